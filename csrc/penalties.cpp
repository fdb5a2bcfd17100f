// CPU kernels of the penalties op family (torch_sampling_ops/penalties.py): penalties,
// update_output_counts and bad_words.
#include "ops.h"

#include <cmath>

namespace tso {
namespace {

// A row's request slot, or -1 when idx_mapping points outside [0, num_slots).
inline int64_t slot_of(const int64_t* slots, int64_t t, int64_t num_slots) {
  const int64_t r = slots[t];
  return (r >= 0 && r < num_slots) ? r : -1;
}

template <typename scalar_t>
void penalties_kernel(at::Tensor& logits, const int64_t* slots, const at::Tensor& prompt_mask,
                      const at::Tensor& output_mask, const at::Tensor& output_counts, const float* rep_p,
                      const float* freq_p, const float* pres_p, int64_t R) {
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
      // Repetition off: only output tokens change (x / 1 and x * 1 are exact), the prompt mask is not read.
      const bool use_prompt = rep != 1.0f;
      scalar_t* row = base + t * row_stride;
      const uint32_t* prompt_row = prompt + r * prompt_stride;
      const uint32_t* output_row = output + r * output_stride;
      const int32_t* counts_row = counts + r * counts_stride;
      for (int64_t w = 0; w < words; ++w) {
        const uint32_t out_word = output_row[w];
        uint32_t seen = use_prompt ? (out_word | prompt_row[w]) : out_word;
        while (seen != 0) {  // set bits in ascending token order
          const int j = __builtin_ctz(seen);
          seen &= seen - 1;
          const int64_t tok = 32 * w + j;
          if (tok >= V) break;  // bits past V are ignored
          float x = static_cast<float>(row[tok]);
          // A true float32 division and one fused multiply-add, as the Triton kernel: CPU and CUDA agree bitwise.
          const float divided = x / rep, multiplied = x * rep;  // both, then a select: the sign is random
          x = x > 0.0f ? divided : multiplied;
          if ((out_word >> j) & 1u) x -= std::fma(freq, static_cast<float>(counts_row[tok]), pres);
          row[tok] = static_cast<scalar_t>(x);
        }
      }
    }
  });
}

template <typename scalar_t>
void bad_words_kernel(at::Tensor& logits, const int64_t* slots, const int64_t* ids, int64_t W,
                      const int32_t* offsets, int64_t offsets_stride, int64_t N, const int64_t* num,
                      const int32_t* history, int64_t history_stride, int64_t L, const int64_t* hist_lens, int64_t R) {
  const int64_t T = logits.size(0), V = logits.size(1), row_stride = logits.stride(0);
  scalar_t* base = logits.data_ptr<scalar_t>();
  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end_row) {
    for (int64_t t = begin; t < end_row; ++t) {
      const int64_t r = slot_of(slots, t, R);
      if (r < 0) continue;
      const int64_t n_words = std::clamp<int64_t>(num[r], 0, N);
      const int64_t hist_len = std::clamp<int64_t>(hist_lens[t], 0, L);
      const int64_t* ids_row = ids + r * W;
      const int32_t* offsets_row = offsets + r * offsets_stride;
      const int32_t* hist_row = history + r * history_stride;
      scalar_t* row = base + t * row_stride;
      for (int64_t i = 0; i < n_words; ++i) {
        const int64_t start = std::clamp<int64_t>(offsets_row[i], 0, W);
        const int64_t end = std::clamp<int64_t>(offsets_row[i + 1], 0, W);
        const int64_t prefix = end - start - 1;  // < 0: an empty sequence, which bans nothing
        if (prefix < 0 || prefix > hist_len) continue;  // longer than the history + 1: cannot match
        const int64_t last = ids_row[end - 1];
        if (last < 0 || last >= V) continue;
        const int32_t* tail = hist_row + (hist_len - prefix);
        bool match = true;
        for (int64_t k = 0; k < prefix && match; ++k) match = ids_row[start + k] == static_cast<int64_t>(tail[k]);
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
  const at::Tensor slots = as_int64(idx_mapping);
  const at::Tensor rep = repetition_penalty.contiguous(), freq = frequency_penalty.contiguous(),
                   pres = presence_penalty.contiguous();
  TSO_DISPATCH_LOGITS(logits.scalar_type(), "penalties", [&] {
    penalties_kernel<scalar_t>(logits, slots.data_ptr<int64_t>(), prompt_mask, output_mask, output_counts,
                               rep.data_ptr<float>(), freq.data_ptr<float>(), pres.data_ptr<float>(), rep.size(0));
  });
}

void update_output_counts(at::Tensor output_counts, at::Tensor output_mask, const at::Tensor& idx_mapping,
                          const at::Tensor& token_ids) {
  const at::Tensor slots = as_int64(idx_mapping), tokens = as_int64(token_ids);
  const int64_t T = slots.size(0), R = output_counts.size(0), V = output_counts.size(1);
  const int64_t* slot_p = slots.data_ptr<int64_t>();
  const int64_t* tok_p = tokens.data_ptr<int64_t>();
  int32_t* counts = output_counts.data_ptr<int32_t>();
  uint32_t* mask = reinterpret_cast<uint32_t*>(output_mask.data_ptr<int32_t>());
  const int64_t counts_stride = output_counts.stride(0), mask_stride = output_mask.stride(0);
  // Serial: rows may name the same slot and token, and T is a few hundred rows at most.
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = slot_p[t], tok = tok_p[t];
    if (r < 0 || r >= R || tok < 0 || tok >= V) continue;  // -1 and out-of-range ids or slots count nothing
    int32_t& count = counts[r * counts_stride + tok];
    count = static_cast<int32_t>(static_cast<uint32_t>(count) + 1u);  // wraps as the CUDA atomic does
    mask[r * mask_stride + (tok >> 5)] |= 1u << (tok & 31);
  }
}

void bad_words(at::Tensor logits, const at::Tensor& idx_mapping, const at::Tensor& bad_word_ids,
               const at::Tensor& bad_word_offsets, const at::Tensor& num_bad_words, const at::Tensor& history,
               const at::Tensor& history_lens) {
  const int64_t W = bad_word_ids.size(1), N = bad_word_offsets.size(1) - 1, L = history.size(1);
  if (logits.size(0) == 0 || W == 0 || N <= 0) return;  // no sequence can be listed
  const at::Tensor slots = as_int64(idx_mapping), ids = as_int64(bad_word_ids), num = as_int64(num_bad_words),
                   lens = as_int64(history_lens);
  TSO_DISPATCH_LOGITS(logits.scalar_type(), "bad_words", [&] {
    bad_words_kernel<scalar_t>(logits, slots.data_ptr<int64_t>(), ids.data_ptr<int64_t>(), W,
                               bad_word_offsets.data_ptr<int32_t>(), bad_word_offsets.stride(0), N,
                               num.data_ptr<int64_t>(), history.data_ptr<int32_t>(), history.stride(0), L,
                               lens.data_ptr<int64_t>(), num.size(0));
  });
}

}  // namespace tso
