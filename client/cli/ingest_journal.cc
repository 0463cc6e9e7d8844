// The ingest resume journal and the document content hash.
#include "client/cli/ingest_journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <variant>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tessera/base/errno_status.h"

namespace tessera::client {

namespace {

constexpr absl::string_view kHeaderPrefix = "# tessera-ingest journal v1 collection=";

absl::Status WriteAll(int fd, absl::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot write the ingest journal", path);
    }
    bytes.remove_prefix(static_cast<size_t>(written));
  }
  return absl::OkStatus();
}

absl::Status Sync(int fd, const std::string& path) {
  if (::fsync(fd) != 0) return ErrnoStatus(errno, "cannot fsync the ingest journal", path);
  return absl::OkStatus();
}

// Makes the journal's directory entry durable after creating it.
void SyncParentDirectory(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) parent = ".";
  const int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

uint64_t Load64(const char* p) {
  uint64_t value;
  std::memcpy(&value, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  value = __builtin_bswap64(value);
#endif
  return value;
}

void AppendField(std::string* out, absl::string_view bytes) {
  absl::StrAppend(out, bytes.size(), ":");
  out->append(bytes.data(), bytes.size());
  out->push_back(';');
}

std::string HashHex(uint64_t hash) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i) {
    out[i] = kHex[hash & 0xf];
    hash >>= 4;
  }
  return out;
}

}  // namespace

uint64_t Hash64(absl::string_view bytes, uint64_t seed) {
  constexpr uint64_t kM = 0xc6a4a7935bd1e995ULL;
  constexpr int kR = 47;
  const size_t len = bytes.size();
  uint64_t h = seed ^ (len * kM);
  const char* data = bytes.data();
  const char* end = data + (len / 8) * 8;
  for (; data != end; data += 8) {
    uint64_t k = Load64(data);
    k *= kM;
    k ^= k >> kR;
    k *= kM;
    h ^= k;
    h *= kM;
  }
  const unsigned char* tail = reinterpret_cast<const unsigned char*>(data);
  switch (len & 7) {
    case 7:
      h ^= uint64_t{tail[6]} << 48;
      [[fallthrough]];
    case 6:
      h ^= uint64_t{tail[5]} << 40;
      [[fallthrough]];
    case 5:
      h ^= uint64_t{tail[4]} << 32;
      [[fallthrough]];
    case 4:
      h ^= uint64_t{tail[3]} << 24;
      [[fallthrough]];
    case 3:
      h ^= uint64_t{tail[2]} << 16;
      [[fallthrough]];
    case 2:
      h ^= uint64_t{tail[1]} << 8;
      [[fallthrough]];
    case 1:
      h ^= uint64_t{tail[0]};
      h *= kM;
  }
  h ^= h >> kR;
  h *= kM;
  h ^= h >> kR;
  return h;
}

uint64_t DocumentContentHash(absl::string_view dtype_name, absl::Span<const int64_t> shape,
                             absl::string_view raw_bytes, const std::optional<PatchLayout>& layout,
                             const Attributes& attributes,
                             const std::optional<SparseVector>& sparse) {
  // A canonical, unambiguous (length-prefixed) description of everything but the token bytes,
  // which are hashed on their own so that they are not copied.
  std::string description = "tessera-document-v1;";
  AppendField(&description, dtype_name);
  for (int64_t dim : shape) absl::StrAppend(&description, dim, "x");
  absl::StrAppend(&description, ";data=", HashHex(Hash64(raw_bytes, 0x7e55e7a)), ";");
  if (layout.has_value()) {
    absl::StrAppend(&description, "layout=", layout->rows, ",", layout->cols, ",",
                    layout->prefix_tokens, ",", layout->suffix_tokens, ";");
  } else {
    description.append("nolayout;");
  }
  for (const auto& [name, value] : attributes) {  // std::map: sorted by name
    AppendField(&description, name);
    if (const auto* i = std::get_if<int64_t>(&value)) {
      absl::StrAppend(&description, "i", *i, ";");
    } else if (const auto* d = std::get_if<double>(&value)) {
      uint64_t bits;
      std::memcpy(&bits, d, sizeof(bits));
      absl::StrAppend(&description, "d", HashHex(bits), ";");
    } else {
      description.append("s");
      AppendField(&description, std::get<std::string>(value));
    }
  }
  if (sparse.has_value()) {
    description.append("sparse=");
    for (size_t i = 0; i < sparse->indices.size() && i < sparse->values.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &sparse->values[i], sizeof(bits));
      absl::StrAppend(&description, sparse->indices[i], ":", bits, ",");
    }
    absl::StrAppend(&description, sparse->indices.size(), "/", sparse->values.size(), ";");
  }
  return Hash64(description, 0x10c4a1);
}

std::string EscapeJournalId(absl::string_view id) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(id.size());
  for (char c : id) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f || c == '%') {
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xf]);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<std::string> UnescapeJournalId(absl::string_view escaped) {
  std::string out;
  out.reserve(escaped.size());
  for (size_t i = 0; i < escaped.size(); ++i) {
    if (escaped[i] != '%') {
      out.push_back(escaped[i]);
      continue;
    }
    int value = 0;
    for (size_t j = 1; j <= 2; ++j) {
      const char c = i + j < escaped.size() ? escaped[i + j] : '\0';
      value <<= 4;
      if (c >= '0' && c <= '9') {
        value |= c - '0';
      } else if (c >= 'A' && c <= 'F') {
        value |= c - 'A' + 10;
      } else if (c >= 'a' && c <= 'f') {
        value |= c - 'a' + 10;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("bad percent escape in journal id '", escaped, "'"));
      }
    }
    out.push_back(static_cast<char>(value));
    i += 2;
  }
  return out;
}

IngestJournal::IngestJournal(std::string path, std::string collection, int fd)
    : path_(std::move(path)), collection_(std::move(collection)), fd_(fd) {}

IngestJournal::~IngestJournal() {
  MutexLock lock(&mu_);
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::unique_ptr<IngestJournal>> IngestJournal::Open(const std::string& path,
                                                                   const std::string& collection,
                                                                   bool reset) {
  const bool existed = ::access(path.c_str(), F_OK) == 0;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "cannot open the ingest journal", path);
  std::unique_ptr<IngestJournal> journal(new IngestJournal(path, collection, fd));
  MutexLock lock(&journal->mu_);
  if (!existed) SyncParentDirectory(path);

  std::string contents;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read the ingest journal", path);
    }
    if (n == 0) break;
    contents.append(buffer, static_cast<size_t>(n));
  }
  // Drop a torn last line, and a file that never got its whole header.
  const size_t complete = contents.rfind('\n') == std::string::npos ? 0 : contents.rfind('\n') + 1;
  contents.resize(complete);
  if (reset || contents.empty()) {
    absl::Status status = journal->ResetLocked();
    if (!status.ok()) return status;
    return journal;
  }

  std::vector<absl::string_view> lines = absl::StrSplit(contents, '\n', absl::SkipEmpty());
  const std::string expected_header = absl::StrCat(kHeaderPrefix, EscapeJournalId(collection));
  if (lines.empty() || !absl::StartsWith(lines[0], kHeaderPrefix)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not a tessera ingest journal (its first line is not '",
                     kHeaderPrefix, "…'); remove it, or pass --journal with another path"));
  }
  if (lines[0] != expected_header) {
    absl::StatusOr<std::string> other = UnescapeJournalId(lines[0].substr(kHeaderPrefix.size()));
    return absl::FailedPreconditionError(absl::StrCat(
        "the ingest journal '", path, "' records an ingest into collection '",
        other.ok() ? *other : std::string(lines[0].substr(kHeaderPrefix.size())), "', not '",
        collection, "': pass --journal PATH to keep a separate one, or --no-resume to start over"));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    const size_t space = line.find(' ');
    uint64_t hash = 0;
    absl::StatusOr<std::string> id = absl::InvalidArgumentError("");
    if (space != absl::string_view::npos && line.size() - space - 1 == 16 &&
        absl::SimpleHexAtoi(line.substr(space + 1), &hash)) {
      id = UnescapeJournalId(line.substr(0, space));
    }
    if (!id.ok() || id->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the ingest journal '", path, "' line ", i + 1,
                       " is not 'ID HASH': remove the file or pass --no-resume to start over"));
    }
    auto [it, inserted] = journal->entries_.insert_or_assign(*std::move(id), hash);
    if (inserted) journal->order_.push_back(it->first);
  }
  // Appends go to the end; cut a torn tail off first so that they start on a new line.
  if (::ftruncate(fd, static_cast<off_t>(complete)) != 0) {
    return ErrnoStatus(errno, "cannot truncate the ingest journal", path);
  }
  if (::lseek(fd, 0, SEEK_END) < 0) return ErrnoStatus(errno, "cannot seek in", path);
  return journal;
}

absl::Status IngestJournal::ResetLocked() {
  entries_.clear();
  order_.clear();
  if (::ftruncate(fd_, 0) != 0)
    return ErrnoStatus(errno, "cannot truncate the ingest journal", path_);
  if (::lseek(fd_, 0, SEEK_SET) < 0) return ErrnoStatus(errno, "cannot seek in", path_);
  absl::Status status =
      WriteAll(fd_, absl::StrCat(kHeaderPrefix, EscapeJournalId(collection_), "\n"), path_);
  if (!status.ok()) return status;
  return Sync(fd_, path_);
}

absl::Status IngestJournal::Reset() {
  MutexLock lock(&mu_);
  return ResetLocked();
}

bool IngestJournal::Contains(const std::string& id, uint64_t hash) const {
  MutexLock lock(&mu_);
  auto it = entries_.find(id);
  return it != entries_.end() && it->second == hash;
}

size_t IngestJournal::size() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

std::vector<std::string> IngestJournal::SampleIds(size_t count) const {
  MutexLock lock(&mu_);
  std::vector<std::string> sample;
  if (order_.empty() || count == 0) return sample;
  if (count >= order_.size()) return order_;
  for (size_t i = 0; i < count; ++i) {
    const size_t index = count == 1 ? order_.size() - 1 : i * (order_.size() - 1) / (count - 1);
    sample.push_back(order_[index]);
  }
  return sample;
}

absl::Status IngestJournal::Append(absl::Span<const std::pair<std::string, uint64_t>> entries) {
  if (entries.empty()) return absl::OkStatus();
  std::string lines;
  for (const auto& [id, hash] : entries) {
    absl::StrAppend(&lines, EscapeJournalId(id), " ", HashHex(hash), "\n");
  }
  MutexLock lock(&mu_);
  absl::Status status = WriteAll(fd_, lines, path_);
  if (!status.ok()) return status;
  status = Sync(fd_, path_);
  if (!status.ok()) return status;
  for (const auto& [id, hash] : entries) {
    auto [it, inserted] = entries_.insert_or_assign(id, hash);
    if (inserted) order_.push_back(it->first);
  }
  return absl::OkStatus();
}

}  // namespace tessera::client
