// The .npz reader and writer: just enough of the ZIP format (PKWARE APPNOTE 6.3) for what NumPy
// writes and reads. The reader trusts nothing: every offset and length from the file is checked
// against the bytes actually present before it is used; every member's declared sizes (central
// directory, local header, and the shape × dtype of its .npy header) must agree and fit the
// caller's limits before the member is inflated, and inflation stops at the declared size.
#include "tessera/npz.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "tessera/status_macros.h"

namespace tessera {
namespace {

constexpr uint32_t kLocalHeaderSignature = 0x04034b50;
constexpr uint32_t kCentralHeaderSignature = 0x02014b50;
constexpr uint32_t kEndSignature = 0x06054b50;
constexpr uint32_t kZip64EndSignature = 0x06064b50;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr size_t kLocalHeaderSize = 30;
constexpr size_t kCentralHeaderSize = 46;
constexpr size_t kEndSize = 22;
constexpr size_t kZip64EndSize = 56;
constexpr size_t kZip64LocatorSize = 20;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint32_t kSaturated32 = 0xffffffff;
constexpr uint16_t kSaturated16 = 0xffff;
constexpr uint16_t kMethodStored = 0;
constexpr uint16_t kMethodDeflated = 8;
constexpr uint16_t kFlagEncrypted = 0x0001;
constexpr uint16_t kFlagDataDescriptor = 0x0008;  // CRC-32 and sizes follow the data
constexpr uint16_t kFlagUtf8 = 0x0800;
constexpr uint16_t kVersionDefault = 20;  // 2.0: deflate.
constexpr uint16_t kVersionZip64 = 45;    // 4.5: ZIP64.
constexpr uint16_t kMadeByUnix = 3 << 8;
constexpr uint16_t kDosDate1980 = (0 << 9) | (1 << 5) | 1;  // 1980-01-01: reproducible output.
constexpr uint32_t kRegularFileAttributes = 0100644u << 16;
// Deflate cannot expand data more than 1032-fold; a member claiming more is corrupt.
constexpr uint64_t kMaxInflateRatio = 1032;
// How much of a deflated member is inflated first, for its .npy header: NumPy's headers are at
// most a few KiB (it refuses to read more than 10,000 bytes by default).
constexpr uint64_t kHeaderReadAhead = uint64_t{1} << 20;
// zlib counts in uInt; feed it at most this much at a time.
constexpr size_t kZlibChunk = size_t{1} << 30;

uint16_t Load16(absl::string_view bytes, uint64_t offset) {
  uint16_t value;
  std::memcpy(&value, bytes.data() + offset, sizeof(value));
  return value;
}
uint32_t Load32(absl::string_view bytes, uint64_t offset) {
  uint32_t value;
  std::memcpy(&value, bytes.data() + offset, sizeof(value));
  return value;
}
uint64_t Load64(absl::string_view bytes, uint64_t offset) {
  uint64_t value;
  std::memcpy(&value, bytes.data() + offset, sizeof(value));
  return value;
}

void Put16(std::string* out, uint16_t value) { out->append(reinterpret_cast<char*>(&value), 2); }
void Put32(std::string* out, uint32_t value) { out->append(reinterpret_cast<char*>(&value), 4); }
void Put64(std::string* out, uint64_t value) { out->append(reinterpret_cast<char*>(&value), 8); }

// Whether [offset, offset + length) lies within [0, size).
bool Fits(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

std::string Quote(absl::string_view name) { return internal::QuoteForMessage(name); }

std::string Hint(const std::string& hint) {
  return hint.empty() ? "" : absl::StrCat(" (", hint, ")");
}

std::string Hex32(uint32_t value) { return absl::StrCat("0x", absl::Hex(value, absl::kZeroPad8)); }

template <typename... Args>
absl::Status Invalid(absl::string_view where, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", args...));
}

uint32_t Crc32(uint32_t crc, absl::string_view bytes) {
  if (bytes.empty()) return crc;  // zlib returns the initial value for a null pointer.
  return static_cast<uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

absl::string_view MethodName(uint16_t method) {
  switch (method) {
    case 9:
      return " (deflate64)";
    case 12:
      return " (bzip2)";
    case 14:
      return " (lzma)";
    case 93:
      return " (zstd)";
    case 95:
      return " (xz)";
    default:
      return "";
  }
}

// ---------------------------------------------------------------------------------------------
// Reading.

struct CentralDirectory {
  uint64_t count = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

struct Member {
  absl::string_view name;
  uint16_t flags = 0;
  uint16_t method = 0;
  uint32_t crc = 0;
  uint64_t compressed_size = 0;
  uint64_t size = 0;
  uint64_t local_offset = 0;
};

// Finds the end-of-central-directory record (and the ZIP64 one, if there is a locator for it).
absl::StatusOr<CentralDirectory> FindCentralDirectory(absl::string_view zip,
                                                      absl::string_view source) {
  if (zip.size() < kEndSize) {
    return Invalid(source, "not a ZIP archive: ", zip.size(),
                   " bytes, fewer than the 22 of an end-of-central-directory record");
  }
  // The record is last, followed only by a comment of at most 65535 bytes.
  const uint64_t last = zip.size() - kEndSize;
  const uint64_t lowest = last > 0xffff ? last - 0xffff : 0;
  uint64_t end = last + 1;
  for (uint64_t pos = last + 1; pos-- > lowest;) {
    if (Load32(zip, pos) == kEndSignature && pos + kEndSize + Load16(zip, pos + 20) == zip.size()) {
      end = pos;
      break;
    }
  }
  if (end > last) {
    return Invalid(source,
                   "not a ZIP archive: no end-of-central-directory record (signature 0x06054b50) "
                   "in its last 65557 bytes");
  }
  uint32_t disk = Load16(zip, end + 4);
  uint32_t directory_disk = Load16(zip, end + 6);
  uint64_t disk_count = Load16(zip, end + 8);
  CentralDirectory directory;
  directory.count = Load16(zip, end + 10);
  directory.size = Load32(zip, end + 12);
  directory.offset = Load32(zip, end + 16);
  uint64_t directory_limit = end;  // The directory must lie before this offset.

  if (end >= kZip64LocatorSize && Load32(zip, end - kZip64LocatorSize) == kZip64LocatorSignature) {
    const uint64_t locator = end - kZip64LocatorSize;
    const uint32_t record_disk = Load32(zip, locator + 4);
    const uint64_t record = Load64(zip, locator + 8);
    const uint32_t total_disks = Load32(zip, locator + 16);
    if (record_disk != 0 || total_disks > 1) {
      return Invalid(source, "multi-disk (split) ZIP archives are not supported (", total_disks,
                     " disks)");
    }
    if (!Fits(record, kZip64EndSize, locator)) {
      return Invalid(source, "the ZIP64 end-of-central-directory record at offset ", record,
                     " does not fit before its locator at offset ", locator);
    }
    if (Load32(zip, record) != kZip64EndSignature) {
      return Invalid(source, "the ZIP64 end-of-central-directory record at offset ", record,
                     " has signature ", Hex32(Load32(zip, record)), ", expected 0x06064b50");
    }
    disk = Load32(zip, record + 16);
    directory_disk = Load32(zip, record + 20);
    disk_count = Load64(zip, record + 24);
    directory.count = Load64(zip, record + 32);
    directory.size = Load64(zip, record + 40);
    directory.offset = Load64(zip, record + 48);
    directory_limit = record;
  }
  if (disk != 0 || directory_disk != 0 || disk_count != directory.count) {
    return Invalid(source, "multi-disk (split) ZIP archives are not supported (disk ", disk,
                   ", directory on disk ", directory_disk, ")");
  }
  if (!Fits(directory.offset, directory.size, directory_limit)) {
    return Invalid(source, "the central directory (", directory.size, " bytes at offset ",
                   directory.offset, ") does not fit before offset ", directory_limit);
  }
  if (directory.count > directory.size / kCentralHeaderSize) {
    return Invalid(source, "a central directory of ", directory.size, " bytes cannot hold ",
                   directory.count, " entries");
  }
  return directory;
}

// Reads the sizes and offset that a ZIP64 extra field holds for the fields saturated in `member`.
absl::Status ApplyZip64Extra(absl::string_view extra, bool disk_saturated, const std::string& where,
                             Member* member) {
  absl::string_view zip64;
  bool found = false;
  for (size_t pos = 0; pos + 4 <= extra.size();) {
    const uint16_t id = Load16(extra, pos);
    const uint16_t length = Load16(extra, pos + 2);
    if (length > extra.size() - pos - 4) {
      return Invalid(where, "extra field ", Hex32(id), " of ", length,
                     " bytes overruns the extra data (", extra.size() - pos - 4, " bytes left)");
    }
    if (id == kZip64ExtraId && !found) {
      zip64 = extra.substr(pos + 4, length);
      found = true;
    }
    pos += 4 + length;
  }
  size_t next = 0;
  auto take = [&](uint64_t* field, size_t width) {
    if (*field != (width == 8 ? kSaturated32 : kSaturated16)) return true;
    if (next + width > zip64.size()) return false;
    *field = width == 8 ? Load64(zip64, next) : Load32(zip64, next);
    next += width;
    return true;
  };
  uint64_t disk = disk_saturated ? kSaturated16 : 0;
  if (!take(&member->size, 8) || !take(&member->compressed_size, 8) ||
      !take(&member->local_offset, 8) || !take(&disk, 4)) {
    return Invalid(where,
                   found ? "the ZIP64 extra field is too short for the fields marked 0xffffffff"
                         : "sizes or offset are marked 0xffffffff but there is no ZIP64 "
                           "extra field");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Member>> ReadCentralDirectory(absl::string_view zip,
                                                         const CentralDirectory& directory,
                                                         absl::string_view source) {
  std::vector<Member> members;
  members.reserve(directory.count);
  const uint64_t limit = directory.offset + directory.size;
  uint64_t pos = directory.offset;
  for (uint64_t i = 0; i < directory.count; ++i) {
    if (!Fits(pos, kCentralHeaderSize, limit)) {
      return Invalid(source, "central directory entry ", i, " at offset ", pos,
                     " runs past the directory's end at offset ", limit);
    }
    if (Load32(zip, pos) != kCentralHeaderSignature) {
      return Invalid(source, "central directory entry ", i, " at offset ", pos, " has signature ",
                     Hex32(Load32(zip, pos)), ", expected 0x02014b50");
    }
    Member member;
    member.flags = Load16(zip, pos + 8);
    member.method = Load16(zip, pos + 10);
    member.crc = Load32(zip, pos + 16);
    member.compressed_size = Load32(zip, pos + 20);
    member.size = Load32(zip, pos + 24);
    const uint16_t name_length = Load16(zip, pos + 28);
    const uint16_t extra_length = Load16(zip, pos + 30);
    const uint16_t comment_length = Load16(zip, pos + 32);
    const bool disk_saturated = Load16(zip, pos + 34) == kSaturated16;
    member.local_offset = Load32(zip, pos + 42);
    const uint64_t variable = uint64_t{name_length} + extra_length + comment_length;
    if (!Fits(pos + kCentralHeaderSize, variable, limit)) {
      return Invalid(source, "central directory entry ", i, " at offset ", pos,
                     ": its name, extra field and comment run past the directory's end at offset ",
                     limit);
    }
    member.name = zip.substr(pos + kCentralHeaderSize, name_length);
    const absl::string_view extra =
        zip.substr(pos + kCentralHeaderSize + name_length, extra_length);
    if (member.size == kSaturated32 || member.compressed_size == kSaturated32 ||
        member.local_offset == kSaturated32 || disk_saturated) {
      TESSERA_RETURN_IF_ERROR(ApplyZip64Extra(
          extra, disk_saturated, absl::StrCat(source, " member ", Quote(member.name)), &member));
    }
    members.push_back(member);
    pos += kCentralHeaderSize + variable;
  }
  return members;
}

// A member whose structure has been checked: where its data lies, and its name as a key.
struct LocatedMember {
  const Member* member = nullptr;
  std::string where;       // "SOURCE member 'NAME'" for messages
  absl::string_view data;  // the stored or deflated bytes
};

// Checks one member's directory entry and local header against each other and against the
// archive's bytes: method, encryption, name, where its data lies, and (unless the sizes follow the
// data in a descriptor) that the local header declares the same CRC-32 and sizes as the central
// directory. Nothing is inflated.
absl::StatusOr<LocatedMember> LocateMember(absl::string_view zip, const Member& member,
                                           absl::string_view source) {
  LocatedMember located;
  located.member = &member;
  located.where = absl::StrCat(source, " member ", Quote(member.name));
  const std::string& where = located.where;
  if (member.flags & kFlagEncrypted) {
    return Invalid(where, "is encrypted; encrypted archives are not supported");
  }
  if (member.method != kMethodStored && member.method != kMethodDeflated) {
    return Invalid(where, "uses compression method ", member.method, MethodName(member.method),
                   "; expected 0 (stored, numpy.savez) or 8 (deflated, numpy.savez_compressed)");
  }
  if (!absl::EndsWith(member.name, ".npy")) {
    return Invalid(where, "is not a .npy file; an .npz holds only NAME.npy members");
  }

  const uint64_t local = member.local_offset;
  if (!Fits(local, kLocalHeaderSize, zip.size())) {
    return Invalid(where, "the local header at offset ", local, " lies outside the archive's ",
                   zip.size(), " bytes");
  }
  if (Load32(zip, local) != kLocalHeaderSignature) {
    return Invalid(where, "the local header at offset ", local, " has signature ",
                   Hex32(Load32(zip, local)), ", expected 0x04034b50");
  }
  const uint64_t name_length = Load16(zip, local + 26);
  const uint64_t extra_length = Load16(zip, local + 28);
  if (!Fits(local + kLocalHeaderSize, name_length + extra_length, zip.size())) {
    return Invalid(where, "the local header at offset ", local, " runs past the archive's end");
  }
  const absl::string_view local_name = zip.substr(local + kLocalHeaderSize, name_length);
  if (local_name != member.name) {
    return Invalid(where, "the local header at offset ", local, " names ", Quote(local_name),
                   ", the central directory ", Quote(member.name));
  }
  if ((Load16(zip, local + 6) & kFlagDataDescriptor) == 0) {
    // The local header's own sizes (a ZIP64 extra field holds those marked 0xffffffff).
    Member declared;
    declared.crc = Load32(zip, local + 14);
    declared.compressed_size = Load32(zip, local + 18);
    declared.size = Load32(zip, local + 22);
    if (declared.size == kSaturated32 || declared.compressed_size == kSaturated32) {
      TESSERA_RETURN_IF_ERROR(ApplyZip64Extra(
          zip.substr(local + kLocalHeaderSize + name_length, extra_length),
          /*disk_saturated=*/false, absl::StrCat(where, " (local header)"), &declared));
    }
    if (declared.size != member.size || declared.compressed_size != member.compressed_size ||
        declared.crc != member.crc) {
      return Invalid(where, "the local header declares ", declared.size, " bytes (",
                     declared.compressed_size, " compressed, CRC-32 ", Hex32(declared.crc),
                     "), the central directory ", member.size, " bytes (", member.compressed_size,
                     " compressed, CRC-32 ", Hex32(member.crc), ")");
    }
  }
  const uint64_t data_offset = local + kLocalHeaderSize + name_length + extra_length;
  if (!Fits(data_offset, member.compressed_size, zip.size())) {
    return Invalid(where, "its ", member.compressed_size, " bytes of data at offset ", data_offset,
                   " run past the archive's end at ", zip.size());
  }
  located.data = zip.substr(data_offset, member.compressed_size);
  if (member.method == kMethodStored && member.compressed_size != member.size) {
    return Invalid(where, "is stored but its compressed size ", member.compressed_size,
                   " differs from its size ", member.size);
  }
  if (member.method == kMethodDeflated && member.size / kMaxInflateRatio > located.data.size()) {
    return Invalid(where, "claims ", member.size, " bytes from ", located.data.size(),
                   " deflated bytes, more than deflate can produce");
  }
  return located;
}

// A raw deflate stream read in pieces: each Read writes only into the room it is given, so what a
// member inflates to never exceeds the buffer sized from its declared size.
class Inflater {
 public:
  Inflater(absl::string_view compressed, const std::string& where, internal::NpzReadStats* stats)
      : compressed_(compressed), where_(where), stats_(stats) {
    std::memset(&stream_, 0, sizeof(stream_));
  }
  ~Inflater() {
    if (initialized_) inflateEnd(&stream_);
  }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;

  // Fills `out` from the stream and returns how many bytes it wrote: all of out.size() unless the
  // stream ends first (then ended() is true). INVALID_ARGUMENT for corrupt or truncated data;
  // `expected` (the declared size) is for messages.
  absl::StatusOr<size_t> Read(absl::Span<uint8_t> out, uint64_t expected) {
    if (!initialized_) {
      if (inflateInit2(&stream_, -MAX_WBITS) != Z_OK) {
        return absl::InternalError(absl::StrCat(where_, ": cannot initialize zlib"));
      }
      initialized_ = true;
    }
    size_t written = 0;
    while (written < out.size() && !ended_) {
      if (stream_.avail_in == 0 && consumed_ < compressed_.size()) {
        const size_t chunk = std::min(compressed_.size() - consumed_, kZlibChunk);
        stream_.next_in =
            reinterpret_cast<Bytef*>(const_cast<char*>(compressed_.data() + consumed_));
        stream_.avail_in = static_cast<uInt>(chunk);
        consumed_ += chunk;
      }
      const size_t room = std::min(out.size() - written, kZlibChunk);
      stream_.next_out = out.data() + written;
      stream_.avail_out = static_cast<uInt>(room);
      const int result = inflate(&stream_, Z_NO_FLUSH);
      const size_t produced = room - stream_.avail_out;
      written += produced;
      produced_ += produced;
      if (stats_ != nullptr) stats_->inflated_bytes += produced;
      if (result == Z_STREAM_END) {
        ended_ = true;
      } else if (result == Z_BUF_ERROR && stream_.avail_in == 0 &&
                 consumed_ == compressed_.size()) {
        return Invalid(where_, "the deflate stream is truncated after ", produced_, " of ",
                       expected, " bytes");
      } else if (result != Z_OK && result != Z_BUF_ERROR) {
        return Invalid(where_, "corrupt deflate data (zlib: ",
                       stream_.msg != nullptr ? std::string(stream_.msg) : std::to_string(result),
                       ")");
      }
    }
    return written;
  }

  bool ended() const { return ended_; }

 private:
  absl::string_view compressed_;
  const std::string& where_;
  internal::NpzReadStats* stats_;
  z_stream stream_;
  bool initialized_ = false;
  bool ended_ = false;
  size_t consumed_ = 0;
  uint64_t produced_ = 0;
};

// Reads one located member. Its .npy header is parsed first (for a deflated member, from the
// first bytes inflated), and the shape × dtype it declares must account for exactly the member's
// declared size and fit `limits` before the rest is inflated; the buffer never grows past the
// declared size, and a stream that would inflate further is refused.
absl::StatusOr<std::pair<std::string, NpyArray>> ReadMember(const LocatedMember& located,
                                                            const NpzLimits& limits,
                                                            internal::NpzReadStats* stats) {
  const Member& member = *located.member;
  const std::string& where = located.where;
  std::string key(member.name.substr(0, member.name.size() - 4));
  auto check_header = [&](absl::string_view prefix, absl::string_view size_origin) -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(const internal::NpyHeaderInfo header,
                             internal::ParseNpyHeader(prefix, member.size, where, size_origin));
    if (header.data_size > limits.max_array_bytes) {
      return Invalid(where, "its array of ", NpyDtypeName(header.dtype), " ",
                     internal::ShapeStringForMessage(header.shape), " holds ", header.data_size,
                     " bytes, more than the limit of ", limits.max_array_bytes, " bytes per array",
                     Hint(limits.array_limit_hint));
    }
    return absl::OkStatus();
  };

  if (member.method == kMethodStored) {
    const uint32_t crc = Crc32(0, located.data);
    if (crc != member.crc) {
      return Invalid(where, "CRC-32 mismatch: computed ", Hex32(crc), ", the directory says ",
                     Hex32(member.crc));
    }
    TESSERA_RETURN_IF_ERROR(check_header(located.data, "the file has"));
    TESSERA_ASSIGN_OR_RETURN(NpyArray array, ParseNpy(located.data, where));
    return std::make_pair(std::move(key), std::move(array));
  }

  Inflater inflater(located.data, where, stats);
  const uint64_t size = member.size;
  std::vector<uint8_t> payload(std::min<uint64_t>(size, kHeaderReadAhead));
  auto note_buffer = [&] {
    if (stats != nullptr) {
      stats->largest_buffer_bytes = std::max<uint64_t>(stats->largest_buffer_bytes, payload.size());
    }
  };
  note_buffer();
  TESSERA_ASSIGN_OR_RETURN(size_t produced, inflater.Read(absl::MakeSpan(payload), size));
  if (produced < payload.size()) {
    return Invalid(where, "inflates to ", produced, " bytes, but the directory says ", size);
  }
  TESSERA_RETURN_IF_ERROR(
      check_header(absl::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()),
                   "the ZIP directory declares"));
  // The rest, the buffer growing with what inflate really produces (a stream that ends early
  // never gets the whole declared size), never past the declared size.
  while (produced < size && !inflater.ended()) {
    payload.resize(std::min<uint64_t>(size, std::max<uint64_t>(2 * payload.size(), 1 << 20)));
    note_buffer();
    TESSERA_ASSIGN_OR_RETURN(const size_t more,
                             inflater.Read(absl::MakeSpan(payload).subspan(produced), size));
    produced += more;
  }
  if (produced < size) {
    return Invalid(where, "inflates to ", produced, " bytes, but the directory says ", size);
  }
  if (!inflater.ended()) {
    uint8_t extra;
    TESSERA_ASSIGN_OR_RETURN(const size_t beyond, inflater.Read(absl::MakeSpan(&extra, 1), size));
    if (beyond > 0) {
      return Invalid(where, "inflates to more than the ", size,
                     " bytes the directory says; stopped there");
    }
  }
  const uint32_t crc =
      Crc32(0, absl::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()));
  if (crc != member.crc) {
    return Invalid(where, "CRC-32 mismatch: computed ", Hex32(crc), ", the directory says ",
                   Hex32(member.crc));
  }
  TESSERA_ASSIGN_OR_RETURN(NpyArray array, internal::ParseNpyBuffer(std::move(payload), where));
  return std::make_pair(std::move(key), std::move(array));
}

// ---------------------------------------------------------------------------------------------
// Writing.

class StringSink : public internal::ByteSink {
 public:
  explicit StringSink(std::string* out) : out_(out) {}
  absl::Status Append(absl::string_view bytes) override {
    out_->append(bytes.data(), bytes.size());
    return absl::OkStatus();
  }

 private:
  std::string* out_;
};

// Raw-deflates `first` followed by `second`.
absl::StatusOr<std::string> Deflate(absl::string_view first, absl::string_view second) {
  z_stream stream;
  std::memset(&stream, 0, sizeof(stream));
  if (deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) !=
      Z_OK) {
    return absl::InternalError("cannot initialize zlib's deflate");
  }
  std::string out(deflateBound(&stream, static_cast<uLong>(first.size() + second.size())) + 64,
                  '\0');
  size_t produced = 0;
  const absl::string_view inputs[2] = {first, second};
  int result = Z_OK;
  for (int part = 0; part < 2 && result != Z_STREAM_END; ++part) {
    absl::string_view input = inputs[part];
    const bool last_part = part == 1;
    while (true) {
      if (stream.avail_in == 0 && !input.empty()) {
        const size_t chunk = std::min(input.size(), kZlibChunk);
        stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(input.data()));
        stream.avail_in = static_cast<uInt>(chunk);
        input.remove_prefix(chunk);
      }
      if (produced == out.size()) out.resize(2 * out.size());
      const size_t room = std::min(out.size() - produced, kZlibChunk);
      stream.next_out = reinterpret_cast<Bytef*>(&out[produced]);
      stream.avail_out = static_cast<uInt>(room);
      const int flush = last_part && input.empty() ? Z_FINISH : Z_NO_FLUSH;
      result = deflate(&stream, flush);
      produced += room - stream.avail_out;
      if (result == Z_STREAM_END) break;
      if (result != Z_OK && result != Z_BUF_ERROR) {
        deflateEnd(&stream);
        return absl::InternalError(absl::StrCat("zlib deflate failed with ", result));
      }
      if (flush == Z_NO_FLUSH && stream.avail_in == 0 && input.empty()) break;
    }
  }
  deflateEnd(&stream);
  out.resize(produced);
  return out;
}

absl::Status ValidateEntries(const NpzEntries& arrays) {
  std::set<absl::string_view> names;
  for (const auto& [name, array] : arrays) {
    if (name.empty() || name.size() > 0xffff - 4 || name.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid .npz entry name ", Quote(name),
                       ": expected 1 to 65531 bytes without NUL characters"));
    }
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate .npz entry name ", Quote(name)));
    }
    const absl::Status status = array.Validate();
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(".npz entry ", Quote(name), ": ", status.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteNpz(const NpzEntries& arrays, bool compress, bool force_zip64,
                      internal::ByteSink& sink) {
  TESSERA_RETURN_IF_ERROR(ValidateEntries(arrays));
  std::string directory;
  uint64_t offset = 0;
  for (const auto& [key, array] : arrays) {
    const std::string name = key + ".npy";
    const std::string header = internal::NpyHeaderBytes(array);
    const absl::string_view data(reinterpret_cast<const char*>(array.data.data()),
                                 array.data.size());
    const uint32_t crc = Crc32(Crc32(0, header), data);
    const uint64_t size = header.size() + data.size();
    std::string compressed;
    if (compress) {
      TESSERA_ASSIGN_OR_RETURN(compressed, Deflate(header, data));
    }
    const uint64_t compressed_size = compress ? compressed.size() : size;
    const bool zip64_sizes = force_zip64 || size >= kSaturated32 || compressed_size >= kSaturated32;
    const bool zip64_offset = force_zip64 || offset >= kSaturated32;
    const uint16_t version = zip64_sizes || zip64_offset ? kVersionZip64 : kVersionDefault;
    const bool ascii = std::all_of(name.begin(), name.end(),
                                   [](char c) { return static_cast<unsigned char>(c) < 0x80; });
    const uint16_t flags = ascii ? 0 : kFlagUtf8;
    const uint16_t method = compress ? kMethodDeflated : kMethodStored;

    std::string local;
    Put32(&local, kLocalHeaderSignature);
    Put16(&local, version);
    Put16(&local, flags);
    Put16(&local, method);
    Put16(&local, 0);  // Time 00:00:00.
    Put16(&local, kDosDate1980);
    Put32(&local, crc);
    Put32(&local, zip64_sizes ? kSaturated32 : static_cast<uint32_t>(compressed_size));
    Put32(&local, zip64_sizes ? kSaturated32 : static_cast<uint32_t>(size));
    Put16(&local, static_cast<uint16_t>(name.size()));
    Put16(&local, zip64_sizes ? 20 : 0);
    local += name;
    if (zip64_sizes) {
      Put16(&local, kZip64ExtraId);
      Put16(&local, 16);
      Put64(&local, size);
      Put64(&local, compressed_size);
    }
    TESSERA_RETURN_IF_ERROR(sink.Append(local));
    if (compress) {
      TESSERA_RETURN_IF_ERROR(sink.Append(compressed));
    } else {
      TESSERA_RETURN_IF_ERROR(sink.Append(header));
      TESSERA_RETURN_IF_ERROR(sink.Append(data));
    }

    const uint16_t extra_length =
        (zip64_sizes || zip64_offset ? 4 : 0) + (zip64_sizes ? 16 : 0) + (zip64_offset ? 8 : 0);
    Put32(&directory, kCentralHeaderSignature);
    Put16(&directory, kMadeByUnix | version);
    Put16(&directory, version);
    Put16(&directory, flags);
    Put16(&directory, method);
    Put16(&directory, 0);
    Put16(&directory, kDosDate1980);
    Put32(&directory, crc);
    Put32(&directory, zip64_sizes ? kSaturated32 : static_cast<uint32_t>(compressed_size));
    Put32(&directory, zip64_sizes ? kSaturated32 : static_cast<uint32_t>(size));
    Put16(&directory, static_cast<uint16_t>(name.size()));
    Put16(&directory, extra_length);
    Put16(&directory, 0);  // Comment length.
    Put16(&directory, 0);  // Disk.
    Put16(&directory, 0);  // Internal attributes.
    Put32(&directory, kRegularFileAttributes);
    Put32(&directory, zip64_offset ? kSaturated32 : static_cast<uint32_t>(offset));
    directory += name;
    if (extra_length > 0) {
      Put16(&directory, kZip64ExtraId);
      Put16(&directory, extra_length - 4);
      if (zip64_sizes) {
        Put64(&directory, size);
        Put64(&directory, compressed_size);
      }
      if (zip64_offset) Put64(&directory, offset);
    }
    offset += local.size() + compressed_size;
  }

  const uint64_t count = arrays.size();
  const uint64_t directory_offset = offset;
  const uint64_t directory_size = directory.size();
  const bool zip64_end = force_zip64 || count >= kSaturated16 || directory_offset >= kSaturated32 ||
                         directory_size >= kSaturated32;
  std::string end = std::move(directory);
  if (zip64_end) {
    const uint64_t record = directory_offset + directory_size;
    Put32(&end, kZip64EndSignature);
    Put64(&end, kZip64EndSize - 12);  // The record's size after this field.
    Put16(&end, kMadeByUnix | kVersionZip64);
    Put16(&end, kVersionZip64);
    Put32(&end, 0);  // This disk.
    Put32(&end, 0);  // The directory's disk.
    Put64(&end, count);
    Put64(&end, count);
    Put64(&end, directory_size);
    Put64(&end, directory_offset);
    Put32(&end, kZip64LocatorSignature);
    Put32(&end, 0);  // The record's disk.
    Put64(&end, record);
    Put32(&end, 1);  // Disks in all.
  }
  const uint16_t count16 = zip64_end ? kSaturated16 : static_cast<uint16_t>(count);
  Put32(&end, kEndSignature);
  Put16(&end, 0);
  Put16(&end, 0);
  Put16(&end, count16);
  Put16(&end, count16);
  Put32(&end, zip64_end ? kSaturated32 : static_cast<uint32_t>(directory_size));
  Put32(&end, zip64_end ? kSaturated32 : static_cast<uint32_t>(directory_offset));
  Put16(&end, 0);  // Comment length.
  return sink.Append(end);
}

}  // namespace

absl::StatusOr<NpzEntries> ParseNpz(absl::string_view bytes, absl::string_view source,
                                    const NpzLimits& limits) {
  return internal::ParseNpzForTesting(bytes, source, limits, nullptr);
}

absl::StatusOr<std::string> SerializeNpz(const NpzEntries& arrays, bool compress) {
  return internal::SerializeNpzForTesting(arrays, compress, /*force_zip64=*/false);
}

absl::StatusOr<NpzEntries> ReadNpzFile(const std::string& path, const NpzLimits& limits) {
  TESSERA_ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes, internal::ReadFileBytes(path));
  return ParseNpz(absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                  absl::StrCat("'", path, "'"), limits);
}

absl::Status WriteNpzFile(const std::string& path, const NpzEntries& arrays, bool compress) {
  TESSERA_RETURN_IF_ERROR(ValidateEntries(arrays));
  return internal::WriteFileWith(path, [&](internal::ByteSink& sink) {
    return WriteNpz(arrays, compress, /*force_zip64=*/false, sink);
  });
}

namespace internal {

absl::StatusOr<NpzEntries> ParseNpzForTesting(absl::string_view bytes, absl::string_view source,
                                              const NpzLimits& limits, NpzReadStats* stats) {
  TESSERA_ASSIGN_OR_RETURN(const CentralDirectory directory, FindCentralDirectory(bytes, source));
  TESSERA_ASSIGN_OR_RETURN(const std::vector<Member> members,
                           ReadCentralDirectory(bytes, directory, source));
  std::set<absl::string_view> names;
  for (const Member& member : members) {
    if (!names.insert(member.name).second) {
      return Invalid(source, "member ", Quote(member.name), " appears more than once");
    }
  }
  // Every member's declared sizes, checked before anything is inflated or copied.
  std::vector<LocatedMember> located;
  located.reserve(members.size());
  uint64_t total = 0;
  for (const Member& member : members) {
    TESSERA_ASSIGN_OR_RETURN(LocatedMember entry, LocateMember(bytes, member, source));
    located.push_back(std::move(entry));
    if (__builtin_add_overflow(total, member.size, &total) || total > limits.max_total_bytes) {
      return Invalid(source, "its members declare more than the limit of ", limits.max_total_bytes,
                     " bytes in all", Hint(limits.total_limit_hint), " (", members.size(),
                     " members; the limit is passed at member ", Quote(member.name), " of ",
                     member.size, " bytes)");
    }
  }
  NpzEntries entries;
  entries.reserve(members.size());
  for (const LocatedMember& member : located) {
    TESSERA_ASSIGN_OR_RETURN(auto entry, ReadMember(member, limits, stats));
    entries.push_back(std::move(entry));
  }
  return entries;
}

absl::StatusOr<std::string> SerializeNpzForTesting(const NpzEntries& arrays, bool compress,
                                                   bool force_zip64) {
  std::string out;
  StringSink sink(&out);
  TESSERA_RETURN_IF_ERROR(WriteNpz(arrays, compress, force_zip64, sink));
  return out;
}

}  // namespace internal
}  // namespace tessera
