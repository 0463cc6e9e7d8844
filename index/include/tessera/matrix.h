// Non-owning views of row-major token matrices, the currency of the index library's API.
#ifndef TESSERA_MATRIX_H_
#define TESSERA_MATRIX_H_

#include <cstdint>

#include "tessera/float16.h"

namespace tessera {

// The storage type of token vectors.
enum class VectorDtype {
  kFloat32,
  kFloat16,
};

// `rows × cols` fp32 values, row-major and contiguous (`data[r * cols + c]`). Does not own `data`.
struct FloatMatrixView {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

}  // namespace tessera

#endif  // TESSERA_MATRIX_H_
