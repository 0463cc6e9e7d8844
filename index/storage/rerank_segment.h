// Rerank segment files: documents' rerank rows moved out of RocksDB into append-once files that a
// search reads in place (memory-mapped, page-cache backed, no per-document copy or checksum pass).
// ShardStore writes them and commits pointers to them (record_codec.h, kRerankPointer); this file
// is only the byte layout, the writer and the verified, mapped reader.
//
// File `rerank-<number, 8 digits>.seg` in the store's directory, little-endian:
//   [0, 64)   header: "TSRSEG01", u32 format (1), u32 segment number, zero bytes
//   rows      each document's rows·cols·itemsize bytes, at an offset that is a multiple of 64
//   table     count × 32 bytes: u64 iid, u64 offset, u32 rows, u32 cols, u8 dtype (0 fp32,
//             1 fp16), 3 zero bytes, u32 CRC-32 of the rows
//   trailer   u64 count, u64 table offset, u32 CRC-32 of every byte before this field,
//             "TSRSEGND"
// A segment is written whole to `<name>.tmp`, fsynced, renamed and its directory fsynced
// (WriteFileAtomically) before any pointer to it is committed, and never written again.
#ifndef TESSERA_INDEX_STORAGE_RERANK_SEGMENT_H_
#define TESSERA_INDEX_STORAGE_RERANK_SEGMENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "index/common/file_io.h"
#include "tessera/matrix.h"

namespace tessera::internal {

// The file name of segment `number` ("rerank-00000012.seg"), and its inverse (false for any other
// name, the temporary "….seg.tmp" included).
std::string RerankSegmentFileName(uint32_t number);
bool ParseRerankSegmentFileName(absl::string_view name, uint32_t* number);

// One document's rows as written to, or listed in, a segment.
struct RerankSegmentEntry {
  uint64_t iid = 0;
  VectorDtype dtype = VectorDtype::kFloat16;
  int64_t rows = 0;
  int64_t cols = 0;
  uint64_t offset = 0;  // set by the writer
  uint32_t crc = 0;     // CRC-32 of the rows; set by the writer
  int64_t bytes() const;
};

// Writes segment `number` to `path` (atomically and durably, see above) holding `entries` in order;
// rows[i] are entry i's bytes (rows·cols·itemsize of them). Fills in each entry's offset and crc
// and returns the file's size. ErrnoStatus naming the file on an I/O error.
absl::StatusOr<int64_t> WriteRerankSegment(const std::string& path, uint32_t number,
                                           absl::Span<RerankSegmentEntry> entries,
                                           absl::Span<const absl::string_view> rows);

// A written segment, mapped read-only and verified. Immutable; thread-safe. Readers keep it (and so
// its mapping) alive with the shared pointer Open returns.
class RerankSegment {
 public:
  // Maps `path` and checks it whole: its size (`expected_size`, as committed, or -1 for any), the
  // header's number, the trailer, the CRC-32 of every byte, and that every table entry lies within
  // the rows. DATA_LOSS naming the file for a torn, truncated or corrupt segment; ErrnoStatus
  // naming it when it cannot be opened (NOT_FOUND when it does not exist).
  static absl::StatusOr<std::shared_ptr<const RerankSegment>> Open(const std::string& path,
                                                                   uint32_t number,
                                                                   int64_t expected_size);

  uint32_t number() const { return number_; }
  const std::string& path() const { return file_->path(); }
  int64_t size() const { return static_cast<int64_t>(file_->bytes().size()); }
  // The documents written to it, in file order (removed ones included: liveness is RocksDB's).
  const std::vector<RerankSegmentEntry>& entries() const { return entries_; }
  // The `bytes` bytes at `offset`, in place; empty when the range is not within the rows.
  absl::string_view Rows(uint64_t offset, uint64_t bytes) const {
    if (offset > rows_end_ || bytes > rows_end_ - offset) return {};
    return file_->bytes().substr(offset, bytes);
  }

 private:
  RerankSegment(uint32_t number, std::shared_ptr<const MappedFile> file,
                std::vector<RerankSegmentEntry> entries, uint64_t rows_end)
      : number_(number),
        file_(std::move(file)),
        entries_(std::move(entries)),
        rows_end_(rows_end) {}

  const uint32_t number_;
  const std::shared_ptr<const MappedFile> file_;
  const std::vector<RerankSegmentEntry> entries_;
  const uint64_t rows_end_;  // where the table begins
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_STORAGE_RERANK_SEGMENT_H_
