// CPU kernel of top_k_top_p (torch_sampling_ops/truncation/), in place.
//
// Per row, over the row as float32 (NaN read as -inf): the k-th largest value by nth_element over
// the values at least the k-th largest of about 2k group maxima (one vectorized pass each), else
// from one pass that offers a sorted list only the lanes above its last value.
// The top-p boundary, with top-k on: by sorting only the kept tokens within a window below the
// maximum that already holds the target mass (the window grows until it does); top-p alone: from
// the masses of value buckets below the maximum, sorting only the boundary bucket. Masses are
// accumulated in double, each token's exponential in float32 (at::vec's exp, 1 ulp, in the
// vectorized loops): a float32 running sum over a 150K-token row drifts by ~1e-4, the contract's
// whole tolerance.
#include "ops.h"
#include "top_k.h"
#include "vec.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace tso {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
// Largest k whose k largest values top_p_threshold_sorted walks; larger k use the windows of
// top_p_threshold.
constexpr int64_t kListMaxK = 256;

// kth_largest by a TopK list fed the row in one pass (offered only the lanes above its last
// value): for rows where the group maxima below bound the k-th value poorly (ties, -inf).
float kth_largest_by_list(const float* x, int64_t V, int64_t k, std::vector<float>& scratch,
                          std::vector<float>& largest) {
  largest.clear();
  if (k > kListMaxK) {
    scratch.assign(x, x + V);
    std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(),
                     std::greater<float>());
    return scratch[k - 1];
  }
  TopK top(k);
  int64_t j = 0;
  for (; j + Vec::size() <= V; j += Vec::size()) {
    for (int mask = top.candidates(Vec::loadu(x + j)); mask; mask &= mask - 1) {
      top.offer(x[j + __builtin_ctz(mask)], j + __builtin_ctz(mask));
    }
  }
  for (; j < V; ++j) top.offer(x[j], j);
  top.finish();
  const float kth = top.vals[k - 1];
  largest.swap(top.vals);
  return kth;
}

// The k-th largest of x[0:V] (counting ties), 0 < k < V, x without NaN. `candidates` then holds
// the values at least a lower bound of it, in index order (every kept token's value), or nothing
// (x holds them); up to kListMaxK, `largest` the k largest values, larger first (else it is left
// empty). The bound is the k-th largest of the maxima of disjoint groups of tokens (k of them hold
// a value at least it), about 2k groups: lanes of runs of vectors, 4 running maxima a run.
float kth_largest(const float* x, int64_t V, int64_t k, std::vector<float>& candidates,
                  std::vector<float>& scratch, std::vector<float>& largest) {
  constexpr int64_t kPhases = 4;
  const int64_t vectors = V / Vec::size();
  const int64_t runs = std::max<int64_t>(1, std::min(vectors, (2 * k + 31) / 32));
  const int64_t run = std::max<int64_t>(1, (vectors + runs - 1) / runs);
  scratch.clear();
  for (int64_t v0 = 0; v0 < vectors; v0 += run) {
    Vec maxima[kPhases] = {Vec(kNegInf), Vec(kNegInf), Vec(kNegInf), Vec(kNegInf)};
    for (int64_t v = v0; v < std::min(v0 + run, vectors); ++v) {
      maxima[v % kPhases] = at::vec::maximum(maxima[v % kPhases], Vec::loadu(x + v * Vec::size()));
    }
    float lanes[kPhases * Vec::size()];
    for (int64_t i = 0; i < kPhases; ++i) maxima[i].store(lanes + i * Vec::size());
    scratch.insert(scratch.end(), lanes, lanes + kPhases * Vec::size());
  }
  candidates.clear();
  const float lower = kth_group_max(scratch.data(), static_cast<int64_t>(scratch.size()), k);
  // A bound at -inf (fewer than k groups with a live token) or one that lets through many more
  // than k values: the list.
  const int64_t most = 4 * k + 256;
  if (lower == kNegInf) return kth_largest_by_list(x, V, k, scratch, largest);
  int64_t j = 0;
  for (; j + Vec::size() <= V; j += Vec::size()) {
    for (int mask = lanes_above<true>(Vec::loadu(x + j), lower); mask; mask &= mask - 1) {
      candidates.push_back(x[j + __builtin_ctz(mask)]);
    }
    if (static_cast<int64_t>(candidates.size()) > most) {
      candidates.clear();
      return kth_largest_by_list(x, V, k, scratch, largest);
    }
  }
  for (; j < V; ++j) {
    if (x[j] >= lower) candidates.push_back(x[j]);
  }
  scratch.assign(candidates.begin(), candidates.end());
  std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(),
                   std::greater<float>());
  largest.clear();
  if (k <= kListMaxK) {
    largest.assign(scratch.begin(), scratch.begin() + k);
    std::sort(largest.begin(), largest.end(), std::greater<float>());
  }
  return scratch[k - 1];
}

// sum of exp(v - row_max) over the values v >= floor_value of x, in double; with `window`, those
// values are also collected. Only lanes >= floor_value are visited, unless floor_value is -inf.
double mass_at_least(const float* x, int64_t V, float floor_value, float row_max,
                     std::vector<float>* window) {
  double mass = 0.;
  int64_t j = 0;
  if (floor_value == kNegInf && window == nullptr) {  // the whole row: vectorized exponentials
    const Vec vm(row_max);
    float lanes[Vec::size()];
    for (; j + Vec::size() <= V; j += Vec::size()) {
      (Vec::loadu(x + j) - vm).exp().store(lanes);
      for (int i = 0; i < Vec::size(); ++i) mass += lanes[i];
    }
  } else {
    for (; j + Vec::size() <= V; j += Vec::size()) {
      for (int mask = lanes_above<true>(Vec::loadu(x + j), floor_value); mask; mask &= mask - 1) {
        const float v = x[j + __builtin_ctz(mask)];
        mass += std::exp(v - row_max);
        if (window) window->push_back(v);
      }
    }
  }
  for (; j < V; ++j) {
    if (x[j] >= floor_value) {
      mass += std::exp(x[j] - row_max);
      if (window) window->push_back(x[j]);
    }
  }
  return mass;
}

// The value at which the mass of the tokens >= it, counted from the largest, first reaches target.
float top_p_threshold(const float* x, int64_t V, float lower, float row_max, double target,
                      std::vector<float>& window) {
  for (float width = 0.5f;; width *= 1.5f) {  // a window 1.5x wider than needed, at most
    const float floor_value = std::max(lower, row_max - width);
    window.clear();
    const double mass = mass_at_least(x, V, floor_value, row_max, &window);
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

// top_p_threshold when the kept tokens are the k largest (`largest`, larger first) and ties of the
// last (`lower`): the same cumulative sums in the same order, without the windows' passes.
float top_p_threshold_sorted(const std::vector<float>& largest, float lower, float row_max,
                             double target) {
  double cumulative = 0.;
  for (float v : largest) {
    cumulative += std::exp(v - row_max);
    if (cumulative >= target) return v;
  }
  return lower;  // only ties of the k-th value are left: the boundary is at it
}

// Top-p alone over a whole row: the row's mass (summed as mass_at_least sums it, so the target is
// the same) and the masses of value buckets below the maximum. The tokens within kBucketRange of
// the maximum fall in buckets of 1 / kBucketsPerUnit by their distance to it; the masses of the
// buckets, from the largest down, find the bucket where the cumulative mass reaches the target,
// and only its tokens are sorted. A vector whose lanes all lie over kNoMass below the maximum is
// skipped: their exponentials are exactly 0 (at::vec's exp flushes below -104).
//
// The row's mass is first summed in Vec::size() independent sums, within (2V + 16) * 2**-53 of
// its sum in index order (each within (V - 1) * 2**-53 of the exact one): a comparison with the
// target that this leaves open is made again with the sum in index order. The buckets of a first
// band are filled with the exponentials, the others when the walk from the largest reaches them;
// a bucket's sum is still in index order.
constexpr int kBucketsPerUnit = 8;
constexpr int kBucketRange = 64;
constexpr int kBuckets = kBucketsPerUnit * kBucketRange;
constexpr float kNoMass = 110.f;
// The first band: the buckets within 6 of the maximum, every bucket in rows of more than
// kOneBandRow tokens (their boundary lies further below the maximum, and a second pass over a
// long row costs more than scattering every bucket in the first).
constexpr int kFirstBand = 6 * kBucketsPerUnit;
constexpr int64_t kOneBandRow = 8192;

// The top-p target: p times the kept mass (at least the smallest normal float, so that top_p <= 0
// keeps the most probable token(s)).
inline double top_p_target(float p, double kept_mass) {
  return std::max(p * kept_mass, double(std::numeric_limits<float>::min()));
}

struct TopPBoundary {
  double target;   // p times the row's mass (set when boundary is NaN)
  float boundary;  // NaN when it lies below the buckets (top_p near 1)
};

// The lanes (a bit each) of 8 tokens whose b (their distance to the maximum times
// kBucketsPerUnit) lies in buckets [lo, hi).
inline int lanes_in_buckets(const Vec& b, int lo, int hi) {
  return lanes_above<true>(b, static_cast<float>(lo)) &
         lanes_above(Vec(static_cast<float>(hi)) - b, 0.f);
}

// Adds e[i] to bucket b[i] for the lanes of 8 tokens in buckets [lo, hi).
inline void add_to_buckets(const Vec& b, const float* e, int lo, int hi, double* bucket_mass) {
  int in = lanes_in_buckets(b, lo, hi);
  if (in == 0) return;
  float lanes_b[Vec::size()];
  b.store(lanes_b);
  for (; in; in &= in - 1) {
    const int i = __builtin_ctz(in);
    bucket_mass[static_cast<int>(lanes_b[i])] += e[i];
  }
}

// Adds the exponentials `exps` of the tokens in buckets [lo, hi) to their buckets, in index order.
void fill_buckets(const float* x, const float* exps, int64_t V, float row_max, int lo, int hi,
                  double* bucket_mass) {
  const Vec vm(row_max), vscale(static_cast<float>(kBucketsPerUnit));
  int64_t j = 0;
  for (; j + Vec::size() <= V; j += Vec::size()) {
    add_to_buckets((vm - Vec::loadu(x + j)) * vscale, exps + j, lo, hi, bucket_mass);
  }
  for (; j < V; ++j) {
    const float b = (row_max - x[j]) * kBucketsPerUnit;
    if (b >= lo && b < hi) bucket_mass[static_cast<int>(b)] += exps[j];
  }
}

#if defined(CPU_CAPABILITY_AVX2)
// Per-lane double sums of 8 float lanes (lane i sums the i-th lanes in order).
struct LaneSums {
  __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();
  void add(__m256 v) {
    low = _mm256_add_pd(low, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    high = _mm256_add_pd(high, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  }
  void store(double* sums) const {
    _mm256_storeu_pd(sums, low);
    _mm256_storeu_pd(sums + 4, high);
  }
};
#endif

TopPBoundary top_p_alone_boundary(const float* x, int64_t V, float row_max, float p,
                                  std::vector<double>& bucket_mass, std::vector<float>& exps,
                                  std::vector<float>& window) {
  bucket_mass.assign(kBuckets, 0.);
  // Long rows: every bucket and the mass in index order in one pass (the scatter hides the sum's
  // latency); short rows: the first band, and the mass in Vec::size() sums certified below.
  const bool banded = V <= kOneBandRow;
  const int first_band = banded ? kFirstBand : kBuckets;
  if (banded) exps.resize(V);
  const Vec vm(row_max), vscale(static_cast<float>(kBucketsPerUnit));
  double sums[Vec::size()] = {}, mass = 0.;
#if defined(CPU_CAPABILITY_AVX2)
  LaneSums sums_x8;
#endif
  float lanes[Vec::size()];
  int64_t j = 0;
  for (; j + Vec::size() <= V; j += Vec::size()) {
    const Vec v = Vec::loadu(x + j);
    if (lanes_above(vm - v, kNoMass) == (1 << Vec::size()) - 1) {
      if (banded) Vec(0.f).store(exps.data() + j);
      continue;
    }
    const Vec e = (v - vm).exp();
    e.store(lanes);  // read from a local copy: a vector store read back lane by lane stalls
    if (banded) {
      e.store(exps.data() + j);
#if defined(CPU_CAPABILITY_AVX2)
      sums_x8.add(e);
#else
      for (int i = 0; i < Vec::size(); ++i) sums[i] += lanes[i];
#endif
    } else {
      for (int i = 0; i < Vec::size(); ++i) mass += lanes[i];
    }
    add_to_buckets((vm - v) * vscale, lanes, 0, first_band, bucket_mass.data());
  }
#if defined(CPU_CAPABILITY_AVX2)
  sums_x8.store(sums);
#endif
  for (int i = 0; i < Vec::size(); ++i) mass += sums[i];  // the 8 sums: 0 for long rows
  for (; j < V; ++j) {
    const float e = std::exp(x[j] - row_max), b = (row_max - x[j]) * kBucketsPerUnit;
    if (banded) exps[j] = e;
    mass += e;
    if (b < first_band) bucket_mass[static_cast<int>(b)] += e;
  }
  auto exact_mass = [&] {
    double sum = 0.;
    for (int64_t i = 0; i < V; ++i) sum += exps[i];  // 0 for skipped vectors: no change
    return sum;
  };
  const double slack = banded ? mass * (2.0 * static_cast<double>(V) + 16.0) * 0x1p-53 : 0.;
  double target_lo = top_p_target(p, mass - slack), target_hi = top_p_target(p, mass + slack);
  if (target_lo > target_hi) std::swap(target_lo, target_hi);
  int filled = first_band;
  for (;;) {  // at most twice: with the target's bounds, then with the target itself
    const bool exact = target_lo == target_hi;
    double above = 0.;
    int bucket = 0;
    bool open = false;
    for (; bucket < kBuckets; ++bucket) {
      if (bucket == filled) {  // the other buckets
        fill_buckets(x, exps.data(), V, row_max, filled, kBuckets, bucket_mass.data());
        filled = kBuckets;
      }
      const double next = above + bucket_mass[bucket];
      if (next >= target_lo) {
        open = next < target_hi;
        break;
      }
      above = next;
    }
    if (!open && bucket == kBuckets) {
      if (exact) return {target_lo, std::numeric_limits<float>::quiet_NaN()};
      open = true;  // the window search needs the target itself
    }
    if (!open) {
      // The bucket's tokens: b = d * kBucketsPerUnit in [bucket, bucket + 1).
      window.clear();
      int64_t i = 0;
      for (; i + Vec::size() <= V; i += Vec::size()) {
        const Vec b = (vm - Vec::loadu(x + i)) * vscale;
        for (int in = lanes_in_buckets(b, bucket, bucket + 1); in; in &= in - 1) {
          window.push_back(x[i + __builtin_ctz(in)]);
        }
      }
      for (; i < V; ++i) {
        const float b = (row_max - x[i]) * kBucketsPerUnit;
        if (b >= bucket && b < bucket + 1) window.push_back(x[i]);
      }
      std::sort(window.begin(), window.end(), std::greater<float>());
      for (float v : window) {
        above += std::exp(v - row_max);
        if (above >= target_hi) return {target_hi, v};
        if (above >= target_lo) {
          open = true;
          break;
        }
      }
      // The bucket's own sum reached target: rounding of the last addition.
      if (!open) return {target_lo, window.back()};
    }
    // Open: again with the target itself, which decides every comparison.
    target_lo = target_hi = top_p_target(p, exact_mass());
  }
}

// Sets row[j] to -inf where !(row[j] >= threshold) (NaN included).
template <typename scalar_t>
void mask_below(scalar_t* row, int64_t V, float threshold) {
  int64_t j = 0;
  if constexpr (std::is_same_v<scalar_t, float>) {
    const Vec vt(threshold), neg_inf(kNegInf);
    for (; j + Vec::size() <= V; j += Vec::size()) {
      const Vec v = Vec::loadu(row + j);
      Vec::blendv(neg_inf, v, v >= vt).store(row + j);  // false for NaN
    }
  }
  for (; j < V; ++j) {
    if (!(static_cast<float>(row[j]) >= threshold)) row[j] = kNegInf;
  }
}

// The work buffers of a thread's rows (x: the row as float32), kept from call to call: no
// allocation once the thread has seen a row as long.
struct RowBuffers {
  std::vector<float> x, candidates, scratch, window, largest, exps;
  std::vector<double> masses;
};

// Not inlined: the compiler would otherwise specialize the functions given these buffers for the
// thread-local object, and look its address up again at each use, in their loops too.
__attribute__((noinline)) RowBuffers& thread_buffers() {
  thread_local RowBuffers buffers;
  return buffers;
}

template <typename scalar_t>
void top_k_top_p_kernel(at::Tensor& logits, const IndexView& slots, const int32_t* top_k_p,
                        const float* top_p_p, int64_t num_slots) {
  const int64_t T = logits.size(0), V = logits.size(1), row_stride = logits.stride(0);
  scalar_t* base = logits.data_ptr<scalar_t>();

  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
    float* x = thread_row_buffer(V);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = slot_of(slots, t, num_slots);
      if (r < 0) continue;
      const int64_t k = top_k_p[r];
      const float p = top_p_p[r];
      if (!top_k_on(k, V) && !top_p_on(p)) continue;
      scalar_t* row = base + t * row_stride;
      const float row_max = load_row(row, V, x);
      if (row_max == kNegInf) continue;
      mask_below(row, V, top_k_top_p_threshold(x, V, row_max, k, p));
    }
  });
}

}  // namespace

float* thread_row_buffer(int64_t V) {
  std::vector<float>& x = thread_buffers().x;
  if (static_cast<int64_t>(x.size()) < V) x.resize(V);
  return x.data();
}

float top_k_top_p_threshold(const float* x, int64_t V, float row_max, int64_t k, float p) {
  const bool k_on = top_k_on(k, V), p_on = top_p_on(p);
  if ((!k_on && !p_on) || row_max == kNegInf) return kNegInf;
  RowBuffers& b = thread_buffers();
  float threshold = k_on ? kth_largest(x, V, k, b.candidates, b.scratch, b.largest) : kNegInf;
  if (p_on && row_max == kInf) {
    threshold = kInf;  // all the mass lies on the +inf logits
  } else if (p_on) {
    TopPBoundary top_p{0., std::numeric_limits<float>::quiet_NaN()};
    if (k_on) {
      // The kept tokens are candidates, in index order, when there are any: the same sum.
      const bool listed = !b.candidates.empty();
      const double kept_mass = mass_at_least(listed ? b.candidates.data() : x,
                                             listed ? static_cast<int64_t>(b.candidates.size()) : V,
                                             threshold, row_max, nullptr);
      top_p.target = top_p_target(p, kept_mass);
      if (!b.largest.empty()) {
        top_p.boundary = top_p_threshold_sorted(b.largest, threshold, row_max, top_p.target);
      }
    } else {
      top_p = top_p_alone_boundary(x, V, row_max, p, b.masses, b.exps, b.window);
    }
    const float boundary = top_p.boundary == top_p.boundary
                               ? top_p.boundary
                               : top_p_threshold(x, V, threshold, row_max, top_p.target, b.window);
    threshold = std::max(threshold, boundary);
  }
  return threshold;
}

void top_k_top_p(at::Tensor logits, const at::Tensor& idx_mapping, const at::Tensor& top_k,
                 const at::Tensor& top_p) {
  const IndexView slots(idx_mapping);
  const at::Tensor k = top_k.contiguous(), p = top_p.contiguous();
  TSO_DISPATCH_LOGITS(logits.scalar_type(), "top_k_top_p", [&] {
    top_k_top_p_kernel<scalar_t>(logits, slots, k.data_ptr<int32_t>(), p.data_ptr<float>(),
                                 k.size(0));
  });
}

}  // namespace tso
