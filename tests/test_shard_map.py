"""oxijax inside jax.shard_map (check_vma=True) on 4 host CPU devices: every op types its
results as its jnp/lax counterpart does (varying manual axes included), and gradients
with respect to replicated and sharded arguments equal the jnp ones inside the same
shard_map (a replicated weight's gradient needs the psum that JAX's pvary transposes to).

JAX fixes its device count at start-up, so the cases run in one subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=4 and report back as JSON.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P
    import oxijax

    jax.config.update("jax_enable_x64", True)
    mesh = jax.make_mesh((4,), ("d",))
    rng = np.random.default_rng(0)
    S, R = P("d"), P()  # sharded over d in dim 0, replicated

    def types_and_grads(fn, args, specs):
        \"\"\"Inside one shard_map: the type of fn's result, and the gradients (and their
        types) of psum(sum(result * cotangent)) for every argument.\"\"\"
        types = {}

        def loss(*args):
            out = fn(*args)
            types["out"] = str(jax.typeof(out))
            ct = jnp.asarray(np.random.default_rng(1).standard_normal(out.shape))
            return lax.psum(jnp.sum(out * ct), "d")

        def body(*args):
            grads = jax.grad(loss, argnums=tuple(range(len(args))))(*args)
            types["grads"] = [str(jax.typeof(g)) for g in grads]
            return grads

        grads = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=specs))(*args)
        return types, [np.asarray(g) for g in grads]

    def case(fn, reference, *shapes_specs, positive=False):
        low = 0.5 if positive else -2.0
        args = [jax.device_put(rng.uniform(low, 2.0, shape), NamedSharding(mesh, spec))
                for shape, spec in shapes_specs]
        specs = tuple(spec for _, spec in shapes_specs)
        got_types, got = types_and_grads(fn, args, specs)
        want_types, want = types_and_grads(reference, args, specs)
        return {
            "types": [got_types, want_types],
            "close": all(bool(np.allclose(g, w, rtol=1e-10, atol=1e-10))
                         for g, w in zip(got, want)),
        }

    def attention_reference(q, k, v):
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)

    jnp_unary = {"relu": jax.nn.relu, "sigmoid": jax.nn.sigmoid, "tanh": jnp.tanh,
                 "exp": jnp.exp, "log": jnp.log, "sqrt": jnp.sqrt, "abs": jnp.abs,
                 "neg": jnp.negative}
    jnp_binary = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply,
                  "div": jnp.divide, "maximum": jnp.maximum, "minimum": jnp.minimum}
    jnp_reduce = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min, "mean": jnp.mean}
    results = {}
    for name, ref in jnp_unary.items():
        results[f"unary {name}"] = case(getattr(oxijax, name), ref, ((16, 6), S), positive=True)
    for name, ref in jnp_binary.items():  # a sharded, b replicated and broadcast
        results[f"binary {name}"] = case(getattr(oxijax, name), ref, ((16, 6), S), ((6,), R),
                                         positive=True)
    results["binary replicated, sharded"] = case(oxijax.mul, jnp.multiply, ((4, 6), R),
                                                 ((16, 6), S))
    results["binary both replicated"] = case(oxijax.sub, jnp.subtract, ((4, 6), R), ((4, 6), R))
    for name, ref in jnp_reduce.items():
        results[f"reduce {name}"] = case(lambda x, f=getattr(oxijax, name): f(x, 1),
                                         lambda x, f=ref: f(x, axis=1), ((16, 5, 6), S))
    results["gemm sharded a, replicated b"] = case(oxijax.matmul, jnp.matmul,
                                                   ((16, 8), S), ((8, 12), R))
    results["gemm batched, transposed b, c"] = case(
        lambda a, b, c: oxijax.gemm(a, b, c, trans_b="T", alpha=0.5, beta=2.0),
        lambda a, b, c: 0.5 * a @ jnp.swapaxes(b, -1, -2) + 2.0 * c,
        ((8, 3, 8), S), ((1, 12, 8), R), ((12,), R))
    results["mlp (matmul, relu, mean, pmean)"] = case(
        lambda w, x: lax.pmean(
            oxijax.mean(oxijax.mean(oxijax.relu(oxijax.matmul(x, w)), 1), 0), "d"),
        lambda w, x: lax.pmean(jnp.mean(jax.nn.relu(x @ w)), "d"),
        ((8, 32), R), ((16, 8), S))
    results["conv2d"] = case(
        lambda x, w: oxijax.conv2d(x, w, stride=2, padding=1),
        lambda x, w: lax.conv_general_dilated(x, w, (2, 2), [(1, 1), (1, 1)]),
        ((8, 3, 7, 7), S), ((4, 3, 3, 3), R))
    qs = P(None, None, "d")  # queries split, keys and values replicated
    results["attention"] = case(oxijax.attention, attention_reference,
                                ((2, 2, 16, 8), qs), ((2, 2, 12, 8), R), ((2, 2, 12, 8), R))

    # Manual over x only, y left to the partitioner (custom_partitioning inside shard_map).
    mesh2 = jax.make_mesh((2, 2), ("x", "y"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    a = jax.device_put(rng.standard_normal((8, 6)), NamedSharding(mesh2, P("x", "y")))
    w = jax.device_put(rng.standard_normal((6, 4)), NamedSharding(mesh2, P()))
    partial = []
    for mm, relu in ((jnp.matmul, jax.nn.relu), (oxijax.matmul, oxijax.relu)):
        loss = lambda a, w: lax.psum(jnp.sum(relu(mm(a, w)) ** 2), "x")
        grads = jax.jit(jax.shard_map(jax.grad(loss, argnums=(0, 1)), mesh=mesh2,
                                      in_specs=(P("x"), P()), out_specs=(P("x"), P()),
                                      axis_names={"x"}))(a, w)
        partial.append([np.asarray(g) for g in grads])
    results["partially manual mlp"] = {
        "close": all(bool(np.allclose(g, w, rtol=1e-10, atol=1e-10)) for g, w in zip(*partial)),
    }

    # out_specs=P() claims a replicated result: a varying one must be refused, as for jnp.
    x = jax.device_put(rng.standard_normal((16, 6)), NamedSharding(mesh, S))
    refused = {}
    for name, fn in (("jnp", jnp.exp), ("oxijax", oxijax.exp)):
        try:
            jax.shard_map(fn, mesh=mesh, in_specs=S, out_specs=P())(x)
            refused[name] = None
        except Exception as error:
            refused[name] = type(error).__name__
    results["out_specs refused"] = refused
    print(json.dumps(results))
    """
)


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_every_op_ran(results):
    names = {name.split()[0] for name in results}
    assert {"unary", "binary", "reduce", "gemm", "conv2d", "attention", "mlp"} <= names


def test_types_match_jnp(results):
    """Results and gradients carry jnp's varying manual axes ({V:d}) and nothing else."""
    for name, result in results.items():
        if "types" in result:
            got, want = result["types"]
            assert got == want, (name, got, want)


def test_gradients_match_jnp(results):
    bad = [name for name, r in results.items() if "close" in r and not r["close"]]
    assert bad == [], bad


def test_varying_result_with_replicated_out_specs_is_refused(results):
    refused = results["out_specs refused"]
    assert refused["jnp"] is not None and refused["oxijax"] == refused["jnp"], refused
