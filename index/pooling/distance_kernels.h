// The double-precision Gram matrix behind hierarchical pooling's distances. A register-blocked
// AVX-512 or AVX2+FMA version is chosen at run time (the two give the same bits); the portable
// version defines the result (they agree with it to rounding).
#ifndef TESSERA_INDEX_POOLING_DISTANCE_KERNELS_H_
#define TESSERA_INDEX_POOLING_DISTANCE_KERNELS_H_

#include <cstdint>

namespace tessera::internal {

// out[i * n + j] = Σ_k rows[i * m + k] · rows[j * m + k] for all i, j < n (the full symmetric
// n × n matrix). rows: n × m, row-major.
void GramMatrix(const double* rows, int32_t n, int64_t m, double* out);

// The kernel pinned to one implementation, for tests and benchmarks. The AVX-512 one may only be
// called when Cpu().avx512f is true, the AVX2 one when Cpu().Avx2Fma() is (cpu_features.h).
void GramMatrixPortable(const double* rows, int32_t n, int64_t m, double* out);
void GramMatrixAvx512(const double* rows, int32_t n, int64_t m, double* out);
void GramMatrixAvx2(const double* rows, int32_t n, int64_t m, double* out);

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_POOLING_DISTANCE_KERNELS_H_
