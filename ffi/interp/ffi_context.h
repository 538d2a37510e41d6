// The CUDA FFI handlers (ffi/bindings/cuda_handlers.cc, compiled unchanged) run on the
// CPU platform in the interpreter's module: the stream decodes to a null stream
// (launches run at once), scratch memory comes from the interpreted device, and every
// buffer XLA passes is registered for the kernels' bounds checks while the call runs
// (results as uninitialised memory, filled with NaN).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "memory.h"
#include "xla/ffi/api/ffi.h"

namespace oxijax::interp {

struct FfiStream {};

// The handler's device workspace (XLA's scratch allocator on a GPU): interpreted device
// memory, freed when the call ends.
class FfiScratch {
 public:
  std::optional<void*> Allocate(size_t bytes, size_t alignment = 1) {
    // XLA's own rule (ffi_api.cc): a power of two no larger than 16 bytes.
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > 16)
      return std::nullopt;
    void* p = device_alloc(bytes, "the handler's scratch memory (" + std::to_string(bytes) +
                                      " bytes)");
    if (p == nullptr) return std::nullopt;
    blocks_->push_back(p);
    return p;
  }

 private:
  struct Blocks : std::vector<void*> {
    ~Blocks() {
      for (void* p : *this) device_free(p);
    }
  };
  std::shared_ptr<Blocks> blocks_ = std::make_shared<Blocks>();
};

// Registers the call's buffers for as long as it lives.
class CallBuffers {
 public:
  CallBuffers() = default;
  CallBuffers(const CallBuffers&) = delete;
  ~CallBuffers() {
    for (void* p : registered_) unregister_buffer(p);
  }
  void add(const xla::ffi::AnyBuffer& b) {
    add_buffer(b.untyped_data(), b.size_bytes(), "argument " + std::to_string(args_++), true);
  }
  void add(xla::ffi::Result<xla::ffi::AnyBuffer>& r) {
    add_buffer(r->untyped_data(), r->size_bytes(), "result " + std::to_string(results_++), false);
  }
  void add(const xla::ffi::RemainingArgs& rest) {
    for (size_t i = 0; i < rest.size(); ++i)
      if (auto b = rest.get<xla::ffi::AnyBuffer>(i); b.has_value()) add(*b);
  }
  template <typename T>
  void add(const T&) {}

 private:
  void add_buffer(void* p, size_t bytes, std::string label, bool initialized) {
    if (p == nullptr || bytes == 0) return;
    register_buffer(p, bytes, "XLA's " + label + " (" + std::to_string(bytes) + " bytes)",
                    initialized);
    registered_.push_back(p);
  }
  std::vector<void*> registered_;
  int args_ = 0, results_ = 0;
};

template <auto Impl>
struct FfiHandler;
template <typename... Args, xla::ffi::Error (*Impl)(Args...)>
struct FfiHandler<Impl> {
  static xla::ffi::Error Call(Args... args) noexcept {
    CallBuffers buffers;
    (buffers.add(args), ...);
    return bindings::Handler<Impl>::Call(std::move(args)...);
  }
};

}  // namespace oxijax::interp

namespace xla::ffi {
template <>
struct CtxDecoding<oxijax::interp::FfiStream> {
  using Type = cudaStream_t;
  static std::optional<Type> Decode(const XLA_FFI_Api*, XLA_FFI_ExecutionContext*,
                                    DiagnosticEngine&) {
    return Type{nullptr};
  }
};
template <>
struct CtxDecoding<oxijax::interp::FfiScratch> {
  using Type = oxijax::interp::FfiScratch;
  static std::optional<Type> Decode(const XLA_FFI_Api*, XLA_FFI_ExecutionContext*,
                                    DiagnosticEngine&) {
    return Type{};
  }
};
}  // namespace xla::ffi
