// Exact late-interaction scoring: MaxSim(q, d) = Σ_i max_j ⟨q_i, d_j⟩ over query tokens i and
// document tokens j. One interface, several backends (CPU now, CUDA later): the public,
// non-virtual Score() validates shapes and owns the result; each backend implements ScoreImpl().
#ifndef TESSERA_MAXSIM_H_
#define TESSERA_MAXSIM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tessera/matrix.h"

namespace tessera {

// One document's token matrix: `num_tokens × dim` values of the batch's dtype, row-major and
// contiguous. Not owned.
struct DocumentRef {
  const void* data = nullptr;
  int64_t num_tokens = 0;
};

// The documents to score against one query. All share `dtype` and `dim`.
struct DocumentBatch {
  VectorDtype dtype = VectorDtype::kFloat16;
  int64_t dim = 0;
  absl::Span<const DocumentRef> docs;
};

struct MaxSimOptions {
  // Also report, for each (document, query token), the index of the document token that attains
  // the maximum (the lowest index among exact ties).
  bool want_best_tokens = false;
};

struct MaxSimResult {
  // scores[d] = MaxSim(query, docs[d]), accumulated in fp32.
  std::vector<float> scores;
  // When asked: best_tokens[d * query_tokens + i] is the argmax document token of query token i
  // for document d. Empty otherwise.
  std::vector<int32_t> best_tokens;
};

// Scores one query against a batch of documents. Implementations are thread-safe: Score() may be
// called concurrently from several threads on one scorer.
class MaxSimScorer {
 public:
  virtual ~MaxSimScorer() = default;

  // query: `nq × dim` fp32, row-major, nq ≥ 1, finite values.
  // Returns INVALID_ARGUMENT when the query is empty or not finite, when query and documents
  // disagree on `dim`, or when a document has no tokens or no data; otherwise the backend's
  // status (UNIMPLEMENTED for a backend not compiled in).
  absl::StatusOr<MaxSimResult> Score(FloatMatrixView query, const DocumentBatch& docs,
                                     const MaxSimOptions& options = {}) const;

  // A short name for logs and benchmarks, e.g. "cpu-avx512".
  virtual std::string_view name() const = 0;

 private:
  // Called with validated inputs and `result` sized: scores has docs.size() entries, best_tokens
  // docs.size() × nq entries when asked, else empty.
  virtual absl::Status ScoreImpl(FloatMatrixView query, const DocumentBatch& docs,
                                 const MaxSimOptions& options, MaxSimResult* result) const = 0;
};

// The instruction set a CPU scorer uses.
enum class CpuIsa {
  kAuto,      // the best one this CPU supports, chosen at run time
  kAvx512,    // AVX-512F (fp16 loads via VCVTPH2PS)
  kAvx2,      // AVX2 + FMA + F16C
  kPortable,  // plain C++, any CPU
};

struct CpuMaxSimOptions {
  CpuIsa isa = CpuIsa::kAuto;
  // Threads that split the documents of one Score() call; 0 = all hardware threads, 1 = the calling
  // thread only.
  int num_threads = 0;
};

// Returns the CPU scorer, or FAILED_PRECONDITION when `options.isa` names an instruction set this
// CPU lacks, or INVALID_ARGUMENT for a negative thread count.
absl::StatusOr<std::unique_ptr<MaxSimScorer>> NewCpuMaxSimScorer(
    const CpuMaxSimOptions& options = {});

// The best instruction set this CPU supports (never kAuto).
CpuIsa DetectCpuIsa();

// Scores with `primary` and, when a call fails with anything but INVALID_ARGUMENT (a device error,
// device memory exhausted), passes the failure to `on_fallback` (may be null) and scores the call
// with `fallback` instead. Thread-safe if both scorers and on_fallback are.
std::unique_ptr<MaxSimScorer> NewFallbackMaxSimScorer(
    std::shared_ptr<const MaxSimScorer> primary, std::shared_ptr<const MaxSimScorer> fallback,
    std::function<void(const absl::Status&)> on_fallback);

}  // namespace tessera

#endif  // TESSERA_MAXSIM_H_
