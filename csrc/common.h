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

// Index-like inputs may be int32 or int64; the CPU kernels read them as contiguous int64
// (row-major, for a 2-D input). A contiguous int64 input is read in place; a contiguous int32 one
// is widened into a vector the object owns (a tensor allocation, through the dispatcher, costs
// more than the copy for the short index vectors the ops take); any other goes through `to`.
// Not copyable: data() may point into the object.
class Int64Index {
 public:
  explicit Int64Index(const at::Tensor& t) {
    if (t.scalar_type() == at::kLong && t.is_contiguous()) {
      data_ = t.data_ptr<int64_t>();
    } else if (t.scalar_type() == at::kInt && t.is_contiguous()) {
      const int32_t* src = t.data_ptr<int32_t>();
      widened_.assign(src, src + t.numel());
      data_ = widened_.data();
    } else {
      converted_ = t.to(at::kLong).contiguous();
      data_ = converted_.data_ptr<int64_t>();
    }
  }
  Int64Index(const Int64Index&) = delete;
  Int64Index& operator=(const Int64Index&) = delete;

  const int64_t* data() const { return data_; }

 private:
  const int64_t* data_ = nullptr;
  std::vector<int64_t> widened_;
  at::Tensor converted_;
};

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
