// Vectorized helpers of the CPU kernels over float32 rows (ATen's at::vec: AVX2 where the extension
// is built for it, scalar loops otherwise; see setup.py).
#pragma once

#include <ATen/cpu/vec/vec.h>

#include <type_traits>
#include <vector>

#include "common.h"

namespace tso {

using Vec = at::vec::Vectorized<float>;

// A row as float32, for the kernels written over float32 rows: the row itself for float32 logits,
// else converted (exactly) into `buffer`.
template <typename scalar_t>
const float* float_row(const scalar_t* row, int64_t V, std::vector<float>& buffer) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    return row;
  } else {
    buffer.resize(V);
    for (int64_t j = 0; j < V; ++j) buffer[j] = static_cast<float>(row[j]);
    return buffer.data();
  }
}

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

// x[0:V] = the row (unit column stride) as float32, divided by `temp` unless it is 0 or 1 (a true
// division, as the temperature op: x / 1 is x), NaN read as -inf; returns the row max.
template <typename scalar_t>
float load_row(const scalar_t* row, int64_t V, float* x, float temp = 1.0f) {
  const bool divide = temp != 0.0f && temp != 1.0f;
  int64_t j = 0;
  Vec v_max(kNegInf);
  if constexpr (std::is_same_v<scalar_t, float>) {
    const Vec vt(temp), neg_inf(kNegInf);
    for (; j + Vec::size() <= V; j += Vec::size()) {
      Vec v = Vec::loadu(row + j);
      if (divide) v = v / vt;
      v = Vec::blendv(v, neg_inf, v.isnan());
      v.store(x + j);
      v_max = at::vec::maximum(v_max, v);
    }
  }
  float m = max_lane(v_max);
  for (; j < V; ++j) {
    const float v = divide ? static_cast<float>(row[j]) / temp : static_cast<float>(row[j]);
    x[j] = v == v ? v : kNegInf;
    m = std::max(m, x[j]);
  }
  return m;
}

}  // namespace tso
