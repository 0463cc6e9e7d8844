// Deterministic rerank matrices for the storage tests: the same (dtype, shape, seed) always gives
// the same bytes, so a test can write one and compare what it reads back with a fresh copy.
#ifndef TESSERA_INDEX_TESTING_STORED_MATRIX_H_
#define TESSERA_INDEX_TESTING_STORED_MATRIX_H_

#include <cmath>
#include <cstdint>
#include <vector>

#include "index/storage/shard_store.h"
#include "tessera/float16.h"

namespace tessera::internal {

// rows × cols values of `dtype` (fp16: sin, fp32: cos of a seeded ramp), as stored.
inline StoredMatrix MakeMatrix(VectorDtype dtype, int64_t rows, int64_t cols, uint32_t seed) {
  StoredMatrix m{dtype, rows, cols, {}};
  const int64_t n = rows * cols;
  if (dtype == VectorDtype::kFloat16) {
    std::vector<Float16> values(n);
    for (int64_t i = 0; i < n; ++i) values[i] = FloatToHalf(std::sin(0.37f * (i + seed)));
    m.bytes.assign(reinterpret_cast<const char*>(values.data()), n * 2);
  } else {
    std::vector<float> values(n);
    for (int64_t i = 0; i < n; ++i) values[i] = std::cos(0.11f * (i + seed));
    m.bytes.assign(reinterpret_cast<const char*>(values.data()), n * 4);
  }
  return m;
}

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_TESTING_STORED_MATRIX_H_
