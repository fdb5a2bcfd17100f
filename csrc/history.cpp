// CPU kernels of the history op family (torch_sampling_ops/history.py): penalties,
// update_output_counts and bad_words.
#include "ops.h"

#include <cmath>
#include <cstring>
#include <type_traits>

namespace tso {
namespace {

// Seen tokens of a mask word above which all 32 are processed at once.
constexpr int kDenseBits = 6;

template <typename scalar_t>
using bits_t = std::conditional_t<sizeof(scalar_t) == 4, uint32_t, uint16_t>;

// `a` where `take` is set, else `b`, on the raw bits: the compiler cannot turn it into a branch
// (a division may trap, so a ternary between a quotient and a product becomes one), and a branch
// on a random sign or bit mispredicts half the time.
template <typename bits>
inline bits select_bits(bool take, bits a, bits b) {
  const bits keep = bits(0) - static_cast<bits>(take);
  return (a & keep) | (b & ~keep);
}

// The repetition penalty of a seen token. A true float32 division (no reciprocal) and, after it,
// one fused multiply-add for frequency and presence, as the Triton kernel: CPU and CUDA agree
// bitwise.
inline float repeat(float x, float rep) {
  const float divided = x / rep, multiplied = x * rep;
  uint32_t d, m;
  std::memcpy(&d, &divided, 4);
  std::memcpy(&m, &multiplied, 4);
  const uint32_t r = select_bits<uint32_t>(x > 0.0f, d, m);
  float out;
  std::memcpy(&out, &r, 4);
  return out;
}

template <typename scalar_t>
void penalties_kernel(at::Tensor& logits, const IndexView& slots, const at::Tensor& prompt_mask,
                      const at::Tensor& output_mask, const at::Tensor& output_counts,
                      const float* rep_p, const float* freq_p, const float* pres_p, int64_t R) {
  const int64_t T = logits.size(0), V = logits.size(1), row_stride = logits.stride(0);
  const int64_t words = (V + 31) / 32;
  scalar_t* base = logits.data_ptr<scalar_t>();
  const uint32_t* prompt = reinterpret_cast<const uint32_t*>(prompt_mask.data_ptr<int32_t>());
  const uint32_t* output = reinterpret_cast<const uint32_t*>(output_mask.data_ptr<int32_t>());
  const int32_t* counts = output_counts.data_ptr<int32_t>();
  const int64_t prompt_stride = prompt_mask.stride(0), output_stride = output_mask.stride(0);
  const int64_t counts_stride = output_counts.stride(0);
  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = slot_of(slots, t, R);
      if (r < 0) continue;
      const float rep = rep_p[r], freq = freq_p[r], pres = pres_p[r];
      if (rep == 1.0f && freq == 0.0f && pres == 0.0f) continue;  // all off: the row is not read
      // Repetition off: only output tokens change (x / 1 and x * 1 are exact), the prompt mask is
      // not read.
      const bool use_prompt = rep != 1.0f;
      scalar_t* row = base + t * row_stride;
      const uint32_t* prompt_row = prompt + r * prompt_stride;
      const uint32_t* output_row = output + r * output_stride;
      const int32_t* counts_row = counts + r * counts_stride;
      for (int64_t w = 0; w < words; ++w) {
        const uint32_t out_word = output_row[w];
        uint32_t seen = use_prompt ? (out_word | prompt_row[w]) : out_word;
        if (seen == 0) continue;
        const int64_t first = 32 * w;
        scalar_t* tokens = row + first;
        if (first + 32 <= V && __builtin_popcount(seen) > kDenseBits) {
          // Many seen tokens: repetition on all 32 lanes (a select, no branch on the random sign or
          // bit), the output tokens one by one, then the seen lanes stored; unseen lanes keep their
          // bits.
          float y[32];
          for (int b = 0; b < 32; ++b) y[b] = repeat(static_cast<float>(tokens[b]), rep);
          for (uint32_t o = out_word; o != 0; o &= o - 1) {
            const int j = __builtin_ctz(o);
            y[j] -= std::fma(freq, static_cast<float>(counts_row[first + j]), pres);
          }
          bits_t<scalar_t>* token_bits = reinterpret_cast<bits_t<scalar_t>*>(tokens);
          for (int b = 0; b < 32; ++b) {
            const scalar_t value = static_cast<scalar_t>(y[b]);
            bits_t<scalar_t> value_bits;
            std::memcpy(&value_bits, &value, sizeof(value_bits));
            token_bits[b] = select_bits((seen >> b) & 1u, value_bits, token_bits[b]);
          }
          continue;
        }
        while (seen != 0) {  // set bits in ascending token order
          const int j = __builtin_ctz(seen);
          seen &= seen - 1;
          if (first + j >= V) break;  // bits past V are ignored
          float x = repeat(static_cast<float>(tokens[j]), rep);
          if ((out_word >> j) & 1u)
            x -= std::fma(freq, static_cast<float>(counts_row[first + j]), pres);
          tokens[j] = static_cast<scalar_t>(x);
        }
      }
    }
  });
}

template <typename scalar_t>
void bad_words_kernel(at::Tensor& logits, const IndexView& slots, const IndexView& ids, int64_t W,
                      const int32_t* offsets, int64_t offsets_stride, int64_t N,
                      const IndexView& num, const int32_t* history, int64_t history_stride,
                      int64_t L, const IndexView& hist_lens, int64_t R) {
  const int64_t T = logits.size(0), V = logits.size(1), row_stride = logits.stride(0);
  scalar_t* base = logits.data_ptr<scalar_t>();
  // A row costs about its slot's list length: short lists stay on one thread (a parallel region
  // costs more than it saves there).
  const int64_t grain = std::max<int64_t>(1, 8192 / (N + W));
  at::parallel_for(0, T, grain, [&](int64_t begin, int64_t end_row) {
    for (int64_t t = begin; t < end_row; ++t) {
      const int64_t r = slot_of(slots, t, R);
      if (r < 0) continue;
      const int64_t n_words = std::clamp<int64_t>(num[r], 0, N);
      const int64_t hist_len = std::clamp<int64_t>(hist_lens[t], 0, L);
      const int32_t* offsets_row = offsets + r * offsets_stride;
      const int32_t* hist_row = history + r * history_stride;
      scalar_t* row = base + t * row_stride;
      for (int64_t i = 0; i < n_words; ++i) {
        const int64_t start = std::clamp<int64_t>(offsets_row[i], 0, W);
        const int64_t end = std::clamp<int64_t>(offsets_row[i + 1], 0, W);
        const int64_t prefix = end - start - 1;  // < 0: an empty sequence, which bans nothing
        if (prefix < 0 || prefix > hist_len) continue;  // longer than the history + 1: cannot match
        const int64_t last = ids.at(r, end - 1);
        if (last < 0 || last >= V) continue;
        const int32_t* tail = hist_row + (hist_len - prefix);
        bool match = true;
        for (int64_t k = 0; k < prefix && match; ++k)
          match = ids.at(r, start + k) == static_cast<int64_t>(tail[k]);
        if (match) row[last] = kNegInf;
      }
    }
  });
}

}  // namespace

void penalties(at::Tensor logits, const at::Tensor& idx_mapping, const at::Tensor& prompt_mask,
               const at::Tensor& output_mask, const at::Tensor& output_counts,
               const at::Tensor& repetition_penalty, const at::Tensor& frequency_penalty,
               const at::Tensor& presence_penalty) {
  const IndexView slots(idx_mapping);
  const at::Tensor rep = repetition_penalty.contiguous(), freq = frequency_penalty.contiguous(),
                   pres = presence_penalty.contiguous();
  TSO_DISPATCH_LOGITS(logits.scalar_type(), "penalties", [&] {
    penalties_kernel<scalar_t>(logits, slots, prompt_mask, output_mask, output_counts,
                               rep.data_ptr<float>(), freq.data_ptr<float>(),
                               pres.data_ptr<float>(), rep.size(0));
  });
}

void update_output_counts(at::Tensor output_counts, at::Tensor output_mask,
                          const at::Tensor& idx_mapping, const at::Tensor& token_ids) {
  const IndexView slots(idx_mapping), tokens(token_ids);
  const int64_t T = idx_mapping.size(0), R = output_counts.size(0), V = output_counts.size(1);
  int32_t* counts = output_counts.data_ptr<int32_t>();
  uint32_t* mask = reinterpret_cast<uint32_t*>(output_mask.data_ptr<int32_t>());
  const int64_t counts_stride = output_counts.stride(0), mask_stride = output_mask.stride(0);
  // Serial: rows may name the same slot and token, and T is a few hundred rows at most.
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = slots[t], tok = tokens[t];
    if (r < 0 || r >= R || tok < 0 || tok >= V)
      continue;  // -1 and out-of-range ids or slots count nothing
    int32_t& count = counts[r * counts_stride + tok];
    count =
        static_cast<int32_t>(static_cast<uint32_t>(count) + 1u);  // wraps as the CUDA atomic does
    mask[r * mask_stride + (tok >> 5)] |= 1u << (tok & 31);
  }
}

void bad_words(at::Tensor logits, const at::Tensor& idx_mapping, const at::Tensor& bad_word_ids,
               const at::Tensor& bad_word_offsets, const at::Tensor& num_bad_words,
               const at::Tensor& history, const at::Tensor& history_lens) {
  const int64_t W = bad_word_ids.size(1), N = bad_word_offsets.size(1) - 1, L = history.size(1);
  if (logits.size(0) == 0 || W == 0 || N <= 0) return;  // no sequence can be listed
  const IndexView slots(idx_mapping), ids(bad_word_ids), num(num_bad_words), lens(history_lens);
  TSO_DISPATCH_LOGITS(logits.scalar_type(), "bad_words", [&] {
    bad_words_kernel<scalar_t>(logits, slots, ids, W, bad_word_offsets.data_ptr<int32_t>(),
                               bad_word_offsets.stride(0), N, num, history.data_ptr<int32_t>(),
                               history.stride(0), L, lens, num_bad_words.size(0));
  });
}

}  // namespace tso
