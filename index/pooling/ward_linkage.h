// Ward agglomerative clustering on a precomputed distance matrix, and the flat "maxclust" cut,
// reproducing SciPy's `linkage(y, method="ward")` (nearest-neighbour chain, Lance–Williams update)
// followed by `fcluster(Z, t, criterion="maxclust")`, tie-breaking included.
#ifndef TESSERA_INDEX_POOLING_WARD_LINKAGE_H_
#define TESSERA_INDEX_POOLING_WARD_LINKAGE_H_

#include <cstdint>
#include <vector>

namespace tessera::internal {

// One agglomeration step: the clusters containing observations `a` and `b` merged at `height`.
struct WardMerge {
  int32_t a = 0;
  int32_t b = 0;
  double height = 0.0;
};

// Runs Ward linkage over n observations. `distances` is the full symmetric n × n matrix,
// row-major; its diagonal is ignored and its contents are consumed (used as the working matrix).
// Returns the n − 1 merges in SciPy's order: sorted by height with a stable sort of the
// nearest-neighbour-chain order. Deterministic. Where Ward's update would take the square root of
// a negative number (possible for non-Euclidean inputs, where SciPy yields NaN) it yields 0.
// O(n²) time and no memory beyond the matrix.
std::vector<WardMerge> WardLinkage(std::vector<double>& distances, int32_t n);

// SciPy's fcluster(..., criterion="maxclust") on the merges above: the smallest cut height (found
// by SciPy's own binary search) that leaves at most `max_clusters` clusters; ties in height can
// leave fewer. Returns a label per observation, numbered 0, 1, ... in order of first appearance.
std::vector<int32_t> CutAtMaxClusters(const std::vector<WardMerge>& merges, int32_t n,
                                      int32_t max_clusters);

// The partition left by the first `applied` merges (0 ≤ applied ≤ n − 1): exactly n − applied
// clusters, nested in the cuts with more merges. Labels as CutAtMaxClusters.
std::vector<int32_t> CutAfterMerges(const std::vector<WardMerge>& merges, int32_t n,
                                    int32_t applied);

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_POOLING_WARD_LINKAGE_H_
