// AVX2 + FMA + F16C MaxSim kernels (compiled with -mavx2 -mfma -mf16c; only called when the CPU has
// them): the SIMD driver of cpu_maxsim_simd.h over 8-lane ymm vectors. With 16 registers the
// micro-kernel is 16 query lanes (2 ymm) × 6 document tokens = 12 accumulators; per dimension 2
// loads, 6 broadcasts and 12 FMAs. The query is zero-padded to 8 lanes by the caller; fp16 tails
// are copied through a small stack buffer so nothing past a document's end is read.
//
// No std:: or absl:: inline code here (see cpu_maxsim_kernels.h).
#include <immintrin.h>

#include <cstdint>

#include "index/kernels/cpu_maxsim_kernels.h"
#include "index/kernels/cpu_maxsim_simd.h"

namespace tessera {
namespace internal {
namespace {

// The traits interface is described in cpu_maxsim_simd.h. The token indices live in a float
// register (bit patterns only): blendv_ps selects them with the same mask as the maxima.
struct Avx2 {
  using Vec = __m256;
  using Index = __m256;
  using Mask = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kNj = 6;

  static Vec Zero() { return _mm256_setzero_ps(); }
  static Vec Set1(float x) { return _mm256_set1_ps(x); }
  static Vec Broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static Vec Load(const float* p) { return _mm256_load_ps(p); }
  static void Store(float* p, Vec v) { _mm256_store_ps(p, v); }
  static void StoreUnaligned(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec Fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec Max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
  static Mask Greater(Vec a, Vec b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static Vec Blend(Vec a, Vec b, Mask m) { return _mm256_blendv_ps(a, b, m); }

  static Index LoadIndex(const int32_t* p) {
    return _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static Index SetIndex(int32_t t) { return _mm256_castsi256_ps(_mm256_set1_epi32(t)); }
  static void StoreIndex(int32_t* p, Index v) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(p), _mm256_castps_si256(v));
  }
  static Index BlendIndex(Index a, Index b, Mask m) { return _mm256_blendv_ps(a, b, m); }

  static Vec LoadHalf(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void ConvertHalfTail(const uint16_t* src, int64_t count, float* dst) {
    alignas(16) uint16_t tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    alignas(32) float converted[8];
    for (int64_t t = 0; t < count; ++t) tail[t] = src[t];
    _mm256_store_ps(converted, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<__m128i*>(tail))));
    for (int64_t t = 0; t < count; ++t) dst[t] = converted[t];
  }
};

}  // namespace

constexpr MaxSimKernels kAvx2Kernels = {&simd::MaxSim<Avx2>, &simd::SimilarityBlock<Avx2>,
                                        Avx2::kLanes};

}  // namespace internal
}  // namespace tessera
