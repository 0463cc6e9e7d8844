// CPU MaxSim backend: the query prepared once per call and the split of documents over the thread
// pool. The kernels and their run-time selection are in index/kernels/.
#include "index/rerank/cpu_maxsim_scorer.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tessera {
namespace internal {
namespace {

// A chunk of documents should be worth at least this many multiply-adds before it is handed to
// another thread (waking a worker costs microseconds).
constexpr int64_t kMinChunkMultiplyAdds = int64_t{1} << 20;
// Chunks per thread, so that documents of uneven length still balance.
constexpr int64_t kChunksPerThread = 4;

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

CpuMaxSimScorer::CpuMaxSimScorer(CpuIsa isa, std::shared_ptr<ThreadPool> pool)
    : isa_(isa),
      name_(absl::StrCat("cpu-", CpuIsaName(isa))),
      kernel_(KernelsFor(isa).maxsim),
      lane_multiple_(KernelsFor(isa).lanes),
      pool_(std::move(pool)) {}

absl::Status CpuMaxSimScorer::ScoreImpl(FloatMatrixView query, const DocumentBatch& docs,
                                        const MaxSimOptions& options, MaxSimResult* result) const {
  const int64_t nq = query.rows;
  const int64_t dim = query.cols;
  const int64_t lanes = RoundUp(nq, lane_multiple_);

  const AlignedBuffer query_t = TransposeQuery(query, lanes);

  MaxSimKernelArgs args;
  args.query_t = static_cast<const float*>(query_t.get());
  args.lanes = lanes;
  args.nq = nq;
  args.dim = dim;
  args.dtype = docs.dtype;
  args.docs = docs.docs.data();
  args.scores = result->scores.data();
  args.best_tokens = options.want_best_tokens ? result->best_tokens.data() : nullptr;

  const int64_t num_docs = static_cast<int64_t>(docs.docs.size());
  const int64_t scratch_bytes = MaxSimScratchBytes(lanes, dim);
  auto run = [&](int64_t begin, int64_t end) {
    AlignedBuffer scratch = AllocateAligned(scratch_bytes);
    kernel_(args, begin, end, scratch.get());
  };

  const int64_t threads = pool_->num_threads();
  if (threads == 1 || num_docs <= 1) {
    run(0, num_docs);
    return absl::OkStatus();
  }
  int64_t total_tokens = 0;
  for (const DocumentRef& doc : docs.docs) total_tokens += doc.num_tokens;
  const int64_t work_per_doc = std::max<int64_t>(1, nq * dim * total_tokens / num_docs);
  const int64_t grain = std::max({int64_t{1}, num_docs / (threads * kChunksPerThread),
                                  (kMinChunkMultiplyAdds + work_per_doc - 1) / work_per_doc});
  pool_->ParallelFor(num_docs, grain, run);
  return absl::OkStatus();
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<MaxSimScorer>> NewCpuMaxSimScorer(const CpuMaxSimOptions& options) {
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_threads ", options.num_threads,
                                                   ", expected ≥ 0 (0 = all hardware threads)"));
  }
  CpuIsa isa = options.isa;
  if (isa == CpuIsa::kAuto) isa = DetectCpuIsa();
  if (isa != CpuIsa::kAvx512 && isa != CpuIsa::kAvx2 && isa != CpuIsa::kPortable) {
    return absl::InvalidArgumentError(
        absl::StrCat("isa ", static_cast<int>(isa), ", expected a CpuIsa enumerator"));
  }
  if (!internal::CpuSupportsIsa(isa)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "isa ", internal::CpuIsaName(isa), " is not supported by this CPU (best available: ",
        internal::CpuIsaName(DetectCpuIsa()), ")"));
  }
  return std::make_unique<internal::CpuMaxSimScorer>(
      isa, std::make_shared<internal::ThreadPool>(options.num_threads));
}

}  // namespace tessera
