"""The part CpuBackend and CudaBackend share: every check of SPEC §2, in its order
(initialised → arguments → pointers and sizes → device), then one call into the
extension's device object (ffi/backend), which has the same op methods on both."""

from __future__ import annotations

import math
import threading
import weakref

import numpy as np

from oxijax._enums import BinaryOp, ReduceOp, UnaryOp
from oxijax.backend import _checks as checks
from oxijax.backend._abc import ComputeBackend
from oxijax.backend._errors import InvalidArgument, NotInitialized
from oxijax.backend._tracker import AllocationTracker


def host_buffer(obj: object, argument: str, writable: bool) -> tuple[memoryview, int]:
    """A contiguous byte view of a buffer-protocol object and its address."""
    try:
        view = memoryview(obj)
    except TypeError:
        raise InvalidArgument(f"{argument} must support the buffer protocol") from None
    if not view.c_contiguous:
        raise InvalidArgument(f"{argument} must be a C-contiguous buffer")
    if writable and view.readonly:
        raise InvalidArgument(f"{argument} must be a writable buffer")
    view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
    if view.nbytes == 0:
        return view, 0
    return view, np.frombuffer(view, dtype=np.uint8).ctypes.data


class PointerBackend(ComputeBackend):
    """Subclasses set self._device (None: no device, see _no_device) in _start(), and
    implement _allocate / _copy_in / _copy_out / _sync / _stop."""

    _kind = ""

    def __init__(self) -> None:
        self._initialized = False
        self._lock = threading.Lock()  # init / close
        self._device = None
        self._tracker = AllocationTracker()

    # -- lifecycle -------------------------------------------------------------------
    def name(self) -> str:
        return self._kind

    def init(self) -> None:
        with self._lock:
            if not self._initialized:
                self._start()
                self._initialized = True
                # Frees what is still allocated when the backend is collected or, at the
                # latest, at interpreter exit (without close()). No reference to self.
                self._finalizer = weakref.finalize(self, self._tracker.clear)

    def is_initialized(self) -> bool:
        return self._initialized

    def close(self) -> None:
        """Frees what is still allocated, releases the device; a no-op when not initialised.
        Memory handed to JAX (to_jax_array) stays valid until JAX lets go of it."""
        with self._lock:
            if not self._initialized:
                return
            self._initialized = False
            self._finalizer.detach()
            owners = self._tracker.clear()
            del owners  # the last reference to own memory: it is freed here
            self._stop()

    def __enter__(self):
        self.init()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def live_allocations(self) -> int:
        """How many allocations (and imports) this backend tracks."""
        return len(self._tracker)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(initialized={self._initialized}, "
                f"live_allocations={len(self._tracker)})")

    def _require_init(self) -> None:
        if not self._initialized:
            raise NotInitialized()

    def _dev(self):
        """The device object, or the reason there is none (DeviceError)."""
        if self._device is None:
            raise self._no_device()
        return self._device

    def _check(self, ptr: int, nbytes: int, argument: str):
        """The owner of ptr's allocation, checked to hold nbytes from ptr on; the caller
        keeps it referenced so that a concurrent free cannot release the memory."""
        return self._tracker.find(ptr, nbytes, argument).owners[-1]

    # -- memory ------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> int:
        self._require_init()
        nbytes = checks.count(nbytes, "nbytes")
        if nbytes == 0:
            raise InvalidArgument("cannot allocate 0 bytes")
        ptr, owner = self._allocate(nbytes)
        self._tracker.add(ptr, nbytes, owner)
        return ptr

    def free(self, ptr: int) -> None:
        self._require_init()
        owner = self._tracker.remove(checks.pointer(ptr, "ptr"))
        del owner  # own memory is freed with its last reference (see _allocate)

    def copy_htod(self, dst: int, src) -> None:
        self._require_init()
        dst = checks.pointer(dst, "dst")
        view, address = host_buffer(src, "src", writable=False)
        if view.nbytes == 0:
            return
        keep = self._check(dst, view.nbytes, "dst")
        self._copy_in(dst, address, view.nbytes)
        del keep

    def copy_dtoh(self, dst, src: int) -> None:
        self._require_init()
        src = checks.pointer(src, "src")
        view, address = host_buffer(dst, "dst", writable=True)
        if view.nbytes == 0:
            return
        keep = self._check(src, view.nbytes, "src")
        self._copy_out(address, src, view.nbytes)
        del keep

    def synchronize(self) -> None:
        self._require_init()
        self._sync()

    # -- ops ----------------------------------------------------------------------------
    def _run(self, method: str, operands: list[tuple[int, int, str]], *args) -> None:
        """Checks every (ptr, nbytes, name) operand, then calls device.method(*args)."""
        keep = [self._check(ptr, nbytes, name) for ptr, nbytes, name in operands]
        self._call(getattr(self._dev(), method), *args)
        del keep

    def gemm(self, trans_a, trans_b, m, n, k, alpha, a_ptr, lda, b_ptr, ldb, beta, c_ptr, ldc,
             *, dtype=None) -> None:
        self.batched_gemm(trans_a, trans_b, m, n, k, alpha, a_ptr, lda, 0, b_ptr, ldb, 0, beta,
                          c_ptr, ldc, 0, 1, dtype=dtype)

    def batched_gemm(self, trans_a, trans_b, m, n, k, alpha, a_ptr, lda, stride_a, b_ptr, ldb,
                     stride_b, beta, c_ptr, ldc, stride_c, batch_count, *, dtype=None) -> None:
        self._require_init()
        ta, tb = checks.transpose(trans_a, "trans_a"), checks.transpose(trans_b, "trans_b")
        m, n, k = (checks.count(v, name) for v, name in ((m, "m"), (n, "n"), (k, "k")))
        if m == 0 or n == 0 or k == 0:
            raise InvalidArgument("GEMM dimensions m, n, k must all be > 0")
        alpha, beta = checks.real(alpha, "alpha"), checks.real(beta, "beta")
        _, code, size = checks.dtype_of(dtype, "float64")
        # Column-major: A is stored (rows x cols) with lda >= rows.
        a_rows, a_cols = (k, m) if ta else (m, k)
        b_rows, b_cols = (n, k) if tb else (k, n)
        lda, ldb, ldc = (checks.count(v, name, 1) for v, name in
                         ((lda, "lda"), (ldb, "ldb"), (ldc, "ldc")))
        for ld, rows, name in ((lda, a_rows, "lda"), (ldb, b_rows, "ldb"), (ldc, m, "ldc")):
            if ld < rows:
                raise InvalidArgument(f"{name} = {ld} is smaller than the {rows} stored rows")
        stride_a, stride_b, stride_c = (checks.count(v, name) for v, name in
                                        ((stride_a, "stride_a"), (stride_b, "stride_b"),
                                         (stride_c, "stride_c")))
        batch = checks.count(batch_count, "batch_count")
        if batch > 1 and stride_c < ldc * n:
            raise InvalidArgument(f"stride_c = {stride_c} makes C's matrices overlap "
                                  f"(each is ldc·n = {ldc * n} elements)")
        if batch == 0:
            return
        last = batch - 1
        a_ptr, b_ptr, c_ptr = (checks.pointer(p, name) for p, name in
                               ((a_ptr, "a_ptr"), (b_ptr, "b_ptr"), (c_ptr, "c_ptr")))
        operands = [(a_ptr, (last * stride_a + lda * a_cols) * size, "a_ptr"),
                    (b_ptr, (last * stride_b + ldb * b_cols) * size, "b_ptr"),
                    (c_ptr, (last * stride_c + ldc * n) * size, "c_ptr")]
        # Column-major C = op(A)·op(B) is row-major Cᵀ = op(B)ᵀ·op(A)ᵀ over the same
        # memory: swap the operands and m, n; no copies.
        self._run("gemm", operands, code, tb, ta, n, m, k, alpha, b_ptr, ldb, stride_b, a_ptr,
                  lda, stride_a, beta, c_ptr, ldc, stride_c, batch)

    def conv2d_forward(self, input_ptr, input_shape, filter_ptr, filter_shape, output_ptr,
                       output_shape, stride, padding, *, dtype=None) -> None:
        self._require_init()
        x = checks.dims(input_shape, "input_shape (NCHW)", 4)
        w = checks.dims(filter_shape, "filter_shape (KCRS)", 4)
        out = checks.dims(output_shape, "output_shape (NKPQ)", 4)
        sh, sw = checks.dims(stride, "stride", 2)
        ph, pw = checks.dims(padding, "padding", 2)
        if sh < 1 or sw < 1:
            raise InvalidArgument(f"stride must be >= 1, got {[sh, sw]}")
        if w[1] != x[1]:
            raise InvalidArgument(f"filter channels {w[1]} != input channels {x[1]}")
        if min(x[1], w[0], w[2], w[3]) < 1:
            raise InvalidArgument("channels, filters and filter sizes must be > 0")
        if x[2] + 2 * ph < w[2] or x[3] + 2 * pw < w[3]:
            raise InvalidArgument("the filter is larger than the padded input")
        expected = [x[0], w[0], (x[2] + 2 * ph - w[2]) // sh + 1, (x[3] + 2 * pw - w[3]) // sw + 1]
        if out != expected:
            raise InvalidArgument(f"output_shape must be {expected}, got {out}")
        _, code, size = checks.dtype_of(dtype, "float32")
        if math.prod(out) == 0:
            return
        input_ptr, filter_ptr, output_ptr = (
            checks.pointer(p, name) for p, name in
            ((input_ptr, "input_ptr"), (filter_ptr, "filter_ptr"), (output_ptr, "output_ptr")))
        operands = [(input_ptr, math.prod(x) * size, "input_ptr"),
                    (filter_ptr, math.prod(w) * size, "filter_ptr"),
                    (output_ptr, math.prod(out) * size, "output_ptr")]
        self._run("conv2d", operands, code, input_ptr, x, filter_ptr, w, output_ptr, out,
                  [sh, sw], [ph, pw])

    def attention(self, q_ptr, k_ptr, v_ptr, o_ptr, batch, heads, seq_q, seq_kv, head_dim,
                  scale, causal, *, dtype=None) -> None:
        self._require_init()
        sizes = [checks.count(v, name) for v, name in
                 ((batch, "batch"), (heads, "heads"), (seq_q, "seq_q"), (seq_kv, "seq_kv"),
                  (head_dim, "head_dim"))]
        if sizes[2] == 0 or sizes[3] == 0 or sizes[4] == 0:
            raise InvalidArgument("sequence lengths and head_dim must be > 0")
        if sizes[0] == 0 or sizes[1] == 0:
            raise InvalidArgument("attention batch and heads must be > 0")
        scale = checks.positive_scale(scale)
        _, code, size = checks.dtype_of(dtype, "float32")
        batch, heads, seq_q, seq_kv, head_dim = sizes
        q_bytes = batch * heads * seq_q * head_dim * size
        kv_bytes = batch * heads * seq_kv * head_dim * size
        q_ptr, k_ptr, v_ptr, o_ptr = (checks.pointer(p, name) for p, name in
                                      ((q_ptr, "q_ptr"), (k_ptr, "k_ptr"), (v_ptr, "v_ptr"),
                                       (o_ptr, "o_ptr")))
        operands = [(q_ptr, q_bytes, "q_ptr"), (k_ptr, kv_bytes, "k_ptr"),
                    (v_ptr, kv_bytes, "v_ptr"), (o_ptr, q_bytes, "o_ptr")]
        self._run("attention", operands, code, q_ptr, k_ptr, v_ptr, o_ptr, batch, heads, seq_q,
                  seq_kv, head_dim, scale, bool(causal))

    def reduce(self, op, input_ptr, output_ptr, shape, axis, *, dtype=None) -> None:
        self._require_init()
        op = checks.parse(ReduceOp, op, "op")
        shape = checks.dims(shape, "shape")
        if not shape:
            raise InvalidArgument("shape must not be empty")
        axis = checks.integer(axis, "axis")
        if not -len(shape) <= axis < len(shape):
            raise InvalidArgument(f"axis {axis} out of bounds for shape with "
                                  f"{len(shape)} dimensions")
        axis %= len(shape)
        _, code, size = checks.dtype_of(dtype, "float32")
        # Like jnp (and oxijax.reduce): an error even when the result is empty too.
        if shape[axis] == 0 and op in (ReduceOp.MAX, ReduceOp.MIN):
            raise InvalidArgument(f"{op.name.lower()} over an empty axis has no identity")
        outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
        if outer * inner == 0:
            return
        input_ptr = checks.pointer(input_ptr, "input_ptr")
        output_ptr = checks.pointer(output_ptr, "output_ptr")
        operands = [(input_ptr, math.prod(shape) * size, "input_ptr"),
                    (output_ptr, outer * inner * size, "output_ptr")]
        self._run("reduce", operands, code, int(op), input_ptr, output_ptr, outer, shape[axis],
                  inner)

    def unary(self, op, input_ptr, output_ptr, n, *, dtype=None) -> None:
        self._require_init()
        op = checks.parse(UnaryOp, op, "op")
        n = checks.count(n, "n")
        _, code, size = checks.dtype_of(dtype, "float32")
        if n == 0:
            return
        input_ptr = checks.pointer(input_ptr, "input_ptr")
        output_ptr = checks.pointer(output_ptr, "output_ptr")
        operands = [(input_ptr, n * size, "input_ptr"), (output_ptr, n * size, "output_ptr")]
        self._run("unary", operands, code, int(op), input_ptr, output_ptr, n)

    def binary(self, op, a_ptr, b_ptr, output_ptr, n, *, dtype=None) -> None:
        self._require_init()
        op = checks.parse(BinaryOp, op, "op")
        n = checks.count(n, "n")
        _, code, size = checks.dtype_of(dtype, "float32")
        if n == 0:
            return
        a_ptr, b_ptr, output_ptr = (checks.pointer(p, name) for p, name in
                                    ((a_ptr, "a_ptr"), (b_ptr, "b_ptr"),
                                     (output_ptr, "output_ptr")))
        operands = [(a_ptr, n * size, "a_ptr"), (b_ptr, n * size, "b_ptr"),
                    (output_ptr, n * size, "output_ptr")]
        self._run("binary", operands, code, int(op), a_ptr, b_ptr, output_ptr, n)

    # -- per backend ------------------------------------------------------------------
    def _start(self) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError

    def _no_device(self) -> Exception:
        raise NotImplementedError

    def _call(self, fn, *args):
        return fn(*args)

    def _allocate(self, nbytes: int) -> tuple[int, object]:
        raise NotImplementedError

    def _copy_in(self, dst: int, src_address: int, nbytes: int) -> None:
        raise NotImplementedError

    def _copy_out(self, dst_address: int, src: int, nbytes: int) -> None:
        raise NotImplementedError

    def _sync(self) -> None:
        raise NotImplementedError
