// The AVX-512 kernel computes 4 × 4 blocks of (i, j) row pairs at once: per 8 columns it loads 8
// row chunks and issues 16 FMAs into 16 independent accumulators, enough to hide FMA latency. Only
// blocks with j ≥ i are computed; the result is mirrored.
#include "index/pooling/distance_kernels.h"

#include <immintrin.h>

namespace tessera::internal {
namespace {

constexpr int kBlock = 4;

__attribute__((target("avx512f"), always_inline)) inline void BlockStep(
    const __m512d (&va)[kBlock], const __m512d (&vb)[kBlock], __m512d (&acc)[kBlock][kBlock]) {
#pragma GCC unroll 4
  for (int r = 0; r < kBlock; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < kBlock; ++c) acc[r][c] = _mm512_fmadd_pd(va[r], vb[c], acc[r][c]);
  }
}

}  // namespace

bool CpuHasAvx512ForPooling() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

void GramMatrixPortable(const double* rows, int32_t n, int64_t m, double* out) {
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t j = i; j < n; ++j) {
      double sum = 0.0;
      for (int64_t k = 0; k < m; ++k) sum += rows[i * m + k] * rows[j * m + k];
      out[static_cast<int64_t>(i) * n + j] = sum;
      out[static_cast<int64_t>(j) * n + i] = sum;
    }
  }
}

__attribute__((target("avx512f"))) void GramMatrixAvx512(const double* rows, int32_t n, int64_t m,
                                                         double* out) {
  const int64_t full = m & ~int64_t{7};
  const __mmask8 tail_mask = static_cast<__mmask8>((1u << (m - full)) - 1u);
  for (int32_t i0 = 0; i0 < n; i0 += kBlock) {
    for (int32_t j0 = i0; j0 < n; j0 += kBlock) {
      // Rows past the end are clamped to the last row; their results are discarded.
      const double* a[kBlock];
      const double* b[kBlock];
      for (int t = 0; t < kBlock; ++t) {
        a[t] = rows + static_cast<int64_t>(i0 + t < n ? i0 + t : n - 1) * m;
        b[t] = rows + static_cast<int64_t>(j0 + t < n ? j0 + t : n - 1) * m;
      }
      __m512d acc[kBlock][kBlock];
#pragma GCC unroll 4
      for (int r = 0; r < kBlock; ++r) {
#pragma GCC unroll 4
        for (int c = 0; c < kBlock; ++c) acc[r][c] = _mm512_setzero_pd();
      }
      __m512d va[kBlock], vb[kBlock];
      for (int64_t k = 0; k < full; k += 8) {
#pragma GCC unroll 4
        for (int t = 0; t < kBlock; ++t) {
          va[t] = _mm512_loadu_pd(a[t] + k);
          vb[t] = _mm512_loadu_pd(b[t] + k);
        }
        BlockStep(va, vb, acc);
      }
      if (tail_mask != 0) {
#pragma GCC unroll 4
        for (int t = 0; t < kBlock; ++t) {
          va[t] = _mm512_maskz_loadu_pd(tail_mask, a[t] + full);
          vb[t] = _mm512_maskz_loadu_pd(tail_mask, b[t] + full);
        }
        BlockStep(va, vb, acc);
      }
      for (int r = 0; r < kBlock && i0 + r < n; ++r) {
        for (int c = 0; c < kBlock && j0 + c < n; ++c) {
          const int32_t i = i0 + r, j = j0 + c;
          if (j < i) continue;
          const double value = _mm512_reduce_add_pd(acc[r][c]);
          out[static_cast<int64_t>(i) * n + j] = value;
          out[static_cast<int64_t>(j) * n + i] = value;
        }
      }
    }
  }
}

void GramMatrix(const double* rows, int32_t n, int64_t m, double* out) {
  if (CpuHasAvx512ForPooling()) return GramMatrixAvx512(rows, n, m, out);
  GramMatrixPortable(rows, n, m, out);
}

}  // namespace tessera::internal
