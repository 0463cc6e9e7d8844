// The .npy reader and writer, and the whole-file I/O that the .npz code shares. The header is a
// Python dict literal; it is parsed by a small recursive-descent parser for the subset of Python
// literals NumPy writes (strings, integers, booleans, tuples, lists, dicts) so that anything else
// in a hostile file is reported instead of misread.
#include "tessera/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tessera/base/errno_status.h"
#include "tessera/status_macros.h"

static_assert(
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
    "the NPY code stores arrays in the host's byte order and assumes it is little-endian");

namespace tessera {
namespace {

constexpr absl::string_view kMagic("\x93NUMPY", 6);
constexpr size_t kMaxDims = 64;  // NumPy 2 allows 64, NumPy 1 only 32.
constexpr int kMaxNesting = 16;  // Bounds the parser's recursion on hostile headers.
constexpr absl::string_view kExpectedDescrs = "'<f4', '<f2', '<i4', '<i8' or '<f8'";

std::string Quote(absl::string_view text) { return internal::QuoteForMessage(text); }

// The product of `shape`, or false if a dim is negative or the product overflows int64.
bool ShapeProduct(absl::Span<const int64_t> shape, int64_t* product) {
  int64_t result = 1;
  bool zero = false;
  for (int64_t dim : shape) {
    if (dim < 0) return false;
    if (dim == 0) zero = true;
  }
  if (zero) {
    *product = 0;
    return true;
  }
  for (int64_t dim : shape) {
    if (__builtin_mul_overflow(result, dim, &result)) return false;
  }
  *product = result;
  return true;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

absl::string_view Descr(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::kFloat32:
      return "<f4";
    case NpyDtype::kFloat16:
      return "<f2";
    case NpyDtype::kInt32:
      return "<i4";
    case NpyDtype::kInt64:
      return "<i8";
    case NpyDtype::kFloat64:
      return "<f8";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Python literals.

struct PyValue {
  enum class Kind { kString, kInt, kBool, kNone, kTuple, kList, kDict };
  Kind kind = Kind::kNone;
  std::string str;       // kString
  int64_t integer = 0;   // kInt
  bool boolean = false;  // kBool
  // kTuple, kList: the elements. kDict: the values, parallel to `keys`.
  std::vector<PyValue> items;
  std::vector<std::string> keys;  // kDict
  absl::string_view text;         // The literal as written.
};

class PyLiteralParser {
 public:
  explicit PyLiteralParser(absl::string_view text) : text_(text) {}

  // Parses one literal followed by nothing but whitespace. On failure error() says why.
  bool Parse(PyValue* value) {
    if (!ParseValue(0, value)) return false;
    SkipSpace();
    if (pos_ != text_.size()) return Fail("unexpected characters after the literal");
    return true;
  }
  const std::string& error() const { return error_; }

 private:
  bool Fail(absl::string_view what) {
    error_ = absl::StrCat(what, " at offset ", pos_);
    return false;
  }
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }
  static bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
  static bool IsDigit(char c) { return c >= '0' && c <= '9'; }
  static bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
  void SkipSpace() {
    while (!AtEnd() && IsSpace(Peek())) ++pos_;
  }

  bool ParseValue(int depth, PyValue* out) {
    SkipSpace();
    if (depth > kMaxNesting) return Fail("literal nested too deeply");
    if (AtEnd()) return Fail("unexpected end of header");
    const size_t start = pos_;
    const char c = Peek();
    bool ok;
    if (c == '\'' || c == '"') {
      ok = ParseString(out);
    } else if (c == '-' || c == '+' || IsDigit(c)) {
      ok = ParseInt(out);
    } else if (c == '(') {
      ok = ParseSequence(depth, ')', PyValue::Kind::kTuple, out);
    } else if (c == '[') {
      ok = ParseSequence(depth, ']', PyValue::Kind::kList, out);
    } else if (c == '{') {
      ok = ParseDict(depth, out);
    } else if (IsAlpha(c)) {
      ok = ParseName(out);
    } else {
      return Fail(absl::StrCat("unexpected character ", Quote(text_.substr(pos_, 1))));
    }
    if (ok) out->text = text_.substr(start, pos_ - start);
    return ok;
  }

  bool ParseString(PyValue* out) {
    const char quote = Peek();
    ++pos_;
    out->kind = PyValue::Kind::kString;
    out->str.clear();
    while (!AtEnd() && Peek() != quote) {
      if (Peek() == '\\') {  // Escapes are kept as the escaped character; enough for messages.
        ++pos_;
        if (AtEnd()) break;
      }
      out->str.push_back(Peek());
      ++pos_;
    }
    if (AtEnd()) return Fail("unterminated string");
    ++pos_;
    return true;
  }

  bool ParseInt(PyValue* out) {
    bool negative = false;
    if (Peek() == '-' || Peek() == '+') {
      negative = Peek() == '-';
      ++pos_;
    }
    if (AtEnd() || !IsDigit(Peek())) return Fail("expected digits");
    uint64_t magnitude = 0;
    while (!AtEnd() && IsDigit(Peek())) {
      magnitude = magnitude * 10 + static_cast<uint64_t>(Peek() - '0');
      if (magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Fail("integer out of range");
      }
      ++pos_;
    }
    if (!AtEnd() && (Peek() == 'L' || Peek() == 'l')) ++pos_;  // Python 2 longs: (3L, 4L).
    out->kind = PyValue::Kind::kInt;
    out->integer = negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude);
    return true;
  }

  bool ParseName(PyValue* out) {
    const size_t start = pos_;
    while (!AtEnd() && (IsAlpha(Peek()) || IsDigit(Peek()) || Peek() == '_')) ++pos_;
    const absl::string_view name = text_.substr(start, pos_ - start);
    if (name == "True" || name == "False") {
      out->kind = PyValue::Kind::kBool;
      out->boolean = name == "True";
    } else if (name == "None") {
      out->kind = PyValue::Kind::kNone;
    } else {
      pos_ = start;
      return Fail(absl::StrCat("unexpected name ", Quote(name)));
    }
    return true;
  }

  // A tuple or list. "(x)" without a comma is just x, as in Python.
  bool ParseSequence(int depth, char close, PyValue::Kind kind, PyValue* out) {
    ++pos_;
    std::vector<PyValue> items;
    bool comma = false;
    while (true) {
      SkipSpace();
      if (AtEnd()) return Fail("unexpected end of header");
      if (Peek() == close) break;
      items.emplace_back();
      if (!ParseValue(depth + 1, &items.back())) return false;
      SkipSpace();
      if (AtEnd()) return Fail("unexpected end of header");
      if (Peek() == ',') {
        comma = true;
        ++pos_;
      } else if (Peek() != close) {
        return Fail(absl::StrCat("expected ',' or '", std::string(1, close), "'"));
      }
    }
    ++pos_;
    if (kind == PyValue::Kind::kTuple && items.size() == 1 && !comma) {
      *out = std::move(items[0]);
      return true;
    }
    out->kind = kind;
    out->items = std::move(items);
    return true;
  }

  bool ParseDict(int depth, PyValue* out) {
    ++pos_;
    out->kind = PyValue::Kind::kDict;
    while (true) {
      SkipSpace();
      if (AtEnd()) return Fail("unexpected end of header");
      if (Peek() == '}') break;
      PyValue key;
      if (!ParseValue(depth + 1, &key)) return false;
      if (key.kind != PyValue::Kind::kString) return Fail("dict key is not a string");
      SkipSpace();
      if (AtEnd() || Peek() != ':') return Fail("expected ':'");
      ++pos_;
      out->keys.push_back(std::move(key.str));
      out->items.emplace_back();
      if (!ParseValue(depth + 1, &out->items.back())) return false;
      SkipSpace();
      if (AtEnd()) return Fail("unexpected end of header");
      if (Peek() == ',') {
        ++pos_;
      } else if (Peek() != '}') {
        return Fail("expected ',' or '}'");
      }
    }
    ++pos_;
    return true;
  }

  absl::string_view text_;
  size_t pos_ = 0;
  std::string error_;
};

// ---------------------------------------------------------------------------------------------
// Headers.

struct NpyHeader {
  NpyDtype dtype = NpyDtype::kFloat32;
  bool big_endian = false;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  size_t data_offset = 0;  // Where the array data starts in the payload.
  size_t data_size = 0;    // Bytes of array data: product(shape) * itemsize.
};

absl::Status ParseDescr(const PyValue& value, absl::string_view source, NpyHeader* header) {
  if (value.kind == PyValue::Kind::kList) {
    std::string quoted = Quote(value.text);
    if (quoted.back() == '\'') quoted = quoted.substr(1, quoted.size() - 2);  // A short list.
    return absl::InvalidArgumentError(absl::StrCat(source, ": structured dtype (descr ", quoted,
                                                   ") is not supported; expected ",
                                                   kExpectedDescrs));
  }
  if (value.kind != PyValue::Kind::kString) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": 'descr' is ", Quote(value.text),
                                                   "; expected a dtype string such as '<f4'"));
  }
  const absl::string_view descr = value.str;
  if (descr.size() >= 2 && descr[1] == 'O') {
    return absl::InvalidArgumentError(absl::StrCat(source, ": object arrays (descr ", Quote(descr),
                                                   ") are not supported; expected ",
                                                   kExpectedDescrs));
  }
  const absl::string_view type = descr.size() == 3 ? descr.substr(1) : absl::string_view();
  const char order = descr.empty() ? '\0' : descr[0];
  bool known = order == '<' || order == '>' || order == '=' || order == '|';
  if (type == "f4") {
    header->dtype = NpyDtype::kFloat32;
  } else if (type == "f2") {
    header->dtype = NpyDtype::kFloat16;
  } else if (type == "i4") {
    header->dtype = NpyDtype::kInt32;
  } else if (type == "i8") {
    header->dtype = NpyDtype::kInt64;
  } else if (type == "f8") {
    header->dtype = NpyDtype::kFloat64;
  } else {
    known = false;
  }
  if (!known) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": unsupported dtype descr ",
                                                   Quote(descr), "; expected ", kExpectedDescrs,
                                                   " (or another byte order)"));
  }
  header->big_endian = order == '>';
  return absl::OkStatus();
}

// Parses the preamble and header at the start of `bytes`, which must hold at least the whole
// header, of a payload of `total_size` bytes in all (bytes.size() when `bytes` is the whole
// payload, more when it is a prefix read ahead); the shape's data size must be what follows the
// header. `size_origin` says in messages where `total_size` comes from ("the file has").
absl::StatusOr<NpyHeader> ParseHeader(absl::string_view bytes, absl::string_view source,
                                      uint64_t total_size, absl::string_view size_origin) {
  if (bytes.size() < kMagic.size() || bytes.substr(0, kMagic.size()) != kMagic) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not an NPY file: starts with ",
                                                   Quote(bytes.substr(0, kMagic.size())),
                                                   ", expected the magic string '\\x93NUMPY'"));
  }
  if (bytes.size() < 10) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": truncated: ", bytes.size(),
                                                   " bytes, shorter than the NPY preamble"));
  }
  const uint8_t major = static_cast<uint8_t>(bytes[6]);
  const uint8_t minor = static_cast<uint8_t>(bytes[7]);
  size_t header_len;
  size_t prefix;
  if (major == 1 && minor == 0) {
    prefix = 10;
    header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
  } else if ((major == 2 || major == 3) && minor == 0) {
    prefix = 12;
    if (bytes.size() < prefix) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": truncated: ", bytes.size(),
                                                     " bytes, shorter than the NPY preamble"));
    }
    header_len = 0;
    for (int i = 3; i >= 0; --i) {
      header_len = (header_len << 8) | static_cast<uint8_t>(bytes[8 + i]);
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(source, ": unsupported NPY format version ",
                                                   major, ".", minor,
                                                   "; expected 1.0, 2.0 or 3.0"));
  }
  if (header_len > total_size - prefix) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": truncated: the header is ", header_len, " bytes but only ",
                     total_size - prefix, " bytes follow the preamble"));
  }
  if (header_len > bytes.size() - prefix) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the header of ", header_len,
                                                   " bytes is longer than the ", bytes.size(),
                                                   " bytes read ahead for it"));
  }
  const absl::string_view text = bytes.substr(prefix, header_len);
  const absl::string_view shown = absl::StripTrailingAsciiWhitespace(text);  // For messages.

  PyValue dict;
  PyLiteralParser parser(text);
  if (!parser.Parse(&dict)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": cannot parse the header ", Quote(shown), ": ", parser.error()));
  }
  if (dict.kind != PyValue::Kind::kDict) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the header ", Quote(shown), " is not a dict"));
  }
  NpyHeader header;
  header.data_offset = prefix + header_len;
  bool has_descr = false, has_fortran = false, has_shape = false;
  for (size_t i = 0; i < dict.keys.size(); ++i) {
    const std::string& key = dict.keys[i];
    const PyValue& value = dict.items[i];
    if (key == "descr") {
      has_descr = true;
      TESSERA_RETURN_IF_ERROR(ParseDescr(value, source, &header));
    } else if (key == "fortran_order") {
      has_fortran = true;
      if (value.kind != PyValue::Kind::kBool) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": 'fortran_order' is ", Quote(value.text), "; expected True or False"));
      }
      header.fortran_order = value.boolean;
    } else if (key == "shape") {
      has_shape = true;
      bool ok = value.kind == PyValue::Kind::kTuple && value.items.size() <= kMaxDims;
      header.shape.clear();
      for (size_t d = 0; ok && d < value.items.size(); ++d) {
        ok = value.items[d].kind == PyValue::Kind::kInt && value.items[d].integer >= 0;
        header.shape.push_back(value.items[d].integer);
      }
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": 'shape' is ", Quote(value.text),
                                                       "; expected a tuple of at most ", kMaxDims,
                                                       " non-negative integers"));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": unexpected key ", Quote(key),
                       " in the header; expected only 'descr', 'fortran_order' and 'shape'"));
    }
  }
  if (!has_descr || !has_fortran || !has_shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the header ", Quote(shown), " lacks '",
                     !has_descr ? "descr" : (!has_fortran ? "fortran_order" : "shape"), "'"));
  }

  int64_t count = 0;
  uint64_t data_size = 0;
  if (!ShapeProduct(header.shape, &count) ||
      __builtin_mul_overflow(static_cast<uint64_t>(count), NpyItemSize(header.dtype), &data_size) ||
      data_size > std::numeric_limits<size_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": shape ", ShapeString(header.shape), " has too many elements"));
  }
  header.data_size = static_cast<size_t>(data_size);
  const uint64_t available = total_size - header.data_offset;
  if (available != header.data_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", available < header.data_size ? "truncated: " : "", "shape ",
                     ShapeString(header.shape), " of ", NpyDtypeName(header.dtype), " needs ",
                     header.data_size, " bytes of data, but ", size_origin, " ", available));
  }
  return header;
}

template <typename Word>
void ByteSwapAll(uint8_t* data, size_t count, Word (*swap)(Word)) {
  for (size_t i = 0; i < count; ++i) {
    Word word;
    std::memcpy(&word, data + i * sizeof(Word), sizeof(Word));
    word = swap(word);
    std::memcpy(data + i * sizeof(Word), &word, sizeof(Word));
  }
}

uint16_t Swap16(uint16_t v) { return __builtin_bswap16(v); }
uint32_t Swap32(uint32_t v) { return __builtin_bswap32(v); }
uint64_t Swap64(uint64_t v) { return __builtin_bswap64(v); }

// FortranToC for a matrix: a transpose, in tiles so that both sides stay in cache.
template <size_t kSize>
void FortranToC2D(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out) {
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = std::min(r0 + kTile, rows);
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c1 = std::min(c0 + kTile, cols);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          std::memcpy(out + (r * cols + c) * kSize, in + (c * rows + r) * kSize, kSize);
        }
      }
    }
  }
}

// Reorders the elements of a Fortran-order array of `shape` into C order. For each run along the
// last (C-fastest) axis the source is strided; the outer index advances like an odometer.
template <size_t kSize>
void FortranToC(const uint8_t* in, absl::Span<const int64_t> shape, uint8_t* out) {
  if (shape.size() == 2) return FortranToC2D<kSize>(in, shape[0], shape[1], out);
  const size_t ndim = shape.size();
  std::vector<int64_t> stride(ndim);  // Fortran strides, in elements.
  int64_t total = 1;
  for (size_t k = 0; k < ndim; ++k) {
    stride[k] = total;
    total *= shape[k];
  }
  const int64_t inner = shape[ndim - 1];
  const int64_t inner_stride = stride[ndim - 1];
  std::vector<int64_t> index(ndim, 0);
  int64_t base = 0;
  for (int64_t outer = total / inner; outer > 0; --outer) {
    const uint8_t* src = in + base * kSize;
    for (int64_t j = 0; j < inner; ++j) {
      std::memcpy(out, src + j * inner_stride * kSize, kSize);
      out += kSize;
    }
    for (size_t k = ndim - 1; k-- > 0;) {
      base += stride[k];
      if (++index[k] < shape[k]) break;
      base -= stride[k] * shape[k];
      index[k] = 0;
    }
  }
}

// Turns raw file data (already in `array->data`) into C-order little-endian data.
void Normalize(const NpyHeader& header, NpyArray* array) {
  const size_t count = array->data.size() / array->itemsize();
  if (header.big_endian) {
    switch (array->itemsize()) {
      case 2:
        ByteSwapAll<uint16_t>(array->data.data(), count, Swap16);
        break;
      case 4:
        ByteSwapAll<uint32_t>(array->data.data(), count, Swap32);
        break;
      case 8:
        ByteSwapAll<uint64_t>(array->data.data(), count, Swap64);
        break;
    }
  }
  if (header.fortran_order && array->shape.size() >= 2 && count > 0) {
    std::vector<uint8_t> c_order(array->data.size());
    switch (array->itemsize()) {
      case 2:
        FortranToC<2>(array->data.data(), array->shape, c_order.data());
        break;
      case 4:
        FortranToC<4>(array->data.data(), array->shape, c_order.data());
        break;
      case 8:
        FortranToC<8>(array->data.data(), array->shape, c_order.data());
        break;
    }
    array->data = std::move(c_order);
  }
}

}  // namespace

size_t NpyItemSize(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::kFloat16:
      return 2;
    case NpyDtype::kFloat32:
    case NpyDtype::kInt32:
      return 4;
    case NpyDtype::kInt64:
    case NpyDtype::kFloat64:
      return 8;
  }
  return 1;
}

absl::string_view NpyDtypeName(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::kFloat32:
      return "float32";
    case NpyDtype::kFloat16:
      return "float16";
    case NpyDtype::kInt32:
      return "int32";
    case NpyDtype::kInt64:
      return "int64";
    case NpyDtype::kFloat64:
      return "float64";
  }
  return "unknown";
}

int64_t NpyArray::num_elements() const {
  int64_t count;
  return ShapeProduct(shape, &count) ? count : -1;
}

absl::Status NpyArray::Validate() const {
  const int64_t count = num_elements();
  if (count < 0 || shape.size() > kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid shape ", ShapeString(shape), ": expected at most ", kMaxDims,
                     " non-negative dims whose product fits in int64"));
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(static_cast<uint64_t>(count), itemsize(), &bytes) ||
      bytes != data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ShapeString(shape), " of ", NpyDtypeName(dtype), " needs ", count,
                     " × ", itemsize(), " bytes, but data holds ", data.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> NpyArray::ToFloat32() const {
  TESSERA_RETURN_IF_ERROR(Validate());
  const size_t count = static_cast<size_t>(num_elements());
  std::vector<float> out(dtype == NpyDtype::kFloat32 ? 0 : count);
  switch (dtype) {
    case NpyDtype::kFloat32: {
      const float* in = reinterpret_cast<const float*>(data.data());
      return std::vector<float>(in, in + count);
    }
    case NpyDtype::kFloat16:
      HalfToFloat(reinterpret_cast<const Float16*>(data.data()), count, out.data());
      return out;
    case NpyDtype::kFloat64: {
      const double* in = reinterpret_cast<const double*>(data.data());
      for (size_t i = 0; i < count; ++i) out[i] = static_cast<float>(in[i]);
      return out;
    }
    case NpyDtype::kInt32:
    case NpyDtype::kInt64:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("cannot read a ", NpyDtypeName(dtype),
                                                 " array as float32; expected float32, float16 "
                                                 "or float64"));
}

absl::StatusOr<std::vector<int64_t>> NpyArray::ToInt64() const {
  TESSERA_RETURN_IF_ERROR(Validate());
  const size_t count = static_cast<size_t>(num_elements());
  std::vector<int64_t> out(count);
  if (dtype == NpyDtype::kInt64) {
    if (count > 0) std::memcpy(out.data(), data.data(), data.size());
    return out;
  }
  if (dtype == NpyDtype::kInt32) {
    const int32_t* in = reinterpret_cast<const int32_t*>(data.data());
    for (size_t i = 0; i < count; ++i) out[i] = in[i];
    return out;
  }
  return absl::InvalidArgumentError(absl::StrCat("cannot read a ", NpyDtypeName(dtype),
                                                 " array as int64; expected int32 or int64"));
}

NpyArray NpyArray::FromBytes(NpyDtype dtype, std::vector<int64_t> shape, const void* bytes) {
  NpyArray array;
  array.dtype = dtype;
  array.shape = std::move(shape);
  const int64_t count = array.num_elements();
  if (count > 0) {
    const uint8_t* begin = static_cast<const uint8_t*>(bytes);
    array.data.assign(begin, begin + static_cast<size_t>(count) * array.itemsize());
  }
  return array;
}

NpyArray NpyArray::FromFloat32(int64_t rows, int64_t cols, const float* values) {
  return FromBytes(NpyDtype::kFloat32, {rows, cols}, values);
}

NpyArray NpyArray::FromFloat16(int64_t rows, int64_t cols, const Float16* values) {
  return FromBytes(NpyDtype::kFloat16, {rows, cols}, values);
}

NpyArray NpyArray::FromFloat32(absl::Span<const float> values) {
  return FromBytes(NpyDtype::kFloat32, {static_cast<int64_t>(values.size())}, values.data());
}

NpyArray NpyArray::FromInt32(absl::Span<const int32_t> values) {
  return FromBytes(NpyDtype::kInt32, {static_cast<int64_t>(values.size())}, values.data());
}

NpyArray NpyArray::FromInt64(absl::Span<const int64_t> values) {
  return FromBytes(NpyDtype::kInt64, {static_cast<int64_t>(values.size())}, values.data());
}

absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes, absl::string_view source) {
  TESSERA_ASSIGN_OR_RETURN(const NpyHeader header,
                           ParseHeader(bytes, source, bytes.size(), "the file has"));
  NpyArray array;
  array.dtype = header.dtype;
  array.shape = header.shape;
  const absl::string_view data = bytes.substr(header.data_offset);
  array.data.assign(data.begin(), data.end());
  Normalize(header, &array);
  return array;
}

absl::StatusOr<std::string> SerializeNpy(const NpyArray& array) {
  TESSERA_RETURN_IF_ERROR(array.Validate());
  std::string out = internal::NpyHeaderBytes(array);
  out.append(reinterpret_cast<const char*>(array.data.data()), array.data.size());
  return out;
}

absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, internal::ReadFileBytes(path));
  return internal::ParseNpyBuffer(std::move(bytes), absl::StrCat("'", path, "'"));
}

absl::Status WriteNpyFile(const std::string& path, const NpyArray& array) {
  TESSERA_RETURN_IF_ERROR(array.Validate());
  return internal::WriteFileWith(path, [&array](internal::ByteSink& sink) {
    TESSERA_RETURN_IF_ERROR(sink.Append(internal::NpyHeaderBytes(array)));
    return sink.Append(
        absl::string_view(reinterpret_cast<const char*>(array.data.data()), array.data.size()));
  });
}

namespace internal {

std::string QuoteForMessage(absl::string_view text) {
  constexpr size_t kMaxQuoted = 200;
  std::string out = "'";
  for (const char c : text.substr(0, kMaxQuoted)) {
    const unsigned char byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      out.push_back(c);
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(byte, absl::kZeroPad2));
    }
  }
  out.push_back('\'');
  if (text.size() > kMaxQuoted) absl::StrAppend(&out, "... (", text.size(), " bytes)");
  return out;
}

std::string ShapeStringForMessage(absl::Span<const int64_t> shape) { return ShapeString(shape); }

std::string NpyHeaderBytes(const NpyArray& array) {
  std::string dict =
      absl::StrCat("{'descr': '", Descr(array.dtype),
                   "', 'fortran_order': False, 'shape': ", ShapeString(array.shape), ", }");
  // Pad with spaces so that the data starts 64-byte aligned, as NumPy does; end with a newline.
  constexpr size_t kPreamble = 10;
  const size_t unpadded = kPreamble + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  const size_t header_len = dict.size();  // < 65536: at most 64 dims of at most 19 digits.
  std::string out(kMagic);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header_len & 0xff));
  out.push_back(static_cast<char>(header_len >> 8));
  out += dict;
  return out;
}

absl::StatusOr<NpyArray> ParseNpyBuffer(std::vector<uint8_t> buffer, absl::string_view source) {
  TESSERA_ASSIGN_OR_RETURN(
      const NpyHeader header,
      ParseHeader(absl::string_view(reinterpret_cast<const char*>(buffer.data()), buffer.size()),
                  source, buffer.size(), "the file has"));
  NpyArray array;
  array.dtype = header.dtype;
  array.shape = header.shape;
  if (header.data_size > 0) {
    std::memmove(buffer.data(), buffer.data() + header.data_offset, header.data_size);
  }
  buffer.resize(header.data_size);
  array.data = std::move(buffer);
  Normalize(header, &array);
  return array;
}

absl::StatusOr<NpyHeaderInfo> ParseNpyHeader(absl::string_view prefix, uint64_t total_size,
                                             absl::string_view source,
                                             absl::string_view size_origin) {
  TESSERA_ASSIGN_OR_RETURN(NpyHeader header, ParseHeader(prefix, source, total_size, size_origin));
  NpyHeaderInfo info;
  info.dtype = header.dtype;
  info.shape = std::move(header.shape);
  info.data_offset = header.data_offset;
  info.data_size = header.data_size;
  return info;
}

absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat info;
  if (::fstat(fd, &info) != 0) return ErrnoStatus(errno, "cannot stat", path);
  if (S_ISDIR(info.st_mode)) return ErrnoStatus(EISDIR, "cannot read", path);

  // Read straight into a buffer of the file's size; a file that grows (or a pipe, whose size is
  // 0) continues through a small buffer.
  std::vector<uint8_t> bytes(S_ISREG(info.st_mode) ? static_cast<size_t>(info.st_size) : 0);
  size_t used = 0;
  uint8_t spill[1 << 16];
  while (true) {
    const bool into_bytes = used < bytes.size();
    uint8_t* dst = into_bytes ? bytes.data() + used : spill;
    const size_t room = into_bytes ? bytes.size() - used : sizeof(spill);
    const ssize_t got = ::read(fd, dst, room);
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read", path);
    }
    if (got == 0) break;
    if (into_bytes) {
      used += static_cast<size_t>(got);
    } else {
      bytes.insert(bytes.end(), spill, spill + got);
      used = bytes.size();
    }
  }
  bytes.resize(used);  // The file shrank while we read it.
  return bytes;
}

absl::Status WriteFileWith(const std::string& path,
                           const std::function<absl::Status(ByteSink&)>& produce) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return ErrnoStatus(errno, "cannot create", path);

  class StdioSink : public ByteSink {
   public:
    StdioSink(std::FILE* file, const std::string& path) : file_(file), path_(path) {}
    absl::Status Append(absl::string_view bytes) override {
      if (bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), file_) == bytes.size()) {
        return absl::OkStatus();
      }
      return ErrnoStatus(errno, "cannot write", path_);
    }

   private:
    std::FILE* file_;
    const std::string& path_;
  } sink(file, path);

  absl::Status status = produce(sink);
  if (status.ok() && std::fflush(file) != 0) status = ErrnoStatus(errno, "cannot write", path);
  if (std::fclose(file) != 0 && status.ok()) status = ErrnoStatus(errno, "cannot close", path);
  if (!status.ok()) std::remove(path.c_str());
  return status;
}

}  // namespace internal
}  // namespace tessera
