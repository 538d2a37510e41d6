// Helpers shared by the FFI handlers of every platform: enum attributes, dtype
// dispatch and error construction.
#pragma once

#include <exception>
#include <new>
#include <string>
#include <type_traits>

#include "oxijax/numeric.h"
#include "oxijax/ops.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// Enum attributes arrive as int32 (the Python side passes np.int32 codes).
XLA_FFI_REGISTER_ENUM_ATTR_DECODING(oxijax::Transpose);
XLA_FFI_REGISTER_ENUM_ATTR_DECODING(oxijax::ReduceOp);
XLA_FFI_REGISTER_ENUM_ATTR_DECODING(oxijax::UnaryOp);
XLA_FFI_REGISTER_ENUM_ATTR_DECODING(oxijax::BinaryOp);

namespace oxijax::bindings {

inline ffi::Error invalid(const std::string& message) {
  return ffi::Error::InvalidArgument("oxijax: " + message);
}

// Calls body(T{}) with T the storage type of `dtype`; other dtypes are rejected.
template <typename Body>
ffi::Error dispatch_float(ffi::DataType dtype, Body&& body) {
  switch (dtype) {
    case ffi::DataType::F16: return body(half{});
    case ffi::DataType::BF16: return body(bfloat16{});
    case ffi::DataType::F32: return body(float{});
    case ffi::DataType::F64: return body(double{});
    default:
      return invalid("unsupported dtype (expected float16, bfloat16, float32 or float64)");
  }
}

// Handler<Impl>::Call runs Impl and turns any C++ exception (a kernel's scratch
// allocation failing with std::bad_alloc, ...) into an ffi::Error: nothing may unwind
// through XLA's C API, which would abort the user's process.
template <auto Impl>
struct Handler;
template <typename... Args, ffi::Error (*Impl)(Args...)>
struct Handler<Impl> {
  static ffi::Error Call(Args... args) noexcept {
    try {
      return Impl(std::move(args)...);
    } catch (const std::bad_alloc&) {
      return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                        "oxijax: out of host memory (a kernel's scratch allocation failed)");
    } catch (const std::exception& e) {
      return ffi::Error::Internal(std::string("oxijax: internal error: ") + e.what());
    } catch (...) {
      return ffi::Error::Internal("oxijax: internal error (unknown exception)");
    }
  }
};

template <typename T>
const T* typed(const ffi::AnyBuffer& buffer) {
  return static_cast<const T*>(buffer.untyped_data());
}
template <typename T>
T* typed(ffi::Result<ffi::AnyBuffer>& buffer) {
  return static_cast<T*>(buffer->untyped_data());
}

}  // namespace oxijax::bindings
