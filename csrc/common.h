// Shared helpers of the CPU kernels. Arguments are validated in Python before these run
// (torch_sampling_ops/_checks.py); the kernels only guard memory safety against bad values.
#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace tso {

// Index-like inputs may be int32 or int64; the CPU kernels read them as contiguous int64. An int64
// contiguous input is returned as it is without a round trip through the dispatcher (`to` and
// `contiguous` would return it too, at the cost of two operator calls).
// A contiguous int32 input is widened by a plain loop into a fresh tensor (an operator call costs
// more than the copy for the short index vectors the ops take).
inline at::Tensor as_int64(const at::Tensor& t) {
  if (t.scalar_type() == at::kLong && t.is_contiguous()) return t;
  if (t.scalar_type() == at::kInt && t.is_contiguous()) {
    at::Tensor out = at::empty(t.sizes(), t.options().dtype(at::kLong));
    const int32_t* src = t.data_ptr<int32_t>();
    int64_t* dst = out.data_ptr<int64_t>();
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
    return out;
  }
  return t.to(at::kLong).contiguous();
}

// A ragged per-slot list: slot r holds ids[r, :clamp(num[r], 0, W)].
class RaggedList {
 public:
  RaggedList(const at::Tensor& ids, const at::Tensor& num)
      : ids_(as_int64(ids)), num_(as_int64(num)), width_(ids.size(1)) {}

  int64_t size(int64_t slot) const {
    return std::clamp<int64_t>(num_.data_ptr<int64_t>()[slot], 0, width_);
  }
  const int64_t* row(int64_t slot) const { return ids_.data_ptr<int64_t>() + slot * width_; }

 private:
  at::Tensor ids_, num_;
  int64_t width_;
};

inline bool is_finite(float x) { return std::abs(x) < std::numeric_limits<float>::infinity(); }

// When a row's filters are on, as every kernel reads them (the contract's "off" values: top_k <= 0
// or
// >= V, top_p >= 1 or NaN, min_p == 0).
inline bool top_k_on(int64_t k, int64_t V) { return k > 0 && k < V; }
inline bool top_p_on(float p) { return p < 1.f; }
inline bool min_p_on(float p) { return p != 0.0f; }

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The logits dtypes of the contract: float32, float16, bfloat16.
// clang-format off: one dispatch case a line
#define TSO_DISPATCH_LOGITS(TYPE, NAME, ...)                   \
  AT_DISPATCH_SWITCH(TYPE, NAME,                               \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) \
                     AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__)  \
                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))
// clang-format on

}  // namespace tso
