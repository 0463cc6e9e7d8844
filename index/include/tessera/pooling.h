// Document compression at ingest: hierarchical token pooling (Ward clustering of a document's
// token vectors, each cluster replaced by its mean) and spatial pooling of image patch grids.
// All functions are pure, deterministic (same input → same output, bit for bit) and thread-safe.
#ifndef TESSERA_POOLING_H_
#define TESSERA_POOLING_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/matrix.h"

namespace tessera {

// The largest document hierarchical pooling accepts: clustering holds an n × n matrix of doubles
// (128 MiB at this size).
inline constexpr int64_t kMaxHierarchicalPoolingTokens = 4096;

// Pooled vectors and, for each of them, the input tokens it covers.
struct PooledMatrix {
  int64_t dim = 0;
  // num_vectors() × dim, row-major.
  std::vector<float> vectors;
  // One entry per input token: the pooled vector that covers it, or -1 when it was dropped. When
  // several vectors cover a token (overlapping row windows), the first one.
  std::vector<int32_t> labels;
  // Vector v covers input tokens members[member_offsets[v] .. member_offsets[v + 1]), ascending.
  std::vector<int32_t> member_offsets;
  std::vector<int32_t> members;

  int64_t num_vectors() const { return dim == 0 ? 0 : static_cast<int64_t>(vectors.size()) / dim; }
};

enum class PoolingMethod {
  // Ward linkage on the cosine distances 1 − ⟨a, b⟩/(‖a‖‖b‖) between token vectors (1 − ⟨a, b⟩ for
  // unit vectors): what SciPy's linkage(pdist(E, "cosine"), method="ward") computes.
  kWard,
  // The upstream ColBERT/PyLate recipe, reproduced exactly: SciPy's
  // linkage(1 − E·Eᵀ, method="ward", metric="euclidean"), which treats the rows of the n × n
  // matrix 1 − E·Eᵀ as n feature vectors of dimension n (O(n³) work).
  kReference,
};

struct TokenPoolingOptions {
  // ≥ 1. The unprotected tokens are cut into at most max(floor(n / pool_factor), 1) clusters (the
  // "maxclust" criterion: exact ties in merge height can leave fewer). 1 keeps every token.
  int pool_factor = 2;
  PoolingMethod method = PoolingMethod::kWard;
  // ≥ 0. The first `protected_tokens` tokens (e.g. [CLS] or a [D] marker) are kept as they are.
  int protected_tokens = 0;
  // L2-normalise each cluster mean (the server never does so unless asked).
  bool renormalize = false;
  // ≥ 0. A floor under the cluster count for short documents, which have little redundancy to
  // pool away: when min(n, min_vectors) exceeds floor(n / pool_factor), the same Ward tree is cut
  // at exactly min(n, min_vectors) clusters, so a document of at most min_vectors (unprotected)
  // tokens keeps every token. 0 = no floor (the published recipe).
  int min_vectors = 0;
  // ≥ 0, finite. A limit on how far apart pooled tokens may be: Ward merges above this height
  // (SciPy's linkage height, the "distance" criterion of fcluster) are not applied, so a document
  // whose tokens are far apart keeps more than n / pool_factor vectors — the n / p cut of the
  // same tree, refined to fcluster(Z, t, "distance") where that leaves more clusters. Short texts
  // reach such heights within their n / p merges; long, redundant ones mostly do not. 0 = no
  // limit (the published recipe). Collections and tessera-pool default to
  // DefaultMaxMergeHeight(method).
  double max_merge_height = 0.0;
};

// The merge-height limit for kWard when none is given, chosen on the evaluation sets
// (docs/results.md, "Quality on real data"): on short texts (scifact titles + first sentences, ~53
// tokens) it keeps 32 vectors a document instead of 26 and more than the full nDCG@10, and on
// abstracts (~190–240 tokens) 0.3–3% more vectors than n / 2.
inline constexpr double kAdaptiveMergeHeight = 0.3;

// The limit a collection (and tessera-pool) pools with when none is given: kAdaptiveMergeHeight
// for kWard; none for kReference, the published recipe reproduced as it is (its heights, on rows
// of 1 − E·Eᵀ, are on another scale).
inline double DefaultMaxMergeHeight(PoolingMethod method) {
  return method == PoolingMethod::kWard ? kAdaptiveMergeHeight : 0.0;
}

// Pools one document. tokens: n × dim fp32, row-major, finite values.
// Output order: the protected tokens first, then one vector per cluster in order of each cluster's
// first token. labels has n entries.
// Returns INVALID_ARGUMENT when n = 0, dim = 0, a value is not finite, pool_factor < 1,
// min_vectors < 0, max_merge_height < 0 or not finite, protected_tokens < 0, or n exceeds
// kMaxHierarchicalPoolingTokens.
absl::StatusOr<PooledMatrix> PoolTokens(FloatMatrixView tokens, const TokenPoolingOptions& options);

// A page image's patch grid inside a document's token sequence: `prefix_tokens` special/prompt
// tokens, then rows × cols patch tokens in row-major order, then `suffix_tokens` more.
struct PatchGridLayout {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t prefix_tokens = 0;
  int64_t suffix_tokens = 0;

  int64_t num_tokens() const { return prefix_tokens + rows * cols + suffix_tokens; }
};

enum class SpatialMode {
  kRows,        // one mean vector per grid row
  kColumns,     // one mean vector per grid column
  kTiles,       // tiles of tile_rows × tile_cols patches (edge tiles may be smaller)
  kRowWindows,  // windows of window_rows consecutive rows every window_stride rows
  kGlobal,      // one mean vector of the whole grid
};

struct SpatialPoolingOptions {
  SpatialMode mode = SpatialMode::kRows;
  int tile_rows = 2;  // kTiles, ≥ 1
  int tile_cols = 2;  // kTiles, ≥ 1
  // kRowWindows: ≥ 1 each. Windows start at 0, s, 2s, ... while they fit in the grid, plus a last
  // window ending at the final row when the stride does not land there, so every row is covered.
  int window_rows = 2;
  int window_stride = 1;
  // Keep the prefix/suffix tokens as vectors of their own (prefix first, suffix last) instead of
  // dropping them.
  bool keep_special_tokens = false;
  bool renormalize = false;
};

// Spatially pools one document whose tokens follow `layout`. tokens: n × dim fp32.
// Returns INVALID_ARGUMENT when the layout does not describe exactly n tokens, a size or option is
// out of range, or a value is not finite.
absl::StatusOr<PooledMatrix> PoolPatchGrid(FloatMatrixView tokens, const PatchGridLayout& layout,
                                           const SpatialPoolingOptions& options);

// Spatial pooling followed by hierarchical pooling of its output, or either one alone. With both,
// the result's members and labels refer to the original tokens.
struct PoolingSpec {
  std::optional<SpatialPoolingOptions> spatial;  // needs a layout
  std::optional<TokenPoolingOptions> hierarchical;
};

// Returns INVALID_ARGUMENT for spatial pooling without a layout, and the errors of the stages.
absl::StatusOr<PooledMatrix> PoolDocument(FloatMatrixView tokens,
                                          const std::optional<PatchGridLayout>& layout,
                                          const PoolingSpec& spec);

// Parses the names used by configuration and tools: "ward" | "reference".
absl::StatusOr<PoolingMethod> ParsePoolingMethod(const std::string& name);
// Parses "rows" | "cols" | "tile:AxB" | "window:W:S" | "global" into options (other fields kept).
absl::Status ParseSpatialMode(const std::string& spec, SpatialPoolingOptions* options);

}  // namespace tessera

#endif  // TESSERA_POOLING_H_
