#include "cuda_device.h"

#include <cuda_runtime_api.h>

#include <string>

#include "cuda/kernels.h"
#include "errors.h"

namespace oxijax::backend {

class CudaDevice::Current {
 public:
  explicit Current(const CudaDevice& d) : d_(d) {
    d_.driver_.check(d_.driver_.ctx_push_current(d_.ctx_), "cuCtxPushCurrent");
  }
  ~Current() {
    CUcontext popped;
    d_.driver_.ctx_pop_current(&popped);
  }

 private:
  const CudaDevice& d_;
};

CudaDevice::CudaDevice(int ordinal) : driver_(CudaDriver::get()), ordinal_(ordinal) {
  driver_.check(driver_.init(0), "cuInit");
  driver_.check(driver_.device_get(&device_, ordinal), "cuDeviceGet");
  driver_.check(driver_.primary_ctx_retain(&ctx_, device_), "cuDevicePrimaryCtxRetain");
  try {
    Current current(*this);
    driver_.check(driver_.stream_create(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  } catch (...) {
    driver_.primary_ctx_release(device_);
    throw;
  }
}

CudaDevice::~CudaDevice() {
  // Reached when Python drops the device; close() normally released everything.
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  live_ = 0;  // leaks what is still allocated rather than free it under its owner
  release_if_done();
}

void CudaDevice::require_open() const {
  if (closed_) throw DriverFailure(kClosed, "BACKEND_CLOSED", "the CUDA backend was closed");
}

std::shared_lock<std::shared_mutex> CudaDevice::use() {
  std::shared_lock<std::shared_mutex> lock(use_mu_);
  // closed_ is set before the release waits for use_mu_: an op that gets the lock after
  // close() sees it, one that got it before finishes enqueuing before the release.
  require_open();
  return lock;
}

void CudaDevice::release_if_done() noexcept {
  if (!closed_ || released_ || live_ > 0) return;
  released_ = true;
  // Waits for the ops that passed their open check (and so for the workspace's users).
  std::unique_lock<std::shared_mutex> in_use(use_mu_);
  std::lock_guard<std::mutex> workspace_lock(workspace_mu_);  // workspace_ is freed here
  try {
    Current current(*this);
    driver_.stream_synchronize(stream_);
    if (workspace_ != 0) driver_.mem_free(workspace_);
    driver_.stream_destroy(stream_);
  } catch (const DriverFailure&) {
    // The driver is shutting down (process exit): nothing left to clean up.
  }
  // Only our retain is dropped: JAX's client keeps the context alive if it uses it,
  // and nothing here resets the device.
  driver_.primary_ctx_release(device_);
}

void CudaDevice::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  release_if_done();
}

uintptr_t CudaDevice::alloc(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  require_open();
  Current current(*this);
  CUdeviceptr ptr = 0;
  driver_.check(driver_.mem_alloc(&ptr, bytes), "cuMemAlloc");
  ++live_;
  return static_cast<uintptr_t>(ptr);
}

void CudaDevice::free(uintptr_t ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  if (released_) throw DriverFailure(kClosed, "BACKEND_CLOSED", "the CUDA backend was closed");
  {
    Current current(*this);
    // Work already queued may still read or write the memory.
    driver_.check(driver_.stream_synchronize(stream_), "cuStreamSynchronize");
    driver_.check(driver_.mem_free(static_cast<CUdeviceptr>(ptr)), "cuMemFree");
  }
  --live_;
  release_if_done();
}

void CudaDevice::htod(uintptr_t dst, uintptr_t src, size_t bytes) {
  const auto in_use = use();
  Current current(*this);
  driver_.check(driver_.memcpy_htod_async(static_cast<CUdeviceptr>(dst), at<const void>(src),
                                          bytes, stream_),
                "cuMemcpyHtoDAsync");
  driver_.check(driver_.stream_synchronize(stream_), "cuStreamSynchronize");
}

void CudaDevice::dtoh(uintptr_t dst, uintptr_t src, size_t bytes) {
  const auto in_use = use();
  Current current(*this);
  driver_.check(driver_.memcpy_dtoh_async(at<void>(dst), static_cast<CUdeviceptr>(src), bytes,
                                          stream_),
                "cuMemcpyDtoHAsync");
  driver_.check(driver_.stream_synchronize(stream_), "cuStreamSynchronize");
}

void CudaDevice::synchronize() {
  const auto in_use = use();
  Current current(*this);
  driver_.check(driver_.stream_synchronize(stream_), "cuStreamSynchronize");
}

std::pair<size_t, size_t> CudaDevice::mem_info() {
  const auto in_use = use();
  Current current(*this);
  size_t free_bytes = 0, total_bytes = 0;
  driver_.check(driver_.mem_get_info(&free_bytes, &total_bytes), "cuMemGetInfo");
  return {free_bytes, total_bytes};
}

void* CudaDevice::workspace(size_t bytes) {
  if (bytes > workspace_bytes_) {
    // Kernels queued earlier may still use the old buffer.
    driver_.check(driver_.stream_synchronize(stream_), "cuStreamSynchronize");
    if (workspace_ != 0) driver_.check(driver_.mem_free(workspace_), "cuMemFree");
    workspace_ = 0;
    workspace_bytes_ = 0;
    const size_t rounded = (bytes + (size_t{1} << 20) - 1) & ~((size_t{1} << 20) - 1);
    driver_.check(driver_.mem_alloc(&workspace_, rounded), "cuMemAlloc (workspace)");
    workspace_bytes_ = rounded;
  }
  return reinterpret_cast<void*>(workspace_);
}

namespace {

// The driver's CUresult for a launcher's runtime status: DriverFailure carries the
// driver's codes and names (SPEC section 2). The runtime's codes are the driver's wherever
// both APIs have the error (driver_types.h and cuda.h: cudaErrorMemoryAllocation =
// CUDA_ERROR_OUT_OF_MEMORY, cudaErrorLaunchFailure = CUDA_ERROR_LAUNCH_FAILED, ...). A
// launch configuration the device cannot run, the runtime's own
// cudaErrorInvalidConfiguration, is cuLaunchKernel's CUDA_ERROR_INVALID_VALUE; any other
// runtime-only code (one the driver does not know) is CUDA_ERROR_UNKNOWN.
CUresult driver_result(const CudaDriver& driver, cudaError_t status) {
  static_assert(int(cudaErrorMemoryAllocation) == int(CUDA_ERROR_OUT_OF_MEMORY) &&
                    int(cudaErrorLaunchFailure) == int(CUDA_ERROR_LAUNCH_FAILED) &&
                    int(cudaErrorIllegalAddress) == int(CUDA_ERROR_ILLEGAL_ADDRESS),
                "the runtime's codes are the driver's");
  if (status == cudaErrorInvalidConfiguration) return CUDA_ERROR_INVALID_VALUE;
  const CUresult same = static_cast<CUresult>(status);
  const char* name = nullptr;
  return driver.get_error_name(same, &name) == CUDA_SUCCESS ? same : CUDA_ERROR_UNKNOWN;
}

// Throws the DriverFailure of a failed launch: the driver's code and name, the runtime's
// own name and description in the message.
void launched(cudaError_t status, const char* op) {
  if (status == cudaSuccess) return;
  const CudaDriver& driver = CudaDriver::get();  // loaded: the device exists
  const CUresult result = driver_result(driver, status);
  const char* name = nullptr;
  if (driver.get_error_name(result, &name) != CUDA_SUCCESS) name = "CUDA_ERROR_UNKNOWN";
  throw DriverFailure(static_cast<int>(result), name,
                      std::string("CUDA ") + op + " kernel launch failed: " +
                          cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

}  // namespace

// The launchers take the runtime's stream type; a driver stream is the same object.
#define OXIJAX_STREAM reinterpret_cast<cudaStream_t>(stream_)

void CudaDevice::unary(int dtype, int op, uintptr_t x, uintptr_t y, int64_t n) {
  const auto in_use = use();
  Current current(*this);
  with_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    launched(cuda::unary(OXIJAX_STREAM, static_cast<UnaryOp>(op), at<const T>(x), at<T>(y), n),
             "unary");
  });
}

void CudaDevice::binary(int dtype, int op, uintptr_t a, uintptr_t b, uintptr_t out, int64_t n) {
  const auto in_use = use();
  const BroadcastShape shape = flat_shape(n);
  Current current(*this);
  with_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    launched(cuda::binary(OXIJAX_STREAM, static_cast<BinaryOp>(op), shape, at<const T>(a),
                          at<const T>(b), at<T>(out)),
             "binary");
  });
}

void CudaDevice::reduce(int dtype, int op, uintptr_t x, uintptr_t out, const ReduceShape& shape) {
  const auto in_use = use();
  Current current(*this);
  with_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    std::lock_guard<std::mutex> lock(workspace_mu_);
    const size_t bytes = cuda::reduce_workspace_bytes(shape, sizeof(T));
    void* ws = bytes > 0 ? workspace(bytes) : nullptr;
    launched(cuda::reduce(OXIJAX_STREAM, static_cast<ReduceOp>(op), shape, at<const T>(x),
                          at<T>(out), ws),
             "reduce");
  });
}

void CudaDevice::gemm(int dtype, const GemmProblem& problem, uintptr_t a, uintptr_t b,
                      uintptr_t c) {
  const auto in_use = use();
  const GemmShape shape = gemm_shape(problem);
  Current current(*this);
  with_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    // The pointer backend's float32 gemm is exact (no TF32), like the CPU one.
    std::lock_guard<std::mutex> lock(workspace_mu_);
    const size_t bytes = cuda::gemm_workspace_bytes(shape, sizeof(T), false);
    void* ws = bytes > 0 ? workspace(bytes) : nullptr;
    launched(cuda::gemm(OXIJAX_STREAM, shape, at<const T>(a), at<const T>(b),
                        problem.beta != 0.0 ? at<const T>(c) : nullptr, at<T>(c), false, ws),
             "gemm");
  });
}

void CudaDevice::conv2d(int dtype, const ConvArgs& args) {
  const auto in_use = use();
  const ConvShape shape =
      conv_shape(args.input, args.filter, args.output, args.stride, args.padding);
  Current current(*this);
  with_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    launched(cuda::conv2d(OXIJAX_STREAM, shape, at<const T>(args.x), at<const T>(args.w),
                          at<T>(args.out)),
             "conv2d");
  });
}

void CudaDevice::attention(int dtype, const AttentionArgs& args) {
  const auto in_use = use();
  const AttentionShape& s = args.shape;
  Current current(*this);
  with_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    std::lock_guard<std::mutex> lock(workspace_mu_);
    // The kernels also write each row's log-sum-exp (for the JAX backward pass).
    void* lse = workspace(size_t(s.batch * s.heads * s.seq_q) * sizeof(Acc<T>));
    launched(cuda::attention(OXIJAX_STREAM, s, at<const T>(args.q), at<const T>(args.k),
                             at<const T>(args.v), at<T>(args.out), static_cast<Acc<T>*>(lse),
                             /*allow_tf32=*/false),
             "attention");
  });
}

#undef OXIJAX_STREAM

}  // namespace oxijax::backend
