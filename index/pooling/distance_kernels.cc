// The SIMD kernels work on a transposed copy of the rows, so that consecutive columns j of the
// output are two vectors: per k they broadcast rows[i][k] for a block of rows i and issue FMAs
// into independent accumulators that become output rows directly (no horizontal sums). AVX-512
// blocks 8 rows × 16 columns, AVX2 4 rows × 8 columns (16 registers). Only blocks that reach the
// upper triangle are computed; the rest is mirrored. Each entry is the FMA chain over k in order,
// so both kernels give the same bits.
#include "index/pooling/distance_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "index/common/cpu_features.h"

namespace tessera::internal {
namespace {

constexpr int kRowsPerBlock = 8;
constexpr int kColsPerBlock = 16;
constexpr int kAvx2RowsPerBlock = 4;
constexpr int kAvx2ColsPerBlock = 8;
constexpr int kTile = 16;

// columns[k * padded + j] = rows[j][k], zero-padded to `padded` columns (a whole number of column
// blocks). Transposed in tiles so that reads and writes both stay within a few cache lines.
void TransposeRows(const double* rows, int32_t n, int64_t m, int64_t padded,
                   std::vector<double>* columns) {
  columns->assign(padded * m, 0.0);
  for (int32_t j0 = 0; j0 < n; j0 += kTile) {
    for (int64_t k0 = 0; k0 < m; k0 += kTile) {
      for (int32_t j = j0; j < std::min<int32_t>(j0 + kTile, n); ++j) {
        for (int64_t k = k0; k < std::min<int64_t>(k0 + kTile, m); ++k) {
          (*columns)[k * padded + j] = rows[j * m + k];
        }
      }
    }
  }
}

// Fills the entries left of each row block's first column block from the computed upper part,
// in tiles for the same reason as the transpose.
void MirrorLowerBlocks(int32_t n, int rows_per_block, int cols_per_block, double* out) {
  auto computed_from = [&](int32_t i) {
    return i / rows_per_block * rows_per_block / cols_per_block * cols_per_block;
  };
  for (int32_t i0 = 0; i0 < n; i0 += kTile) {
    for (int32_t j0 = 0; j0 < computed_from(i0 + kTile - 1); j0 += kTile) {
      for (int32_t i = i0; i < std::min<int32_t>(i0 + kTile, n); ++i) {
        const int32_t j_end = std::min(j0 + kTile, computed_from(i));
        for (int32_t j = j0; j < j_end; ++j) {
          out[static_cast<int64_t>(i) * n + j] = out[static_cast<int64_t>(j) * n + i];
        }
      }
    }
  }
}

}  // namespace

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
  const int64_t padded = (n + kColsPerBlock - 1) / kColsPerBlock * kColsPerBlock;
  thread_local std::vector<double> columns;
  TransposeRows(rows, n, m, padded, &columns);
  for (int32_t i0 = 0; i0 < n; i0 += kRowsPerBlock) {
    // Rows past the end repeat the last row; their results are not stored.
    const double* a[kRowsPerBlock];
    for (int r = 0; r < kRowsPerBlock; ++r) {
      a[r] = rows + static_cast<int64_t>(i0 + r < n ? i0 + r : n - 1) * m;
    }
    for (int64_t j0 = i0 / kColsPerBlock * kColsPerBlock; j0 < n; j0 += kColsPerBlock) {
      __m512d acc[kRowsPerBlock][2];
#pragma GCC unroll 8
      for (int r = 0; r < kRowsPerBlock; ++r) {
        acc[r][0] = _mm512_setzero_pd();
        acc[r][1] = _mm512_setzero_pd();
      }
      const double* column = columns.data() + j0;
      for (int64_t k = 0; k < m; ++k, column += padded) {
        const __m512d c0 = _mm512_loadu_pd(column);
        const __m512d c1 = _mm512_loadu_pd(column + 8);
#pragma GCC unroll 8
        for (int r = 0; r < kRowsPerBlock; ++r) {
          const __m512d value = _mm512_set1_pd(a[r][k]);
          acc[r][0] = _mm512_fmadd_pd(value, c0, acc[r][0]);
          acc[r][1] = _mm512_fmadd_pd(value, c1, acc[r][1]);
        }
      }
      const int64_t valid = n - j0 < kColsPerBlock ? n - j0 : kColsPerBlock;
      const __mmask8 mask0 = static_cast<__mmask8>(valid >= 8 ? 0xff : (1u << valid) - 1u);
      const __mmask8 mask1 = static_cast<__mmask8>(valid >= 16  ? 0xff
                                                   : valid <= 8 ? 0
                                                                : (1u << (valid - 8)) - 1u);
      for (int r = 0; r < kRowsPerBlock && i0 + r < n; ++r) {
        double* target = out + static_cast<int64_t>(i0 + r) * n + j0;
        _mm512_mask_storeu_pd(target, mask0, acc[r][0]);
        _mm512_mask_storeu_pd(target + 8, mask1, acc[r][1]);
      }
    }
  }
  MirrorLowerBlocks(n, kRowsPerBlock, kColsPerBlock, out);
}

__attribute__((target("avx2,fma"))) void GramMatrixAvx2(const double* rows, int32_t n, int64_t m,
                                                        double* out) {
  const int64_t padded = (n + kAvx2ColsPerBlock - 1) / kAvx2ColsPerBlock * kAvx2ColsPerBlock;
  thread_local std::vector<double> columns;
  TransposeRows(rows, n, m, padded, &columns);
  for (int32_t i0 = 0; i0 < n; i0 += kAvx2RowsPerBlock) {
    // Rows past the end repeat the last row; their results are not stored.
    const double* a[kAvx2RowsPerBlock];
    for (int r = 0; r < kAvx2RowsPerBlock; ++r) {
      a[r] = rows + static_cast<int64_t>(i0 + r < n ? i0 + r : n - 1) * m;
    }
    for (int64_t j0 = i0 / kAvx2ColsPerBlock * kAvx2ColsPerBlock; j0 < n; j0 += kAvx2ColsPerBlock) {
      __m256d acc[kAvx2RowsPerBlock][2];
#pragma GCC unroll 4
      for (int r = 0; r < kAvx2RowsPerBlock; ++r) {
        acc[r][0] = _mm256_setzero_pd();
        acc[r][1] = _mm256_setzero_pd();
      }
      const double* column = columns.data() + j0;
      for (int64_t k = 0; k < m; ++k, column += padded) {
        const __m256d c0 = _mm256_loadu_pd(column);
        const __m256d c1 = _mm256_loadu_pd(column + 4);
#pragma GCC unroll 4
        for (int r = 0; r < kAvx2RowsPerBlock; ++r) {
          const __m256d value = _mm256_broadcast_sd(&a[r][k]);
          acc[r][0] = _mm256_fmadd_pd(value, c0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_pd(value, c1, acc[r][1]);
        }
      }
      const int64_t valid = std::min<int64_t>(n - j0, kAvx2ColsPerBlock);
      for (int r = 0; r < kAvx2RowsPerBlock && i0 + r < n; ++r) {
        double* target = out + static_cast<int64_t>(i0 + r) * n + j0;
        if (valid == kAvx2ColsPerBlock) {
          _mm256_storeu_pd(target, acc[r][0]);
          _mm256_storeu_pd(target + 4, acc[r][1]);
        } else {
          alignas(32) double block[kAvx2ColsPerBlock];
          _mm256_store_pd(block, acc[r][0]);
          _mm256_store_pd(block + 4, acc[r][1]);
          std::copy(block, block + valid, target);
        }
      }
    }
  }
  MirrorLowerBlocks(n, kAvx2RowsPerBlock, kAvx2ColsPerBlock, out);
}

void GramMatrix(const double* rows, int32_t n, int64_t m, double* out) {
  if (Cpu().avx512f) return GramMatrixAvx512(rows, n, m, out);
  if (Cpu().Avx2Fma()) return GramMatrixAvx2(rows, n, m, out);
  GramMatrixPortable(rows, n, m, out);
}

}  // namespace tessera::internal
