// Models of the PTX instructions of ffi/cuda/ptx.h, from the PTX ISA (version 9.0; the
// section of each is named beside it), not from the kernels' reading of it; where the ISA
// leaves a result to the implementation (mma's float32 sums, cvt.rna.tf32's NaN), what an
// H200 produced (tests/test_ptx_probe.py, 2026-12-04). Warp-wide instructions
// (.sync.aligned) gather every lane's operands through warp_collective, so they also
// check that the whole warp executes the same instruction together.
#include <algorithm>
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
// precision to the implementation, so the float32-accumulating shapes follow the
// hardware (fused_dot below); the f64 shape is a chain of IEEE fused multiply-adds over
// k, starting from C (bit for bit on an H200 too).

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

// One f16, bf16 or tf32 operand: |value| = significand * 2^(exponent - mantissa_bits),
// exponent the unbiased exponent field (emin for subnormals, which have no leading 1).
struct Operand {
  double value;
  bool negative;
  uint32_t significand;
  int exponent, mantissa_bits;
  bool zero, special;  // special: inf or NaN
};

Operand decode(uint32_t bits, int exponent_bits, int mantissa_bits) {
  const uint32_t mantissa = bits & ((1u << mantissa_bits) - 1);
  const uint32_t field = (bits >> mantissa_bits) & ((1u << exponent_bits) - 1);
  const int bias = (1 << (exponent_bits - 1)) - 1;
  Operand o;
  o.negative = (bits >> (mantissa_bits + exponent_bits)) & 1;
  o.zero = field == 0 && mantissa == 0;
  o.special = field == (1u << exponent_bits) - 1;
  o.significand = field ? mantissa | (1u << mantissa_bits) : mantissa;
  o.exponent = field ? int(field) - bias : 1 - bias;
  o.mantissa_bits = mantissa_bits;
  const double magnitude = o.special ? (mantissa ? NAN : INFINITY)
                                     : std::ldexp(double(o.significand), o.exponent - mantissa_bits);
  o.value = o.negative ? -magnitude : magnitude;
  return o;
}

Operand decode_f16(uint16_t bits) { return decode(bits, 5, 10); }
Operand decode_bf16(uint16_t bits) { return decode(bits, 8, 7); }
Operand decode_tf32(uint32_t bits) { return decode(bits >> 13, 8, 10); }  // low 13 ignored
Operand decode_f32(float x) { return decode(as_bits(x), 8, 23); }

// d = c + sum_k a[k] * b[k] as the float32-accumulating tensor cores compute it: the
// products exact; every nonzero product and c aligned to the largest of their exponents
// (a product's exponent the sum of its operands' exponent fields, so its significand is
// in [1, 4)); each addend truncated (toward zero) to 25 bits below that exponent; the
// truncated addends summed exactly; the sum normalised to float32 rounding toward zero.
// Why: on an H200 (sm_90) on 2026-12-04 the m16n8k16 f16/bf16 and m16n8k8 tf32 probes of
// tests/test_ptx_probe.py (seed 0) came back 1 ulp smaller in magnitude than the
// correctly rounded sum in 63, 50 and 37 of 128 words; this model reproduces every logged
// word (the differing indices and counts, and the eight hardware values printed per
// probe), where rounding the exact sum to nearest or toward zero, or truncating to
// 24, 26 or 27 bits, or in blocks of 2, 4 or 8 products, each miss several (the numerical
// behaviour of Volta/Ampere tensor cores, Fasi, Higham, Mikaitis & Pranesh 2021, with
// 2 extra alignment bits and all k products plus c in one fused sum). Not observed, so
// chosen: zeros take no part in the alignment, f16 subnormals align with exponent -14,
// inf and NaN operands give the IEEE result with NaN as 0x7fffffff, and a sum beyond
// float32's range gives inf.
template <int K>
float fused_dot(const Operand (&a)[K], const Operand (&b)[K], float c_value) {
  const Operand c = decode_f32(c_value);
  bool special = c.special;
  for (int k = 0; k < K; ++k) special |= a[k].special || b[k].special;
  if (special) {
    double sum = c.value;
    for (int k = 0; k < K; ++k) sum += a[k].value * b[k].value;
    return std::isnan(sum) ? as_float(0x7fffffffu) : float(sum);
  }
  // Addend i: |value| = significand[i] * 2^lsb[i], aligned by exponent[i].
  uint64_t significand[K + 1];
  int lsb[K + 1], exponent[K + 1];
  bool negative[K + 1];
  int n = 0;
  for (int k = 0; k < K; ++k) {
    if (a[k].zero || b[k].zero) continue;
    significand[n] = uint64_t(a[k].significand) * b[k].significand;
    exponent[n] = a[k].exponent + b[k].exponent;
    lsb[n] = exponent[n] - a[k].mantissa_bits - b[k].mantissa_bits;
    negative[n++] = a[k].negative != b[k].negative;
  }
  if (!c.zero) {
    significand[n] = c.significand;
    exponent[n] = c.exponent;
    lsb[n] = c.exponent - 23;
    negative[n++] = c.negative;
  }
  if (n == 0) {  // every addend zero: the IEEE sum of signed zeros
    double sum = c.value;
    for (int k = 0; k < K; ++k) sum += a[k].value * b[k].value;
    return float(sum);
  }
  int top = exponent[0];
  for (int i = 1; i < n; ++i) top = std::max(top, exponent[i]);
  const int cut = top - 25;  // the weight of the lowest bit kept
  int64_t sum = 0;  // each |kept| < 2^27 (a product < 2^(top + 2)), K + 1 <= 17 of them
  for (int i = 0; i < n; ++i) {
    const int shift = lsb[i] - cut;
    const uint64_t kept =
        shift >= 0 ? significand[i] << shift : (-shift < 64 ? significand[i] >> -shift : 0);
    sum += negative[i] ? -int64_t(kept) : int64_t(kept);
  }
  if (sum == 0) return 0.0f;
  const double exact = std::ldexp(double(sum), cut);  // |sum| < 2^32: exact
  if (std::fabs(exact) >= 0x1p128) return exact > 0 ? INFINITY : -INFINITY;
  float d = float(exact);  // to nearest; step back toward zero where that rounded up
  if (std::fabs(double(d)) > std::fabs(exact)) d = std::nextafter(d, 0.0f);
  return d;
}

// D = A * B + C over the lanes' m16n8 float32 accumulators, each element by fused_dot.
template <int K>
void accumulate(void* const* records, const Operand (&a)[16][K], const Operand (&b)[K][8]) {
  float c[16][8];
  for_each_accumulator([&](int lane, int i, int row, int col) {
    c[row][col] = static_cast<const MmaRecord*>(records[lane])->d[i];
  });
  for_each_accumulator([&](int lane, int i, int row, int col) {
    Operand column[K];
    for (int k = 0; k < K; ++k) column[k] = b[k][col];
    static_cast<const MmaRecord*>(records[lane])->d[i] = fused_dot<K>(a[row], column, c[row][col]);
  });
}

template <bool kBf16>
void mma_16816_complete(void* const* records, uint32_t, const void*) {
  Operand a[16][16], b[16][8];
  auto widen = [](uint16_t bits, bool bf16) { return bf16 ? decode_bf16(bits) : decode_f16(bits); };
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
  auto tf32 = decode_tf32;
  Operand a[16][8], b[8][8];
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
// bits, kept in a 32-bit register with the low 13 bits zero. The ISA only says NaN gives
// a NaN; the hardware keeps the input's bits: on an H200 on 2026-12-04 the NaN 0x7fc00000
// came back as 0x7fc00000 (not the canonical 0x7fffffff), and ptxas (CUDA 13, sm_90)
// emits no conversion instruction for it but `|x| >= inf or unordered ? x : x + 0x1000`
// and a mask of the low 13 bits, which is this model, NaN payloads included (a NaN with
// only low payload bits becomes inf there too).
uint32_t cvt_rna_tf32(float x) {
  const uint32_t bits = as_bits(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return bits & 0xffffe000u;  // inf, NaN
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
