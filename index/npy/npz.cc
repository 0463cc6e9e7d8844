// The .npz reader and writer on libzip: libzip parses and writes the ZIP structure (central
// directory, local headers, ZIP64, deflate, CRC-32); this file adds what an .npz needs on top. The
// reader opens archives with ZIP_CHECKCONS (every local header must agree with the central
// directory and lie before it), checks every member's declared sizes against the caller's limits
// before anything is inflated, parses each .npy header from the first bytes read, and reads a
// member into a buffer of its declared size, one byte more telling whether the stream would go on.
#include "tessera/npz.h"

#include <zip.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tessera/base/errno_status.h"
#include "tessera/status_macros.h"

namespace tessera {
namespace {

// The end-of-central-directory record of an archive without members: what numpy.savez writes for
// no arrays, and what libzip does not (it removes an archive that would be empty).
constexpr absl::string_view kEmptyArchive("PK\x05\x06\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 22);
// Deflate cannot expand data more than 1032-fold; a member claiming more is corrupt.
constexpr uint64_t kMaxInflateRatio = 1032;
// How much of a member is read first, for its .npy header: NumPy's headers are at most a few KiB
// (it refuses to read more than 10,000 bytes by default).
constexpr uint64_t kHeaderReadAhead = uint64_t{1} << 20;
// zlib's default level, as numpy.savez_compressed (libzip's default is 9).
constexpr zip_uint32_t kDeflateLevel = 6;
constexpr zip_uint16_t kDosDate1980 = (0 << 9) | (1 << 5) | 1;  // 1980-01-01: reproducible output.
constexpr zip_uint32_t kRegularFileAttributes = 0100644u << 16;

struct ZipDiscard {
  void operator()(zip_t* archive) const { zip_discard(archive); }
};
using ZipPtr = std::unique_ptr<zip_t, ZipDiscard>;
struct ZipFileClose {
  void operator()(zip_file_t* file) const { zip_fclose(file); }
};
using ZipFilePtr = std::unique_ptr<zip_file_t, ZipFileClose>;
struct ZipSourceFree {
  void operator()(zip_source_t* source) const { zip_source_free(source); }
};
using ZipSourcePtr = std::unique_ptr<zip_source_t, ZipSourceFree>;

// Owns a zip_error_t.
class ZipError {
 public:
  ZipError() { zip_error_init(&error_); }
  ~ZipError() { zip_error_fini(&error_); }
  ZipError(const ZipError&) = delete;
  ZipError& operator=(const ZipError&) = delete;
  zip_error_t* get() { return &error_; }
  int code() const { return zip_error_code_zip(&error_); }

 private:
  zip_error_t error_;
};

std::string Quote(absl::string_view name) { return internal::QuoteForMessage(name); }

std::string Hint(const std::string& hint) {
  return hint.empty() ? "" : absl::StrCat(" (", hint, ")");
}

std::string Hex32(uint32_t value) { return absl::StrCat("0x", absl::Hex(value, absl::kZeroPad8)); }

template <typename... Args>
absl::Status Invalid(absl::string_view where, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", args...));
}

// libzip's description of `error`, which it formats (with strerror for system errors).
std::string Describe(zip_error_t* error) { return zip_error_strerror(error); }

absl::string_view MethodName(int32_t method) {
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

// What the central directory says about one member; `name` is the raw bytes of its name.
struct Member {
  zip_uint64_t index = 0;
  std::string name;
  std::string where;  // "SOURCE member 'NAME'" for messages
  zip_stat_t stat;
};

// The status for an archive libzip could not open. A duplicate name (ZIP_ER_EXISTS, found while
// ZIP_CHECKCONS builds its name table) is named by opening the directory again without the check.
absl::Status OpenError(int code, zip_error_t* error, absl::string_view source,
                       const std::string& path,
                       const std::function<zip_t*(int, zip_error_t*)>& open) {
  if (!path.empty() && zip_error_system_type(error) == ZIP_ET_SYS &&
      zip_error_code_system(error) != 0) {
    return ErrnoStatus(zip_error_code_system(error), "cannot read", path);
  }
  switch (code) {
    case ZIP_ER_NOZIP:
      return Invalid(source, "not a ZIP archive, or its central directory is damaged (libzip: ",
                     Describe(error), ")");
    case ZIP_ER_MULTIDISK:
      return Invalid(source, "multi-disk (split) ZIP archives are not supported");
    case ZIP_ER_EXISTS: {
      ZipError again;
      const ZipPtr archive(open(ZIP_RDONLY, again.get()));
      if (archive != nullptr) {
        std::set<std::string> names;
        const zip_int64_t count = zip_get_num_entries(archive.get(), 0);
        for (zip_int64_t i = 0; i < count; ++i) {
          const char* name = zip_get_name(archive.get(), i, ZIP_FL_ENC_RAW);
          if (name != nullptr && !names.insert(name).second) {
            return Invalid(source, "member ", Quote(name), " appears more than once");
          }
        }
      }
      return Invalid(source, "a member name appears more than once");
    }
    case ZIP_ER_NOENT:  // libzip's answer for some damage to a central directory entry.
      return Invalid(source, "damaged ZIP archive: libzip cannot read its central directory");
    default:
      return Invalid(source, "damaged or unsupported ZIP archive (libzip: ", Describe(error), ")");
  }
}

// The members' directory entries, checked before anything is read: names, methods, encryption,
// and declared sizes against each other and against `limits`.
absl::StatusOr<std::vector<Member>> ReadDirectory(zip_t* archive, absl::string_view source,
                                                  const NpzLimits& limits) {
  const zip_int64_t count = zip_get_num_entries(archive, 0);
  std::vector<Member> members(static_cast<size_t>(std::max<zip_int64_t>(count, 0)));
  std::set<absl::string_view> names;
  uint64_t total = 0;
  for (zip_uint64_t i = 0; i < members.size(); ++i) {
    Member& member = members[i];
    member.index = i;
    zip_stat_init(&member.stat);
    if (zip_stat_index(archive, i, ZIP_FL_ENC_RAW, &member.stat) != 0) {
      return Invalid(source, "central directory entry ", i, ": ", Describe(zip_get_error(archive)));
    }
    const zip_stat_t& stat = member.stat;
    member.name = stat.name != nullptr ? stat.name : "";
    member.where = absl::StrCat(source, " member ", Quote(member.name));
    const std::string& where = member.where;
    if (!names.insert(member.name).second) {
      return Invalid(source, "member ", Quote(member.name), " appears more than once");
    }
    if (stat.encryption_method != ZIP_EM_NONE) {
      return Invalid(where, "is encrypted; encrypted archives are not supported");
    }
    if (stat.comp_method != ZIP_CM_STORE && stat.comp_method != ZIP_CM_DEFLATE) {
      return Invalid(where, "uses compression method ", stat.comp_method,
                     MethodName(stat.comp_method),
                     "; expected 0 (stored, numpy.savez) or 8 (deflated, numpy.savez_compressed)");
    }
    if (member.name.size() <= 4 || !absl::EndsWith(member.name, ".npy")) {
      return Invalid(where, "is not a .npy file; an .npz holds only NAME.npy members");
    }
    if (stat.comp_method == ZIP_CM_STORE && stat.comp_size != stat.size) {
      return Invalid(where, "is stored but its compressed size ", stat.comp_size,
                     " differs from its size ", stat.size);
    }
    if (stat.comp_method == ZIP_CM_DEFLATE && stat.size / kMaxInflateRatio > stat.comp_size) {
      return Invalid(where, "claims ", stat.size, " bytes from ", stat.comp_size,
                     " deflated bytes, more than deflate can produce");
    }
    if (__builtin_add_overflow(total, stat.size, &total) || total > limits.max_total_bytes) {
      return Invalid(source, "its members declare more than the limit of ", limits.max_total_bytes,
                     " bytes in all", Hint(limits.total_limit_hint), " (", members.size(),
                     " members; the limit is passed at member ", Quote(member.name), " of ",
                     stat.size, " bytes)");
    }
  }
  return members;
}

absl::Status CrcMismatch(const Member& member) {
  return Invalid(member.where, "CRC-32 mismatch: the data does not have the CRC-32 ",
                 Hex32(member.stat.crc), " the directory says");
}

// Reads up to out.size() bytes of `file` into `out`, fewer only where the member ends. A failed
// read is INVALID_ARGUMENT: libzip reports a CRC-32 that does not match at the member's end, and
// a stream that ends before or after the declared size as inconsistent.
absl::StatusOr<size_t> ReadSome(zip_file_t* file, absl::Span<uint8_t> out, const Member& member,
                                uint64_t produced_before) {
  size_t read = 0;
  while (read < out.size()) {
    const zip_int64_t got = zip_fread(file, out.data() + read, out.size() - read);
    if (got == 0) break;
    if (got < 0) {
      zip_error_t* error = zip_file_get_error(file);
      const int code = zip_error_code_zip(error);
      if ((code == ZIP_ER_CRC || code == ZIP_ER_INCONS) &&
          produced_before + read < member.stat.size) {
        // libzip checks at the member's end: the stream ended before the declared size.
        return Invalid(member.where, "inflates to ", produced_before + read,
                       " bytes, but the directory says ", member.stat.size);
      }
      switch (code) {
        case ZIP_ER_CRC:
          return CrcMismatch(member);
        case ZIP_ER_INCONS:
          return Invalid(member.where, "inflates to ", produced_before + read,
                         " bytes, but the directory says ", member.stat.size);
        default:
          return Invalid(member.where, "corrupt data after ", produced_before + read, " of ",
                         member.stat.size, " bytes (libzip: ", Describe(error), ")");
      }
    }
    read += static_cast<size_t>(got);
  }
  return read;
}

// Reads one member. Its .npy header is parsed first, from the first bytes read, and the shape ×
// dtype it declares must account for exactly the member's declared size and fit `limits` before
// the rest is read; the buffer never grows past the declared size, and a stream that would
// inflate further is refused.
absl::StatusOr<std::pair<std::string, NpyArray>> ReadMember(zip_t* archive, const Member& member,
                                                            const NpzLimits& limits,
                                                            internal::NpzReadStats* stats) {
  const std::string& where = member.where;
  const uint64_t size = member.stat.size;
  const bool deflated = member.stat.comp_method == ZIP_CM_DEFLATE;
  const ZipFilePtr file(zip_fopen_index(archive, member.index, 0));
  if (file == nullptr) {
    return Invalid(where, "cannot be opened (libzip: ", Describe(zip_get_error(archive)), ")");
  }
  std::vector<uint8_t> payload(std::min<uint64_t>(size, kHeaderReadAhead));
  uint64_t produced = 0;
  auto read = [&](absl::Span<uint8_t> out) -> absl::StatusOr<size_t> {
    TESSERA_ASSIGN_OR_RETURN(const size_t got, ReadSome(file.get(), out, member, produced));
    produced += got;
    if (stats != nullptr && deflated) {
      stats->inflated_bytes += got;
      stats->largest_buffer_bytes = std::max<uint64_t>(stats->largest_buffer_bytes, payload.size());
    }
    return got;
  };
  TESSERA_RETURN_IF_ERROR(read(absl::MakeSpan(payload)).status());
  if (produced < payload.size()) {
    return Invalid(where, "inflates to ", produced, " bytes, but the directory says ", size);
  }
  absl::StatusOr<internal::NpyHeaderInfo> parsed_header = internal::ParseNpyHeader(
      absl::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()), size, where,
      deflated ? "the ZIP directory declares" : "the file has");
  if (!parsed_header.ok() && !deflated) {
    // A damaged header is more often damaged data: read a stored member on (through a small
    // buffer; it holds no more than the archive does) to its end, where libzip checks the CRC-32,
    // and report that. A deflated member is not inflated past a header that is refused.
    std::vector<uint8_t> scratch(std::min<uint64_t>(size - produced + 1, 1 << 16));
    while (true) {
      const absl::StatusOr<size_t> got = read(absl::MakeSpan(scratch));
      if (!got.ok() && got.status() == CrcMismatch(member)) return got.status();
      if (!got.ok() || *got == 0 || produced > size) break;
    }
  }
  if (!parsed_header.ok()) return parsed_header.status();
  const internal::NpyHeaderInfo& header = *parsed_header;
  if (header.data_size > limits.max_array_bytes) {
    return Invalid(where, "its array of ", NpyDtypeName(header.dtype), " ",
                   internal::ShapeStringForMessage(header.shape), " holds ", header.data_size,
                   " bytes, more than the limit of ", limits.max_array_bytes, " bytes per array",
                   Hint(limits.array_limit_hint));
  }
  // The rest, the buffer growing with what is really read (a stream that ends early never gets
  // the whole declared size), never past the declared size.
  while (produced < size) {
    payload.resize(std::min<uint64_t>(size, std::max<uint64_t>(2 * payload.size(), 1 << 20)));
    TESSERA_ASSIGN_OR_RETURN(const size_t got, read(absl::MakeSpan(payload).subspan(produced)));
    if (got == 0) break;
  }
  if (produced < size) {
    return Invalid(where, "inflates to ", produced, " bytes, but the directory says ", size);
  }
  // One byte more: libzip checks the CRC-32 and the size when the member ends, and a stream that
  // goes on is refused here.
  uint8_t extra;
  TESSERA_ASSIGN_OR_RETURN(const size_t beyond, read(absl::MakeSpan(&extra, 1)));
  if (beyond > 0) {
    return Invalid(where, "inflates to more than the ", size,
                   " bytes the directory says; stopped there");
  }
  TESSERA_ASSIGN_OR_RETURN(NpyArray array, internal::ParseNpyBuffer(std::move(payload), where));
  return std::make_pair(member.name.substr(0, member.name.size() - 4), std::move(array));
}

// Opens the archive in `source` (null: creating the source failed, `error` says why); the archive
// takes the source over.
zip_t* OpenSource(zip_source_t* source, int flags, zip_error_t* error) {
  if (source == nullptr) return nullptr;
  zip_t* archive = zip_open_from_source(source, flags, error);
  if (archive == nullptr) zip_source_free(source);
  return archive;
}

// Reads the archive that `open` opens (with the flags and error it is given): the file at `path`,
// or a buffer (`path` empty).
absl::StatusOr<NpzEntries> ReadArchive(const std::function<zip_t*(int, zip_error_t*)>& open,
                                       absl::string_view source, const std::string& path,
                                       const NpzLimits& limits, internal::NpzReadStats* stats) {
  ZipError error;
  const ZipPtr archive(open(ZIP_RDONLY | ZIP_CHECKCONS, error.get()));
  if (archive == nullptr) return OpenError(error.code(), error.get(), source, path, open);
  TESSERA_ASSIGN_OR_RETURN(const std::vector<Member> members,
                           ReadDirectory(archive.get(), source, limits));
  NpzEntries entries;
  entries.reserve(members.size());
  for (const Member& member : members) {
    TESSERA_ASSIGN_OR_RETURN(auto entry, ReadMember(archive.get(), member, limits, stats));
    entries.push_back(std::move(entry));
  }
  return entries;
}

absl::Status NotAZipArchive(absl::string_view source, uint64_t size) {
  return Invalid(source, "not a ZIP archive: ", size,
                 " bytes, fewer than the 22 of an end-of-central-directory record");
}

// ---------------------------------------------------------------------------------------------
// Writing.

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

// Adds `arrays` to `archive` as members NAME.npy, each read at zip_close from its .npy header (in
// `headers`, which must outlive the close) and the array's own bytes, uncopied.
absl::Status AddMembers(zip_t* archive, const NpzEntries& arrays, bool compress,
                        std::vector<std::string>* headers) {
  headers->reserve(arrays.size());
  for (const auto& [key, array] : arrays) {
    headers->push_back(internal::NpyHeaderBytes(array));
    const std::string& header = headers->back();
    const zip_buffer_fragment_t fragments[2] = {
        {reinterpret_cast<zip_uint8_t*>(const_cast<char*>(header.data())), header.size()},
        {const_cast<zip_uint8_t*>(array.data.data()), array.data.size()}};
    zip_source_t* source =
        zip_source_buffer_fragment(archive, fragments, array.data.empty() ? 1 : 2, 0);
    if (source == nullptr) {
      return absl::InternalError(absl::StrCat("libzip: ", Describe(zip_get_error(archive))));
    }
    const std::string name = key + ".npy";
    const zip_int64_t index = zip_file_add(archive, name.c_str(), source, ZIP_FL_ENC_GUESS);
    if (index < 0) {
      zip_source_free(source);
      return absl::InternalError(absl::StrCat("libzip cannot add .npz member ", Quote(name), ": ",
                                              Describe(zip_get_error(archive))));
    }
    const zip_uint64_t i = static_cast<zip_uint64_t>(index);
    if (zip_set_file_compression(archive, i, compress ? ZIP_CM_DEFLATE : ZIP_CM_STORE,
                                 compress ? kDeflateLevel : 0) != 0 ||
        zip_file_set_dostime(archive, i, 0, kDosDate1980, 0) != 0 ||
        zip_file_set_external_attributes(archive, i, 0, ZIP_OPSYS_UNIX, kRegularFileAttributes) !=
            0) {
      return absl::InternalError(absl::StrCat("libzip cannot set up .npz member ", Quote(name),
                                              ": ", Describe(zip_get_error(archive))));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<NpzEntries> ParseNpz(absl::string_view bytes, absl::string_view source,
                                    const NpzLimits& limits) {
  return internal::ParseNpzForTesting(bytes, source, limits, nullptr);
}

absl::StatusOr<std::string> SerializeNpz(const NpzEntries& arrays, bool compress) {
  TESSERA_RETURN_IF_ERROR(ValidateEntries(arrays));
  if (arrays.empty()) return std::string(kEmptyArchive);
  ZipError error;
  const ZipSourcePtr buffer(zip_source_buffer_create(nullptr, 0, 0, error.get()));
  if (buffer == nullptr)
    return absl::InternalError(absl::StrCat("libzip: ", Describe(error.get())));
  ZipPtr archive(zip_open_from_source(buffer.get(), ZIP_TRUNCATE, error.get()));
  if (archive == nullptr) {
    return absl::InternalError(absl::StrCat("libzip: ", Describe(error.get())));
  }
  zip_source_keep(buffer.get());  // The archive's reference; ours stays for reading it back.
  std::vector<std::string> headers;
  TESSERA_RETURN_IF_ERROR(AddMembers(archive.get(), arrays, compress, &headers));
  if (zip_close(archive.get()) != 0) {
    return absl::InternalError(
        absl::StrCat("libzip cannot write the .npz: ", Describe(zip_get_error(archive.get()))));
  }
  (void)archive.release();  // zip_close freed it.

  zip_stat_t stat;
  zip_stat_init(&stat);
  if (zip_source_stat(buffer.get(), &stat) != 0 || zip_source_open(buffer.get()) != 0) {
    return absl::InternalError(absl::StrCat("libzip: ", Describe(zip_source_error(buffer.get()))));
  }
  std::string out(stat.size, '\0');
  const zip_int64_t got = zip_source_read(buffer.get(), out.data(), out.size());
  zip_source_close(buffer.get());
  if (got != static_cast<zip_int64_t>(out.size())) {
    return absl::InternalError(
        absl::StrCat("libzip returned ", got, " of the archive's ", out.size(), " bytes"));
  }
  return out;
}

absl::StatusOr<NpzEntries> ReadNpzFile(const std::string& path, const NpzLimits& limits) {
  const std::string source = absl::StrCat("'", path, "'");
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (error) return ErrnoStatus(error.value(), "cannot open", path);
  if (std::filesystem::is_directory(status)) return ErrnoStatus(EISDIR, "cannot read", path);
  const uintmax_t size = std::filesystem::file_size(path, error);
  // libzip takes an empty file for an empty archive; NumPy does not.
  if (!error && size < kEmptyArchive.size()) return NotAZipArchive(source, size);
  return ReadArchive(
      [&path](int flags, zip_error_t* error) {
        return OpenSource(zip_source_file_create(path.c_str(), 0, -1, error), flags, error);
      },
      source, path, limits, nullptr);
}

absl::Status WriteNpzFile(const std::string& path, const NpzEntries& arrays, bool compress) {
  TESSERA_RETURN_IF_ERROR(ValidateEntries(arrays));
  if (arrays.empty()) {
    return internal::WriteFileWith(
        path, [](internal::ByteSink& sink) { return sink.Append(kEmptyArchive); });
  }
  // libzip writes a temporary file beside `path` and renames it over `path` when it closes: a
  // failed write leaves neither behind.
  int code = 0;
  ZipPtr archive(zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &code));
  if (archive == nullptr) {
    ZipError error;
    zip_error_init_with_code(error.get(), code);
    return ErrnoStatus(
        zip_error_code_system(error.get()) != 0 ? zip_error_code_system(error.get()) : EIO,
        "cannot create", path);
  }
  std::vector<std::string> headers;
  TESSERA_RETURN_IF_ERROR(AddMembers(archive.get(), arrays, compress, &headers));
  if (zip_close(archive.get()) != 0) {
    zip_error_t* error = zip_get_error(archive.get());
    const int system =
        zip_error_system_type(error) == ZIP_ET_SYS ? zip_error_code_system(error) : 0;
    if (system != 0) return ErrnoStatus(system, "cannot write", path);
    return absl::InternalError(absl::StrCat("cannot write '", path, "': ", Describe(error)));
  }
  (void)archive.release();  // zip_close freed it.
  return absl::OkStatus();
}

namespace internal {

absl::StatusOr<NpzEntries> ParseNpzForTesting(absl::string_view bytes, absl::string_view source,
                                              const NpzLimits& limits, NpzReadStats* stats) {
  if (bytes.size() < kEmptyArchive.size()) return NotAZipArchive(source, bytes.size());
  return ReadArchive(
      [bytes](int flags, zip_error_t* error) {
        return OpenSource(zip_source_buffer_create(bytes.data(), bytes.size(), 0, error), flags,
                          error);
      },
      source, /*path=*/"", limits, stats);
}

}  // namespace internal
}  // namespace tessera
