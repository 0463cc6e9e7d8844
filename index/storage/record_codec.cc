#include "index/storage/record_codec.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "index/common/crc32.h"
#include "index/common/little_endian.h"
#include "tessera/float16.h"
#include "tessera/status_macros.h"

namespace tessera::internal {
namespace {

constexpr uint8_t kAttributeInt64 = 0;
constexpr uint8_t kAttributeDouble = 1;
constexpr uint8_t kAttributeString = 2;
constexpr uint8_t kDtypeFloat32 = 0;
constexpr uint8_t kDtypeFloat16 = 1;

void PutU8(std::string* out, uint8_t v) { out->push_back(static_cast<char>(v)); }

void PutU32(std::string* out, uint32_t v) {
  char buf[4];
  StoreLittleEndian32(buf, v);
  out->append(buf, 4);
}

void PutU64(std::string* out, uint64_t v) {
  char buf[8];
  StoreLittleEndian64(buf, v);
  out->append(buf, 8);
}

void PutI64(std::string* out, int64_t v) { PutU64(out, static_cast<uint64_t>(v)); }

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// kPackedDocument's int32 arrays: a count, then each value's zigzag delta from the one before.
void PutDeltaArray(std::string* out, const std::vector<int32_t>& values) {
  PutVarint(out, values.size());
  int64_t previous = 0;
  for (const int32_t v : values) {
    const int64_t delta = int64_t{v} - previous;
    PutVarint(out, (static_cast<uint64_t>(delta) << 1) ^ static_cast<uint64_t>(delta >> 63));
    previous = v;
  }
}

void PutString(std::string* out, absl::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
}

// Starts an envelope in *out; returns the offset FinishEnvelope needs.
size_t BeginEnvelope(RecordKind kind, std::string* out) {
  const size_t start = out->size();
  PutU8(out, kRecordFormatVersion);
  PutU8(out, static_cast<uint8_t>(kind));
  return start;
}

void FinishEnvelope(size_t start, std::string* out) {
  const uint32_t crc = Crc32(absl::string_view(*out).substr(start));
  PutU32(out, crc);
}

// A bounds-checked little-endian reader over a payload. Every Read* returns false, without
// consuming, when the payload has too few bytes left.
class Reader {
 public:
  explicit Reader(absl::string_view data) : data_(data) {}

  size_t left() const { return data_.size(); }

  bool ReadU8(uint8_t* v) {
    if (data_.empty()) return false;
    *v = static_cast<uint8_t>(data_[0]);
    data_.remove_prefix(1);
    return true;
  }
  bool ReadU32(uint32_t* v) {
    if (data_.size() < 4) return false;
    *v = LoadLittleEndian32(data_.data());
    data_.remove_prefix(4);
    return true;
  }
  bool ReadU64(uint64_t* v) {
    if (data_.size() < 8) return false;
    *v = LoadLittleEndian64(data_.data());
    data_.remove_prefix(8);
    return true;
  }
  bool ReadI64(int64_t* v) {
    uint64_t u;
    if (!ReadU64(&u)) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool ReadBytes(size_t n, absl::string_view* v) {
    if (data_.size() < n) return false;
    *v = data_.substr(0, n);
    data_.remove_prefix(n);
    return true;
  }
  bool ReadString(absl::string_view* v) {
    uint32_t n;
    if (data_.size() < 4) return false;
    n = LoadLittleEndian32(data_.data());
    if (data_.size() - 4 < n) return false;
    data_.remove_prefix(4);
    return ReadBytes(n, v);
  }
  // A minimal LEB128 varint of at most 64 bits: false for a truncated one, one with a trailing
  // zero byte (another encoding of a shorter one) and one past 64 bits.
  bool ReadVarint(uint64_t* v) {
    uint64_t value = 0;
    for (size_t i = 0; i < data_.size() && i < 10; ++i) {
      const auto byte = static_cast<uint8_t>(data_[i]);
      if (i == 9 && byte > 1) return false;
      value |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) {
        if (byte == 0 && i > 0) return false;
        *v = value;
        data_.remove_prefix(i + 1);
        return true;
      }
    }
    return false;
  }
  // PutDeltaArray's form: false when truncated, not minimal, or a value leaves int32. The count
  // is checked against the bytes left (a value takes at least one) before anything is allocated.
  bool ReadDeltaArray(std::vector<int32_t>* v) {
    Reader in(data_);
    uint64_t n = 0;
    if (!in.ReadVarint(&n) || n > in.left()) return false;
    v->resize(n);
    int64_t previous = 0;
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t zigzag = 0;
      if (!in.ReadVarint(&zigzag)) return false;
      const auto delta = static_cast<int64_t>((zigzag >> 1) ^ (~(zigzag & 1) + 1));
      if (delta > std::numeric_limits<int32_t>::max() - previous ||
          delta < std::numeric_limits<int32_t>::min() - previous) {
        return false;
      }
      previous += delta;
      (*v)[i] = static_cast<int32_t>(previous);
    }
    data_ = in.data_;
    return true;
  }
  // A u32 count followed by count int32 values; the count is checked against the bytes left
  // before anything is allocated.
  bool ReadI32Array(std::vector<int32_t>* v) {
    uint32_t n;
    if (data_.size() < 4) return false;
    n = LoadLittleEndian32(data_.data());
    if ((data_.size() - 4) / 4 < n) return false;
    data_.remove_prefix(4);
    v->resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      (*v)[i] = static_cast<int32_t>(LoadLittleEndian32(data_.data() + 4 * static_cast<size_t>(i)));
    }
    data_.remove_prefix(4 * static_cast<size_t>(n));
    return true;
  }

 private:
  absl::string_view data_;
};

std::string IidWhat(absl::string_view cf, uint64_t iid) {
  return absl::StrCat(cf, " CF, iid ", iid);
}

std::string KeyWhat(absl::string_view cf, absl::string_view label, absl::string_view key) {
  return absl::StrCat(cf, " CF, ", label, " '", absl::CHexEscape(key.substr(0, 256)), "'");
}

absl::Status Corrupt(absl::string_view what, absl::string_view problem) {
  return absl::DataLossError(absl::StrCat(what, ": ", problem));
}

absl::Status Truncated(absl::string_view what, absl::string_view field) {
  return Corrupt(what, absl::StrCat("value truncated in field '", field, "'"));
}

}  // namespace

size_t DtypeSize(VectorDtype dtype) { return dtype == VectorDtype::kFloat16 ? 2 : 4; }

absl::Status ValidateMatrix(const StoredMatrix& matrix, absl::string_view what) {
  if (matrix.dtype != VectorDtype::kFloat32 && matrix.dtype != VectorDtype::kFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": unknown dtype ", static_cast<int>(matrix.dtype)));
  }
  if (matrix.rows < 0 || matrix.cols < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": negative shape ", matrix.rows, " × ", matrix.cols));
  }
  const uint64_t itemsize = DtypeSize(matrix.dtype);
  const uint64_t rows = static_cast<uint64_t>(matrix.rows);
  const uint64_t cols = static_cast<uint64_t>(matrix.cols);
  const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (cols != 0 && rows > limit / cols / itemsize) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shape ", matrix.rows, " × ", matrix.cols, " is too large"));
  }
  const uint64_t expected = rows * cols * itemsize;
  if (matrix.bytes.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", matrix.bytes.size(), " bytes for a ", matrix.rows, " × ", matrix.cols, " ",
        matrix.dtype == VectorDtype::kFloat16 ? "fp16" : "fp32", " matrix, expected ", expected));
  }
  return absl::OkStatus();
}

std::string EncodeIidKey(uint64_t iid) {
  std::string key(8, '\0');
  for (int i = 0; i < 8; ++i) key[i] = static_cast<char>((iid >> (8 * (7 - i))) & 0xff);
  return key;
}

bool DecodeIidKey(absl::string_view key, uint64_t* iid) {
  if (key.size() != 8) return false;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(key[i]);
  *iid = v;
  return true;
}

bool HasKind(absl::string_view value, RecordKind kind) {
  return value.size() >= 2 && static_cast<uint8_t>(value[1]) == static_cast<uint8_t>(kind);
}

absl::StatusOr<absl::string_view> OpenEnvelope(absl::string_view value, RecordKind kind,
                                               absl::string_view what) {
  if (value.size() < kRecordOverheadBytes) {
    return Corrupt(what, absl::StrCat("value of ", value.size(), " bytes is shorter than the ",
                                      kRecordOverheadBytes, "-byte envelope"));
  }
  const size_t body = value.size() - 4;
  const uint32_t stored = LoadLittleEndian32(value.data() + body);
  const uint32_t computed = Crc32(value.substr(0, body));
  if (stored != computed) {
    return Corrupt(
        what, absl::StrFormat("checksum mismatch (stored %08x, computed %08x)", stored, computed));
  }
  const uint8_t version = static_cast<uint8_t>(value[0]);
  if (version != kRecordFormatVersion) {
    return Corrupt(what, absl::StrCat("unsupported format version ", version, " (this build reads ",
                                      kRecordFormatVersion, ")"));
  }
  const uint8_t got_kind = static_cast<uint8_t>(value[1]);
  if (got_kind != static_cast<uint8_t>(kind)) {
    return Corrupt(
        what, absl::StrCat("value of kind ", got_kind, ", expected kind ", static_cast<int>(kind)));
  }
  return value.substr(2, body - 2);
}

void EncodeDocumentRecord(const DocumentRecord& record, std::string* out) {
  const size_t start = BeginEnvelope(RecordKind::kPackedDocument, out);
  PutU64(out, record.iid);
  PutString(out, record.external_id);
  PutU64(out, record.version);
  PutI64(out, record.num_tokens);
  PutU8(out, record.layout.has_value() ? 1 : 0);
  if (record.layout.has_value()) {
    PutI64(out, record.layout->rows);
    PutI64(out, record.layout->cols);
    PutI64(out, record.layout->prefix_tokens);
    PutI64(out, record.layout->suffix_tokens);
  }
  PutU32(out, static_cast<uint32_t>(record.attributes.size()));
  for (const auto& [name, value] : record.attributes) {
    PutString(out, name);
    if (const auto* i = std::get_if<int64_t>(&value)) {
      PutU8(out, kAttributeInt64);
      PutI64(out, *i);
    } else if (const auto* d = std::get_if<double>(&value)) {
      PutU8(out, kAttributeDouble);
      uint64_t bits;
      static_assert(sizeof(bits) == sizeof(*d));
      std::memcpy(&bits, d, sizeof(bits));
      PutU64(out, bits);
    } else {
      PutU8(out, kAttributeString);
      PutString(out, std::get<std::string>(value));
    }
  }
  PutDeltaArray(out, record.member_offsets);
  PutDeltaArray(out, record.members);
  if (record.sparse.has_value()) {
    PutU8(out, 1);
    PutU32(out, static_cast<uint32_t>(record.sparse->indices.size()));
    for (uint32_t index : record.sparse->indices) PutU32(out, index);
    for (float value : record.sparse->values) {
      uint32_t bits;
      std::memcpy(&bits, &value, sizeof(bits));
      PutU32(out, bits);
    }
  }
  FinishEnvelope(start, out);
}

std::string EncodeDocumentRecord(const DocumentRecord& record) {
  std::string out;
  EncodeDocumentRecord(record, &out);
  return out;
}

absl::StatusOr<DocumentRecord> DecodeDocumentRecord(absl::string_view value, uint64_t iid) {
  const std::string what = IidWhat("docs", iid);
  // Written as kPackedDocument since its membership took varints; kDocument before.
  const bool packed = HasKind(value, RecordKind::kPackedDocument);
  TESSERA_ASSIGN_OR_RETURN(
      absl::string_view payload,
      OpenEnvelope(value, packed ? RecordKind::kPackedDocument : RecordKind::kDocument, what));
  Reader in(payload);
  DocumentRecord record;
  absl::string_view external_id;
  uint8_t has_layout = 0;
  if (!in.ReadU64(&record.iid)) return Truncated(what, "iid");
  if (record.iid != iid) {
    return Corrupt(what, absl::StrCat("value belongs to iid ", record.iid));
  }
  if (!in.ReadString(&external_id)) return Truncated(what, "external_id");
  record.external_id = std::string(external_id);
  if (!in.ReadU64(&record.version)) return Truncated(what, "version");
  if (!in.ReadI64(&record.num_tokens)) return Truncated(what, "num_tokens");
  if (!in.ReadU8(&has_layout)) return Truncated(what, "layout");
  if (has_layout > 1) return Corrupt(what, absl::StrCat("bad layout flag ", has_layout));
  if (has_layout == 1) {
    PatchGridLayout layout;
    if (!in.ReadI64(&layout.rows) || !in.ReadI64(&layout.cols) ||
        !in.ReadI64(&layout.prefix_tokens) || !in.ReadI64(&layout.suffix_tokens)) {
      return Truncated(what, "layout");
    }
    record.layout = layout;
  }
  uint32_t num_attributes = 0;
  if (!in.ReadU32(&num_attributes)) return Truncated(what, "attributes");
  // Each attribute takes at least 4 + 1 + 4 bytes: bound the loop by what is left.
  if (num_attributes > in.left() / 9) return Truncated(what, "attributes");
  for (uint32_t i = 0; i < num_attributes; ++i) {
    absl::string_view name;
    uint8_t type = 0;
    if (!in.ReadString(&name) || !in.ReadU8(&type)) return Truncated(what, "attributes");
    AttributeValue attribute;
    switch (type) {
      case kAttributeInt64: {
        int64_t v;
        if (!in.ReadI64(&v)) return Truncated(what, "attributes");
        attribute = v;
        break;
      }
      case kAttributeDouble: {
        uint64_t bits;
        if (!in.ReadU64(&bits)) return Truncated(what, "attributes");
        double v;
        std::memcpy(&v, &bits, sizeof(v));
        attribute = v;
        break;
      }
      case kAttributeString: {
        absl::string_view v;
        if (!in.ReadString(&v)) return Truncated(what, "attributes");
        attribute = std::string(v);
        break;
      }
      default:
        return Corrupt(
            what, absl::StrCat("attribute '", absl::CHexEscape(name), "' has unknown type ", type));
    }
    // Names were written in map order: anything else is not a value this codec wrote.
    if (!record.attributes.empty() && !(record.attributes.rbegin()->first < name)) {
      return Corrupt(what, absl::StrCat("attribute '", absl::CHexEscape(name), "' out of order"));
    }
    record.attributes.emplace_hint(record.attributes.end(), std::string(name),
                                   std::move(attribute));
  }
  if (packed) {
    if (!in.ReadDeltaArray(&record.member_offsets)) {
      return Corrupt(what, "field 'member_offsets' truncated, not minimal varints or not int32");
    }
    if (!in.ReadDeltaArray(&record.members)) {
      return Corrupt(what, "field 'members' truncated, not minimal varints or not int32");
    }
  } else {
    if (!in.ReadI32Array(&record.member_offsets)) return Truncated(what, "member_offsets");
    if (!in.ReadI32Array(&record.members)) return Truncated(what, "members");
  }
  if (in.left() != 0) {
    uint8_t has_sparse = 0;
    uint32_t count = 0;
    if (!in.ReadU8(&has_sparse) || has_sparse != 1) {
      return Corrupt(what, absl::StrCat("bad sparse vector flag ", has_sparse));
    }
    if (!in.ReadU32(&count) || count > in.left() / 8) return Truncated(what, "sparse");
    SparseVector sparse;
    sparse.indices.resize(count);
    sparse.values.resize(count);
    for (uint32_t i = 0; i < count; ++i) {
      if (!in.ReadU32(&sparse.indices[i])) return Truncated(what, "sparse");
    }
    for (uint32_t i = 0; i < count; ++i) {
      uint32_t bits = 0;
      if (!in.ReadU32(&bits)) return Truncated(what, "sparse");
      std::memcpy(&sparse.values[i], &bits, sizeof(bits));
    }
    record.sparse = std::move(sparse);
  }
  if (in.left() != 0) {
    return Corrupt(what, absl::StrCat(in.left(), " unexpected trailing bytes"));
  }
  return record;
}

void EncodeStoredMatrix(const StoredMatrix& matrix, std::string* out) {
  out->reserve(out->size() + kRecordOverheadBytes + 17 + matrix.bytes.size());
  const size_t start = BeginEnvelope(RecordKind::kMatrix, out);
  PutU8(out, matrix.dtype == VectorDtype::kFloat16 ? kDtypeFloat16 : kDtypeFloat32);
  PutI64(out, matrix.rows);
  PutI64(out, matrix.cols);
  out->append(matrix.bytes);
  FinishEnvelope(start, out);
}

std::string EncodeStoredMatrix(const StoredMatrix& matrix) {
  std::string out;
  EncodeStoredMatrix(matrix, &out);
  return out;
}

absl::StatusOr<StoredMatrix> DecodeStoredMatrix(absl::string_view value, absl::string_view cf,
                                                uint64_t iid) {
  const std::string what = IidWhat(cf, iid);
  TESSERA_ASSIGN_OR_RETURN(absl::string_view payload,
                           OpenEnvelope(value, RecordKind::kMatrix, what));
  Reader in(payload);
  uint8_t dtype = 0;
  StoredMatrix matrix;
  if (!in.ReadU8(&dtype)) return Truncated(what, "dtype");
  if (dtype == kDtypeFloat32) {
    matrix.dtype = VectorDtype::kFloat32;
  } else if (dtype == kDtypeFloat16) {
    matrix.dtype = VectorDtype::kFloat16;
  } else {
    return Corrupt(what, absl::StrCat("unknown dtype ", dtype));
  }
  if (!in.ReadI64(&matrix.rows) || !in.ReadI64(&matrix.cols)) return Truncated(what, "shape");
  if (matrix.rows < 0 || matrix.cols < 0) {
    return Corrupt(what, absl::StrCat("negative shape ", matrix.rows, " × ", matrix.cols));
  }
  // Compare without multiplying first so that a garbage shape cannot overflow.
  const uint64_t left = in.left();
  const uint64_t itemsize = DtypeSize(matrix.dtype);
  const uint64_t rows = static_cast<uint64_t>(matrix.rows);
  const uint64_t cols = static_cast<uint64_t>(matrix.cols);
  const bool fits = cols == 0 || rows <= left / itemsize / cols;
  if (!fits || rows * cols * itemsize != left) {
    return Corrupt(what, absl::StrCat("shape ", matrix.rows, " × ", matrix.cols, " does not match ",
                                      left, " bytes of vectors"));
  }
  absl::string_view bytes;
  in.ReadBytes(left, &bytes);
  matrix.bytes = std::string(bytes);
  return matrix;
}

std::string EncodeRerankPointer(const RerankPointer& pointer) {
  std::string out;
  const size_t start = BeginEnvelope(RecordKind::kRerankPointer, &out);
  PutU32(&out, pointer.segment);
  PutU64(&out, pointer.offset);
  PutU8(&out, pointer.dtype == VectorDtype::kFloat16 ? kDtypeFloat16 : kDtypeFloat32);
  PutI64(&out, pointer.rows);
  PutI64(&out, pointer.cols);
  PutU32(&out, pointer.crc);
  FinishEnvelope(start, &out);
  return out;
}

bool IsRerankPointer(absl::string_view value) { return HasKind(value, RecordKind::kRerankPointer); }

absl::StatusOr<RerankPointer> DecodeRerankPointer(absl::string_view value, uint64_t iid) {
  const std::string what = IidWhat("rerank", iid);
  TESSERA_ASSIGN_OR_RETURN(absl::string_view payload,
                           OpenEnvelope(value, RecordKind::kRerankPointer, what));
  Reader in(payload);
  RerankPointer pointer;
  uint8_t dtype = 0;
  if (!in.ReadU32(&pointer.segment) || !in.ReadU64(&pointer.offset) || !in.ReadU8(&dtype) ||
      !in.ReadI64(&pointer.rows) || !in.ReadI64(&pointer.cols) || !in.ReadU32(&pointer.crc)) {
    return Truncated(what, "rerank pointer");
  }
  if (in.left() != 0) return Corrupt(what, absl::StrCat(in.left(), " trailing bytes"));
  if (dtype != kDtypeFloat16 && dtype != kDtypeFloat32) {
    return Corrupt(what, absl::StrCat("unknown dtype ", dtype));
  }
  pointer.dtype = dtype == kDtypeFloat16 ? VectorDtype::kFloat16 : VectorDtype::kFloat32;
  // Rows and columns bounded so that their product times the item size cannot overflow.
  if (pointer.rows < 1 || pointer.cols < 1 || pointer.rows > (int64_t{1} << 31) ||
      pointer.cols > (int64_t{1} << 20)) {
    return Corrupt(what, absl::StrCat("shape ", pointer.rows, " × ", pointer.cols));
  }
  return pointer;
}

std::string EncodeCodesPointer(const CodesPointer& pointer) {
  std::string out;
  const size_t start = BeginEnvelope(RecordKind::kCodesPointer, &out);
  PutU32(&out, pointer.segment);
  PutU64(&out, pointer.offset);
  PutU32(&out, static_cast<uint32_t>(pointer.bytes));
  PutU32(&out, pointer.crc);
  FinishEnvelope(start, &out);
  return out;
}

bool IsCodesPointer(absl::string_view value) { return HasKind(value, RecordKind::kCodesPointer); }

absl::StatusOr<CodesPointer> DecodeCodesPointer(absl::string_view value, uint32_t generation,
                                                uint64_t iid) {
  const std::string what = absl::StrCat("codes CF generation ", generation, " iid ", iid);
  TESSERA_ASSIGN_OR_RETURN(absl::string_view payload,
                           OpenEnvelope(value, RecordKind::kCodesPointer, what));
  Reader in(payload);
  CodesPointer pointer;
  uint32_t bytes = 0;
  if (!in.ReadU32(&pointer.segment) || !in.ReadU64(&pointer.offset) || !in.ReadU32(&bytes) ||
      !in.ReadU32(&pointer.crc)) {
    return Truncated(what, "codes pointer");
  }
  if (in.left() != 0) return Corrupt(what, absl::StrCat(in.left(), " trailing bytes"));
  if (bytes == 0) return Corrupt(what, "a codes pointer to 0 bytes");
  pointer.bytes = bytes;
  return pointer;
}

std::string EncodeIdValue(uint64_t iid) {
  std::string out;
  const size_t start = BeginEnvelope(RecordKind::kId, &out);
  PutU64(&out, iid);
  FinishEnvelope(start, &out);
  return out;
}

absl::StatusOr<uint64_t> DecodeIdValue(absl::string_view value, absl::string_view external_id) {
  const std::string what = KeyWhat("ids", "external id", external_id);
  TESSERA_ASSIGN_OR_RETURN(absl::string_view payload, OpenEnvelope(value, RecordKind::kId, what));
  Reader in(payload);
  uint64_t iid = 0;
  if (!in.ReadU64(&iid)) return Truncated(what, "iid");
  if (in.left() != 0) return Corrupt(what, "unexpected trailing bytes");
  if (iid == 0) return Corrupt(what, "iid 0");
  return iid;
}

std::string EncodeCounterValue(uint64_t value) {
  std::string out;
  const size_t start = BeginEnvelope(RecordKind::kCounter, &out);
  PutU64(&out, value);
  FinishEnvelope(start, &out);
  return out;
}

absl::StatusOr<uint64_t> DecodeCounterValue(absl::string_view value, absl::string_view key) {
  const std::string what = KeyWhat("meta", "key", key);
  TESSERA_ASSIGN_OR_RETURN(absl::string_view payload,
                           OpenEnvelope(value, RecordKind::kCounter, what));
  Reader in(payload);
  uint64_t v = 0;
  if (!in.ReadU64(&v)) return Truncated(what, "value");
  if (in.left() != 0) return Corrupt(what, "unexpected trailing bytes");
  return v;
}

std::string EncodeMetaValue(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() + kRecordOverheadBytes);
  const size_t start = BeginEnvelope(RecordKind::kMeta, &out);
  out.append(bytes.data(), bytes.size());
  FinishEnvelope(start, &out);
  return out;
}

absl::StatusOr<std::string> DecodeMetaValue(absl::string_view value, absl::string_view key) {
  TESSERA_ASSIGN_OR_RETURN(absl::string_view payload,
                           OpenEnvelope(value, RecordKind::kMeta, KeyWhat("meta", "key", key)));
  return std::string(payload);
}

std::string EncodeCodesKey(uint32_t generation, uint64_t iid) {
  std::string key(12, '\0');
  for (int i = 0; i < 4; ++i) key[i] = static_cast<char>(generation >> (24 - 8 * i));
  for (int i = 0; i < 8; ++i) key[4 + i] = static_cast<char>(iid >> (56 - 8 * i));
  return key;
}

bool DecodeCodesKey(absl::string_view key, uint32_t* generation, uint64_t* iid) {
  if (key.size() != 12) return false;
  *generation = 0;
  *iid = 0;
  for (int i = 0; i < 4; ++i) *generation = (*generation << 8) | static_cast<uint8_t>(key[i]);
  for (int i = 0; i < 8; ++i) *iid = (*iid << 8) | static_cast<uint8_t>(key[4 + i]);
  return true;
}

std::string EncodeCodesValue(absl::string_view codes) {
  std::string out;
  out.reserve(codes.size() + kRecordOverheadBytes);
  const size_t start = BeginEnvelope(RecordKind::kCodes, &out);
  out.append(codes.data(), codes.size());
  FinishEnvelope(start, &out);
  return out;
}

absl::StatusOr<std::string> DecodeCodesValue(absl::string_view value, uint32_t generation,
                                             uint64_t iid) {
  TESSERA_ASSIGN_OR_RETURN(
      absl::string_view payload,
      OpenEnvelope(value, RecordKind::kCodes,
                   absl::StrCat("codes CF generation ", generation, " iid ", iid)));
  return std::string(payload);
}

std::vector<float> MatrixToFloat(const StoredMatrixView& matrix) {
  std::vector<float> values(matrix.rows * matrix.cols);
  if (matrix.dtype == VectorDtype::kFloat32) {
    std::memcpy(values.data(), matrix.bytes.data(), values.size() * sizeof(float));
  } else {
    HalfToFloat(reinterpret_cast<const Float16*>(matrix.bytes.data()), values.size(),
                values.data());
  }
  return values;
}

StoredMatrix MatrixFromFloat(const std::vector<float>& values, int64_t rows, int64_t cols,
                             VectorDtype dtype) {
  StoredMatrix matrix{dtype, rows, cols, {}};
  if (dtype == VectorDtype::kFloat32) {
    matrix.bytes.assign(reinterpret_cast<const char*>(values.data()),
                        values.size() * sizeof(float));
  } else {
    matrix.bytes.resize(values.size() * sizeof(Float16));
    FloatToHalf(values.data(), values.size(), reinterpret_cast<Float16*>(matrix.bytes.data()));
  }
  return matrix;
}

}  // namespace tessera::internal
