// CPU kernels of the sampling op family (torch_sampling_ops/sampling.py): sample and logprobs,
// and the random stream exposed for tests.
#include "draw.h"
#include "ops.h"
#include "random_stream.h"
#include "top_k.h"
#include "vec.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

namespace tso {
namespace {

#if defined(CPU_CAPABILITY_AVX2)
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

// The approximate noise -log(-log(u)) of 8 lanes of stream bits (the CPU twin of
// gumbel.stream_gumbel_approx): within 2**-17 * (1 + |g|) of stream_gumbel, checked on all 2**23
// uniforms by the tests. u = (m + 1/2) / 2**23 is exact; where w = 1 - u < 1/16 (exact there),
// -log(u) = -log(1 - w) comes from its series to w**5 (relative error under w**5 / 6 <= 2**-22.6),
// where a log of u near 1 would lose its small result.
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

// The approximate noise of n stream bits: gumbel_approx_x8 with AVX2, else at::vec's log (within
// 1 ulp where the exact noise takes std::log); the last n % 8 exactly.
void gumbel_approx(const uint32_t* bits, int64_t n, float* noise) {
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

// One row of logprobs over x (float32, NaN read as -inf), k = top.k(); `maxima` is scratch.
void logprobs_row(const float* x, int64_t V, int64_t tok, TopK& top, std::vector<float>& maxima,
                  int64_t* topk_ids, float* topk_lp, float* token_lp, int64_t* rank) {
  const bool tok_ok = tok >= 0 && tok < V;
  const float x_tok = tok_ok ? logit_at(x, tok) : kNegInf;
  const int64_t k = top.k();
  // First pass: the max, the count of logits larger than the token's (per lane, in float: exact
  // below 2**24), and the lane maxima of each block of kBlock vectors and of each chunk of
  // `per_chunk` blocks. The chunks' lanes are disjoint groups of tokens, about kGroupsPerK * k of
  // them: the k-th largest of their maxima bounds the k-th largest logit from below.
  constexpr int64_t kBlock = 8, kGroupsPerK = 2;
  constexpr int64_t kBlockLen = kBlock * Vec::size();
  const int64_t blocks = V / kBlockLen;
  const int64_t chunks =
      std::max<int64_t>(1, std::min(blocks, (kGroupsPerK * k + Vec::size() - 1) / Vec::size()));
  const int64_t per_chunk = std::max<int64_t>(1, (blocks + chunks - 1) / chunks);
  maxima.resize((blocks + chunks) * Vec::size());
  float* block_maxima = maxima.data();
  float* group_maxima = block_maxima + blocks * Vec::size();
  int64_t groups = 0;
  const Vec v_tok(x_tok);
  Vec v_max(kNegInf), v_larger(0.0f);
  for (int64_t b0 = 0; b0 < blocks; b0 += per_chunk) {
    Vec chunk_max(kNegInf);
    for (int64_t b = b0; b < std::min(b0 + per_chunk, blocks); ++b) {
      Vec block_max(kNegInf);
      for (int64_t i = 0; i < kBlock; ++i) {
        const Vec v = load_logits(x + b * kBlockLen + i * Vec::size());
        block_max = at::vec::maximum(block_max, v);
        v_larger = v_larger + v.gt(v_tok);
      }
      block_max.store(block_maxima + b * Vec::size());
      chunk_max = at::vec::maximum(chunk_max, block_max);
    }
    chunk_max.store(group_maxima + groups);
    groups += Vec::size();
    v_max = at::vec::maximum(v_max, chunk_max);
  }
  int64_t j = blocks * kBlockLen;
  for (; j + Vec::size() <= V; j += Vec::size()) {
    const Vec v = load_logits(x + j);
    v_max = at::vec::maximum(v_max, v);
    v_larger = v_larger + v.gt(v_tok);
  }
  float m = max_lane(v_max);
  float lanes[Vec::size()];
  v_larger.store(lanes);
  int64_t larger = 0;
  for (int i = 0; i < Vec::size(); ++i) larger += static_cast<int64_t>(lanes[i]);
  for (; j < V; ++j) {
    const float xj = logit_at(x, j);
    m = std::max(m, xj);
    larger += xj > x_tok;
  }
  // Second pass, over the blocks whose maxima reach the bound: the top k, offered in index order
  // only the lanes that may enter (at least the bound, then above the list's last entry).
  if (k > 0) {
    const float floor = kth_group_max(group_maxima, groups, k);
    auto offer_vector = [&](int64_t jv) {
      for (int mask = top.candidates(load_logits(x + jv), floor); mask; mask &= mask - 1) {
        const int lane = __builtin_ctz(mask);
        top.offer(logit_at(x, jv + lane), jv + lane);
      }
    };
    for (int64_t b = 0; b < blocks; ++b) {
      if (!top.candidates(Vec::loadu(block_maxima + b * Vec::size()), floor)) continue;
      for (int64_t i = 0; i < kBlock; ++i) offer_vector(b * kBlockLen + i * Vec::size());
    }
    for (j = blocks * kBlockLen; j + Vec::size() <= V; j += Vec::size()) offer_vector(j);
    for (; j < V; ++j) {
      const float xj = logit_at(x, j);
      if (xj >= floor) top.offer(xj, j);
    }
    top.finish();
  }
  // A +inf logit holds all the mass: logsumexp is +inf (finite logits get -inf, +inf ones NaN).
  const float lse = m == -kNegInf ? m : (m > kNegInf ? m + std::log(sum_exp(x, V, m)) : kNegInf);
  auto logprob = [&](float v) { return lse > kNegInf ? v - lse : kNegInf; };
  for (int64_t i = 0; i < k; ++i) {
    topk_ids[i] = top.ids[i];
    topk_lp[i] = logprob(top.vals[i]);
  }
  *token_lp = tok_ok ? logprob(x_tok) : kNegInf;
  *rank = tok_ok ? 1 + larger : -1;
}

template <typename scalar_t>
void logprobs_kernel(const at::Tensor& logits, const IndexView& tokens, int64_t k,
                     int64_t* topk_ids, float* topk_lp, float* token_lp, int64_t* ranks) {
  const int64_t T = logits.size(0), V = logits.size(1), row_stride = logits.stride(0);
  const scalar_t* base = logits.data_ptr<scalar_t>();
  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer;  // float16/bfloat16 rows as float32
    std::vector<float> maxima;
    for (int64_t t = begin; t < end; ++t) {
      const float* xs = float_row(base + t * row_stride, V, buffer);
      TopK top(k);
      logprobs_row(xs, V, tokens[t], top, maxima, topk_ids + t * k, topk_lp + t * k, token_lp + t,
                   ranks + t);
    }
  });
}

// Whether a row in range needs a processed float32 row: not when it is drawn straight from float32
// logits (raw_ok; the checks give every logits matrix a unit column stride), which a greedy row is
// (the filters always keep the argmax, the lowest index among ties) and a plain one (temperature 1,
// every filter off: x / 1 is x).
bool needs_processing(int64_t V, bool raw_ok, float temp, int32_t k, float p, float min_p) {
  if (!raw_ok) return true;
  const bool filters_off = !top_k_on(k, V) && !top_p_on(p) && !min_p_on(min_p);
  return !(temp == 0.0f || (temp == 1.0f && filters_off));
}

// min_p on a row without NaN whose max is m, in place (as the min_p op: the tokens below
// m + log(min_p) set to -inf); returns the new max.
float min_p_row(float* x, int64_t V, float m, float min_p) {
  if (!(m > kNegInf)) return m;
  const float threshold = min_p_threshold(m, min_p);
  const Vec vt(threshold), neg_inf(kNegInf);
  int64_t j = 0;
  for (; j + Vec::size() <= V; j += Vec::size()) {
    const Vec v = Vec::loadu(x + j);
    Vec::blendv(v, neg_inf, v < vt).store(x + j);
  }
  for (; j < V; ++j) x[j] = x[j] < threshold ? kNegInf : x[j];
  return threshold > m ? kNegInf : m;  // NaN: nothing was set
}

// The token of each row: argmax of the (temperature-scaled, filtered) row plus the Gumbel noise of
// its stream; the plain argmax for greedy rows; -1 for rows without a logit above -inf, or with a
// slot out of range. A processed row is scaled into a thread's buffer, min_p applied there, and
// drawn over the tokens at least top_k_top_p's threshold, without writing its mask.
template <typename scalar_t>
void sample_kernel(const at::Tensor& logits, const IndexView& slots, const float* temps,
                   const int32_t* top_ks, const float* top_ps, const float* min_ps,
                   const IndexView& seeds, const IndexView& positions, int64_t R, float tol,
                   int64_t* out) {
  const int64_t T = logits.size(0), V = logits.size(1), row_stride = logits.stride(0);
  const scalar_t* base = logits.data_ptr<scalar_t>();
  constexpr bool raw_ok = std::is_same_v<scalar_t, float>;
  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
    float* x = thread_row_buffer(V);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = slot_of(slots, t, R);
      if (r < 0) {
        out[t] = -1;
        continue;
      }
      const float temp = temps[r];
      const scalar_t* in = base + t * row_stride;
      const uint32_t key = stream_key(seeds[r], positions[t]);
      if (!needs_processing(V, raw_ok, temp, top_ks[r], top_ps[r], min_ps[r])) {
        const float* row = reinterpret_cast<const float*>(in);
        out[t] = temp != 0.0f ? gumbel_argmax_row(row, V, key, tol) : argmax_row(row, V);
        continue;
      }
      float m = load_row(in, V, x, temp);
      if (min_p_on(min_ps[r])) m = min_p_row(x, V, m, min_ps[r]);
      const float threshold = top_k_top_p_threshold(x, V, m, top_ks[r], top_ps[r]);
      // x >= threshold as x > floor (the float below the threshold; -inf keeps every token above
      // -inf).
      const float floor = std::nextafter(threshold, kNegInf);
      out[t] = temp != 0.0f ? gumbel_argmax_row(x, V, key, tol, floor) : row_argmax(x, V, floor);
    }
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> random_stream(const at::Tensor& seeds,
                                                 const at::Tensor& positions,
                                                 const at::Tensor& tokens) {
  const IndexView s(seeds), p(positions), j(tokens);
  at::Tensor bits = at::empty(seeds.sizes(), seeds.options().dtype(at::kLong));
  at::Tensor noise = at::empty(seeds.sizes(), seeds.options().dtype(at::kFloat));
  for (int64_t i = 0; i < seeds.numel(); ++i) {
    const uint32_t key = stream_key(s[i], p[i]);
    bits.data_ptr<int64_t>()[i] = stream_bits(key, static_cast<uint32_t>(j[i]));
    noise.data_ptr<float>()[i] = token_noise(key, j[i]);
  }
  return {bits, noise};
}

std::tuple<at::Tensor, at::Tensor> gumbel_noise(const at::Tensor& bits) {
  const IndexView b(bits);
  const int64_t n = bits.numel();
  at::Tensor exact = at::empty(bits.sizes(), bits.options().dtype(at::kFloat));
  at::Tensor approx = at::empty(bits.sizes(), bits.options().dtype(at::kFloat));
  float* ex = exact.data_ptr<float>();
  float* ap = approx.data_ptr<float>();
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    std::vector<uint32_t> words(end - begin);
    for (int64_t i = begin; i < end; ++i) {
      words[i - begin] = static_cast<uint32_t>(b[i]);
      ex[i] = stream_gumbel(words[i - begin]);
    }
    gumbel_approx(words.data(), end - begin, ap + begin);
  });
  return {exact, approx};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logprobs(const at::Tensor& logits,
                                                                    const at::Tensor& token_ids,
                                                                    int64_t num_logprobs) {
  const int64_t T = logits.size(0);
  const IndexView tokens(token_ids);
  const auto opts = logits.options();
  at::Tensor topk_ids = at::empty({T, num_logprobs}, opts.dtype(at::kLong));
  at::Tensor topk_lp = at::empty({T, num_logprobs}, opts.dtype(at::kFloat));
  at::Tensor token_lp = at::empty({T}, opts.dtype(at::kFloat));
  at::Tensor ranks = at::empty({T}, opts.dtype(at::kLong));
  TSO_DISPATCH_LOGITS(logits.scalar_type(), "logprobs", [&] {
    logprobs_kernel<scalar_t>(logits, tokens, num_logprobs, topk_ids.data_ptr<int64_t>(),
                              topk_lp.data_ptr<float>(), token_lp.data_ptr<float>(),
                              ranks.data_ptr<int64_t>());
  });
  return {topk_ids, topk_lp, token_lp, ranks};
}

at::Tensor sample(const at::Tensor& logits, const at::Tensor& idx_mapping,
                  const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
                  const at::Tensor& min_p, const at::Tensor& seeds, const at::Tensor& output_lens,
                  double tol) {
  const int64_t T = logits.size(0);
  const IndexView slots(idx_mapping), positions(output_lens), seed(seeds);
  const at::Tensor temps = temperature.contiguous(), k = top_k.contiguous(), p = top_p.contiguous(),
                   mp = min_p.contiguous();
  at::Tensor out = at::empty({T}, logits.options().dtype(at::kLong));
  TSO_DISPATCH_LOGITS(logits.scalar_type(), "sample", [&] {
    sample_kernel<scalar_t>(logits, slots, temps.data_ptr<float>(), k.data_ptr<int32_t>(),
                            p.data_ptr<float>(), mp.data_ptr<float>(), seed, positions,
                            temps.size(0), static_cast<float>(tol), out.data_ptr<int64_t>());
  });
  return out;
}

}  // namespace tso
