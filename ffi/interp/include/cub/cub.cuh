// CUB's device-side parts use PTX that the host compiler cannot build; the CUDA
// interpreter replaces the one the kernels use (cub::BlockReduce) by this model of its
// documented contract: Reduce(input, op) gives thread 0 the reduction of every thread's
// input; other threads get an undefined value (here: their own input, so a kernel that
// relies on it computes wrong results); TempStorage may be reused after a __syncthreads.
#pragma once

#include "oxijax_interp.h"

namespace cub {

template <typename T, int kBlockThreads>
class BlockReduce {
 public:
  struct TempStorage {
    T slot[kBlockThreads];
  };
  explicit BlockReduce(TempStorage& storage) : storage_(storage) {}

  template <typename Op>
  T Reduce(T input, Op op) {
    const int tid = int(threadIdx.x + threadIdx.y * blockDim.x +
                        threadIdx.z * blockDim.x * blockDim.y);
    storage_.slot[tid] = input;
    __syncthreads();
    for (int width = 1; width < kBlockThreads; width *= 2) {
      if (tid % (2 * width) == 0 && tid + width < kBlockThreads)
        storage_.slot[tid] = op(storage_.slot[tid], storage_.slot[tid + width]);
      __syncthreads();
    }
    return tid == 0 ? storage_.slot[0] : input;
  }

 private:
  TempStorage& storage_;
};

}  // namespace cub
