// CPU kernels of the filtering op family (torch_sampling_ops/filtering.py): temperature and min_p.
#include "ops.h"

#include <cmath>
#include <cstring>
#include <type_traits>

namespace tso {
namespace {

// min_p works on the raw bits of the logits: a select between bit patterns vectorizes, where a
// select between Half/BFloat16 structs (copied through memory) does not.
template <typename scalar_t>
using bits_t = std::conditional_t<sizeof(scalar_t) == 4, uint32_t, uint16_t>;

template <typename scalar_t>
inline float bits_to_float(bits_t<scalar_t> b) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    float f;
    std::memcpy(&f, &b, sizeof(f));
    return f;
  } else {
    return static_cast<float>(scalar_t(b, scalar_t::from_bits()));
  }
}

template <typename scalar_t>
void temperature_kernel(at::Tensor& logits, const IndexView& slots, const float* temps, int64_t R) {
  const int64_t T = logits.size(0), V = logits.size(1), row_stride = logits.stride(0);
  scalar_t* base = logits.data_ptr<scalar_t>();
  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = slot_of(slots, t, R);
      if (r < 0) continue;
      const float temp = temps[r];
      if (temp == 0.0f) continue;  // greedy row: left as it is
      scalar_t* row = base + t * row_stride;
      // A true float32 division (no reciprocal), as the Triton kernel's div_rn: CPU and CUDA agree
      // bitwise.
      for (int64_t j = 0; j < V; ++j)
        row[j] = static_cast<scalar_t>(static_cast<float>(row[j]) / temp);
    }
  });
}

// The largest logit of a row, ignoring NaN (-inf when there is no non-NaN logit). Lanes of
// independent running maxima: an elementwise select the compiler vectorizes (a float max
// reduction would need -ffast-math, which would also drop the NaN rule).
template <typename scalar_t>
float row_max_ignoring_nan(const bits_t<scalar_t>* row, int64_t V) {
  constexpr int kLanes = 16;
  float lanes[kLanes];
  for (int k = 0; k < kLanes; ++k) lanes[k] = kNegInf;
  int64_t j = 0;
  for (; j + kLanes <= V; j += kLanes) {
#pragma omp simd
    for (int k = 0; k < kLanes; ++k) {
      const float x = bits_to_float<scalar_t>(row[j + k]);
      lanes[k] = x > lanes[k] ? x : lanes[k];  // false for NaN: NaN never becomes the max
    }
  }
  for (; j < V; ++j) {
    const float x = bits_to_float<scalar_t>(row[j]);
    lanes[0] = x > lanes[0] ? x : lanes[0];
  }
  float m = lanes[0];
  for (int k = 1; k < kLanes; ++k) m = lanes[k] > m ? lanes[k] : m;
  return m;
}

template <typename scalar_t>
void min_p_kernel(at::Tensor& logits, const IndexView& slots, const float* min_ps, int64_t R) {
  const int64_t T = logits.size(0), V = logits.size(1), row_stride = logits.stride(0);
  using bits = bits_t<scalar_t>;
  static_assert(sizeof(bits) == sizeof(scalar_t));
  bits* base = reinterpret_cast<bits*>(logits.data_ptr<scalar_t>());
  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
    const scalar_t neg_inf_value = kNegInf;
    bits neg_inf;
    std::memcpy(&neg_inf, &neg_inf_value, sizeof(neg_inf));
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = slot_of(slots, t, R);
      if (r < 0) continue;
      const float p = min_ps[r];
      if (!min_p_on(p)) continue;  // no pass over the row
      bits* row = base + t * row_stride;
      const float m = row_max_ignoring_nan<scalar_t>(row, V);
      if (!(m > kNegInf)) continue;  // no non-NaN finite-or-+inf logit: the row is left as it is
      const float threshold = min_p_threshold(m, p);
      // NaN < threshold is false: NaN logits stay NaN.
      for (int64_t j = 0; j < V; ++j) {
        const bits x = row[j];
        row[j] = bits_to_float<scalar_t>(x) < threshold ? neg_inf : x;
      }
    }
  });
}

}  // namespace

void temperature(at::Tensor logits, const at::Tensor& idx_mapping, const at::Tensor& temperature) {
  const IndexView slots(idx_mapping);
  const at::Tensor temps = temperature.contiguous();
  TSO_DISPATCH_LOGITS(logits.scalar_type(), "temperature", [&] {
    temperature_kernel<scalar_t>(logits, slots, temps.data_ptr<float>(), temps.size(0));
  });
}

void min_p(at::Tensor logits, const at::Tensor& idx_mapping, const at::Tensor& min_p) {
  const IndexView slots(idx_mapping);
  const at::Tensor ps = min_p.contiguous();
  TSO_DISPATCH_LOGITS(logits.scalar_type(), "min_p", [&] {
    min_p_kernel<scalar_t>(logits, slots, ps.data_ptr<float>(), ps.size(0));
  });
}

}  // namespace tso
