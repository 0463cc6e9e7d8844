#include "index/common/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "tessera/base/errno_status.h"
#include "tessera/status_macros.h"

namespace tessera::internal {
namespace {

absl::Status WriteAll(int fd, absl::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "cannot write", path);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// The directory that holds `path` ("." for a bare name, "/" for a file in the root).
std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// A file opened read-only with its stat, or the error naming it; the caller closes fd.
struct OpenForReading {
  int fd = -1;
  struct stat st {};

  static absl::StatusOr<OpenForReading> Open(const std::string& path) {
    OpenForReading file;
    file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (file.fd < 0) return ErrnoStatus(errno, "cannot open", path);
    if (::fstat(file.fd, &file.st) != 0) {
      const absl::Status status = ErrnoStatus(errno, "cannot stat", path);
      ::close(file.fd);
      return status;
    }
    return file;
  }
};

// The start of the page holding p.
const char* PageStart(const char* p, uintptr_t page_size) {
  return p - reinterpret_cast<uintptr_t>(p) % page_size;
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::Span<const absl::string_view> parts) {
  const std::string temporary = path + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "cannot create", temporary);
  absl::Status status;
  for (const absl::string_view part : parts) {
    status = WriteAll(fd, part, temporary);
    if (!status.ok()) break;
  }
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoStatus(errno, "cannot fsync", temporary);
  if (::close(fd) != 0 && status.ok()) status = ErrnoStatus(errno, "cannot close", temporary);
  if (status.ok() && ::rename(temporary.c_str(), path.c_str()) != 0) {
    status = ErrnoStatus(errno, absl::StrCat("cannot rename '", temporary, "' to"), path);
  }
  if (!status.ok()) {
    ::unlink(temporary.c_str());
    return status;
  }
  const std::string dir = DirectoryOf(path);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return ErrnoStatus(errno, "cannot open directory", dir);
  if (::fsync(dir_fd) != 0) status = ErrnoStatus(errno, "cannot fsync directory", dir);
  ::close(dir_fd);
  return status;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(const OpenForReading file, OpenForReading::Open(path));
  const int fd = file.fd;
  const struct stat& st = file.st;
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const absl::Status status = ErrnoStatus(errno, "cannot read", path);
      ::close(fd);
      return status;
    }
    if (n == 0) break;  // the file shrank while being read: the caller's checks see the bytes read
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  bytes.resize(done);
  return bytes;
}

absl::Status ReadFileInChunks(const std::string& path, uint64_t size, size_t chunk_bytes,
                              const std::function<void(absl::string_view)>& fn) {
  TESSERA_ASSIGN_OR_RETURN(const OpenForReading file, OpenForReading::Open(path));
  std::string buffer(
      static_cast<size_t>(std::min<uint64_t>(size, std::max<size_t>(chunk_bytes, 1))), '\0');
  uint64_t done = 0;
  absl::Status status;
  while (done < size) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(size - done, buffer.size()));
    size_t got = 0;
    while (got < want) {
      const ssize_t n =
          ::pread(file.fd, buffer.data() + got, want - got, static_cast<off_t>(done + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        status = ErrnoStatus(errno, "cannot read", path);
        break;
      }
      if (n == 0) {
        status = absl::DataLossError(
            absl::StrCat("'", path, "': ", done + got, " bytes, ", size, " expected"));
        break;
      }
      got += static_cast<size_t>(n);
    }
    if (!status.ok()) break;
    fn(absl::string_view(buffer.data(), want));
    done += want;
  }
  ::close(file.fd);
  return status;
}

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(const OpenForReading file, OpenForReading::Open(path));
  const int fd = file.fd;
  const struct stat& st = file.st;
  const size_t size = static_cast<size_t>(st.st_size);
  void* data = nullptr;
  if (size > 0) {
    data = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) {
      const absl::Status status = ErrnoStatus(errno, "cannot map", path);
      ::close(fd);
      return status;
    }
  }
  ::close(fd);  // the mapping keeps the file open
  return std::shared_ptr<const MappedFile>(
      new MappedFile(path, static_cast<const char*>(data), size));
}

void MappedFile::DropResidentPages() const {
  // Advice only: a failure leaves the pages resident, which is what happens without it.
  if (size_ > 0) ::madvise(const_cast<char*>(data_), size_, MADV_DONTNEED);
}

size_t PrefetchMapped(std::vector<absl::string_view> ranges) {
  const auto page_size = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto address = [](const char* p) { return reinterpret_cast<uintptr_t>(p); };
  std::sort(ranges.begin(), ranges.end(), [&](absl::string_view a, absl::string_view b) {
    return address(a.data()) < address(b.data());
  });
  // The run being gathered: [begin, end), begin on a page boundary.
  const char* begin = nullptr;
  const char* end = nullptr;
  size_t advised = 0;
  auto advise = [&] {
    if (begin == nullptr) return;
    ::madvise(const_cast<char*>(begin), end - begin, MADV_WILLNEED);
    advised += end - begin;
  };
  for (absl::string_view range : ranges) {
    if (range.empty()) continue;
    const char* first = PageStart(range.data(), page_size);
    const char* last = range.data() + range.size();
    if (begin != nullptr && address(first) <= address(end) + page_size) {
      if (address(last) > address(end)) end = last;
      continue;
    }
    advise();
    begin = first;
    end = last;
  }
  advise();
  return advised;
}

size_t MappedReadAhead::Read(std::vector<absl::string_view> ranges) {
  const auto page_size = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  ranges.erase(std::remove_if(ranges.begin(), ranges.end(),
                              [](absl::string_view range) { return range.empty(); }),
               ranges.end());
  const size_t samples = std::min(ranges.size(), kResidencySamples);
  bool cached = true;
  for (size_t i = 0; i < samples && cached; ++i) {
    const char* page = PageStart(ranges[i * ranges.size() / samples].data(), page_size);
    unsigned char resident = 0;
    cached = ::mincore(const_cast<char*>(page), 1, &resident) == 0 && (resident & 1) != 0;
  }
  // Concurrent reads may lose an update of the count: it only steers advice.
  if (!cached) {
    cached_in_a_row_.store(0, std::memory_order_relaxed);
  } else {
    const int in_a_row = cached_in_a_row_.load(std::memory_order_relaxed) + 1;
    if (in_a_row >= kCachedReadsToSkip) return 0;
    cached_in_a_row_.store(in_a_row, std::memory_order_relaxed);
  }
  return PrefetchMapped(std::move(ranges));
}

MappedFile::~MappedFile() {
  if (size_ > 0) ::munmap(const_cast<char*>(data_), size_);
}

int64_t AllocatedBytes(const std::string& path) {
  namespace fs = std::filesystem;
  const auto allocated = [](const fs::path& file) -> int64_t {
    struct stat st;
    if (::lstat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    return static_cast<int64_t>(st.st_blocks) * 512;  // st_blocks is in 512-byte units (POSIX)
  };
  std::error_code error;
  if (!fs::is_directory(fs::symlink_status(path, error))) return allocated(path);
  int64_t total = 0;
  for (fs::recursive_directory_iterator
           it(path, fs::directory_options::skip_permission_denied, error),
       end;
       !error && it != end; it.increment(error)) {
    total += allocated(it->path());
  }
  return total;
}

}  // namespace tessera::internal
