// The CUDA backend of MaxSimScorer (DESIGN §6): exact MaxSim on one GPU with fp32 accumulation.
// Optional at build time (TESSERA_ENABLE_CUDA): without CUDA the factory returns UNIMPLEMENTED and
// CudaDeviceAvailable() is false, so callers can fall back to NewCpuMaxSimScorer().
#ifndef TESSERA_CUDA_MAXSIM_H_
#define TESSERA_CUDA_MAXSIM_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "tessera/maxsim.h"

namespace tessera {

// Which kernel scores a batch.
enum class CudaMaxSimKernel {
  // Tensor cores (mma.sync, fp16 × fp16 → fp32) when the batch is fp16 with dim a multiple of 32
  // and ≤ 384; the SIMT kernel otherwise.
  kAuto,
  // Always the SIMT kernel (fp32 FMA on CUDA cores): any dtype and dim. For comparison and tests.
  kSimt,
};

struct CudaMaxSimOptions {
  // The CUDA device ordinal.
  int device = 0;
  // Device memory this scorer may hold (document arena, query, offsets and results), in bytes.
  // 0 = 80% of the device's free memory when the scorer is created. A batch larger than the budget
  // is scored in chunks; a batch whose results and largest document cannot fit at all is
  // RESOURCE_EXHAUSTED.
  size_t memory_budget_bytes = 0;
  // Size of each of the two pinned host buffers through which documents are gathered and copied to
  // the device. 0 = 32 MiB.
  size_t pinned_staging_bytes = 0;
  CudaMaxSimKernel kernel = CudaMaxSimKernel::kAuto;
};

// Returns a scorer on `options.device`, or
// - UNIMPLEMENTED "built without CUDA" when TESSERA_ENABLE_CUDA was off;
// - FAILED_PRECONDITION "no CUDA device visible" (with the CUDA error, if any) when there is no
//   usable device, or when the device's compute capability is below 8.0;
// - INVALID_ARGUMENT for a device ordinal that does not exist.
//
// The scorer is thread-safe: Score() may be called from several threads; calls are serialised on
// one CUDA stream by a mutex (one batch occupies the whole GPU anyway). Scores match the CPU scorer
// to fp32 rounding (the tensor-core kernel splits the fp32 query into two fp16 halves, so only
// the documents are fp16, as on the CPU). Documents are gathered from host memory on every call;
// Score() returns INTERNAL with the CUDA error string for any failing CUDA call and
// RESOURCE_EXHAUSTED when device memory runs out.
absl::StatusOr<std::unique_ptr<MaxSimScorer>> NewCudaMaxSimScorer(
    const CudaMaxSimOptions& options = {});

// Whether this build has the CUDA backend and at least one CUDA device is visible.
bool CudaDeviceAvailable();

}  // namespace tessera

#endif  // TESSERA_CUDA_MAXSIM_H_
