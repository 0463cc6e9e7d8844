// The trained part of a centroid index: k-means centroids over a shard's rerank vectors and the
// residual codec, which together turn a vector into (centroid id, residual code) and back.
//
// Training is spherical k-means (inner product, centroids L2-normalised after each step, as the
// vectors are), on a sample, with the assignment step run by the MaxSim micro-kernels
// (QuerySimilarity) across a thread pool; beyond kExactAssignmentCentroids the assignment goes
// through CentroidGroups, in training and in Encode alike. Deterministic: the same sample and
// options give the same codebook, bit for bit, whatever the number of threads.
//
// Immutable after Train/Parse: every method is const and may run concurrently.
#ifndef TESSERA_INDEX_CENTROID_CENTROID_CODEBOOK_H_
#define TESSERA_INDEX_CENTROID_CENTROID_CODEBOOK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "index/centroid/residual_codec.h"
#include "tessera/matrix.h"

namespace tessera::internal {

class ThreadPool;
class QuerySimilarity;

// Grouped nearest-centroid search for large codebooks: the centroids are grouped by a small
// spherical k-means over the centroids themselves (about 64 a group); a vector is compared with
// every group mean, then exactly with the centroids of its 8 best groups — G + 8 · 64 inner
// products instead of C (768 instead of 16,384 at C = 16,384). The nearest centroid almost
// always lies in those groups (centroid_index_test measures it); when it does not, the vector
// gets a near one — a slightly larger residual, never a wrong answer. Deterministic; immutable
// after construction.
class CentroidGroups {
 public:
  // centroids: C × dim, row-major (copied). `pool` (may be null) splits the grouping k-means.
  CentroidGroups(const float* centroids, int64_t C, int64_t dim, ThreadPool* pool);
  ~CentroidGroups();
  // ids[i] for each of the n rows (n × dim): the best centroid of its probed groups (ties: the
  // lower id). Cheapest per row with a few thousand rows a call (every group then meets many).
  void Assign(const float* rows, int64_t n, uint32_t* ids) const;
  // Appends to *out (score, centroid id) for every centroid of the `probes` groups whose means
  // score highest against `row` (dim values), unordered.
  void ScoreNearest(const float* row, int probes,
                    std::vector<std::pair<float, uint32_t>>* out) const;
  int64_t MemoryBytes() const;

 private:
  int64_t dim_;
  int64_t num_groups_;
  std::unique_ptr<const QuerySimilarity> means_;  // the L2-normalised group means, as lanes
  std::vector<int64_t> offsets_;         // group g holds members_[offsets_[g] .. offsets_[g + 1])
  std::vector<uint32_t> members_;        // centroid ids, ascending within a group
  std::vector<QuerySimilarity> groups_;  // per group: its members' centroids as lanes
};

struct CentroidTrainingOptions {
  int64_t num_centroids = 0;  // ≥ 1; at most the sample's row count
  int nbits = 2;              // residual bits per dimension: 2 or 4
  int iterations = 8;         // k-means iterations (assignment + update)
  uint64_t seed = 0x43454e54524f4944;
};

// The fewest centroids DefaultNumCentroids asks for, and so the fewest rerank vectors a shard's
// training may start from (ValidateSchema): a training of fewer vectors than centroids cannot
// fill its codebook (k-means keeps min(centroids, sample rows), each vector its own centroid).
inline constexpr int64_t kMinCentroids = 256;

// PLAID's rule of thumb (factor 16) scaled by `factor`: 2^⌊log2(factor · √vectors)⌋, clamped
// to [min_centroids, max_centroids]. The default, half PLAID's count, gives 32,768 centroids at
// 64M vectors (1M documents of 64 pooled vectors: lists of ~2,000), where the query × centroid
// scores and the k-means stay a small part of a search and of a build on two cores.
int64_t DefaultNumCentroids(int64_t vectors, double factor = 8.0,
                            int64_t min_centroids = kMinCentroids, int64_t max_centroids = 65536);

class CentroidCodebook {
 public:
  // sample: n × dim fp32 rows (L2-normalised vectors). INVALID_ARGUMENT for a bad option or an
  // empty sample; num_centroids is reduced to n when the sample is smaller.
  static absl::StatusOr<std::unique_ptr<CentroidCodebook>> Train(
      FloatMatrixView sample, const CentroidTrainingOptions& options, ThreadPool* pool);
  // The bytes Serialize wrote. DATA_LOSS when malformed or when the checksum fails.
  static absl::StatusOr<std::unique_ptr<CentroidCodebook>> Parse(absl::string_view bytes);
  // Checksummed, self-describing bytes (format in centroid_codebook.cc).
  std::string Serialize() const;
  ~CentroidCodebook();

  int64_t dim() const { return dim_; }
  int64_t num_centroids() const { return num_centroids_; }
  const ResidualCodec& codec() const { return codec_; }
  // num_centroids × dim fp32, row-major, each row L2-normalised (or zero).
  const float* centroids() const { return centroids_.data(); }

  // For each row of vectors (n × dim): its nearest centroid by inner product (exact for up to
  // kExactAssignmentCentroids centroids; beyond, through CentroidGroups) into ids[0..n), and its
  // residual code into codes[0 .. n·code_bytes).
  void Encode(FloatMatrixView vectors, uint32_t* ids, uint8_t* codes) const;
  // The decoded vector: centroid + decoded residual (dim values).
  void Decode(uint32_t id, const uint8_t* code, float* out) const;

  // out[c · similarity.stride() + i] = ⟨centroid c, query row i⟩ for every centroid (see
  // QuerySimilarity::Compute). out: num_centroids × stride values.
  void ScoreCentroids(const QuerySimilarity& similarity, float* out) const;
  // Whether ScoreNearCentroids scores a subset (the codebook has groups).
  bool has_groups() const { return groups_ != nullptr; }
  // (score, centroid id) for the centroids of the `probes` groups nearest `row` (dim values):
  // CentroidGroups::ScoreNearest. Precondition: has_groups().
  void ScoreNearCentroids(const float* row, int probes,
                          std::vector<std::pair<float, uint32_t>>* out) const;

  // Resident bytes (centroids, codec tables, the groups).
  int64_t MemoryBytes() const;

  static constexpr int64_t kExactAssignmentCentroids = 1024;

 private:
  CentroidCodebook(int64_t dim, std::vector<float> centroids, ResidualCodec codec);
  void BuildGroups();

  const int64_t dim_;
  const int64_t num_centroids_;
  const std::vector<float> centroids_;
  const ResidualCodec codec_;
  // Beyond kExactAssignmentCentroids: the groups Encode assigns through.
  std::unique_ptr<const CentroidGroups> groups_;
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_CENTROID_CENTROID_CODEBOOK_H_
