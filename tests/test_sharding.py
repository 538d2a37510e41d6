"""Sharded inputs on 4 host CPU devices (a 2 x 2 mesh): every op runs on its local
shards, the result equals the unsharded one, and the compiled program has no collective
for the axes the op can split locally. Programs exported with jax.export, serialized and
deserialized, do so too for the leading dims that all operands share (XLA's batch
partitioner), and give the unsharded result for every split.

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
    import json, re
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import oxijax

    jax.config.update("jax_enable_x64", True)
    mesh = jax.make_mesh((2, 2), ("x", "y"))
    rng = np.random.default_rng(0)
    COLLECTIVE = re.compile(r"all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter")

    def case(fn, *specs_and_shapes):
        arrays = [rng.standard_normal(shape) for _, shape in specs_and_shapes]
        sharded = [jax.device_put(a, NamedSharding(mesh, P(*spec)))
                   for a, (spec, _) in zip(arrays, specs_and_shapes)]
        jitted = jax.jit(fn)
        out = jitted(*sharded)
        expected = jax.jit(fn)(*(jnp.asarray(a) for a in arrays))  # one device
        hlo = jitted.lower(*sharded).compile().as_text()
        outs = out if isinstance(out, tuple) else (out,)
        exps = expected if isinstance(expected, tuple) else (expected,)
        return {
            "close": all(bool(np.allclose(o, e, rtol=1e-12, atol=1e-12, equal_nan=True))
                         for o, e in zip(outs, exps)),
            "collectives": sorted(set(COLLECTIVE.findall(hlo))),
            "spec": [list(map(str, o.sharding.spec)) for o in outs],
        }

    CHECKS = [jax.export.DisabledSafetyCheck.custom_call(target)
              for targets in oxijax.REGISTERED_TARGETS.values() for target in targets]

    def exported(fn, *specs_and_shapes, reference=None):  # case() of fn exported and loaded
        arrays = [rng.standard_normal(shape) for _, shape in specs_and_shapes]
        sharded = [jax.device_put(a, NamedSharding(mesh, P(*spec)))
                   for a, (spec, _) in zip(arrays, specs_and_shapes)]
        blob = jax.export.export(jax.jit(fn), disabled_checks=CHECKS)(*sharded).serialize()
        call = jax.jit(jax.export.deserialize(blob).call)
        outs = jax.tree.leaves(call(*sharded))
        exps = jax.tree.leaves(jax.jit(reference or fn)(*(jnp.asarray(a) for a in arrays)))
        hlo = call.lower(*sharded).compile().as_text()
        return {
            "close": all(bool(np.allclose(o, e, rtol=1e-12, atol=1e-12))
                         for o, e in zip(outs, exps)),
            "collectives": sorted(set(COLLECTIVE.findall(hlo))),
            "spec": [list(map(str, o.sharding.spec)) for o in outs],
        }

    attention = lambda causal: (lambda q, k, v: oxijax.attention(q, k, v, causal=causal))
    # The gradient for the first operand, for a cotangent sharded like the result.
    grad_first = lambda f: (lambda x, *rest_and_ct: jax.vjp(lambda x: f(x, *rest_and_ct[:-1]), x)[1](rest_and_ct[-1])[0])
    results = {
        "unary": case(oxijax.exp, (("x", "y"), (8, 6))),
        "binary broadcast": case(oxijax.add, (("x", "y"), (8, 6)), (("y",), (6,))),
        "binary size-1 dim": case(oxijax.mul, ((None, "y"), (8, 6)), (("x", None), (8, 1))),
        "reduce kept axes": case(lambda x: oxijax.max(x, 1), (("x", None, "y"), (4, 5, 6))),
        "reduce split axis": case(lambda x: oxijax.sum(x, 1), (("x", "y"), (8, 6))),
        "gemm batch and m": case(oxijax.matmul, (("x", "y", None), (4, 8, 6)),
                                 (("x", None, None), (4, 6, 10))),
        "gemm n, transposed b": case(lambda a, b: oxijax.gemm(a, b, trans_b="T"),
                                     ((None, None), (8, 6)), (("y", None), (10, 6))),
        "gemm split k": case(oxijax.matmul, ((None, "y"), (8, 6)), (("y", None), (6, 10))),
        "gemm with c": case(lambda a, b, c: oxijax.gemm(a, b, c, alpha=0.5, beta=2.0),
                            (("x", None), (8, 6)), ((None, "y"), (6, 10)),
                            (("x", "y"), (8, 10))),
        "conv2d images and filters": case(
            lambda x, w: oxijax.conv2d(x, w, stride=2, padding=1),
            (("x",), (4, 3, 9, 9)), (("y",), (6, 3, 3, 3))),
        "conv2d split height": case(oxijax.conv2d, ((None, None, "x"), (2, 3, 8, 8)),
                                    ((None,), (4, 3, 3, 3))),
        "attention batch and heads": case(attention(True), *[(("x", "y"), (4, 2, 16, 8))] * 3),
        "attention queries": case(attention(False), ((None, None, "x"), (2, 2, 16, 8)),
                                  *[((None,), (2, 2, 12, 8))] * 2),
        "attention causal queries": case(attention(True), ((None, None, "x"), (2, 2, 16, 8)),
                                         *[((None,), (2, 2, 12, 8))] * 2),
        "grad unary": case(grad_first(oxijax.tanh), (("x", "y"), (8, 6)), (("x", "y"), (8, 6))),
        "grad binary broadcast": case(grad_first(oxijax.maximum), (("x", "y"), (8, 6)),
                                      (("y",), (6,)), (("x", "y"), (8, 6))),
        "grad reduce max": case(grad_first(lambda x: oxijax.max(x, 1)),
                                (("x", None, "y"), (4, 5, 6)), (("x", "y"), (4, 6))),
        "grad gemm batch and m": case(grad_first(oxijax.matmul), (("x", "y", None), (4, 8, 6)),
                                      (("x", None, None), (4, 6, 10)), (("x", "y", None), (4, 8, 10))),
        "grad conv2d images": case(grad_first(lambda x, w: oxijax.conv2d(x, w, padding=1)),
                                   (("x",), (4, 3, 9, 9)), ((None,), (6, 3, 3, 3)),
                                   (("x",), (4, 6, 9, 9))),
    }
    with jax.set_mesh(mesh):  # a mesh in context: Explicit types must not force a gather
        results["set_mesh unary"] = case(oxijax.exp, (("x", "y"), (8, 6)))
        results["set_mesh grad gemm batch"] = case(
            grad_first(oxijax.matmul), (("x", "y", None), (4, 8, 6)),
            (("x", None, None), (4, 6, 10)), (("x", "y", None), (4, 8, 10)))
    xy = (("x", "y"),)
    total = lambda f: (lambda *args: oxijax.sum(f(*args).reshape(-1), 0))
    conv = lambda x, w: oxijax.conv2d(x, w, padding=1)
    results.update({
        "export unary": exported(oxijax.exp, (xy, (8, 6))),
        "export binary": exported(oxijax.div, (xy, (8, 6)), (xy, (8, 6))),
        "export binary broadcast": exported(oxijax.add, (xy, (8, 6)), ((), (6,))),
        "export reduce": exported(lambda x: oxijax.max(x, 1), (xy, (8, 5, 6))),
        "export gemm batch": exported(oxijax.matmul, (xy, (4, 8, 6)), (xy, (4, 6, 10))),
        "export gemm split m": exported(oxijax.matmul, (("x",), (8, 6)), ((), (6, 10))),
        "export conv2d": exported(lambda x, w: oxijax.conv2d(x, w, padding=1),
                                  (("x",), (4, 3, 9, 9)), ((), (6, 3, 3, 3))),
        "export attention": exported(attention(True), *[(("x", "y"), (2, 2, 16, 8))] * 3),
        "export grad gemm": exported(jax.grad(total(lambda a, b: oxijax.tanh(oxijax.matmul(a, b))),
                                              argnums=(0, 1)), (xy, (4, 8, 6)), (xy, (4, 6, 10))),
        "export grad attention": exported(jax.grad(total(attention(False)), argnums=(0, 1, 2)),
                                          *[(("x", "y"), (2, 2, 16, 8))] * 3),
        # The way to keep any split local in an exported program: shard_map exports.
        "export shard_map conv2d": exported(
            jax.shard_map(conv, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x")),
            (("x",), (4, 3, 9, 9)), ((), (6, 3, 3, 3)), reference=conv),
    })
    print(json.dumps(results))
    """
)

# Case -> the partition spec of each result when nothing is gathered; None where the op
# cannot keep the split (JAX gathers those axes: only correctness is checked).
LOCAL = {
    "unary": [["x", "y"]],
    "binary broadcast": [["x", "y"]],
    "binary size-1 dim": [["x", "y"]],
    "reduce kept axes": [["x", "y"]],
    "reduce split axis": None,
    "gemm batch and m": [["x", "y", "None"]],
    "gemm n, transposed b": [["None", "y"]],
    "gemm split k": None,
    "gemm with c": [["x", "y"]],
    "conv2d images and filters": [["x", "y", "None", "None"]],
    "conv2d split height": None,
    "attention batch and heads": [["x", "y", "None", "None"]],
    "attention queries": [["None", "None", "x", "None"]],
    "attention causal queries": None,
    "grad unary": [["x", "y"]],
    "grad binary broadcast": [["x", "y"]],
    "grad reduce max": [["x", "None", "y"]],
    "grad gemm batch and m": [["x", "y", "None"]],
    "grad conv2d images": [["x", "None", "None", "None"]],
    "set_mesh unary": [["x", "y"]],
    "set_mesh grad gemm batch": [["x", "y", "None"]],
    "export unary": [["('x', 'y')", "None"]],
    "export binary": [["('x', 'y')", "None"]],
    "export binary broadcast": None,  # operands of different ranks share no leading dim
    "export reduce": [["('x', 'y')", "None"]],
    "export gemm batch": [["('x', 'y')", "None", "None"]],
    "export gemm split m": None,  # not a leading dim of both operands
    "export conv2d": None,  # images are not a dim of the filters
    "export attention": [["x", "y", "None", "None"]],
    "export grad gemm": [["('x', 'y')", "None", "None"]] * 2,
    "export grad attention": [["x", "y", "None", "None"]] * 3,
    "export shard_map conv2d": [["x", "None", "None", "None"]],
}


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(LOCAL))
def test_sharded_result_equals_unsharded(results, name):
    assert results[name]["close"], results[name]


@pytest.mark.parametrize("name", [name for name, spec in LOCAL.items() if spec is not None])
def test_shardable_axes_stay_local(results, name):
    result = results[name]
    assert result["collectives"] == [], result
    specs = [spec + ["None"] * (len(expected) - len(spec))
             for spec, expected in zip(result["spec"], LOCAL[name])]
    assert specs == LOCAL[name], result
