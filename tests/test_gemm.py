"""gemm against NumPy float64 matmul: transposes, alpha/beta, batch broadcasting."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, f64, random

import oxijax

TRANS = ["N", "T", "C"]


def stored(shape_mk, trans):
    """Storage shape of an operand whose op() is shape_mk."""
    *batch, rows, cols = shape_mk
    return (*batch, cols, rows) if trans != "N" else (*batch, rows, cols)


def reference(a, b, c, trans_a, trans_b, alpha, beta):
    a, b = f64(a), f64(b)
    if trans_a != "N":
        a = np.swapaxes(a, -1, -2)
    if trans_b != "N":
        b = np.swapaxes(b, -1, -2)
    out = alpha * np.matmul(a, b)
    return out + beta * f64(c) if beta != 0 else out


def check(m, n, k, dtype, trans_a="N", trans_b="N", batch_a=(), batch_b=(), alpha=1.0, beta=0.0):
    a = random(stored((*batch_a, m, k), trans_a), dtype, seed=1)
    b = random(stored((*batch_b, k, n), trans_b), dtype, seed=2)
    out_shape = (*np.broadcast_shapes(batch_a, batch_b), m, n)
    c = random(out_shape, dtype, seed=3) if beta != 0 else None
    fn = jax.jit(lambda a, b, c: oxijax.gemm(a, b, c, trans_a=trans_a, trans_b=trans_b,
                                             alpha=alpha, beta=beta))
    actual = fn(a, b, c)
    assert actual.shape == out_shape and actual.dtype == a.dtype
    expected = reference(a, b, c, trans_a, trans_b, alpha, beta)
    # Dot products err relative to sqrt(k) times their terms' size (inputs are <= 2).
    assert_close(actual, expected, dtype, scale=4.0 * abs(alpha) * np.sqrt(max(k, 1)) + 2 * abs(beta))


SIZES = [(1, 1, 1), (1, 7, 3), (5, 1, 9), (3, 5, 7), (16, 16, 16), (17, 33, 65), (64, 31, 128),
         (100, 129, 33), (257, 65, 300)]


@pytest.mark.parametrize("m,n,k", SIZES, ids=str)
@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product(TRANS, TRANS)), ids="".join)
def test_gemm_shapes_and_transposes(m, n, k, trans_a, trans_b, dtype):
    check(m, n, k, dtype, trans_a, trans_b)


def test_every_row_and_column_count_of_the_last_tile(dtype):
    # The last tile's rows run a shorter tile when they fit one (AVX-512: 4 or 8 of its
    # 14 rows; AVX2 and the others: 2 or 4 of 6), its columns a tile of one vector when
    # they fit it (16 of 32 columns, 8 of 16 on AVX2): m from 1 to 30 and n from 1 to 66
    # end on every count.
    for m in range(1, 31):
        check(m, 37, 19, dtype, "N", "T", alpha=1.5, beta=0.5)
    for n in range(1, 67):
        check(9, n, 21, dtype, "T", "N", alpha=1.5, beta=0.5)


def test_every_row_and_column_count_of_the_last_block_of_a_deep_product(dtype):
    # The same for products big enough for AMX's tiles (the amx level's bfloat16 runs
    # M * N * K from 40^3 on in 32 x 32 blocks, K padded to 32): m from 1 to 33 and n
    # from 1 to 66 end on every count of a block's rows and columns.
    for m in range(1, 34):
        check(m, 37, 2001, dtype, "N", "T", alpha=1.5, beta=0.5)
    for n in range(1, 67):
        check(33, n, 2001, dtype, "T", "N", alpha=1.5, beta=0.5)


@pytest.mark.parametrize("alpha,beta", [(2.0, 0.0), (1.0, 1.0), (-0.5, 2.5), (0.0, 1.0)])
def test_alpha_beta(alpha, beta, dtype):
    check(19, 23, 29, dtype, "T", "N", alpha=alpha, beta=beta)


@pytest.mark.parametrize("batch_a,batch_b", [((4,), (4,)), ((3,), ()), ((), (5,)), ((2, 1), (1, 3)),
                                             ((2, 3, 1), (4,)),
                                             ((2, 1) * 4, (1, 2) * 4)], ids=str)
def test_batched_gemm_broadcasts_like_matmul(batch_a, batch_b, dtype):
    check(7, 9, 11, dtype, "N", "T", batch_a, batch_b)
    check(8, 5, 6, dtype, "T", "N", batch_a, batch_b, alpha=0.5, beta=2.0)


def test_beta_zero_never_reads_c():
    a, b = random((4, 6), jnp.float32, 1), random((6, 5), jnp.float32, 2)
    c = jnp.full((4, 5), jnp.nan, jnp.float32)
    out = oxijax.gemm(a, b, c, beta=0.0)
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, f64(a) @ f64(b), rtol=1e-5)


def test_large_square(dtype):
    check(384, 384, 384, dtype, "N", "N")


@pytest.mark.parametrize("trans_a,trans_b", [("N", "N"), ("T", "T")])
def test_few_large_matrices_share_the_threads(trans_a, trans_b, dtype):
    # Too few matrices for whole-matrix tasks to balance (3 on 2 or 16 threads): the
    # kernel packs and computes them together, each matrix cut over all threads.
    check(160, 200, 150, dtype, trans_a, trans_b, (3,), (3,), alpha=0.5, beta=2.0)
    check(160, 200, 150, dtype, trans_a, trans_b, (3,), ())


@pytest.mark.parametrize("trans_a,trans_b", [("N", "N"), ("T", "T"), ("N", "T"), ("T", "N")])
def test_long_odd_k_over_several_k_blocks(trans_a, trans_b, dtype):
    # K odd and several cache blocks deep (KC is at most 1024 packed elements, and a
    # packed element of bfloat16 under AVX512_BF16 is a pair of K steps): the last pair
    # is padded, and every block boundary falls on a pair.
    check(37, 45, 4999, dtype, trans_a, trans_b, alpha=0.5, beta=1.5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_nan_and_inf_propagate(dtype):
    a = jnp.asarray([[1.0, np.nan], [1.0, 2.0], [np.inf, 1.0]], dtype)
    b = jnp.asarray([[1.0, 0.5], [2.0, 3.0]], dtype)
    out = f64(oxijax.gemm(a, b))
    with np.errstate(invalid="ignore"):  # inf * 0 is NaN on purpose
        expected = f64(a) @ f64(b)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    np.testing.assert_array_equal(out[1], expected[1])
    assert np.isinf(out[2]).all()


def test_zero_sizes():
    a, b = jnp.zeros((3, 0), jnp.float32), jnp.zeros((0, 4), jnp.float32)
    np.testing.assert_array_equal(oxijax.gemm(a, b), np.zeros((3, 4)))
    c = jnp.ones((3, 4), jnp.float32)
    np.testing.assert_array_equal(oxijax.gemm(a, b, c, beta=2.0), np.full((3, 4), 2.0))
    assert oxijax.gemm(jnp.zeros((0, 2)), jnp.zeros((2, 5))).shape == (0, 5)
    assert oxijax.gemm(jnp.zeros((2, 0, 2)), jnp.zeros((2, 5))).shape == (2, 0, 5)


def test_matmul_alias_handles_vectors():
    a, b, v = random((3, 4), jnp.float64, 1), random((4, 5), jnp.float64, 2), random((4,), jnp.float64, 3)
    np.testing.assert_allclose(oxijax.matmul(a, b), a @ b, rtol=1e-12)
    np.testing.assert_allclose(oxijax.matmul(a, v), a @ v, rtol=1e-12)
    np.testing.assert_allclose(oxijax.matmul(v, b), v @ b, rtol=1e-12)
    np.testing.assert_allclose(oxijax.matmul(v, v), v @ v, rtol=1e-12)


def test_vmap_folds_into_kernel_batch():
    a, b = random((6, 4, 3), jnp.float64, 1), random((6, 3, 5), jnp.float64, 2)
    c = random((4, 5), jnp.float64, 3)
    fn = lambda a, b, c: oxijax.gemm(a, b, c, beta=1.0, alpha=2.0)  # noqa: E731
    for in_axes in [(0, 0, None), (0, None, None), (None, 0, None), (1, 0, None), (0, 0, 0)]:
        args = [jnp.moveaxis(a, 0, 1) if in_axes[0] == 1 else a, b if in_axes[1] is not None else b[0],
                jnp.stack([c] * 6) if in_axes[2] == 0 else c]
        if in_axes[0] is None:
            args[0] = a[0]
        got = jax.vmap(fn, in_axes=in_axes)(*args)
        a_full = a if in_axes[0] is not None else jnp.broadcast_to(a[0], a.shape)
        b_full = b if in_axes[1] is not None else jnp.broadcast_to(b[0], b.shape)
        np.testing.assert_allclose(got, 2.0 * a_full @ b_full + c, rtol=1e-12)
        jaxpr = jax.make_jaxpr(jax.vmap(fn, in_axes=in_axes))(*args)
        assert sum(e.primitive.name == "oxijax_gemm" for e in jaxpr.eqns) == 1


def test_shows_as_its_own_primitive():
    a = random((2, 2), jnp.float32)
    assert "oxijax_gemm" in str(jax.make_jaxpr(oxijax.gemm)(a, a))


def test_large_single_matrix_takes_the_blocked_parallel_path():
    # Large enough that one matrix is cut into several packed blocks shared by threads.
    check(1100, 1030, 1200, jnp.float32, "N", "T", alpha=0.5, beta=1.5)
    check(150, 140, 20000, jnp.float32, "T", "N")


def test_concurrent_calls_from_threads_agree():
    from concurrent.futures import ThreadPoolExecutor

    a, b = random((8, 300, 200), jnp.float32, 1), random((200, 250), jnp.float32, 2)
    fn = jax.jit(oxijax.matmul)
    expected = np.asarray(fn(a, b))
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: np.asarray(fn(a, b)), range(16)))
    for result in results:
        np.testing.assert_array_equal(result, expected)
