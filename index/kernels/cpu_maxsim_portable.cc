// Portable MaxSim kernel: plain C++ loops for any CPU, same semantics as the SIMD kernels. One
// document token at a time: its similarities to all query tokens are accumulated over the
// transposed query (an inner loop over query tokens the compiler can vectorise with baseline SSE2),
// then folded into the running max. Also defines the scratch size shared by all kernels.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "index/kernels/cpu_maxsim_kernels.h"
#include "tessera/float16.h"

namespace tessera {
namespace internal {
namespace {

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

int64_t MaxSimScratchBytes(int64_t lanes, int64_t dim) {
  // run_max, run_idx and one more lanes-sized region (portable: similarities), then the panel.
  return 3 * RoundUp(lanes * 4, kMaxSimAlignment) +
         RoundUp(kMaxSimPanelTokens * dim * 4, kMaxSimAlignment);
}

namespace {

void MaxSimPortable(const MaxSimKernelArgs& args, int64_t begin, int64_t end, void* scratch) {
  const int64_t lanes = args.lanes;
  const int64_t nq = args.nq;
  const int64_t dim = args.dim;
  unsigned char* bytes = static_cast<unsigned char*>(scratch);
  float* run_max = reinterpret_cast<float*>(bytes);
  bytes += RoundUp(lanes * 4, kMaxSimAlignment);
  int32_t* run_idx = reinterpret_cast<int32_t*>(bytes);
  bytes += RoundUp(lanes * 4, kMaxSimAlignment);
  float* sims = reinterpret_cast<float*>(bytes);
  bytes += RoundUp(lanes * 4, kMaxSimAlignment);
  float* row_buffer = reinterpret_cast<float*>(bytes);

  for (int64_t d = begin; d < end; ++d) {
    const DocumentRef& doc = args.docs[d];
    std::fill(run_max, run_max + nq, -std::numeric_limits<float>::infinity());
    std::fill(run_idx, run_idx + nq, 0);
    for (int64_t j = 0; j < doc.num_tokens; ++j) {
      const float* row;
      if (args.dtype == VectorDtype::kFloat16) {
        HalfToFloat(static_cast<const Float16*>(doc.data) + j * dim, static_cast<size_t>(dim),
                    row_buffer);
        row = row_buffer;
      } else {
        row = static_cast<const float*>(doc.data) + j * dim;
      }
      std::fill(sims, sims + nq, 0.0f);
      for (int64_t k = 0; k < dim; ++k) {
        const float x = row[k];
        const float* q = args.query_t + k * lanes;
        for (int64_t i = 0; i < nq; ++i) sims[i] += q[i] * x;
      }
      for (int64_t i = 0; i < nq; ++i) {
        if (sims[i] > run_max[i]) {  // strictly greater: the lowest index wins exact ties
          run_max[i] = sims[i];
          run_idx[i] = static_cast<int32_t>(j);
        }
      }
    }
    float score = 0.0f;
    for (int64_t i = 0; i < nq; ++i) score += run_max[i];
    args.scores[d] = score;
    if (args.best_tokens != nullptr) std::copy(run_idx, run_idx + nq, args.best_tokens + d * nq);
  }
}

void SimilarityBlockPortable(const float* query_t, int64_t lanes, int64_t dim, const float* vectors,
                             int64_t n, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    const float* row = vectors + j * dim;
    float* sims = out + j * lanes;
    std::fill(sims, sims + lanes, 0.0f);
    for (int64_t k = 0; k < dim; ++k) {
      const float x = row[k];
      const float* q = query_t + k * lanes;
      for (int64_t i = 0; i < lanes; ++i) sims[i] += q[i] * x;
    }
  }
}

}  // namespace

// One lane: the loops need no padding.
constexpr MaxSimKernels kPortableKernels = {&MaxSimPortable, &SimilarityBlockPortable, 1};

}  // namespace internal
}  // namespace tessera
