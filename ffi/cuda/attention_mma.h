// The tensor-core attention backward (attention_backward_mma_kernels.cu), called by the
// attention_backward launcher once delta is computed, for float16 / bfloat16 calls that
// mma_tile::tensor_cores_take.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "oxijax/numeric.h"
#include "oxijax/shapes.h"

namespace oxijax::cuda {

// dq, dk, dv from q, k, v, the output cotangent dout, the forward's lse and delta =
// rowsum(dout * out) (float32 per query row). Enqueues two kernels; no workspace.
template <typename T>
cudaError_t attention_backward_mma(cudaStream_t stream, const AttentionShape& shape, const T* q,
                                   const T* k, const T* v, const T* dout, const float* lse,
                                   const float* delta, T* dq, T* dk, T* dv);

}  // namespace oxijax::cuda
