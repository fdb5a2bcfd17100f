// The k best (value, index) pairs of a row, found in one pass over it, for the CPU kernels.
#pragma once

#include <cstdint>
#include <vector>

#include "vec.h"

namespace tso {

// (value, index) ordering: larger value first, lower index among ties.
inline bool ranks_before(float a, int64_t ia, float b, int64_t ib) {
  return a > b || (a == b && ia < ib);
}

// The k best (value, index) pairs of a row so far, larger first (ranks_before), and their count;
// vals[k - 1] is then the k-th largest value, ties counted. Tokens are offered in index order, so
// one equal to the last entry never ranks before it: only lanes above it need offering.
struct TopK {
  std::vector<float> vals;
  std::vector<int64_t> ids;
  int64_t held = 0;

  explicit TopK(int64_t k) : vals(k), ids(k) {}
  int64_t k() const { return static_cast<int64_t>(vals.size()); }
  // Lanes of v (tokens j0 ..) that may enter: all while the list fills, then those above its last.
  int candidates(const Vec& v) const {
    if (k() == 0) return 0;
    return held < k() ? (1 << Vec::size()) - 1 : lanes_above(v, vals[k() - 1]);
  }
  void offer(float x, int64_t j) {
    const int64_t k = this->k();
    if (held == k && !ranks_before(x, j, vals[k - 1], ids[k - 1])) return;
    int64_t i = held < k ? held++ : k - 1;
    for (; i > 0 && ranks_before(x, j, vals[i - 1], ids[i - 1]); --i) {
      vals[i] = vals[i - 1];
      ids[i] = ids[i - 1];
    }
    vals[i] = x;
    ids[i] = j;
  }
};

}  // namespace tso
