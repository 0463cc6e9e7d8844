#include "index/centroid/centroid_codebook.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "index/common/crc32.h"
#include "index/common/thread_pool.h"
#include "index/kernels/query_similarity.h"

namespace tessera::internal {
namespace {

// Serialized layout (little-endian):
//   "TSCB" | u32 format version | i64 dim | i64 num_centroids | num_centroids × dim f32 |
//   ResidualCodec::AppendTo bytes | u32 CRC-32 of everything before it.
constexpr char kMagic[4] = {'T', 'S', 'C', 'B'};
constexpr uint32_t kFormatVersion = 1;

// Rows assigned per QuerySimilarity (its lanes run over them) and centroids scored per panel
// (a panel's similarities, 1,024 × 64 floats, stay in L2 while the maxima are taken).
constexpr int64_t kAssignRows = 64;
// Rows per CentroidGroups::Assign call: enough that each probed group is scored against tens of
// rows at once (2,048 · 8 probes over 256 groups: 64 on average at C = 16,384), which the
// micro-kernels need to run near their peak.
constexpr int64_t kGroupedAssignRows = 2048;
constexpr int64_t kCentroidPanel = 1024;
// Rows of the sample the residual codec is trained on.
constexpr int64_t kCodecTrainingRows = 1 << 16;
// Grouped assignment (CentroidGroups): centroids per group, groups probed per vector, and the
// k-means iterations that form the groups.
constexpr int64_t kGroupSize = 64;
constexpr int kProbedGroups = 8;
constexpr int kGroupIterations = 8;

// For rows [0, n) of `rows` (n ≤ kAssignRows): the index and similarity of the best of the C
// centroids (ties: the lower index).
void NearestCentroids(const float* rows, int64_t n, int64_t dim, const float* centroids, int64_t C,
                      uint32_t* ids, float* best) {
  const QuerySimilarity similarity(FloatMatrixView{rows, n, dim});
  const int64_t stride = similarity.stride();
  std::vector<float> out(kCentroidPanel * stride);
  std::fill(best, best + n, -std::numeric_limits<float>::infinity());
  std::fill(ids, ids + n, 0);
  for (int64_t c0 = 0; c0 < C; c0 += kCentroidPanel) {
    const int64_t panel = std::min(kCentroidPanel, C - c0);
    similarity.Compute(centroids + c0 * dim, panel, out.data());
    for (int64_t j = 0; j < panel; ++j) {
      const float* sims = &out[j * stride];
      const uint32_t id = static_cast<uint32_t>(c0 + j);
      // Branch-free, so that the compiler vectorises it over the rows.
      for (int64_t i = 0; i < n; ++i) {
        const bool better = sims[i] > best[i];
        best[i] = better ? sims[i] : best[i];
        ids[i] = better ? id : ids[i];
      }
    }
  }
}

// Assigns every row of `vectors` to its nearest of the C centroids (through `groups` when not
// null), in blocks of kAssignRows (kGroupedAssignRows) split over `pool` (null: the calling
// thread).
void AssignAll(FloatMatrixView vectors, const float* centroids, int64_t C,
               const CentroidGroups* groups, ThreadPool* pool, uint32_t* ids) {
  const int64_t block = groups != nullptr ? kGroupedAssignRows : kAssignRows;
  const int64_t blocks = (vectors.rows + block - 1) / block;
  auto run = [&](int64_t begin, int64_t end) {
    float best[kAssignRows];
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first = b * block;
      const int64_t n = std::min(block, vectors.rows - first);
      const float* rows = vectors.data + first * vectors.cols;
      if (groups != nullptr) {
        groups->Assign(rows, n, ids + first);
      } else {
        NearestCentroids(rows, n, vectors.cols, centroids, C, ids + first, best);
      }
    }
  };
  if (pool == nullptr) {
    run(0, blocks);
  } else {
    pool->ParallelFor(blocks, 1, run);
  }
}

void Normalize(float* v, int64_t dim) {
  double norm = 0.0;
  for (int64_t k = 0; k < dim; ++k) norm += static_cast<double>(v[k]) * v[k];
  if (norm <= 0.0) return;
  const float scale = static_cast<float>(1.0 / std::sqrt(norm));
  for (int64_t k = 0; k < dim; ++k) v[k] *= scale;
}

// The k-means update: means[c] = the L2-normalised sum of the rows assigned to c, for every c
// with members; counts[c] = its members. Means without members are left as they were.
void UpdateMeans(FloatMatrixView rows, const uint32_t* assignment, int64_t k, float* means,
                 std::vector<int64_t>* counts) {
  const int64_t dim = rows.cols;
  std::vector<double> sums(k * dim, 0.0);
  counts->assign(k, 0);
  for (int64_t i = 0; i < rows.rows; ++i) {
    const float* row = rows.data + i * dim;
    double* sum = &sums[assignment[i] * dim];
    for (int64_t d = 0; d < dim; ++d) sum[d] += row[d];
    ++(*counts)[assignment[i]];
  }
  for (int64_t c = 0; c < k; ++c) {
    if ((*counts)[c] == 0) continue;
    for (int64_t d = 0; d < dim; ++d) means[c * dim + d] = static_cast<float>(sums[c * dim + d]);
    Normalize(&means[c * dim], dim);
  }
}

template <typename T>
void AppendPod(const T& value, std::string* out) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

}  // namespace

// Centroids per group ≈ kGroupSize: G = ⌈C / kGroupSize⌉ groups from a spherical k-means over the
// centroids themselves (initial means: every (C/G)-th centroid; deterministic).
CentroidGroups::CentroidGroups(const float* centroids, int64_t C, int64_t dim, ThreadPool* pool)
    : dim_(dim), num_groups_((C + kGroupSize - 1) / kGroupSize) {
  std::vector<float> means(num_groups_ * dim);
  for (int64_t g = 0; g < num_groups_; ++g) {
    std::copy_n(centroids + (g * C / num_groups_) * dim, dim, &means[g * dim]);
  }
  const FloatMatrixView all{centroids, C, dim};
  std::vector<uint32_t> group(C);
  std::vector<int64_t> counts;
  for (int iteration = 0; iteration < kGroupIterations; ++iteration) {
    AssignAll(all, means.data(), num_groups_, nullptr, pool, group.data());
    // An empty group keeps its mean (and may stay empty).
    UpdateMeans(all, group.data(), num_groups_, means.data(), &counts);
  }
  AssignAll(all, means.data(), num_groups_, nullptr, pool, group.data());
  means_ = std::make_unique<QuerySimilarity>(FloatMatrixView{means.data(), num_groups_, dim});
  // Members grouped by a counting sort: ascending ids within each group.
  offsets_.assign(num_groups_ + 1, 0);
  for (int64_t c = 0; c < C; ++c) ++offsets_[group[c] + 1];
  for (int64_t g = 0; g < num_groups_; ++g) offsets_[g + 1] += offsets_[g];
  members_.resize(C);
  std::vector<float> member_vectors(C * dim);
  std::vector<int64_t> next(offsets_.begin(), offsets_.end() - 1);
  for (int64_t c = 0; c < C; ++c) {
    const int64_t at = next[group[c]]++;
    members_[at] = static_cast<uint32_t>(c);
    std::copy_n(centroids + c * dim, dim, &member_vectors[at * dim]);
  }
  groups_.reserve(num_groups_);
  for (int64_t g = 0; g < num_groups_; ++g) {
    // An empty group gets one zero lane (QuerySimilarity needs a row); Assign never probes it.
    const int64_t size = std::max<int64_t>(offsets_[g + 1] - offsets_[g], 1);
    std::vector<float> zero(dim, 0.0f);
    const float* first =
        offsets_[g + 1] > offsets_[g] ? &member_vectors[offsets_[g] * dim] : zero.data();
    groups_.emplace_back(FloatMatrixView{first, size, dim});
  }
}

CentroidGroups::~CentroidGroups() = default;

void CentroidGroups::Assign(const float* rows, int64_t n, uint32_t* ids) const {
  const int probes = static_cast<int>(std::min<int64_t>(kProbedGroups, num_groups_));
  // Rows are the streamed side of every product below (the means and each group's centroids were
  // laid out as query lanes once, at construction): nothing is transposed per call.
  const int64_t mean_stride = means_->stride();
  std::vector<float> group_scores(n * mean_stride);
  means_->Compute(rows, n, group_scores.data());
  // (group, row) for each row's `probes` best non-empty groups (ties: lower group), grouped by
  // group.
  std::vector<std::pair<uint32_t, uint32_t>> probed;
  probed.reserve(n * probes);
  std::vector<std::pair<float, uint32_t>> ranked(num_groups_);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t g = 0; g < num_groups_; ++g) {
      const bool empty = offsets_[g + 1] == offsets_[g];
      ranked[g] = {
          empty ? -std::numeric_limits<float>::infinity() : group_scores[i * mean_stride + g],
          static_cast<uint32_t>(g)};
    }
    std::nth_element(ranked.begin(), ranked.begin() + (probes - 1), ranked.end(),
                     [](const auto& a, const auto& b) {
                       return a.first != b.first ? a.first > b.first : a.second < b.second;
                     });
    for (int p = 0; p < probes; ++p) probed.emplace_back(ranked[p].second, i);
  }
  std::sort(probed.begin(), probed.end());
  std::vector<float> best(n, -std::numeric_limits<float>::infinity());
  std::fill(ids, ids + n, 0);
  // Per probed group: the rows that probe it against its centroids, exactly.
  std::vector<float> gathered;
  std::vector<uint32_t> gathered_rows;
  std::vector<float> scores;
  for (size_t start = 0; start < probed.size();) {
    const uint32_t g = probed[start].first;
    size_t end = start;
    gathered.clear();
    gathered_rows.clear();
    for (; end < probed.size() && probed[end].first == g; ++end) {
      const uint32_t row = probed[end].second;
      gathered_rows.push_back(row);
      gathered.insert(gathered.end(), rows + row * dim_, rows + (row + 1) * dim_);
    }
    start = end;
    const int64_t size = offsets_[g + 1] - offsets_[g];
    if (size == 0) continue;
    const int64_t m = static_cast<int64_t>(gathered_rows.size());
    const int64_t stride = groups_[g].stride();
    scores.resize(m * stride);
    groups_[g].Compute(gathered.data(), m, scores.data());
    const uint32_t* members = &members_[offsets_[g]];
    for (int64_t r = 0; r < m; ++r) {
      // Members ascend, so `>` keeps the lower id on ties within the group.
      const float* row_scores = &scores[r * stride];
      int64_t top = 0;
      for (int64_t j = 1; j < size; ++j) top = row_scores[j] > row_scores[top] ? j : top;
      const uint32_t row = gathered_rows[r];
      const float score = row_scores[top];
      if (score > best[row] || (score == best[row] && members[top] < ids[row])) {
        best[row] = score;
        ids[row] = members[top];
      }
    }
  }
}

void CentroidGroups::ScoreNearest(const float* row, int probes,
                                  std::vector<std::pair<float, uint32_t>>* out) const {
  probes = static_cast<int>(std::min<int64_t>(probes, num_groups_));
  std::vector<float> group_scores(means_->stride());
  means_->Compute(row, 1, group_scores.data());
  std::vector<std::pair<float, uint32_t>> ranked(num_groups_);
  for (int64_t g = 0; g < num_groups_; ++g) {
    const bool empty = offsets_[g + 1] == offsets_[g];
    ranked[g] = {empty ? -std::numeric_limits<float>::infinity() : group_scores[g],
                 static_cast<uint32_t>(g)};
  }
  std::nth_element(ranked.begin(), ranked.begin() + (probes - 1), ranked.end(),
                   [](const auto& a, const auto& b) {
                     return a.first != b.first ? a.first > b.first : a.second < b.second;
                   });
  std::vector<float> scores;
  for (int p = 0; p < probes; ++p) {
    const uint32_t g = ranked[p].second;
    const int64_t size = offsets_[g + 1] - offsets_[g];
    if (size == 0) continue;
    scores.resize(groups_[g].stride());
    groups_[g].Compute(row, 1, scores.data());
    for (int64_t j = 0; j < size; ++j) out->emplace_back(scores[j], members_[offsets_[g] + j]);
  }
}

int64_t CentroidGroups::MemoryBytes() const {
  int64_t lanes = means_->stride();
  for (const QuerySimilarity& group : groups_) lanes += group.stride();
  return static_cast<int64_t>(lanes * dim_ * sizeof(float) + offsets_.size() * sizeof(int64_t) +
                              members_.size() * sizeof(uint32_t));
}

int64_t DefaultNumCentroids(int64_t vectors, double factor, int64_t min_centroids,
                            int64_t max_centroids) {
  const double target = factor * std::sqrt(static_cast<double>(std::max<int64_t>(vectors, 1)));
  int64_t centroids = 1;
  while (static_cast<double>(centroids * 2) <= target) centroids *= 2;
  return std::clamp(centroids, min_centroids, max_centroids);
}

CentroidCodebook::CentroidCodebook(int64_t dim, std::vector<float> centroids, ResidualCodec codec)
    : dim_(dim),
      num_centroids_(static_cast<int64_t>(centroids.size()) / dim),
      centroids_(std::move(centroids)),
      codec_(std::move(codec)) {
  BuildGroups();
}

CentroidCodebook::~CentroidCodebook() = default;

void CentroidCodebook::BuildGroups() {
  if (num_centroids_ <= kExactAssignmentCentroids) return;
  groups_ = std::make_unique<CentroidGroups>(centroids_.data(), num_centroids_, dim_, nullptr);
}

absl::StatusOr<std::unique_ptr<CentroidCodebook>> CentroidCodebook::Train(
    FloatMatrixView sample, const CentroidTrainingOptions& options, ThreadPool* pool) {
  const int64_t n = sample.rows;
  const int64_t dim = sample.cols;
  if (n < 1 || dim < 1 || sample.data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("centroid training: a sample of ", n, " × ", dim, ", expected ≥ 1 × 1"));
  }
  if (options.num_centroids < 1 || options.num_centroids > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_centroids ", options.num_centroids, ", expected 1 … 2^31"));
  }
  if (options.iterations < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("k-means iterations ", options.iterations, ", expected ≥ 0"));
  }
  const int64_t C = std::min(options.num_centroids, n);
  std::mt19937_64 rng(options.seed);

  // Initial centroids: C distinct sample rows (a partial Fisher–Yates shuffle).
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  for (int64_t i = 0; i < C; ++i) {
    std::uniform_int_distribution<int64_t> pick(i, n - 1);
    std::swap(order[i], order[pick(rng)]);
  }
  std::vector<float> centroids(C * dim);
  for (int64_t c = 0; c < C; ++c) {
    std::copy_n(sample.data + order[c] * dim, dim, &centroids[c * dim]);
    Normalize(&centroids[c * dim], dim);
  }

  std::vector<uint32_t> assignment(n);
  std::vector<int64_t> counts;
  // Large codebooks assign through groups of the current centroids, formed anew each iteration.
  auto assign = [&] {
    std::unique_ptr<CentroidGroups> groups;
    if (C > kExactAssignmentCentroids) {
      groups = std::make_unique<CentroidGroups>(centroids.data(), C, dim, pool);
    }
    AssignAll(sample, centroids.data(), C, groups.get(), pool, assignment.data());
  };
  for (int iteration = 0; iteration < options.iterations; ++iteration) {
    assign();
    UpdateMeans(sample, assignment.data(), C, centroids.data(), &counts);
    std::uniform_int_distribution<int64_t> any_row(0, n - 1);
    for (int64_t c = 0; c < C; ++c) {
      if (counts[c] > 0) continue;
      // An empty cluster restarts at a random sample row.
      float* centroid = &centroids[c * dim];
      std::copy_n(sample.data + any_row(rng) * dim, dim, centroid);
      Normalize(centroid, dim);
    }
  }
  assign();

  // The residual codec, on (a prefix of) the sample's residuals against the final centroids.
  const int64_t codec_rows = std::min(n, kCodecTrainingRows);
  std::vector<float> residuals(codec_rows * dim);
  for (int64_t i = 0; i < codec_rows; ++i) {
    const float* row = sample.data + i * dim;
    const float* centroid = &centroids[assignment[i] * dim];
    for (int64_t k = 0; k < dim; ++k) residuals[i * dim + k] = row[k] - centroid[k];
  }
  absl::StatusOr<ResidualCodec> codec =
      ResidualCodec::Train(residuals.data(), codec_rows, dim, options.nbits);
  if (!codec.ok()) return codec.status();
  return std::unique_ptr<CentroidCodebook>(
      new CentroidCodebook(dim, std::move(centroids), std::move(*codec)));
}

std::string CentroidCodebook::Serialize() const {
  std::string out(kMagic, sizeof(kMagic));
  AppendPod(kFormatVersion, &out);
  AppendPod(dim_, &out);
  AppendPod(num_centroids_, &out);
  out.append(reinterpret_cast<const char*>(centroids_.data()), centroids_.size() * sizeof(float));
  codec_.AppendTo(&out);
  AppendPod(Crc32(out), &out);
  return out;
}

absl::StatusOr<std::unique_ptr<CentroidCodebook>> CentroidCodebook::Parse(absl::string_view bytes) {
  constexpr size_t kHeader = sizeof(kMagic) + sizeof(uint32_t) + 2 * sizeof(int64_t);
  if (bytes.size() < kHeader + sizeof(uint32_t) ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("centroid codebook: not a codebook (bad magic or too short)");
  }
  uint32_t stored_crc = 0;
  std::memcpy(&stored_crc, bytes.data() + bytes.size() - sizeof(uint32_t), sizeof(uint32_t));
  const absl::string_view body = bytes.substr(0, bytes.size() - sizeof(uint32_t));
  if (Crc32(body) != stored_crc) {
    return absl::DataLossError("centroid codebook: checksum mismatch");
  }
  uint32_t version = 0;
  int64_t dim = 0, count = 0;
  std::memcpy(&version, body.data() + 4, sizeof(version));
  std::memcpy(&dim, body.data() + 8, sizeof(dim));
  std::memcpy(&count, body.data() + 16, sizeof(count));
  if (version != kFormatVersion) {
    return absl::DataLossError(absl::StrCat("centroid codebook: format version ", version,
                                            ", this build reads ", kFormatVersion));
  }
  if (dim < 1 || dim > (int64_t{1} << 20) || count < 1 || count > (int64_t{1} << 31) ||
      static_cast<uint64_t>(count) * dim * sizeof(float) > body.size() - kHeader) {
    return absl::DataLossError(absl::StrCat("centroid codebook: ", count, " centroids of dim ", dim,
                                            " do not fit in ", body.size(), " bytes"));
  }
  std::vector<float> centroids(count * dim);
  std::memcpy(centroids.data(), body.data() + kHeader, centroids.size() * sizeof(float));
  for (size_t i = 0; i < centroids.size(); ++i) {
    if (!std::isfinite(centroids[i])) {
      return absl::DataLossError(absl::StrCat("centroid codebook: centroid ", i / dim, " value ",
                                              i % dim, " is ", centroids[i],
                                              ", expected a finite value"));
    }
  }
  size_t offset = kHeader + centroids.size() * sizeof(float);
  absl::StatusOr<ResidualCodec> codec = ResidualCodec::Parse(body, &offset);
  if (!codec.ok()) return codec.status();
  if (codec->dim() != dim || offset != body.size()) {
    return absl::DataLossError("centroid codebook: codec does not match the centroids");
  }
  return std::unique_ptr<CentroidCodebook>(
      new CentroidCodebook(dim, std::move(centroids), std::move(*codec)));
}

void CentroidCodebook::Encode(FloatMatrixView vectors, uint32_t* ids, uint8_t* codes) const {
  AssignAll(vectors, centroids_.data(), num_centroids_, groups_.get(), nullptr, ids);
  std::vector<float> residual(dim_);
  for (int64_t i = 0; i < vectors.rows; ++i) {
    const float* row = vectors.data + i * dim_;
    const float* centroid = &centroids_[ids[i] * dim_];
    for (int64_t k = 0; k < dim_; ++k) residual[k] = row[k] - centroid[k];
    codec_.Encode(residual.data(), codes + i * codec_.code_bytes());
  }
}

void CentroidCodebook::Decode(uint32_t id, const uint8_t* code, float* out) const {
  codec_.Decode(code, out);
  const float* centroid = &centroids_[static_cast<int64_t>(id) * dim_];
  for (int64_t k = 0; k < dim_; ++k) out[k] += centroid[k];
}

void CentroidCodebook::ScoreCentroids(const QuerySimilarity& similarity, float* out) const {
  similarity.Compute(centroids_.data(), num_centroids_, out);
}

void CentroidCodebook::ScoreNearCentroids(const float* row, int probes,
                                          std::vector<std::pair<float, uint32_t>>* out) const {
  groups_->ScoreNearest(row, probes, out);
}

int64_t CentroidCodebook::MemoryBytes() const {
  int64_t bytes = static_cast<int64_t>(centroids_.size() * sizeof(float));
  bytes += dim_ * ((int64_t{1} << codec_.nbits()) * 2 - 1) * static_cast<int64_t>(sizeof(float));
  if (groups_ != nullptr) bytes += groups_->MemoryBytes();
  return bytes;
}

}  // namespace tessera::internal
