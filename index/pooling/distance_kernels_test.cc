#include "index/pooling/distance_kernels.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "index/common/cpu_features.h"

namespace tessera::internal {
namespace {

// Every (n, m) shape class: row blocks of 8 (4) and column blocks of 16 (8) with and without
// remainders.
TEST(GramMatrix, MatchesLongDoubleReferenceForAllShapes) {
  std::mt19937 rng(9);
  std::normal_distribution<double> normal;
  for (int32_t n : {1, 2, 3, 5, 8, 9, 16, 17, 33, 40}) {
    for (int64_t m : {1, 7, 8, 13, 128, 130}) {
      std::vector<double> rows(n * m);
      for (double& v : rows) v = normal(rng);
      std::vector<double> gram(n * n), gram_portable(n * n);
      GramMatrix(rows.data(), n, m, gram.data());
      GramMatrixPortable(rows.data(), n, m, gram_portable.data());
      // The SIMD kernels: the same FMA chain per entry, so the same bits.
      std::vector<double> gram_avx2(n * n), gram_avx512(n * n);
      if (Cpu().Avx2Fma()) GramMatrixAvx2(rows.data(), n, m, gram_avx2.data());
      if (Cpu().avx512f) {
        GramMatrixAvx512(rows.data(), n, m, gram_avx512.data());
        if (Cpu().Avx2Fma()) EXPECT_EQ(gram_avx2, gram_avx512) << n << " " << m;
      }
      for (int32_t i = 0; i < n; ++i) {
        for (int32_t j = 0; j < n; ++j) {
          long double dot = 0;
          for (int64_t k = 0; k < m; ++k)
            dot += static_cast<long double>(rows[i * m + k]) * rows[j * m + k];
          const double tol = 1e-12 * (1.0 + m);
          EXPECT_NEAR(gram[i * n + j], static_cast<double>(dot), tol) << n << " " << m;
          EXPECT_NEAR(gram_portable[i * n + j], static_cast<double>(dot), tol);
          if (Cpu().Avx2Fma()) {
            EXPECT_NEAR(gram_avx2[i * n + j], static_cast<double>(dot), tol);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera::internal
