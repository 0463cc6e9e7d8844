// Tests for the CPU MaxSim scorer: every kernel the CPU supports against a double-precision
// brute-force reference, exact ties, input validation and concurrent callers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/rerank/cpu_maxsim_scorer.h"
#include "tessera/float16.h"
#include "tessera/maxsim.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

constexpr CpuIsa kAllIsas[] = {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kPortable};

// A document batch with owned storage. Values are kept as the fp32 the reference uses (for fp16,
// the decoded fp16 values) and as the bytes the scorer reads.
struct OwnedDocs {
  VectorDtype dtype = VectorDtype::kFloat32;
  int64_t dim = 0;
  std::vector<std::vector<float>> values;    // per document, num_tokens × dim
  std::vector<std::vector<Float16>> halves;  // fp16 storage, when dtype is kFloat16
  std::vector<DocumentRef> refs;

  void Add(std::vector<float> tokens) {
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

  // Call after the last Add: vectors no longer move.
  DocumentBatch Batch() {
    refs.clear();
    for (size_t d = 0; d < values.size(); ++d) {
      DocumentRef ref;
      ref.num_tokens = static_cast<int64_t>(values[d].size()) / dim;
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
};

// Double-precision brute force, independent of the kernels' code.
struct Reference {
  std::vector<double> scores;             // per document
  std::vector<double> score_scale;        // max(1, Σ_i max_j |sim|) per document
  std::vector<std::vector<double>> sims;  // per document, nq × num_tokens
  std::vector<double> sim_scale;          // per document × query token: max(1, max_j Σ_k |q d|)
};

Reference ComputeReference(const std::vector<float>& query, int64_t nq, const OwnedDocs& docs) {
  const int64_t dim = docs.dim;
  Reference ref;
  for (const std::vector<float>& doc : docs.values) {
    const int64_t n = static_cast<int64_t>(doc.size()) / dim;
    std::vector<double> sims(nq * n);
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
        best = std::max(best, dot);
        best_abs = std::max(best_abs, std::fabs(dot));
        abs_sum_max = std::max(abs_sum_max, abs_sum);
      }
      score += best;
      scale += best_abs;
      ref.sim_scale.push_back(std::max(1.0, abs_sum_max));
    }
    ref.scores.push_back(score);
    ref.score_scale.push_back(std::max(1.0, scale));
    ref.sims.push_back(std::move(sims));
  }
  return ref;
}

std::vector<float> RandomValues(std::mt19937& rng, int64_t count, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

std::unique_ptr<MaxSimScorer> MakeScorer(CpuIsa isa, int threads) {
  CpuMaxSimOptions options;
  options.isa = isa;
  options.num_threads = threads;
  auto scorer = NewCpuMaxSimScorer(options);
  if (!scorer.ok()) return nullptr;  // unsupported ISA; callers skip
  return *std::move(scorer);
}

// Checks one scorer's output against the reference; returns the number of failures (also reported
// through gtest) so callers can stop early.
int CheckAgainstReference(const MaxSimResult& got, const Reference& ref, const OwnedDocs& docs,
                          int64_t nq, const std::string& what) {
  int failures = 0;
  const size_t num_docs = docs.values.size();
  EXPECT_EQ(got.scores.size(), num_docs) << what;
  EXPECT_EQ(got.best_tokens.size(), num_docs * nq) << what;
  if (got.scores.size() != num_docs || got.best_tokens.size() != num_docs * nq) return 1;
  for (size_t d = 0; d < num_docs; ++d) {
    const double tol = 1e-5 * ref.score_scale[d];
    if (!(std::fabs(got.scores[d] - ref.scores[d]) <= tol)) {
      ADD_FAILURE() << what << " doc " << d << ": score " << got.scores[d] << ", reference "
                    << ref.scores[d] << ", tolerance " << tol;
      ++failures;
    }
    const int64_t n = static_cast<int64_t>(docs.values[d].size()) / docs.dim;
    const std::vector<double>& sims = ref.sims[d];
    for (int64_t i = 0; i < nq; ++i) {
      const double* row = &sims[i * n];
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
      const double sim_tol = 1e-5 * ref.sim_scale[d * nq + i];
      if (!(row[chosen] >= row[argmax] - sim_tol)) {
        ADD_FAILURE() << what << " doc " << d << " query token " << i << ": best token " << chosen
                      << " (similarity " << row[chosen] << "), reference " << argmax
                      << " (similarity " << row[argmax] << "), tolerance " << sim_tol;
        ++failures;
      }
    }
    if (failures > 10) return failures;
  }
  return failures;
}

TEST(CpuMaxSimScorer, MatchesDoublePrecisionReference) {
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<int64_t> nq_dist(1, 70);
  std::uniform_int_distribution<int64_t> len_dist(1, 300);
  std::uniform_int_distribution<int> docs_dist(1, 7);
  int checked = 0;
  for (VectorDtype dtype : {VectorDtype::kFloat32, VectorDtype::kFloat16}) {
    for (int64_t dim : {1, 3, 16, 64, 96, 128, 130, 320}) {
      for (int trial = 0; trial < 3; ++trial) {
        const int64_t nq = nq_dist(rng);
        const std::vector<float> query = RandomValues(rng, nq * dim);
        OwnedDocs docs;
        docs.dtype = dtype;
        docs.dim = dim;
        const int num_docs = docs_dist(rng);
        for (int d = 0; d < num_docs; ++d) docs.Add(RandomValues(rng, len_dist(rng) * dim));
        const DocumentBatch batch = docs.Batch();
        const Reference ref = ComputeReference(query, nq, docs);
        const FloatMatrixView view{query.data(), nq, dim};

        for (CpuIsa isa : kAllIsas) {
          for (int threads : {1, 2}) {
            std::unique_ptr<MaxSimScorer> scorer = MakeScorer(isa, threads);
            if (scorer == nullptr) continue;  // this CPU lacks the ISA
            const std::string what =
                absl::StrCat(std::string(scorer->name()), " threads=", threads,
                             dtype == VectorDtype::kFloat16 ? " fp16" : " fp32", " dim=", dim,
                             " nq=", nq, " trial=", trial);
            MaxSimOptions options;
            options.want_best_tokens = true;
            absl::StatusOr<MaxSimResult> got = scorer->Score(view, batch, options);
            ASSERT_TRUE(got.ok()) << what << ": " << got.status();
            ASSERT_EQ(CheckAgainstReference(*got, ref, docs, nq, what), 0);
            // Scores do not depend on whether best tokens are tracked.
            absl::StatusOr<MaxSimResult> scores_only = scorer->Score(view, batch);
            ASSERT_TRUE(scores_only.ok()) << what << ": " << scores_only.status();
            EXPECT_TRUE(scores_only->best_tokens.empty()) << what;
            EXPECT_EQ(scores_only->scores, got->scores) << what;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(CpuMaxSimScorer, EveryDocumentLengthAroundTileSizes) {
  // Lengths 1..70 cover every remainder of the 6/12-token micro-kernels and 16-token vectors.
  std::mt19937 rng(7);
  const int64_t dim = 24;
  for (int64_t nq : {1, 15, 16, 17, 32, 33, 48}) {
    const std::vector<float> query = RandomValues(rng, nq * dim);
    OwnedDocs docs;
    docs.dtype = VectorDtype::kFloat16;
    docs.dim = dim;
    for (int64_t n = 1; n <= 70; ++n) docs.Add(RandomValues(rng, n * dim));
    const DocumentBatch batch = docs.Batch();
    const Reference ref = ComputeReference(query, nq, docs);
    for (CpuIsa isa : kAllIsas) {
      std::unique_ptr<MaxSimScorer> scorer = MakeScorer(isa, 1);
      if (scorer == nullptr) continue;
      MaxSimOptions options;
      options.want_best_tokens = true;
      absl::StatusOr<MaxSimResult> got = scorer->Score({query.data(), nq, dim}, batch, options);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(CheckAgainstReference(*got, ref, docs, nq,
                                      absl::StrCat(std::string(scorer->name()), " nq=", nq)),
                0);
    }
  }
}

TEST(CpuMaxSimScorer, ExactTiesGoToLowestIndex) {
  // Positive queries; a planted all-ones token beats every small random token, and its copies
  // (across micro-kernel and vector boundaries) tie exactly with it.
  std::mt19937 rng(11);
  const int64_t dim = 40, nq = 37, n = 90;
  const std::vector<float> query = RandomValues(rng, nq * dim, 0.1f, 1.0f);
  const std::vector<int64_t> planted = {7, 12, 19, 20, 31, 45, 89};
  for (VectorDtype dtype : {VectorDtype::kFloat32, VectorDtype::kFloat16}) {
    OwnedDocs docs;
    docs.dtype = dtype;
    docs.dim = dim;
    std::vector<float> tokens = RandomValues(rng, n * dim, -0.01f, 0.01f);
    for (int64_t p : planted) std::fill(&tokens[p * dim], &tokens[(p + 1) * dim], 1.0f);
    docs.Add(tokens);
    // A document whose tokens are all the same: token 0 wins everywhere.
    std::vector<float> same = RandomValues(rng, dim);
    std::vector<float> repeated;
    for (int j = 0; j < 50; ++j) repeated.insert(repeated.end(), same.begin(), same.end());
    docs.Add(repeated);
    const DocumentBatch batch = docs.Batch();
    for (CpuIsa isa : kAllIsas) {
      for (int threads : {1, 2}) {
        std::unique_ptr<MaxSimScorer> scorer = MakeScorer(isa, threads);
        if (scorer == nullptr) continue;
        MaxSimOptions options;
        options.want_best_tokens = true;
        absl::StatusOr<MaxSimResult> got = scorer->Score({query.data(), nq, dim}, batch, options);
        ASSERT_TRUE(got.ok()) << got.status();
        for (int64_t i = 0; i < nq; ++i) {
          EXPECT_EQ(got->best_tokens[i], planted[0]) << scorer->name() << " query token " << i;
          EXPECT_EQ(got->best_tokens[nq + i], 0) << scorer->name() << " query token " << i;
        }
      }
    }
  }
}

TEST(CpuMaxSimScorer, ResultsDoNotDependOnThreadCount) {
  std::mt19937 rng(3);
  const int64_t dim = 128, nq = 32;
  const std::vector<float> query = RandomValues(rng, nq * dim);
  OwnedDocs docs;
  docs.dtype = VectorDtype::kFloat16;
  docs.dim = dim;
  std::uniform_int_distribution<int64_t> len_dist(1, 200);
  for (int d = 0; d < 200; ++d) docs.Add(RandomValues(rng, len_dist(rng) * dim));
  const DocumentBatch batch = docs.Batch();
  MaxSimOptions options;
  options.want_best_tokens = true;
  for (CpuIsa isa : kAllIsas) {
    std::unique_ptr<MaxSimScorer> one = MakeScorer(isa, 1);
    std::unique_ptr<MaxSimScorer> many = MakeScorer(isa, 3);
    if (one == nullptr) continue;
    ASSERT_NE(many, nullptr);
    absl::StatusOr<MaxSimResult> a = one->Score({query.data(), nq, dim}, batch, options);
    absl::StatusOr<MaxSimResult> b = many->Score({query.data(), nq, dim}, batch, options);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->scores, b->scores) << one->name();
    EXPECT_EQ(a->best_tokens, b->best_tokens) << one->name();
  }
}

TEST(CpuMaxSimScorer, ConcurrentCallersGetIdenticalResults) {
  std::mt19937 rng(5);
  const int64_t dim = 64, nq = 20;
  const std::vector<float> query = RandomValues(rng, nq * dim);
  OwnedDocs docs;
  docs.dtype = VectorDtype::kFloat32;
  docs.dim = dim;
  std::uniform_int_distribution<int64_t> len_dist(1, 150);
  for (int d = 0; d < 120; ++d) docs.Add(RandomValues(rng, len_dist(rng) * dim));
  const DocumentBatch batch = docs.Batch();
  MaxSimOptions options;
  options.want_best_tokens = true;

  std::unique_ptr<MaxSimScorer> scorer = MakeScorer(CpuIsa::kAuto, 2);
  ASSERT_NE(scorer, nullptr);
  absl::StatusOr<MaxSimResult> expected = scorer->Score({query.data(), nq, dim}, batch, options);
  ASSERT_TRUE(expected.ok()) << expected.status();

  constexpr int kCallers = 4;
  constexpr int kRounds = 10;
  std::vector<int> mismatches(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int r = 0; r < kRounds; ++r) {
        absl::StatusOr<MaxSimResult> got = scorer->Score({query.data(), nq, dim}, batch, options);
        if (!got.ok() || got->scores != expected->scores ||
            got->best_tokens != expected->best_tokens) {
          ++mismatches[c];
        }
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(mismatches[c], 0) << "caller " << c;
}

TEST(CpuMaxSimScorer, EmptyBatchGivesEmptyResult) {
  std::unique_ptr<MaxSimScorer> scorer = MakeScorer(CpuIsa::kAuto, 2);
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

// Validation: each bad input is INVALID_ARGUMENT with the offending field in the message.
class ValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    scorer_ = MakeScorer(CpuIsa::kPortable, 1);
    ASSERT_NE(scorer_, nullptr);
    refs_ = {{doc_.data(), 2}, {doc_.data(), 1}, {doc_.data(), 2}};
    batch_.dtype = VectorDtype::kFloat32;
    batch_.dim = 4;
    batch_.docs = refs_;
  }

  void ExpectInvalid(FloatMatrixView query, const DocumentBatch& batch,
                     const std::string& message) {
    absl::StatusOr<MaxSimResult> got = scorer_->Score(query, batch);
    ASSERT_FALSE(got.ok()) << "expected an error containing: " << message;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(message));
  }

  std::unique_ptr<MaxSimScorer> scorer_;
  std::vector<float> query_ = std::vector<float>(12, 0.25f);  // 3 × 4
  std::vector<float> doc_ = std::vector<float>(8, 1.0f);      // 2 × 4
  std::vector<DocumentRef> refs_;
  DocumentBatch batch_;
};

TEST_F(ValidationTest, AcceptsValidInput) {
  absl::StatusOr<MaxSimResult> got = scorer_->Score({query_.data(), 3, 4}, batch_);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->scores, ::testing::ElementsAre(3.0f, 3.0f, 3.0f));
}

TEST_F(ValidationTest, RejectsNullQueryData) {
  ExpectInvalid({nullptr, 3, 4}, batch_, "query: data is null");
}

TEST_F(ValidationTest, RejectsEmptyQuery) {
  ExpectInvalid({query_.data(), 0, 4}, batch_, "query: rows 0, expected ≥ 1");
  ExpectInvalid({query_.data(), -2, 4}, batch_, "query: rows -2, expected ≥ 1");
  ExpectInvalid({query_.data(), 3, 0}, batch_, "query: cols 0, expected ≥ 1");
}

TEST_F(ValidationTest, RejectsNonFiniteQuery) {
  query_[6] = NAN;
  ExpectInvalid({query_.data(), 3, 4}, batch_, "query: value at row 1, col 2 is nan");
  query_[6] = 0;
  query_[11] = -INFINITY;
  ExpectInvalid({query_.data(), 3, 4}, batch_, "query: value at row 2, col 3 is -inf");
}

TEST_F(ValidationTest, RejectsDimMismatch) {
  batch_.dim = 5;
  ExpectInvalid({query_.data(), 3, 4}, batch_, "documents: dim 5, expected 4");
}

TEST_F(ValidationTest, RejectsUnknownDtype) {
  batch_.dtype = static_cast<VectorDtype>(9);
  ExpectInvalid({query_.data(), 3, 4}, batch_, "documents: dtype 9");
}

TEST_F(ValidationTest, RejectsDocumentWithoutTokens) {
  refs_[2].num_tokens = 0;
  ExpectInvalid({query_.data(), 3, 4}, batch_, "document 2: num_tokens 0, expected ≥ 1");
  refs_[2].num_tokens = -1;
  ExpectInvalid({query_.data(), 3, 4}, batch_, "document 2: num_tokens -1, expected ≥ 1");
}

TEST_F(ValidationTest, RejectsDocumentWithNullData) {
  refs_[1].data = nullptr;
  ExpectInvalid({query_.data(), 3, 4}, batch_, "document 1: data is null");
}

TEST_F(ValidationTest, RejectsTokenCountBeyondInt32) {
  refs_[0].num_tokens = int64_t{1} << 31;
  ExpectInvalid({query_.data(), 3, 4}, batch_, "document 0: num_tokens 2147483648");
}

// Stage 1's similarity blocks: every kernel against the double-precision reference (each vector
// a one-token document), over query rows around the lane widths, vector counts around the
// micro-kernel panels and prefetch distance, and odd dims; padding lanes are 0.
TEST(QuerySimilarity, MatchesDoublePrecisionReference) {
  std::mt19937 rng(5);
  int checked = 0;
  for (int64_t dim : {1, 7, 64, 130, 384}) {
    for (int64_t nq : {1, 8, 15, 16, 17, 33}) {
      const std::vector<float> query = RandomValues(rng, nq * dim);
      for (int64_t n : {1, 5, 6, 12, 13, 150}) {
        OwnedDocs vectors;
        vectors.dim = dim;
        for (int64_t j = 0; j < n; ++j) vectors.Add(RandomValues(rng, dim));
        const Reference ref = ComputeReference(query, nq, vectors);
        for (CpuIsa isa : kAllIsas) {
          if (!internal::CpuSupportsIsa(isa)) continue;
          const internal::QuerySimilarity similarity({query.data(), nq, dim}, isa);
          ASSERT_GE(similarity.stride(), nq);
          std::vector<float> flat;
          for (const std::vector<float>& v : vectors.values)
            flat.insert(flat.end(), v.begin(), v.end());
          std::vector<float> out(n * similarity.stride(), NAN);
          similarity.Compute(flat.data(), n, out.data());
          for (int64_t j = 0; j < n; ++j) {
            for (int64_t i = 0; i < similarity.stride(); ++i) {
              const float got = out[j * similarity.stride() + i];
              const std::string what =
                  absl::StrCat(internal::CpuIsaName(isa), " dim=", dim, " nq=", nq, " n=", n,
                               " vector ", j, " lane ", i);
              if (i >= nq) {
                ASSERT_EQ(got, 0.0f) << what;
                continue;
              }
              ASSERT_NEAR(got, ref.sims[j][i], 1e-5 * ref.sim_scale[j * nq + i]) << what;
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(NewCpuMaxSimScorer, RejectsNegativeThreadCount) {
  CpuMaxSimOptions options;
  options.num_threads = -1;
  absl::StatusOr<std::unique_ptr<MaxSimScorer>> scorer = NewCpuMaxSimScorer(options);
  ASSERT_FALSE(scorer.ok());
  EXPECT_EQ(scorer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(scorer.status().message()), HasSubstr("num_threads -1"));
}

TEST(NewCpuMaxSimScorer, AutoPicksTheDetectedIsa) {
  absl::StatusOr<std::unique_ptr<MaxSimScorer>> scorer = NewCpuMaxSimScorer();
  ASSERT_TRUE(scorer.ok()) << scorer.status();
  const CpuIsa best = DetectCpuIsa();
  EXPECT_NE(best, CpuIsa::kAuto);
  EXPECT_EQ((*scorer)->name(), absl::StrCat("cpu-", internal::CpuIsaName(best)));
}

TEST(NewCpuMaxSimScorer, UnsupportedIsaIsFailedPrecondition) {
  for (CpuIsa isa : kAllIsas) {
    if (internal::CpuSupportsIsa(isa)) continue;
    CpuMaxSimOptions options;
    options.isa = isa;
    absl::StatusOr<std::unique_ptr<MaxSimScorer>> scorer = NewCpuMaxSimScorer(options);
    ASSERT_FALSE(scorer.ok());
    EXPECT_EQ(scorer.status().code(), absl::StatusCode::kFailedPrecondition);
    return;
  }
  GTEST_SKIP() << "this CPU supports every ISA";
}

TEST(DetectCpuIsa, PortableAlwaysSupported) {
  EXPECT_TRUE(internal::CpuSupportsIsa(CpuIsa::kPortable));
  EXPECT_TRUE(internal::CpuSupportsIsa(DetectCpuIsa()));
}

}  // namespace
}  // namespace tessera
