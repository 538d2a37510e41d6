// Where the input pixels of one filter tap lie for a run of consecutive output pixels:
// the geometry shared by conv2d's forward packing (an im2col row: a panel of output
// pixels for one channel and tap) and its filter gradient's (an im2col column: a vector
// of output pixels, the GEMM's K steps, for one channel and tap).
#pragma once

#include <algorithm>
#include <cstdint>

#include "gemm_microkernel.h"
#include "oxijax/shapes.h"

namespace oxijax::cpu::conv_detail {

// Lanes [a, b) of a vector of output pixels whose inputs through one tap lie inside the
// image: lane j reads plane[off + (j - a) * stride_w] of a channel's plane. `bits` has
// bits a .. b-1 set.
struct Run {
  int64_t off;
  int32_t a, b;
  uint32_t bits;
};

// Appends to `out` the runs of tap (r, t) for lanes [lane0, lane0 + len), which hold
// the output pixels pix0, pix0 + 1, ... (pixel = p * Q + q) of one image: the lanes
// split where they wrap to the next output row, clipped to the image. `image_off` is
// added to every offset. Returns how many runs it appended (at most len).
inline int tap_runs(const ConvShape& s, int64_t r, int64_t t, int64_t pix0, int lane0,
                    int64_t len, int64_t image_off, Run* out) {
  using gemm_detail::ceil_div;
  int n = 0;
  for (int64_t j = 0; j < len;) {
    const int64_t p = (pix0 + j) / s.q, q0 = (pix0 + j) % s.q;
    const int64_t seg = std::min(s.q - q0, len - j);
    const int64_t h = p * s.stride_h - s.pad_h + r;
    const int64_t w0 = q0 * s.stride_w - s.pad_w + t;  // input column of output column q0
    const int64_t lo = std::min(seg, w0 >= 0 ? 0 : ceil_div(-w0, s.stride_w));
    const int64_t hi = std::min(seg, w0 < s.w ? ceil_div(s.w - w0, s.stride_w) : 0);
    if (h >= 0 && h < s.h && lo < hi) {
      const int32_t a = int32_t(lane0 + j + lo), b = int32_t(lane0 + j + hi);
      const uint32_t bits = uint32_t((uint64_t{1} << b) - (uint64_t{1} << a));
      out[n++] = {image_off + h * s.w + w0 + lo * s.stride_w, a, b, bits};
    }
    j += seg;
  }
  return n;
}

// The address lane `lane` of a stride-1 run would read, were the run to extend there:
// integer arithmetic, as it may lie outside the plane (masked loads never touch it).
template <typename T>
inline const T* lane_address(const T* plane, const Run& run, int lane) {
  return reinterpret_cast<const T*>(reinterpret_cast<std::intptr_t>(plane) +
                                    std::intptr_t(sizeof(T)) * (run.off - run.a + lane));
}

#if defined(__AVX512BF16__)
// The 32 bfloat16 that lanes [0, 32) read through the runs (of one channel's plane) as
// the 16-bit lanes of a vector, zeros outside the runs.
inline __m512i gather_bf16_lanes(const bfloat16* plane, const Run* run, int count,
                                 int64_t stride_w) {
  if (stride_w == 1) {  // one masked load per run
    __m512i lanes = _mm512_setzero_si512();
    for (int i = 0; i < count; ++i)
      lanes = _mm512_mask_loadu_epi16(lanes, __mmask32(run[i].bits),
                                      lane_address(plane, run[i], 0));
    return lanes;
  }
  alignas(64) uint16_t lanes[32] = {};
  for (int i = 0; i < count; ++i)
    for (int j = run[i].a; j < run[i].b; ++j)
      lanes[j] = plane[run[i].off + (j - run[i].a) * stride_w].bits;
  return _mm512_load_si512(lanes);
}
#endif

}  // namespace oxijax::cpu::conv_detail
