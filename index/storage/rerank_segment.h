// Segment files: documents' rerank rows, or their centroid codes, moved out of RocksDB into
// append-once files that a search reads in place (memory-mapped, page-cache backed, no
// per-document copy or checksum pass). ShardStore writes them and commits pointers to them
// (record_codec.h, kRerankPointer and kCodesPointer); this file is only the byte layout, the
// writer and the verified, mapped reader. Both kinds share the format; a file holds one kind, and
// a codes segment the codes of one generation (shard_store.h).
//
// File `rerank-<number, 8 digits>.seg` or `codes-<number, 8 digits>.seg` (segment numbers are
// one sequence over both kinds) in the store's directory, little-endian:
//   [0, 64)   header: "TSRSEG01", u32 format (1), u32 segment number, u32 kind (0 rerank rows,
//             1 codes), u32 generation (of the codes; 0 for rerank rows), zero bytes
//   rows      each document's bytes (rows·cols·itemsize of them; a codes entry's `rows` bytes):
//             rerank rows at an offset that is a multiple of 64, so that they start a cache line;
//             codes at a multiple of 4 (their u32 count and centroid ids then lie aligned:
//             DocumentCodesView::aligned_centroids), as a 64-byte boundary cost 60 bytes of every
//             document's 2,308 (2-bit codes) or 4,356 (4-bit) at 64 vectors of dim 128, 0.47 bytes
//             per original token at p = 2. Files written with codes at multiples of 64 read the
//             same: every offset is the table's.
//   table     count × 32 bytes: u64 iid, u64 offset, u32 rows, u32 cols, u8 dtype (0 fp32,
//             1 fp16, 2 opaque bytes: a codes entry, cols 1), 3 zero bytes, u32 CRC-32 of the
//             rows
//   trailer   u64 count, u64 table offset, u32 CRC-32 of every byte before this field,
//             "TSRSEGND"
// Segments written before codes segments existed have zeros where kind and generation are: they
// read as rerank segments, unchanged. A segment is written whole to `<name>.tmp`, fsynced,
// renamed and its directory fsynced (WriteFileAtomically) before any pointer to it is committed,
// and never written again.
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

// What a segment holds.
enum class SegmentKind : uint32_t {
  kRerank = 0,  // documents' rerank rows (fp16/fp32 matrices)
  kCodes = 1,   // documents' centroid codes of one generation (opaque bytes)
};
// "rerank" or "codes", as in file names and messages.
const char* SegmentKindName(SegmentKind kind);

// The file name of segment `number` of `kind` ("rerank-00000012.seg", "codes-00000013.seg"), and
// its inverse (false for any other name, the temporary "….seg.tmp" and the other kind's included).
std::string SegmentFileName(SegmentKind kind, uint32_t number);
bool ParseSegmentFileName(absl::string_view name, SegmentKind kind, uint32_t* number);

// One document's rows (or codes) as written to, or listed in, a segment.
struct RerankSegmentEntry {
  uint64_t iid = 0;
  VectorDtype dtype = VectorDtype::kFloat16;
  int64_t rows = 0;
  int64_t cols = 0;
  // A codes entry: `rows` opaque bytes, cols 1, dtype unused.
  bool opaque = false;
  uint64_t offset = 0;  // set by the writer
  uint32_t crc = 0;     // CRC-32 of the rows; set by the writer
  int64_t bytes() const;
};

// Writes segment `number` of `kind` (and, for codes, `generation`) to `path` (atomically and
// durably, see above) holding `entries` in order (opaque exactly when kind is kCodes); rows[i] are
// entry i's bytes (bytes() of them). Fills in each entry's offset and crc and returns the file's
// size. ErrnoStatus naming the file on an I/O error.
absl::StatusOr<int64_t> WriteRerankSegment(const std::string& path, SegmentKind kind,
                                           uint32_t generation, uint32_t number,
                                           absl::Span<RerankSegmentEntry> entries,
                                           absl::Span<const absl::string_view> rows);

// A written segment, mapped read-only and verified. Immutable; thread-safe. Readers keep it (and so
// its mapping) alive with the shared pointer Open returns.
class RerankSegment {
 public:
  // Checks `path` whole and maps it: its size (`expected_size`, as committed, or -1 for any), the
  // header's number and kind (`kind`), the trailer, the CRC-32 of every byte, that every table
  // entry lies within the rows and is of the kind. The checksum pass reads the file with pread, not
  // through the mapping, so that opening a shard's segments does not make them resident in the
  // process (the mapping's pages come in as searches read them). DATA_LOSS naming the file for a
  // torn, truncated or corrupt segment; ErrnoStatus naming it when it cannot be opened or read
  // (NOT_FOUND when it does not exist).
  static absl::StatusOr<std::shared_ptr<const RerankSegment>> Open(const std::string& path,
                                                                   SegmentKind kind,
                                                                   uint32_t number,
                                                                   int64_t expected_size);

  uint32_t number() const { return number_; }
  SegmentKind kind() const { return kind_; }
  // The generation of a codes segment's codes (0 for rerank rows).
  uint32_t generation() const { return generation_; }
  const std::string& path() const { return file_->path(); }
  int64_t size() const { return static_cast<int64_t>(file_->bytes().size()); }
  // The documents written to it, in file order (removed ones included: liveness is RocksDB's).
  const std::vector<RerankSegmentEntry>& entries() const { return entries_; }
  // The `bytes` bytes at `offset`, in place; empty when the range is not within the rows.
  absl::string_view Rows(uint64_t offset, uint64_t bytes) const {
    if (offset > rows_end_ || bytes > rows_end_ - offset) return {};
    return file_->bytes().substr(offset, bytes);
  }
  // Drops the mapping's pages from this process's resident memory (madvise MADV_DONTNEED; the
  // page cache keeps them): for a scan that read every entry once. Views stay valid (a later read
  // faults the page in again).
  void DropResidentPages() const { file_->DropResidentPages(); }

 private:
  RerankSegment(uint32_t number, SegmentKind kind, uint32_t generation,
                std::shared_ptr<const MappedFile> file, std::vector<RerankSegmentEntry> entries,
                uint64_t rows_end)
      : number_(number),
        kind_(kind),
        generation_(generation),
        file_(std::move(file)),
        entries_(std::move(entries)),
        rows_end_(rows_end) {}

  const uint32_t number_;
  const SegmentKind kind_;
  const uint32_t generation_;
  const std::shared_ptr<const MappedFile> file_;
  const std::vector<RerankSegmentEntry> entries_;
  const uint64_t rows_end_;  // where the table begins
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_STORAGE_RERANK_SEGMENT_H_
