// Every inline PTX instruction the kernels use, each as one small device function: the
// only `asm` in ffi/cuda. Under OXIJAX_CUDA_INTERPRET (the CUDA interpreter, ffi/interp)
// each function calls the interpreter's model of the instruction instead; that model
// (ffi/interp/ptx.cc) follows the PTX ISA section cited here, not these kernels' use of it.
//
// Shared-memory operands are 32-bit shared-window addresses (shared_address()).
// Fragment layouts (PTX ISA 9.0, "Warp-level Matrix Multiply-Accumulate Instructions":
// "Matrix Fragments for mma.m16n8k16 / mma.m16n8k8 / mma.m8n8k4"); lane = 4 * g + t (g = groupID = lane / 4, t = lane % 4):
//  m16n8k16 (f16, bf16): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..2t+1], a2 = A[g][2t+8..2t+9],
//    a3 = A[g+8][2t+8..2t+9] (two 16-bit elements per register, the lower column in bits
//    0..15); b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g].
//  m16n8k8 (tf32): a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4], a3 = A[g+8][t+4];
//    b0 = B[t][g], b1 = B[t+4][g].
//  m16n8 float32 accumulators: c0, c1 = C[g][2t..2t+1], c2, c3 = C[g+8][2t..2t+1].
//  m8n8k4 (f64): a0 = A[g][t]; b0 = B[t][g]; c0, c1 = C[g][2t], C[g][2t+1].
// ldmatrix .x4 (PTX ISA, "Warp-level matrix load instruction: ldmatrix"): lanes 8j..8j+7 give the 16-byte row addresses of
//   8x8 b16 matrix j, which lands in register j; without .trans lane l receives row l/4,
//   elements 2(l%4) and 2(l%4)+1 of every matrix; with .trans the same of its transpose.
#pragma once

#include <cstdint>

#ifdef OXIJAX_CUDA_INTERPRET
#include "oxijax_interp.h"
#else
#include <cuda_runtime.h>
#endif

// The tensor-core and cp.async instructions need sm_80; compiled for an older GPU they trap.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define OXIJAX_PTX_SM80 0
#else
#define OXIJAX_PTX_SM80 1
#endif

namespace oxijax::cuda::ptx {

// The shared-window address of a generic pointer into shared memory (PTX ISA, "Data Movement and
// Conversion Instructions: cvta").
__device__ __forceinline__ uint32_t shared_address(const void* p) {
#ifdef OXIJAX_CUDA_INTERPRET
  return interp::shared_address(p);
#else
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#endif
}

// cp.async (PTX ISA, "Data Movement and Conversion Instructions: cp.async"): copies src_bytes (0..kBytes) from global src to shared
// dst and zero-fills the rest of the kBytes; with src_bytes == 0 nothing is read. dst and
// src are kBytes-aligned. 16 bytes bypass L1 (.cg), 4 and 8 cache in L1 (.ca, the only
// mode for them). The data lands at the latest when a cp_async_wait retires the group.
template <int kBytes>
__device__ __forceinline__ void cp_async(uint32_t dst, const void* src, int src_bytes) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
#ifdef OXIJAX_CUDA_INTERPRET
  interp::cp_async(dst, src, kBytes, src_bytes);
#elif OXIJAX_PTX_SM80
  const size_t global = __cvta_generic_to_global(src);
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global),
                 "r"(src_bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(global),
                 "n"(kBytes), "r"(src_bytes)
                 : "memory");
  }
#else
  __trap();
#endif
}

// cp.async.commit_group (PTX ISA, "cp.async.commit_group"): the thread's cp.asyncs since the last
// commit form one group.
__device__ __forceinline__ void cp_async_commit() {
#ifdef OXIJAX_CUDA_INTERPRET
  interp::cp_async_commit();
#elif OXIJAX_PTX_SM80
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// cp.async.wait_group N (PTX ISA, "cp.async.wait_group"): waits until at most kPending of the
// thread's committed groups are in flight. Other threads see the data after a barrier.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#ifdef OXIJAX_CUDA_INTERPRET
  interp::cp_async_wait(kPending);
#elif OXIJAX_PTX_SM80
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX ISA, "Warp-level matrix load instruction: ldmatrix"): see the layout
// above. A warp-wide instruction: every lane of the warp executes it together.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
#ifdef OXIJAX_CUDA_INTERPRET
  interp::ldmatrix_x4(r, addr, false);
#elif OXIJAX_PTX_SM80
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
#ifdef OXIJAX_CUDA_INTERPRET
  interp::ldmatrix_x4(r, addr, true);
#elif OXIJAX_PTX_SM80
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
#else
  __trap();
#endif
}

// d += a * b, mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32
// (PTX ISA, "Warp-level Matrix Multiply-Accumulate
// Instructions: mma"): A 16x16 row-major, B 16x8 column-major, float32 C and D.
template <bool kBf16>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
#ifdef OXIJAX_CUDA_INTERPRET
  interp::mma_m16n8k16(d, a, b, kBf16);
#elif OXIJAX_PTX_SM80
  if constexpr (kBf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  __trap();
#endif
}

// d += a * b, mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (PTX ISA, "Warp-level Matrix Multiply-Accumulate
// Instructions: mma");
// a and b hold tf32 values (cvt_rna_tf32) in 32-bit registers.
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4],
                                                 const uint32_t (&b)[2]) {
#ifdef OXIJAX_CUDA_INTERPRET
  interp::mma_m16n8k8_tf32(d, a, b);
#elif OXIJAX_PTX_SM80
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();
#endif
}

// d += a * b, mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 (PTX ISA, "Warp-level Matrix Multiply-Accumulate
// Instructions: mma").
__device__ __forceinline__ void mma_m8n8k4_f64(double (&d)[2], double a, double b) {
#ifdef OXIJAX_CUDA_INTERPRET
  interp::mma_m8n8k4_f64(d, a, b);
#elif OXIJAX_PTX_SM80
  asm("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
      : "+d"(d[0]), "+d"(d[1])
      : "d"(a), "d"(b));
#else
  __trap();
#endif
}

// cvt.rna.tf32.f32 (PTX ISA, "Data Movement and Conversion Instructions: cvt"): x rounded to tf32 (10 mantissa bits, ties away
// from zero), as float32 bits with the low 13 bits zero.
__device__ __forceinline__ uint32_t cvt_rna_tf32(float x) {
#ifdef OXIJAX_CUDA_INTERPRET
  return interp::cvt_rna_tf32(x);
#elif OXIJAX_PTX_SM80
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
#else
  __trap();
  return 0;
#endif
}

// cvt.rn.{bf16x2,f16x2}.f32 (PTX ISA, "Data Movement and Conversion Instructions: cvt"): two floats rounded to nearest even into
// one b16x2 register, lo in bits 0..15 (the instruction's second source operand).
template <bool kBf16>
__device__ __forceinline__ uint32_t cvt_rn_pack(float lo, float hi) {
#ifdef OXIJAX_CUDA_INTERPRET
  return interp::cvt_rn_pack(lo, hi, kBf16);
#elif OXIJAX_PTX_SM80
  uint32_t r;
  if constexpr (kBf16) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
#else
  __trap();
  return 0;
#endif
}

// ex2.approx.ftz.f32 (PTX ISA, "Floating-Point Instructions: ex2"): 2^x, maximum relative error 2^-22 (about 2 ulp);
// 2^-inf = +0, NaN stays NaN, subnormal inputs and results flush to zero.
__device__ __forceinline__ float ex2_approx_ftz(float x) {
#ifdef OXIJAX_CUDA_INTERPRET
  return interp::ex2_approx_ftz(x);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#endif
}

// st.shared.v4.b32 (PTX ISA, "Data Movement and Conversion Instructions: st"): one 16-byte store to a 16-byte aligned address.
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint32_t w0, uint32_t w1,
                                             uint32_t w2, uint32_t w3) {
#ifdef OXIJAX_CUDA_INTERPRET
  interp::st_shared_v4(addr, w0, w1, w2, w3);
#else
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(w0), "r"(w1),
               "r"(w2), "r"(w3)
               : "memory");
#endif
}

}  // namespace oxijax::cuda::ptx
