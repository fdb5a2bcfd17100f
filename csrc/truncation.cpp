// CPU kernel of top_k_top_p (torch_sampling_ops/truncation.py), in place.
//
// Per row: the k-th largest value by nth_element; the top-p boundary by sorting only the tokens
// within a window below the maximum that already holds the target mass (the window doubles until it
// does), not the whole row. Masses are accumulated in double: a float32 running sum over a
// 150K-token row drifts by ~1e-4, the contract's whole tolerance.
#include "ops.h"

#include <cmath>
#include <vector>

namespace tso {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The value at which the mass of the tokens >= it, counted from the largest, first reaches target.
float top_p_threshold(const std::vector<float>& x, float lower, float row_max, double target,
                      std::vector<float>& window) {
  for (float width = 0.5f;; width *= 1.5f) {  // a window 1.5x wider than needed, at most
    const float floor_value = std::max(lower, row_max - width);
    window.clear();
    double mass = 0.;
    for (float v : x) {
      if (v >= floor_value) {
        window.push_back(v);
        mass += std::exp(v - row_max);
      }
    }
    if (mass >= target || floor_value == lower || width > 1e30f) break;
  }
  std::sort(window.begin(), window.end(), std::greater<float>());
  double cumulative = 0.;
  for (float v : window) {
    cumulative += std::exp(v - row_max);
    if (cumulative >= target) return v;
  }
  return window.empty() ? lower : window.back();
}

template <typename scalar_t>
void top_k_top_p_kernel(at::Tensor& logits, const int64_t* slot_p, const int32_t* top_k_p,
                        const float* top_p_p, int64_t num_slots) {
  const int64_t T = logits.size(0), V = logits.size(1), row_stride = logits.stride(0);
  scalar_t* base = logits.data_ptr<scalar_t>();

  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> x(V), scratch, window;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = slot_p[t];
      if (r < 0 || r >= num_slots) continue;
      const int64_t k = top_k_p[r];
      const float p = top_p_p[r];
      const bool k_on = k > 0 && k < V, p_on = p < 1.f;
      if (!k_on && !p_on) continue;
      scalar_t* row = base + t * row_stride;
      float row_max = kNegInf;
      for (int64_t j = 0; j < V; ++j) {
        const float v = static_cast<float>(row[j]);
        x[j] = std::isnan(v) ? kNegInf : v;
        row_max = std::max(row_max, x[j]);
      }
      if (row_max == kNegInf) continue;

      float threshold = kNegInf;
      if (k_on) {
        scratch.assign(x.begin(), x.end());
        std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(),
                         std::greater<float>());
        threshold = scratch[k - 1];
      }
      if (p_on && row_max == kInf) {
        threshold = kInf;  // all the mass lies on the +inf logits
      } else if (p_on) {
        double kept_mass = 0.;
        for (float v : x) {
          if (v >= threshold) kept_mass += std::exp(v - row_max);
        }
        const double target = std::max(p * kept_mass, double(std::numeric_limits<float>::min()));
        threshold = std::max(threshold, top_p_threshold(x, threshold, row_max, target, window));
      }
      for (int64_t j = 0; j < V; ++j) {
        if (!(static_cast<float>(row[j]) >= threshold)) row[j] = kNegInf;
      }
    }
  });
}

}  // namespace

void top_k_top_p(at::Tensor logits, const at::Tensor& idx_mapping, const at::Tensor& top_k,
                 const at::Tensor& top_p) {
  const at::Tensor slots = as_int64(idx_mapping), k = top_k.contiguous(), p = top_p.contiguous();
  TSO_DISPATCH_LOGITS(logits.scalar_type(), "top_k_top_p", [&] {
    top_k_top_p_kernel<scalar_t>(logits, slots.data_ptr<int64_t>(), k.data_ptr<int32_t>(),
                                 p.data_ptr<float>(), k.size(0));
  });
}

}  // namespace tso
