// Vectorized helpers of the CPU kernels over float32 rows (ATen's at::vec: AVX2 where the extension
// is built for it, scalar loops otherwise; see setup.py).
#pragma once

#include <ATen/cpu/vec/vec.h>

#include <cmath>
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

// One logit as float32, NaN read as -inf (the scalar twin of load_logits).
template <typename scalar_t>
inline float logit_at(const scalar_t* row, int64_t j) {
  const float x = static_cast<float>(row[j]);
  return x == x ? x : kNegInf;
}

// The sum of exp(x[j] - m) over a float32 row (NaN read as -inf: no mass), vectorized with
// at::vec's exp_u20 (about 20 ulp a term: the logsumexp within about 1e-6).
inline float sum_exp(const float* x, int64_t V, float m) {
  const Vec vm(m);
  // Two accumulators, so that the sum's chain of adds does not bound the loop.
  Vec acc0(0.0f), acc1(0.0f);
  int64_t j = 0;
  for (; j + 2 * Vec::size() <= V; j += 2 * Vec::size()) {
    acc0 = acc0 + (load_logits(x + j) - vm).exp_u20();
    acc1 = acc1 + (load_logits(x + j + Vec::size()) - vm).exp_u20();
  }
  for (; j + Vec::size() <= V; j += Vec::size()) acc0 = acc0 + (load_logits(x + j) - vm).exp_u20();
  float lanes[Vec::size()];
  (acc0 + acc1).store(lanes);
  float s = 0.0f;
  for (int k = 0; k < Vec::size(); ++k) s += lanes[k];
  for (; j < V; ++j) s += std::exp(logit_at(x, j) - m);
  return s;
}

}  // namespace tso
