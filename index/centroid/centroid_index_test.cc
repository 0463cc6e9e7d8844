// CentroidCodebook and CentroidIndex against brute-force references: nearest-centroid assignment,
// deterministic training, the byte form, and search scores equal to a direct evaluation of the
// documented approximation (and, within the lookup tables' quantisation bound, to MaxSim over the
// decoded vectors when every centroid is probed); tombstones, compaction, replacement and filters.
#include "index/centroid/centroid_index.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/centroid/code_scan.h"
#include "index/common/crc32.h"
#include "index/common/thread_pool.h"
#include "index/kernels/query_similarity.h"

namespace tessera::internal {
namespace {

void Normalize(float* v, int64_t dim) {
  double norm = 0.0;
  for (int64_t k = 0; k < dim; ++k) norm += double{v[k]} * v[k];
  for (int64_t k = 0; k < dim; ++k) v[k] = static_cast<float>(v[k] / std::sqrt(norm));
}

// Unit vectors around `topics` random directions (noise of norm ~0.5); the directions depend on
// (topics, dim) only, so that samples drawn with different seeds share them.
std::vector<float> Clustered(int64_t n, int64_t dim, int topics, uint64_t seed) {
  std::mt19937_64 topic_rng(topics * 1000003 + dim);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> centers(topics * dim);
  for (float& v : centers) v = normal(topic_rng);
  for (int t = 0; t < topics; ++t) Normalize(&centers[t * dim], dim);
  std::uniform_int_distribution<int> topic(0, topics - 1);
  std::vector<float> x(n * dim);
  const float noise = 0.5f / std::sqrt(static_cast<float>(dim));
  for (int64_t i = 0; i < n; ++i) {
    const int t = topic(rng);
    for (int64_t k = 0; k < dim; ++k) x[i * dim + k] = centers[t * dim + k] + noise * normal(rng);
    Normalize(&x[i * dim], dim);
  }
  return x;
}

double Dot(const float* a, const float* b, int64_t dim) {
  double s = 0.0;
  for (int64_t k = 0; k < dim; ++k) s += double{a[k]} * b[k];
  return s;
}

// A token's margin in whole units (centroid_index.h, MarginLevelCap) from `units`, the margin in
// units plus ½: rounded to the nearest, at least one when positive, at most `cap`.
int64_t MarginLevel(double units, int cap) {
  const int64_t nearest = std::clamp<int64_t>(static_cast<int64_t>(std::floor(units)), 0, cap);
  return units > 0.5 ? std::max<int64_t>(nearest, 1) : nearest;
}

// Whether `units` lies within 1/1000 of a unit of a boundary between two levels (½: none or one;
// 2, 3, … cap: one more), where the index's float arithmetic may round it either way.
bool AmbiguousLevel(double units, int cap) {
  constexpr double kSlack = 1e-3;
  if (std::abs(units - 0.5) < kSlack) return true;
  return units > 1.5 && units < cap + kSlack && std::abs(units - std::round(units)) < kSlack;
}

// The highest margin a token could reach (centroid_index.h, MarginLevelCap): its best probed
// centroid's score `top` + the tables' bias + step · the sum of each nibble's highest level, less
// its estimate `missing`.
double TokenReach(const ScanTables& tables, int64_t nibbles, double top, double missing) {
  int64_t levels = 0;
  for (int64_t n = 0; n < nibbles; ++n) {
    levels += *std::max_element(&tables.levels[n * 16], &tables.levels[n * 16] + 16);
  }
  return top + tables.bias + double{tables.step} * static_cast<double>(levels) - missing;
}

uint32_t BruteNearest(const CentroidCodebook& codebook, const float* v) {
  uint32_t best = 0;
  double best_score = -1e30;
  for (int64_t c = 0; c < codebook.num_centroids(); ++c) {
    const double s = Dot(v, codebook.centroids() + c * codebook.dim(), codebook.dim());
    if (s > best_score) best_score = s, best = static_cast<uint32_t>(c);
  }
  return best;
}

std::unique_ptr<CentroidCodebook> TrainOrDie(const std::vector<float>& sample, int64_t dim,
                                             int64_t centroids, int nbits, ThreadPool* pool,
                                             int iterations = 6) {
  CentroidTrainingOptions options;
  options.num_centroids = centroids;
  options.nbits = nbits;
  options.iterations = iterations;
  auto codebook = CentroidCodebook::Train(
      FloatMatrixView{sample.data(), static_cast<int64_t>(sample.size()) / dim, dim}, options,
      pool);
  EXPECT_TRUE(codebook.ok()) << codebook.status();
  return std::move(codebook).value();
}

TEST(CentroidCodebook, ExactAssignmentIsTheNearestCentroid) {
  const int64_t dim = 32;
  const std::vector<float> sample = Clustered(3000, dim, 40, 1);
  ThreadPool pool(2);
  auto codebook = TrainOrDie(sample, dim, 64, 2, &pool);
  ASSERT_EQ(codebook->num_centroids(), 64);
  const std::vector<float> x = Clustered(500, dim, 40, 2);
  std::vector<uint32_t> ids(500);
  std::vector<uint8_t> codes(500 * codebook->codec().code_bytes());
  codebook->Encode(FloatMatrixView{x.data(), 500, dim}, ids.data(), codes.data());
  for (int i = 0; i < 500; ++i) ASSERT_EQ(ids[i], BruteNearest(*codebook, &x[i * dim])) << i;
  // Decoding lands closer to the vector than its centroid alone does.
  std::vector<float> decoded(dim);
  double with_residual = 0.0, centroid_only = 0.0;
  for (int i = 0; i < 500; ++i) {
    codebook->Decode(ids[i], &codes[i * codebook->codec().code_bytes()], decoded.data());
    const float* c = codebook->centroids() + ids[i] * dim;
    for (int64_t k = 0; k < dim; ++k) {
      with_residual += std::pow(decoded[k] - x[i * dim + k], 2);
      centroid_only += std::pow(c[k] - x[i * dim + k], 2);
    }
  }
  EXPECT_LT(with_residual, 0.3 * centroid_only);
}

TEST(CentroidCodebook, GroupedAssignmentOfLargeCodebooksAgreesWithBruteForce) {
  const int64_t dim = 16;
  const int64_t centroids = CentroidCodebook::kExactAssignmentCentroids * 2;
  const std::vector<float> sample = Clustered(centroids * 2, dim, 1000, 3);
  ThreadPool pool(2);
  auto codebook = TrainOrDie(sample, dim, centroids, 2, &pool, 2);
  const std::vector<float> x = Clustered(2000, dim, 1000, 4);
  std::vector<uint32_t> ids(2000);
  std::vector<uint8_t> codes(2000 * codebook->codec().code_bytes());
  codebook->Encode(FloatMatrixView{x.data(), 2000, dim}, ids.data(), codes.data());
  int agree = 0;
  for (int i = 0; i < 2000; ++i) agree += ids[i] == BruteNearest(*codebook, &x[i * dim]);
  EXPECT_GE(agree, 0.95 * 2000);
}

TEST(CentroidCodebook, GroupedAssignmentIsTheBestCentroidOfTheEightNearestGroups) {
  // CentroidGroups' contract, exactly: a vector's centroid is the best-scoring member (ties: the
  // lower id) of its 8 best groups, which ScoreNearCentroids lists with the same products.
  constexpr int kAssignedGroups = 8;
  const int64_t dim = 40;  // not a multiple of the kernels' widths
  const int64_t centroids = CentroidCodebook::kExactAssignmentCentroids * 4;
  const std::vector<float> sample = Clustered(centroids * 4, dim, 300, 5);
  ThreadPool pool(2);
  auto codebook = TrainOrDie(sample, dim, centroids, 4, &pool, 2);
  ASSERT_TRUE(codebook->has_groups());
  const int64_t n = 3000;  // more than one assignment block
  const std::vector<float> x = Clustered(n, dim, 300, 6);
  std::vector<uint32_t> ids(n);
  std::vector<uint8_t> codes(n * codebook->codec().code_bytes());
  codebook->Encode(FloatMatrixView{x.data(), n, dim}, ids.data(), codes.data());
  std::vector<std::vector<std::pair<float, uint32_t>>> near;
  codebook->ScoreNearCentroids(FloatMatrixView{x.data(), n, dim}, kAssignedGroups, nullptr, nullptr,
                               &near);
  ASSERT_EQ(near.size(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_FALSE(near[i].empty());
    const auto best =
        std::min_element(near[i].begin(), near[i].end(), [](const auto& a, const auto& b) {
          return a.first != b.first ? a.first > b.first : a.second < b.second;
        });
    ASSERT_EQ(ids[i], best->second) << "row " << i;
  }
}

TEST(CentroidCodebook, NearCentroidsHoldTheBestAndScoreThemExactly) {
  // A query token's ProbedGroups(nprobe) nearest groups (16 of 128) against every centroid
  // scored: the same scores bit for bit (the same micro-kernel products), and almost all of its
  // nprobe best. All the tokens scored at once (over a pool, a group's members once for all the
  // tokens that probe it) give each token what it gets alone, and reading the members' scores
  // from a table gives the same.
  const int64_t dim = 32;
  const int64_t centroids = CentroidCodebook::kExactAssignmentCentroids * 8;
  const std::vector<float> sample = Clustered(centroids * 8, dim, 200, 3);
  ThreadPool pool(2);
  auto codebook = TrainOrDie(sample, dim, centroids, 2, &pool, 4);
  ASSERT_TRUE(codebook->has_groups());
  const int nprobe = 32;
  const int64_t n = 200;
  const std::vector<float> queries = Clustered(n, dim, 200, 9);
  const QuerySimilarity similarity(FloatMatrixView{queries.data(), n, dim});
  std::vector<float> all(centroids * similarity.stride());
  codebook->ScoreCentroids(similarity, all.data());
  auto better = [](const std::pair<float, uint32_t>& a, const std::pair<float, uint32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  std::vector<std::vector<std::pair<float, uint32_t>>> all_near;
  codebook->ScoreNearCentroids(FloatMatrixView{queries.data(), n, dim}, ProbedGroups(nprobe),
                               nullptr, &pool, &all_near);
  ASSERT_EQ(all_near.size(), static_cast<size_t>(n));
  std::vector<float> token_major(n * centroids);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < centroids; ++c) {
      token_major[i * centroids + c] = all[c * similarity.stride() + i];
    }
  }
  std::vector<std::vector<std::pair<float, uint32_t>>> from_table;
  codebook->ScoreNearCentroids(FloatMatrixView{queries.data(), n, dim}, ProbedGroups(nprobe),
                               token_major.data(), &pool, &from_table);
  ASSERT_EQ(from_table, all_near);
  int64_t found = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<std::pair<float, uint32_t>> near = all_near[i];
    std::vector<std::vector<std::pair<float, uint32_t>>> alone;
    codebook->ScoreNearCentroids(FloatMatrixView{&queries[i * dim], 1, dim}, ProbedGroups(nprobe),
                                 nullptr, nullptr, &alone);
    ASSERT_EQ(alone.size(), 1u);
    std::vector<std::pair<float, uint32_t>> alone_sorted = alone[0], near_sorted = near;
    std::sort(alone_sorted.begin(), alone_sorted.end(), better);
    std::sort(near_sorted.begin(), near_sorted.end(), better);
    ASSERT_EQ(alone_sorted, near_sorted) << "token " << i;
    ASSERT_GE(near.size(), static_cast<size_t>(nprobe));
    ASSERT_LT(near.size(), static_cast<size_t>(centroids / 4));  // a subset, not all of them
    for (const auto& [score, c] : near) {
      ASSERT_EQ(score, all[c * similarity.stride() + i]) << "token " << i << " centroid " << c;
    }
    std::vector<std::pair<float, uint32_t>> exact;
    for (int64_t c = 0; c < centroids; ++c) {
      exact.emplace_back(all[c * similarity.stride() + i], static_cast<uint32_t>(c));
    }
    std::partial_sort(exact.begin(), exact.begin() + nprobe, exact.end(), better);
    std::partial_sort(near.begin(), near.begin() + nprobe, near.end(), better);
    std::set<uint32_t> best;
    for (int p = 0; p < nprobe; ++p) best.insert(exact[p].second);
    for (int p = 0; p < nprobe; ++p) found += best.count(near[p].second);
  }
  // 99.98% here. Where a token's nprobe best are near-ties over unrelated directions (1,000
  // topics for 8,192 centroids: beyond its own topic's ~8) the groups hold ~86% of them.
  EXPECT_GE(found, 0.98 * n * nprobe);
}

TEST(CentroidCodebook, TrainingIsDeterministicAcrossThreadCountsAndRoundTrips) {
  const int64_t dim = 24;
  const std::vector<float> sample = Clustered(2000, dim, 30, 5);
  ThreadPool one(1), two(2);
  const std::string a = TrainOrDie(sample, dim, 50, 4, &one)->Serialize();
  const std::string b = TrainOrDie(sample, dim, 50, 4, &two)->Serialize();
  EXPECT_EQ(a, b);
  auto parsed = CentroidCodebook::Parse(a);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ((*parsed)->Serialize(), a);
  std::string corrupt = a;
  corrupt[corrupt.size() / 2] ^= 1;
  EXPECT_EQ(CentroidCodebook::Parse(corrupt).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(CentroidCodebook::Parse(a.substr(0, 20)).status().code(), absl::StatusCode::kDataLoss);
}

// tests/fuzz/centroid_codebook_fuzzer: a codebook with a non-finite centroid and a valid checksum
// parsed (corpus/centroid_codebook/regression-inf-centroid); training never writes one.
TEST(CentroidCodebook, ParseRejectsNonFiniteCentroids) {
  const int64_t dim = 8;
  const std::vector<float> sample = Clustered(200, dim, 4, 7);
  const std::string good = TrainOrDie(sample, dim, 4, 2, nullptr)->Serialize();
  constexpr size_t kFirstCentroid = 24;  // "TSCB", u32 version, i64 dim, i64 count
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::string damaged = good;
    std::memcpy(&damaged[kFirstCentroid + 3 * sizeof(float)], &bad, sizeof(bad));
    const uint32_t crc = Crc32(absl::string_view(damaged).substr(0, damaged.size() - 4));
    std::memcpy(&damaged[damaged.size() - 4], &crc, sizeof(crc));
    const auto parsed = CentroidCodebook::Parse(damaged);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss) << bad;
    EXPECT_NE(parsed.status().message().find("centroid 0 value 3"), std::string::npos)
        << parsed.status();
  }
}

TEST(CentroidCodebook, RejectsBadOptions) {
  const std::vector<float> sample = Clustered(100, 8, 4, 6);
  CentroidTrainingOptions options;
  options.num_centroids = 0;
  EXPECT_EQ(CentroidCodebook::Train(FloatMatrixView{sample.data(), 100, 8}, options, nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  options.num_centroids = 8;
  options.nbits = 3;
  EXPECT_EQ(CentroidCodebook::Train(FloatMatrixView{sample.data(), 100, 8}, options, nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Mean over `x` (n × dim) of the squared distance to its nearest centroid (brute force).
double QuantizationError(const CentroidCodebook& codebook, const std::vector<float>& x) {
  const int64_t dim = codebook.dim();
  const int64_t n = static_cast<int64_t>(x.size()) / dim;
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float* c = codebook.centroids() + BruteNearest(codebook, &x[i * dim]) * dim;
    for (int64_t k = 0; k < dim; ++k) total += std::pow(double{x[i * dim + k]} - c[k], 2);
  }
  return total / static_cast<double>(n);
}

// The two-level training (cells of ~√C, a k-means inside each) against one flat k-means of as
// many centroids over the same sample: held-out quantisation error within 10% (measured: 1.01×
// here), the cells stored as the codebook's groups, and their byte form round trips as version 2.
TEST(CentroidCodebook, TwoLevelTrainingIsWithinTenPercentOfFlatKMeans) {
  const int64_t dim = 32;
  const int64_t centroids = CentroidCodebook::kExactAssignmentCentroids * 2;
  const std::vector<float> sample = Clustered(centroids * 16, dim, 300, 11);
  const std::vector<float> held_out = Clustered(4000, dim, 300, 12);
  ThreadPool pool(2);
  CentroidTrainingOptions options;
  options.num_centroids = centroids;
  const FloatMatrixView view{sample.data(), static_cast<int64_t>(sample.size()) / dim, dim};
  auto two_level = CentroidCodebook::Train(view, options, &pool);
  options.two_level = false;
  auto flat = CentroidCodebook::Train(view, options, &pool);
  ASSERT_TRUE(two_level.ok() && flat.ok()) << two_level.status() << flat.status();
  ASSERT_EQ((*two_level)->num_centroids(), centroids);
  EXPECT_EQ((*two_level)->stored_groups(), 64);  // the least power of two whose square ≥ 2,048
  EXPECT_EQ((*flat)->stored_groups(), 0);
  const double two_level_error = QuantizationError(**two_level, held_out);
  const double flat_error = QuantizationError(**flat, held_out);
  std::cout << "quantisation error: two-level " << two_level_error << ", flat " << flat_error
            << " (" << two_level_error / flat_error << "x)\n";
  EXPECT_LE(two_level_error, 1.1 * flat_error);

  const std::string bytes = (*two_level)->Serialize();
  uint32_t version = 0;
  std::memcpy(&version, bytes.data() + 4, sizeof(version));
  EXPECT_EQ(version, 2u);
  auto parsed = CentroidCodebook::Parse(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ((*parsed)->stored_groups(), 64);
  EXPECT_EQ((*parsed)->Serialize(), bytes);
  // The same groups: the same assignment.
  const std::vector<float> x = Clustered(1000, dim, 300, 13);
  std::vector<uint32_t> a(1000), b(1000);
  std::vector<uint8_t> codes(1000 * (*parsed)->codec().code_bytes());
  (*two_level)->Encode(FloatMatrixView{x.data(), 1000, dim}, a.data(), codes.data());
  (*parsed)->Encode(FloatMatrixView{x.data(), 1000, dim}, b.data(), codes.data());
  EXPECT_EQ(a, b);
  int agree = 0;
  for (int i = 0; i < 1000; ++i) agree += a[i] == BruteNearest(**parsed, &x[i * dim]);
  EXPECT_GE(agree, 0.95 * 1000);

  // A flat training's codebook keeps version 1 (the format every stored codebook so far has),
  // its groups formed at load as before.
  const std::string v1 = (*flat)->Serialize();
  std::memcpy(&version, v1.data() + 4, sizeof(version));
  EXPECT_EQ(version, 1u);
  auto parsed_v1 = CentroidCodebook::Parse(v1);
  ASSERT_TRUE(parsed_v1.ok()) << parsed_v1.status();
  EXPECT_TRUE((*parsed_v1)->has_groups());
  EXPECT_EQ((*parsed_v1)->stored_groups(), 0);
  EXPECT_EQ((*parsed_v1)->Serialize(), v1);
}

TEST(CentroidCodebook, TwoLevelTrainingIsDeterministicAcrossThreadCounts) {
  const int64_t dim = 16;
  const int64_t centroids = CentroidCodebook::kExactAssignmentCentroids * 2;
  const std::vector<float> sample = Clustered(centroids * 8, dim, 100, 14);
  ThreadPool one(1), two(2);
  EXPECT_EQ(TrainOrDie(sample, dim, centroids, 2, &one)->Serialize(),
            TrainOrDie(sample, dim, centroids, 2, &two)->Serialize());
}

// Version 2's group section is checked like the rest: offsets that do not run from 0 to C in
// order, or a count that does not fit the bytes, are DATA_LOSS.
TEST(CentroidCodebook, ParseRejectsBadStoredGroups) {
  const int64_t dim = 8;
  const int64_t centroids = CentroidCodebook::kExactAssignmentCentroids * 2;
  const std::vector<float> sample = Clustered(centroids * 4, dim, 50, 15);
  const std::string good = TrainOrDie(sample, dim, centroids, 2, nullptr, 2)->Serialize();
  const int64_t groups = 64;
  const size_t offsets_at = good.size() - 4 - (groups + 1) * sizeof(int64_t);
  const size_t count_at = offsets_at - groups * dim * sizeof(float) - sizeof(int64_t);
  auto damage = [&](size_t at, int64_t value) {
    std::string damaged = good;
    std::memcpy(&damaged[at], &value, sizeof(value));
    const uint32_t crc = Crc32(absl::string_view(damaged).substr(0, damaged.size() - 4));
    std::memcpy(&damaged[damaged.size() - 4], &crc, sizeof(crc));
    return CentroidCodebook::Parse(damaged).status();
  };
  EXPECT_TRUE(damage(count_at, groups).ok());
  EXPECT_EQ(damage(count_at, groups + 1).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(damage(count_at, 0).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(damage(count_at, -1).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(damage(offsets_at, 1).code(), absl::StatusCode::kDataLoss);  // starts past 0
  EXPECT_EQ(damage(offsets_at + groups * sizeof(int64_t), centroids - 1).code(),
            absl::StatusCode::kDataLoss);  // ends short of C
  const absl::Status backwards = damage(offsets_at + 10 * sizeof(int64_t), centroids);
  EXPECT_EQ(backwards.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(backwards.message().find("group 10 ends"), std::string::npos) << backwards;
}

TEST(SquareRootNumCentroids, FollowsThePowerOfTwoRule) {
  EXPECT_EQ(SquareRootNumCentroids(1'280'000, 4.0, 1, 1 << 20), 4096);     // 4·√1.28M = 4525
  EXPECT_EQ(SquareRootNumCentroids(64'000'000, 16.0, 1, 1 << 20), 65536);  // PLAID's rule
  EXPECT_EQ(SquareRootNumCentroids(10, 4.0, 256, 16384), 256);
  EXPECT_EQ(SquareRootNumCentroids(int64_t{1} << 40, 4.0, 256, 16384), 16384);
  EXPECT_EQ(SquareRootNumCentroids(64'000'000), 32768);  // the previous default at 1M documents
  EXPECT_EQ(SquareRootNumCentroids(16'384), 1024);
}

// Sets the sizing rule for one scope and restores the one before it.
class ScopedCentroidSizing {
 public:
  explicit ScopedCentroidSizing(CentroidSizing sizing) : previous_(GetCentroidSizing()) {
    SetCentroidSizingForTesting(sizing);
  }
  ~ScopedCentroidSizing() { SetCentroidSizingForTesting(previous_); }

 private:
  const CentroidSizing previous_;
};

TEST(ListLengthNumCentroids, KeepsTheAverageListBetween128And256Vectors) {
  EXPECT_EQ(ListLengthNumCentroids(640'000), 4096);        // 10k documents of 64 vectors: 156
  EXPECT_EQ(ListLengthNumCentroids(1'280'000), 8192);      // 20k: 156
  EXPECT_EQ(ListLengthNumCentroids(6'400'000), 32768);     // 100k: 195
  EXPECT_EQ(ListLengthNumCentroids(64'000'000), 262144);   // 1M: 244
  EXPECT_EQ(ListLengthNumCentroids(192'000'000), 262144);  // 3M: capped (kMaxCentroids), 732
  EXPECT_EQ(ListLengthNumCentroids(10), kMinCentroids);
  EXPECT_EQ(ListLengthNumCentroids(32'768), 256);
  EXPECT_EQ(ListLengthNumCentroids(65'535), 256);
  EXPECT_EQ(ListLengthNumCentroids(65'536), 512);
  EXPECT_EQ(ListLengthNumCentroids(1'000'000, 64, 1, 1 << 20), 8192);  // 15,625 → 2^13
  for (int64_t vectors = 32'768; vectors <= (int64_t{1} << 25); vectors = vectors * 3 / 2) {
    const int64_t c = ListLengthNumCentroids(vectors);
    EXPECT_GE(vectors / c, 128) << vectors;
    EXPECT_LT(vectors / c, 256) << vectors;
    EXPECT_EQ(c & (c - 1), 0) << vectors;  // a power of two
  }
}

TEST(DefaultNumCentroids, FollowsTheSelectedRule) {
  EXPECT_EQ(GetCentroidSizing(), CentroidSizing::kSquareRoot);
  EXPECT_EQ(DefaultNumCentroids(64'000'000), 32768);
  EXPECT_EQ(DefaultNumCentroids(6'400'000), 16384);
  EXPECT_EQ(DefaultNumCentroids(16'384), 1024);
  {
    ScopedCentroidSizing list_length(CentroidSizing::kListLength);
    EXPECT_EQ(DefaultNumCentroids(64'000'000), 262144);
    EXPECT_EQ(DefaultNumCentroids(6'400'000), 32768);
    EXPECT_EQ(DefaultNumCentroids(16'384), kMinCentroids);
  }
  EXPECT_EQ(DefaultNumCentroids(64'000'000), 32768);
}

TEST(TrainingSampleVectors, ThirtyTwoPerCentroidWithinAGibibyte) {
  EXPECT_EQ(TrainingSampleVectors(32768, 64'000'000, 128), 32768 * 32);        // 512 MiB
  EXPECT_EQ(TrainingSampleVectors(262144, 64'000'000, 128), 2 * 1024 * 1024);  // 1 GiB: 8 each
  EXPECT_EQ(TrainingSampleVectors(262144, 64'000'000, 1024), 262144 * 8);      // never under 8
  EXPECT_EQ(TrainingSampleVectors(4096, 100'000, 128), 100'000);  // at most the shard's vectors
  EXPECT_EQ(TrainingSampleVectors(4096, 10'000'000, 384), 4096 * 32);
}

// A shard's worth of documents and the brute-force reading of the index's definition.
class CentroidIndexTest : public ::testing::Test {
 protected:
  static constexpr int64_t kDim = 32;
  static constexpr int kTokens = 12;

  void SetUp() override {
    const std::vector<float> sample = Clustered(4000, kDim, 50, 7);
    codebook_ = std::shared_ptr<const CentroidCodebook>(TrainOrDie(sample, kDim, 64, 2, &pool_));
    // Lists of the codebook's own 2-bit codes, so that probing every centroid is MaxSim over the
    // decoded vectors (the default 1-bit scan is tested below).
    index_ = std::make_unique<CentroidIndex>(codebook_, /*scan_nbits=*/2);
    for (uint64_t doc = 1; doc <= 300; ++doc) AddDocument(*index_, doc, doc);
  }

  void AddDocument(CentroidIndex& index, uint64_t doc, uint64_t seed, int topics = 50) {
    std::vector<float> vectors = Clustered(kTokens, kDim, topics, 1000 + seed);
    DocumentCodes codes = index.Encode(FloatMatrixView{vectors.data(), kTokens, kDim});
    ASSERT_TRUE(index.Add(doc, codes).ok());
    docs_[doc] = codes;
  }

  // Token i's quantised lookup tables (code_scan.h), as the index builds them.
  ScanTables Tables(const float* token) const {
    const ResidualCodec& codec = ScanCodec();
    std::vector<float> lut(codec.nibbles() * 16);
    codec.BuildLookupTable(token, lut.data());
    ScanTables tables;
    QuantizeScanTables(lut.data(), codec.nibbles(), &tables);
    return tables;
  }

  // Σ_i nibbles · step_i / 2: how far the quantised tables may move a document's score.
  double QuantisationBound(const std::vector<float>& query) const {
    double bound = 0.0;
    for (size_t i = 0; i < query.size() / kDim; ++i) {
      bound += ScanCodec().nibbles() * Tables(&query[i * kDim]).step * 0.5;
    }
    return bound;
  }

  // Token i's nprobe best centroids (ties: lower id) in probed[i], its last one's score in
  // missing[i] and its first one's in top[i] (when asked); with groups, among the centroids of its
  // ProbedGroups(nprobe) nearest groups.
  void Probes(const std::vector<float>& query, int nprobe, std::vector<std::set<uint32_t>>* probed,
              std::vector<double>* missing, std::vector<double>* top = nullptr) const {
    const int64_t nq = static_cast<int64_t>(query.size()) / kDim;
    const int64_t C = codebook_->num_centroids();
    probed->assign(nq, {});
    missing->assign(nq, 0.0);
    for (int64_t i = 0; i < nq; ++i) {
      std::vector<std::pair<double, uint32_t>> ranked;
      if (codebook_->has_groups()) {  // the candidates are the nearest groups' centroids
        // One row at a time, without a pool: the search scores all its tokens' groups at once.
        std::vector<std::vector<std::pair<float, uint32_t>>> near;
        codebook_->ScoreNearCentroids(FloatMatrixView{&query[i * kDim], 1, kDim},
                                      ProbedGroups(nprobe), nullptr, nullptr, &near);
        for (const auto& [score, c] : near[0]) {
          ranked.push_back({Dot(&query[i * kDim], codebook_->centroids() + c * kDim, kDim), c});
        }
      } else {
        for (int64_t c = 0; c < C; ++c) {
          ranked.push_back({Dot(&query[i * kDim], codebook_->centroids() + c * kDim, kDim),
                            static_cast<uint32_t>(c)});
        }
      }
      std::sort(ranked.begin(), ranked.end(), [](auto& a, auto& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
      });
      for (int p = 0; p < nprobe; ++p) (*probed)[i].insert(ranked[p].second);
      (*missing)[i] = ranked[nprobe - 1].first;
      if (top != nullptr) top->push_back(ranked[0].first);
    }
  }

  // The query's margin unit (centroid_index.h, MarginLevelCap): the highest TokenReach of its
  // tokens over the cap.
  double MarginUnit(const std::vector<ScanTables>& tables, const std::vector<double>& top,
                    const std::vector<double>& missing) const {
    double reach = 0.0;
    for (size_t i = 0; i < tables.size(); ++i) {
      reach = std::max(reach, TokenReach(tables[i], ScanCodec().nibbles(), top[i], missing[i]));
    }
    const double unit = reach / MarginLevelCap(static_cast<int64_t>(tables.size()));
    return unit > 0.0 ? unit : 1.0;
  }

  // A document's documented score, and its tokens whose margin lies on a rounding boundary
  // (AmbiguousLevel): float arithmetic may round those either way, a unit up or down each.
  struct ReferenceHit {
    uint64_t doc = 0;
    double score = 0.0;
    int ambiguous = 0;
  };

  // The documented score, best first (ties: lower id), of every accepted document with a vector
  // above its token's estimate for some token (or that may have one: an ambiguous margin): Σ_i
  // token i's estimate (its last probed centroid's score) + its margin — the best over the
  // document's vectors in token i's probed lists of ⟨q_i, centroid⟩ + the quantised table score
  // of its code, less the estimate, in whole margin units (MarginLevel). With `quantised` false:
  // Σ_i max(estimate, the best ⟨q_i, decoded vector⟩), without tables or units. `unit`: the
  // margin unit.
  std::vector<ReferenceHit> Reference(const std::vector<float>& query, int nprobe,
                                      const std::function<bool(uint64_t)>& accept,
                                      bool quantised = true, double* unit = nullptr) const {
    const int64_t nq = static_cast<int64_t>(query.size()) / kDim;
    std::vector<ScanTables> tables;
    for (int64_t i = 0; i < nq; ++i) tables.push_back(Tables(&query[i * kDim]));
    std::vector<std::set<uint32_t>> probed;
    std::vector<double> missing;
    std::vector<double> top;
    Probes(query, nprobe, &probed, &missing, &top);
    const double margin_unit = MarginUnit(tables, top, missing);
    if (unit != nullptr) *unit = margin_unit;
    const int cap = MarginLevelCap(nq);
    std::vector<ReferenceHit> hits;
    std::vector<float> decoded(kDim);
    const int64_t code_bytes = codebook_->codec().code_bytes();
    std::vector<uint8_t> coarse(ScanCodec().code_bytes());
    for (const auto& [doc, codes] : docs_) {
      if (!accept(doc)) continue;
      ReferenceHit hit{doc, 0.0, 0};
      int64_t levels = 0;
      bool found_any = false;
      for (int64_t i = 0; i < nq; ++i) {
        double best = -1e30;
        for (int64_t v = 0; v < codes.size(); ++v) {
          if (!probed[i].count(codes.centroids[v])) continue;
          const auto* code = reinterpret_cast<const uint8_t*>(codes.codes.data()) + v * code_bytes;
          double score = 0.0;
          if (quantised) {
            const uint8_t* scanned = code;
            if (ScanCodec().nbits() != codebook_->codec().nbits()) {
              codebook_->codec().CoarsenCode(code, ScanCodec().nbits(), coarse.data());
              scanned = coarse.data();
            }
            int64_t table_levels = 0;
            for (int64_t j = 0; j < ScanCodec().code_bytes(); ++j) {
              table_levels += tables[i].levels[2 * j * 16 + (scanned[j] & 15)] +
                              tables[i].levels[(2 * j + 1) * 16 + (scanned[j] >> 4)];
            }
            score =
                Dot(&query[i * kDim], codebook_->centroids() + codes.centroids[v] * kDim, kDim) +
                tables[i].bias + double{tables[i].step} * table_levels;
          } else {
            codebook_->Decode(codes.centroids[v], code, decoded.data());
            score = Dot(&query[i * kDim], decoded.data(), kDim);
          }
          best = std::max(best, score);
        }
        hit.score += missing[i];
        if (!quantised) {
          found_any |= best > missing[i];
          hit.score += std::max(best, missing[i]) - missing[i];
          continue;
        }
        const double units = (best - missing[i]) / margin_unit + 0.5;
        levels += MarginLevel(units, cap);
        if (AmbiguousLevel(units, cap)) {
          ++hit.ambiguous;
        }
      }
      if (quantised) {
        hit.score += margin_unit * static_cast<double>(levels);
        found_any = levels > 0 || hit.ambiguous > 0;
      }
      if (found_any) hits.push_back(hit);
    }
    std::sort(hits.begin(), hits.end(), [](const ReferenceHit& a, const ReferenceHit& b) {
      return a.score != b.score ? a.score > b.score : a.doc < b.doc;
    });
    return hits;
  }

  // A query of `tokens` tokens around `topics` directions (those of AddDocument's documents by
  // default), searched on `pool` (null: inline, one accumulation tile up to kMaxTileOrdinals) for
  // 40 documents: each hit is a document the reference keeps, at its score (to fp32 rounding, and a
  // unit per ambiguous token), in order; every document sure to score above the last hit is a hit;
  // and when no document is ambiguous, the hits are the reference's first 40, rank by rank.
  void ExpectMatchesReference(const CentroidIndex& index, int nprobe,
                              const std::function<bool(uint64_t)>* accept, uint64_t seed,
                              ThreadPool* pool, int topics = 50, int64_t tokens = 8) {
    const std::vector<float> query = Clustered(tokens, kDim, topics, seed);
    constexpr size_t kHits = 40;
    CentroidSearchOptions options;
    options.nprobe = nprobe;
    options.num_documents = kHits;
    absl::StatusOr<std::vector<CentroidHit>> hits =
        index.Search(FloatMatrixView{query.data(), tokens, kDim}, options, accept, pool);
    ASSERT_TRUE(hits.ok()) << hits.status();
    double unit = 0.0;
    const std::vector<ReferenceHit> expected = Reference(
        query, nprobe, accept ? *accept : [](uint64_t) { return true; }, true, &unit);
    std::map<uint64_t, ReferenceHit> by_doc;
    int ambiguous = 0;
    for (const ReferenceHit& hit : expected) {
      by_doc[hit.doc] = hit;
      ambiguous += hit.ambiguous;
    }
    constexpr double kRounding = 2e-4;  // fp32 sums of fp32 scores against doubles
    ASSERT_EQ(hits->size(), std::min(kHits, expected.size()));
    for (size_t r = 0; r < hits->size(); ++r) {
      const CentroidHit& hit = (*hits)[r];
      const auto it = by_doc.find(hit.doc);
      ASSERT_NE(it, by_doc.end()) << "rank " << r << ": document " << hit.doc;
      EXPECT_NEAR(hit.score, it->second.score, kRounding + unit * it->second.ambiguous)
          << "rank " << r;
      if (r > 0) {
        const CentroidHit& before = (*hits)[r - 1];
        EXPECT_TRUE(before.score > hit.score || (before.score == hit.score && before.doc < hit.doc))
            << "rank " << r;
      }
      if (ambiguous == 0) {
        EXPECT_EQ(hit.doc, expected[r].doc) << "rank " << r;
      }
    }
    if (hits->empty()) return;
    std::set<uint64_t> found;
    for (const CentroidHit& hit : *hits) found.insert(hit.doc);
    for (const ReferenceHit& hit : expected) {
      if (hit.score - unit * hit.ambiguous - kRounding > hits->back().score) {
        EXPECT_TRUE(found.count(hit.doc)) << "document " << hit.doc << " at " << hit.score;
      }
    }
  }

  // The codec index_ scans: the codebook's or a coarsening of it.
  const ResidualCodec& ScanCodec() const { return index_->scan_codec(); }

  ThreadPool pool_{2};
  std::shared_ptr<const CentroidCodebook> codebook_;
  std::unique_ptr<CentroidIndex> index_;
  std::map<uint64_t, DocumentCodes> docs_;
};

TEST_F(CentroidIndexTest, ProbingEveryCentroidGivesMaxSimOverDecodedVectors) {
  // With nprobe = C no token misses a document: the score is MaxSim over the decoded vectors, up
  // to the tables' quantisation (at most nibbles · step / 2 per token) and the margins' rounding
  // (half a unit per token).
  const int all = static_cast<int>(codebook_->num_centroids());
  ExpectMatchesReference(*index_, all, nullptr, 11, &pool_);
  const std::vector<float> query = Clustered(8, kDim, 50, 11);
  const auto any = [](uint64_t) { return true; };
  double unit = 0.0;
  const std::vector<ReferenceHit> quantised = Reference(query, all, any, true, &unit);
  const std::vector<ReferenceHit> decoded = Reference(query, all, any, false);
  std::map<uint64_t, double> exact;
  for (const ReferenceHit& hit : decoded) exact[hit.doc] = hit.score;
  const double bound = QuantisationBound(query) + 8 * unit / 2;
  EXPECT_GT(bound, 0.0);
  EXPECT_LT(bound, 0.1);  // small against scores of ~8 · 0.6
  ASSERT_EQ(quantised.size(), decoded.size());
  for (const ReferenceHit& hit : quantised) {
    ASSERT_NEAR(hit.score, exact.at(hit.doc), bound + 1e-4) << hit.doc;
  }
}

// A token adds at most MarginLevelCap units: 255, a byte, up to 257 tokens, and fewer beyond, so
// that the 16-bit sums of 1,024 tokens (the server's default limit) hold the documented scores.
TEST_F(CentroidIndexTest, LongQueriesKeepTheirSumsInSixteenBits) {
  EXPECT_EQ(MarginLevelCap(1), 255);
  EXPECT_EQ(MarginLevelCap(257), 255);
  EXPECT_EQ(MarginLevelCap(258), 254);
  EXPECT_EQ(MarginLevelCap(1024), 63);
  EXPECT_EQ(MarginLevelCap(kMaxCentroidQueryTokens), 1);
  ExpectMatchesReference(*index_, 8, nullptr, 61, &pool_, 50, 1024);
  ExpectMatchesReference(*index_, 8, nullptr, 62, &pool_, 50, 300);
  // Beyond kMaxCentroidQueryTokens a token could not add even one unit.
  const std::vector<float> huge((kMaxCentroidQueryTokens + 1) * kDim, 0.5f);
  const absl::StatusOr<std::vector<CentroidHit>> refused = index_->Search(
      FloatMatrixView{huge.data(), kMaxCentroidQueryTokens + 1, kDim}, {}, nullptr, &pool_);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("query of 65536 tokens"));
}

TEST_F(CentroidIndexTest, FewProbesMatchTheDocumentedApproximation) {
  for (int nprobe : {1, 3, 8})
    ExpectMatchesReference(*index_, nprobe, nullptr, 20 + nprobe, &pool_);
}

TEST_F(CentroidIndexTest, CoarsenedScansListTheTopBitsOfEachCode) {
  // A 4-bit index scanning 2 bits or 1 (the default) lists the codes' coarsening: stage 1 scores as
  // the documented approximation with the coarse codec's tables, on the coarsened codes. It keeps
  // nothing per vector beyond the list entry (ordinal + coarse code). The 2-bit fixture's lists
  // coarsen to 1 bit likewise.
  const std::vector<float> sample = Clustered(4000, kDim, 50, 7);
  for (const int codec_nbits : {4, 2}) {
    for (const int scan_nbits : {2, 1}) {
      if (scan_nbits >= codec_nbits) continue;
      SCOPED_TRACE(absl::StrCat(codec_nbits, "-bit codes scanned at ", scan_nbits));
      codebook_ = std::shared_ptr<const CentroidCodebook>(
          TrainOrDie(sample, kDim, 64, codec_nbits, &pool_));
      index_ = scan_nbits == kScanNbits ? std::make_unique<CentroidIndex>(codebook_)
                                        : std::make_unique<CentroidIndex>(codebook_, scan_nbits);
      docs_.clear();
      for (uint64_t doc = 1; doc <= 300; ++doc) AddDocument(*index_, doc, doc);
      ASSERT_EQ(index_->scan_codec().nbits(), scan_nbits);
      for (int nprobe : {1, 8, static_cast<int>(codebook_->num_centroids())}) {
        ExpectMatchesReference(*index_, nprobe, nullptr, 40 + nprobe, &pool_);
      }
      // Memory beyond the codebook: per vector its list entry (4 bytes of ordinal, the coarse
      // code) rounded up to whole scan blocks per list, per document its tables (ordinal → doc,
      // vectors, dead flag; doc → ordinal) — no copy of the full codes (code_bytes per vector).
      const CentroidIndexStats stats = index_->Stats();
      const int64_t lists = codebook_->num_centroids();
      const int64_t blocks_bound =
          (stats.vectors + lists * kScanBlockEntries) * index_->scan_codec().code_bytes() +
          lists * int64_t{sizeof(std::vector<uint8_t>) * 2};
      const int64_t bound =
          codebook_->MemoryBytes() + stats.vectors * 4 * 2 + blocks_bound + stats.documents * 64;
      EXPECT_LE(stats.memory_bytes, bound)
          << stats.vectors << " vectors, " << stats.documents << " documents";
      // Removing a third compacts the lists (kCompactionFraction); the scan still matches.
      for (uint64_t doc = 1; doc <= 100; ++doc) {
        index_->Remove(doc);
        docs_.erase(doc);
      }
      ExpectMatchesReference(*index_, 8, nullptr, 60, &pool_);
    }
  }
  // A scan width of the codec's own (or more) lists the codebook's codes.
  EXPECT_EQ(CentroidIndex(codebook_, 2).scan_codec().nbits(), 2);
  EXPECT_EQ(CentroidIndex(codebook_, 4).scan_codec().nbits(), 2);
}

TEST(CentroidIndexCoarsening, NarrowDimensionsListTheCoarsenedCodesToo) {
  // At dim 1 and 2 a 4-bit code and its 2-bit coarsening are both one byte (at dim ≤ 8 its 1-bit
  // one too): the lists must still hold the coarsened code the scan reads. Every centroid probed, a
  // one-token query: each document's score is the estimate (the last centroid's score) plus the
  // margin over it of the best over its vectors of ⟨q, centroid⟩ + the scan tables' score of the
  // coarsened code, in whole margin units (the documented approximation).
  ThreadPool pool(2);
  for (const auto& [dim, scan_nbits] : std::vector<std::pair<int64_t, int>>{
           {1, 2}, {2, 2}, {3, 2}, {1, 1}, {2, 1}, {3, 1}, {9, 1}}) {
    const std::vector<float> sample = Clustered(2000, dim, 8, 70 + dim);
    std::shared_ptr<const CentroidCodebook> codebook(TrainOrDie(sample, dim, 4, 4, &pool));
    CentroidIndex index(codebook, scan_nbits);
    ASSERT_EQ(index.scan_codec().nbits(), scan_nbits)
        << "dim " << dim << " at " << scan_nbits << " bits";
    const ResidualCodec& coarse = index.scan_codec();
    std::map<uint64_t, DocumentCodes> docs;
    for (uint64_t doc = 1; doc <= 60; ++doc) {
      const std::vector<float> vectors = Clustered(3, dim, 8, 500 + doc);
      DocumentCodes codes = index.Encode(FloatMatrixView{vectors.data(), 3, dim});
      ASSERT_TRUE(index.Add(doc, codes).ok());
      docs[doc] = std::move(codes);
    }
    const int C = static_cast<int>(codebook->num_centroids());
    const std::vector<float> query = Clustered(1, dim, 8, 99);
    std::vector<float> lut(coarse.nibbles() * 16);
    coarse.BuildLookupTable(query.data(), lut.data());
    ScanTables tables;
    QuantizeScanTables(lut.data(), coarse.nibbles(), &tables);
    double missing = 1e30;
    double top = -1e30;
    for (int c = 0; c < C; ++c) {
      const double score = Dot(query.data(), codebook->centroids() + c * dim, dim);
      missing = std::min(missing, score);
      top = std::max(top, score);
    }
    // The margin unit: the token's reach over MarginLevelCap(1).
    const double unit = TokenReach(tables, coarse.nibbles(), top, missing) / MarginLevelCap(1);
    // Per document with a positive margin: its score and whether its margin lies on a rounding
    // boundary (AmbiguousLevel).
    std::map<uint64_t, std::pair<double, bool>> expected;
    size_t maybe = 0;  // documents whose margin may or may not be positive

    std::vector<uint8_t> coarsened(coarse.code_bytes());
    const int64_t code_bytes = codebook->codec().code_bytes();
    for (const auto& [doc, codes] : docs) {
      double best = -1e30;
      for (int64_t v = 0; v < codes.size(); ++v) {
        codebook->codec().CoarsenCode(
            reinterpret_cast<const uint8_t*>(codes.codes.data()) + v * code_bytes, scan_nbits,
            coarsened.data());
        int64_t levels = 0;
        for (int64_t j = 0; j < coarse.code_bytes(); ++j) {
          levels += tables.levels[2 * j * 16 + (coarsened[j] & 15)] +
                    tables.levels[(2 * j + 1) * 16 + (coarsened[j] >> 4)];
        }
        best = std::max(best,
                        Dot(query.data(), codebook->centroids() + codes.centroids[v] * dim, dim) +
                            tables.bias + double{tables.step} * levels);
      }
      const double units = (best - missing) / unit + 0.5;
      const int64_t level = MarginLevel(units, MarginLevelCap(1));
      const bool ambiguous = AmbiguousLevel(units, MarginLevelCap(1));
      if (level > 0) expected[doc] = {missing + unit * static_cast<double>(level), ambiguous};
      if (units < 1.0 && ambiguous) ++maybe;
    }
    CentroidSearchOptions options;
    options.nprobe = C;
    options.num_documents = 60;
    absl::StatusOr<std::vector<CentroidHit>> hits =
        index.Search(FloatMatrixView{query.data(), 1, dim}, options, nullptr, &pool);
    ASSERT_TRUE(hits.ok()) << hits.status();
    ASSERT_GE(hits->size() + maybe, expected.size())
        << "dim " << dim << " at " << scan_nbits << " bits";
    ASSERT_LE(hits->size(), expected.size() + maybe);
    for (const CentroidHit& hit : *hits) {
      if (maybe > 0 && !expected.count(hit.doc)) continue;  // an ambiguous first unit
      ASSERT_TRUE(expected.count(hit.doc)) << "dim " << dim << " at " << scan_nbits << " bits"
                                           << ", document " << hit.doc;
      const auto& [score, ambiguous] = expected.at(hit.doc);
      EXPECT_NEAR(hit.score, score, 2e-4 + (ambiguous ? unit : 0.0))
          << "dim " << dim << " at " << scan_nbits << " bits"
          << ", document " << hit.doc;
    }
  }
}

TEST(DefaultNprobe, GrowsWithTheSquareRootOfTheCodebook) {
  EXPECT_EQ(DefaultNprobe(64), 16);
  EXPECT_EQ(DefaultNprobe(4096), 16);
  EXPECT_EQ(DefaultNprobe(8192), 24);   // √8192 / 5 = 18.1
  EXPECT_EQ(DefaultNprobe(16384), 32);  // 25.6
  EXPECT_EQ(DefaultNprobe(32768), 40);  // 36.2
  EXPECT_EQ(DefaultNprobe(65536), 56);  // 51.2
  EXPECT_EQ(DefaultNprobe(262144), 104);
  // Under the list-length rule: up to 32 (WARP's nprobe), whatever the codebook.
  ScopedCentroidSizing list_length(CentroidSizing::kListLength);
  EXPECT_EQ(DefaultNprobe(4096), 16);
  EXPECT_EQ(DefaultNprobe(8192), 24);
  EXPECT_EQ(DefaultNprobe(16384), 32);
  EXPECT_EQ(DefaultNprobe(32768), 32);
  EXPECT_EQ(DefaultNprobe(262144), 32);
}

TEST(DefaultNumCandidates, GrowsFromTheExactScansRuleToFortyPerHitThenWithTheShard) {
  EXPECT_EQ(DefaultNumCandidates(10, 16384), 100);  // below 2^18 vectors: max(10·k, 100)
  EXPECT_EQ(DefaultNumCandidates(1, 262144), 100);  // k < 10 asks for 10 hits' worth
  EXPECT_EQ(DefaultNumCandidates(50, 262144), 500);
  EXPECT_EQ(DefaultNumCandidates(10, 1048576), 200);   // 20 per hit at 2^20
  EXPECT_EQ(DefaultNumCandidates(10, 2560000), 313);   // 10·√9.77 = 31.25 per hit
  EXPECT_EQ(DefaultNumCandidates(10, 4194304), 400);   // 40 per hit from 2^22
  EXPECT_EQ(DefaultNumCandidates(10, 33554432), 400);  // 2^25: 40 per hit still
  EXPECT_EQ(DefaultNumCandidates(10, 64000000), 553);  // 1M documents: 40·√1.907 per hit
  EXPECT_EQ(DefaultNumCandidates(1000, 64000000), 55243);
  EXPECT_EQ(DefaultNumCandidates(10, 134217728), 800);  // 2^27: 80 per hit
  EXPECT_EQ(DefaultNumCandidates(10, 192000000), 957);  // 3M documents: 40·√5.722 per hit
}

TEST_F(CentroidIndexTest, NprobeZeroIsTheDefault) {
  const std::vector<float> query = Clustered(8, kDim, 50, 77);
  CentroidSearchOptions defaults, explicit_default, fewer;
  explicit_default.nprobe = DefaultNprobe(codebook_->num_centroids());
  fewer.nprobe = 2;
  const FloatMatrixView view{query.data(), 8, kDim};
  auto a = index_->Search(view, defaults, nullptr, &pool_);
  auto b = index_->Search(view, explicit_default, nullptr, &pool_);
  auto c = index_->Search(view, fewer, nullptr, &pool_);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_EQ(a->size(), b->size());
  for (size_t r = 0; r < a->size(); ++r) {
    EXPECT_EQ((*a)[r].doc, (*b)[r].doc);
    EXPECT_EQ((*a)[r].score, (*b)[r].score);
  }
  // And the setting matters: two probes score differently.
  EXPECT_NE((*a)[0].score, (*c)[0].score);
}

TEST_F(CentroidIndexTest, FiltersRunInsideTheSearch) {
  const std::function<bool(uint64_t)> odd = [](uint64_t doc) { return doc % 2 == 1; };
  ExpectMatchesReference(*index_, 4, &odd, 31, &pool_);
}

TEST_F(CentroidIndexTest, RemovedAndReplacedDocumentsAreNeverReturned) {
  // Remove 30% (past the compaction fraction) and replace 20 others with new content.
  for (uint64_t doc = 1; doc <= 300; doc += 3) {
    index_->Remove(doc);
    docs_.erase(doc);
  }
  for (uint64_t doc = 2; doc <= 60; doc += 3) AddDocument(*index_, doc, 5000 + doc);
  const CentroidIndexStats stats = index_->Stats();
  EXPECT_EQ(stats.documents, static_cast<int64_t>(docs_.size()));
  EXPECT_EQ(stats.vectors, static_cast<int64_t>(docs_.size()) * kTokens);
  EXPECT_LE(stats.dead_vectors,
            CentroidIndex::kCompactionFraction * (stats.vectors + stats.dead_vectors));
  for (int nprobe : {2, 64}) ExpectMatchesReference(*index_, nprobe, nullptr, 40 + nprobe, &pool_);
  std::vector<uint64_t> expected;
  for (const auto& [doc, codes] : docs_) expected.push_back(doc);
  EXPECT_EQ(index_->Documents(), expected);
  EXPECT_FALSE(index_->Contains(1));
  EXPECT_TRUE(index_->Contains(2));
}

TEST_F(CentroidIndexTest, OrdinalTilesDoNotChangeResults) {
  // 2,000 documents: 8 accumulation tiles of 256 ordinals with the 2-thread pool, 4 of 500
  // without one. Both must give the same hits, bit for bit, and the documented scores.
  for (uint64_t doc = 301; doc <= 2000; ++doc) AddDocument(*index_, doc, doc);
  for (uint64_t doc = 5; doc <= 2000; doc += 7) {  // dead ordinals in every tile
    index_->Remove(doc);
    docs_.erase(doc);
  }
  const std::vector<float> query = Clustered(8, kDim, 50, 77);
  const FloatMatrixView view{query.data(), 8, kDim};
  CentroidSearchOptions options;
  options.nprobe = 4;
  options.num_documents = 200;
  const auto pooled = index_->Search(view, options, nullptr, &pool_);
  const auto inline_search = index_->Search(view, options, nullptr, nullptr);
  ASSERT_TRUE(pooled.ok() && inline_search.ok());
  ASSERT_EQ(pooled->size(), 200u);
  ASSERT_EQ(inline_search->size(), 200u);
  for (size_t r = 0; r < pooled->size(); ++r) {
    EXPECT_EQ((*pooled)[r].doc, (*inline_search)[r].doc) << "rank " << r;
    EXPECT_EQ((*pooled)[r].score, (*inline_search)[r].score) << "rank " << r;
  }
  ExpectMatchesReference(*index_, 4, nullptr, 77, &pool_);
}

TEST_F(CentroidIndexTest, LargeCodebooksProbeTheirNearestGroups) {
  // 2,048 centroids (grouped): each token's probes come from its nearest groups' centroids; the
  // scores are still the documented reading over those probes.
  codebook_ = std::shared_ptr<const CentroidCodebook>(
      TrainOrDie(Clustered(8192, kDim, 1000, 17), kDim,
                 CentroidCodebook::kExactAssignmentCentroids * 2, 2, &pool_, 2));
  ASSERT_TRUE(codebook_->has_groups());
  index_ = std::make_unique<CentroidIndex>(codebook_);
  docs_.clear();
  for (uint64_t doc = 1; doc <= 400; ++doc) AddDocument(*index_, doc, doc);
  for (int nprobe : {8, 40}) ExpectMatchesReference(*index_, nprobe, nullptr, 91 + nprobe, &pool_);
}

// A token whose probed lists hold few entries against a tile's ordinals (fewer than one in
// kSparseFoldRatio) folds its margins into the sums entry by entry, not over the whole tile. 4,000
// documents of 12 vectors around 1,000 directions over 2,048 centroids (lists of ~23, the longest
// probed ~50): at nprobe 1 every token is below the ratio in the inline search's one tile of 4,000
// ordinals (under 125 entries), at 40 none is, and at 6 some are. Every fold gives the
// documented scores, and the same hits bit for bit in tiles of 2,000 (the pool's) and of 4,000.
TEST_F(CentroidIndexTest, SparseAndDenseFoldsGiveTheDocumentedScores) {
  codebook_ = std::shared_ptr<const CentroidCodebook>(
      TrainOrDie(Clustered(8192, kDim, 1000, 17), kDim,
                 CentroidCodebook::kExactAssignmentCentroids * 2, 2, &pool_, 2));
  index_ = std::make_unique<CentroidIndex>(codebook_);
  docs_.clear();
  constexpr int kTopics = 1000;
  constexpr uint64_t kDocs = 4000;
  for (uint64_t doc = 1; doc <= kDocs; ++doc) AddDocument(*index_, doc, doc, kTopics);
  std::map<uint32_t, int64_t> list_size;
  for (const auto& [doc, codes] : docs_) {
    for (uint32_t c : codes.centroids) ++list_size[c];
  }
  for (int nprobe : {1, 6, 40}) {
    const uint64_t seed = 300 + nprobe;
    const std::vector<float> query = Clustered(8, kDim, kTopics, seed);
    std::vector<std::set<uint32_t>> probed;
    std::vector<double> missing;
    Probes(query, nprobe, &probed, &missing);
    for (size_t i = 0; i < probed.size(); ++i) {
      int64_t entries = 0;
      for (uint32_t c : probed[i]) entries += list_size[c];
      const bool sparse = entries * kSparseFoldRatio < static_cast<int64_t>(kDocs);
      if (nprobe != 6) {
        EXPECT_EQ(sparse, nprobe == 1)
            << "nprobe " << nprobe << ", token " << i << ": " << entries << " entries";
      }
    }
    ExpectMatchesReference(*index_, nprobe, nullptr, seed, nullptr, kTopics);
    ExpectMatchesReference(*index_, nprobe, nullptr, seed, &pool_, kTopics);
    CentroidSearchOptions options;
    options.nprobe = nprobe;
    options.num_documents = 300;
    const FloatMatrixView view{query.data(), 8, kDim};
    const auto pooled = index_->Search(view, options, nullptr, &pool_);
    const auto inline_search = index_->Search(view, options, nullptr, nullptr);
    ASSERT_TRUE(pooled.ok() && inline_search.ok());
    ASSERT_EQ(pooled->size(), inline_search->size());
    for (size_t r = 0; r < pooled->size(); ++r) {
      EXPECT_EQ((*pooled)[r].doc, (*inline_search)[r].doc) << "nprobe " << nprobe << ", rank " << r;
      EXPECT_EQ((*pooled)[r].score, (*inline_search)[r].score)
          << "nprobe " << nprobe << ", rank " << r;
    }
  }
}

// Asked for the query × centroid table (for the stage 2 from codes), a search keeps
// QuerySimilarity's score of every centroid, token-major, and finds the same hits bit for bit: with
// groups, reading the probed groups' members from the table gives the scores that scoring the
// groups gave. 67 centroids: a count the table's 4 × 4 transposes do not divide (9 query rows
// neither). A grouped codebook beyond kMaxKeptTableCentroids keeps no table, with the same hits.
TEST_F(CentroidIndexTest, KeepsTheCentroidScoresWhenAskedWithTheSameHits) {
  const std::shared_ptr<const CentroidCodebook> grouped(
      TrainOrDie(Clustered(8192, kDim, 1000, 17), kDim,
                 CentroidCodebook::kExactAssignmentCentroids * 2, 2, &pool_, 2));
  ASSERT_TRUE(grouped->has_groups());
  ASSERT_FALSE(codebook_->has_groups());
  const std::shared_ptr<const CentroidCodebook> odd(
      TrainOrDie(Clustered(4096, kDim, 100, 23), kDim, 67, 2, &pool_));
  ASSERT_EQ(odd->num_centroids(), 67);
  const std::shared_ptr<const CentroidCodebook> large(
      TrainOrDie(Clustered(4 * kMaxKeptTableCentroids, kDim, 1000, 29), kDim,
                 2 * kMaxKeptTableCentroids, 2, &pool_, 2));
  ASSERT_TRUE(large->has_groups());
  for (const std::shared_ptr<const CentroidCodebook>& codebook : {codebook_, grouped, odd, large}) {
    CentroidIndex index(codebook);
    for (uint64_t doc = 1; doc <= 400; ++doc) AddDocument(index, doc, doc);
    const int64_t C = codebook->num_centroids();
    const std::vector<float> query = Clustered(9, kDim, 50, 5);
    const FloatMatrixView view{query.data(), 9, kDim};
    const QuerySimilarity similarity(view);
    std::vector<float> expected(C * similarity.stride());
    similarity.Compute(codebook->centroids(), C, expected.data());
    for (const int nprobe : {4, 40}) {
      CentroidSearchOptions options;
      options.nprobe = nprobe;
      options.num_documents = 100;
      const auto plain = index.Search(view, options, nullptr, &pool_);
      CentroidScoreTable table;
      options.centroid_scores = &table;
      const auto with_table = index.Search(view, options, nullptr, &pool_);
      ASSERT_TRUE(plain.ok() && with_table.ok());
      const std::string where = absl::StrCat(C, " centroids, nprobe ", nprobe);
      ASSERT_EQ(plain->size(), with_table->size()) << where;
      for (size_t r = 0; r < plain->size(); ++r) {
        EXPECT_EQ((*plain)[r].doc, (*with_table)[r].doc) << where << ", rank " << r;
        EXPECT_EQ((*plain)[r].score, (*with_table)[r].score) << where << ", rank " << r;
      }
      if (codebook == large) {
        EXPECT_EQ(table.codebook, nullptr) << where;
        EXPECT_EQ(table.scores, nullptr) << where;
        continue;
      }
      ASSERT_EQ(table.codebook, codebook) << where;
      ASSERT_EQ(table.nq, 9) << where;
      ASSERT_NE(table.scores, nullptr) << where;
      for (int64_t i = 0; i < 9; ++i) {
        for (int64_t c = 0; c < C; ++c) {
          ASSERT_EQ(table.scores[i * C + c], expected[c * similarity.stride() + i])
              << where << ", row " << i << ", centroid " << c;
        }
      }
    }
  }
}

// Stage 2's table from the centroids its documents use (ScoreUsedCentroids): the rows of every
// used centroid equal QuerySimilarity::Compute's bit for bit, whether a few are used (their rows
// gathered), half, or nearly all (the whole codebook scored in place), over one part or several
// of the pool (64 and 2,048 centroids).
TEST_F(CentroidIndexTest, ScoresTheCentroidsItsDocumentsUse) {
  const std::shared_ptr<const CentroidCodebook> large(
      TrainOrDie(Clustered(8192, kDim, 1000, 17), kDim,
                 CentroidCodebook::kExactAssignmentCentroids * 2, 2, &pool_, 2));
  const std::vector<float> query = Clustered(9, kDim, 50, 5);
  const QuerySimilarity similarity({query.data(), 9, kDim});
  const int64_t stride = similarity.stride();
  std::mt19937 rng(3);
  for (const std::shared_ptr<const CentroidCodebook>& codebook : {codebook_, large}) {
    const int64_t C = codebook->num_centroids();
    std::vector<float> expected(C * stride);
    similarity.Compute(codebook->centroids(), C, expected.data());
    for (const int64_t used_count : {int64_t{3}, C / 2, C - 1, C}) {
      std::vector<uint32_t> ids(C);
      for (int64_t c = 0; c < C; ++c) ids[c] = static_cast<uint32_t>(c);
      std::shuffle(ids.begin(), ids.end(), rng);
      ids.resize(used_count);
      // Two documents, the second naming some of the first's centroids again.
      const std::vector<uint8_t> codes(C * codebook->codec().code_bytes(), 0);
      const int64_t half = (used_count + 1) / 2;
      const DocumentCodesView documents[] = {
          {half, reinterpret_cast<const char*>(ids.data()), codes.data()},
          {used_count - half + 1, reinterpret_cast<const char*>(&ids[half - 1]), codes.data()}};
      const std::unique_ptr<float[]> table =
          ScoreUsedCentroids(*codebook, similarity, documents, &pool_);
      for (const uint32_t c : ids) {
        for (int64_t i = 0; i < stride; ++i) {
          ASSERT_EQ(table[c * stride + i], expected[c * stride + i])
              << C << " centroids, " << used_count << " used: centroid " << c << ", lane " << i;
        }
      }
    }
  }
}

TEST_F(CentroidIndexTest, RejectsMalformedInput) {
  DocumentCodes bad;
  EXPECT_EQ(index_->Add(1000, bad).code(), absl::StatusCode::kInvalidArgument);
  bad.centroids = {static_cast<uint32_t>(codebook_->num_centroids())};
  bad.codes.assign(codebook_->codec().code_bytes(), 0);
  EXPECT_EQ(index_->Add(1000, bad).code(), absl::StatusCode::kInvalidArgument);
  bad.centroids = {0};
  bad.codes.assign(1, 0);
  EXPECT_EQ(index_->Add(1000, bad).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<float> query(kDim + 1, 0.1f);
  EXPECT_EQ(index_->Search(FloatMatrixView{query.data(), 1, kDim + 1}, {}, nullptr, nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DocumentCodes, ByteFormRoundTripsAndRejectsDamage) {
  DocumentCodes codes;
  codes.centroids = {3, 0, 7};
  codes.codes = std::string("abcdefghijkl", 12);
  const std::string bytes = SerializeDocumentCodes(codes);
  absl::StatusOr<DocumentCodes> parsed = ParseDocumentCodes(bytes, 4, 8);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->centroids, codes.centroids);
  EXPECT_EQ(parsed->codes, codes.codes);
  EXPECT_EQ(ParseDocumentCodes(bytes, 4, 7).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseDocumentCodes(bytes.substr(1), 4, 8).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseDocumentCodes(bytes, 5, 8).status().code(), absl::StatusCode::kDataLoss);
}

// The in-place view stage 2 reads stored codes through (Shard::FetchCodes): the same checks as
// ParseDocumentCodes, with messages that say what was expected, and ids read at any alignment.
TEST(DocumentCodes, ViewReadsTheBytesInPlaceAtAnyAlignment) {
  DocumentCodes codes;
  codes.centroids = {3, 0, 7};
  codes.codes = std::string("abcdefghijkl", 12);
  const std::string bytes = SerializeDocumentCodes(codes);
  for (size_t shift : {0, 1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("shift ", shift));
    const std::string shifted = std::string(shift, 'x') + bytes;
    const absl::string_view at = absl::string_view(shifted).substr(shift);
    absl::StatusOr<DocumentCodesView> view = ViewDocumentCodes(at, 4, 8);
    ASSERT_TRUE(view.ok()) << view.status();
    ASSERT_EQ(view->size, 3);
    for (int64_t v = 0; v < 3; ++v) EXPECT_EQ(view->centroid(v), codes.centroids[v]);
    EXPECT_EQ(absl::string_view(reinterpret_cast<const char*>(view->codes), 12), codes.codes);
    EXPECT_EQ(view->centroids, at.data() + 4);
    const bool aligned = reinterpret_cast<uintptr_t>(at.data() + 4) % alignof(uint32_t) == 0;
    EXPECT_EQ(view->aligned_centroids() != nullptr, aligned);
  }
  const absl::Status out_of_range = ViewDocumentCodes(bytes, 4, 7).status();
  EXPECT_EQ(out_of_range.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(out_of_range.message(),
              ::testing::HasSubstr("vector 2 has centroid 7, expected < 7"));
  const absl::Status short_by_one = ViewDocumentCodes(bytes.substr(1), 4, 8).status();
  EXPECT_EQ(short_by_one.code(), absl::StatusCode::kDataLoss);
  const absl::Status wrong_size = ViewDocumentCodes(bytes, 5, 8).status();
  EXPECT_EQ(wrong_size.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(wrong_size.message(),
              ::testing::HasSubstr("28 bytes for 3 vectors of 5 code bytes, expected 31"));
  EXPECT_EQ(ViewDocumentCodes("abc", 4, 8).status().code(), absl::StatusCode::kDataLoss);
}

// tests/fuzz/record_codec_fuzzer: zero vectors made the parser memcpy into an empty vector's null
// data(), which is undefined (corpus/record_codec/regression-zero-document-codes).
TEST(DocumentCodes, ZeroVectorsParseToNoCodes) {
  const absl::StatusOr<DocumentCodes> parsed = ParseDocumentCodes(std::string(4, '\0'), 4, 8);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->size(), 0);
  EXPECT_TRUE(parsed->codes.empty());
  EXPECT_EQ(SerializeDocumentCodes(*parsed), std::string(4, '\0'));
}

}  // namespace
}  // namespace tessera::internal
