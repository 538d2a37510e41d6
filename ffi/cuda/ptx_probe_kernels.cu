// Probes of ptx.h's instructions: one warp applies one instruction to words from the
// host and returns what it produced. Built into both the CUDA extension and the CUDA
// interpreter, so that a test on a GPU (tests/test_ptx_probe.py) compares the hardware
// with the interpreter's model bit for bit. Not on any op's path.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels.h"
#include "launch.h"
#include "ptx.h"

namespace oxijax::cuda {
namespace {

// Every probe reads kProbeWords words of `in` and writes kProbeWords words of `out`.
__global__ void __launch_bounds__(32) ptx_probe_kernel(PtxProbe probe, const uint32_t* in,
                                                       uint32_t* out) {
  OXIJAX_SHARED(uint32_t, tile, [kProbeWords], 16);
  const int lane = threadIdx.x;
  for (int i = lane; i < kProbeWords; i += 32) out[i] = 0;
  __syncwarp();  // the probes write words other lanes cleared
  switch (probe) {
    case PtxProbe::kCpAsync: {
      // Lane l copies 16, 8 and 4 bytes with src-size l % 17, l % 9, l % 5 (zero-fill).
      for (int i = lane; i < 28 * 32; i += 32) tile[i] = 0xdeadbeefu;
      __syncwarp();
      const uint32_t base = ptx::shared_address(tile) + 112u * uint32_t(lane);
      ptx::cp_async<16>(base, in + 28 * lane, lane % 17);
      ptx::cp_async<8>(base + 16, in + 28 * lane + 4, lane % 9);
      ptx::cp_async<4>(base + 24, in + 28 * lane + 6, lane % 5);
      ptx::cp_async_commit();
      ptx::cp_async_wait<0>();
      __syncwarp();
      for (int i = 0; i < 7; ++i) out[7 * lane + i] = tile[28 * lane + i];
      break;
    }
    case PtxProbe::kLdmatrix:
    case PtxProbe::kLdmatrixTrans: {
      // Four 8x8 b16 matrices (128 words); lane l points at row l % 8 of matrix l / 8,
      // rows permuted by in[128 + l] % 8 so that the addresses are not in order.
      for (int i = lane; i < 128; i += 32) tile[i] = in[i];
      __syncwarp();
      const int row = (lane / 8) * 8 + int(in[128 + lane] % 8);
      uint32_t r[4];
      if (probe == PtxProbe::kLdmatrix)
        ptx::ldmatrix_x4(r, ptx::shared_address(tile + 4 * row));
      else
        ptx::ldmatrix_x4_trans(r, ptx::shared_address(tile + 4 * row));
      for (int j = 0; j < 4; ++j) out[4 * lane + j] = r[j];
      break;
    }
    case PtxProbe::kMmaF16:
    case PtxProbe::kMmaBf16:
    case PtxProbe::kMmaTf32: {
      // Lane l: a = in[10l..+3], b = in[10l+4..+5], c = in[10l+6..+9] (float bits).
      const uint32_t* w = in + 10 * lane;
      const uint32_t a[4] = {w[0], w[1], w[2], w[3]}, b[2] = {w[4], w[5]};
      float d[4];
      for (int i = 0; i < 4; ++i) std::memcpy(&d[i], &w[6 + i], 4);
      if (probe == PtxProbe::kMmaF16)
        ptx::mma_m16n8k16<false>(d, a, b);
      else if (probe == PtxProbe::kMmaBf16)
        ptx::mma_m16n8k16<true>(d, a, b);
      else
        ptx::mma_m16n8k8_tf32(d, a, b);
      std::memcpy(out + 4 * lane, d, 16);
      break;
    }
    case PtxProbe::kMmaF64: {
      // Lane l: a, b, c[0], c[1] as doubles at in[8l..8l+7].
      double v[4];
      std::memcpy(v, in + 8 * lane, 32);
      double d[2] = {v[2], v[3]};
      ptx::mma_m8n8k4_f64(d, v[0], v[1]);
      std::memcpy(out + 4 * lane, d, 16);
      break;
    }
    case PtxProbe::kConvert: {
      // Word i: tf32 of in[i], bf16x2 and f16x2 packs of (in[i], in[i + 1]), ex2 of in[i].
      for (int i = lane; i < kProbeWords / 4; i += 32) {
        float x, y;
        std::memcpy(&x, &in[i], 4);
        std::memcpy(&y, &in[i + 1], 4);
        out[4 * i] = ptx::cvt_rna_tf32(x);
        out[4 * i + 1] = ptx::cvt_rn_pack<true>(x, y);
        out[4 * i + 2] = ptx::cvt_rn_pack<false>(x, y);
        const float e = ptx::ex2_approx_ftz(x);
        std::memcpy(&out[4 * i + 3], &e, 4);
      }
      break;
    }
    case PtxProbe::kStShared: {
      ptx::st_shared_v4(ptx::shared_address(tile + 4 * (31 - lane)), in[4 * lane],
                        in[4 * lane + 1], in[4 * lane + 2], in[4 * lane + 3]);
      __syncwarp();
      for (int i = 0; i < 4; ++i) out[4 * lane + i] = tile[4 * lane + i];
      break;
    }
  }
}

}  // namespace

cudaError_t ptx_probe(cudaStream_t stream, PtxProbe probe, const uint32_t* in, uint32_t* out) {
  return launch(&ptx_probe_kernel, 1, 32, 0, stream, probe, in, out);
}

}  // namespace oxijax::cuda
