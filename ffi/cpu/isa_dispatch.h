// Run-time choice of the CPU kernels' instruction-set level. The extension carries one
// kernel library per level (kernel_table.h); on first use it loads the best level this
// CPU (and its OS) runs (default_isa_level), or the level named by OXIJAX_CPU_ISA,
// which may only ask for one the CPU runs (to test the lower levels on a newer CPU).
// The choice holds for the life of the process.
#pragma once

#include <string>
#include <vector>

#include "kernel_table.h"

namespace oxijax::cpu {

// The loaded table; throws std::runtime_error saying why when no library can be loaded
// (OXIJAX_CPU_ISA names a level this build lacks or this CPU cannot run, a library is
// missing or of another version).
const KernelTable& kernel_table();

template <typename T>
const Kernels<T>& kernels() {
  return kernel_table().of<T>();
}

// The levels this build has, lowest first, and those of them this CPU runs.
std::vector<std::string> built_isa_levels();
std::vector<std::string> runnable_isa_levels();
// The level loaded unless OXIJAX_CPU_ISA names another: the best this CPU runs ("" if
// none), but for a level this CPU runs slower than the one below (isa_dispatch.cc).
std::string default_isa_level();

}  // namespace oxijax::cpu
