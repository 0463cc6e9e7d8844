// AVX-512 MaxSim kernels (compiled with -mavx512f/bw/vl/dq -mfma -mf16c; only called when the CPU
// has them): the SIMD driver of cpu_maxsim_simd.h over 16-lane zmm vectors. With 32 registers the
// micro-kernel is 32 query lanes (2 zmm) × 12 document tokens = 24 accumulators; per dimension 2
// aligned loads, 12 broadcasts and 24 FMAs. On L1-resident data it runs at the FMA peak (Zen 4:
// one 512-bit FMA per cycle). The query is zero-padded to 16 lanes by the caller; fp16 tails are
// read with masked loads, so nothing past a document's end is ever read.
//
// No std:: or absl:: inline code here (see cpu_maxsim_kernels.h).

// GCC 12's _mm512_undefined_ps() (used by _mm512_max_ps, _mm512_cvtph_ps) initialises a variable
// from itself, which -Wuninitialized reports at every use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "index/kernels/cpu_maxsim_kernels.h"
#include "index/kernels/cpu_maxsim_simd.h"

namespace tessera {
namespace internal {
namespace {

// The traits interface is described in cpu_maxsim_simd.h.
struct Avx512 {
  using Vec = __m512;
  using Index = __m512i;
  using Mask = __mmask16;
  static constexpr int kLanes = 16;
  static constexpr int kNj = 12;

  static Vec Zero() { return _mm512_setzero_ps(); }
  static Vec Set1(float x) { return _mm512_set1_ps(x); }
  static Vec Broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static Vec Load(const float* p) { return _mm512_load_ps(p); }
  static void Store(float* p, Vec v) { _mm512_store_ps(p, v); }
  static void StoreUnaligned(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec Fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec Max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
  static Mask Greater(Vec a, Vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static Vec Blend(Vec a, Vec b, Mask m) { return _mm512_mask_mov_ps(a, m, b); }

  static Index LoadIndex(const int32_t* p) { return _mm512_load_si512(p); }
  static Index SetIndex(int32_t t) { return _mm512_set1_epi32(t); }
  static void StoreIndex(int32_t* p, Index v) { _mm512_store_si512(p, v); }
  static Index BlendIndex(Index a, Index b, Mask m) { return _mm512_mask_mov_epi32(a, m, b); }

  static Vec LoadHalf(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void ConvertHalfTail(const uint16_t* src, int64_t count, float* dst) {
    const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1u);
    _mm512_mask_storeu_ps(dst, mask, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, src)));
  }
};

}  // namespace

constexpr MaxSimKernels kAvx512Kernels = {&simd::MaxSim<Avx512>, &simd::SimilarityBlock<Avx512>,
                                          Avx512::kLanes};

}  // namespace internal
}  // namespace tessera
