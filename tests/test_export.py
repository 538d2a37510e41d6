"""jax.export of programs calling oxijax: symbolic batch sizes, a serialize/deserialize
round trip, calls at two batch sizes against the jnp reference (not exported); and the
compatibility promise: a serialized call that does not match the installed handlers
(unknown target, missing, extra, renamed or mistyped attributes) fails with an error."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, random

import oxijax

export = jax.export
b = export.symbolic_shape("b")[0]


def S(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def bhsd_attention(q, k, v):
    swap = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731 - jax.nn wants [B, S, H, D]
    return swap(jax.nn.dot_product_attention(swap(q), swap(k), swap(v)))


def mlp_loss(ops, w, bias, x):
    """A batched matmul with a broadcast weight and bias: their gradients sum over b."""
    matmul, add, tanh, mean = ops
    return mean(tanh(add(matmul(x, w), bias)))


OXI = (oxijax.matmul, oxijax.add, oxijax.tanh,
       lambda y: oxijax.mean(oxijax.mean(oxijax.mean(y, 2), 1), 0))
JNP = (jnp.matmul, jnp.add, jnp.tanh, jnp.mean)

# name: (oxijax function, jnp reference, argument shapes with the symbolic batch b)
CASES = {
    "unary": (oxijax.tanh, jnp.tanh, [S(b, 3)]),
    "binary broadcast": (oxijax.maximum, jnp.maximum, [S(b, 1, 3), S(4, 1)]),
    "reduce": (lambda x: oxijax.sum(x, 0), lambda x: jnp.sum(x, 0), [S(b, 3)]),
    "reduce mean": (lambda x: oxijax.mean(x, 1), lambda x: jnp.mean(x, 1), [S(b, 3)]),
    "gemm": (oxijax.matmul, jnp.matmul, [S(b, 4), S(4, 3)]),
    "gemm batched": (lambda a, w, c: oxijax.gemm(a, w, c, trans_b="T", beta=1.0),
                     lambda a, w, c: a @ jnp.swapaxes(w, -1, -2) + c, [S(b, 2, 4), S(b, 3, 4), S(3)]),
    "conv2d": (lambda x, w: oxijax.conv2d(x, w, stride=2, padding=1),
               lambda x, w: jax.lax.conv_general_dilated(x, w, (2, 2), [(1, 1), (1, 1)]),
               [S(b, 2, 6, 5), S(3, 2, 3, 3)]),
    "attention": (oxijax.attention, bhsd_attention, [S(b, 2, 5, 8), S(b, 2, 7, 8), S(b, 2, 7, 8)]),
    "vmap": (jax.vmap(oxijax.mul, in_axes=(1, None)), jax.vmap(jnp.multiply, in_axes=(1, None)),
             [S(3, b), S(3)]),
    "grad": (jax.grad(lambda *a: mlp_loss(OXI, *a), (0, 1, 2)),
             jax.grad(lambda *a: mlp_loss(JNP, *a), (0, 1, 2)), [S(4, 3), S(3), S(b, 2, 4)]),
    "grad conv2d attention": (
        jax.grad(lambda x, w: oxijax.sum(oxijax.attention(x, x, oxijax.conv2d(x, w, padding=1))
                                         .reshape(-1), 0), (0, 1)),
        jax.grad(lambda x, w: bhsd_attention(x, x, jax.lax.conv_general_dilated(
            x, w, (1, 1), [(1, 1), (1, 1)])).sum(), (0, 1)),
        [S(b, 2, 3, 4), S(2, 2, 3, 3)]),
}


@pytest.mark.parametrize("name", CASES)
def test_export_round_trip_with_symbolic_batch(name):
    fn, reference, shapes = CASES[name]
    exported = export.export(jax.jit(fn), disabled_checks=oxijax.export_disabled_checks())(*shapes)
    restored = export.deserialize(exported.serialize())
    for size in (1, 3):
        args = [random(tuple(size if d is b else d for d in s.shape), jnp.float32, seed=i)
                for i, s in enumerate(shapes)]
        for got, want in zip(jax.tree.leaves(restored.call(*args)),
                             jax.tree.leaves(jax.jit(reference)(*args))):
            assert_close(got, want, jnp.float32)


def test_export_needs_the_disabled_checks():
    with pytest.raises(ValueError, match="custom call"):
        export.export(jax.jit(oxijax.tanh))(S(b, 3))
    names = {check.is_custom_call() for check in oxijax.export_disabled_checks()}
    assert names == {t for targets in oxijax.REGISTERED_TARGETS.values() for t in targets}


def test_symbolic_size_of_a_kernel_attribute_is_a_clear_error():
    """conv2d's backward kernels take the input's H and W as static attributes, and
    attention's default scale derives from head_dim."""
    h = export.symbolic_shape("h")[0]
    grad = jax.grad(lambda x, w: oxijax.sum(oxijax.conv2d(x, w).reshape(-1), 0))
    with pytest.raises(TypeError, match="input_h=h must be a static number"):
        export.export(jax.jit(grad), disabled_checks=oxijax.export_disabled_checks())(
            S(2, 2, h, 5), S(3, 2, 3, 3))

    d = export.symbolic_shape("d")[0]
    with pytest.raises(ValueError, match="head_dim d is symbolic"):
        export.export(jax.jit(oxijax.attention))(*[S(1, 2, 4, d)] * 3)


i32, f64 = np.int32, np.float64
GEMM = dict(trans_a=i32(0), trans_b=i32(0), alpha=f64(1), beta=f64(0), allow_tf32=False)
# (target, attributes, fragment of the error): the handlers are those of oxijax_unary
# (op) and oxijax_gemm; any mismatch with what they decode must fail, never compute.
MISMATCHED = [
    ("oxijax_unary_v9", dict(op=i32(0)), "oxijax_unary_v9"),                  # unknown target
    ("oxijax_unary", dict(op=i32(0), version=i32(2)), "Wrong number of attributes"),  # extra
    ("oxijax_gemm", {k: v for k, v in GEMM.items() if k != "alpha"}, "Wrong number of attributes"),
    ("oxijax_unary", dict(opcode=i32(0)), "decode"),                             # renamed
    ("oxijax_gemm", {("alpha2" if k == "alpha" else k): v for k, v in GEMM.items()}, "decode"),
    ("oxijax_unary", dict(op=np.int64(0)), "decode"),                            # mistyped
]


@pytest.mark.parametrize("target,attrs,fragment", MISMATCHED, ids=[str(i) for i in range(len(MISMATCHED))])
def test_serialized_call_with_mismatched_attributes_fails(target, attrs, fragment):
    operands = (S(2, 2),) if "unary" in target else (S(2, 3), S(3, 2))

    def call(*xs):
        return jax.ffi.ffi_call(target, S(2, 2))(*xs, **attrs)

    checks = [export.DisabledSafetyCheck.custom_call(target)]
    restored = export.deserialize(export.export(jax.jit(call), disabled_checks=checks)(*operands)
                                  .serialize())
    with pytest.raises(Exception, match=fragment):
        jax.block_until_ready(restored.call(*(jnp.ones(s.shape, s.dtype) for s in operands)))
