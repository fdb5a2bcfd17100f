// Shared helpers of the CPU kernels. Arguments are validated in Python before these run
// (torch_sampling_ops/_checks.py); the kernels only guard memory safety against bad values.
#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace tso {

// Index-like inputs may be int32 or int64 (1-D, or 2-D with unit last stride, as the checks
// require); the CPU kernels read them in place, widening each value to int64 as it is read: no copy
// and no allocation a call.
class IndexView {
 public:
  explicit IndexView(const at::Tensor& t)
      : data_(t.data_ptr()),
        is64_(t.scalar_type() == at::kLong),
        row_stride_(t.dim() == 2 ? t.stride(0) : 0),
        elem_stride_(t.dim() == 1 ? t.stride(0) : 1) {
    TORCH_CHECK(is64_ || t.scalar_type() == at::kInt,
                "torch_sampling_ops: an index tensor must be int32 or int64, got ",
                t.scalar_type());
  }
  int64_t operator[](int64_t i) const { return at(0, i); }
  int64_t at(int64_t row, int64_t i) const {
    const int64_t k = row * row_stride_ + i * elem_stride_;
    return is64_ ? static_cast<const int64_t*>(data_)[k] : static_cast<const int32_t*>(data_)[k];
  }

 private:
  const void* data_;
  bool is64_;
  int64_t row_stride_, elem_stride_;
};

// Row t's request slot, or -1 when idx_mapping points outside [0, num_slots).
inline int64_t slot_of(const IndexView& slots, int64_t t, int64_t num_slots) {
  const int64_t r = slots[t];
  return (r >= 0 && r < num_slots) ? r : -1;
}

inline bool is_finite(float x) { return std::abs(x) < std::numeric_limits<float>::infinity(); }

// When a row's filters are on, as every kernel reads them (the contract's "off" values: top_k <= 0
// or
// >= V, top_p >= 1 or NaN, min_p == 0).
inline bool top_k_on(int64_t k, int64_t V) { return k > 0 && k < V; }
inline bool top_p_on(float p) { return p < 1.f; }
inline bool min_p_on(float p) { return p != 0.0f; }

// min_p keeps the tokens at least this, of a row whose max (NaN ignored) is above -inf.
inline float min_p_threshold(float row_max, float p) { return row_max + std::log(p); }

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
