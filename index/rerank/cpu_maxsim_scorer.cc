// CPU MaxSim backend: run-time ISA selection, query preparation (transpose + padding, once per
// call) and the split of documents over the thread pool. The kernels are in cpu_maxsim_*.cc.
#include "index/rerank/cpu_maxsim_scorer.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "index/common/cpu_features.h"

namespace tessera {
namespace internal {
namespace {

// A chunk of documents should be worth at least this many multiply-adds before it is handed to
// another thread (waking a worker costs microseconds).
constexpr int64_t kMinChunkMultiplyAdds = int64_t{1} << 20;
// Chunks per thread, so that documents of uneven length still balance.
constexpr int64_t kChunksPerThread = 4;

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

const MaxSimKernels& KernelsFor(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return kAvx512Kernels;
    case CpuIsa::kAvx2:
      return kAvx2Kernels;
    default:
      return kPortableKernels;
  }
}

// query_t[k * lanes + i] = query[i][k], padding lanes zero: a tile of query rows at one dimension
// is one aligned vector load in the kernels.
AlignedBuffer TransposeQuery(FloatMatrixView query, int64_t lanes) {
  const int64_t nq = query.rows;
  const int64_t dim = query.cols;
  AlignedBuffer buffer = AllocateAligned(dim * lanes * int64_t{sizeof(float)});
  float* query_t = static_cast<float*>(buffer.get());
  std::memset(query_t, 0, static_cast<size_t>(dim * lanes) * sizeof(float));
  for (int64_t i = 0; i < nq; ++i) {
    const float* row = query.data + i * dim;
    for (int64_t k = 0; k < dim; ++k) query_t[k * lanes + i] = row[k];
  }
  return buffer;
}

}  // namespace

void AlignedFree::operator()(void* p) const {
  ::operator delete(p, std::align_val_t(kMaxSimAlignment));
}

AlignedBuffer AllocateAligned(int64_t bytes) {
  return AlignedBuffer(
      ::operator new(static_cast<size_t>(std::max<int64_t>(bytes, kMaxSimAlignment)),
                     std::align_val_t(kMaxSimAlignment)));
}

QuerySimilarity::QuerySimilarity(FloatMatrixView queries, CpuIsa isa) {
  if (isa == CpuIsa::kAuto) isa = DetectCpuIsa();
  dim_ = queries.cols;
  const MaxSimKernels& kernels = KernelsFor(isa);
  lanes_ = RoundUp(queries.rows, kernels.lanes);
  query_t_ = TransposeQuery(queries, lanes_);
  kernel_ = kernels.similarity;
}

void QuerySimilarity::Compute(const float* vectors, int64_t n, float* out) const {
  kernel_(static_cast<const float*>(query_t_.get()), lanes_, dim_, vectors, n, out);
}

bool CpuSupportsIsa(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return Cpu().Avx512() && Cpu().f16c;
    case CpuIsa::kAvx2:
      return Cpu().Avx2Fma() && Cpu().f16c;
    case CpuIsa::kAuto:
    case CpuIsa::kPortable:
      return true;
  }
  return false;
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
      return "auto";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kPortable:
      return "portable";
  }
  return "unknown";
}

CpuMaxSimScorer::CpuMaxSimScorer(CpuIsa isa, int num_threads)
    : isa_(isa),
      name_(absl::StrCat("cpu-", CpuIsaName(isa))),
      kernel_(KernelsFor(isa).maxsim),
      lane_multiple_(KernelsFor(isa).lanes),
      pool_(std::make_unique<ThreadPool>(num_threads)) {}

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

CpuIsa DetectCpuIsa() {
  static const CpuIsa kBest = [] {
    if (internal::CpuSupportsIsa(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
    if (internal::CpuSupportsIsa(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
    return CpuIsa::kPortable;
  }();
  return kBest;
}

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
  return std::make_unique<internal::CpuMaxSimScorer>(isa, options.num_threads);
}

}  // namespace tessera
