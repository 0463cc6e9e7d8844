#include "index/storage/rerank_segment.h"

#include <array>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "index/common/crc32.h"
#include "index/common/little_endian.h"
#include "tessera/status_macros.h"

namespace tessera::internal {
namespace {

constexpr char kHeaderMagic[] = "TSRSEG01";
constexpr std::array<char, 8> kTrailerMagic = {'T', 'S', 'R', 'S', 'E', 'G', 'N', 'D'};
constexpr uint32_t kSegmentFormat = 1;
constexpr uint64_t kHeaderBytes = 64;
constexpr uint64_t kRowAlignment = 64;
constexpr uint64_t kCodesAlignment = 4;
constexpr uint64_t kEntryBytes = 32;
// u64 count, u64 table offset, u32 CRC, 8-byte magic.
constexpr uint64_t kTrailerBytes = 28;
constexpr char kSuffix[] = ".seg";
constexpr uint8_t kOpaqueDtype = 2;
// The checksum pass reads this much at a time (ReadFileInChunks).
constexpr size_t kVerifyChunkBytes = size_t{1} << 20;

size_t ItemSize(VectorDtype dtype) { return dtype == VectorDtype::kFloat16 ? 2 : 4; }

absl::Status Corrupt(SegmentKind kind, const std::string& path, absl::string_view problem) {
  return absl::DataLossError(
      absl::StrCat(SegmentKindName(kind), " segment '", path, "': ", problem));
}

}  // namespace

const char* SegmentKindName(SegmentKind kind) {
  return kind == SegmentKind::kCodes ? "codes" : "rerank";
}

int64_t RerankSegmentEntry::bytes() const {
  if (opaque) return rows;
  return rows * cols * static_cast<int64_t>(ItemSize(dtype));
}

std::string SegmentFileName(SegmentKind kind, uint32_t number) {
  return absl::StrFormat("%s-%08u%s", SegmentKindName(kind), number, kSuffix);
}

bool ParseSegmentFileName(absl::string_view name, SegmentKind kind, uint32_t* number) {
  if (!absl::ConsumePrefix(&name, SegmentKindName(kind)) || !absl::ConsumePrefix(&name, "-") ||
      !absl::ConsumeSuffix(&name, kSuffix)) {
    return false;
  }
  if (name.size() != 8) return false;
  for (char c : name) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(name, number);
}

absl::StatusOr<int64_t> WriteRerankSegment(const std::string& path, SegmentKind kind,
                                           uint32_t generation, uint32_t number,
                                           absl::Span<RerankSegmentEntry> entries,
                                           absl::Span<const absl::string_view> rows) {
  std::string header(kHeaderBytes, '\0');
  std::memcpy(header.data(), kHeaderMagic, 8);
  StoreLittleEndian32(&header[8], kSegmentFormat);
  StoreLittleEndian32(&header[12], number);
  StoreLittleEndian32(&header[16], static_cast<uint32_t>(kind));
  StoreLittleEndian32(&header[20], generation);
  static const std::string kZeros(kRowAlignment, '\0');
  std::vector<absl::string_view> parts;
  parts.reserve(2 * entries.size() + 3);
  parts.push_back(header);
  // Rerank rows start on a cache line; codes only on a 4-byte boundary (see the file comment).
  const uint64_t alignment = kind == SegmentKind::kCodes ? kCodesAlignment : kRowAlignment;
  uint64_t offset = kHeaderBytes;
  for (size_t i = 0; i < entries.size(); ++i) {
    RerankSegmentEntry& entry = entries[i];
    entry.offset = offset;
    entry.crc = Crc32(rows[i]);
    parts.push_back(rows[i]);
    offset += rows[i].size();
    const uint64_t pad = (alignment - offset % alignment) % alignment;
    if (pad > 0) parts.emplace_back(kZeros.data(), pad);
    offset += pad;
  }
  std::string table(entries.size() * kEntryBytes + kTrailerBytes, '\0');
  for (size_t i = 0; i < entries.size(); ++i) {
    char* p = &table[i * kEntryBytes];
    StoreLittleEndian64(p, entries[i].iid);
    StoreLittleEndian64(p + 8, entries[i].offset);
    StoreLittleEndian32(p + 16, static_cast<uint32_t>(entries[i].rows));
    StoreLittleEndian32(p + 20, static_cast<uint32_t>(entries[i].cols));
    p[24] = static_cast<char>(entries[i].opaque                           ? kOpaqueDtype
                              : entries[i].dtype == VectorDtype::kFloat16 ? 1
                                                                          : 0);
    StoreLittleEndian32(p + 28, entries[i].crc);
  }
  char* trailer = &table[entries.size() * kEntryBytes];
  StoreLittleEndian64(trailer, entries.size());
  StoreLittleEndian64(trailer + 8, offset);
  uint32_t crc = 0;
  for (absl::string_view part : parts) crc = Crc32(part, crc);
  crc = Crc32(absl::string_view(table.data(), entries.size() * kEntryBytes + 16), crc);
  StoreLittleEndian32(trailer + 16, crc);
  std::memcpy(trailer + 20, kTrailerMagic.data(), kTrailerMagic.size());
  parts.push_back(table);
  TESSERA_RETURN_IF_ERROR(WriteFileAtomically(path, parts));
  return static_cast<int64_t>(offset + table.size());
}

absl::StatusOr<std::shared_ptr<const RerankSegment>> RerankSegment::Open(const std::string& path,
                                                                         SegmentKind kind,
                                                                         uint32_t number,
                                                                         int64_t expected_size) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::Open(path));
  const absl::string_view bytes = file->bytes();
  const uint64_t size = bytes.size();
  if (expected_size >= 0 && size != static_cast<uint64_t>(expected_size)) {
    return Corrupt(
        kind, path,
        absl::StrCat(size, " bytes, ", expected_size, " were written (torn or ", "truncated)"));
  }
  if (size < kHeaderBytes + kTrailerBytes) return Corrupt(kind, path, absl::StrCat(size, " bytes"));
  if (std::memcmp(bytes.data(), kHeaderMagic, 8) != 0 ||
      std::memcmp(bytes.data() + size - 8, kTrailerMagic.data(), kTrailerMagic.size()) != 0) {
    return Corrupt(kind, path, "no segment header or trailer (torn or not a segment)");
  }
  if (LoadLittleEndian32(bytes.data() + 8) != kSegmentFormat) {
    return Corrupt(kind, path,
                   absl::StrCat("format ", LoadLittleEndian32(bytes.data() + 8),
                                ", this build reads ", kSegmentFormat));
  }
  if (LoadLittleEndian32(bytes.data() + 12) != number) {
    return Corrupt(kind, path,
                   absl::StrCat("header says segment ", LoadLittleEndian32(bytes.data() + 12)));
  }
  if (LoadLittleEndian32(bytes.data() + 16) != static_cast<uint32_t>(kind)) {
    return Corrupt(
        kind, path,
        absl::StrCat("header says kind ", LoadLittleEndian32(bytes.data() + 16), ", expected ",
                     static_cast<uint32_t>(kind), " (", SegmentKindName(kind), ")"));
  }
  const uint32_t generation = LoadLittleEndian32(bytes.data() + 20);
  const char* trailer = bytes.data() + size - kTrailerBytes;
  // Read with pread, not through the mapping: the pages a checksum pass touched through it would
  // stay resident in the process.
  uint32_t crc = 0;
  TESSERA_RETURN_IF_ERROR(
      ReadFileInChunks(path, size - kTrailerBytes + 16, kVerifyChunkBytes,
                       [&crc](absl::string_view chunk) { crc = Crc32(chunk, crc); }));
  if (crc != LoadLittleEndian32(trailer + 16)) {
    return Corrupt(kind, path,
                   absl::StrFormat("checksum mismatch (stored %08x, computed %08x)",
                                   LoadLittleEndian32(trailer + 16), crc));
  }
  const uint64_t count = LoadLittleEndian64(trailer);
  const uint64_t table_offset = LoadLittleEndian64(trailer + 8);
  if (table_offset < kHeaderBytes || table_offset > size - kTrailerBytes ||
      (size - kTrailerBytes - table_offset) / kEntryBytes != count ||
      (size - kTrailerBytes - table_offset) % kEntryBytes != 0) {
    return Corrupt(kind, path,
                   absl::StrCat("table of ", count, " entries at ", table_offset, " does not fit ",
                                size, " bytes"));
  }
  std::vector<RerankSegmentEntry> entries(count);
  for (uint64_t i = 0; i < count; ++i) {
    const char* p = bytes.data() + table_offset + i * kEntryBytes;
    RerankSegmentEntry& entry = entries[i];
    entry.iid = LoadLittleEndian64(p);
    entry.offset = LoadLittleEndian64(p + 8);
    entry.rows = LoadLittleEndian32(p + 16);
    entry.cols = LoadLittleEndian32(p + 20);
    const uint8_t dtype = static_cast<uint8_t>(p[24]);
    entry.opaque = dtype == kOpaqueDtype;
    entry.dtype = dtype == 1 ? VectorDtype::kFloat16 : VectorDtype::kFloat32;
    entry.crc = LoadLittleEndian32(p + 28);
    if (entry.opaque != (kind == SegmentKind::kCodes) || dtype > kOpaqueDtype) {
      return Corrupt(kind, path,
                     absl::StrCat("entry ", i, " (iid ", entry.iid, ") has dtype ", dtype,
                                  ", expected ", kind == SegmentKind::kCodes ? "2" : "0 or 1"));
    }
    if (entry.offset < kHeaderBytes || entry.offset > table_offset ||
        static_cast<uint64_t>(entry.bytes()) > table_offset - entry.offset) {
      return Corrupt(kind, path,
                     absl::StrCat("entry ", i, " (iid ", entry.iid, ") lies outside the rows"));
    }
  }
  // The header and table were read through the mapping: drop what they made resident.
  file->DropResidentPages();
  return std::shared_ptr<const RerankSegment>(new RerankSegment(
      number, kind, generation, std::move(file), std::move(entries), table_offset));
}

}  // namespace tessera::internal
