#include "isa_dispatch.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace oxijax::cpu {
namespace {

#if defined(__x86_64__) || defined(_M_X64)

// The x86-64 micro-architecture levels the libraries are compiled for (-march=x86-64-vN
// may use any instruction of its level; avx512bf16 adds AVX512_BF16, amx AMX-TILE and
// AMX-BF16 to that), read from cpuid, with the OS's consent for the registers' state
// (XCR0) as the AVX, AVX-512 and AMX levels require.
struct X86Levels {
  bool v3 = false;  // AVX, AVX2, BMI1, BMI2, F16C, FMA, LZCNT, MOVBE (+ the v2 set)
  bool v4 = false;       // AVX-512 F, BW, CD, DQ, VL
  bool v4_bf16 = false;  // + AVX512_BF16
  bool amx = false;      // + AMX-TILE, AMX-BF16, and Linux lets this process use them
  bool intel = false;    // GenuineIntel
};

bool bit(unsigned reg, int n) { return (reg >> n) & 1u; }

uint64_t read_xcr0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

// Linux (5.16 and newer) gives a process the 8 KiB of AMX tile state only on request
// (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); a tile instruction without it
// is a SIGILL. Older kernels refuse the request, and so does one that finds a thread's
// alternate signal stack too small for the larger signal frame.
bool linux_grants_amx() {
#if defined(__linux__)
  constexpr int kReqXcompPerm = 0x1023, kXtileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
#else
  return false;
#endif
}

X86Levels detect_x86_levels() {
  X86Levels levels;
  unsigned a, b, c1, d;
  if (!__get_cpuid(0, &a, &b, &c1, &d)) return levels;
  levels.intel = b == 0x756e6547 && d == 0x49656e69 && c1 == 0x6c65746e;  // "GenuineIntel"
  if (!__get_cpuid(1, &a, &b, &c1, &d)) return levels;
  const bool v2 = bit(c1, 0) /*SSE3*/ && bit(c1, 9) /*SSSE3*/ && bit(c1, 13) /*CX16*/ &&
                  bit(c1, 19) /*SSE4.1*/ && bit(c1, 20) /*SSE4.2*/ && bit(c1, 23) /*POPCNT*/;
  const bool osxsave = bit(c1, 27);
  if (!v2 || !osxsave) return levels;
  unsigned ext_c = 0;
  if (__get_cpuid(0x80000001u, &a, &b, &ext_c, &d) == 0) return levels;
  unsigned b7 = 0, c7 = 0, d7 = 0;
  if (!__get_cpuid_count(7, 0, &a, &b7, &c7, &d7)) return levels;
  const unsigned leaf7_subleaves = a;  // the highest subleaf of leaf 7
  const uint64_t xcr0 = read_xcr0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;    // XMM and YMM
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;  // + opmask, ZMM0-15 upper halves, ZMM16-31
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;  // XTILECFG, XTILEDATA
  levels.v3 = ymm_state && bit(c1, 12) /*FMA*/ && bit(c1, 22) /*MOVBE*/ &&
              bit(c1, 28) /*AVX*/ && bit(c1, 29) /*F16C*/ && bit(ext_c, 0) /*LAHF*/ &&
              bit(ext_c, 5) /*LZCNT*/ && bit(b7, 3) /*BMI1*/ && bit(b7, 5) /*AVX2*/ &&
              bit(b7, 8) /*BMI2*/;
  levels.v4 = levels.v3 && zmm_state && bit(b7, 16) /*AVX512F*/ && bit(b7, 17) /*DQ*/ &&
              bit(b7, 28) /*CD*/ && bit(b7, 30) /*BW*/ && bit(b7, 31) /*VL*/;
  unsigned a7_1 = 0, b7_1, c7_1, d7_1;
  if (levels.v4 && leaf7_subleaves >= 1 && __get_cpuid_count(7, 1, &a7_1, &b7_1, &c7_1, &d7_1))
    levels.v4_bf16 = bit(a7_1, 5) /*AVX512_BF16*/;
  levels.amx = levels.v4_bf16 && tile_state && bit(d7, 24) /*AMX-TILE*/ &&
               bit(d7, 22) /*AMX-BF16*/ && linux_grants_amx();
  return levels;
}

const X86Levels& this_cpu() {
  static const X86Levels cpu = detect_x86_levels();
  return cpu;
}

bool cpu_runs(const std::string& level) {
  const X86Levels& cpu = this_cpu();
  if (level == "amx") return cpu.amx;
  if (level == "avx512bf16") return cpu.v4_bf16;
  if (level == "avx512") return cpu.v4;
  if (level == "avx2") return cpu.v3;
  return level == "baseline";
}

// Whether the best level is chosen over `level` without being asked: avx512bf16 is not
// on Intel CPUs, whose VDPBF16PS is slower than widening to float FMAs (it seems to
// issue on one port, where the FMAs have two): on a Xeon with AMX, bfloat16 gemm and
// conv2d took 1.35-1.6x the time of avx512's bfloat16 widened to float. (There the amx
// level is chosen when Linux grants AMX.)
bool chosen_by_default(const std::string& level) {
  return !(level == "avx512bf16" && this_cpu().intel);
}

#else

// Other architectures build one level, their baseline (aarch64: NEON).
bool cpu_runs(const std::string&) { return true; }
bool chosen_by_default(const std::string&) { return true; }

#endif

std::vector<std::string> split_levels(const char* list) {
  std::vector<std::string> levels;
  std::stringstream stream(list);
  for (std::string level; std::getline(stream, level, ',');) levels.push_back(level);
  return levels;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// The folder of this extension, where the kernel libraries are installed beside it.
std::string extension_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&kernel_table), &info) == 0 || !info.dli_fname)
    throw std::runtime_error("oxijax: cannot locate the extension module (dladdr failed)");
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string chosen_level() {
  const std::vector<std::string> runnable = runnable_isa_levels();
  if (runnable.empty())
    throw std::runtime_error("oxijax: this CPU runs none of the kernel levels built (" +
                             join(built_isa_levels()) + ")");
  const char* forced = std::getenv("OXIJAX_CPU_ISA");
  if (!forced || !*forced) return default_isa_level();
  const std::vector<std::string> built = built_isa_levels();
  if (std::find(built.begin(), built.end(), forced) == built.end())
    throw std::runtime_error(std::string("oxijax: OXIJAX_CPU_ISA=") + forced +
                             " is not a level of this build (" + join(built) + ")");
  if (std::find(runnable.begin(), runnable.end(), forced) == runnable.end())
    throw std::runtime_error(std::string("oxijax: OXIJAX_CPU_ISA=") + forced +
                             " asks for instructions this CPU lacks (it runs: " +
                             join(runnable) + ")");
  return forced;
}

const KernelTable& load_table() {
  const std::string level = chosen_level();
  const std::string path = extension_dir() + "/liboxijax_cpu_" + level + ".so";
  // RTLD_LOCAL: the library's symbols serve only its own table.
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library)
    throw std::runtime_error("oxijax: cannot load the " + level + " CPU kernels: " +
                             std::string(dlerror()));
  auto table_fn = reinterpret_cast<OxijaxKernelTableFn>(dlsym(library, OXIJAX_KERNEL_TABLE_SYMBOL));
  const KernelTable* table = table_fn ? table_fn() : nullptr;
  if (!table || table->version != kKernelTableVersion || table->size != sizeof(KernelTable))
    throw std::runtime_error("oxijax: " + path +
                             " is from another oxijax build (kernel table version mismatch); "
                             "reinstall oxijax");
  return *table;  // the library stays loaded for the life of the process
}

}  // namespace

const KernelTable& kernel_table() {
  static const KernelTable& table = load_table();
  return table;
}

std::vector<std::string> built_isa_levels() { return split_levels(OXIJAX_CPU_LEVELS); }

std::vector<std::string> runnable_isa_levels() {
  std::vector<std::string> levels;
  for (const std::string& level : built_isa_levels())
    if (cpu_runs(level)) levels.push_back(level);
  return levels;
}

std::string default_isa_level() {
  const std::vector<std::string> runnable = runnable_isa_levels();
  for (auto level = runnable.rbegin(); level != runnable.rend(); ++level)
    if (chosen_by_default(*level)) return *level;
  return runnable.empty() ? std::string() : runnable.front();
}

}  // namespace oxijax::cpu
