// One document's pooling as its collection's schema names it: spatial pooling of its patch grid,
// hierarchical pooling, or the one followed by the other, with members and labels that refer to
// the original tokens either way. See tessera/pooling.h.
#include <algorithm>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tessera/pooling.h"
#include "tessera/status_macros.h"

namespace tessera {

absl::StatusOr<PooledMatrix> PoolDocument(FloatMatrixView tokens,
                                          const std::optional<PatchGridLayout>& layout,
                                          const PoolingSpec& spec) {
  if (spec.spatial.has_value() && !layout.has_value()) {
    return absl::InvalidArgumentError("spatial pooling needs a patch grid layout");
  }
  if (!spec.spatial.has_value()) {
    if (spec.hierarchical.has_value()) return PoolTokens(tokens, *spec.hierarchical);
    TokenPoolingOptions keep_all;
    keep_all.pool_factor = 1;
    return PoolTokens(tokens, keep_all);
  }
  TESSERA_ASSIGN_OR_RETURN(PooledMatrix spatial, PoolPatchGrid(tokens, *layout, *spec.spatial));
  if (!spec.hierarchical.has_value()) return spatial;
  const FloatMatrixView spatial_view{spatial.vectors.data(), spatial.num_vectors(), spatial.dim};
  TESSERA_ASSIGN_OR_RETURN(PooledMatrix pooled, PoolTokens(spatial_view, *spec.hierarchical));
  // Rewrite members and labels in terms of the original tokens.
  PooledMatrix composed;
  composed.dim = pooled.dim;
  composed.vectors = std::move(pooled.vectors);
  composed.member_offsets.push_back(0);
  for (int64_t v = 0; v + 1 < static_cast<int64_t>(pooled.member_offsets.size()); ++v) {
    std::vector<int32_t> tokens_covered;
    for (int32_t m = pooled.member_offsets[v]; m < pooled.member_offsets[v + 1]; ++m) {
      const int32_t s = pooled.members[m];
      tokens_covered.insert(tokens_covered.end(),
                            spatial.members.begin() + spatial.member_offsets[s],
                            spatial.members.begin() + spatial.member_offsets[s + 1]);
    }
    std::sort(tokens_covered.begin(), tokens_covered.end());
    tokens_covered.erase(std::unique(tokens_covered.begin(), tokens_covered.end()),
                         tokens_covered.end());
    composed.members.insert(composed.members.end(), tokens_covered.begin(), tokens_covered.end());
    composed.member_offsets.push_back(static_cast<int32_t>(composed.members.size()));
  }
  composed.labels.resize(spatial.labels.size());
  for (size_t t = 0; t < spatial.labels.size(); ++t) {
    composed.labels[t] = spatial.labels[t] < 0 ? -1 : pooled.labels[spatial.labels[t]];
  }
  return composed;
}

}  // namespace tessera
