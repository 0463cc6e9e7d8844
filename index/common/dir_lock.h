// An exclusive lock on a directory for the life of one object: flock(2) on <dir>/LOCK, so that
// two processes (or two opens within one process) never use one data directory at once. The
// holder writes its pid into the file, so that an opener it refuses can name the process in the
// way. The kernel drops the lock when the holder exits, however it exits (SIGKILL included), so a
// stale LOCK file never blocks a later open.
#ifndef TESSERA_INDEX_COMMON_DIR_LOCK_H_
#define TESSERA_INDEX_COMMON_DIR_LOCK_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace tessera::internal {

// Holds the lock from Acquire until destruction. Thread-compatible (nothing to share).
class DirLock {
 public:
  // Creates `dir` if it is missing, then locks it without waiting. FAILED_PRECONDITION
  // "data dir 'DIR' is in use by pid N …" when another holder has the lock ("by another process"
  // when it has not yet written its pid); the errno status (tessera/base/errno_status.h) naming
  // the path when the directory or the lock file cannot be created or opened.
  static absl::StatusOr<std::unique_ptr<DirLock>> Acquire(const std::string& dir);

  // Releases the lock (the file stays: removing it would race with a new holder).
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  // <dir>/LOCK.
  const std::string& path() const { return path_; }

 private:
  DirLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  const int fd_;
  const std::string path_;
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COMMON_DIR_LOCK_H_
