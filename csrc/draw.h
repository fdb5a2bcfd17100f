// The Gumbel-max draw and the plain argmax of one row, shared by the CPU kernels of sample
// (csrc/sampling.cpp) and rejection_sample (csrc/speculative.cpp): the draws score exact float32
// scores only, skipping the blocks of 4 tokens (csrc/random_stream.h) that provably cannot win;
// with AVX2, 16 blocks are bounded at a time.
#pragma once

#include "common.h"
#include "random_stream.h"
#include "vec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

namespace tso {

// GUMBEL_APPROX_TOL of sampling.py (the same value in both, checked by a test through
// `_C.GUMBEL_APPROX_TOL`): the tolerance of the approximate noise (`_C.gumbel_noise`, the CPU twin
// of the Triton draw's). The CPU draws score exactly and take it as the default margin of their
// skip test (block_gumbel_argmax).
constexpr double kGumbelApproxTol = 1.0 / 65536.0;

// A running argmax that keeps the lower index on ties (tokens may be offered out of index order).
struct Argmax {
  float best = kNegInf;
  int64_t index = -1;
  void offer(float score, int64_t j) {
    if (index < 0 || score > best || (score == best && j < index)) {
      best = score;
      index = j;
    }
  }
};

// argmax of the row over the tokens above `floor` (at least -inf; NaN never is); -1 if none.
inline int64_t row_argmax(const float* row, int64_t V, float floor = kNegInf) {
  Argmax am;
  for (int64_t j = 0; j < V; ++j) {
    if (row[j] > floor) am.offer(row[j], j);
  }
  return am.index;
}

#if defined(CPU_CAPABILITY_AVX2)
// Token indices j .. j + 7.
inline __m256i tokens_x8(int64_t j) {
  return _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(j)),
                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// stream_bits of one key at 8 counters, for loops: its constants built once, opaque to the
// compiler so that it keeps them (in registers or on the stack) rather than rebuilding them at
// every hash.
struct StreamBitsX8 {
  __m256i key, m1 = _mm256_set1_epi32(static_cast<int>(0x85EBCA6Bu)),
               m2 = _mm256_set1_epi32(static_cast<int>(0xC2B2AE35u)),
               add = _mm256_set1_epi32(0x6A09E667);
  explicit StreamBitsX8(uint32_t k) : key(_mm256_set1_epi32(static_cast<int>(k))) {
    asm("" : "+x"(key), "+x"(m1), "+x"(m2), "+x"(add));
  }
  // mix32 of 8 lanes.
  __m256i mix(__m256i h) const {
    h = _mm256_mullo_epi32(_mm256_xor_si256(h, _mm256_srli_epi32(h, 16)), m1);
    h = _mm256_mullo_epi32(_mm256_xor_si256(h, _mm256_srli_epi32(h, 13)), m2);
    return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  }
  __m256i operator()(__m256i counters) const {
    return mix(_mm256_add_epi32(mix(_mm256_xor_si256(key, counters)), add));
  }
};
#endif

// row_argmax without a floor over a float32 row (per AVX2 lane, then merged: the largest value, the
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

// Upper bounds of a block's noise M = -log(W) = -log(-log u) + log 4 (its first arrival's noise, at
// least every token's of the block) from its bits, as block_exponential and a float32 log compute
// it: -log(-log u) <= -log w for w = 1 - u = k / 2**24, k = 2**24 - 1 - 2m (exact), and log2 k is
// at least the bits of float(k) read as an integer, / 2**23 - 127 (log2(1 + f) >= f); plus log 4
// and 2**-10, far above the float32 logs' error (a few ulp of at most 18.03) and this bound's own
// roundings. Both forms (the AVX2 one fuses the last multiply-add) lie above M by at least 9e-4 on
// all 2**23 uniforms, and within 0.16 of it where M > 3. kMaxBlockNoise lies above every M (the
// largest, of the largest uniform, is 18.0219).
constexpr float kMaxBlockNoise = 18.03f;
constexpr float kNoiseStep = 0.693147181f / 8388608.0f, kNoiseOffset = 1.0f / 1024 + 1.38629436f;

inline float block_noise_upper(uint32_t block) {
  const float k = static_cast<float>((1 << 24) - 1 - static_cast<int32_t>((block >> 9) << 1));
  int32_t k_bits;
  std::memcpy(&k_bits, &k, sizeof k_bits);  // exact: k < 2**24
  return static_cast<float>((151 << 23) - k_bits) * kNoiseStep + kNoiseOffset;
}

#if defined(CPU_CAPABILITY_AVX2)
inline __m256 block_noise_upper_x8(__m256i blocks) {
  const __m256i k = _mm256_sub_epi32(_mm256_set1_epi32((1 << 24) - 1),
                                     _mm256_slli_epi32(_mm256_srli_epi32(blocks, 9), 1));
  const __m256i k_bits = _mm256_castps_si256(_mm256_cvtepi32_ps(k));  // exact: k < 2**24
  const __m256 steps = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_set1_epi32(151 << 23), k_bits));
  return _mm256_fmadd_ps(steps, _mm256_set1_ps(kNoiseStep), _mm256_set1_ps(kNoiseOffset));
}

// The largest of each 4 consecutive lanes of a, b, c, d (tokens j .. j + 31: 8 blocks, one per
// 128-bit half); lane k of the result holds block kBlockOfLane[k] of them.
constexpr int kBlockOfLane[8] = {0, 2, 4, 6, 1, 3, 5, 7};

inline __m256 block_max_x8(__m256 a, __m256 b, __m256 c, __m256 d) {
  // Per half: a0 b0 a1 b1 and a2 b2 a3 b3, their max a02 b02 a13 b13 (likewise c, d), then
  // a02 b02 c02 d02 against a13 b13 c13 d13.
  const __m256 ab = _mm256_max_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
  const __m256 cd = _mm256_max_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
  return _mm256_max_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
}
#endif

// The exact Gumbel-max draw over per-token values v_j (the scaled logit, or log r of the residual
// draw): argmax_j fl(v_j + token_noise(key, j)) over the live tokens (v_j > -inf), the lowest index
// among equal scores; -1 when no token is live. `row` gives
//   value(j): v_j in float32, -inf for a token that is not live (never NaN);
//   bound(j): at least v_j, -inf only where v_j is -inf, +inf where it knows nothing (never NaN);
//   with AVX2, bound8(j): bound(j .. j + 7).
// A block of 4 tokens is skipped when fl(its largest bound + an upper bound of its noise M) stays
// below `level`, the best exact score so far less a margin tol * (1 + |best|): each of its tokens
// scores fl(v + g) <= fl(largest bound + M) (g <= M; float addition is monotone), below the best.
// The blocks come in index order, so a skipped token can neither beat the best nor tie it. A block
// not skipped has its M computed (two logs) and its first arrival scored (v + M, no more hashing);
// then only its tokens with fl(v + M) at least the level are scored. A huge tol skips no live
// token of finite values well below it.
template <typename Row>
int64_t block_gumbel_argmax(const Row& row, int64_t V, uint32_t key, float tol) {
  Argmax am;
  float level = kNegInf;
  auto offer = [&](float score, int64_t j) {
    am.offer(score, j);
    level = am.best == -kNegInf ? am.best : am.best - tol * (1.0f + std::fabs(am.best));
  };
  auto score_block = [&](int64_t b, uint32_t block) {
    const int64_t j0 = 4 * b, j1 = std::min(j0 + 4, V);
    const float w = block_exponential(block), m = -std::log(w);
    const int64_t first = j0 + (block & 3u);  // the first arrival: noise m exactly
    if (first < V) {
      const float v = row.value(first);
      if (v > kNegInf) offer(v + m, first);
    }
    for (int64_t j = j0; j < j1; ++j) {
      if (j == first) continue;
      const float v = row.value(j);
      if (!(v > kNegInf) || v + m < level) continue;
      offer(v + token_noise_in_block(key, j, block, w), j);
    }
  };
  int64_t j = 0;
#if defined(CPU_CAPABILITY_AVX2)
  // 64 tokens a step: 16 blocks, in two independent halves of 8.
  const __m256 neg_inf = _mm256_set1_ps(kNegInf), max_noise = _mm256_set1_ps(kMaxBlockNoise);
  const __m256i block_order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);  // kBlockOfLane
  const StreamBitsX8 stream_bits_of(key);
  for (; j + 64 <= V; j += 64) {
    const __m256 lv = _mm256_set1_ps(level);
    __m256 top[2], open[2];
    for (int h = 0; h < 2; ++h) {
      const int64_t i = j + 32 * h;
      top[h] = block_max_x8(row.bound8(i), row.bound8(i + 8), row.bound8(i + 16),
                            row.bound8(i + 24));
      // The blocks with a live token that the largest noise lifts to the level (+inf included).
      open[h] = _mm256_and_ps(_mm256_cmp_ps(top[h], neg_inf, _CMP_GT_OQ),
                              _mm256_cmp_ps(_mm256_add_ps(top[h], max_noise), lv, _CMP_NLT_UQ));
    }
    if (_mm256_movemask_ps(_mm256_or_ps(open[0], open[1])) == 0) continue;
    __m256i blocks[2];
    __m256 reach[2];
    for (int h = 0; h < 2; ++h) {
      blocks[h] = stream_bits_of(_mm256_add_epi32(
          _mm256_set1_epi32(static_cast<int>(kBlockCounter | ((j >> 2) + 8 * h))), block_order));
      reach[h] = _mm256_add_ps(top[h], block_noise_upper_x8(blocks[h]));
      open[h] = _mm256_and_ps(open[h], _mm256_cmp_ps(reach[h], lv, _CMP_NLT_UQ));
    }
    const int lanes = _mm256_movemask_ps(open[0]) | _mm256_movemask_ps(open[1]) << 8;
    if (lanes == 0) continue;
    alignas(32) uint32_t bits[16];
    alignas(32) float reaches[16];
    for (int h = 0; h < 2; ++h) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(bits + 8 * h), blocks[h]);
      _mm256_store_ps(reaches + 8 * h, reach[h]);
    }
    for (int k = 0; k < 16; ++k) {  // in index order; the level may have risen since
      const int lane = (k & 8) | (k & 7) >> 1 | (k & 1) << 2;
      if ((lanes >> lane & 1) && !(reaches[lane] < level)) score_block((j >> 2) + k, bits[lane]);
    }
  }
#endif
  for (; j < V; j += 4) {  // block by block (the last may be short), as one lane of the above
    float top = kNegInf;
    for (int64_t i = j; i < std::min(j + 4, V); ++i) top = std::max(top, row.bound(i));
    if (!(top > kNegInf) || top + kMaxBlockNoise < level) continue;
    const uint32_t block = block_bits(key, j);
    if (top + block_noise_upper(block) < level) continue;
    score_block(j >> 2, block);
  }
  return am.index;
}

// The tokens of a float32 row above `floor` (NaN never is), valued at their logit.
struct LogitRow {
  const float* x;
  float floor;
  float value(int64_t j) const { return x[j] > floor ? x[j] : kNegInf; }
  float bound(int64_t j) const { return value(j); }
#if defined(CPU_CAPABILITY_AVX2)
  __m256 bound8(int64_t j) const {
    const __m256 v = _mm256_loadu_ps(x + j);
    return _mm256_blendv_ps(_mm256_set1_ps(kNegInf), v,
                            _mm256_cmp_ps(v, _mm256_set1_ps(floor), _CMP_GT_OQ));
  }
#endif
};

// The Gumbel draw of a float32 row: argmax_j fl(x_j + token_noise(key, j)) over the tokens above
// `floor` (a filtered row drawn without writing its mask: as if every other token were -inf), the
// lowest index among equal scores; -1 without such a token. tol: block_gumbel_argmax's margin.
inline int64_t gumbel_argmax_row(const float* row, int64_t V, uint32_t key, float tol,
                                 float floor = kNegInf) {
  return block_gumbel_argmax(LogitRow{row, floor}, V, key, tol);
}

}  // namespace tso
