// Snapshots (tessera/snapshot.h): taken with Engine::CheckpointCollectionAtCut into a temporary
// directory beside the snapshots, checksummed, described by a manifest and renamed into place;
// streamed as the archive the header documents; restored by verifying every file of an archive
// into the engine's staging directory and adopting the result as a new collection
// (Engine::AdoptCollection), so a failed restore leaves nothing visible.
#include "tessera/snapshot.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "index/common/crc32.h"
#include "index/common/file_io.h"
#include "tessera/base/errno_status.h"
#include "tessera/base/mutex.h"
#include "tessera/document.h"
#include "tessera/status_macros.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

constexpr char kManifestFormatLine[] = "tessera-snapshot 1";
constexpr char kManifestFile[] = "manifest";
constexpr char kDataDirectory[] = "data";

// The engine's rule for collection names (ValidateSchema).
bool IsValidCollectionName(absl::string_view name) {
  if (name.empty() || name.size() > 128 || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

absl::Status CheckCollectionName(absl::string_view field, absl::string_view name) {
  if (IsValidCollectionName(name)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " ", QuotedForMessage(name),
                                                 ", expected 1-128 characters of [A-Za-z0-9_.-]"));
}

// "<collection>@<suffix>" with a valid collection name and a suffix of [A-Za-z0-9-]; the
// collection, or INVALID_ARGUMENT.
absl::StatusOr<std::string> CollectionOfId(absl::string_view id) {
  const size_t at = id.rfind('@');
  const auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot id ", QuotedForMessage(id),
                     ", expected <collection>@<time>-<hex> as CreateSnapshot returns it"));
  };
  if (at == absl::string_view::npos || at + 1 == id.size() || id.size() > 200) return bad();
  const absl::string_view collection = id.substr(0, at);
  const absl::string_view suffix = id.substr(at + 1);
  if (!IsValidCollectionName(collection)) return bad();
  for (char c : suffix) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return bad();
  }
  return std::string(collection);
}

// A path an archive may hold: relative, "/"-separated, without "." or ".." components.
bool IsSafeRelativePath(absl::string_view path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != absl::string_view::npos) {
    return false;
  }
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

void FsyncDirectory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// The size and CRC-32 of a file, read in chunks.
absl::StatusOr<SnapshotFile> ChecksumFile(const fs::path& path, std::string relative) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path.string());
  std::string buffer(size_t{1} << 20, '\0');
  SnapshotFile file;
  file.path = std::move(relative);
  while (true) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus(err, "cannot read", path.string());
    }
    if (n == 0) break;
    file.crc32 =
        internal::Crc32(absl::string_view(buffer.data(), static_cast<size_t>(n)), file.crc32);
    file.size += n;
  }
  ::close(fd);
  return file;
}

std::string NewSnapshotId(const std::string& collection) {
  static std::atomic<uint32_t> counter{0};
  std::random_device random;
  const uint32_t salt = random() ^ (counter.fetch_add(1) * 0x9e3779b9u);
  return absl::StrCat(collection, "@",
                      absl::FormatTime("%Y%m%dT%H%M%SZ", absl::Now(), absl::UTCTimeZone()), "-",
                      absl::StrFormat("%08x", salt));
}

// The archive's files, as SnapshotArchiveReader hands them over, written and synced under the
// engine's staging directory, then adopted as the new collection.
class ArchiveRestore final : public SnapshotRestore, private SnapshotArchiveReader::Handler {
 public:
  ArchiveRestore(Engine* engine, std::string new_name)
      : engine_(engine), new_name_(std::move(new_name)), reader_(this) {
    status_ = CheckCollectionName("new collection name", new_name_);
    if (status_.ok()) status_ = CheckNameFree();
  }

  ~ArchiveRestore() override {
    CloseFile();
    if (!dir_.empty()) {
      std::error_code ignored;
      fs::remove_all(dir_, ignored);
    }
  }

  absl::Status Add(absl::string_view bytes) override {
    if (!status_.ok()) return status_;
    status_ = reader_.Add(bytes);
    return status_;
  }

  absl::StatusOr<SnapshotManifest> Finish() override {
    if (!status_.ok()) return status_;
    status_ = reader_.Finish();
    if (!status_.ok()) return status_;
    status_ = engine_->AdoptCollection(new_name_, dir_);
    if (!status_.ok()) return status_;
    dir_.clear();  // moved into the engine
    return manifest_;
  }

 private:
  absl::Status CheckNameFree() const {
    const absl::Status taken = engine_->GetCollection(new_name_).status();
    if (absl::IsNotFound(taken)) return absl::OkStatus();
    return absl::AlreadyExistsError(
        absl::StrCat("collection ", QuotedForMessage(new_name_), " already exists"));
  }

  absl::StatusOr<std::vector<SnapshotArchiveEntry>> OnManifest(absl::string_view text) override {
    absl::StatusOr<SnapshotManifest> manifest = DecodeSnapshotManifest(text);
    if (!manifest.ok()) {
      return absl::DataLossError(
          absl::StrCat("snapshot archive: manifest: ", manifest.status().message()));
    }
    manifest_ = *std::move(manifest);
    bool has_schema = false;
    std::vector<SnapshotArchiveEntry> entries;
    for (const SnapshotFile& file : manifest_.files) {
      if (!IsSafeRelativePath(file.path) || file.size < 0) {
        return absl::DataLossError(absl::StrCat("snapshot archive: manifest lists file ",
                                                QuotedForMessage(file.path),
                                                ", expected a relative path without '..'"));
      }
      has_schema |= file.path == "schema";
      entries.push_back(SnapshotArchiveEntry{file.path, file.size, file.crc32});
    }
    if (!has_schema) {
      return absl::DataLossError("snapshot archive: the manifest lists no schema file");
    }
    // Checked again by the adoption; here so that a taken name fails before any data moves.
    TESSERA_RETURN_IF_ERROR(CheckNameFree());
    static std::atomic<uint64_t> counter{0};
    dir_ = absl::StrCat(engine_->StagingDirectory(), "/restore.", new_name_, ".",
                        std::chrono::steady_clock::now().time_since_epoch().count(), ".",
                        counter.fetch_add(1));
    std::error_code error;
    fs::create_directories(dir_, error);
    if (error) {
      const std::string failed = dir_;
      dir_.clear();
      return absl::InternalError(absl::StrCat("cannot create ", failed, ": ", error.message()));
    }
    return entries;
  }

  absl::Status OnEntryBegin(size_t index) override {
    const fs::path path = fs::path(dir_) / manifest_.files[index].path;
    std::error_code error;
    fs::create_directories(path.parent_path(), error);
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) return ErrnoStatus(errno, "cannot create", path.string());
    return absl::OkStatus();
  }

  absl::Status OnEntryBytes(size_t index, absl::string_view data) override {
    for (size_t done = 0; done < data.size();) {
      const ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
      if (n < 0) {
        return ErrnoStatus(errno, "cannot write",
                           (fs::path(dir_) / manifest_.files[index].path).string());
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  // The file is complete and matched its CRC-32: durable before the collection opens (RocksDB
  // does not sync files it finds at open).
  absl::Status OnEntryEnd(size_t index) override {
    const int fd = fd_;
    fd_ = -1;
    const int synced = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (synced != 0) return ErrnoStatus(err, "cannot fsync", manifest_.files[index].path);
    return absl::OkStatus();
  }

  void CloseFile() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  Engine* const engine_;
  const std::string new_name_;
  absl::Status status_;
  SnapshotArchiveReader reader_;
  SnapshotManifest manifest_;
  std::string dir_;  // the staging directory the files go to; empty once adopted
  int fd_ = -1;      // the file being written
};

// Reads a local snapshot as the archive: head, then each file's bytes, then the trailer.
class ArchiveReader final : public SnapshotArchive {
 public:
  ArchiveReader(fs::path data, SnapshotManifest manifest, size_t chunk_bytes)
      : data_(std::move(data)),
        manifest_(std::move(manifest)),
        chunk_bytes_(std::max<size_t>(chunk_bytes, 1)) {}
  ~ArchiveReader() override {
    if (fd_ >= 0) ::close(fd_);
  }

  const SnapshotManifest& manifest() const override { return manifest_; }

  absl::StatusOr<std::string> Next() override {
    if (!started_) {
      started_ = true;
      return EncodeSnapshotArchiveHead(EncodeSnapshotManifest(manifest_));
    }
    while (file_ < manifest_.files.size()) {
      const SnapshotFile& file = manifest_.files[file_];
      if (fd_ < 0) {
        const fs::path path = data_ / file.path;
        fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd_ < 0) {
          return absl::DataLossError(absl::StrCat("snapshot ", QuotedForMessage(manifest_.id),
                                                  " file '", file.path,
                                                  "': cannot open: ", std::strerror(errno)));
        }
        sent_ = 0;
      }
      if (sent_ == file.size) {
        ::close(fd_);
        fd_ = -1;
        ++file_;
        continue;
      }
      std::string chunk(static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(chunk_bytes_),
                                                              file.size - sent_)),
                        '\0');
      const ssize_t n = ::read(fd_, chunk.data(), chunk.size());
      if (n < 0) return ErrnoStatus(errno, "cannot read", (data_ / file.path).string());
      if (n == 0) {
        return absl::DataLossError(absl::StrCat("snapshot ", QuotedForMessage(manifest_.id),
                                                " file '", file.path, "': ", sent_,
                                                " bytes, the manifest says ", file.size));
      }
      chunk.resize(static_cast<size_t>(n));
      sent_ += n;
      return chunk;
    }
    if (!ended_) {
      ended_ = true;
      return std::string(SnapshotArchiveEndMarker());
    }
    return std::string();
  }

 private:
  const fs::path data_;
  const SnapshotManifest manifest_;
  const size_t chunk_bytes_;
  bool started_ = false;
  bool ended_ = false;
  size_t file_ = 0;
  int fd_ = -1;
  int64_t sent_ = 0;
};

class SnapshotStoreImpl final : public SnapshotStore {
 public:
  SnapshotStoreImpl(Engine* engine, fs::path dir) : engine_(engine), dir_(std::move(dir)) {}

  absl::StatusOr<SnapshotManifest> Create(const std::string& collection) override {
    TESSERA_RETURN_IF_ERROR(CheckCollectionName("collection", collection));
    TESSERA_RETURN_IF_ERROR(engine_->GetCollection(collection).status());
    SnapshotManifest manifest;
    manifest.id = NewSnapshotId(collection);
    manifest.collection = collection;
    manifest.created_unix_micros = absl::ToUnixMicros(absl::Now());
    const fs::path temporary = dir_ / absl::StrCat(".tmp-", manifest.id);
    // Removed on every failure below.
    struct Cleanup {
      fs::path path;
      ~Cleanup() {
        if (path.empty()) return;
        std::error_code ignored;
        fs::remove_all(path, ignored);
      }
    } cleanup{temporary};
    std::error_code error;
    fs::create_directories(temporary, error);
    if (error) {
      return absl::InternalError(
          absl::StrCat("cannot create ", temporary.string(), ": ", error.message()));
    }
    const fs::path data = temporary / kDataDirectory;
    const absl::Time cut_start = absl::Now();
    TESSERA_ASSIGN_OR_RETURN(manifest.shard_sequences,
                             engine_->CheckpointCollectionAtCut(collection, data.string()));
    manifest.cut_micros = absl::ToInt64Microseconds(absl::Now() - cut_start);
    manifest.num_shards = static_cast<int>(manifest.shard_sequences.size());
    // The cut is taken: writes flow again while the files are checksummed.
    std::vector<fs::path> files;
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(data)) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& path : files) {
      TESSERA_ASSIGN_OR_RETURN(SnapshotFile file,
                               ChecksumFile(path, fs::relative(path, data).generic_string()));
      manifest.files.push_back(std::move(file));
    }
    TESSERA_RETURN_IF_ERROR(internal::WriteFileAtomically((temporary / kManifestFile).string(),
                                                          {EncodeSnapshotManifest(manifest)}));
    const fs::path parent = dir_ / collection;
    fs::create_directories(parent, error);
    fs::rename(temporary, parent / manifest.id, error);
    if (error) {
      return absl::InternalError(absl::StrCat("cannot move ", temporary.string(), " to ",
                                              (parent / manifest.id).string(), ": ",
                                              error.message()));
    }
    cleanup.path.clear();
    FsyncDirectory(parent);
    return manifest;
  }

  absl::StatusOr<std::vector<SnapshotManifest>> List(const std::string& collection) const override {
    TESSERA_RETURN_IF_ERROR(CheckCollectionName("collection", collection));
    std::vector<SnapshotManifest> out;
    std::error_code error;
    const fs::path parent = dir_ / collection;
    if (fs::is_directory(parent, error)) {
      for (const fs::directory_entry& entry : fs::directory_iterator(parent, error)) {
        absl::StatusOr<SnapshotManifest> manifest = ReadManifest(entry.path());
        if (manifest.ok()) out.push_back(*std::move(manifest));
      }
    }
    if (out.empty()) {
      // No snapshot: say so for a name that is not a collection either.
      const absl::Status exists = engine_->GetCollection(collection).status();
      if (absl::IsNotFound(exists)) {
        return absl::NotFoundError(absl::StrCat("collection ", QuotedForMessage(collection),
                                                " not found (and it has no snapshots)"));
      }
    }
    std::sort(out.begin(), out.end(), [](const SnapshotManifest& a, const SnapshotManifest& b) {
      return std::tie(a.created_unix_micros, a.id) < std::tie(b.created_unix_micros, b.id);
    });
    return out;
  }

  absl::StatusOr<SnapshotManifest> Get(const std::string& id) const override {
    TESSERA_ASSIGN_OR_RETURN(const fs::path path, PathOf(id));
    return ReadManifest(path);
  }

  absl::Status Delete(const std::string& id) override {
    TESSERA_ASSIGN_OR_RETURN(const fs::path path, PathOf(id));
    // Renamed aside first: a crash in the middle leaves no half snapshot listed.
    const fs::path aside = dir_ / absl::StrCat(".tmp-deleted-", id);
    std::error_code error;
    fs::rename(path, aside, error);
    if (error) {
      return absl::InternalError(
          absl::StrCat("cannot move ", path.string(), " aside: ", error.message()));
    }
    fs::remove_all(aside, error);
    if (error) {
      return absl::InternalError(
          absl::StrCat("cannot remove ", aside.string(), ": ", error.message()));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<SnapshotArchive>> OpenArchive(const std::string& id,
                                                               size_t chunk_bytes) const override {
    TESSERA_ASSIGN_OR_RETURN(const fs::path path, PathOf(id));
    TESSERA_ASSIGN_OR_RETURN(SnapshotManifest manifest, ReadManifest(path));
    return std::unique_ptr<SnapshotArchive>(
        new ArchiveReader(path / kDataDirectory, std::move(manifest), chunk_bytes));
  }

  std::unique_ptr<SnapshotRestore> NewRestore(const std::string& new_name) override {
    return std::make_unique<ArchiveRestore>(engine_, new_name);
  }

  absl::StatusOr<SnapshotManifest> RestoreLocal(const std::string& id,
                                                const std::string& new_name) override {
    TESSERA_RETURN_IF_ERROR(PathOf(id).status());
    ArchiveRestore restore(engine_, new_name);
    TESSERA_RETURN_IF_ERROR(
        WriteArchive(id, [&restore](absl::string_view bytes) { return restore.Add(bytes); }));
    return restore.Finish();
  }

 private:
  // The directory of snapshot `id`: INVALID_ARGUMENT for a malformed id, NOT_FOUND naming it for
  // one that does not exist.
  absl::StatusOr<fs::path> PathOf(const std::string& id) const {
    TESSERA_ASSIGN_OR_RETURN(const std::string collection, CollectionOfId(id));
    const fs::path path = dir_ / collection / id;
    std::error_code error;
    if (!fs::exists(path / kManifestFile, error)) {
      return absl::NotFoundError(absl::StrCat("snapshot ", QuotedForMessage(id), " not found"));
    }
    return path;
  }

  static absl::StatusOr<SnapshotManifest> ReadManifest(const fs::path& path) {
    TESSERA_ASSIGN_OR_RETURN(const std::string text,
                             internal::ReadWholeFile((path / kManifestFile).string()));
    absl::StatusOr<SnapshotManifest> manifest = DecodeSnapshotManifest(text);
    if (!manifest.ok()) {
      return absl::DataLossError(
          absl::StrCat((path / kManifestFile).string(), ": ", manifest.status().message()));
    }
    return manifest;
  }

  Engine* const engine_;
  const fs::path dir_;
};

}  // namespace

absl::Status SnapshotStore::WriteArchive(const std::string& id,
                                         const std::function<absl::Status(absl::string_view)>& sink,
                                         size_t chunk_bytes) const {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<SnapshotArchive> archive, OpenArchive(id, chunk_bytes));
  while (true) {
    TESSERA_ASSIGN_OR_RETURN(const std::string piece, archive->Next());
    if (piece.empty()) return absl::OkStatus();
    TESSERA_RETURN_IF_ERROR(sink(piece));
  }
}

int64_t SnapshotManifest::total_bytes() const {
  int64_t total = 0;
  for (const SnapshotFile& file : files) total += file.size;
  return total;
}

std::string EncodeSnapshotManifest(const SnapshotManifest& manifest) {
  std::string out =
      absl::StrCat(kManifestFormatLine, "\n", "id ", manifest.id, "\n", "collection ",
                   manifest.collection, "\n", "created_unix_micros ", manifest.created_unix_micros,
                   "\n", "num_shards ", manifest.num_shards, "\n");
  for (size_t s = 0; s < manifest.shard_sequences.size(); ++s) {
    absl::StrAppend(&out, "sequence ", s, " ", manifest.shard_sequences[s], "\n");
  }
  absl::StrAppend(&out, "cut_micros ", manifest.cut_micros, "\n");
  for (const SnapshotFile& file : manifest.files) {
    absl::StrAppend(&out, "file ", file.size, " ", absl::StrFormat("%08x", file.crc32), " ",
                    file.path, "\n");
  }
  return out;
}

absl::StatusOr<SnapshotManifest> DecodeSnapshotManifest(absl::string_view text) {
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] != kManifestFormatLine) {
    return absl::DataLossError(
        absl::StrCat("snapshot manifest: expected the line '", kManifestFormatLine, "' first"));
  }
  SnapshotManifest manifest;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<absl::string_view> words = absl::StrSplit(lines[i], ' ');
    const auto bad = [&] {
      return absl::DataLossError(absl::StrCat("snapshot manifest line ", i + 1, ": ",
                                              QuotedForMessage(lines[i]), " is malformed"));
    };
    if (words[0] == "id" && words.size() == 2) {
      manifest.id = std::string(words[1]);
    } else if (words[0] == "collection" && words.size() == 2) {
      manifest.collection = std::string(words[1]);
    } else if (words[0] == "created_unix_micros" && words.size() == 2) {
      if (!absl::SimpleAtoi(words[1], &manifest.created_unix_micros)) return bad();
    } else if (words[0] == "cut_micros" && words.size() == 2) {
      if (!absl::SimpleAtoi(words[1], &manifest.cut_micros)) return bad();
    } else if (words[0] == "num_shards" && words.size() == 2) {
      if (!absl::SimpleAtoi(words[1], &manifest.num_shards)) return bad();
    } else if (words[0] == "sequence" && words.size() == 3) {
      uint64_t sequence = 0;
      size_t shard = 0;
      if (!absl::SimpleAtoi(words[1], &shard) || !absl::SimpleAtoi(words[2], &sequence) ||
          shard != manifest.shard_sequences.size()) {
        return bad();
      }
      manifest.shard_sequences.push_back(sequence);
    } else if (words[0] == "file" && words.size() == 4) {
      SnapshotFile file;
      if (!absl::SimpleAtoi(words[1], &file.size) || file.size < 0 ||
          !absl::SimpleHexAtoi(words[2], &file.crc32)) {
        return bad();
      }
      file.path = std::string(words[3]);
      manifest.files.push_back(std::move(file));
    } else {
      return bad();
    }
  }
  if (manifest.id.empty() || manifest.collection.empty()) {
    return absl::DataLossError("snapshot manifest: no id or no collection line");
  }
  return manifest;
}

absl::StatusOr<std::unique_ptr<SnapshotStore>> SnapshotStore::Open(Engine* engine,
                                                                   const std::string& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot create snapshot directory ", dir, ": ", error.message()));
  }
  // Snapshots being taken or deleted when the process stopped.
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    if (entry.path().filename().string().rfind(".tmp-", 0) == 0) {
      std::error_code ignored;
      fs::remove_all(entry.path(), ignored);
    }
  }
  return std::unique_ptr<SnapshotStore>(new SnapshotStoreImpl(engine, fs::path(dir)));
}

}  // namespace tessera
