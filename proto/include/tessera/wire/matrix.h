// Token matrices as tessera.v1 packs them (v1::Matrix): rows × cols values, row-major, as
// little-endian IEEE 754 binary32 (DTYPE_FLOAT32, 4 bytes each) or binary16 (DTYPE_FLOAT16, 2 bytes
// each) in one bytes field — never repeated floats. The checks, packing and unpacking that the
// server, the C++ client and the fuzz targets share; on a big-endian host the bytes are swapped.
// Stateless, thread-safe.
#ifndef TESSERA_WIRE_MATRIX_H_
#define TESSERA_WIRE_MATRIX_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "tessera/float16.h"
#include "tessera/v1/common.pb.h"

namespace tessera::wire {

// Bytes per value of a wire dtype: 4 for DTYPE_FLOAT32, 2 for DTYPE_FLOAT16, 0 for any other.
size_t DtypeSize(v1::DType dtype);

// OK when a matrix of `rows` × `cols` values of `dtype` packed into `data_bytes` bytes is well
// formed, checked in this order, each failure INVALID_ARGUMENT with a message that starts with
// `field` (which names the matrix: "documents[3] ('a17').tokens", "query"):
//   - dtype is DTYPE_FLOAT32 or DTYPE_FLOAT16: "<field>: dtype DTYPE_UNSPECIFIED (0), expected
//     DTYPE_FLOAT32 or DTYPE_FLOAT16";
//   - when expected_cols > 0, cols == expected_cols: "<field>: cols (dim) 96, expected 128";
//   - data_bytes == rows × cols × DtypeSize(dtype), computed without overflow: "<field>: 23 bytes
//     of data, expected rows 2 × cols 3 × 4 = 24" (or "… × 4 (over 2^64)").
absl::Status CheckMatrix(uint32_t rows, uint32_t cols, v1::DType dtype, size_t data_bytes,
                         int64_t expected_cols, absl::string_view field);
// The same for a v1::Matrix.
absl::Status CheckMatrix(const v1::Matrix& matrix, int64_t expected_cols, absl::string_view field);

// Appends `count` fp32 values to `out` packed as `dtype`: DTYPE_FLOAT32 as they are, DTYPE_FLOAT16
// rounded to nearest even (beyond the fp16 range: ±inf). Precondition: DtypeSize(dtype) > 0.
void PackFloat32(const float* values, size_t count, v1::DType dtype, std::string* out);
// Appends `count` fp16 values to `out` packed as DTYPE_FLOAT16 (bit for bit).
void PackFloat16(const Float16* values, size_t count, std::string* out);

// Unpacks `count` values of `dtype` from `bytes` into fp32 (fp16 widens exactly). Preconditions:
// DtypeSize(dtype) > 0 and `bytes` holds count × DtypeSize(dtype) bytes (CheckMatrix).
void UnpackToFloat32(const char* bytes, size_t count, v1::DType dtype, float* out);

// `values` (rows × cols fp32, row-major) packed into `out` as `dtype`: its shape, dtype and data
// replaced. Precondition: DtypeSize(dtype) > 0.
void EncodeMatrix(const float* values, uint32_t rows, uint32_t cols, v1::DType dtype,
                  v1::Matrix* out);

}  // namespace tessera::wire

#endif  // TESSERA_WIRE_MATRIX_H_
