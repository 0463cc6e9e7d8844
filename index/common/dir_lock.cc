#include "index/common/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tessera/base/errno_status.h"

namespace tessera::internal {
namespace {

constexpr size_t kPidWidth = 24;  // a 64-bit pid and a newline

// The pid the holder wrote into the lock file, or 0 when it holds none (yet).
int64_t HolderPid(int fd) {
  char buffer[kPidWidth + 1];
  const ssize_t n = ::pread(fd, buffer, sizeof(buffer) - 1, 0);
  if (n <= 0) return 0;
  int64_t pid = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(buffer, n)), &pid)) return 0;
  return pid;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DirLock>> DirLock::Acquire(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return ErrnoStatus(error.value(), "cannot create data dir", dir);
  const std::string path = (std::filesystem::path(dir) / "LOCK").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "cannot open the lock file", path);
  // flock, not fcntl: a second open description conflicts even within the holder's own process.
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int flock_error = errno;
    if (flock_error != EWOULDBLOCK) {
      ::close(fd);
      return ErrnoStatus(flock_error, "cannot lock", path);
    }
    const int64_t pid = HolderPid(fd);
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "data dir '", dir, "' is in use by ",
        pid > 0 ? absl::StrCat("pid ", pid) : std::string("another process"),
        " (it holds the lock on '", path,
        "'); one data dir serves one process: stop that one or choose another data dir"));
  }
  // The pid only serves the message above: best effort, and padded to one width that any pid
  // fits, so that a rewrite takes no new space (a full disk must not keep the engine from
  // opening) and leaves nothing of a longer pid behind.
  std::string pid = std::to_string(::getpid());
  pid.resize(kPidWidth, ' ');
  pid.back() = '\n';
  (void)!::pwrite(fd, pid.data(), pid.size(), 0);
  return std::unique_ptr<DirLock>(new DirLock(fd, path));
}

DirLock::~DirLock() { ::close(fd_); }

}  // namespace tessera::internal
