// The fused MaxSim kernels and their host-side launch interface. This header holds no device code:
// it is included by plain C++ (the scorer, the GPU benchmark) and by maxsim_kernel.cu.
//
// Two kernels, both "one warp per document, persistent blocks, query in shared memory, running max
// per query token in registers, no similarity matrix in global memory":
// - tensor core (fp16 documents, dim % 32 == 0, dim ≤ 384): mma.sync m16n8k16 with fp32
//   accumulation; the fp32 query is split into fp16 hi + lo halves (two MMAs), so the only rounding
//   is the documents' own fp16 storage — the same inputs the CPU scorer sees.
// - SIMT (any dim, fp16 or fp32 documents): fp32 FMA, one document token per lane.
#ifndef TESSERA_INDEX_RERANK_CUDA_MAXSIM_KERNEL_CUH_
#define TESSERA_INDEX_RERANK_CUDA_MAXSIM_KERNEL_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tessera {
namespace internal {

enum class MaxSimKernelKind { kSimt, kTensorCore };

// Threads per block: 4 warps, each scoring its own documents.
inline constexpr int kMaxSimWarpsPerBlock = 4;
// The query tiles of one launch live in at most this much (static-limit) shared memory; longer
// queries take several launches that add to the scores in order.
inline constexpr size_t kMaxSimQuerySmemBytes = 48 * 1024;
// Tensor-core kernel: query tokens per tile (two m16 tiles) and the largest dim one tile fits.
inline constexpr int kTensorCoreQueryTile = 32;
inline constexpr int64_t kTensorCoreMaxDim = 384;
// SIMT kernel: query tokens per tile (fewer when dim is so large that 16 rows do not fit) and the
// largest dim (one fp32 query row in shared memory).
inline constexpr int kSimtQueryTile = 16;
inline constexpr int64_t kSimtMaxDim = static_cast<int64_t>(kMaxSimQuerySmemBytes / sizeof(float));

// Whether a kernel handles documents of this storage type and dim.
bool TensorCoreKernelSupports(bool fp16, int64_t dim);
bool SimtKernelSupports(int64_t dim);

// The query in the layout a kernel reads, built on the host once per Score() call and copied to
// the device as is.
struct PreparedQuery {
  MaxSimKernelKind kind = MaxSimKernelKind::kSimt;
  int64_t nq = 0;
  int64_t dim = 0;
  int tile_tokens = 0;           // query tokens per tile
  int64_t num_tiles = 0;         // ceil(nq / tile_tokens)
  int64_t tiles_per_launch = 0;  // tiles whose shared-memory image fits kMaxSimQuerySmemBytes
  // The kernel sums are multiplied by this: the tensor-core kernel scales the query by a power of
  // two (max |q| → [1, 2)) so that its fp16 halves neither overflow nor lose bits.
  float inv_scale = 1.0f;
  // Device image. Tensor core: num_tiles × (dim/32) × 2 (m16 tile) × 2 (rows g, g+8) × 2 (hi, lo) ×
  // 32 (lane) 16-byte fragments, zero beyond nq. SIMT: the fp32 query, nq × dim row-major.
  std::vector<uint32_t> words;

  size_t bytes() const { return words.size() * sizeof(uint32_t); }
};

// query: nq × dim fp32, row-major, finite, nq ≥ 1. Requires TensorCoreKernelSupports(true, dim)
// for kTensorCore and SimtKernelSupports(dim) for kSimt.
PreparedQuery PrepareMaxSimQuery(MaxSimKernelKind kind, const float* query, int64_t nq,
                                 int64_t dim);

// Documents in device memory. Document d is num_tokens[d] rows of `dim` values starting at row
// token_begin[d] of `vectors`; documents need not be adjacent or in order, so a gathered arena
// (prefix offsets) and a resident arena (any subset) look the same to the kernels.
struct DeviceDocuments {
  const void* vectors = nullptr;         // __half when fp16, else float; 16-byte aligned
  const int64_t* token_begin = nullptr;  // num_docs entries
  const int32_t* num_tokens = nullptr;   // num_docs entries, each ≥ 1
  int64_t num_docs = 0;
  int64_t dim = 0;
  bool fp16 = true;
};

struct MaxSimLaunch {
  DeviceDocuments docs;
  const void* query = nullptr;     // device copy of PreparedQuery::words
  float* scores = nullptr;         // num_docs entries
  int32_t* best_tokens = nullptr;  // null, or num_docs × nq entries: [d * nq + i]
};

// cudaSuccess when this binary holds kernel code the current device can run (else, typically,
// cudaErrorNoKernelImageForDevice).
cudaError_t CheckMaxSimKernelImage();

// Enqueues on `stream` the launches that write scores[d] = MaxSim(query, document d) (and the
// argmax document token per query token, lowest index among exact ties). Every pointer is a device
// pointer on the current device. Returns the launch error, if any (execution errors surface at the
// next synchronisation).
cudaError_t LaunchMaxSim(const PreparedQuery& query, const MaxSimLaunch& launch,
                         cudaStream_t stream);

}  // namespace internal
}  // namespace tessera

#endif  // TESSERA_INDEX_RERANK_CUDA_MAXSIM_KERNEL_CUH_
