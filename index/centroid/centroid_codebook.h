// The trained part of a centroid index: k-means centroids over a shard's rerank vectors and the
// residual codec, which together turn a vector into (centroid id, residual code) and back.
//
// Training is spherical k-means (inner product, centroids L2-normalised after each step, as the
// vectors are), on a sample, with the assignment step run by the MaxSim micro-kernels
// (QuerySimilarity) across a thread pool. Beyond kExactAssignmentCentroids it is two-level: a
// k-means of ~√C coarse cells, then a k-means inside each cell over the sample rows assigned to
// it, with centroids in proportion to the cell's rows — n·(G + C/G) inner products an iteration
// instead of n·C (1,024 instead of 262,144 per row at C = 2^18). The cells are kept as the
// codebook's CentroidGroups, which Encode assigns through and a search probes. Deterministic: the
// same sample and options give the same codebook, bit for bit, whatever the number of threads.
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
  // Groups given by a two-level training: group g holds the centroids [offsets[g], offsets[g+1])
  // and has the mean means[g] (G × dim, L2-normalised); offsets: G + 1 values from 0 to C,
  // non-decreasing (a group may be empty).
  CentroidGroups(const float* centroids, int64_t C, int64_t dim, const float* means,
                 const std::vector<int64_t>& offsets);
  ~CentroidGroups();
  // ids[i] for each of the n rows (n × dim): the best centroid of its probed groups (ties: the
  // lower id). Cheapest per row with a few thousand rows a call (every group then meets many).
  void Assign(const float* rows, int64_t n, uint32_t* ids) const;
  // (*out)[i] for each row i of `rows` (n × dim): (score, centroid id) for every centroid of the
  // `probes` groups whose means score highest against the row (ties: the lower group), unordered.
  // centroid_scores: null, or the rows' scores of every centroid (row i's C values at
  // centroid_scores[i · C], as QuerySimilarity computes them: the same values this would), read
  // instead of scoring the groups' members. The means are scored for all the rows in one pass, and
  // a probed group's members once for all the rows that probe it: a row at a time, each token of
  // a query read every mean and its groups' members itself (matrix–vector products bound by
  // reading them). The scores are those of a row at a time: Compute's sums do not depend on the
  // rows scored with it. Split over `pool` when not null.
  void ScoreNearest(FloatMatrixView rows, int probes, const float* centroid_scores,
                    ThreadPool* pool,
                    std::vector<std::vector<std::pair<float, uint32_t>>>* out) const;
  int64_t MemoryBytes() const;

 private:
  // Lays out the groups: means (num_groups_ × dim) and each centroid's group.
  void Build(const float* centroids, int64_t C, const float* means,
             const std::vector<uint32_t>& group);
  // best[0 .. probes): the groups of the `probes` highest mean_scores (one row's score of each
  // group mean), non-empty ones first (ties: the lower group), best first. heap: scratch.
  void BestGroups(const float* mean_scores, int probes,
                  std::vector<std::pair<float, uint32_t>>* heap, uint32_t* best) const;

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
  int iterations = 8;         // k-means iterations (assignment + update), at each level
  uint64_t seed = 0x43454e54524f4944;
  // Beyond kExactAssignmentCentroids: train in two levels (above). False: one flat k-means whose
  // assignment goes through CentroidGroups of the current centroids, formed anew each iteration
  // (the reference the two-level training is measured against; ~C/(2√C) times its cost).
  bool two_level = true;
};

// The fewest centroids DefaultNumCentroids asks for, and so the fewest rerank vectors a shard's
// training may start from (ValidateSchema): a training of fewer vectors than centroids cannot
// fill its codebook (k-means keeps min(centroids, sample rows), each vector its own centroid).
inline constexpr int64_t kMinCentroids = 256;
// The most: 2^18 centroids (128 MiB of fp32 centroids at dim 128, as much again as the groups'
// lanes) serve 64M vectors (1M documents of 64 pooled vectors) at lists of ~244; a larger
// codebook would need a training sample of more than kTrainingSampleBytes for 8 rows a centroid.
inline constexpr int64_t kMaxCentroids = int64_t{1} << 18;
// Vectors per centroid under the list-length rule: lists of 128 to 256 vectors on average.
inline constexpr int64_t kMinAverageListLength = 128;

// How a shard sizes its codebook (DefaultNumCentroids) and a search its probes (DefaultNprobe).
enum class CentroidSizing {
  // The default: SquareRootNumCentroids, nprobe growing with √C (DefaultNprobe); a token scans a
  // share of the shard that shrinks as vectors^-1/4, so its codes grow as vectors^0.75.
  kSquareRoot,
  // A fixed average list length, as the codebook grows with the vectors (ListLengthNumCentroids),
  // nprobe capped at 32: a token scans ~4,000–8,000 codes whatever the shard's size (up to
  // kMaxCentroids · 256 vectors). Not the default: on the synthetic 100k-document shard (6.4M
  // vectors, 32,768 centroids) recall@10 against exhaustive fell to 0.758 at nprobe 32 and 0.959
  // at 48, against 0.971 for the √ rule (16,384 centroids, nprobe 32); the probes it needs for
  // recall ≥ 0.95 grow with the shard on that corpus, which its lists' length does not make up.
  // On real token embeddings (the resampled corpus) it did no better: at 1M documents (2^18
  // centroids) recall@10 0.826 at nprobe 32 and 0.916 at 64 against the √ rule's 0.992 at 40.
  // With the means scored once a query its stage 1 at 64 probes is ~8.6–9.0 ms against the √
  // rule's ~7.4 at 40, and probing 2–4× the groups finds no more (recall is bound by the probed
  // lists, not by the groups: docs/notes/2026-12-06-codebook-rules.md).
  kListLength,
};

// The codebook size a shard of `vectors` rerank vectors trains: SquareRootNumCentroids (the
// default), or ListLengthNumCentroids under SetCentroidSizingForTesting(kListLength). A shard
// retrains when this grows past what its last training asked for (Shard::OutgrewTraining): at
// every 4× growth of its vectors under the √ rule, every 2× under the list-length rule.
int64_t DefaultNumCentroids(int64_t vectors);

// 2^⌊log2(vectors / list_length)⌋ clamped to [min_centroids, max_centroids]: an average list of
// list_length to 2·list_length vectors. 4,096 centroids at 640k vectors (10k documents of 64
// pooled vectors), 8,192 at 1.28M, 32,768 at 6.4M (100k documents), 2^18 at 64M (1M).
int64_t ListLengthNumCentroids(int64_t vectors, int64_t list_length = kMinAverageListLength,
                               int64_t min_centroids = kMinCentroids,
                               int64_t max_centroids = kMaxCentroids);

// PLAID's rule of thumb (factor 16, also WARP's: 2^⌊log2(16 · √embeddings)⌋) scaled by
// `factor`, clamped to [min_centroids, max_centroids]. The previous default, factor 8 up to
// 65,536: 16,384 centroids at 6.4M vectors, 32,768 at 64M (lists of ~2,000).
int64_t SquareRootNumCentroids(int64_t vectors, double factor = 8.0,
                               int64_t min_centroids = kMinCentroids,
                               int64_t max_centroids = 65536);

// Selects the rule DefaultNumCentroids and DefaultNprobe follow, process-wide (benchmarks compare
// the two in one binary). Not for use while shards train or search.
void SetCentroidSizingForTesting(CentroidSizing sizing);
CentroidSizing GetCentroidSizing();

// The rows a training of `num_centroids` centroids samples from a shard of `vectors` vectors of
// `dim` values: 32 per centroid (k-means quality flattens beyond ~30), fewer where that passes
// kTrainingSampleBytes of fp32 rows but at least 8 per centroid; at most `vectors`. 1M rows at
// 32,768 centroids, 2M (1 GiB) at 2^18, dim 128.
inline constexpr int64_t kTrainingSampleBytes = int64_t{1} << 30;
int64_t TrainingSampleVectors(int64_t num_centroids, int64_t vectors, int64_t dim);

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
  // Per row of `rows`: (score, centroid id) for the centroids of the `probes` groups nearest it
  // (CentroidGroups::ScoreNearest, which reads the members' scores from centroid_scores, the
  // rows' scores of every centroid, when not null). Precondition: has_groups().
  void ScoreNearCentroids(FloatMatrixView rows, int probes, const float* centroid_scores,
                          ThreadPool* pool,
                          std::vector<std::vector<std::pair<float, uint32_t>>>* out) const;

  // Resident bytes (centroids, codec tables, the groups).
  int64_t MemoryBytes() const;
  // The groups' count when the training stored them (a two-level training), else 0: the groups
  // of a codebook beyond kExactAssignmentCentroids are then formed at load by a k-means over its
  // centroids (format version 1).
  int64_t stored_groups() const {
    return group_offsets_.empty() ? 0 : static_cast<int64_t>(group_offsets_.size()) - 1;
  }

  static constexpr int64_t kExactAssignmentCentroids = 1024;

 private:
  // group_means (G × dim) and group_offsets (G + 1): the stored groups, or both empty.
  CentroidCodebook(int64_t dim, std::vector<float> centroids, ResidualCodec codec,
                   std::vector<float> group_means = {}, std::vector<int64_t> group_offsets = {});
  void BuildGroups();

  const int64_t dim_;
  const int64_t num_centroids_;
  const std::vector<float> centroids_;
  const ResidualCodec codec_;
  const std::vector<float> group_means_;
  const std::vector<int64_t> group_offsets_;
  // Beyond kExactAssignmentCentroids: the groups Encode assigns through.
  std::unique_ptr<const CentroidGroups> groups_;
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_CENTROID_CENTROID_CODEBOOK_H_
