// Runs one ptx.h probe (cuda/kernels.h) on the current CUDA device, or on the CUDA
// interpreter in its module: the same host code for both, through the runtime API.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/kernels.h"

namespace oxijax::bindings {

inline std::vector<uint32_t> run_ptx_probe(int probe, const std::vector<uint32_t>& words) {
  constexpr size_t kBytes = cuda::kProbeWords * sizeof(uint32_t);
  if (probe < 0 || probe > int(cuda::PtxProbe::kStShared) || words.size() != cuda::kProbeWords)
    throw std::invalid_argument("ptx probe: a probe code and exactly " +
                                std::to_string(cuda::kProbeWords) + " words");
  void* in = nullptr;
  void* out = nullptr;
  std::vector<uint32_t> result(cuda::kProbeWords);
  auto check = [&](cudaError_t status, const char* what) {
    if (status == cudaSuccess) return;
    cudaFree(in);
    cudaFree(out);
    throw std::runtime_error(std::string("ptx probe: ") + what + ": " + cudaGetErrorString(status));
  };
  check(cudaMalloc(&in, kBytes), "cudaMalloc");
  check(cudaMalloc(&out, kBytes), "cudaMalloc");
  check(cudaMemcpy(in, words.data(), kBytes, cudaMemcpyHostToDevice), "copy in");
  check(cuda::ptx_probe(nullptr, cuda::PtxProbe(probe), static_cast<const uint32_t*>(in),
                        static_cast<uint32_t*>(out)),
        "launch");
  check(cudaDeviceSynchronize(), "kernel");
  check(cudaMemcpy(result.data(), out, kBytes, cudaMemcpyDeviceToHost), "copy out");
  cudaFree(in);
  cudaFree(out);
  return result;
}

}  // namespace oxijax::bindings
