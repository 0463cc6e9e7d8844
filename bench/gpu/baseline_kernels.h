// Device helpers of the GPU MaxSim benchmark: synthetic documents generated on the device, the fp32
// copy the FP32 baseline multiplies, and the max/sum pass of the materialising baseline (which
// reads a similarity tensor that a cuBLAS GEMM wrote to global memory).
#ifndef TESSERA_BENCH_GPU_BASELINE_KERNELS_H_
#define TESSERA_BENCH_GPU_BASELINE_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace tessera {
namespace bench {

// out[i] = fp16 of a uniform value in [-scale, scale) drawn from a hash of (seed, i).
cudaError_t FillRandomHalf(void* out, int64_t count, uint64_t seed, float scale,
                           cudaStream_t stream);

// out[i] = (float) in[i] for `count` fp16 values.
cudaError_t HalfToFloatOnDevice(const void* in, float* out, int64_t count, cudaStream_t stream);

// scores[d] = Σ_i max_j sim[(d · doc_tokens + j) · nq + i]: the max over document tokens and sum
// over query tokens of a materialised num_docs × doc_tokens × nq fp32 similarity tensor. nq ≤ 32.
cudaError_t MaxSumSimilarities(const float* sim, int64_t num_docs, int doc_tokens, int nq,
                               float* scores, cudaStream_t stream);

}  // namespace bench
}  // namespace tessera

#endif  // TESSERA_BENCH_GPU_BASELINE_KERNELS_H_
