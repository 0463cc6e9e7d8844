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
constexpr uint64_t kEntryBytes = 32;
// u64 count, u64 table offset, u32 CRC, 8-byte magic.
constexpr uint64_t kTrailerBytes = 28;
constexpr char kPrefix[] = "rerank-";
constexpr char kSuffix[] = ".seg";

size_t ItemSize(VectorDtype dtype) { return dtype == VectorDtype::kFloat16 ? 2 : 4; }

absl::Status Corrupt(const std::string& path, absl::string_view problem) {
  return absl::DataLossError(absl::StrCat("rerank segment '", path, "': ", problem));
}

}  // namespace

int64_t RerankSegmentEntry::bytes() const {
  return rows * cols * static_cast<int64_t>(ItemSize(dtype));
}

std::string RerankSegmentFileName(uint32_t number) {
  return absl::StrFormat("%s%08u%s", kPrefix, number, kSuffix);
}

bool ParseRerankSegmentFileName(absl::string_view name, uint32_t* number) {
  if (!absl::ConsumePrefix(&name, kPrefix) || !absl::ConsumeSuffix(&name, kSuffix)) return false;
  if (name.size() != 8) return false;
  for (char c : name) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(name, number);
}

absl::StatusOr<int64_t> WriteRerankSegment(const std::string& path, uint32_t number,
                                           absl::Span<RerankSegmentEntry> entries,
                                           absl::Span<const absl::string_view> rows) {
  std::string header(kHeaderBytes, '\0');
  std::memcpy(header.data(), kHeaderMagic, 8);
  StoreLittleEndian32(&header[8], kSegmentFormat);
  StoreLittleEndian32(&header[12], number);
  static const std::string kZeros(kRowAlignment, '\0');
  std::vector<absl::string_view> parts;
  parts.reserve(2 * entries.size() + 3);
  parts.push_back(header);
  uint64_t offset = kHeaderBytes;
  for (size_t i = 0; i < entries.size(); ++i) {
    RerankSegmentEntry& entry = entries[i];
    entry.offset = offset;
    entry.crc = Crc32(rows[i]);
    parts.push_back(rows[i]);
    offset += rows[i].size();
    const uint64_t pad = (kRowAlignment - offset % kRowAlignment) % kRowAlignment;
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
    p[24] = entries[i].dtype == VectorDtype::kFloat16 ? 1 : 0;
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
                                                                         uint32_t number,
                                                                         int64_t expected_size) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file,
                           MappedFile::Open(path, /*populate=*/true));
  const absl::string_view bytes = file->bytes();
  const uint64_t size = bytes.size();
  if (expected_size >= 0 && size != static_cast<uint64_t>(expected_size)) {
    return Corrupt(path, absl::StrCat(size, " bytes, ", expected_size, " were written (torn or ",
                                      "truncated)"));
  }
  if (size < kHeaderBytes + kTrailerBytes) return Corrupt(path, absl::StrCat(size, " bytes"));
  if (std::memcmp(bytes.data(), kHeaderMagic, 8) != 0 ||
      std::memcmp(bytes.data() + size - 8, kTrailerMagic.data(), kTrailerMagic.size()) != 0) {
    return Corrupt(path, "no segment header or trailer (torn or not a segment)");
  }
  if (LoadLittleEndian32(bytes.data() + 8) != kSegmentFormat) {
    return Corrupt(path, absl::StrCat("format ", LoadLittleEndian32(bytes.data() + 8),
                                      ", this build reads ", kSegmentFormat));
  }
  if (LoadLittleEndian32(bytes.data() + 12) != number) {
    return Corrupt(path,
                   absl::StrCat("header says segment ", LoadLittleEndian32(bytes.data() + 12)));
  }
  const char* trailer = bytes.data() + size - kTrailerBytes;
  const uint32_t crc = Crc32(bytes.substr(0, size - kTrailerBytes + 16));
  if (crc != LoadLittleEndian32(trailer + 16)) {
    return Corrupt(path, absl::StrFormat("checksum mismatch (stored %08x, computed %08x)",
                                         LoadLittleEndian32(trailer + 16), crc));
  }
  const uint64_t count = LoadLittleEndian64(trailer);
  const uint64_t table_offset = LoadLittleEndian64(trailer + 8);
  if (table_offset < kHeaderBytes || table_offset > size - kTrailerBytes ||
      (size - kTrailerBytes - table_offset) / kEntryBytes != count ||
      (size - kTrailerBytes - table_offset) % kEntryBytes != 0) {
    return Corrupt(path, absl::StrCat("table of ", count, " entries at ", table_offset,
                                      " does not fit ", size, " bytes"));
  }
  std::vector<RerankSegmentEntry> entries(count);
  for (uint64_t i = 0; i < count; ++i) {
    const char* p = bytes.data() + table_offset + i * kEntryBytes;
    RerankSegmentEntry& entry = entries[i];
    entry.iid = LoadLittleEndian64(p);
    entry.offset = LoadLittleEndian64(p + 8);
    entry.rows = LoadLittleEndian32(p + 16);
    entry.cols = LoadLittleEndian32(p + 20);
    entry.dtype = p[24] == 1 ? VectorDtype::kFloat16 : VectorDtype::kFloat32;
    entry.crc = LoadLittleEndian32(p + 28);
    if (entry.offset < kHeaderBytes || entry.offset > table_offset ||
        static_cast<uint64_t>(entry.bytes()) > table_offset - entry.offset) {
      return Corrupt(path,
                     absl::StrCat("entry ", i, " (iid ", entry.iid, ") lies outside the rows"));
    }
  }
  return std::shared_ptr<const RerankSegment>(
      new RerankSegment(number, std::move(file), std::move(entries), table_offset));
}

}  // namespace tessera::internal
