// The table of one kernel library (kernel_table.h): this level's instantiations of
// every kernel. OXIJAX_CPU_LEVEL and OXIJAX_CPU_FLAGS come from CMakeLists.txt.
#include "kernel_table.h"

namespace oxijax::cpu {
namespace {

template <typename T>
Kernels<T> kernels_of() {
  Kernels<T> k{};
#define OXIJAX_KERNEL_ENTRY(name) k.name = &cpu::name<T>;
  OXIJAX_FOR_EACH_KERNEL(OXIJAX_KERNEL_ENTRY)
#undef OXIJAX_KERNEL_ENTRY
  return k;
}

const KernelTable kTable = {kKernelTableVersion, sizeof(KernelTable), OXIJAX_CPU_LEVEL,
                            OXIJAX_CPU_FLAGS,    kernels_of<half>(),  kernels_of<bfloat16>(),
                            kernels_of<float>(), kernels_of<double>()};

}  // namespace
}  // namespace oxijax::cpu

extern "C" __attribute__((visibility("default"))) const oxijax::cpu::KernelTable*
oxijax_cpu_kernel_table() {
  return &oxijax::cpu::kTable;
}
