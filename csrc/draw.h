// The exact Gumbel-max draw and the plain argmax of one row, shared by the CPU kernels of sample
// (csrc/sampling.cpp) and rejection_sample (csrc/speculative.cpp).
#pragma once

#include "common.h"
#include "random_stream.h"

#include <cstdint>

namespace tso {

// The tolerance of the approximate Gumbel scores: GUMBEL_APPROX_TOL of sampling.py (the same value
// in both, checked by a test through `_C.GUMBEL_APPROX_TOL`).
constexpr double kGumbelApproxTol = 1.0 / 65536.0;

template <typename scalar_t>
inline float logit_at(const scalar_t* row, int64_t j) {
  const float x = static_cast<float>(row[j]);
  return x == x ? x : kNegInf;  // NaN is read as -inf
}

// An upper bound of the stream's Gumbel noise: its largest uniform 1 - 2**-24 gives 16.6355. A
// token whose score cannot beat the running best even with this noise is skipped without computing
// its noise; float addition is monotonic, so fl(x + g) <= fl(x + kMaxGumbel) < best and the result
// is the same as without skipping.
constexpr float kMaxGumbel = 16.64f;

// A running argmax that keeps the lower index on ties.
struct Argmax {
  float best = kNegInf;
  int64_t index = -1;
  void offer(float score, int64_t j) {
    if (index < 0 || score > best) {
      best = score;
      index = j;
    }
  }
};

// argmax of the row (plus the Gumbel noise of `key` when `noise`) over the tokens above -inf; -1 if
// none.
template <typename scalar_t>
int64_t row_argmax(const scalar_t* row, int64_t V, bool noise, uint32_t key) {
  Argmax am;
  for (int64_t j = 0; j < V; ++j) {
    const float x = logit_at(row, j);
    if (!(x > kNegInf)) continue;
    if (!noise) {
      am.offer(x, j);
    } else if (am.index < 0 || !(x + kMaxGumbel < am.best)) {
      am.offer(x + stream_gumbel(stream_bits(key, static_cast<uint32_t>(j))), j);
    }
  }
  return am.index;
}

}  // namespace tso
