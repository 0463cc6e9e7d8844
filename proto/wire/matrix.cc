#include "tessera/wire/matrix.h"

#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera::wire {
namespace {

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
constexpr bool kLittleEndianHost = false;
#else
constexpr bool kLittleEndianHost = true;
#endif

// Reverses the bytes of each of `count` values of `width` bytes at `bytes`, in place.
void SwapEach(char* bytes, size_t count, size_t width) {
  for (size_t i = 0; i < count; ++i) {
    char* value = bytes + i * width;
    for (size_t b = 0; b < width / 2; ++b) std::swap(value[b], value[width - 1 - b]);
  }
}

// Appends `count` values of `width` bytes each, in host order at `src`, little-endian to `out`;
// returns where they start.
char* AppendLittleEndian(const void* src, size_t count, size_t width, std::string* out) {
  const size_t offset = out->size();
  out->resize(offset + count * width);
  char* dst = out->data() + offset;
  if (count == 0) return dst;  // memcpy may not take the null data() of an empty source
  std::memcpy(dst, src, count * width);
  if (!kLittleEndianHost) SwapEach(dst, count, width);
  return dst;
}

}  // namespace

size_t DtypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return 4;
    case v1::DTYPE_FLOAT16:
      return 2;
    default:
      return 0;
  }
}

absl::Status CheckMatrix(uint32_t rows, uint32_t cols, v1::DType dtype, size_t data_bytes,
                         int64_t expected_cols, absl::string_view field) {
  const size_t itemsize = DtypeSize(dtype);
  if (itemsize == 0) {
    const std::string& name = v1::DType_Name(dtype);
    const int number = static_cast<int>(dtype);
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": dtype ",
                     name.empty() ? absl::StrCat(number) : absl::StrCat(name, " (", number, ")"),
                     ", expected DTYPE_FLOAT32 or DTYPE_FLOAT16"));
  }
  if (expected_cols > 0 && static_cast<int64_t>(cols) != expected_cols) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": cols (dim) ", cols, ", expected ", expected_cols));
  }
  const uint64_t count = static_cast<uint64_t>(rows) * cols;  // < 2^64
  // count × itemsize can pass 2^64 (rows = cols = 2^31 of fp32 wraps to 0 bytes): checked before
  // the multiplication.
  const bool too_large = count > std::numeric_limits<uint64_t>::max() / itemsize;
  if (too_large || data_bytes != count * itemsize) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", data_bytes, " bytes of data, expected rows ", rows, " × cols ",
                     cols, " × ", itemsize, too_large ? " (over 2^64)" : " = ",
                     too_large ? "" : absl::StrCat(count * itemsize)));
  }
  return absl::OkStatus();
}

absl::Status CheckMatrix(const v1::Matrix& matrix, int64_t expected_cols, absl::string_view field) {
  return CheckMatrix(matrix.rows(), matrix.cols(), matrix.dtype(), matrix.data().size(),
                     expected_cols, field);
}

void PackFloat32(const float* values, size_t count, v1::DType dtype, std::string* out) {
  if (dtype == v1::DTYPE_FLOAT32) {
    AppendLittleEndian(values, count, sizeof(float), out);
    return;
  }
  const size_t offset = out->size();
  out->resize(offset + count * sizeof(Float16));
  if (count == 0) return;
  char* dst = out->data() + offset;
  FloatToHalf(values, count, reinterpret_cast<Float16*>(dst));
  if (!kLittleEndianHost) SwapEach(dst, count, sizeof(Float16));
}

void PackFloat16(const Float16* values, size_t count, std::string* out) {
  AppendLittleEndian(values, count, sizeof(Float16), out);
}

void UnpackToFloat32(const char* bytes, size_t count, v1::DType dtype, float* out) {
  if (count == 0) return;
  if (dtype == v1::DTYPE_FLOAT32) {
    std::memcpy(out, bytes, count * sizeof(float));
    if (!kLittleEndianHost) SwapEach(reinterpret_cast<char*>(out), count, sizeof(float));
    return;
  }
  if (kLittleEndianHost) {
    HalfToFloat(reinterpret_cast<const Float16*>(bytes), count, out);
    return;
  }
  std::vector<Float16> halves(count);
  std::memcpy(halves.data(), bytes, count * sizeof(Float16));
  SwapEach(reinterpret_cast<char*>(halves.data()), count, sizeof(Float16));
  HalfToFloat(halves.data(), count, out);
}

void EncodeMatrix(const float* values, uint32_t rows, uint32_t cols, v1::DType dtype,
                  v1::Matrix* out) {
  out->set_rows(rows);
  out->set_cols(cols);
  out->set_dtype(dtype);
  std::string* data = out->mutable_data();
  data->clear();
  PackFloat32(values, static_cast<size_t>(rows) * cols, dtype, data);
}

}  // namespace tessera::wire
