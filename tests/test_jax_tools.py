"""JAX's debugging tools treat oxijax ops as they treat their jnp counterparts:
jax.disable_jit, jax_debug_nans / jax_debug_infs (eagerly, under jit and in gradients)
and checkify's float checks. Each is compared with the jnp op under the same tool."""

import jax
import jax.numpy as jnp
import pytest
from conftest import assert_close, random
from jax import lax
from jax.experimental import checkify

import oxijax


def _attention_jnp(q, k, v):
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(q.shape[-1])
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)


# name -> (oxijax function, jnp/lax reference, argument shapes); inputs are positive
# (log and sqrt) and tie-free.
CASES = {
    **{f"unary {name}": (getattr(oxijax, name), ref, [(3, 5)]) for name, ref in (
        ("relu", jax.nn.relu), ("sigmoid", jax.nn.sigmoid), ("tanh", jnp.tanh),
        ("exp", jnp.exp), ("log", jnp.log), ("sqrt", jnp.sqrt), ("abs", jnp.abs),
        ("neg", jnp.negative))},
    **{f"binary {name}": (getattr(oxijax, name), ref, [(3, 5), (5,)]) for name, ref in (
        ("add", jnp.add), ("sub", jnp.subtract), ("mul", jnp.multiply), ("div", jnp.divide),
        ("maximum", jnp.maximum), ("minimum", jnp.minimum))},
    **{f"reduce {name}": (lambda x, f=getattr(oxijax, name): f(x, 1),
                          lambda x, f=ref: f(x, axis=1), [(3, 5)]) for name, ref in (
        ("sum", jnp.sum), ("max", jnp.max), ("min", jnp.min), ("mean", jnp.mean))},
    "gemm": (lambda a, b: oxijax.gemm(a, b, trans_b="T"), lambda a, b: a @ b.T,
             [(2, 3, 4), (5, 4)]),
    "conv2d": (lambda x, w: oxijax.conv2d(x, w, stride=2, padding=1),
               lambda x, w: lax.conv_general_dilated(x, w, (2, 2), [(1, 1), (1, 1)]),
               [(2, 3, 5, 5), (4, 3, 3, 3)]),
    "attention": (oxijax.attention, _attention_jnp, [(1, 2, 5, 4), (1, 2, 6, 4), (1, 2, 6, 4)]),
}


def _value_and_grads(fn, args):
    loss = lambda *a: jnp.sum(fn(*a) ** 2)  # noqa: E731
    return fn(*args), jax.grad(loss, argnums=tuple(range(len(args))))(*args)


@pytest.mark.parametrize("name", list(CASES))
def test_disable_jit(name):
    """Every op and its gradient run op by op without jit (the impl must not re-enter
    itself) and equal the jnp reference run the same way."""
    fn, reference, shapes = CASES[name]
    args = [random(shape, jnp.float64, seed=i, low=0.5) for i, shape in enumerate(shapes)]
    with jax.disable_jit():
        out, grads = _value_and_grads(fn, args)
        want_out, want_grads = _value_and_grads(reference, args)
    assert_close(out, want_out, jnp.float64)
    for got, want in zip(grads, want_grads):
        assert_close(got, want, jnp.float64)


TRANSFORMS = {
    "eager": lambda f: f,
    "jit": jax.jit,
    "grad": lambda f: jax.grad(lambda x: jnp.sum(f(x))),
    "vmap of jit": lambda f: jax.vmap(jax.jit(f)),
}


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("flag, ops, value", [
    (jax.debug_nans, (jnp.log, oxijax.log), -1.0),
    (jax.debug_infs, (jnp.exp, oxijax.exp), 1000.0),
], ids=["debug_nans", "debug_infs"])
def test_debug_nans_and_infs(flag, ops, value, transform):
    """A NaN (an inf) made by the op raises FloatingPointError, for jnp and oxijax alike;
    a finite input raises nothing."""
    with flag(True):
        for op in ops:
            with pytest.raises(FloatingPointError):
                jax.block_until_ready(TRANSFORMS[transform](op)(jnp.full((3,), value)))
            jax.block_until_ready(TRANSFORMS[transform](op)(jnp.full((3,), 2.0)))


def _checkify_kind(fn, *args):
    """checkify's float-check verdict on fn: None, or the kind of error it reports."""
    error, _ = checkify.checkify(fn, errors=checkify.float_checks)(*args)
    message = error.get()
    return None if message is None else message.split(":")[0]


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("ops, args", [
    ((jnp.log, oxijax.log), ([-1.0, 2.0],)),                  # NaN made: reported
    ((jnp.log, oxijax.log), ([1.0, 2.0],)),                   # none: nothing reported
    ((jnp.divide, oxijax.div), ([1.0, 2.0], [0.0, 1.0])),     # division by zero
    ((jnp.subtract, oxijax.sub), ([INF, 1.0], [INF, 1.0])),   # inf - inf
    ((jax.nn.relu, oxijax.relu), ([NAN, 1.0],)),              # NaN passed on, not made
    ((jnp.maximum, oxijax.maximum), ([NAN, 1.0], [0.0, 0.0])),
    ((lambda x: jnp.sum(x, 0), lambda x: oxijax.sum(x, 0)), ([INF, -INF],)),
    ((lambda x: jnp.max(x, 0), lambda x: oxijax.max(x, 0)), ([NAN, 1.0],)),
    ((jnp.matmul, oxijax.matmul), ([[INF, 1.0]], [[0.0], [1.0]])),  # inf * 0
])
def test_checkify_float_checks(ops, args, jit):
    """checkify reports what it reports for the jnp op: NaNs an op makes (not those it
    passes on, as lax's max/abs/relu) and divisions by zero."""
    arrays = [jnp.asarray(a) for a in args]
    kinds = [_checkify_kind(jax.jit(op) if jit else op, *arrays) for op in ops]
    assert kinds[0] == kinds[1], kinds
