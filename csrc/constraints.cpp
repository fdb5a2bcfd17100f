// CPU kernels of the constraints op family (torch_sampling_ops/constraints.py): logit_bias and
// apply_token_bitmask.
#include "ops.h"

#include <cstring>
#include <type_traits>

namespace tso {
namespace {

// Marks listed ids in a per-thread byte map over the vocabulary and clears them again, so the
// map is reused across the rows a thread handles.
class TokenMarks {
 public:
  explicit TokenMarks(int64_t vocab) : marks_(vocab, 0) {}
  void set(const int64_t* ids, int64_t n, uint8_t value) {
    const int64_t vocab = static_cast<int64_t>(marks_.size());
    for (int64_t i = 0; i < n; ++i) {
      if (ids[i] >= 0 && ids[i] < vocab) marks_[ids[i]] = value;
    }
  }
  bool operator[](int64_t j) const { return marks_[j] != 0; }

 private:
  std::vector<uint8_t> marks_;
};

template <typename scalar_t>
void logit_bias_kernel(at::Tensor& logits, const at::Tensor& slots, const at::Tensor& output_lens,
                       const RaggedList& allowed, const RaggedList& bias,
                       const at::Tensor& bias_values, const RaggedList& stop,
                       const at::Tensor& min_tokens) {
  const int64_t T = logits.size(0), V = logits.size(1), R = min_tokens.size(0);
  const int64_t row_stride = logits.stride(0);
  const int64_t bias_width = bias_values.size(1);
  scalar_t* base = logits.data_ptr<scalar_t>();
  const int64_t* slot_p = slots.data_ptr<int64_t>();
  const int64_t* len_p = output_lens.data_ptr<int64_t>();
  const float* bias_p = bias_values.data_ptr<float>();
  const int32_t* min_p = min_tokens.data_ptr<int32_t>();

  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
    TokenMarks marks(V);
    std::vector<float> biased;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = slot_p[t];
      if (r < 0 || r >= R) continue;
      scalar_t* row = base + t * row_stride;

      const int64_t n_allowed = allowed.size(r);
      if (n_allowed > 0) {
        marks.set(allowed.row(r), n_allowed, 1);
        for (int64_t j = 0; j < V; ++j) {
          if (!marks[j]) row[j] = kNegInf;
        }
        marks.set(allowed.row(r), n_allowed, 0);
      }

      // Read every biased logit before writing any, so a duplicated id gets one bias, not two.
      const int64_t n_bias = bias.size(r);
      const int64_t* bias_ids = bias.row(r);
      const float* bias_row = bias_p + r * bias_width;
      biased.resize(n_bias);
      for (int64_t i = 0; i < n_bias; ++i) {
        const int64_t id = bias_ids[i];
        if (id >= 0 && id < V) biased[i] = static_cast<float>(row[id]) + bias_row[i];
      }
      for (int64_t i = 0; i < n_bias; ++i) {
        const int64_t id = bias_ids[i];
        if (id >= 0 && id < V) row[id] = biased[i];
      }

      const int64_t n_stop = stop.size(r);
      if (n_stop > 0 && len_p[t] < min_p[r]) {
        marks.set(stop.row(r), n_stop, 1);
        bool other_finite = false;
        for (int64_t j = 0; j < V && !other_finite; ++j) {
          other_finite = !marks[j] && is_finite(static_cast<float>(row[j]));
        }
        marks.set(stop.row(r), n_stop, 0);
        if (other_finite) {
          const int64_t* stop_ids = stop.row(r);
          for (int64_t i = 0; i < n_stop; ++i) {
            if (stop_ids[i] >= 0 && stop_ids[i] < V) row[stop_ids[i]] = kNegInf;
          }
        }
      }
    }
  });
}

template <typename scalar_t>
void token_bitmask_kernel(at::Tensor& logits, const at::Tensor& bitmask, const int64_t* slot_p) {
  // Works on the raw bits of the logits: a branch-free select that the compiler vectorizes
  // (a branch per token mispredicts on half the tokens of a random mask).
  using bits_t = std::conditional_t<sizeof(scalar_t) == 4, uint32_t, uint16_t>;
  static_assert(sizeof(bits_t) == sizeof(scalar_t));
  const scalar_t neg_inf_value = kNegInf;
  bits_t neg_inf;
  std::memcpy(&neg_inf, &neg_inf_value, sizeof(neg_inf));

  const int64_t T = logits.size(0), V = logits.size(1), mask_rows = bitmask.size(0);
  const int64_t row_stride = logits.stride(0), mask_stride = bitmask.stride(0);
  const int64_t words = (V + 31) / 32;
  bits_t* base = reinterpret_cast<bits_t*>(logits.data_ptr<scalar_t>());
  const int32_t* mask_p = bitmask.data_ptr<int32_t>();

  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = slot_p ? slot_p[t] : t;
      if (r < 0 || r >= mask_rows) continue;
      bits_t* row = base + t * row_stride;
      const uint32_t* mask_row = reinterpret_cast<const uint32_t*>(mask_p + r * mask_stride);
      for (int64_t w = 0; w < words; ++w) {
        const uint32_t word = mask_row[w];
        if (word == 0xffffffffu) continue;
        bits_t* tokens = row + 32 * w;
        const int64_t n = std::min<int64_t>(32, V - 32 * w);
        for (int64_t b = 0; b < n; ++b) {
          const bits_t keep = bits_t(0) - static_cast<bits_t>((word >> b) & 1u);
          tokens[b] = (tokens[b] & keep) | (neg_inf & ~keep);
        }
      }
    }
  });
}

}  // namespace

void logit_bias(at::Tensor logits, const at::Tensor& idx_mapping, const at::Tensor& output_lens,
                const at::Tensor& allowed_ids, const at::Tensor& num_allowed,
                const at::Tensor& bias_ids, const at::Tensor& bias_values,
                const at::Tensor& num_bias, const at::Tensor& stop_ids, const at::Tensor& num_stop,
                const at::Tensor& min_tokens) {
  const RaggedList allowed(allowed_ids, num_allowed), bias(bias_ids, num_bias),
      stop(stop_ids, num_stop);
  const at::Tensor slots = as_int64(idx_mapping), lens = as_int64(output_lens);
  const at::Tensor values = bias_values.contiguous(), min_tok = min_tokens.contiguous();
  TSO_DISPATCH_LOGITS(logits.scalar_type(), "logit_bias", [&] {
    logit_bias_kernel<scalar_t>(logits, slots, lens, allowed, bias, values, stop, min_tok);
  });
}

void apply_token_bitmask(at::Tensor logits, const at::Tensor& bitmask,
                         const std::optional<at::Tensor>& idx_mapping) {
  const at::Tensor slots = idx_mapping ? as_int64(*idx_mapping) : at::Tensor();
  const int64_t* slot_p = idx_mapping ? slots.data_ptr<int64_t>() : nullptr;
  TSO_DISPATCH_LOGITS(logits.scalar_type(), "apply_token_bitmask",
                      [&] { token_bitmask_kernel<scalar_t>(logits, bitmask, slot_p); });
}

}  // namespace tso
