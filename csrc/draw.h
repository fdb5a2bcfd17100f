// The Gumbel-max draw and the plain argmax of one row, shared by the CPU kernels of sample
// (csrc/sampling.cpp) and rejection_sample (csrc/speculative.cpp): exact (row_argmax) and, over
// float32 rows, vectorized (argmax_row, and gumbel_argmax_row from certified approximate scores).
#pragma once

#include "common.h"
#include "random_stream.h"
#include "vec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

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

// argmax of the row (plus the Gumbel noise of `key` when `noise`) over the tokens above `floor` (at
// least -inf); -1 if none.
template <typename scalar_t>
int64_t row_argmax(const scalar_t* row, int64_t V, bool noise, uint32_t key,
                   float floor = kNegInf) {
  Argmax am;
  for (int64_t j = 0; j < V; ++j) {
    const float x = logit_at(row, j);
    if (!(x > floor)) continue;
    if (!noise) {
      am.offer(x, j);
    } else if (am.index < 0 || !(x + kMaxGumbel < am.best)) {
      am.offer(x + token_noise(key, j), j);
    }
  }
  return am.index;
}

#if defined(CPU_CAPABILITY_AVX2)
// The approximate noise of 8 consecutive tokens (AVX2), for draws that certify their winner (the
// CPU twin of gumbel.stream_gumbel_approx): within 2**-17 * (1 + |g|) of stream_gumbel, checked on
// all 2**23 uniforms by the tests (`_C.gumbel_noise`).

inline __m256i mix32_x8(__m256i h) {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0x85EBCA6Bu)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0xC2B2AE35u)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

// Token indices j .. j + 7.
inline __m256i tokens_x8(int64_t j) {
  return _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(j)),
                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// stream_bits of 8 token indices.
inline __m256i stream_bits_x8(uint32_t key, __m256i tokens) {
  const __m256i h = mix32_x8(_mm256_xor_si256(_mm256_set1_epi32(static_cast<int>(key)), tokens));
  return mix32_x8(_mm256_add_epi32(h, _mm256_set1_epi32(0x6A09E667)));
}

// log(y) of positive normal floats: y = 2**e * m with m in [sqrt(1/2), sqrt(2)),
// log(m) = f - f**2 / 2 + f**3 P(f) for f = m - 1 (exact), P a degree-6 fit of the rest (error
// under 2e-7 on that interval, float32 evaluation included), e * log(2) in two parts (the first
// exact).
inline __m256 log_x8(__m256 y) {
  const __m256i b = _mm256_castps_si256(y);
  __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(b, 23), _mm256_set1_epi32(127));
  __m256 m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi32(0x7FFFFF)),
                                                 _mm256_set1_epi32(0x3F800000)));
  const __m256 high = _mm256_cmp_ps(m, _mm256_set1_ps(1.41421356f), _CMP_GT_OQ);
  m = _mm256_blendv_ps(m, _mm256_mul_ps(m, _mm256_set1_ps(0.5f)), high);
  e = _mm256_sub_epi32(e, _mm256_castps_si256(high));  // the halved lanes (all ones: -1) gain 1
  const __m256 f = _mm256_sub_ps(m, _mm256_set1_ps(1.0f));
  const __m256 z = _mm256_mul_ps(f, f);
  __m256 p = _mm256_fmadd_ps(f, _mm256_set1_ps(0.09151823818683624f),
                             _mm256_set1_ps(-0.13937585055828094f));
  p = _mm256_fmadd_ps(f, p, _mm256_set1_ps(0.14647750556468964f));
  p = _mm256_fmadd_ps(f, p, _mm256_set1_ps(-0.1660991758108139f));
  p = _mm256_fmadd_ps(f, p, _mm256_set1_ps(0.19987717270851135f));
  p = _mm256_fmadd_ps(f, p, _mm256_set1_ps(-0.25000593066215515f));
  p = _mm256_fmadd_ps(f, p, _mm256_set1_ps(0.3333338797092438f));
  const __m256 log_m =
      _mm256_fmadd_ps(_mm256_mul_ps(z, f), p, _mm256_fmadd_ps(_mm256_set1_ps(-0.5f), z, f));
  const __m256 ef = _mm256_cvtepi32_ps(e);
  // log(2) = 0.693359375 (9 bits: e times it is exact) - 2.12194440e-4
  return _mm256_fmadd_ps(ef, _mm256_set1_ps(0.693359375f),
                         _mm256_fmadd_ps(ef, _mm256_set1_ps(-2.12194440e-4f), log_m));
}

// The approximate noise -log(-log(u)) of 8 lanes of stream bits. u = (m + 1/2) / 2**23 is exact;
// where w = 1 - u < 1/16 (exact there), -log(u) = -log(1 - w) comes from its series to w**5
// (relative error under w**5 / 6 <= 2**-22.6), where a log of u near 1 would lose its small result.
inline __m256 gumbel_approx_x8(__m256i bits) {
  const __m256 u = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(
                                     _mm256_srli_epi32(bits, 9), _mm256_set1_epi32(0x3F800000))),
                                 _mm256_set1_ps(0.99999994039535522f));
  const __m256 w = _mm256_sub_ps(_mm256_set1_ps(1.0f), u);
  __m256 series = _mm256_fmadd_ps(w, _mm256_set1_ps(0.2f), _mm256_set1_ps(0.25f));
  series = _mm256_fmadd_ps(w, series, _mm256_set1_ps(1.0f / 3.0f));
  series = _mm256_fmadd_ps(w, series, _mm256_set1_ps(0.5f));
  series = _mm256_fmadd_ps(w, series, _mm256_set1_ps(1.0f));
  series = _mm256_mul_ps(w, series);
  const __m256 zero = _mm256_setzero_ps();
  const __m256 e = _mm256_blendv_ps(_mm256_sub_ps(zero, log_x8(u)), series,
                                    _mm256_cmp_ps(w, _mm256_set1_ps(0.0625f), _CMP_LT_OQ));
  return _mm256_sub_ps(zero, log_x8(e));
}
#endif

// row_argmax without noise over a float32 row (per AVX2 lane, then merged: the largest value, the
// lowest index holding it); -1 without a logit above -inf.
inline int64_t argmax_row(const float* row, int64_t V) {
  float best = kNegInf;
  int64_t best_j = -1;
  int64_t j = 0;
#if defined(CPU_CAPABILITY_AVX2)
  const __m256 neg_inf = _mm256_set1_ps(kNegInf);
  __m256 lane_best = neg_inf;
  __m256i lane_j = _mm256_set1_epi32(-1);
  for (; j + 8 <= V; j += 8) {
    const __m256 x = _mm256_loadu_ps(row + j);
    const __m256 take = _mm256_cmp_ps(x, lane_best, _CMP_GT_OQ);  // strictly: NaN and -inf never
    lane_best = _mm256_blendv_ps(lane_best, x, take);
    lane_j = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(lane_j), _mm256_castsi256_ps(tokens_x8(j)), take));
  }
  alignas(32) float bests[8];
  alignas(32) int32_t js[8];
  _mm256_store_ps(bests, lane_best);
  _mm256_store_si256(reinterpret_cast<__m256i*>(js), lane_j);
  for (int k = 0; k < 8; ++k) {
    if (js[k] >= 0 && (best_j < 0 || bests[k] > best || (bests[k] == best && js[k] < best_j))) {
      best = bests[k];
      best_j = js[k];
    }
  }
#endif
  for (; j < V; ++j) {  // after every lane's token: a tie keeps the lane's lower index
    const float x = row[j];
    if (x > kNegInf && (best_j < 0 || x > best)) {
      best = x;
      best_j = j;
    }
  }
  return best_j;
}

// err(s): how far an approximate score s of the draws below may lie from its exact value.
inline float approx_err(float s, float tol) { return tol * (35.0f + std::fabs(s)); }

// The largest and second-largest of approximate scores, with the largest's token: the certificate
// of the draws below. Each score lies within err(s) = tol * (35 + |s|) of its exact value (tol >=
// 2**-16 leaves a wide margin: the approximate noise is within 2**-17 * (1 + |g|), log_x8 within
// 4e-6); when the largest minus its err stays above the runner-up plus its err, the largest's token
// wins the exact scores too. Otherwise (a near tie, an infinite score) the caller draws exactly.
struct Top2 {
  float first = kNegInf, second = kNegInf;
  int64_t first_j = -1;
  void offer(float score, int64_t j) {
    if (score > first) {
      second = first;
      first = score;
      first_j = j;
    } else if (score > second) {
      second = score;
    }
  }
  bool certified(float tol) const {
    return first < -kNegInf &&
           (second == kNegInf || second + approx_err(second, tol) < first - approx_err(first, tol));
  }
};

#if defined(CPU_CAPABILITY_AVX2)
// Top2 of each of 8 lanes (a lane's tokens come in index order: on a tie it keeps the lower one).
struct LaneTop2 {
  __m256 first = _mm256_set1_ps(kNegInf), second = _mm256_set1_ps(kNegInf);
  __m256i first_j = _mm256_set1_epi32(-1);
  void offer(__m256 score, __m256i tokens) {
    const __m256 take = _mm256_cmp_ps(score, first, _CMP_GT_OQ);
    second = _mm256_blendv_ps(_mm256_max_ps(second, score), first, take);
    first = _mm256_blendv_ps(first, score, take);
    first_j = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(first_j), _mm256_castsi256_ps(tokens), take));
  }
  static float largest_of(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
  }
  void merge_into(Top2& top) const {
    alignas(32) float firsts[8], seconds[8];
    alignas(32) int32_t first_js[8];
    _mm256_store_ps(firsts, first);
    _mm256_store_ps(seconds, second);
    _mm256_store_si256(reinterpret_cast<__m256i*>(first_js), first_j);
    for (int k = 0; k < 8; ++k) {
      if (first_js[k] >= 0) top.offer(firsts[k], first_js[k]);
      top.second = std::max(top.second, seconds[k]);
    }
  }
};
#endif

// The approximate noise of n stream bits, as the draws score it: gumbel_approx_x8 with AVX2, else
// at::vec's log (within 1 ulp where the exact noise takes std::log); the last n % 8 exactly.
inline void gumbel_approx(const uint32_t* bits, int64_t n, float* noise) {
  int64_t i = 0;
#if defined(CPU_CAPABILITY_AVX2)
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(
        noise + i,
        gumbel_approx_x8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + i))));
  }
#else
  for (; i + Vec::size() <= n; i += Vec::size()) {
    float u[Vec::size()];
    for (int k = 0; k < Vec::size(); ++k) u[k] = stream_uniform(bits[i + k]);
    (Vec(0.0f) - (Vec(0.0f) - Vec::loadu(u).log()).log()).store(noise + i);  // -log(u) > 0
  }
#endif
  for (; i < n; ++i) noise[i] = stream_gumbel(bits[i]);
}

// Tokens whose noise one step of `gumbel_argmax_row` computes together (stack arrays). A block
// with fewer than one token in kSparseShare above -inf scores its live tokens only (without AVX2
// one by one, exactly).
constexpr int64_t kDrawBlock = 256;
constexpr int64_t kSparseShare = 8;

#if defined(CPU_CAPABILITY_AVX2)
// Upper bounds of the stream's noise, as stream_gumbel computes it in float32, of 8 lanes of stream
// bits: -log(-log u) <= -log w for w = 1 - u = k / 2**24, k = 2**24 - 1 - 2m (exact), and log2 k is
// at least the bits of float(k) read as an integer, / 2**23 - 127 (log2(1 + f) >= f); plus 2**-10,
// far above the float32 logs' error (a few ulp of at most 16.7) and this bound's own roundings.
inline __m256 noise_upper_x8(__m256i bits) {
  const __m256i k = _mm256_sub_epi32(_mm256_set1_epi32((1 << 24) - 1),
                                     _mm256_slli_epi32(_mm256_srli_epi32(bits, 9), 1));
  const __m256i k_bits = _mm256_castps_si256(_mm256_cvtepi32_ps(k));  // exact: k < 2**24
  const __m256 steps = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_set1_epi32(151 << 23), k_bits));
  return _mm256_add_ps(_mm256_mul_ps(steps, _mm256_set1_ps(0.693147181f / 8388608.0f)),
                       _mm256_set1_ps(1.0f / 1024));
}
#endif

#if defined(CPU_CAPABILITY_AVX2)
// The tokens a certified draw leaves unscored, 8 at a time: those whose exact scores, at most a
// bound of the lane (bound + noise_upper_x8), all stay below the best approximate score so
// far less twice its tolerance. `exact_bound` keeps the largest of those bounds: one more runner-up
// of the certificate, exact (no tolerance of its own).
struct Skips {
  __m256 exact_bound = _mm256_set1_ps(kNegInf);
  float level = kNegInf;  // lanes below it are skipped; -inf: none
  // best: the best approximate score so far (-inf for none).
  void update(float best, float tol) {
    level = best > kNegInf && best < -kNegInf ? best - 2.0f * approx_err(best, tol) : kNegInf;
  }
  // Whether the 8 tokens with stream bits `bits` are skipped; bound: at least each lane's exact
  // score less its noise (NaN: the lane is scored).
  bool skip(__m256 bound, __m256i bits) {
    const __m256 reach = _mm256_add_ps(bound, noise_upper_x8(bits));
    if (_mm256_movemask_ps(_mm256_cmp_ps(reach, _mm256_set1_ps(level), _CMP_LT_OQ)) != 0xFF) {
      return false;
    }
    exact_bound = _mm256_max_ps(exact_bound, reach);
    return true;
  }
  // Whether every skipped token loses to the certified winner of `top`.
  bool lose_to(const Top2& top, float tol) const {
    const float bound = LaneTop2::largest_of(exact_bound);
    return bound == kNegInf || bound < top.first - approx_err(top.first, tol);
  }
};
#endif

#if defined(CPU_CAPABILITY_AVX2)
// When the certificate leaves a near tie: the exact argmax among the lanes' leaders and the best of
// the exactly scored tokens (`exact`, scored before the lanes joined it), provided every other
// token stays below A - err(A), A the largest score (the winner's exact score is at least that):
// the lanes' seconds and `exact`'s runner-up plus their err, and the skipped tokens' exact bound.
// Only the candidates within reach, s + err(s) >= A - err(A), are rescored, by `exact_score(j)`, in
// index order (the lower token among equal scores, as the exact passes). -2 when that does not hold
// (the exact pass decides), as the CUDA draw's _rescore_lane_leaders.
template <typename ExactScore>
int64_t settle_among_leaders(const LaneTop2& lanes, const Top2& exact, const Skips& skips,
                             float tol, ExactScore&& exact_score) {
  alignas(32) float firsts[8], seconds[8];
  alignas(32) int32_t first_js[8];
  _mm256_store_ps(firsts, lanes.first);
  _mm256_store_ps(seconds, lanes.second);
  _mm256_store_si256(reinterpret_cast<__m256i*>(first_js), lanes.first_j);
  float top = exact.first_j >= 0 ? exact.first : kNegInf, others = exact.second;
  for (int k = 0; k < 8; ++k) {
    if (first_js[k] >= 0) top = std::max(top, firsts[k]);
    others = std::max(others, seconds[k]);
  }
  const float reach = top - approx_err(top, tol);  // -inf when top is -FLT_MAX
  if (!(top < -kNegInf) || !(reach > kNegInf)) return -2;
  if (others > kNegInf && !(others + approx_err(others, tol) < reach)) return -2;
  const float skipped = LaneTop2::largest_of(skips.exact_bound);
  if (skipped > kNegInf && !(skipped < reach)) return -2;
  int64_t near[9];
  int n = 0;
  if (exact.first_j >= 0 && exact.first + approx_err(exact.first, tol) >= reach)
    near[n++] = exact.first_j;
  for (int k = 0; k < 8; ++k) {
    if (first_js[k] >= 0 && firsts[k] + approx_err(firsts[k], tol) >= reach)
      near[n++] = first_js[k];
  }
  std::sort(near, near + n);
  Argmax am;
  for (int i = 0; i < n; ++i) am.offer(exact_score(near[i]), near[i]);
  return am.index;
}
#endif

// row_argmax's Gumbel draw over a float32 row from approximate scores certified by Top2, as the
// CUDA draw (gumbel_argmax in sampling.py) does; -1 without a live token. The live tokens are
// those above `floor` (a filtered row drawn without writing its mask: as if every other token
// were -inf). A score that overflows
// to -inf counts at -FLT_MAX. The noise is gumbel_approx's (with AVX2 computed in registers); the
// last tokens of a block are scored exactly, and so, without AVX2, are the live tokens of a sparse
// block (a filtered row); with AVX2 those are scored 8 at a time.
//
// With AVX2, 8 tokens whose noise cannot lift them near the running best are not scored (Skips:
// the stream bits, computed anyway, bound each lane's noise); the skipped tokens' exact scores then
// stay below their bounds, the largest of which joins the certificate as one more runner-up (else
// the exact pass decides). A near tie between lanes' leaders is settled by rescoring those leaders
// (settle_among_leaders). The token is the same as scoring every one. A token at or below a floor
// above -inf may enter a skipped group's bound: that bound is then only larger.
inline int64_t gumbel_argmax_row(const float* row, int64_t V, uint32_t key, float tol,
                                 float floor = kNegInf) {
  constexpr float kLowest = -std::numeric_limits<float>::max();
  Top2 top;
  auto offer_exact = [&](float x, int64_t j) {
    top.offer(std::max(x + token_noise(key, j), kLowest), j);
  };
#if defined(CPU_CAPABILITY_AVX2)
  const __m256 neg_inf = _mm256_set1_ps(kNegInf), lowest = _mm256_set1_ps(kLowest),
               floor_x8 = _mm256_set1_ps(floor);
  LaneTop2 lanes;
  Skips skips;
  // Offers the approximate scores of 8 tokens, the lanes not above the floor (NaN included) at
  // -inf.
  auto score = [&](__m256 xv, __m256i tokens, __m256i bits) {
    lanes.offer(
        _mm256_blendv_ps(neg_inf, _mm256_max_ps(_mm256_add_ps(xv, gumbel_approx_x8(bits)), lowest),
                         _mm256_cmp_ps(xv, floor_x8, _CMP_GT_OQ)),
        tokens);
  };
#else
  alignas(64) uint32_t bits[kDrawBlock];
  alignas(64) float noise[kDrawBlock];
#endif
  for (int64_t j0 = 0; j0 < V; j0 += kDrawBlock) {
    const int64_t n = std::min(kDrawBlock, V - j0), full = n & ~int64_t{7};
    const float* x = row + j0;
#if defined(CPU_CAPABILITY_AVX2)
    // The live lanes of each 8 tokens (NaN is not live).
    uint8_t live_lanes[kDrawBlock / 8];
    int64_t live = 0;
    for (int64_t i = 0; i < full; i += 8) {
      live_lanes[i / 8] = static_cast<uint8_t>(
          _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), floor_x8, _CMP_GT_OQ)));
      live += __builtin_popcount(live_lanes[i / 8]);
    }
    for (int64_t i = full; i < n; ++i) live += x[i] > floor;
    if (live * kSparseShare < n) {
      // The live tokens, 8 at a time (in index order: a lane keeps its lower token on ties), the
      // lanes past the last one -inf.
      alignas(32) int32_t tokens[kDrawBlock / kSparseShare + 8];
      alignas(32) float xs[kDrawBlock / kSparseShare + 8];
      int64_t m = 0;
      for (int64_t i = 0; i < full; i += 8) {
        for (int mask = live_lanes[i / 8]; mask; mask &= mask - 1) {
          const int64_t k = i + __builtin_ctz(mask);
          tokens[m] = static_cast<int32_t>(j0 + k);
          xs[m++] = x[k];
        }
      }
      for (int64_t i = full; i < n; ++i) {
        if (x[i] > floor) {
          tokens[m] = static_cast<int32_t>(j0 + i);
          xs[m++] = x[i];
        }
      }
      for (int64_t k = m; k < ((m + 7) & ~int64_t{7}); ++k) {
        tokens[k] = 0;
        xs[k] = kNegInf;
      }
      for (int64_t k = 0; k < m; k += 8) {
        const __m256i tok = _mm256_load_si256(reinterpret_cast<const __m256i*>(tokens + k));
        score(_mm256_load_ps(xs + k), tok, stream_bits_x8(key, tok));
      }
      continue;
    }
    int64_t i = 0;
    for (; i < full; i += 8) {
      if (i % 64 == 0) skips.update(std::max(LaneTop2::largest_of(lanes.first), top.first), tol);
      const __m256i tok = tokens_x8(j0 + i);
      const __m256i bits = stream_bits_x8(key, tok);
      const __m256 xv = _mm256_loadu_ps(x + i);
      if (!skips.skip(xv, bits)) score(xv, tok, bits);
    }
    for (; i < n; ++i) {
      if (x[i] > floor) offer_exact(x[i], j0 + i);
    }
#else
    int64_t live = 0;
    for (int64_t i = 0; i < n; ++i) live += x[i] > floor;  // NaN is not
    if (live * kSparseShare < n) {
      for (int64_t i = 0; i < n; ++i) {
        if (x[i] > floor) offer_exact(x[i], j0 + i);
      }
      continue;
    }
    for (int64_t i = 0; i < n; ++i) bits[i] = stream_bits(key, static_cast<uint32_t>(j0 + i));
    gumbel_approx(bits, n, noise);
    for (int64_t i = 0; i < n; ++i) {
      if (x[i] > floor) top.offer(std::max(x[i] + noise[i], kLowest), j0 + i);
    }
#endif
  }
#if defined(CPU_CAPABILITY_AVX2)
  const Top2 exact = top;  // the tokens scored exactly, before the lanes join
  lanes.merge_into(top);
  if (top.first_j < 0) return -1;  // no live token (nothing is skipped before a first score)
  if (skips.lose_to(top, tol) && top.certified(tol)) return top.first_j;
  const int64_t settled = settle_among_leaders(
      lanes, exact, skips, tol, [&](int64_t j) { return row[j] + token_noise(key, j); });
  return settled != -2 ? settled : row_argmax(row, V, /*noise=*/true, key, floor);
#else
  if (top.first_j < 0) return -1;
  return top.certified(tol) ? top.first_j : row_argmax(row, V, /*noise=*/true, key, floor);
#endif
}

}  // namespace tso
