#include "index/centroid/centroid_codebook.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "index/common/cpu_features.h"
#include "index/common/crc32.h"
#include "index/common/thread_pool.h"
#include "index/kernels/query_similarity.h"

namespace tessera::internal {
namespace {

// Serialized layout (little-endian):
//   "TSCB" | u32 format version | i64 dim | i64 num_centroids | num_centroids × dim f32 |
//   ResidualCodec::AppendTo bytes | u32 CRC-32 of everything before it.
constexpr char kMagic[4] = {'T', 'S', 'C', 'B'};
//   Version 2 (a two-level training's codebook, whose groups are stored) appends, before the CRC:
//   i64 G | G × dim f32 group means | (G + 1) × i64 group offsets (group g: centroids
//   [offsets[g], offsets[g + 1])). Version 1's groups, beyond kExactAssignmentCentroids, are
//   formed at load; a codebook serializes in the version it was read in.
constexpr uint32_t kFormatVersion = 1;
constexpr uint32_t kGroupedFormatVersion = 2;

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

// The first index of the largest of values[0 .. n) (n ≥ 1, finite values): the maximum, then the
// first index holding it, eight values a step. A running `values[j] > values[top]` scan is a chain
// of dependent loads and compares: it was four fifths of CentroidGroups::Assign's own time.
__attribute__((target("avx2"))) int64_t FirstArgMaxAvx2(const float* values, int64_t n) {
  int64_t j = 0;
  float max = values[0];
  if (n >= 8) {
    __m256 lanes = _mm256_loadu_ps(values);
    for (j = 8; j + 8 <= n; j += 8) lanes = _mm256_max_ps(lanes, _mm256_loadu_ps(values + j));
    alignas(32) float lane[8];
    _mm256_store_ps(lane, lanes);
    max = *std::max_element(lane, lane + 8);
  }
  for (; j < n; ++j) max = std::max(max, values[j]);
  const __m256 target = _mm256_set1_ps(max);
  for (j = 0; j + 8 <= n; j += 8) {
    const int equal =
        _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(values + j), target, _CMP_EQ_OQ));
    if (equal != 0) return j + __builtin_ctz(equal);
  }
  while (values[j] != max) ++j;
  return j;
}

int64_t FirstArgMaxPortable(const float* values, int64_t n) {
  int64_t top = 0;
  for (int64_t j = 1; j < n; ++j) top = values[j] > values[top] ? j : top;
  return top;
}

// The first index j in [from, n) with values[j] > threshold, or n: eight values a compare.
__attribute__((target("avx2"))) int64_t FirstAboveAvx2(const float* values, int64_t from, int64_t n,
                                                       float threshold) {
  const __m256 bound = _mm256_set1_ps(threshold);
  int64_t j = from;
  for (; j + 8 <= n; j += 8) {
    const int above =
        _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(values + j), bound, _CMP_GT_OQ));
    if (above != 0) return j + __builtin_ctz(above);
  }
  while (j < n && !(values[j] > threshold)) ++j;
  return j;
}

int64_t FirstAbovePortable(const float* values, int64_t from, int64_t n, float threshold) {
  int64_t j = from;
  while (j < n && !(values[j] > threshold)) ++j;
  return j;
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
  Build(centroids, C, means.data(), group);
}

CentroidGroups::CentroidGroups(const float* centroids, int64_t C, int64_t dim, const float* means,
                               const std::vector<int64_t>& offsets)
    : dim_(dim), num_groups_(static_cast<int64_t>(offsets.size()) - 1) {
  std::vector<uint32_t> group(C);
  for (int64_t g = 0; g < num_groups_; ++g) {
    std::fill(group.begin() + offsets[g], group.begin() + offsets[g + 1], static_cast<uint32_t>(g));
  }
  Build(centroids, C, means, group);
}

void CentroidGroups::Build(const float* centroids, int64_t C, const float* means,
                           const std::vector<uint32_t>& group) {
  const int64_t dim = dim_;
  means_ = std::make_unique<QuerySimilarity>(FloatMatrixView{means, num_groups_, dim});
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

void CentroidGroups::BestGroups(const float* mean_scores, int probes,
                                std::vector<std::pair<float, uint32_t>>* heap,
                                uint32_t* best) const {
  // One pass over the groups, keeping the `probes` best so far in a heap whose top is the worst
  // of them, skipping eight groups a compare to the next that beats the top (a selection over all
  // the groups per row, as std::nth_element did, was 12% of a compact build's CPU). The groups
  // come in ascending order, so a later one enters only on a strictly higher score: ties keep
  // the lower.
  const auto ranks_above = [](const std::pair<float, uint32_t>& a,
                              const std::pair<float, uint32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  const auto empty = [this](int64_t g) { return offsets_[g + 1] == offsets_[g]; };
  heap->clear();
  if (probes <= 0) return;
  int64_t g = 0;
  for (; g < num_groups_ && static_cast<int>(heap->size()) < probes; ++g) {
    heap->emplace_back(empty(g) ? -std::numeric_limits<float>::infinity() : mean_scores[g],
                       static_cast<uint32_t>(g));
    std::push_heap(heap->begin(), heap->end(), ranks_above);
  }
  const auto first_above = Cpu().avx2 ? FirstAboveAvx2 : FirstAbovePortable;
  while ((g = first_above(mean_scores, g, num_groups_, heap->front().first)) < num_groups_) {
    if (!empty(g)) {
      std::pop_heap(heap->begin(), heap->end(), ranks_above);
      heap->back() = {mean_scores[g], static_cast<uint32_t>(g)};
      std::push_heap(heap->begin(), heap->end(), ranks_above);
    }
    ++g;
  }
  std::sort_heap(heap->begin(), heap->end(), ranks_above);
  for (int p = 0; p < probes; ++p) best[p] = (*heap)[p].second;
}

void CentroidGroups::Assign(const float* rows, int64_t n, uint32_t* ids) const {
  const int probes = static_cast<int>(std::min<int64_t>(kProbedGroups, num_groups_));
  // Rows are the streamed side of every product below (the means and each group's centroids were
  // laid out as query lanes once, at construction): nothing is transposed per call.
  const int64_t mean_stride = means_->stride();
  std::vector<float> group_scores(n * mean_stride);
  means_->Compute(rows, n, group_scores.data());
  // Each row's `probes` best non-empty groups (ties: lower group), then the rows that probe each
  // group, ascending (a counting sort: row_starts[g] … row_starts[g + 1] of group_rows).
  std::vector<uint32_t> probed(n * probes);
  std::vector<std::pair<float, uint32_t>> heap;
  for (int64_t i = 0; i < n; ++i) {
    BestGroups(&group_scores[i * mean_stride], probes, &heap, &probed[i * probes]);
  }
  std::vector<int64_t> row_starts(num_groups_ + 1, 0);
  for (const uint32_t g : probed) ++row_starts[g + 1];
  for (int64_t g = 0; g < num_groups_; ++g) row_starts[g + 1] += row_starts[g];
  std::vector<uint32_t> group_rows(probed.size());
  {
    std::vector<int64_t> next(row_starts.begin(), row_starts.end() - 1);
    for (int64_t i = 0; i < n; ++i) {
      for (int p = 0; p < probes; ++p) {
        group_rows[next[probed[i * probes + p]]++] = static_cast<uint32_t>(i);
      }
    }
  }
  std::vector<float> best(n, -std::numeric_limits<float>::infinity());
  std::fill(ids, ids + n, 0);
  const auto first_arg_max = Cpu().avx2 ? FirstArgMaxAvx2 : FirstArgMaxPortable;
  // Per probed group: the rows that probe it against its centroids, exactly.
  std::vector<float> gathered;
  std::vector<float> scores;
  for (int64_t g = 0; g < num_groups_; ++g) {
    const int64_t size = offsets_[g + 1] - offsets_[g];
    const int64_t m = row_starts[g + 1] - row_starts[g];
    if (size == 0 || m == 0) continue;
    const uint32_t* probing = &group_rows[row_starts[g]];
    gathered.resize(m * dim_);
    for (int64_t r = 0; r < m; ++r) {
      std::copy_n(rows + probing[r] * dim_, dim_, &gathered[r * dim_]);
    }
    const int64_t stride = groups_[g].stride();
    scores.resize(m * stride);
    groups_[g].Compute(gathered.data(), m, scores.data());
    const uint32_t* members = &members_[offsets_[g]];
    for (int64_t r = 0; r < m; ++r) {
      // Members ascend, so the first maximum is the lower id on ties within the group.
      const int64_t top = first_arg_max(&scores[r * stride], size);
      const uint32_t row = probing[r];
      const float score = scores[r * stride + top];
      if (score > best[row] || (score == best[row] && members[top] < ids[row])) {
        best[row] = score;
        ids[row] = members[top];
      }
    }
  }
}

void CentroidGroups::ScoreNearest(FloatMatrixView rows, int probes, const float* centroid_scores,
                                  ThreadPool* pool,
                                  std::vector<std::vector<std::pair<float, uint32_t>>>* out) const {
  const int64_t n = rows.rows;
  const int64_t C = static_cast<int64_t>(members_.size());
  probes = static_cast<int>(std::min<int64_t>(probes, num_groups_));
  auto parallel = [pool](int64_t count, int64_t grain,
                         absl::FunctionRef<void(int64_t, int64_t)> fn) {
    if (pool != nullptr) {
      pool->ParallelFor(count, grain, fn);
    } else {
      fn(0, count);
    }
  };
  // Row i's probed groups at probed[i · probes …], by their means' scores.
  std::vector<uint32_t> probed(n * probes);
  parallel(n, 4, [&](int64_t begin, int64_t end) {
    const int64_t mean_stride = means_->stride();
    std::vector<float> group_scores((end - begin) * mean_stride);
    means_->Compute(rows.data + begin * dim_, end - begin, group_scores.data());
    std::vector<std::pair<float, uint32_t>> heap;
    for (int64_t i = begin; i < end; ++i) {
      BestGroups(&group_scores[(i - begin) * mean_stride], probes, &heap, &probed[i * probes]);
    }
  });
  // (group, row, where the group's members go in the row's output), grouped by group; each row's
  // output sized for all its groups, so that the groups fill disjoint parts of it in parallel.
  struct Request {
    uint32_t group;
    uint32_t row;
    uint32_t at;
    bool operator<(const Request& other) const {
      return group != other.group ? group < other.group : row < other.row;
    }
  };
  std::vector<Request> requests;
  requests.reserve(n * probes);
  out->assign(n, {});
  for (int64_t i = 0; i < n; ++i) {
    uint32_t at = 0;
    for (int p = 0; p < probes; ++p) {
      const uint32_t g = probed[i * probes + p];
      const auto size = static_cast<uint32_t>(offsets_[g + 1] - offsets_[g]);
      if (size == 0) continue;
      requests.push_back(Request{g, static_cast<uint32_t>(i), at});
      at += size;
    }
    (*out)[i].resize(at);
  }
  std::sort(requests.begin(), requests.end());
  std::vector<size_t> group_starts;
  for (size_t r = 0; r < requests.size(); ++r) {
    if (r == 0 || requests[r].group != requests[r - 1].group) group_starts.push_back(r);
  }
  group_starts.push_back(requests.size());
  parallel(static_cast<int64_t>(group_starts.size()) - 1, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> gathered;
    std::vector<float> scores;
    for (int64_t k = begin; k < end; ++k) {
      const auto first = requests.begin() + static_cast<ptrdiff_t>(group_starts[k]);
      const auto last = requests.begin() + static_cast<ptrdiff_t>(group_starts[k + 1]);
      const uint32_t g = first->group;
      const int64_t size = offsets_[g + 1] - offsets_[g];
      const uint32_t* members = &members_[offsets_[g]];
      if (centroid_scores != nullptr) {
        for (auto request = first; request != last; ++request) {
          auto* slot = &(*out)[request->row][request->at];
          const float* row_scores = centroid_scores + request->row * C;
          for (int64_t j = 0; j < size; ++j) slot[j] = {row_scores[members[j]], members[j]};
        }
        continue;
      }
      gathered.clear();
      for (auto request = first; request != last; ++request) {
        const float* row = rows.data + request->row * dim_;
        gathered.insert(gathered.end(), row, row + dim_);
      }
      const int64_t stride = groups_[g].stride();
      scores.resize((last - first) * stride);
      groups_[g].Compute(gathered.data(), last - first, scores.data());
      for (auto request = first; request != last; ++request) {
        auto* slot = &(*out)[request->row][request->at];
        const float* row_scores = &scores[(request - first) * stride];
        for (int64_t j = 0; j < size; ++j) slot[j] = {row_scores[j], members[j]};
      }
    }
  });
}

int64_t CentroidGroups::MemoryBytes() const {
  int64_t lanes = means_->stride();
  for (const QuerySimilarity& group : groups_) lanes += group.stride();
  return static_cast<int64_t>(lanes * dim_ * sizeof(float) + offsets_.size() * sizeof(int64_t) +
                              members_.size() * sizeof(uint32_t));
}

namespace {

std::atomic<CentroidSizing> g_centroid_sizing{CentroidSizing::kSquareRoot};

// The largest power of two ≤ target (1 when target < 2).
int64_t FloorPowerOfTwo(double target) {
  int64_t p = 1;
  while (static_cast<double>(p * 2) <= target) p *= 2;
  return p;
}

// Spherical k-means of the rows of `sample` into C ≤ sample.rows centroids (*centroids: C × dim,
// each L2-normalised): the initial centroids are C distinct rows drawn by `rng` (a partial
// Fisher–Yates shuffle), an empty cluster restarts at a random row. With `grouped` and C beyond
// kExactAssignmentCentroids, the assignment goes through CentroidGroups of the current centroids,
// formed anew each iteration. *assignment (when not null): each row's nearest final centroid.
void SphericalKMeans(FloatMatrixView sample, int64_t C, int iterations, bool grouped,
                     std::mt19937_64* rng, ThreadPool* pool, std::vector<float>* centroids,
                     std::vector<uint32_t>* assignment) {
  const int64_t n = sample.rows;
  const int64_t dim = sample.cols;
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  for (int64_t i = 0; i < C; ++i) {
    std::uniform_int_distribution<int64_t> pick(i, n - 1);
    std::swap(order[i], order[pick(*rng)]);
  }
  centroids->assign(C * dim, 0.0f);
  for (int64_t c = 0; c < C; ++c) {
    std::copy_n(sample.data + order[c] * dim, dim, &(*centroids)[c * dim]);
    Normalize(&(*centroids)[c * dim], dim);
  }
  std::vector<uint32_t> assigned(n);
  std::vector<int64_t> counts;
  auto assign = [&] {
    std::unique_ptr<CentroidGroups> groups;
    if (grouped && C > CentroidCodebook::kExactAssignmentCentroids) {
      groups = std::make_unique<CentroidGroups>(centroids->data(), C, dim, pool);
    }
    AssignAll(sample, centroids->data(), C, groups.get(), pool, assigned.data());
  };
  for (int iteration = 0; iteration < iterations; ++iteration) {
    assign();
    UpdateMeans(sample, assigned.data(), C, centroids->data(), &counts);
    std::uniform_int_distribution<int64_t> any_row(0, n - 1);
    for (int64_t c = 0; c < C; ++c) {
      if (counts[c] > 0) continue;
      float* centroid = &(*centroids)[c * dim];
      std::copy_n(sample.data + any_row(*rng) * dim, dim, centroid);
      Normalize(centroid, dim);
    }
  }
  if (assignment != nullptr) {
    assign();
    *assignment = std::move(assigned);
  }
}

// Centroids per cell for the two-level training: C in proportion to the cells' rows (largest
// remainders, ties to the lower cell), at most a cell's rows; what that cap leaves goes to the
// cells with the most rows per centroid. Σ = C when C ≤ Σ rows.
std::vector<int64_t> CellQuotas(const std::vector<int64_t>& rows, int64_t C) {
  const int64_t G = static_cast<int64_t>(rows.size());
  int64_t n = 0;
  for (int64_t r : rows) n += r;
  std::vector<int64_t> quota(G, 0);
  std::vector<std::pair<double, int64_t>> remainders;
  int64_t assigned = 0;
  for (int64_t g = 0; g < G; ++g) {
    const double exact = static_cast<double>(C) * static_cast<double>(rows[g]) / n;
    quota[g] = std::min(rows[g], static_cast<int64_t>(exact));
    assigned += quota[g];
    remainders.emplace_back(exact - std::floor(exact), g);
  }
  std::sort(remainders.begin(), remainders.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  for (const auto& [fraction, g] : remainders) {
    if (assigned >= C) break;
    if (quota[g] < rows[g]) {
      ++quota[g];
      ++assigned;
    }
  }
  while (assigned < C) {
    int64_t best = -1;
    for (int64_t g = 0; g < G; ++g) {
      if (quota[g] >= rows[g]) continue;
      // rows[g] / (quota[g] + 1) > rows[best] / (quota[best] + 1), without division.
      if (best < 0 || rows[g] * (quota[best] + 1) > rows[best] * (quota[g] + 1)) best = g;
    }
    if (best < 0) break;
    ++quota[best];
    ++assigned;
  }
  return quota;
}

// Coarse cells trained per cell of the two-level training on at most this many sample rows each.
constexpr int64_t kCoarseRowsPerCell = 256;

struct TwoLevelCentroids {
  std::vector<float> centroids;  // C × dim, cell by cell
  std::vector<float> means;      // G × dim: the cells' coarse centroids
  std::vector<int64_t> offsets;  // G + 1: cell g holds centroids [offsets[g], offsets[g + 1])
  std::vector<float> residuals;  // residual_rows × dim: sample row i − its nearest centroid
};

// The two-level training (file comment): G = the least power of two with G² ≥ C cells (512 at
// C = 2^18, cells of ~512 centroids), trained on a subsample; every sample row assigned to its
// nearest cell; a k-means per cell over its rows, cells split over `pool` (each cell's k-means is
// seeded by its index, so the result does not depend on the threads). Also the residuals of the
// first residual_rows sample rows against their cell's nearest centroid, for the codec.
TwoLevelCentroids TrainTwoLevel(FloatMatrixView sample, int64_t C,
                                const CentroidTrainingOptions& options, int64_t residual_rows,
                                ThreadPool* pool) {
  const int64_t n = sample.rows;
  const int64_t dim = sample.cols;
  int64_t G = 1;
  while (G * G < C) G *= 2;
  G = std::min(G, n);
  std::mt19937_64 rng(options.seed);
  TwoLevelCentroids out;

  // 1. The cells, from a random subsample of kCoarseRowsPerCell rows a cell.
  const int64_t coarse_rows = std::min(n, G * kCoarseRowsPerCell);
  std::vector<float> subsample;
  FloatMatrixView coarse = sample;
  if (coarse_rows < n) {
    std::vector<int64_t> order(n);
    for (int64_t i = 0; i < n; ++i) order[i] = i;
    for (int64_t i = 0; i < coarse_rows; ++i) {
      std::uniform_int_distribution<int64_t> pick(i, n - 1);
      std::swap(order[i], order[pick(rng)]);
    }
    subsample.resize(coarse_rows * dim);
    for (int64_t i = 0; i < coarse_rows; ++i) {
      std::copy_n(sample.data + order[i] * dim, dim, &subsample[i * dim]);
    }
    coarse = FloatMatrixView{subsample.data(), coarse_rows, dim};
  }
  SphericalKMeans(coarse, G, options.iterations, /*grouped=*/false, &rng, pool, &out.means,
                  nullptr);
  std::vector<float>().swap(subsample);
  std::vector<uint32_t> cell(n);
  AssignAll(sample, out.means.data(), G, nullptr, pool, cell.data());

  // 2. The rows of each cell (ascending), and its centroids.
  std::vector<int64_t> row_offsets(G + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++row_offsets[cell[i] + 1];
  std::vector<int64_t> cell_rows(G);
  for (int64_t g = 0; g < G; ++g) {
    cell_rows[g] = row_offsets[g + 1];
    row_offsets[g + 1] += row_offsets[g];
  }
  std::vector<int64_t> rows_by_cell(n);
  {
    std::vector<int64_t> next(row_offsets.begin(), row_offsets.end() - 1);
    for (int64_t i = 0; i < n; ++i) rows_by_cell[next[cell[i]]++] = i;
  }
  const std::vector<int64_t> quota = CellQuotas(cell_rows, C);
  out.offsets.assign(G + 1, 0);
  for (int64_t g = 0; g < G; ++g) out.offsets[g + 1] = out.offsets[g] + quota[g];
  out.centroids.assign(out.offsets[G] * dim, 0.0f);
  out.residuals.assign(residual_rows * dim, 0.0f);

  // 3. A k-means per cell.
  auto train_cells = [&](int64_t begin, int64_t end) {
    std::vector<float> rows;
    std::vector<float> centroids;
    std::vector<uint32_t> assignment;
    for (int64_t g = begin; g < end; ++g) {
      if (quota[g] == 0) continue;
      const int64_t m = cell_rows[g];
      const int64_t* members = &rows_by_cell[row_offsets[g]];
      rows.resize(m * dim);
      for (int64_t r = 0; r < m; ++r) {
        std::copy_n(sample.data + members[r] * dim, dim, &rows[r * dim]);
      }
      std::mt19937_64 cell_rng(options.seed ^
                               (0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(g + 1)));
      SphericalKMeans(FloatMatrixView{rows.data(), m, dim}, quota[g], options.iterations,
                      /*grouped=*/false, &cell_rng, nullptr, &centroids, &assignment);
      std::copy(centroids.begin(), centroids.end(), &out.centroids[out.offsets[g] * dim]);
      for (int64_t r = 0; r < m; ++r) {
        if (members[r] >= residual_rows) continue;
        const float* row = &rows[r * dim];
        const float* centroid = &centroids[assignment[r] * dim];
        float* residual = &out.residuals[members[r] * dim];
        for (int64_t k = 0; k < dim; ++k) residual[k] = row[k] - centroid[k];
      }
    }
  };
  if (pool == nullptr) {
    train_cells(0, G);
  } else {
    pool->ParallelFor(G, 1, train_cells);
  }
  return out;
}

}  // namespace

int64_t ListLengthNumCentroids(int64_t vectors, int64_t list_length, int64_t min_centroids,
                               int64_t max_centroids) {
  const double target = static_cast<double>(std::max<int64_t>(vectors, 1)) /
                        static_cast<double>(std::max<int64_t>(list_length, 1));
  return std::clamp(FloorPowerOfTwo(target), min_centroids, max_centroids);
}

int64_t SquareRootNumCentroids(int64_t vectors, double factor, int64_t min_centroids,
                               int64_t max_centroids) {
  const double target = factor * std::sqrt(static_cast<double>(std::max<int64_t>(vectors, 1)));
  return std::clamp(FloorPowerOfTwo(target), min_centroids, max_centroids);
}

int64_t DefaultNumCentroids(int64_t vectors) {
  return GetCentroidSizing() == CentroidSizing::kListLength ? ListLengthNumCentroids(vectors)
                                                            : SquareRootNumCentroids(vectors);
}

void SetCentroidSizingForTesting(CentroidSizing sizing) {
  g_centroid_sizing.store(sizing, std::memory_order_relaxed);
}

CentroidSizing GetCentroidSizing() { return g_centroid_sizing.load(std::memory_order_relaxed); }

int64_t TrainingSampleVectors(int64_t num_centroids, int64_t vectors, int64_t dim) {
  const int64_t by_bytes =
      kTrainingSampleBytes / (static_cast<int64_t>(sizeof(float)) * std::max<int64_t>(dim, 1));
  const int64_t rows = std::clamp(by_bytes, num_centroids * 8, num_centroids * 32);
  return std::min(vectors, rows);
}

CentroidCodebook::CentroidCodebook(int64_t dim, std::vector<float> centroids, ResidualCodec codec,
                                   std::vector<float> group_means,
                                   std::vector<int64_t> group_offsets)
    : dim_(dim),
      num_centroids_(static_cast<int64_t>(centroids.size()) / dim),
      centroids_(std::move(centroids)),
      codec_(std::move(codec)),
      group_means_(std::move(group_means)),
      group_offsets_(std::move(group_offsets)) {
  BuildGroups();
}

CentroidCodebook::~CentroidCodebook() = default;

void CentroidCodebook::BuildGroups() {
  if (!group_offsets_.empty()) {
    groups_ = std::make_unique<CentroidGroups>(centroids_.data(), num_centroids_, dim_,
                                               group_means_.data(), group_offsets_);
    return;
  }
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
  // The residual codec is trained on (a prefix of) the sample's residuals against the final
  // centroids.
  const int64_t codec_rows = std::min(n, kCodecTrainingRows);
  std::vector<float> centroids;
  std::vector<float> residuals;
  std::vector<float> group_means;
  std::vector<int64_t> group_offsets;
  if (options.two_level && C > kExactAssignmentCentroids) {
    TwoLevelCentroids trained = TrainTwoLevel(sample, C, options, codec_rows, pool);
    centroids = std::move(trained.centroids);
    residuals = std::move(trained.residuals);
    group_means = std::move(trained.means);
    group_offsets = std::move(trained.offsets);
  } else {
    std::mt19937_64 rng(options.seed);
    std::vector<uint32_t> assignment;
    SphericalKMeans(sample, C, options.iterations, /*grouped=*/true, &rng, pool, &centroids,
                    &assignment);
    residuals.resize(codec_rows * dim);
    for (int64_t i = 0; i < codec_rows; ++i) {
      const float* row = sample.data + i * dim;
      const float* centroid = &centroids[assignment[i] * dim];
      for (int64_t k = 0; k < dim; ++k) residuals[i * dim + k] = row[k] - centroid[k];
    }
  }
  absl::StatusOr<ResidualCodec> codec =
      ResidualCodec::Train(residuals.data(), codec_rows, dim, options.nbits);
  if (!codec.ok()) return codec.status();
  return std::unique_ptr<CentroidCodebook>(
      new CentroidCodebook(dim, std::move(centroids), std::move(*codec), std::move(group_means),
                           std::move(group_offsets)));
}

std::string CentroidCodebook::Serialize() const {
  std::string out(kMagic, sizeof(kMagic));
  AppendPod(group_offsets_.empty() ? kFormatVersion : kGroupedFormatVersion, &out);
  AppendPod(dim_, &out);
  AppendPod(num_centroids_, &out);
  out.append(reinterpret_cast<const char*>(centroids_.data()), centroids_.size() * sizeof(float));
  codec_.AppendTo(&out);
  if (!group_offsets_.empty()) {
    AppendPod(stored_groups(), &out);
    out.append(reinterpret_cast<const char*>(group_means_.data()),
               group_means_.size() * sizeof(float));
    out.append(reinterpret_cast<const char*>(group_offsets_.data()),
               group_offsets_.size() * sizeof(int64_t));
  }
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
  if (version != kFormatVersion && version != kGroupedFormatVersion) {
    return absl::DataLossError(absl::StrCat("centroid codebook: format version ", version,
                                            ", this build reads ", kFormatVersion, " and ",
                                            kGroupedFormatVersion));
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
  if (codec->dim() != dim) {
    return absl::DataLossError("centroid codebook: codec does not match the centroids");
  }
  std::vector<float> group_means;
  std::vector<int64_t> group_offsets;
  if (version == kGroupedFormatVersion) {
    int64_t groups = 0;
    if (body.size() - offset < sizeof(groups)) {
      return absl::DataLossError("centroid codebook: the groups' count is missing");
    }
    std::memcpy(&groups, body.data() + offset, sizeof(groups));
    offset += sizeof(groups);
    const uint64_t want =
        groups < 1 || groups > count
            ? 0
            : static_cast<uint64_t>(groups) * (dim * sizeof(float) + sizeof(int64_t)) +
                  sizeof(int64_t);
    if (want == 0 || want != body.size() - offset) {
      return absl::DataLossError(absl::StrCat("centroid codebook: ", groups, " groups of ", count,
                                              " centroids do not fit in the ", body.size() - offset,
                                              " bytes left"));
    }
    group_means.resize(groups * dim);
    std::memcpy(group_means.data(), body.data() + offset, group_means.size() * sizeof(float));
    offset += group_means.size() * sizeof(float);
    for (size_t i = 0; i < group_means.size(); ++i) {
      if (!std::isfinite(group_means[i])) {
        return absl::DataLossError(absl::StrCat("centroid codebook: group ", i / dim,
                                                " mean value ", i % dim, " is ", group_means[i],
                                                ", expected a finite value"));
      }
    }
    group_offsets.resize(groups + 1);
    std::memcpy(group_offsets.data(), body.data() + offset, group_offsets.size() * sizeof(int64_t));
    offset += group_offsets.size() * sizeof(int64_t);
    for (int64_t g = 0; g < groups; ++g) {
      if (group_offsets[g + 1] < group_offsets[g]) {
        return absl::DataLossError(absl::StrCat("centroid codebook: group ", g, " ends at ",
                                                group_offsets[g + 1], " before it starts at ",
                                                group_offsets[g]));
      }
    }
    if (group_offsets.front() != 0 || group_offsets.back() != count) {
      return absl::DataLossError(absl::StrCat("centroid codebook: groups span centroids ",
                                              group_offsets.front(), " … ", group_offsets.back(),
                                              ", expected 0 … ", count));
    }
  }
  if (offset != body.size()) {
    return absl::DataLossError("centroid codebook: codec does not match the centroids");
  }
  return std::unique_ptr<CentroidCodebook>(
      new CentroidCodebook(dim, std::move(centroids), std::move(*codec), std::move(group_means),
                           std::move(group_offsets)));
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

void CentroidCodebook::ScoreNearCentroids(
    FloatMatrixView rows, int probes, const float* centroid_scores, ThreadPool* pool,
    std::vector<std::vector<std::pair<float, uint32_t>>>* out) const {
  groups_->ScoreNearest(rows, probes, centroid_scores, pool, out);
}

int64_t CentroidCodebook::MemoryBytes() const {
  int64_t bytes = static_cast<int64_t>(centroids_.size() * sizeof(float));
  bytes += dim_ * ((int64_t{1} << codec_.nbits()) * 2 - 1) * static_cast<int64_t>(sizeof(float));
  if (groups_ != nullptr) bytes += groups_->MemoryBytes();
  return bytes;
}

}  // namespace tessera::internal
