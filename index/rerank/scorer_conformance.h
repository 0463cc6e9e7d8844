// The conformance suite every MaxSimScorer implementation runs, and the test helpers it is built
// on: owned document batches, random data and the double-precision brute-force reference that all
// backends are checked against. Test-only (target tessera::scorer_conformance).
//
// A backend's test instantiates both suites over its factories:
//
//   using maxsim_testing::MaxSimScorerConformance;
//   using maxsim_testing::MaxSimScorerValidation;
//   INSTANTIATE_TEST_SUITE_P(Cpu, MaxSimScorerConformance, ::testing::ValuesIn(factories));
//   INSTANTIATE_TEST_SUITE_P(Cpu, MaxSimScorerValidation, ::testing::ValuesIn(factories));
#ifndef TESSERA_INDEX_RERANK_SCORER_CONFORMANCE_H_
#define TESSERA_INDEX_RERANK_SCORER_CONFORMANCE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "tessera/float16.h"
#include "tessera/matrix.h"
#include "tessera/maxsim.h"

namespace tessera {
namespace maxsim_testing {

// Tolerances of CheckAgainstReference. A score must be within both
// - kScoreTolerance × max(1, Σ_i max_j |sim_ij|) of the reference, and
// - kFp32RelativeTolerance (fp32 storage) or kFp16RelativeTolerance (fp16 storage) ×
//   max(|reference|, 1% of the Cauchy–Schwarz bound Σ_i ‖q_i‖·max_j ‖d_j‖), so that very small
//   queries are held to a bound of their own size and scores near zero are not held to a
//   relative one.
// A best token other than the reference argmax must be a near-tie: its similarity within both
// kSimTolerance × max(1, max_j Σ_k |q_ik d_jk|) and kNearTieTolerance × the larger Σ_k |q_ik d_jk|
// of the two tokens.
inline constexpr double kScoreTolerance = 1e-5;
inline constexpr double kSimTolerance = 1e-5;
inline constexpr double kFp32RelativeTolerance = 1e-4;
inline constexpr double kFp16RelativeTolerance = 1e-3;
inline constexpr double kNearTieTolerance = 1e-4;

// A document batch with owned storage. Values are kept as the fp32 the reference uses (for fp16,
// the decoded fp16 values) and as the bytes the scorer reads. Not thread-safe.
struct OwnedDocs {
  OwnedDocs(VectorDtype dtype, int64_t dim) : dtype(dtype), dim(dim) {}

  // tokens: num_tokens × dim values, rounded through fp16 when dtype is kFloat16.
  void Add(std::vector<float> tokens);
  int64_t num_tokens(size_t d) const { return static_cast<int64_t>(values[d].size()) / dim; }
  // Call after the last Add: the views point into values/halves, which must not move.
  DocumentBatch Batch();

  VectorDtype dtype;
  int64_t dim;
  std::vector<std::vector<float>> values;    // per document, num_tokens × dim
  std::vector<std::vector<Float16>> halves;  // fp16 storage, when dtype is kFloat16
  std::vector<DocumentRef> refs;
};

// Double-precision brute force of one query against a batch, independent of every kernel.
struct Reference {
  std::vector<double> scores;                 // per document
  std::vector<double> score_scale;            // per document: max(1, Σ_i max_j |sim|)
  std::vector<double> score_bound;            // per document: Σ_i ‖q_i‖ · max_j ‖d_j‖
  std::vector<std::vector<double>> sims;      // per document, nq × num_tokens
  std::vector<std::vector<double>> abs_sums;  // per document, nq × num_tokens: Σ_k |q_ik d_jk|
  std::vector<double> sim_scale;  // per document × query token: max(1, max_j Σ_k |q d|)
};

// query: nq × docs.dim values, row-major.
Reference ComputeReference(const std::vector<float>& query, int64_t nq, const OwnedDocs& docs);

// `count` values uniform in [lo, hi).
std::vector<float> RandomValues(std::mt19937& rng, int64_t count, float lo = -1, float hi = 1);
// rows × dim values, each row of unit length (like the embeddings the server stores).
std::vector<float> RandomUnitRows(std::mt19937& rng, int64_t rows, int64_t dim);

// Checks `got` (scores and best tokens: scored with want_best_tokens) against the reference within
// the tolerances above, and the top-10 order against the reference's (documents may swap only when
// their reference scores tie within twice the tolerance). Each failure is reported through gtest
// with `what` in the message; returns their number (it stops counting past 10).
int CheckAgainstReference(const MaxSimResult& got, const Reference& ref, const OwnedDocs& docs,
                          int64_t nq, const std::string& what);

// One MaxSimScorer implementation under test.
struct ScorerFactory {
  // A short name for test names and messages, e.g. "avx2".
  std::string name;
  // Why the scorer cannot run here (the CPU lacks the ISA, no CUDA device), or "" when it can:
  // every case then skips with this reason. Null means always available.
  std::function<std::string()> unavailable;
  // Makes a scorer. num_threads (≥ 1) is the thread count when takes_threads; else ignored.
  std::function<absl::StatusOr<std::unique_ptr<MaxSimScorer>>(int num_threads)> make;
  bool takes_threads = false;
};

// Prints the factory's name: gtest shows it as GetParam() and ctest names the cases by it (the
// `/0`, `/1` … of the gtest names become `/portable`, `/avx2` …).
void PrintTo(const ScorerFactory& factory, std::ostream* os);

// Results against the reference (dims, dtypes, document lengths around every backend's tile
// sizes, long queries, tiny and huge queries), exact ties, thread counts, concurrent callers and
// the empty batch.
class MaxSimScorerConformance : public ::testing::TestWithParam<ScorerFactory> {
 protected:
  void SetUp() override;
  // The scorer, or null after reporting the factory's error.
  std::unique_ptr<MaxSimScorer> Make(int num_threads) const;
  // The thread counts to run each case with: {1, 2} when the factory takes one, else {1}.
  std::vector<int> ThreadCounts() const;
};

// Each bad input is INVALID_ARGUMENT with the offending field in the message (MaxSimScorer::Score
// validates for every backend; a wrapper must not hide it).
class MaxSimScorerValidation : public ::testing::TestWithParam<ScorerFactory> {
 protected:
  void SetUp() override;
  void ExpectInvalid(FloatMatrixView query, const DocumentBatch& batch, const std::string& message);

  std::unique_ptr<MaxSimScorer> scorer_;
  std::vector<float> query_ = std::vector<float>(12, 0.25f);  // 3 × 4
  std::vector<float> doc_ = std::vector<float>(8, 1.0f);      // 2 × 4
  std::vector<DocumentRef> refs_;
  DocumentBatch batch_;
};

}  // namespace maxsim_testing
}  // namespace tessera

#endif  // TESSERA_INDEX_RERANK_SCORER_CONFORMANCE_H_
