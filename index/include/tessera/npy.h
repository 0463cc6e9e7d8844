// Reading and writing NumPy's .npy format (https://numpy.org/neps/nep-0001-npy-format.html) for
// the command-line tools: one dense array of a handful of numeric dtypes, held in memory in C order
// and little-endian byte order. Files that NumPy writes big-endian or in Fortran order are
// converted on read; files are always written as NPY format version 1.0, C order, little-endian.
//
// Everything here is thread-compatible: distinct arrays and files may be used from distinct
// threads at once.
#ifndef TESSERA_NPY_H_
#define TESSERA_NPY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tessera/float16.h"

namespace tessera {

// The element types Tessera reads and writes. NumPy spells them '<f4', '<f2', '<i4', '<i8', '<f8'.
enum class NpyDtype { kFloat32, kFloat16, kInt32, kInt64, kFloat64 };

// Bytes per element: 4, 2, 4, 8, 8.
size_t NpyItemSize(NpyDtype dtype);
// NumPy's name for the dtype: "float32", "float16", "int32", "int64", "float64".
absl::string_view NpyDtypeName(NpyDtype dtype);

// One dense array. Owns its bytes. A valid array has non-negative dims and
// `data.size() == num_elements() * itemsize()`; the parsers only return valid arrays, and the
// serializers reject invalid ones with INVALID_ARGUMENT.
struct NpyArray {
  NpyDtype dtype = NpyDtype::kFloat32;
  // Empty for a 0-d (scalar) array, which holds one element.
  std::vector<int64_t> shape;
  // C order (last index fastest), little-endian.
  std::vector<uint8_t> data;

  // The product of `shape` (1 for a 0-d array); -1 if a dim is negative or the product overflows.
  int64_t num_elements() const;
  size_t itemsize() const { return NpyItemSize(dtype); }
  // OK for a valid array (see above), INVALID_ARGUMENT saying what is inconsistent otherwise.
  absl::Status Validate() const;

  // All elements as fp32, in C order. float16 is exact; float64 rounds to nearest. An integer
  // dtype is INVALID_ARGUMENT (token matrices must be floating point).
  absl::StatusOr<std::vector<float>> ToFloat32() const;
  // All elements as int64, in C order, from an int32 or int64 array; otherwise INVALID_ARGUMENT.
  absl::StatusOr<std::vector<int64_t>> ToInt64() const;

  // Factories that copy their input. `values` holds rows × cols elements, row-major.
  static NpyArray FromFloat32(int64_t rows, int64_t cols, const float* values);
  static NpyArray FromFloat16(int64_t rows, int64_t cols, const Float16* values);
  // 1-D arrays.
  static NpyArray FromFloat32(absl::Span<const float> values);
  static NpyArray FromInt32(absl::Span<const int32_t> values);
  static NpyArray FromInt64(absl::Span<const int64_t> values);
  // Any dtype and shape: copies product(shape) * NpyItemSize(dtype) bytes from `bytes`, which must
  // be in C order and little-endian. Precondition: every dim is non-negative.
  static NpyArray FromBytes(NpyDtype dtype, std::vector<int64_t> shape, const void* bytes);
};

// Parses one .npy payload (NPY format version 1.0, 2.0 or 3.0). Accepted descrs: the five dtypes
// with byte order '<', '=' or '|' (all little-endian here) or '>' (byte-swapped on read).
// fortran_order True is transposed into C order. Every malformed or unsupported input (bad magic,
// unknown version, a header that is not the expected dict, an object or structured dtype, a data
// size that does not match the shape) is INVALID_ARGUMENT; `source` names the input in messages.
absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes, absl::string_view source = "npy buffer");

// The .npy bytes of `array` (format version 1.0, header padded to 64 bytes as NumPy does).
// INVALID_ARGUMENT if the array is not valid.
absl::StatusOr<std::string> SerializeNpy(const NpyArray& array);

// Reads the whole file with one read and parses it. NOT_FOUND if it does not exist,
// PERMISSION_DENIED if it cannot be opened, otherwise as ParseNpy with the path in messages.
absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path);
// Writes `array` as SerializeNpy does, replacing the file. INVALID_ARGUMENT for an invalid array;
// an I/O error (NOT_FOUND for a missing directory, PERMISSION_DENIED, RESOURCE_EXHAUSTED for a full
// disk, INTERNAL otherwise) leaves no partial file behind.
absl::Status WriteNpyFile(const std::string& path, const NpyArray& array);

namespace internal {

// `text` in single quotes for an error message: bytes outside printable ASCII as \xNN, and
// shortened to 200 bytes.
std::string QuoteForMessage(absl::string_view text);

// A shape as NumPy prints it: "(3,)", "(2, 5)".
std::string ShapeStringForMessage(absl::Span<const int64_t> shape);

// The NPY preamble and header (magic, version, header length, dict, padding) for `array`, which
// must be valid.
std::string NpyHeaderBytes(const NpyArray& array);

// ParseNpy on a buffer that it takes over: the array's data reuses the buffer's storage (the data
// is moved to its front), so a large payload is not copied a second time.
absl::StatusOr<NpyArray> ParseNpyBuffer(std::vector<uint8_t> buffer, absl::string_view source);

// What an NPY header says, read before the data is at hand.
struct NpyHeaderInfo {
  NpyDtype dtype = NpyDtype::kFloat32;
  std::vector<int64_t> shape;
  uint64_t data_offset = 0;  // the preamble and header: where the data starts
  uint64_t data_size = 0;    // product(shape) × itemsize
};

// Parses the NPY preamble and header at the start of `prefix` for a payload of `total_size` bytes
// of which `prefix` is the beginning (it must hold the whole header; the data may be cut off), and
// checks that the shape's data is exactly what follows the header: INVALID_ARGUMENT otherwise,
// "…needs N bytes of data, but SIZE_ORIGIN M" (e.g. "the ZIP directory declares"), as for every
// error ParseNpy reports about a header. `total_size` ≥ prefix.size().
absl::StatusOr<NpyHeaderInfo> ParseNpyHeader(absl::string_view prefix, uint64_t total_size,
                                             absl::string_view source,
                                             absl::string_view size_origin = "the file has");

// Reads the whole file at `path` into memory. Errors as ReadNpyFile.
absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path);

// Where serializers put their output, in order: a string or a file.
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual absl::Status Append(absl::string_view bytes) = 0;
};

// Creates or truncates `path` and lets `produce` append to it. On any error (from opening, from
// `produce`, from writing or closing) removes the file and returns the error. I/O errors as
// WriteNpyFile.
absl::Status WriteFileWith(const std::string& path,
                           const std::function<absl::Status(ByteSink&)>& produce);

}  // namespace internal
}  // namespace tessera

#endif  // TESSERA_NPY_H_
