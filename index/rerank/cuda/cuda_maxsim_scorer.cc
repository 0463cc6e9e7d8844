// The CUDA MaxSim backend: per Score() call, prepares the query for the chosen kernel, gathers the
// candidates' vectors from host memory into a device arena through two pinned staging buffers
// (host copies into one while the other's DMA runs), launches the fused kernel and copies the
// scores back. Batches larger than the memory budget are scored in chunks of documents that fit.
//
// Device memory held between calls (never more than the budget together):
//   work_  : the prepared query, per-document token offsets and counts, scores, best tokens;
//   arena_ : the document vectors of one chunk, contiguous, in batch order.
// Both grow on demand and shrink only when a call's plan would otherwise exceed the budget.
//
// Not here yet: a resident arena (a shard's vectors kept on the device, updated on upsert/delete).
// The kernels already address documents by (token_begin, num_tokens) pairs, so a resident arena
// only needs to upload the candidates' pairs instead of gathering their vectors.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "index/rerank/cuda/device_buffer.h"
#include "index/rerank/cuda/maxsim_kernel.cuh"
#include "tessera/base/mutex.h"
#include "tessera/cuda_maxsim.h"
#include "tessera/maxsim.h"
#include "tessera/status_macros.h"

namespace tessera {
namespace internal {
namespace {

constexpr size_t kDefaultStagingBytes = size_t{32} << 20;
constexpr double kDefaultBudgetFractionOfFree = 0.8;
constexpr size_t kAlignment = 256;  // cudaMalloc's alignment; keeps every sub-buffer aligned

size_t AlignUp(size_t x) { return (x + kAlignment - 1) / kAlignment * kAlignment; }

// Where each part of work_ lives for one call.
struct WorkLayout {
  size_t query = 0;
  size_t token_begin = 0;
  size_t num_tokens = 0;
  size_t scores = 0;
  size_t best_tokens = 0;
  size_t total = 0;
};

WorkLayout PlanWork(size_t query_bytes, size_t num_docs, size_t nq, bool want_best) {
  WorkLayout layout;
  layout.query = 0;
  layout.token_begin = AlignUp(query_bytes);
  layout.num_tokens = AlignUp(layout.token_begin + num_docs * sizeof(int64_t));
  layout.scores = AlignUp(layout.num_tokens + num_docs * sizeof(int32_t));
  layout.best_tokens = AlignUp(layout.scores + num_docs * sizeof(float));
  layout.total = AlignUp(layout.best_tokens + (want_best ? num_docs * nq * sizeof(int32_t) : 0));
  return layout;
}

// Thread-safe: Score() holds mu_ for the whole call, so concurrent callers take turns on the one
// stream, arena and staging buffers (a batch keeps the GPU busy on its own).
class CudaMaxSimScorer final : public MaxSimScorer {
 public:
  CudaMaxSimScorer(int device, std::string name, size_t budget_bytes, size_t staging_bytes,
                   CudaMaxSimKernel kernel)
      : device_(device),
        name_(std::move(name)),
        budget_bytes_(budget_bytes),
        staging_bytes_(staging_bytes),
        kernel_(kernel) {}

  ~CudaMaxSimScorer() override {
    MutexLock lock(&mu_);
    // Buffers are freed on the device they came from; the stream may still hold work only if a
    // call failed half-way.
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_.get());
  }

  // Creates the stream and events; called once before the scorer is handed out.
  absl::Status Init() {
    MutexLock lock(&mu_);
    TESSERA_RETURN_IF_ERROR(stream_.Create());
    for (CudaEvent& event : staged_) TESSERA_RETURN_IF_ERROR(event.Create());
    return absl::OkStatus();
  }

  std::string_view name() const override { return name_; }

 private:
  absl::Status ScoreImpl(FloatMatrixView query, const DocumentBatch& docs,
                         const MaxSimOptions& options, MaxSimResult* result) const override {
    if (docs.docs.empty()) return absl::OkStatus();
    MutexLock lock(&mu_);
    absl::Status status = ScoreLocked(query, docs, options, result);
    if (!status.ok()) {
      // Leave no copy or kernel of this call running into the next one (errors ignored: the
      // first one is being reported).
      cudaStreamSynchronize(stream_.get());
      cudaGetLastError();
    }
    return status;
  }

  absl::Status ScoreLocked(FloatMatrixView query, const DocumentBatch& docs,
                           const MaxSimOptions& options, MaxSimResult* result) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Copies documents [first, last) into arena_ (contiguous, in order) through the pinned staging
  // buffers and enqueues the DMAs on stream_.
  absl::Status GatherChunk(const DocumentBatch& docs, int64_t first, int64_t last,
                           size_t row_bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Gives work_ and arena_ at least the capacities asked, together no more than the budget.
  absl::Status ReserveDeviceMemory(size_t work_bytes, size_t arena_bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int device_;
  const std::string name_;
  const size_t budget_bytes_;
  const size_t staging_bytes_;
  const CudaMaxSimKernel kernel_;

  mutable Mutex mu_;
  mutable CudaStream stream_ ABSL_GUARDED_BY(mu_);
  mutable DeviceBuffer work_ ABSL_GUARDED_BY(mu_);
  mutable DeviceBuffer arena_ ABSL_GUARDED_BY(mu_);
  mutable PinnedBuffer staging_[2] ABSL_GUARDED_BY(mu_);
  // staged_[i] is recorded after the DMA out of staging_[i]; the host waits on it before refilling.
  mutable CudaEvent staged_[2] ABSL_GUARDED_BY(mu_);
  mutable int next_staging_ ABSL_GUARDED_BY(mu_) = 0;
};

absl::Status CudaMaxSimScorer::ReserveDeviceMemory(size_t work_bytes, size_t arena_bytes) const {
  if (work_.capacity() >= work_bytes && arena_.capacity() >= arena_bytes &&
      work_.capacity() + arena_.capacity() <= budget_bytes_) {
    return absl::OkStatus();
  }
  // Free both before allocating, so that old and new buffers never coexist (work_bytes +
  // arena_bytes ≤ budget by construction). Happens when a call needs more than any before it.
  work_.Release();
  arena_.Release();
  TESSERA_RETURN_IF_ERROR(work_.Resize(work_bytes));
  return arena_.Resize(arena_bytes);
}

absl::Status CudaMaxSimScorer::GatherChunk(const DocumentBatch& docs, int64_t first, int64_t last,
                                           size_t row_bytes) const {
  for (PinnedBuffer& staging : staging_) {
    if (staging.capacity() == 0) TESSERA_RETURN_IF_ERROR(staging.Resize(staging_bytes_));
  }
  char* const arena = arena_.data();
  size_t arena_offset = 0;  // where the current staging buffer's bytes go
  size_t fill = 0;
  int s = next_staging_;
  // staging_[s] is free: every flush below waits for the other buffer's previous DMA.
  auto flush = [&]() -> absl::Status {
    TESSERA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(arena + arena_offset, staging_[s].data(), fill,
                                                 cudaMemcpyHostToDevice, stream_.get()),
                                 "cudaMemcpyAsync of documents to the device");
    TESSERA_CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_[s].get(), stream_.get()),
                                 "cudaEventRecord");
    arena_offset += fill;
    fill = 0;
    s ^= 1;
    next_staging_ = s;
    return CudaStatus(cudaEventSynchronize(staged_[s].get()),
                      "waiting for a document copy to the device");
  };
  for (int64_t d = first; d < last; ++d) {
    const char* src = static_cast<const char*>(docs.docs[d].data);
    size_t left = static_cast<size_t>(docs.docs[d].num_tokens) * row_bytes;
    while (left > 0) {
      const size_t take = std::min(left, staging_bytes_ - fill);
      std::memcpy(staging_[s].data() + fill, src, take);
      fill += take;
      src += take;
      left -= take;
      if (fill == staging_bytes_) TESSERA_RETURN_IF_ERROR(flush());
    }
  }
  if (fill > 0) TESSERA_RETURN_IF_ERROR(flush());
  return absl::OkStatus();
}

absl::Status CudaMaxSimScorer::ScoreLocked(FloatMatrixView query, const DocumentBatch& docs,
                                           const MaxSimOptions& options,
                                           MaxSimResult* result) const {
  TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_),
                               absl::StrCat("cudaSetDevice(", device_, ")"));
  const int64_t nq = query.rows;
  const int64_t dim = query.cols;
  const bool fp16 = docs.dtype == VectorDtype::kFloat16;
  const size_t row_bytes = static_cast<size_t>(dim) * (fp16 ? 2 : 4);
  const int64_t num_docs = static_cast<int64_t>(docs.docs.size());

  MaxSimKernelKind kind = MaxSimKernelKind::kSimt;
  if (kernel_ == CudaMaxSimKernel::kAuto && TensorCoreKernelSupports(fp16, dim)) {
    kind = MaxSimKernelKind::kTensorCore;
  } else if (!SimtKernelSupports(dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("documents: dim ", dim, " exceeds the CUDA scorer's limit of ", kSimtMaxDim,
                     " (one fp32 query row in 48 KiB of shared memory); use the CPU scorer"));
  }
  const PreparedQuery prepared = PrepareMaxSimQuery(kind, query.data, nq, dim);

  // Plan device memory: results and query first, the rest of the budget for document vectors.
  const WorkLayout layout = PlanWork(prepared.bytes(), static_cast<size_t>(num_docs),
                                     static_cast<size_t>(nq), options.want_best_tokens);
  if (layout.total > budget_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "CUDA scorer: the query and results of ", num_docs, " documents need ", layout.total,
        " bytes of device memory, the budget is ", budget_bytes_,
        " bytes (CudaMaxSimOptions::memory_budget_bytes); score fewer documents per call"));
  }
  const size_t arena_limit = (budget_bytes_ - layout.total) / kAlignment * kAlignment;
  size_t total_bytes = 0;
  for (int64_t d = 0; d < num_docs; ++d) {
    const size_t bytes = static_cast<size_t>(docs.docs[d].num_tokens) * row_bytes;
    if (bytes > arena_limit) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "CUDA scorer: document ", d, " (", docs.docs[d].num_tokens, " tokens × dim ", dim,
          ") needs ", bytes, " bytes of device memory, but the budget of ", budget_bytes_,
          " bytes leaves ", arena_limit, " after the query and results"));
    }
    total_bytes += bytes;
  }
  const size_t arena_bytes = std::min(AlignUp(total_bytes), arena_limit);
  TESSERA_RETURN_IF_ERROR(ReserveDeviceMemory(layout.total, arena_bytes));

  // Chunks of consecutive documents that fit the arena; token offsets restart in each chunk.
  std::vector<int64_t> token_begin(num_docs);
  std::vector<int32_t> num_tokens(num_docs);
  std::vector<int64_t> chunk_starts = {0};
  size_t used = 0;
  for (int64_t d = 0; d < num_docs; ++d) {
    const size_t bytes = static_cast<size_t>(docs.docs[d].num_tokens) * row_bytes;
    if (used + bytes > arena_bytes) {
      chunk_starts.push_back(d);
      used = 0;
    }
    token_begin[d] = static_cast<int64_t>(used / row_bytes);
    num_tokens[d] = static_cast<int32_t>(docs.docs[d].num_tokens);
    used += bytes;
  }
  chunk_starts.push_back(num_docs);

  char* const work = work_.data();
  const cudaStream_t stream = stream_.get();
  // Pageable sources: each call returns once the bytes are staged, so the vectors may go.
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(work + layout.query, prepared.words.data(),
                                               prepared.bytes(), cudaMemcpyHostToDevice, stream),
                               "cudaMemcpyAsync of the query");
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(work + layout.token_begin, token_begin.data(),
                      token_begin.size() * sizeof(int64_t), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync of document offsets");
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(work + layout.num_tokens, num_tokens.data(),
                      num_tokens.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync of document lengths");

  auto* scores = reinterpret_cast<float*>(work + layout.scores);
  auto* best_tokens =
      options.want_best_tokens ? reinterpret_cast<int32_t*>(work + layout.best_tokens) : nullptr;
  for (size_t c = 0; c + 1 < chunk_starts.size(); ++c) {
    const int64_t first = chunk_starts[c];
    const int64_t last = chunk_starts[c + 1];
    // The DMAs into the arena queue behind the previous chunk's kernel on the same stream.
    TESSERA_RETURN_IF_ERROR(GatherChunk(docs, first, last, row_bytes));
    MaxSimLaunch launch;
    launch.docs.vectors = arena_.data();
    launch.docs.token_begin = reinterpret_cast<const int64_t*>(work + layout.token_begin) + first;
    launch.docs.num_tokens = reinterpret_cast<const int32_t*>(work + layout.num_tokens) + first;
    launch.docs.num_docs = last - first;
    launch.docs.dim = dim;
    launch.docs.fp16 = fp16;
    launch.query = work + layout.query;
    launch.scores = scores + first;
    launch.best_tokens = best_tokens != nullptr ? best_tokens + first * nq : nullptr;
    TESSERA_CUDA_RETURN_IF_ERROR(LaunchMaxSim(prepared, launch, stream),
                                 "launching the MaxSim kernel");
  }

  // Pageable destinations: these copies return once the data has arrived.
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(result->scores.data(), scores, result->scores.size() * sizeof(float),
                      cudaMemcpyDeviceToHost, stream),
      "running the MaxSim kernel and copying scores back");
  if (best_tokens != nullptr) {
    TESSERA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(result->best_tokens.data(), best_tokens,
                                                 result->best_tokens.size() * sizeof(int32_t),
                                                 cudaMemcpyDeviceToHost, stream),
                                 "copying best tokens back");
  }
  return CudaStatus(cudaStreamSynchronize(stream), "running the MaxSim kernel");
}

}  // namespace
}  // namespace internal

bool CudaDeviceAvailable() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky, but keep later calls' error state clean
    return false;
  }
  return count > 0;
}

absl::StatusOr<std::unique_ptr<MaxSimScorer>> NewCudaMaxSimScorer(
    const CudaMaxSimOptions& options) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device visible: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
  }
  if (count == 0) return absl::FailedPreconditionError("no CUDA device visible");
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("device ", options.device, ", expected 0..",
                                                   count - 1, " (", count,
                                                   " CUDA devices visible)"));
  }
  if (options.kernel != CudaMaxSimKernel::kAuto && options.kernel != CudaMaxSimKernel::kSimt) {
    return absl::InvalidArgumentError(absl::StrCat("kernel ", static_cast<int>(options.kernel),
                                                   ", expected a CudaMaxSimKernel enumerator"));
  }
  cudaDeviceProp prop;
  TESSERA_RETURN_IF_ERROR(internal::CudaStatus(cudaGetDeviceProperties(&prop, options.device),
                                               "cudaGetDeviceProperties"));
  if (prop.major < 8) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", options.device, " (", prop.name, ") has compute capability ",
                     prop.major, ".", prop.minor, "; the CUDA MaxSim scorer needs 8.0 or newer"));
  }
  TESSERA_RETURN_IF_ERROR(internal::CudaStatus(cudaSetDevice(options.device), "cudaSetDevice"));
  TESSERA_RETURN_IF_ERROR(internal::CudaStatus(
      internal::CheckMaxSimKernelImage(),
      absl::StrCat("loading the MaxSim kernels for ", prop.name, " (sm_", prop.major, prop.minor,
                   "; this build targets CMAKE_CUDA_ARCHITECTURES)")));

  size_t budget = options.memory_budget_bytes;
  if (budget == 0) {
    size_t free_bytes = 0, total_bytes = 0;
    TESSERA_RETURN_IF_ERROR(
        internal::CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
    budget = static_cast<size_t>(static_cast<double>(free_bytes) *
                                 internal::kDefaultBudgetFractionOfFree);
  }
  const size_t staging = options.pinned_staging_bytes != 0 ? options.pinned_staging_bytes
                                                           : internal::kDefaultStagingBytes;
  std::string name = absl::StrCat("cuda-sm", prop.major, prop.minor,
                                  options.kernel == CudaMaxSimKernel::kSimt ? "-simt" : "");
  auto scorer = std::make_unique<internal::CudaMaxSimScorer>(options.device, std::move(name),
                                                             budget, staging, options.kernel);
  TESSERA_RETURN_IF_ERROR(scorer->Init());
  return scorer;
}

}  // namespace tessera
