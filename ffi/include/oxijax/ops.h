// The op set of the ComputeBackend contract (SPEC "The op set"): one definition of
// every enum, shared by the CPU kernels, the CUDA kernels and the FFI bindings.
// The numeric codes are the members' positions in SPEC's tables; the Python enums in
// oxijax/_enums.py use the same codes.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define OXIJAX_HD __host__ __device__ __forceinline__
#else
#define OXIJAX_HD inline
#endif

namespace oxijax {

enum class Transpose : int32_t { N = 0, T = 1, C = 2 };
enum class ReduceOp : int32_t { SUM = 0, MAX = 1, MIN = 2, MEAN = 3 };
enum class UnaryOp : int32_t { RELU = 0, SIGMOID, TANH, EXP, LOG, SQRT, ABS, NEG };
enum class BinaryOp : int32_t { ADD = 0, SUB, MUL, DIV, MAX, MIN };

inline constexpr int32_t kNumTranspose = 3;
inline constexpr int32_t kNumReduceOps = 4;
inline constexpr int32_t kNumUnaryOps = 8;
inline constexpr int32_t kNumBinaryOps = 6;

// Real dtypes only: a conjugate transpose is a plain transpose.
OXIJAX_HD bool is_transposed(Transpose t) { return t != Transpose::N; }

}  // namespace oxijax
