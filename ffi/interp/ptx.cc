// Models of the PTX instructions of ffi/cuda/ptx.h, from the PTX ISA (version 9.0; the
// section of each is named beside it), not from the kernels' reading of it. Warp-wide
// instructions (.sync.aligned) gather every lane's operands through warp_collective, so
// they also check that the whole warp executes the same instruction together.
#include <cmath>
#include <cstring>
#include <sstream>

#include "oxijax/numeric.h"
#include "state.h"

namespace oxijax::interp {
namespace {

constexpr uint32_t kFullWarp = 0xffffffffu;

float as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t as_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// 16-bit element `half` (0: bits 0..15, 1: bits 16..31) of a b16x2 register.
uint16_t b16(uint32_t reg, int half) { return uint16_t(reg >> (16 * half)); }

double widen(uint16_t bits, bool bf16) {
  return bf16 ? double(oxijax::bfloat16_to_float(bits)) : double(oxijax::half_to_float(bits));
}

}  // namespace

// ---------------------------------------------------------------- cp.async
// "Data Movement and Conversion Instructions: cp.async": cp-size 4, 8 or 16; src-size
// bytes are read, the rest of cp-size is zero-filled; both addresses aligned to cp-size.
// The write to shared memory is performed asynchronously: here it lands when a
// cp.async.wait_group (or the thread's exit) retires its group, and until then the
// bytes are pending (a read of them is reported).

void cp_async(uint32_t dst, const void* src, int bytes, int src_bytes) {
  InRuntime in_runtime;
  const void* pc = __builtin_return_address(0);
  Thread& t = *tls_thread;
  Block& b = *tls_block;
  if (src_bytes < 0 || src_bytes > bytes)
    fail(cudaErrorIllegalInstruction, "cp.async with src-size " + std::to_string(src_bytes) +
                                          " outside 0.." + std::to_string(bytes) + ", at " +
                                          describe_code(code_offset(pc)));
  if (dst % uint32_t(bytes) != 0 || reinterpret_cast<uintptr_t>(src) % uintptr_t(bytes) != 0) {
    std::ostringstream why;
    why << "misaligned cp.async of " << bytes << " bytes: shared address " << dst
        << ", global address " << src << ", at " << describe_code(code_offset(pc));
    fail(cudaErrorMisalignedAddress, why.str());
  }
  if (src_bytes > 0)  // bounds now, where the report can name the instruction
    check_access(reinterpret_cast<uintptr_t>(src), size_t(src_bytes), Access::kRead, pc,
                 t.linear);
  mark_pending(b, t.linear, dst, bytes, pc);
  t.open_group.push_back(PendingCopy{dst, src, bytes, src_bytes, pc});
}

// "cp.async.commit_group": an empty group when no cp.async is outstanding.
void cp_async_commit() {
  InRuntime in_runtime;
  Thread& t = *tls_thread;
  t.committed.push_back(std::move(t.open_group));
  t.open_group.clear();
}

// "cp.async.wait_group": all but the `pending` most recent committed groups complete.
void cp_async_wait(int pending) {
  InRuntime in_runtime;
  Thread& t = *tls_thread;
  Block& b = *tls_block;
  while (t.committed.size() > size_t(pending)) {
    for (const PendingCopy& copy : t.committed.front()) land_copy(b, t.linear, copy);
    t.committed.pop_front();
  }
}

// ---------------------------------------------------------------- ldmatrix
// "Warp-level matrix load instruction: ldmatrix" (.m8n8.x4.shared.b16): lanes 8j..8j+7
// hold the addresses of rows 0..7 of matrix j (16 bytes each, 16-byte aligned); register
// j of lane l receives row l/4, elements 2(l%4) and 2(l%4)+1 of matrix j (the lower
// column in bits 0..15); .trans delivers the transposed matrix instead.

namespace {
struct LdmatrixRecord {
  uint32_t addr;
  uint32_t* out;
};

template <bool kTrans>
void ldmatrix_complete(void* const* records, uint32_t, const void* pc) {
  const int warp = tls_thread->warp;
  uint16_t m[4][8][8];
  for (int j = 0; j < 4; ++j)
    for (int row = 0; row < 8; ++row) {
      const int lane = 8 * j + row;
      const auto* r = static_cast<const LdmatrixRecord*>(records[lane]);
      const unsigned char* p = shared_pointer(r->addr, 16, 16, Access::kRead, pc,
                                              warp * 32 + lane, "ldmatrix row address");
      std::memcpy(m[j][row], p, 16);
    }
  for (int lane = 0; lane < 32; ++lane) {
    auto* r = static_cast<const LdmatrixRecord*>(records[lane]);
    const int row = lane / 4, col = 2 * (lane % 4);
    for (int j = 0; j < 4; ++j) {
      const uint16_t lo = kTrans ? m[j][col][row] : m[j][row][col];
      const uint16_t hi = kTrans ? m[j][col + 1][row] : m[j][row][col + 1];
      r->out[j] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
  }
}
}  // namespace

void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr, bool trans) {
  InRuntime in_runtime;
  LdmatrixRecord record{addr, r};
  if (trans)
    warp_collective("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", kFullWarp, &record,
                    &ldmatrix_complete<true>, __builtin_return_address(0));
  else
    warp_collective("ldmatrix.sync.aligned.m8n8.x4.shared.b16", kFullWarp, &record,
                    &ldmatrix_complete<false>, __builtin_return_address(0));
}

// ---------------------------------------------------------------- mma
// "Warp-level Matrix Multiply-Accumulate Instructions: mma" with the fragment layouts of
// "Matrix Fragments for mma.m16n8k16 / mma.m16n8k8 / mma.m8n8k4" (groupID g = lane / 4,
// threadID_in_group t = lane % 4). The ISA leaves the accumulation order and internal
// precision to the implementation; the model: exact products (16-bit and tf32 products
// fit a double exactly), summed with C in double, rounded once to float32 (nearest even).
// The f64 shape is a chain of IEEE fused multiply-adds over k, starting from C.

namespace {
struct MmaRecord {
  float* d;
  uint32_t a[4], b[2];
};

// Element (row, col) of the 16x8 float accumulator tile held by `records`.
template <typename Fn>
void for_each_accumulator(Fn&& fn) {
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) fn(lane, i, g + 8 * (i / 2), 2 * t + (i % 2));
  }
}

// D = A * B + C over the lanes' m16n8 float32 accumulators: the products exact, summed
// with C in double, rounded once.
template <int K>
void accumulate(void* const* records, const double (&a)[16][K], const double (&b)[K][8]) {
  double c[16][8];
  for_each_accumulator([&](int lane, int i, int row, int col) {
    c[row][col] = static_cast<const MmaRecord*>(records[lane])->d[i];
  });
  for_each_accumulator([&](int lane, int i, int row, int col) {
    double sum = c[row][col];
    for (int k = 0; k < K; ++k) sum += a[row][k] * b[k][col];
    static_cast<const MmaRecord*>(records[lane])->d[i] = float(sum);
  });
}

template <bool kBf16>
void mma_16816_complete(void* const* records, uint32_t, const void*) {
  double a[16][16], b[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const auto* r = static_cast<const MmaRecord*>(records[lane]);
    const int g = lane / 4, t = lane % 4;
    for (int h = 0; h < 2; ++h) {
      a[g][2 * t + h] = widen(b16(r->a[0], h), kBf16);
      a[g + 8][2 * t + h] = widen(b16(r->a[1], h), kBf16);
      a[g][2 * t + 8 + h] = widen(b16(r->a[2], h), kBf16);
      a[g + 8][2 * t + 8 + h] = widen(b16(r->a[3], h), kBf16);
      b[2 * t + h][g] = widen(b16(r->b[0], h), kBf16);
      b[2 * t + 8 + h][g] = widen(b16(r->b[1], h), kBf16);
    }
  }
  accumulate(records, a, b);
}

void mma_1688_tf32_complete(void* const* records, uint32_t, const void*) {
  // tf32 operands: the 19 high bits of each register (the low 13 are ignored).
  auto tf32 = [](uint32_t bits) { return double(as_float(bits & 0xffffe000u)); };
  double a[16][8], b[8][8];
  for (int lane = 0; lane < 32; ++lane) {
    const auto* r = static_cast<const MmaRecord*>(records[lane]);
    const int g = lane / 4, t = lane % 4;
    a[g][t] = tf32(r->a[0]);
    a[g + 8][t] = tf32(r->a[1]);
    a[g][t + 4] = tf32(r->a[2]);
    a[g + 8][t + 4] = tf32(r->a[3]);
    b[t][g] = tf32(r->b[0]);
    b[t + 4][g] = tf32(r->b[1]);
  }
  accumulate(records, a, b);
}

struct MmaF64Record {
  double* d;
  double a, b;
};

void mma_884_f64_complete(void* const* records, uint32_t, const void*) {
  double a[8][4], b[4][8];
  for (int lane = 0; lane < 32; ++lane) {
    const auto* r = static_cast<const MmaF64Record*>(records[lane]);
    a[lane / 4][lane % 4] = r->a;
    b[lane % 4][lane / 4] = r->b;
  }
  for (int lane = 0; lane < 32; ++lane) {
    const auto* r = static_cast<const MmaF64Record*>(records[lane]);
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 2; ++i) {
      double sum = r->d[i];
      for (int k = 0; k < 4; ++k) sum = std::fma(a[g][k], b[k][2 * t + i], sum);
      r->d[i] = sum;
    }
  }
}
}  // namespace

void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16) {
  InRuntime in_runtime;
  MmaRecord record{d, {a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
  if (bf16)
    warp_collective("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", kFullWarp, &record,
                    &mma_16816_complete<true>, __builtin_return_address(0));
  else
    warp_collective("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", kFullWarp, &record,
                    &mma_16816_complete<false>, __builtin_return_address(0));
}

void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  InRuntime in_runtime;
  MmaRecord record{d, {a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
  warp_collective("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", kFullWarp, &record,
                  &mma_1688_tf32_complete, __builtin_return_address(0));
}

void mma_m8n8k4_f64(double (&d)[2], double a, double b) {
  InRuntime in_runtime;
  MmaF64Record record{d, a, b};
  warp_collective("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64", kFullWarp, &record,
                  &mma_884_f64_complete, __builtin_return_address(0));
}

// ---------------------------------------------------------------- cvt
// "Data Movement and Conversion Instructions: cvt".

// .rna.tf32.f32: round to nearest, ties away from zero, to tf32's 10 explicit mantissa
// bits, kept in a 32-bit register with the low 13 bits zero; NaN gives a NaN.
uint32_t cvt_rna_tf32(float x) {
  const uint32_t bits = as_bits(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return (bits & 0x7fffffu) ? 0x7fffffffu : bits;
  return (bits + 0x1000u) & 0xffffe000u;  // sign-magnitude: adding half an ulp rounds away
}

// .rn.{f16x2,bf16x2}.f32 d, a, b: d = {cvt(a) in bits 16..31, cvt(b) in bits 0..15},
// round to nearest even; a NaN input gives the canonical NaN 0x7fff.
uint32_t cvt_rn_pack(float lo, float hi, bool bf16) {
  auto cvt = [bf16](float v) -> uint32_t {
    if (std::isnan(v)) return 0x7fffu;
    return bf16 ? oxijax::float_to_bfloat16(v) : oxijax::float_to_half(v);
  };
  return cvt(lo) | (cvt(hi) << 16);
}

// ---------------------------------------------------------------- ex2
// "Floating-Point Instructions: ex2" (.approx.ftz.f32): 2^x with a maximum relative
// error of 2^-22; subnormal inputs and results flush to sign-preserving zero; ex2(-inf)
// = +0, ex2(+inf) = +inf, NaN gives NaN. Model: the correctly rounded value (the
// hardware's own approximation is not specified; the gpu test measures the distance).
float ex2_approx_ftz(float x) {
  if (std::isnan(x)) return as_float(0x7fffffffu);
  if (std::fpclassify(x) == FP_SUBNORMAL) x = 0.0f;
  const float y = float(std::exp2(double(x)));
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
}

// ---------------------------------------------------------------- st.shared
// "Data Movement and Conversion Instructions: st" (.shared.v4.b32): 16 bytes, 16-byte
// aligned.
void st_shared_v4(uint32_t addr, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  InRuntime in_runtime;
  const uint32_t w[4] = {w0, w1, w2, w3};
  unsigned char* p = shared_pointer(addr, 16, 16, Access::kWrite, __builtin_return_address(0),
                                    tls_thread->linear, "st.shared.v4.b32");
  std::memcpy(p, w, 16);
}

// ---------------------------------------------------------------- atomics
// "Parallel Synchronization and Communication Instructions: atom": one indivisible
// read-modify-write; blocks of a launch run one at a time here, so it is one.

uint64_t atomic_rmw(void* addr, int bytes, AtomicOp op, bool floating, bool is_signed,
                    uint64_t operand, uint64_t compare) {
  InRuntime in_runtime;
  const void* pc = __builtin_return_address(0);
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  if (a % uintptr_t(bytes) != 0)
    fail(cudaErrorMisalignedAddress, "misaligned atomic at " + describe_code(code_offset(pc)));
  check_access(a, size_t(bytes), Access::kAtomic, pc, tls_thread->linear);
  uint64_t old = 0;
  std::memcpy(&old, addr, size_t(bytes));
  auto combine = [&](auto o, auto v) -> decltype(o) {
    switch (op) {
      case AtomicOp::kAdd: return o + v;
      case AtomicOp::kMax: return o > v ? o : v;
      case AtomicOp::kMin: return o < v ? o : v;
      case AtomicOp::kExch: return v;
      case AtomicOp::kCas: return o;  // handled below
    }
    return o;
  };
  uint64_t result = old;
  if (op == AtomicOp::kCas) {
    result = (old == compare) ? operand : old;
  } else if (floating && bytes == 4) {
    float o, v;
    std::memcpy(&o, &old, 4);
    std::memcpy(&v, &operand, 4);
    const float r = combine(o, v);
    std::memcpy(&result, &r, 4);
  } else if (floating && bytes == 8) {
    double o, v;
    std::memcpy(&o, &old, 8);
    std::memcpy(&v, &operand, 8);
    const double r = combine(o, v);
    std::memcpy(&result, &r, 8);
  } else if (is_signed && bytes == 4) {
    result = uint32_t(combine(int32_t(old), int32_t(operand)));
  } else if (is_signed && bytes == 8) {
    result = uint64_t(combine(int64_t(old), int64_t(operand)));
  } else if (bytes == 4) {
    result = uint32_t(combine(uint32_t(old), uint32_t(operand)));
  } else {
    result = combine(old, operand);
  }
  std::memcpy(addr, &result, size_t(bytes));
  return old;
}

}  // namespace oxijax::interp
