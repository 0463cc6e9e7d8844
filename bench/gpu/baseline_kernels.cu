// Device helpers of the GPU MaxSim benchmark (see baseline_kernels.h).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "bench/gpu/baseline_kernels.h"

namespace tessera {
namespace bench {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void FillRandomHalfKernel(__half* out, int64_t count, uint64_t seed, float scale) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t bits = SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(i)));
    const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    out[i] = __float2half_rn((2.0f * u - 1.0f) * scale);
  }
}

__global__ void HalfToFloatKernel(const __half* in, float* out, int64_t count) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __half2float(in[i]);
  }
}

// One warp per document, lane i = query token i: coalesced 32-float rows of the tensor.
__global__ void MaxSumKernel(const float* __restrict__ sim, int64_t num_docs, int doc_tokens,
                             int nq, float* __restrict__ scores) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t d = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32; d < num_docs;
       d += warps) {
    float best = -INFINITY;
    if (lane < nq) {
      const float* p = sim + d * doc_tokens * nq + lane;
      for (int j = 0; j < doc_tokens; ++j) best = fmaxf(best, p[int64_t{j} * nq]);
    }
    float sum = lane < nq ? best : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) {
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    }
    if (lane == 0) scores[d] = sum;
  }
}

unsigned GridFor(int64_t items) {
  return static_cast<unsigned>(std::min<int64_t>((items + kThreads - 1) / kThreads, 65536));
}

}  // namespace

cudaError_t FillRandomHalf(void* out, int64_t count, uint64_t seed, float scale,
                           cudaStream_t stream) {
  FillRandomHalfKernel<<<GridFor(count), kThreads, 0, stream>>>(static_cast<__half*>(out), count,
                                                                seed, scale);
  return cudaGetLastError();
}

cudaError_t HalfToFloatOnDevice(const void* in, float* out, int64_t count, cudaStream_t stream) {
  HalfToFloatKernel<<<GridFor(count), kThreads, 0, stream>>>(static_cast<const __half*>(in), out,
                                                             count);
  return cudaGetLastError();
}

cudaError_t MaxSumSimilarities(const float* sim, int64_t num_docs, int doc_tokens, int nq,
                               float* scores, cudaStream_t stream) {
  if (nq > 32) return cudaErrorInvalidValue;
  MaxSumKernel<<<GridFor(num_docs * 32), kThreads, 0, stream>>>(sim, num_docs, doc_tokens, nq,
                                                                scores);
  return cudaGetLastError();
}

}  // namespace bench
}  // namespace tessera
