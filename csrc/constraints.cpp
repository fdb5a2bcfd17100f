// CPU kernels of the constraints op family (torch_sampling_ops/constraints.py): logit_bias and
// apply_token_bitmask.
#include "ops.h"

#include <cstring>
#include <type_traits>
#include <vector>

namespace tso {
namespace {

// A ragged per-slot list read in place: slot r holds ids[r, :clamp(num[r], 0, W)], the count
// clamped in 64 bits. `visit(r, f)` calls f(ids, n) with the slot's ids as an int32 or int64
// pointer.
class ListView {
 public:
  ListView(const at::Tensor& ids, const at::Tensor& num)
      : data_(ids.data_ptr()),
        is64_(ids.scalar_type() == at::kLong),
        stride_(ids.stride(0)),
        num_(num),
        width_(ids.size(1)) {}
  int64_t size(int64_t slot) const { return std::clamp<int64_t>(num_[slot], 0, width_); }
  template <typename F>
  void visit(int64_t slot, F&& f) const {
    if (is64_) {
      f(static_cast<const int64_t*>(data_) + slot * stride_, size(slot));
    } else {
      f(static_cast<const int32_t*>(data_) + slot * stride_, size(slot));
    }
  }
  // The slot's ids in [0, vocab), as int64.
  void gather(int64_t slot, int64_t vocab, std::vector<int64_t>& out) const {
    out.clear();
    visit(slot, [&](const auto* ids, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        if (in_vocab(ids[i], vocab)) out.push_back(ids[i]);
      }
    });
  }
  template <typename I>
  static bool in_vocab(I id, int64_t vocab) {
    return static_cast<uint64_t>(id) < static_cast<uint64_t>(vocab);
  }

 private:
  const void* data_;
  bool is64_;
  int64_t stride_;
  IndexView num_;
  int64_t width_;
};

// Ids ahead of the current one whose logits are prefetched: the listed tokens lie scattered over a
// row, and each load is otherwise a cache miss the loop waits on.
constexpr int64_t kPrefetchAhead = 16;

template <typename scalar_t, typename I>
inline void prefetch_listed(const scalar_t* row, const I* ids, int64_t i, int64_t n,
                            int64_t vocab) {
  if (i + kPrefetchAhead < n) {
    const I id = ids[i + kPrefetchAhead];
    __builtin_prefetch(row + (ListView::in_vocab(id, vocab) ? static_cast<int64_t>(id) : 0), 1);
  }
}

// Whether a listed id in [0, vocab) holds a finite logit.
template <typename scalar_t, typename I>
bool any_finite(const scalar_t* row, const I* ids, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i) {
    if (ListView::in_vocab(ids[i], vocab) && is_finite(static_cast<float>(row[ids[i]])))
      return true;
  }
  return false;
}

template <typename scalar_t>
bool any_finite(const scalar_t* row, int64_t vocab) {
  for (int64_t j = 0; j < vocab; ++j) {
    if (is_finite(static_cast<float>(row[j]))) return true;
  }
  return false;
}

// Per row, in the contract's order. Allowed list: the allowed logits are saved, the row filled with
// -inf (a vectorised fill) and the saved logits written back. Bias: every biased logit is read
// before any is written, so a duplicated id gets one bias. Min tokens: the stop logits are saved
// and set to -inf; a finite logit is then looked for among the allowed ids (every other token is
// -inf or NaN) or along the row (stopping at the first); if there is none, the stops get their
// saved values back.
template <typename scalar_t>
void logit_bias_kernel(at::Tensor& logits, const IndexView& slots, const IndexView& output_lens,
                       const ListView& allowed, const ListView& bias, const at::Tensor& bias_values,
                       const ListView& stop, const at::Tensor& min_tokens) {
  const int64_t T = logits.size(0), V = logits.size(1), R = min_tokens.size(0);
  const int64_t row_stride = logits.stride(0);
  const int64_t bias_stride = bias_values.stride(0);
  scalar_t* base = logits.data_ptr<scalar_t>();
  const float* bias_p = bias_values.data_ptr<float>();
  const int32_t* min_p = min_tokens.data_ptr<int32_t>();
  const int64_t min_stride = min_tokens.stride(0);

  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> stop_ids;
    std::vector<scalar_t> saved;
    std::vector<float> biased;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = slot_of(slots, t, R);
      if (r < 0) continue;
      scalar_t* row = base + t * row_stride;

      const bool restricted = allowed.size(r) > 0;
      if (restricted) {
        allowed.visit(r, [&](const auto* ids, int64_t n) {
          saved.resize(n);
          for (int64_t i = 0; i < n; ++i) {
            prefetch_listed(row, ids, i, n, V);
            saved[i] = ListView::in_vocab(ids[i], V) ? row[ids[i]] : static_cast<scalar_t>(0);
          }
          std::fill(row, row + V, static_cast<scalar_t>(kNegInf));
          for (int64_t i = 0; i < n; ++i) {
            if (ListView::in_vocab(ids[i], V)) row[ids[i]] = saved[i];
          }
        });
      }

      bias.visit(r, [&](const auto* ids, int64_t n) {
        const float* values = bias_p + r * bias_stride;
        biased.resize(n);
        for (int64_t i = 0; i < n; ++i) {
          prefetch_listed(row, ids, i, n, V);
          const int64_t id = ListView::in_vocab(ids[i], V) ? static_cast<int64_t>(ids[i]) : -1;
          biased[i] = id >= 0 ? static_cast<float>(row[id]) + values[i] : 0.0f;
        }
        for (int64_t i = 0; i < n; ++i) {
          if (ListView::in_vocab(ids[i], V)) row[ids[i]] = static_cast<scalar_t>(biased[i]);
        }
      });

      if (stop.size(r) > 0 && output_lens[t] < min_p[r * min_stride]) {
        stop.gather(r, V, stop_ids);
        saved.resize(stop_ids.size());
        for (size_t i = 0; i < stop_ids.size(); ++i) saved[i] = row[stop_ids[i]];
        for (const int64_t id : stop_ids) row[id] = static_cast<scalar_t>(kNegInf);
        bool others_finite = false;
        if (restricted) {
          allowed.visit(
              r, [&](const auto* ids, int64_t n) { others_finite = any_finite(row, ids, n, V); });
        } else {
          others_finite = any_finite(row, V);
        }
        if (!others_finite) {
          for (size_t i = 0; i < stop_ids.size(); ++i) row[stop_ids[i]] = saved[i];
        }
      }
    }
  });
}

template <typename scalar_t>
void token_bitmask_kernel(at::Tensor& logits, const at::Tensor& bitmask, const IndexView* slots) {
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
      const int64_t r = slots ? (*slots)[t] : t;
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
  const ListView allowed(allowed_ids, num_allowed), bias(bias_ids, num_bias),
      stop(stop_ids, num_stop);
  const IndexView slots(idx_mapping), lens(output_lens);
  TSO_DISPATCH_LOGITS(logits.scalar_type(), "logit_bias", [&] {
    logit_bias_kernel<scalar_t>(logits, slots, lens, allowed, bias, bias_values, stop, min_tokens);
  });
}

void apply_token_bitmask(at::Tensor logits, const at::Tensor& bitmask,
                         const std::optional<at::Tensor>& idx_mapping) {
  const std::optional<IndexView> slots =
      idx_mapping ? std::optional<IndexView>(*idx_mapping) : std::nullopt;
  const IndexView* slot_p = slots ? &*slots : nullptr;
  TSO_DISPATCH_LOGITS(logits.scalar_type(), "apply_token_bitmask",
                      [&] { token_bitmask_kernel<scalar_t>(logits, bitmask, slot_p); });
}

}  // namespace tso
