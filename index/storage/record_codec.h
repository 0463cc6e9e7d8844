// The byte encodings of the shard store's keys and values (DESIGN §4), kept apart from RocksDB so
// that they can be tested, fuzzed and read by tools on their own.
//
// Keys
//   docs, rerank, candidates   iid as 8 bytes big-endian, so that RocksDB's bytewise order is the
//                              numeric order of iids (iid 0 is never stored: 0 means "none").
//   ids                        the external id's bytes.
//   codes                      code generation as 4 bytes big-endian, then the iid as 8 bytes
//                              big-endian: one generation's codes are one contiguous key range.
//   meta                       "u/" + the caller's key for PutMeta/GetMeta, "s/" + name for the
//                              store's own counters.
//
// Values: every value is an envelope
//   [0]      uint8   format version (kRecordFormatVersion = 1)
//   [1]      uint8   kind (RecordKind), so that a value of one kind is never read as another
//   [2..n-4) payload, little-endian fixed-width fields (kPackedDocument's membership: varints)
//   [n-4..n) uint32  CRC-32 (zlib crc32, little-endian) of bytes [0, n-4)
// A value that is too short, has an unknown version or kind, fails its checksum, or whose payload
// does not parse exactly (every length bounded by the bytes left, no trailing bytes) decodes to
// DATA_LOSS with a message naming the column family and the key.
//
// Payloads
//   kDocument   u64 iid (must equal the key's), u32 len + external id, u64 version,
//               i64 num_tokens, u8 has_layout [+ i64 rows, cols, prefix_tokens, suffix_tokens],
//               u32 count + count × (u32 len + name, u8 type (0 int64, 1 double, 2 string),
//               value: i64 | f64 bits as u64 | u32 len + bytes), names strictly increasing,
//               u32 count + count × i32 member_offsets, u32 count + count × i32 members,
//               then, only for a document with a sparse vector (records without one are
//               byte-identical to those written before sparse vectors existed): u8 1, u32 count,
//               count × u32 indices, count × f32 values
//   kPackedDocument  what kDocument holds, in its order, but each of member_offsets and members
//               as a varint count + count × varint zigzag(value − previous value, the first
//               against 0): offsets ascend by cluster sizes and members within a cluster, so a
//               128-token document pooled at p = 2 takes ~200 bytes where the u32 arrays took
//               772 (the bulk of a docs record). Varints are LEB128 (7 bits a byte, low first)
//               and must be minimal (no trailing zero byte): the encoding stays canonical. What
//               Encode writes since 2026-12-07; kDocument values written before still read, but
//               a binary from before reads kind 9 as DATA_LOSS: a shard written to since cannot
//               be opened by an older binary (no downgrade).
//   kMatrix     u8 dtype (0 fp32, 1 fp16), i64 rows, i64 cols, then exactly rows·cols·itemsize
//               bytes of little-endian values (the StoredMatrix's bytes as they are)
//   kId         u64 iid
//   kCounter    u64 value
//   kMeta       the caller's opaque bytes
//   kCodes      a document's centroid codes, opaque here (see index/centroid/centroid_index.h)
//   kRerankPointer  (rerank CF, in place of a kMatrix once the rows moved to a segment file, see
//               rerank_segment.h) u32 segment number, u64 offset of the rows in it, u8 dtype,
//               i64 rows, i64 cols, u32 CRC-32 of the rows' rows·cols·itemsize bytes
//   kCodesPointer  (codes CF, in place of a kCodes once the codes moved to a codes segment file)
//               u32 segment number, u64 offset of the codes in it, u32 bytes, u32 CRC-32 of them
#ifndef TESSERA_INDEX_STORAGE_RECORD_CODEC_H_
#define TESSERA_INDEX_STORAGE_RECORD_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "index/storage/shard_store.h"

namespace tessera::internal {

inline constexpr uint8_t kRecordFormatVersion = 1;
// Version byte + kind byte + CRC-32.
inline constexpr size_t kRecordOverheadBytes = 6;

enum class RecordKind : uint8_t {
  kDocument = 1,
  kMatrix = 2,
  kId = 3,
  kCounter = 4,
  kMeta = 5,
  kCodes = 6,
  kRerankPointer = 7,
  kCodesPointer = 8,
  kPackedDocument = 9,
};

// Where a document's rerank rows live once moved out of RocksDB: rows·cols values of dtype at
// `offset` in segment file `segment`, whose bytes have CRC-32 `crc`.
struct RerankPointer {
  uint32_t segment = 0;
  uint64_t offset = 0;
  VectorDtype dtype = VectorDtype::kFloat16;
  int64_t rows = 0;
  int64_t cols = 0;
  uint32_t crc = 0;
};

// Where a document's codes (of the generation in their key) live once moved out of RocksDB: `bytes`
// bytes at `offset` in codes segment file `segment`, whose CRC-32 is `crc`.
struct CodesPointer {
  uint32_t segment = 0;
  uint64_t offset = 0;
  int64_t bytes = 0;
  uint32_t crc = 0;
};

// Bytes per value of `dtype` (4 or 2).
size_t DtypeSize(VectorDtype dtype);

// The codes CF key of (generation, iid), and its inverse (false for a key of another length).
std::string EncodeCodesKey(uint32_t generation, uint64_t iid);
bool DecodeCodesKey(absl::string_view key, uint32_t* generation, uint64_t* iid);
std::string EncodeCodesValue(absl::string_view codes);
absl::StatusOr<std::string> DecodeCodesValue(absl::string_view value, uint32_t generation,
                                             uint64_t iid);

// OK when rows, cols ≥ 0, rows·cols·itemsize does not overflow and equals bytes.size();
// INVALID_ARGUMENT naming `what` otherwise.
absl::Status ValidateMatrix(const StoredMatrix& matrix, absl::string_view what);

// iid keys: 8 bytes big-endian.
std::string EncodeIidKey(uint64_t iid);
// False unless `key` is exactly 8 bytes.
bool DecodeIidKey(absl::string_view key, uint64_t* iid);

// Appends the encoded value to *out. `record.iid` is stored and checked against the key on decode.
void EncodeDocumentRecord(const DocumentRecord& record, std::string* out);
std::string EncodeDocumentRecord(const DocumentRecord& record);
// Precondition of the encoder: ValidateMatrix(matrix) is OK.
void EncodeStoredMatrix(const StoredMatrix& matrix, std::string* out);
std::string EncodeStoredMatrix(const StoredMatrix& matrix);
std::string EncodeRerankPointer(const RerankPointer& pointer);
// Whether a rerank CF value is a pointer (its kind byte says so; the decoder checks the rest).
bool IsRerankPointer(absl::string_view value);
std::string EncodeCodesPointer(const CodesPointer& pointer);
// Whether a codes CF value is a pointer (its kind byte says so; the decoder checks the rest).
bool IsCodesPointer(absl::string_view value);
std::string EncodeIdValue(uint64_t iid);
std::string EncodeCounterValue(uint64_t value);
std::string EncodeMetaValue(absl::string_view bytes);

// Decoders: DATA_LOSS (naming `cf` and the key) for anything but a well-formed value of their
// kind. Never crash or allocate more than the value's size on garbage.
absl::StatusOr<DocumentRecord> DecodeDocumentRecord(absl::string_view value, uint64_t iid);
absl::StatusOr<StoredMatrix> DecodeStoredMatrix(absl::string_view value, absl::string_view cf,
                                                uint64_t iid);
absl::StatusOr<RerankPointer> DecodeRerankPointer(absl::string_view value, uint64_t iid);
absl::StatusOr<CodesPointer> DecodeCodesPointer(absl::string_view value, uint32_t generation,
                                                uint64_t iid);
absl::StatusOr<uint64_t> DecodeIdValue(absl::string_view value, absl::string_view external_id);
absl::StatusOr<uint64_t> DecodeCounterValue(absl::string_view value, absl::string_view key);
absl::StatusOr<std::string> DecodeMetaValue(absl::string_view value, absl::string_view key);

// Whether a value's kind byte names `kind` (nothing else is checked: OpenEnvelope and the decoders
// do). For a column family whose values come in more than one kind.
bool HasKind(absl::string_view value, RecordKind kind);

// Verifies only the envelope (length, version, kind, checksum) and returns the payload.
absl::StatusOr<absl::string_view> OpenEnvelope(absl::string_view value, RecordKind kind,
                                               absl::string_view what);

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_STORAGE_RECORD_CODEC_H_
