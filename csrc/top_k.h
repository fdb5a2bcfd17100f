// The k best (value, index) pairs of a row, found in one pass over it, for the CPU kernels.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "vec.h"

namespace tso {

// A lower bound of a row's k-th largest value (ties counted), given the maxima of n disjoint groups
// of its tokens: the k-th largest of them (k tokens hold a value at least it), -inf when n < k.
// Reorders `maxima`.
inline float kth_group_max(float* maxima, int64_t n, int64_t k) {
  if (k <= 0 || n < k) return kNegInf;
  std::nth_element(maxima, maxima + (k - 1), maxima + n, std::greater<float>());
  return maxima[k - 1];
}

// (value, index) ordering: larger value first, lower index among ties.
inline bool ranks_before(float a, int64_t ia, float b, int64_t ib) {
  return a > b || (a == b && ia < ib);
}

// The k best (value, index) pairs of a row, larger first (ranks_before), once `finish` has run;
// vals[k - 1] is then the k-th largest value, ties counted. Offers that may enter the list wait in
// `pending_`, merged into it a batch at a time (a sort of the batch and a merge, where inserting
// each one would shift half the list), except into a full list of at most kInsertMaxK entries,
// where each is inserted at once (a shift of a few entries, and the list's last entry, which
// decides what is offered, stays current). Tokens are offered in index order, so one equal to the
// last entry never ranks before it: only lanes above it need offering.
struct TopK {
  static constexpr int64_t kInsertMaxK = 64;
  std::vector<float> vals;
  std::vector<int64_t> ids;
  int64_t held = 0;  // entries of vals / ids in use (all k once k tokens were offered)

  explicit TopK(int64_t k) : vals(k), ids(k), batch_(std::max<int64_t>(8, k / 4)) {
    pending_.reserve(k);
  }
  int64_t k() const { return static_cast<int64_t>(vals.size()); }
  // Lanes of v (tokens j0 ..) that may enter: all while the list fills, then those above its last.
  int candidates(const Vec& v) const {
    if (k() == 0) return 0;
    return held < k() ? (1 << Vec::size()) - 1 : lanes_above(v, vals[k() - 1]);
  }
  // The same for a row whose k-th largest value is at least `floor`: while the list fills, the
  // lanes at least it (the list then holds only such values, so its last entry is at least it).
  int candidates(const Vec& v, float floor) const {
    if (k() == 0) return 0;
    return held < k() ? lanes_above<true>(v, floor) : lanes_above(v, vals[k() - 1]);
  }
  void offer(float x, int64_t j) {
    const int64_t k = this->k();
    if (k == 0 || (held == k && !ranks_before(x, j, vals[k - 1], ids[k - 1]))) return;
    if (held == k && k <= kInsertMaxK) {  // a short full list: insert, from its end
      int64_t i = k - 1;
      for (; i > 0 && ranks_before(x, j, vals[i - 1], ids[i - 1]); --i) {
        vals[i] = vals[i - 1];
        ids[i] = ids[i - 1];
      }
      vals[i] = x;
      ids[i] = j;
      return;
    }
    pending_.emplace_back(x, j);
    if (static_cast<int64_t>(pending_.size()) == (held < k ? k : batch_)) merge();
  }
  // Merges what is pending: call before reading vals, ids and held.
  void finish() {
    if (!pending_.empty()) merge();
  }

 private:
  // Offers merged at once once the list is full: small enough that the list's last entry, which
  // decides what is offered, stays close to the current k-th value.
  int64_t batch_;
  std::vector<std::pair<float, int64_t>> pending_, merged_;

  void merge() {
    auto before = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
      return ranks_before(a.first, a.second, b.first, b.second);
    };
    std::sort(pending_.begin(), pending_.end(), before);
    merged_.clear();
    const int64_t k = this->k();
    int64_t a = 0;
    size_t b = 0;
    while (static_cast<int64_t>(merged_.size()) < k && (a < held || b < pending_.size())) {
      if (b == pending_.size() ||
          (a < held && ranks_before(vals[a], ids[a], pending_[b].first, pending_[b].second))) {
        merged_.emplace_back(vals[a], ids[a]);
        ++a;
      } else {
        merged_.push_back(pending_[b++]);
      }
    }
    held = static_cast<int64_t>(merged_.size());
    for (int64_t i = 0; i < held; ++i) {
      vals[i] = merged_[i].first;
      ids[i] = merged_[i].second;
    }
    pending_.clear();
  }
};

}  // namespace tso
