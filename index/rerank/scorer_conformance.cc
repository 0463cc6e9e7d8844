// The MaxSimScorer conformance suite (see scorer_conformance.h). The cases register here; each
// backend's test binary instantiates them over its factories.
#include "index/rerank/scorer_conformance.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/float16.h"
#include "tessera/maxsim.h"

namespace tessera {
namespace maxsim_testing {

void OwnedDocs::Add(std::vector<float> tokens) {
  if (dtype == VectorDtype::kFloat16) {
    std::vector<Float16> h(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      h[i] = FloatToHalf(tokens[i]);
      tokens[i] = HalfToFloat(h[i]);
    }
    halves.push_back(std::move(h));
  }
  values.push_back(std::move(tokens));
}

DocumentBatch OwnedDocs::Batch() {
  refs.clear();
  for (size_t d = 0; d < values.size(); ++d) {
    DocumentRef ref;
    ref.num_tokens = num_tokens(d);
    ref.data = dtype == VectorDtype::kFloat16 ? static_cast<const void*>(halves[d].data())
                                              : static_cast<const void*>(values[d].data());
    refs.push_back(ref);
  }
  DocumentBatch batch;
  batch.dtype = dtype;
  batch.dim = dim;
  batch.docs = refs;
  return batch;
}

namespace {

double Norm(const float* a, int64_t dim) {
  double s = 0;
  for (int64_t k = 0; k < dim; ++k) s += double{a[k]} * a[k];
  return std::sqrt(s);
}

// Indices of the k best documents: score descending, index ascending on equal scores.
template <typename T>
std::vector<int64_t> TopK(const std::vector<T>& scores, size_t k) {
  std::vector<int64_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  order.resize(std::min(k, order.size()));
  return order;
}

const char* DtypeName(VectorDtype dtype) {
  return dtype == VectorDtype::kFloat16 ? "fp16" : "fp32";
}

// Scores `query` (nq × docs.dim) against `batch` (made by docs.Batch()) with best tokens and checks
// the result against the reference; a failed call counts as one failure. Returns the number of
// failures and, when `result` is not null, the result.
int ScoreAndCheck(const MaxSimScorer& scorer, const std::vector<float>& query, int64_t nq,
                  const OwnedDocs& docs, const DocumentBatch& batch, const std::string& what,
                  MaxSimResult* result = nullptr) {
  MaxSimOptions options;
  options.want_best_tokens = true;
  absl::StatusOr<MaxSimResult> got = scorer.Score({query.data(), nq, docs.dim}, batch, options);
  if (!got.ok()) {
    ADD_FAILURE() << what << ": " << got.status();
    return 1;
  }
  const int failures =
      CheckAgainstReference(*got, ComputeReference(query, nq, docs), docs, nq, what);
  if (result != nullptr) *result = *std::move(got);
  return failures;
}

}  // namespace

Reference ComputeReference(const std::vector<float>& query, int64_t nq, const OwnedDocs& docs) {
  const int64_t dim = docs.dim;
  double query_norms = 0;
  for (int64_t i = 0; i < nq; ++i) query_norms += Norm(&query[i * dim], dim);
  Reference ref;
  for (const std::vector<float>& doc : docs.values) {
    const int64_t n = static_cast<int64_t>(doc.size()) / dim;
    std::vector<double> sims(nq * n), abs_sums(nq * n);
    double score = 0, scale = 0;
    for (int64_t i = 0; i < nq; ++i) {
      double best = -INFINITY, best_abs = 0, abs_sum_max = 0;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0, abs_sum = 0;
        for (int64_t k = 0; k < dim; ++k) {
          const double p = static_cast<double>(query[i * dim + k]) * doc[j * dim + k];
          dot += p;
          abs_sum += std::fabs(p);
        }
        sims[i * n + j] = dot;
        abs_sums[i * n + j] = abs_sum;
        best = std::max(best, dot);
        best_abs = std::max(best_abs, std::fabs(dot));
        abs_sum_max = std::max(abs_sum_max, abs_sum);
      }
      score += best;
      scale += best_abs;
      ref.sim_scale.push_back(std::max(1.0, abs_sum_max));
    }
    double max_norm = 0;
    for (int64_t j = 0; j < n; ++j) max_norm = std::max(max_norm, Norm(&doc[j * dim], dim));
    ref.scores.push_back(score);
    ref.score_scale.push_back(std::max(1.0, scale));
    ref.score_bound.push_back(query_norms * max_norm);
    ref.sims.push_back(std::move(sims));
    ref.abs_sums.push_back(std::move(abs_sums));
  }
  return ref;
}

std::vector<float> RandomValues(std::mt19937& rng, int64_t count, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<float> RandomUnitRows(std::mt19937& rng, int64_t rows, int64_t dim) {
  std::vector<float> v = RandomValues(rng, rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    double norm = 0;
    for (int64_t k = 0; k < dim; ++k) norm += double{v[r * dim + k]} * v[r * dim + k];
    const float inv = static_cast<float>(1.0 / std::sqrt(std::max(norm, 1e-30)));
    for (int64_t k = 0; k < dim; ++k) v[r * dim + k] *= inv;
  }
  return v;
}

int CheckAgainstReference(const MaxSimResult& got, const Reference& ref, const OwnedDocs& docs,
                          int64_t nq, const std::string& what) {
  int failures = 0;
  const size_t num_docs = docs.values.size();
  EXPECT_EQ(got.scores.size(), num_docs) << what;
  EXPECT_EQ(got.best_tokens.size(), num_docs * nq) << what;
  if (got.scores.size() != num_docs || got.best_tokens.size() != num_docs * nq) return 1;
  const double relative =
      docs.dtype == VectorDtype::kFloat16 ? kFp16RelativeTolerance : kFp32RelativeTolerance;
  std::vector<double> tolerance(num_docs);
  for (size_t d = 0; d < num_docs; ++d) {
    tolerance[d] =
        std::min(kScoreTolerance * ref.score_scale[d],
                 relative * std::max(std::fabs(ref.scores[d]), 0.01 * ref.score_bound[d]));
    if (!(std::fabs(got.scores[d] - ref.scores[d]) <= tolerance[d])) {
      ADD_FAILURE() << what << " doc " << d << " (" << docs.num_tokens(d) << " tokens): score "
                    << got.scores[d] << ", reference " << ref.scores[d] << ", tolerance "
                    << tolerance[d];
      ++failures;
    }
    const int64_t n = docs.num_tokens(d);
    for (int64_t i = 0; i < nq; ++i) {
      const double* row = &ref.sims[d][i * n];
      const double* abs_row = &ref.abs_sums[d][i * n];
      const int64_t argmax = std::max_element(row, row + n) - row;
      const int32_t chosen = got.best_tokens[d * nq + i];
      if (chosen < 0 || chosen >= n) {
        ADD_FAILURE() << what << " doc " << d << " query token " << i << ": best token " << chosen
                      << " out of [0, " << n << ")";
        ++failures;
        continue;
      }
      if (chosen == argmax) continue;
      // Only a near-tie (within fp32 rounding of the dot products) may pick another token.
      const double sim_tol =
          std::min(kSimTolerance * ref.sim_scale[d * nq + i],
                   kNearTieTolerance * std::max(abs_row[chosen], abs_row[argmax]));
      if (!(row[chosen] >= row[argmax] - sim_tol)) {
        ADD_FAILURE() << what << " doc " << d << " query token " << i << ": best token " << chosen
                      << " (similarity " << row[chosen] << "), reference " << argmax
                      << " (similarity " << row[argmax] << "), tolerance " << sim_tol;
        ++failures;
      }
    }
    if (failures > 10) return failures;
  }

  // Top-k order: where the two rankings differ, the documents swapped must tie on the reference
  // scores within tolerance.
  const size_t k = std::min<size_t>(10, num_docs);
  const std::vector<int64_t> got_top = TopK(got.scores, k);
  const std::vector<int64_t> ref_top = TopK(ref.scores, k);
  for (size_t r = 0; r < k; ++r) {
    const int64_t a = got_top[r], b = ref_top[r];
    if (a == b) continue;
    const double tie = std::max(tolerance[a], tolerance[b]) * 2;
    if (!(std::fabs(ref.scores[a] - ref.scores[b]) <= tie)) {
      ADD_FAILURE() << what << " rank " << r << ": scorer has document " << a << " (reference "
                    << ref.scores[a] << "), reference has document " << b << " (" << ref.scores[b]
                    << ")";
      ++failures;
    }
  }
  return failures;
}

void PrintTo(const ScorerFactory& factory, std::ostream* os) { *os << factory.name; }

void MaxSimScorerConformance::SetUp() {
  const ScorerFactory& factory = GetParam();
  const std::string why = factory.unavailable ? factory.unavailable() : "";
  if (!why.empty()) GTEST_SKIP() << why;
}

std::unique_ptr<MaxSimScorer> MaxSimScorerConformance::Make(int num_threads) const {
  absl::StatusOr<std::unique_ptr<MaxSimScorer>> scorer = GetParam().make(num_threads);
  EXPECT_TRUE(scorer.ok()) << GetParam().name << " threads=" << num_threads << ": "
                           << scorer.status();
  return scorer.ok() ? *std::move(scorer) : nullptr;
}

std::vector<int> MaxSimScorerConformance::ThreadCounts() const {
  if (GetParam().takes_threads) return {1, 2};
  return {1};
}

TEST_P(MaxSimScorerConformance, MatchesDoublePrecisionReference) {
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<int64_t> nq_dist(1, 70);
  std::uniform_int_distribution<int64_t> len_dist(1, 300);
  std::uniform_int_distribution<int> docs_dist(1, 7);
  std::vector<std::unique_ptr<MaxSimScorer>> scorers;
  for (int threads : ThreadCounts()) {
    scorers.push_back(Make(threads));
    ASSERT_NE(scorers.back(), nullptr);
  }
  int checked = 0;
  for (VectorDtype dtype : {VectorDtype::kFloat32, VectorDtype::kFloat16}) {
    for (int64_t dim : {1, 3, 16, 64, 96, 128, 130, 320}) {
      for (int trial = 0; trial < 3; ++trial) {
        const int64_t nq = nq_dist(rng);
        const std::vector<float> query = RandomValues(rng, nq * dim);
        OwnedDocs docs(dtype, dim);
        const int num_docs = docs_dist(rng);
        for (int d = 0; d < num_docs; ++d) docs.Add(RandomValues(rng, len_dist(rng) * dim));
        const DocumentBatch batch = docs.Batch();
        for (size_t s = 0; s < scorers.size(); ++s) {
          const MaxSimScorer& scorer = *scorers[s];
          const std::string what =
              absl::StrCat(std::string(scorer.name()), " threads=", ThreadCounts()[s], " ",
                           DtypeName(dtype), " dim=", dim, " nq=", nq, " trial=", trial);
          MaxSimResult got;
          ASSERT_EQ(ScoreAndCheck(scorer, query, nq, docs, batch, what, &got), 0);
          // Scores do not depend on whether best tokens are tracked.
          absl::StatusOr<MaxSimResult> scores_only = scorer.Score({query.data(), nq, dim}, batch);
          ASSERT_TRUE(scores_only.ok()) << what << ": " << scores_only.status();
          EXPECT_TRUE(scores_only->best_tokens.empty()) << what;
          EXPECT_EQ(scores_only->scores, got.scores) << what;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST_P(MaxSimScorerConformance, MatchesReferenceOnMixedLengthBatches) {
  // Unit-length rows; lengths 1…2,048 within one batch, with the lengths around the GPU's
  // 32/128-token steps among them.
  std::unique_ptr<MaxSimScorer> scorer = Make(2);
  ASSERT_NE(scorer, nullptr);
  std::mt19937 rng(20240705);
  std::uniform_int_distribution<int64_t> nq_dist(1, 64);
  std::uniform_int_distribution<int64_t> long_dist(1, 2048);
  std::uniform_int_distribution<int64_t> short_dist(1, 64);
  std::uniform_int_distribution<int> kind_dist(0, 9);
  const int64_t special_lengths[] = {1, 2, 31, 32, 33, 127, 128, 129, 2047, 2048};
  std::uniform_int_distribution<size_t> special_dist(0, std::size(special_lengths) - 1);
  for (VectorDtype dtype : {VectorDtype::kFloat16, VectorDtype::kFloat32}) {
    for (int64_t dim : {64, 96, 128, 320}) {
      for (int trial = 0; trial < 2; ++trial) {
        const int64_t nq = trial == 0 ? nq_dist(rng) : 64;
        const std::vector<float> query = RandomUnitRows(rng, nq, dim);
        OwnedDocs docs(dtype, dim);
        // The extremes, then a mix of long, short and tile-edge lengths.
        std::vector<int64_t> lengths = {2048, 1};
        for (int d = 0; d < 14; ++d) {
          const int kind = kind_dist(rng);
          lengths.push_back(kind < 4   ? long_dist(rng)
                            : kind < 8 ? short_dist(rng)
                                       : special_lengths[special_dist(rng)]);
        }
        for (int64_t n : lengths) docs.Add(RandomUnitRows(rng, n, dim));
        const DocumentBatch batch = docs.Batch();
        const std::string what = absl::StrCat(std::string(scorer->name()), " ", DtypeName(dtype),
                                              " dim=", dim, " nq=", nq, " trial=", trial);
        MaxSimResult got;
        ASSERT_EQ(ScoreAndCheck(*scorer, query, nq, docs, batch, what, &got), 0);
        // Tracking best tokens does not change the scores.
        absl::StatusOr<MaxSimResult> scores_only = scorer->Score({query.data(), nq, dim}, batch);
        ASSERT_TRUE(scores_only.ok()) << what << ": " << scores_only.status();
        EXPECT_TRUE(scores_only->best_tokens.empty()) << what;
        EXPECT_EQ(scores_only->scores, got.scores) << what;
      }
    }
  }
}

TEST_P(MaxSimScorerConformance, EveryDocumentLengthAroundTileSizes) {
  // Lengths 1…70 cover every remainder of the CPU's 6/12-token micro-kernels and 16-token vectors
  // and the GPU's 8-token n-tiles and 32-token steps; the query lengths straddle the CPU's 16-lane
  // vectors and the GPU's 8/16/32-token query tiles.
  std::unique_ptr<MaxSimScorer> scorer = Make(1);
  ASSERT_NE(scorer, nullptr);
  std::mt19937 rng(7);
  struct Shape {
    VectorDtype dtype;
    // 24: CPU; 64: GPU tensor cores; 40: GPU SIMT with vector loads; 13: GPU SIMT scalar loads.
    int64_t dim;
  };
  for (const Shape& shape : {Shape{VectorDtype::kFloat16, 24}, Shape{VectorDtype::kFloat16, 64},
                             Shape{VectorDtype::kFloat16, 40}, Shape{VectorDtype::kFloat32, 13}}) {
    OwnedDocs docs(shape.dtype, shape.dim);
    for (int64_t n = 1; n <= 70; ++n) docs.Add(RandomValues(rng, n * shape.dim));
    const DocumentBatch batch = docs.Batch();
    for (int64_t nq : {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 64, 65}) {
      const std::vector<float> query = RandomValues(rng, nq * shape.dim);
      const std::string what = absl::StrCat(std::string(scorer->name()), " ",
                                            DtypeName(shape.dtype), " dim=", shape.dim, " nq=", nq);
      ASSERT_EQ(ScoreAndCheck(*scorer, query, nq, docs, batch, what), 0);
    }
  }
}

TEST_P(MaxSimScorerConformance, LongQueriesAndLargeDims) {
  // On the GPU these take several launches: query tiles per launch are, for the tensor cores,
  // 1 (dim 320) and 3 (dim 128); for SIMT, 2 (dim 320), 1 with 12-token tiles (dim 1000) and 1
  // with 2-token tiles (dim 5000).
  std::unique_ptr<MaxSimScorer> scorer = Make(2);
  ASSERT_NE(scorer, nullptr);
  std::mt19937 rng(13);
  struct Shape {
    VectorDtype dtype;
    int64_t dim;
    int64_t nq;
  };
  for (const Shape& shape :
       {Shape{VectorDtype::kFloat16, 320, 200}, Shape{VectorDtype::kFloat16, 128, 200},
        Shape{VectorDtype::kFloat32, 1000, 40}, Shape{VectorDtype::kFloat16, 5000, 5}}) {
    const std::vector<float> query = RandomUnitRows(rng, shape.nq, shape.dim);
    OwnedDocs docs(shape.dtype, shape.dim);
    for (int64_t n : {1, 50, 300, 33}) docs.Add(RandomUnitRows(rng, n, shape.dim));
    const DocumentBatch batch = docs.Batch();
    const std::string what = absl::StrCat(std::string(scorer->name()), " ", DtypeName(shape.dtype),
                                          " dim=", shape.dim, " nq=", shape.nq);
    ASSERT_EQ(ScoreAndCheck(*scorer, query, shape.nq, docs, batch, what), 0);
  }
}

TEST_P(MaxSimScorerConformance, QueryMagnitudeDoesNotMatter) {
  // The GPU's tensor-core kernel rescales the query by a power of two before splitting it into fp16
  // halves; tiny and huge queries must come out as exact as unit ones.
  std::unique_ptr<MaxSimScorer> scorer = Make(2);
  ASSERT_NE(scorer, nullptr);
  std::mt19937 rng(17);
  const int64_t dim = 128, nq = 32;
  OwnedDocs docs(VectorDtype::kFloat16, dim);
  for (int64_t n : {5, 128, 700}) docs.Add(RandomUnitRows(rng, n, dim));
  const DocumentBatch batch = docs.Batch();
  const std::vector<float> unit = RandomUnitRows(rng, nq, dim);
  for (float magnitude : {1e-30f, 1e-6f, 1.0f, 3e4f, 1e20f}) {
    std::vector<float> query = unit;
    for (float& x : query) x *= magnitude;
    EXPECT_EQ(ScoreAndCheck(*scorer, query, nq, docs, batch,
                            absl::StrCat(std::string(scorer->name()), " magnitude=", magnitude)),
              0);
  }
}

TEST_P(MaxSimScorerConformance, ExactTiesGoToLowestIndex) {
  // Positive queries; a planted all-ones token beats every small random token, and its copies
  // (across CPU micro-kernel and vector boundaries, GPU lanes, n8 tiles and 32-token steps) tie
  // exactly with it.
  std::vector<std::unique_ptr<MaxSimScorer>> scorers;
  for (int threads : ThreadCounts()) {
    scorers.push_back(Make(threads));
    ASSERT_NE(scorers.back(), nullptr);
  }
  std::mt19937 rng(11);
  const int64_t nq = 37, n = 90;
  const std::vector<int64_t> planted = {7, 12, 19, 20, 31, 45, 89};
  for (int64_t dim : {40, 64}) {
    const std::vector<float> query = RandomValues(rng, nq * dim, 0.1f, 1.0f);
    for (VectorDtype dtype : {VectorDtype::kFloat32, VectorDtype::kFloat16}) {
      OwnedDocs docs(dtype, dim);
      std::vector<float> tokens = RandomValues(rng, n * dim, -0.01f, 0.01f);
      for (int64_t p : planted) std::fill(&tokens[p * dim], &tokens[(p + 1) * dim], 1.0f);
      docs.Add(tokens);
      // A document whose tokens are all the same: token 0 wins everywhere.
      const std::vector<float> same = RandomValues(rng, dim);
      std::vector<float> repeated;
      for (int j = 0; j < 50; ++j) repeated.insert(repeated.end(), same.begin(), same.end());
      docs.Add(repeated);
      const DocumentBatch batch = docs.Batch();
      for (const std::unique_ptr<MaxSimScorer>& scorer : scorers) {
        MaxSimOptions options;
        options.want_best_tokens = true;
        absl::StatusOr<MaxSimResult> got = scorer->Score({query.data(), nq, dim}, batch, options);
        ASSERT_TRUE(got.ok()) << got.status();
        for (int64_t i = 0; i < nq; ++i) {
          EXPECT_EQ(got->best_tokens[i], planted[0]) << scorer->name() << " " << DtypeName(dtype)
                                                     << " dim=" << dim << " query token " << i;
          EXPECT_EQ(got->best_tokens[nq + i], 0) << scorer->name() << " " << DtypeName(dtype)
                                                 << " dim=" << dim << " query token " << i;
        }
      }
    }
  }
}

TEST_P(MaxSimScorerConformance, ResultsDoNotDependOnThreadCount) {
  if (!GetParam().takes_threads) GTEST_SKIP() << GetParam().name << " takes no thread count";
  std::mt19937 rng(3);
  const int64_t dim = 128, nq = 32;
  const std::vector<float> query = RandomValues(rng, nq * dim);
  OwnedDocs docs(VectorDtype::kFloat16, dim);
  std::uniform_int_distribution<int64_t> len_dist(1, 200);
  for (int d = 0; d < 200; ++d) docs.Add(RandomValues(rng, len_dist(rng) * dim));
  const DocumentBatch batch = docs.Batch();
  MaxSimOptions options;
  options.want_best_tokens = true;
  std::unique_ptr<MaxSimScorer> one = Make(1);
  std::unique_ptr<MaxSimScorer> many = Make(3);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(many, nullptr);
  absl::StatusOr<MaxSimResult> a = one->Score({query.data(), nq, dim}, batch, options);
  absl::StatusOr<MaxSimResult> b = many->Score({query.data(), nq, dim}, batch, options);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->scores, b->scores) << one->name();
  EXPECT_EQ(a->best_tokens, b->best_tokens) << one->name();
}

TEST_P(MaxSimScorerConformance, ConcurrentCallersGetIdenticalResults) {
  std::unique_ptr<MaxSimScorer> scorer = Make(2);
  ASSERT_NE(scorer, nullptr);
  struct Load {
    VectorDtype dtype;
    int64_t dim;
    int num_docs;
    int64_t max_tokens;
    int rounds;
    bool unit_rows;
  };
  std::mt19937 rng(5);
  for (const Load& load : {Load{VectorDtype::kFloat32, 64, 120, 150, 10, false},
                           Load{VectorDtype::kFloat16, 96, 150, 400, 8, true}}) {
    const int64_t dim = load.dim, nq = 20;
    const std::vector<float> query =
        load.unit_rows ? RandomUnitRows(rng, nq, dim) : RandomValues(rng, nq * dim);
    OwnedDocs docs(load.dtype, dim);
    std::uniform_int_distribution<int64_t> len_dist(1, load.max_tokens);
    for (int d = 0; d < load.num_docs; ++d) {
      const int64_t n = len_dist(rng);
      docs.Add(load.unit_rows ? RandomUnitRows(rng, n, dim) : RandomValues(rng, n * dim));
    }
    const DocumentBatch batch = docs.Batch();
    MaxSimOptions options;
    options.want_best_tokens = true;
    absl::StatusOr<MaxSimResult> expected = scorer->Score({query.data(), nq, dim}, batch, options);
    ASSERT_TRUE(expected.ok()) << expected.status();

    constexpr int kCallers = 4;
    std::vector<int> mismatches(kCallers, 0);
    std::vector<std::thread> callers;
    for (int c = 0; c < kCallers; ++c) {
      callers.emplace_back([&, c] {
        for (int r = 0; r < load.rounds; ++r) {
          absl::StatusOr<MaxSimResult> got = scorer->Score({query.data(), nq, dim}, batch, options);
          if (!got.ok() || got->scores != expected->scores ||
              got->best_tokens != expected->best_tokens) {
            ++mismatches[c];
          }
        }
      });
    }
    for (std::thread& t : callers) t.join();
    for (int c = 0; c < kCallers; ++c) {
      EXPECT_EQ(mismatches[c], 0) << DtypeName(load.dtype) << " dim=" << dim << " caller " << c;
    }
  }
}

TEST_P(MaxSimScorerConformance, EmptyBatchGivesEmptyResult) {
  std::unique_ptr<MaxSimScorer> scorer = Make(2);
  ASSERT_NE(scorer, nullptr);
  const std::vector<float> query(8, 0.5f);
  DocumentBatch batch;
  batch.dim = 4;
  MaxSimOptions options;
  options.want_best_tokens = true;
  absl::StatusOr<MaxSimResult> got = scorer->Score({query.data(), 2, 4}, batch, options);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->scores.empty());
  EXPECT_TRUE(got->best_tokens.empty());
}

void MaxSimScorerValidation::SetUp() {
  const ScorerFactory& factory = GetParam();
  const std::string why = factory.unavailable ? factory.unavailable() : "";
  if (!why.empty()) GTEST_SKIP() << why;
  absl::StatusOr<std::unique_ptr<MaxSimScorer>> scorer = factory.make(1);
  ASSERT_TRUE(scorer.ok()) << factory.name << ": " << scorer.status();
  scorer_ = *std::move(scorer);
  refs_ = {{doc_.data(), 2}, {doc_.data(), 1}, {doc_.data(), 2}};
  batch_.dtype = VectorDtype::kFloat32;
  batch_.dim = 4;
  batch_.docs = refs_;
}

void MaxSimScorerValidation::ExpectInvalid(FloatMatrixView query, const DocumentBatch& batch,
                                           const std::string& message) {
  absl::StatusOr<MaxSimResult> got = scorer_->Score(query, batch);
  ASSERT_FALSE(got.ok()) << "expected an error containing: " << message;
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  EXPECT_THAT(std::string(got.status().message()), ::testing::HasSubstr(message));
}

TEST_P(MaxSimScorerValidation, AcceptsValidInput) {
  absl::StatusOr<MaxSimResult> got = scorer_->Score({query_.data(), 3, 4}, batch_);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->scores, ::testing::ElementsAre(3.0f, 3.0f, 3.0f));
}

TEST_P(MaxSimScorerValidation, RejectsNullQueryData) {
  ExpectInvalid({nullptr, 3, 4}, batch_, "query: data is null");
}

TEST_P(MaxSimScorerValidation, RejectsEmptyQuery) {
  ExpectInvalid({query_.data(), 0, 4}, batch_, "query: rows 0, expected ≥ 1");
  ExpectInvalid({query_.data(), -2, 4}, batch_, "query: rows -2, expected ≥ 1");
  ExpectInvalid({query_.data(), 3, 0}, batch_, "query: cols 0, expected ≥ 1");
}

TEST_P(MaxSimScorerValidation, RejectsNonFiniteQuery) {
  query_[6] = NAN;
  ExpectInvalid({query_.data(), 3, 4}, batch_, "query: value at row 1, col 2 is nan");
  query_[6] = 0;
  query_[11] = -INFINITY;
  ExpectInvalid({query_.data(), 3, 4}, batch_, "query: value at row 2, col 3 is -inf");
}

TEST_P(MaxSimScorerValidation, RejectsDimMismatch) {
  batch_.dim = 5;
  ExpectInvalid({query_.data(), 3, 4}, batch_, "documents: dim 5, expected 4");
}

TEST_P(MaxSimScorerValidation, RejectsUnknownDtype) {
  batch_.dtype = static_cast<VectorDtype>(9);
  ExpectInvalid({query_.data(), 3, 4}, batch_, "documents: dtype 9");
}

TEST_P(MaxSimScorerValidation, RejectsDocumentWithoutTokens) {
  refs_[2].num_tokens = 0;
  ExpectInvalid({query_.data(), 3, 4}, batch_, "document 2: num_tokens 0, expected ≥ 1");
  refs_[2].num_tokens = -1;
  ExpectInvalid({query_.data(), 3, 4}, batch_, "document 2: num_tokens -1, expected ≥ 1");
}

TEST_P(MaxSimScorerValidation, RejectsDocumentWithNullData) {
  refs_[1].data = nullptr;
  ExpectInvalid({query_.data(), 3, 4}, batch_, "document 1: data is null");
}

TEST_P(MaxSimScorerValidation, RejectsTokenCountBeyondInt32) {
  refs_[0].num_tokens = int64_t{1} << 31;
  ExpectInvalid({query_.data(), 3, 4}, batch_, "document 0: num_tokens 2147483648");
}

}  // namespace maxsim_testing
}  // namespace tessera
