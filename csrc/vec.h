// Vectorized helpers of the CPU kernels over float32 rows (ATen's at::vec: AVX2 where the extension
// is built for it, scalar loops otherwise; see setup.py).
#pragma once

#include <ATen/cpu/vec/vec.h>

#include "common.h"

namespace tso {

using Vec = at::vec::Vectorized<float>;

// Lanes of x as float32 with NaN read as -inf.
inline Vec load_logits(const float* x) {
  const Vec v = Vec::loadu(x);
  return Vec::blendv(v, Vec(kNegInf), v.isnan());
}

// Bit i set when lane i of v is above `threshold` (AT_LEAST: at least `threshold`).
template <bool AT_LEAST = false>
inline int lanes_above(const Vec& v, float threshold) {
#if defined(CPU_CAPABILITY_AVX2)
  return _mm256_movemask_ps(
      _mm256_cmp_ps(v, _mm256_set1_ps(threshold), AT_LEAST ? _CMP_GE_OQ : _CMP_GT_OQ));
#else
  float lanes[Vec::size()];
  v.store(lanes);
  int mask = 0;
  for (int i = 0; i < Vec::size(); ++i) {
    mask |= (AT_LEAST ? lanes[i] >= threshold : lanes[i] > threshold) << i;
  }
  return mask;
#endif
}

// The largest lane of v.
inline float max_lane(const Vec& v) {
  float lanes[Vec::size()];
  v.store(lanes);
  float m = lanes[0];
  for (int i = 1; i < Vec::size(); ++i) m = std::max(m, lanes[i]);
  return m;
}

}  // namespace tso
