// The CUDA MaxSim backend when Tessera is built without CUDA (TESSERA_ENABLE_CUDA=OFF): the factory
// says so, and no device is ever available, so callers fall back to the CPU scorer.
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tessera/cuda_maxsim.h"
#include "tessera/maxsim.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<MaxSimScorer>> NewCudaMaxSimScorer(const CudaMaxSimOptions&) {
  return absl::UnimplementedError(
      "CUDA MaxSim scorer: built without CUDA (configure with -DTESSERA_ENABLE_CUDA=ON and a CUDA "
      "toolkit)");
}

bool CudaDeviceAvailable() { return false; }

}  // namespace tessera
