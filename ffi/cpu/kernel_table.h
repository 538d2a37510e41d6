// The CPU kernels of kernels.h as a table of function pointers. CMakeLists.txt compiles
// the kernels once per instruction-set level (x86-64: baseline, AVX2, AVX-512) into
// shared libraries `liboxijax_cpu_<level>.so`, each exporting only
// `oxijax_cpu_kernel_table`; the extension loads the one level the CPU runs best
// (isa_dispatch.h) and calls every kernel through its table. Separate libraries, not
// one library with per-level namespaces, because a template or inline function that
// two levels both instantiate (std::vector's, ours) is merged into one copy by the
// linker, which may be the AVX-512 one: an illegal instruction on an AVX2 CPU.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels.h"

namespace oxijax::cpu {

// Bump when KernelTable's layout or a kernel's signature changes: a library of another
// version is refused at load time rather than called with the wrong arguments.
inline constexpr uint32_t kKernelTableVersion = 1;

#define OXIJAX_FOR_EACH_KERNEL(X)                                                   \
  X(unary) X(binary) X(unary_grad) X(binary_partial) X(reduce) X(gemm) X(conv2d)    \
  X(conv2d_backward_data) X(conv2d_backward_filter) X(attention) X(attention_backward) \
  X(attention_jvp)

// Every kernel for element type T.
template <typename T>
struct Kernels {
#define OXIJAX_KERNEL_POINTER(name) decltype(&cpu::name<T>) name;
  OXIJAX_FOR_EACH_KERNEL(OXIJAX_KERNEL_POINTER)
#undef OXIJAX_KERNEL_POINTER
};

struct KernelTable {
  uint32_t version;     // kKernelTableVersion of the library
  uint32_t size;        // sizeof(KernelTable) in the library
  const char* level;    // the instruction-set level, e.g. "avx2"
  const char* flags;    // the compiler flags of the library's kernels
  Kernels<half> f16;
  Kernels<bfloat16> bf16;
  Kernels<float> f32;
  Kernels<double> f64;

  template <typename T>
  const Kernels<T>& of() const {
    if constexpr (std::is_same_v<T, half>) return f16;
    else if constexpr (std::is_same_v<T, bfloat16>) return bf16;
    else if constexpr (std::is_same_v<T, float>) return f32;
    else return f64;
  }
};

}  // namespace oxijax::cpu

// The one symbol each kernel library exports.
#define OXIJAX_KERNEL_TABLE_SYMBOL "oxijax_cpu_kernel_table"
extern "C" {
typedef const oxijax::cpu::KernelTable* (*OxijaxKernelTableFn)();
}
