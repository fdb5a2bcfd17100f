// CPU kernel of speculative decoding's verification step (torch_sampling_ops/speculative.py):
// rejection_sample. Each request walks its positions in order and stops at the first rejection,
// reading a target row only when it reaches it and a draft-probability row in full only at the
// rejected position. Requests run in parallel; a request's tokens depend only on its own rows,
// seed and position (the random stream of sample, csrc/random_stream.h).
#include "draw.h"
#include "ops.h"
#include "random_stream.h"
#include "vec.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace tso {
namespace {

// The token index of the acceptance uniform in a position's stream (outside every vocabulary).
constexpr uint32_t kAcceptToken = 0x7FFFFFFFu;

// The max of the row and the sum of exp(x - max), the sum through at::vec's exp_u20 (about 20 ulp a
// term, as logprobs' sum_exp: the sum within about 1e-6); (-inf, 0) without a logit above -inf.
void row_max_sum(const float* row, int64_t V, float& m, float& s) {
  // 4 running maxima (the max does not depend on the order), NaN read as -inf.
  Vec v_max[4] = {Vec(kNegInf), Vec(kNegInf), Vec(kNegInf), Vec(kNegInf)};
  int64_t i = 0;
  for (; i + 4 * Vec::size() <= V; i += 4 * Vec::size()) {
    for (int k = 0; k < 4; ++k) {
      v_max[k] = at::vec::maximum(v_max[k], load_logits(row + i + k * Vec::size()));
    }
  }
  for (; i + Vec::size() <= V; i += Vec::size())
    v_max[0] = at::vec::maximum(v_max[0], load_logits(row + i));
  m = max_lane(
      at::vec::maximum(at::vec::maximum(v_max[0], v_max[1]), at::vec::maximum(v_max[2], v_max[3])));
  for (; i < V; ++i) m = std::max(m, logit_at(row, i));
  s = 0.0f;
  if (m == kNegInf) return;
  const Vec vm(m);
  Vec acc(0.0f);
  int64_t j = 0;
  for (; j + Vec::size() <= V; j += Vec::size()) acc = acc + (load_logits(row + j) - vm).exp_u20();
  float lanes[Vec::size()];
  acc.store(lanes);
  for (int k = 0; k < Vec::size(); ++k) s += lanes[k];
  for (; j < V; ++j) s += std::exp(logit_at(row, j) - m);
}

// p(x) = exp(x - m) / s through at::vec's exp, lane by lane the same function: the vectorized
// residual draw and the exact one compute the same bits.
inline float residual_prob(float x, float m, float s) {
  float lanes[Vec::size()];
  Vec(x - m).exp().store(lanes);
  return lanes[0] / s;
}

// r = p - q of token k with logit x (q from `probs`, or one-hot of `draft` without it).
inline float residual_at(float x, int64_t k, const float* probs, int64_t draft, float m, float s) {
  return residual_prob(x, m, s) - (probs != nullptr ? probs[k] : (k == draft ? 1.0f : 0.0f));
}

// argmax_k log(r_k) + g_k over r = p - q > 0 (residual_at); argmax_k x_k + g_k (a draw from p) if r
// has no positive entry; -1 for a row without a live logit.
int64_t residual_draw(const float* row, const float* probs, int64_t draft, float m, float s,
                      uint32_t key, int64_t V) {
  Argmax from_r, from_p;
  for (int64_t k = 0; k < V; ++k) {
    const float x = logit_at(row, k);
    if (!(x > kNegInf)) continue;
    const float r = residual_at(x, k, probs, draft, m, s);
    const float log_r = r > 0.0f ? std::log(r) : kNegInf;  // r > 0 is false for NaN
    const bool may_r = r > 0.0f && (from_r.index < 0 || !(log_r + kMaxGumbel < from_r.best));
    const bool may_p = from_p.index < 0 || !(x + kMaxGumbel < from_p.best);
    if (!may_r && !may_p) continue;
    const float g = token_noise(key, k);
    if (may_r) from_r.offer(log_r + g, k);
    if (may_p) from_p.offer(x + g, k);
  }
  return from_r.index >= 0 ? from_r.index : from_p.index;
}

// residual_draw over a float32 row from approximate scores (log_x8 of r, gumbel_approx_x8)
// certified by Top2 (a near tie between lanes' leaders settled by rescoring them), with AVX2; the
// exact pass when neither decides, when a positive r is subnormal (log_x8 takes normal floats), and
// without AVX2. Without a positive r it is the draw
// from p, argmax_k x_k + g_k: gumbel_argmax_row's token (the same scores, the same noise).
inline int64_t residual_draw_fast(const float* row, const float* probs, int64_t draft, float m,
                                  float s, uint32_t key, int64_t V, float tol) {
#if defined(CPU_CAPABILITY_AVX2)
  Top2 top_r;
  LaneTop2 lanes_r;
  const __m256 neg_inf = _mm256_set1_ps(kNegInf), zero = _mm256_setzero_ps();
  const __m256 smallest = _mm256_set1_ps(std::numeric_limits<float>::min());
  const __m256i draft_x8 = _mm256_set1_epi32(static_cast<int>(std::clamp<int64_t>(draft, -1, V)));
  __m256 subnormal = zero;
  // Tokens whose noise cannot bring them near the best score so far are not scored, as in
  // gumbel_argmax_row: with q >= 0, log r <= log p = (x - m) - log s, within a margin of 1e-4 +
  // 1e-6 |bound| for the roundings of exp, the division and the logs.
  const float log_s = static_cast<float>(std::log(static_cast<double>(s)));
  const __m256 largest = _mm256_set1_ps(std::numeric_limits<float>::max());
  Skips skips;
  int64_t j = 0;
  for (; j + 8 <= V; j += 8) {
    if (j % 64 == 0) skips.update(std::max(LaneTop2::largest_of(lanes_r.first), top_r.first), tol);
    const __m256i tokens = tokens_x8(j);
    const __m256i bits = stream_bits_x8(key, tokens);
    const __m256 q = probs != nullptr
                         ? _mm256_loadu_ps(probs + j)
                         : _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(tokens, draft_x8)),
                                         _mm256_set1_ps(1.0f));
    const __m256 x = load_logits(row + j);
    // The bound of log r (-inf for a logit at -inf: |b| is clamped); none (NaN: scored) for a q
    // that is not >= 0 (NaN, negative).
    const __m256 b = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_set1_ps(m)), _mm256_set1_ps(log_s));
    const __m256 margin =
        _mm256_add_ps(_mm256_set1_ps(1e-4f),
                      _mm256_mul_ps(_mm256_set1_ps(1e-6f), _mm256_min_ps(Vec(b).abs(), largest)));
    const __m256 bound =
        _mm256_blendv_ps(_mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()),
                         _mm256_add_ps(b, margin), _mm256_cmp_ps(q, zero, _CMP_GE_OQ));
    if (skips.skip(bound, bits)) continue;
    const __m256 live = _mm256_cmp_ps(x, neg_inf, _CMP_GT_OQ);
    const __m256 p = Vec(_mm256_sub_ps(x, _mm256_set1_ps(m))).exp() / Vec(s);
    const __m256 r = _mm256_sub_ps(p, q);
    const __m256 positive = _mm256_and_ps(live, _mm256_cmp_ps(r, zero, _CMP_GT_OQ));
    if (_mm256_movemask_ps(positive) == 0) continue;
    subnormal =
        _mm256_or_ps(subnormal, _mm256_and_ps(positive, _mm256_cmp_ps(r, smallest, _CMP_LT_OQ)));
    const __m256 log_r = log_x8(_mm256_max_ps(r, smallest));
    lanes_r.offer(_mm256_blendv_ps(neg_inf, _mm256_add_ps(log_r, gumbel_approx_x8(bits)), positive),
                  tokens);
  }
  for (; j < V; ++j) {  // the last tokens exactly, as residual_draw scores them
    const float x = logit_at(row, j);
    if (!(x > kNegInf)) continue;
    const float r = residual_at(x, j, probs, draft, m, s);
    if (r > 0.0f) top_r.offer(std::log(r) + token_noise(key, j), j);
  }
  const Top2 exact_r = top_r;  // the tokens scored exactly, before the lanes join
  lanes_r.merge_into(top_r);
  if (_mm256_movemask_ps(subnormal) == 0) {
    if (skips.lose_to(top_r, tol)) {
      if (top_r.first_j >= 0 && top_r.certified(tol)) return top_r.first_j;
      if (top_r.first_j < 0) return gumbel_argmax_row(row, V, key, tol);
    }
    // A near tie between the lanes' leaders: residual_draw's exact scores for them (r > 0).
    if (top_r.first_j >= 0) {
      const int64_t settled = settle_among_leaders(lanes_r, exact_r, skips, tol, [&](int64_t k) {
        const float r = residual_at(logit_at(row, k), k, probs, draft, m, s);
        return std::log(r) + token_noise(key, k);
      });
      if (settled != -2) return settled;
    }
  }
#endif
  return residual_draw(row, probs, draft, m, s, key, V);
}

template <typename scalar_t>
void rejection_sample_kernel(const at::Tensor& logits, const IndexView& drafts, const float* probs,
                             int64_t probs_stride, const IndexView& cu, const float* temps,
                             const IndexView& seeds, const IndexView& positions, int64_t B,
                             int64_t N, int64_t max_spec_len, float tol, int64_t* out,
                             int32_t* num) {
  const int64_t V = logits.size(1), stride = logits.stride(0);
  const scalar_t* base = logits.data_ptr<scalar_t>();
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer;  // float16/bfloat16 rows as float32
    for (int64_t i = begin; i < end; ++i) {
      // Clamped layout: draft rows [lo, lo + n) within [0, N), target rows lo + i + j <= N + i < N
      // + B.
      const int64_t lo = std::clamp<int64_t>(cu[i], 0, N),
                    hi = std::clamp<int64_t>(cu[i + 1], 0, N);
      const int64_t n = std::clamp<int64_t>(hi - lo, 0, max_spec_len);
      const bool greedy = temps[i] == 0.0f;
      int64_t* out_row = out + i * (max_spec_len + 1);
      int64_t j = 0, token = -1;
      for (;; ++j) {
        const float* row = float_row(base + (lo + i + j) * stride, V, buffer);
        const bool is_draft = j < n;
        const int64_t draft = is_draft ? drafts[lo + j] : -1;
        const bool draft_ok = draft >= 0 && draft < V;
        const uint32_t key = stream_key(seeds[i], positions[i] + j);
        bool accept = false;
        if (greedy) {
          token = argmax_row(row, V);
          accept = draft_ok && draft == token;
        } else if (is_draft) {
          float m, s;
          row_max_sum(row, V, m, s);
          const float x_d = draft_ok ? logit_at(row, draft) : kNegInf;
          const float p_d = m > kNegInf ? std::exp(x_d - m) / s : 0.0f;
          const float* probs_row = probs != nullptr ? probs + (lo + j) * probs_stride : nullptr;
          const float q_d = probs_row != nullptr && draft_ok ? probs_row[draft] : 1.0f;
          const float u = stream_uniform(stream_bits(key, kAcceptToken));
          accept = draft_ok && u * q_d < p_d;
          if (!accept) token = residual_draw_fast(row, probs_row, draft, m, s, key, V, tol);
        } else {
          token = gumbel_argmax_row(row, V, key, tol);
        }
        if (!accept) break;
        out_row[j] = draft;
      }
      out_row[j] = token;
      for (int64_t k = j + 1; k <= max_spec_len; ++k) out_row[k] = -1;
      num[i] = static_cast<int32_t>(j + (token >= 0 ? 1 : 0));
    }
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rejection_sample(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& cu_num_draft,
    const at::Tensor& temperature, const at::Tensor& seeds, const at::Tensor& output_lens,
    int64_t max_spec_len, double tol) {
  const int64_t B = cu_num_draft.size(0) - 1, N = draft_token_ids.size(0);
  const auto opts = target_logits.options();
  at::Tensor out = at::empty({B, max_spec_len + 1}, opts.dtype(at::kLong));
  at::Tensor num = at::empty({B}, opts.dtype(at::kInt));
  if (B == 0) return {out, num};
  const IndexView drafts(draft_token_ids), cu(cu_num_draft), seed(seeds), positions(output_lens);
  const at::Tensor temps = temperature.contiguous();
  const float* probs = nullptr;
  int64_t probs_stride = 0;
  if (draft_probs.has_value()) {
    probs = draft_probs->data_ptr<float>();
    probs_stride = draft_probs->stride(0);
  }
  TSO_DISPATCH_LOGITS(target_logits.scalar_type(), "rejection_sample", [&] {
    rejection_sample_kernel<scalar_t>(
        target_logits, drafts, probs, probs_stride, cu, temps.data_ptr<float>(), seed, positions, B,
        N, max_spec_len, static_cast<float>(tol), out.data_ptr<int64_t>(), num.data_ptr<int32_t>());
  });
  return {out, num};
}

}  // namespace tso
