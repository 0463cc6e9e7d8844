// The nearest-neighbour chain keeps the exact operation order of SciPy's `_hierarchy.nn_chain` and
// `_hierarchy_distance_update._ward`, so that identical input distances give identical heights bit
// for bit (this file is compiled with -ffp-contract=off for that reason). It runs on a full square
// matrix instead of a condensed one, with dropped clusters held at +inf, so that the row scans are
// branch-free and vectorise.
#include "index/pooling/ward_linkage.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "index/common/cpu_features.h"

namespace tessera::internal {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The minimum of row[i] over live clusters (size[i] > 0); dropped clusters' entries are stale.
__attribute__((target("avx2"))) double LiveRowMinAvx2(const double* row, const double* size,
                                                      int32_t n) {
  const __m256d inf = _mm256_set1_pd(kInf), zero = _mm256_setzero_pd();
  __m256d best = inf;
  int32_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d live = _mm256_cmp_pd(_mm256_loadu_pd(size + i), zero, _CMP_GT_OQ);
    best = _mm256_min_pd(best, _mm256_blendv_pd(inf, _mm256_loadu_pd(row + i), live));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, best);
  double result = std::min(std::min(lanes[0], lanes[1]), std::min(lanes[2], lanes[3]));
  for (; i < n; ++i) {
    if (size[i] > 0.0) result = std::min(result, row[i]);
  }
  return result;
}

double LiveRowMinPortable(const double* row, const double* size, int32_t n) {
  double result = kInf;
  for (int32_t i = 0; i < n; ++i) {
    if (size[i] > 0.0 && row[i] < result) result = row[i];
  }
  return result;
}

double LiveRowMin(const double* row, const double* size, int32_t n) {
  return Cpu().avx2 ? LiveRowMinAvx2(row, size, n) : LiveRowMinPortable(row, size, n);
}

// Row y of the merged cluster: SciPy's `_ward(d_xi, d_yi, d_xy, size_x, size_y, size_i)` for every
// live cluster i, in SciPy's association order (vector division and square root are correctly
// rounded, so every instruction set gives SciPy's bits); entries of dropped clusters (size 0)
// become +inf. Compiled once per instruction set and chosen at run time (not with target_clones:
// its ifunc resolvers run before sanitizer runtimes start).
#define TESSERA_WARD_UPDATE_ROW_BODY                                      \
  _Pragma("omp simd") for (int32_t i = 0; i < n; ++i) {                   \
    const double size_i = size[i];                                        \
    const double t = 1.0 / (size_x + size_y + size_i);                    \
    const double radicand = (size_i + size_x) * t * row_x[i] * row_x[i] + \
                            (size_i + size_y) * t * row_y[i] * row_y[i] - \
                            size_i * t * d_xy * d_xy;                     \
    const double updated = radicand > 0.0 ? std::sqrt(radicand) : 0.0;    \
    row_y[i] = size_i == 0.0 ? kInf : updated;                            \
  }

__attribute__((target("avx512f"))) void WardUpdateRowAvx512(const double* row_x, double* row_y,
                                                            const double* size, int32_t n,
                                                            double d_xy, double size_x,
                                                            double size_y) {
  TESSERA_WARD_UPDATE_ROW_BODY
}

__attribute__((target("avx2"))) void WardUpdateRowAvx2(const double* row_x, double* row_y,
                                                       const double* size, int32_t n, double d_xy,
                                                       double size_x, double size_y) {
  TESSERA_WARD_UPDATE_ROW_BODY
}

void WardUpdateRowPortable(const double* row_x, double* row_y, const double* size, int32_t n,
                           double d_xy, double size_x, double size_y) {
  TESSERA_WARD_UPDATE_ROW_BODY
}

#undef TESSERA_WARD_UPDATE_ROW_BODY

void WardUpdateRow(const double* row_x, double* row_y, const double* size, int32_t n, double d_xy,
                   double size_x, double size_y) {
  const CpuFeatures& cpu = Cpu();
  if (cpu.avx512f) return WardUpdateRowAvx512(row_x, row_y, size, n, d_xy, size_x, size_y);
  if (cpu.avx2) return WardUpdateRowAvx2(row_x, row_y, size, n, d_xy, size_x, size_y);
  WardUpdateRowPortable(row_x, row_y, size, n, d_xy, size_x, size_y);
}

}  // namespace

std::vector<WardMerge> WardLinkage(std::vector<double>& distances, int32_t n) {
  std::vector<WardMerge> merges;
  if (n < 2) return merges;
  merges.reserve(n - 1);
  double* d = distances.data();
  auto at = [d, n](int32_t i, int32_t j) -> double& { return d[static_cast<int64_t>(i) * n + j]; };
  for (int32_t i = 0; i < n; ++i) at(i, i) = kInf;

  // Cluster sizes as doubles (exact below 2^53) so the update vectorises; 0 marks a dropped slot,
  // whose row and column are stale and never read again.
  std::vector<double> size(n, 1.0);
  std::vector<int32_t> live(n);
  std::iota(live.begin(), live.end(), 0);
  std::vector<int32_t> chain;
  chain.reserve(n);
  for (int32_t k = 0; k < n - 1; ++k) {
    // SciPy restarts an empty chain at the lowest-numbered live cluster.
    if (chain.empty()) chain.push_back(live.front());
    int32_t x = 0, y = 0;
    double current_min = kInf;
    while (true) {
      x = chain.back();
      const double* row = &at(x, 0);
      // SciPy keeps the previous chain element on ties (it replaces only on a strictly smaller
      // distance), which is what guarantees the chain terminates; otherwise the lowest index wins.
      const double row_min = LiveRowMin(row, size.data(), n);
      if (chain.size() > 1 && row[chain[chain.size() - 2]] <= row_min) {
        y = chain[chain.size() - 2];
        current_min = row[y];
        break;
      }
      current_min = row_min;
      y = *std::find_if(live.begin(), live.end(),
                        [row, row_min](int32_t i) { return row[i] == row_min; });
      chain.push_back(y);
    }
    chain.resize(chain.size() - 2);
    if (x > y) std::swap(x, y);
    const double size_x = size[x], size_y = size[y];
    merges.push_back(WardMerge{x, y, current_min});
    size[x] = 0.0;
    size[y] = size_x + size_y;
    live.erase(std::find(live.begin(), live.end(), x));
    // Cluster y becomes the merged cluster: its row is recomputed, and mirrored into the column
    // entries that live clusters will read.
    WardUpdateRow(&at(x, 0), &at(y, 0), size.data(), n, current_min, size_x, size_y);
    at(y, y) = kInf;
    for (int32_t i : live) at(i, y) = at(y, i);
  }
  std::stable_sort(merges.begin(), merges.end(),
                   [](const WardMerge& l, const WardMerge& r) { return l.height < r.height; });
  return merges;
}

namespace {

int32_t Find(std::vector<int32_t>& parent, int32_t i) {
  while (parent[i] != i) {
    parent[i] = parent[parent[i]];
    i = parent[i];
  }
  return i;
}

}  // namespace

std::vector<int32_t> CutAtMaxClusters(const std::vector<WardMerge>& merges, int32_t n,
                                      int32_t max_clusters) {
  // With merges sorted by height, every subtree of a merge at height h has heights ≤ h, so the
  // merges at or below a threshold form a prefix and leave n − (prefix length) clusters.
  auto merged_at_or_below = [&merges](double threshold) {
    return static_cast<int32_t>(
        std::upper_bound(merges.begin(), merges.end(), threshold,
                         [](double t, const WardMerge& m) { return t < m.height; }) -
        merges.begin());
  };
  int32_t applied = 0;
  if (n == 2) {
    applied = max_clusters < 2 ? 1 : 0;  // SciPy reads past its array here; pick the sane answer
  } else if (n > 2) {
    // SciPy's cluster_maxclust_monocrit: binary search over merge indices (index 0 is never
    // tried as a threshold), then cut at the upper bound.
    int32_t lower = 0, upper = n - 1;
    while (upper - lower > 1) {
      const int32_t mid = (lower + upper) >> 1;
      if (n - merged_at_or_below(merges[mid].height) > max_clusters) {
        lower = mid;
      } else {
        upper = mid;
      }
    }
    applied = upper <= n - 2 ? merged_at_or_below(merges[upper].height) : n - 1;
  }
  return CutAfterMerges(merges, n, applied);
}

std::vector<int32_t> CutAfterMerges(const std::vector<WardMerge>& merges, int32_t n,
                                    int32_t applied) {
  std::vector<int32_t> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  for (int32_t m = 0; m < applied; ++m) {
    const int32_t a = Find(parent, merges[m].a), b = Find(parent, merges[m].b);
    if (a != b) parent[std::max(a, b)] = std::min(a, b);
  }
  std::vector<int32_t> label_of_root(n, -1), labels(n);
  int32_t next = 0;
  for (int32_t i = 0; i < n; ++i) {
    int32_t& label = label_of_root[Find(parent, i)];
    if (label < 0) label = next++;
    labels[i] = label;
  }
  return labels;
}

}  // namespace tessera::internal
