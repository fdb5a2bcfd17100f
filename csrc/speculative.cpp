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

// The max of the row and the sum of exp(x - max) (sum_exp); (-inf, 0) without a logit above -inf.
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
  s = m == kNegInf ? 0.0f : sum_exp(row, V, m);
}

// p(x) = exp(x - m) / s through at::vec's exp.
inline float residual_prob(float x, float m, float s) {
  float lanes[Vec::size()];
  Vec(x - m).exp().store(lanes);
  return lanes[0] / s;
}

// r = p - q of token k with logit x (q from `probs`, or one-hot of `draft` without it).
inline float residual_at(float x, int64_t k, const float* probs, int64_t draft, float m, float s) {
  return residual_prob(x, m, s) - (probs != nullptr ? probs[k] : (k == draft ? 1.0f : 0.0f));
}

// The residual of a row valued at log r (block_gumbel_argmax): r = p - q > 0 (residual_at) of a
// live logit, else not live. With q >= 0, log r <= log p = (x - m) - log s up to the roundings of
// exp, the division and the logs (a few ulp: within kLogPMargin); a p below e**-87 may be
// subnormal, less accurate, so the bound takes log p at least -87 there. A q that is not >= 0
// (NaN, negative) bounds nothing (+inf).
constexpr float kLogPMargin = 2e-4f;
constexpr float kLogPFloor = -87.0f;

struct ResidualRow {
  const float* row;
  const float* probs;  // q, or one-hot of `draft` without it
  int64_t draft;  // in [-1, V]: an int32
  float m, s, log_s;
  float value(int64_t k) const {
    const float x = logit_at(row, k);
    if (!(x > kNegInf)) return kNegInf;
    const float r = residual_at(x, k, probs, draft, m, s);
    return r > 0.0f ? std::log(r) : kNegInf;  // r > 0 is false for NaN
  }
  float bound(int64_t k) const {
    const float x = logit_at(row, k);
    if (!(x > kNegInf)) return kNegInf;
    const float q = probs != nullptr ? probs[k] : (k == draft ? 1.0f : 0.0f);
    const float b = (x - m) - log_s;
    return q >= 0.0f && b == b ? std::max(kLogPFloor, b) + kLogPMargin : -kNegInf;
  }
#if defined(CPU_CAPABILITY_AVX2)
  __m256 bound8(int64_t k) const {
    const __m256 x = load_logits(row + k);
    const __m256 q =
        probs != nullptr
            ? _mm256_loadu_ps(probs + k)
            : _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(
                                tokens_x8(k), _mm256_set1_epi32(static_cast<int>(draft)))),
                            _mm256_set1_ps(1.0f));
    const __m256 b = _mm256_max_ps(
        _mm256_set1_ps(kLogPFloor),  // the second operand where either is NaN
        _mm256_sub_ps(_mm256_sub_ps(x, _mm256_set1_ps(m)), _mm256_set1_ps(log_s)));
    const __m256 known = _mm256_and_ps(_mm256_cmp_ps(q, _mm256_setzero_ps(), _CMP_GE_OQ),
                                       _mm256_cmp_ps(b, b, _CMP_ORD_Q));
    const __m256 bound = _mm256_blendv_ps(_mm256_set1_ps(-kNegInf),
                                          _mm256_add_ps(b, _mm256_set1_ps(kLogPMargin)), known);
    return _mm256_blendv_ps(_mm256_set1_ps(kNegInf), bound,
                            _mm256_cmp_ps(x, _mm256_set1_ps(kNegInf), _CMP_GT_OQ));
  }
#endif
};

// argmax_k fl(log(r_k) + g_k) over r = p - q > 0 (residual_at), the lowest index among equal
// scores; the draw from p, argmax_k fl(x_k + g_k) (gumbel_argmax_row), if r has no positive entry;
// -1 for a row without a live logit.
int64_t residual_draw(const float* row, const float* probs, int64_t draft, float m, float s,
                      uint32_t key, int64_t V, float tol) {
  const float log_s = static_cast<float>(std::log(static_cast<double>(s)));
  const int64_t token =
      block_gumbel_argmax(ResidualRow{row, probs, std::clamp<int64_t>(draft, -1, V), m, s, log_s},
                          V, key, tol);
  return token >= 0 ? token : gumbel_argmax_row(row, V, key, tol);
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
          if (!accept) token = residual_draw(row, probs_row, draft, m, s, key, V, tol);
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
