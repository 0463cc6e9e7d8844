// Hierarchical token pooling: distances between a document's tokens, Ward linkage, a maxclust cut
// and cluster means. See tessera/pooling.h for the contract and ward_linkage.h for the clustering.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "index/pooling/distance_kernels.h"
#include "index/pooling/pooling_internal.h"
#include "index/pooling/ward_linkage.h"
#include "tessera/pooling.h"
#include "tessera/status_macros.h"

namespace tessera {
namespace internal {

absl::Status ValidateTokenMatrix(FloatMatrixView tokens) {
  if (tokens.rows <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens: num_tokens ", tokens.rows, ", expected at least 1"));
  }
  if (tokens.cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens: dim ", tokens.cols, ", expected at least 1"));
  }
  if (tokens.data == nullptr) return absl::InvalidArgumentError("tokens: data is null");
  const int64_t count = tokens.rows * tokens.cols;
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(tokens.data[i])) {
      return absl::InvalidArgumentError(absl::StrCat("tokens: value ", tokens.data[i], " at token ",
                                                     i / tokens.cols, ", dimension ",
                                                     i % tokens.cols, " is not finite"));
    }
  }
  return absl::OkStatus();
}

PooledMatrix MeanOfGroups(FloatMatrixView tokens, const std::vector<std::vector<int32_t>>& groups,
                          const std::vector<bool>& renormalize) {
  const int64_t dim = tokens.cols;
  PooledMatrix out;
  out.dim = dim;
  out.vectors.resize(groups.size() * dim);
  out.labels.assign(tokens.rows, -1);
  out.member_offsets.reserve(groups.size() + 1);
  out.member_offsets.push_back(0);
  std::vector<double> sum(dim);
  for (size_t v = 0; v < groups.size(); ++v) {
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int32_t row : groups[v]) {
      const float* token = tokens.data + row * dim;
      for (int64_t k = 0; k < dim; ++k) sum[k] += token[k];
      if (out.labels[row] < 0) out.labels[row] = static_cast<int32_t>(v);
      out.members.push_back(row);
    }
    out.member_offsets.push_back(static_cast<int32_t>(out.members.size()));
    double scale = 1.0 / static_cast<double>(groups[v].size());
    if (v < renormalize.size() && renormalize[v]) {
      double norm_squared = 0.0;
      for (int64_t k = 0; k < dim; ++k) norm_squared += sum[k] * sum[k];
      // A zero mean (tokens that cancel out) stays zero rather than becoming NaN.
      scale = norm_squared > 0.0 ? 1.0 / std::sqrt(norm_squared) : 0.0;
    }
    float* vector = out.vectors.data() + v * dim;
    for (int64_t k = 0; k < dim; ++k) vector[k] = static_cast<float>(sum[k] * scale);
  }
  return out;
}

}  // namespace internal

namespace {

// Per-thread working memory, reused across documents: n × n matrices are large enough that fresh
// allocations would be fresh pages, and faulting them in costs as much as the clustering.
struct Scratch {
  std::vector<double> rows;
  std::vector<double> gram;
  std::vector<double> distances;
  std::vector<double> norms;
};

// Documents up to this many tokens keep their scratch for the next document on the thread.
constexpr int32_t kRetainedScratchTokens = 1536;

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// The Ward input distances for `method` between the n rows of `tokens` (n × dim), as an n × n
// matrix in `scratch.distances`.
void ComputeWardInputDistances(const float* tokens, int32_t n, int64_t dim, PoolingMethod method,
                               Scratch& scratch) {
  const int64_t nn = static_cast<int64_t>(n) * n;
  // Products of fp32 values are exact in double, so the Gram matrix is accurate to double rounding.
  scratch.rows.assign(tokens, tokens + n * dim);
  std::vector<double>& gram = method == PoolingMethod::kWard ? scratch.distances : scratch.gram;
  gram.resize(nn);
  internal::GramMatrix(scratch.rows.data(), n, dim, gram.data());
  if (method == PoolingMethod::kWard) {
    // Cosine distance 1 − ⟨a, b⟩ / (‖a‖‖b‖), as SciPy's pdist(metric="cosine") computes it: equal
    // to 1 − ⟨a, b⟩ for the unit vectors encoders produce, and still meaningful for others. A zero
    // vector is at distance 1 from everything. Clipped at 0, as pdist does, because rounding can
    // push (near-)duplicates below it.
    std::vector<double>& inverse_norms = scratch.norms;
    inverse_norms.resize(n);
    for (int32_t i = 0; i < n; ++i) {
      const double norm_squared = gram[static_cast<int64_t>(i) * n + i];
      inverse_norms[i] = norm_squared > 0.0 ? 1.0 / std::sqrt(norm_squared) : 0.0;
    }
    for (int32_t i = 0; i < n; ++i) {
      double* row = &gram[static_cast<int64_t>(i) * n];
      const double inverse_norm_i = inverse_norms[i];
#pragma omp simd
      for (int32_t j = 0; j < n; ++j) {
        row[j] = std::max(0.0, 1.0 - row[j] * inverse_norm_i * inverse_norms[j]);
      }
    }
    return;
  }
  // Reference recipe: the fp32 matrix F = 1 − E·Eᵀ (each product rounded to fp32 as an fp32 GEMM
  // computes it, up to its summation order), whose rows SciPy then treats as n points in n
  // dimensions. Their Euclidean distances come from F·Fᵀ: ‖f_i − f_j‖² = g_ii + g_jj − 2·g_ij in
  // double, half the work of differencing every pair; the cancellation error (~1e-16 · g_ii) is far
  // below F's own fp32 rounding.
  std::vector<double>& features = gram;
  for (double& value : features) value = static_cast<double>(1.0f - static_cast<float>(value));
  std::vector<double>& distances = scratch.distances;
  distances.resize(nn);
  internal::GramMatrix(features.data(), n, n, distances.data());
  std::vector<double>& norms = scratch.norms;
  norms.resize(n);
  for (int32_t i = 0; i < n; ++i) norms[i] = distances[static_cast<int64_t>(i) * n + i];
  const double max_norm = *std::max_element(norms.begin(), norms.end());
  // Below this distance the Gram-matrix formula is within rounding of 0: check for identical rows.
  const double tie_bound = std::sqrt(2e-12 * max_norm);
  for (int32_t i = 0; i < n; ++i) {
    double* row = &distances[static_cast<int64_t>(i) * n];
    const double norm_i = norms[i];
#pragma omp simd
    for (int32_t j = 0; j < n; ++j) {
      const double squared = norm_i + norms[j] - 2.0 * row[j];
      row[j] = squared > 0.0 ? std::sqrt(squared) : 0.0;
    }
    // Identical rows (duplicate tokens) must tie at exactly 0, as SciPy's differences do.
    const double* f_i = &features[static_cast<int64_t>(i) * n];
    for (int32_t j = 0; j < n; ++j) {
      if (row[j] <= tie_bound && row[j] != 0.0 &&
          std::equal(f_i, f_i + n, &features[static_cast<int64_t>(j) * n])) {
        row[j] = 0.0;
      }
    }
  }
}

}  // namespace

absl::StatusOr<PooledMatrix> PoolTokens(FloatMatrixView tokens,
                                        const TokenPoolingOptions& options) {
  TESSERA_RETURN_IF_ERROR(internal::ValidateTokenMatrix(tokens));
  if (options.pool_factor < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool_factor ", options.pool_factor, ", expected an integer ≥ 1"));
  }
  if (options.min_vectors < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_vectors ", options.min_vectors, ", expected ≥ 0"));
  }
  if (!(options.max_merge_height >= 0.0 && std::isfinite(options.max_merge_height))) {
    return absl::InvalidArgumentError(absl::StrCat("max_merge_height ", options.max_merge_height,
                                                   ", expected a finite value ≥ 0"));
  }
  if (options.protected_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("protected_tokens ", options.protected_tokens, ", expected ≥ 0"));
  }
  if (tokens.rows > kMaxHierarchicalPoolingTokens) {
    return absl::InvalidArgumentError(absl::StrCat("tokens: num_tokens ", tokens.rows,
                                                   " exceeds the hierarchical pooling limit of ",
                                                   kMaxHierarchicalPoolingTokens));
  }
  const int32_t n = static_cast<int32_t>(tokens.rows);
  const int32_t num_protected = std::min(n, options.protected_tokens);
  const int32_t num_pooled = n - num_protected;

  std::vector<std::vector<int32_t>> groups;
  for (int32_t i = 0; i < num_protected; ++i) groups.push_back({i});
  if (num_pooled > 0) {
    const int32_t max_clusters =
        std::max({num_pooled / options.pool_factor, std::min(num_pooled, options.min_vectors), 1});
    std::vector<int32_t> labels(num_pooled, 0);
    if (max_clusters == num_pooled) {
      for (int32_t i = 0; i < num_pooled; ++i) labels[i] = i;
    } else if (num_pooled > 1) {
      const float* rows = tokens.data + static_cast<int64_t>(num_protected) * tokens.cols;
      Scratch& scratch = ThreadScratch();
      ComputeWardInputDistances(rows, num_pooled, tokens.cols, options.method, scratch);
      const std::vector<internal::WardMerge> merges =
          internal::WardLinkage(scratch.distances, num_pooled);
      if (num_pooled > kRetainedScratchTokens) scratch = Scratch();
      // The n / p rule is SciPy's maxclust cut; a floor above it cuts the same tree at exactly
      // max_clusters (maxclust never yields n − 1 clusters, and ties can leave it fewer). A height
      // limit that stops the merges earlier cuts after the last merge at or below it (merges
      // come sorted by height).
      int32_t applied = num_pooled - max_clusters;
      if (options.max_merge_height > 0.0) {
        const auto within = std::upper_bound(
            merges.begin(), merges.begin() + applied, options.max_merge_height,
            [](double height, const internal::WardMerge& merge) { return height < merge.height; });
        applied = static_cast<int32_t>(within - merges.begin());
      }
      labels =
          max_clusters > num_pooled / options.pool_factor || applied < num_pooled - max_clusters
              ? internal::CutAfterMerges(merges, num_pooled, applied)
              : internal::CutAtMaxClusters(merges, num_pooled, max_clusters);
    }
    // Labels are numbered by first appearance, so appending in label order keeps that order.
    const size_t first_cluster = groups.size();
    for (int32_t i = 0; i < num_pooled; ++i) {
      const size_t group = first_cluster + labels[i];
      if (group >= groups.size()) groups.resize(group + 1);
      groups[group].push_back(num_protected + i);
    }
  }
  // Protected tokens are kept as they are; only cluster means are renormalised.
  std::vector<bool> renormalize(groups.size(), options.renormalize);
  std::fill_n(renormalize.begin(), num_protected, false);
  return internal::MeanOfGroups(tokens, groups, renormalize);
}

absl::StatusOr<PoolingMethod> ParsePoolingMethod(const std::string& name) {
  if (name == "ward") return PoolingMethod::kWard;
  if (name == "reference") return PoolingMethod::kReference;
  return absl::InvalidArgumentError(
      absl::StrCat("pooling method '", name, "', expected 'ward' or 'reference'"));
}

}  // namespace tessera
