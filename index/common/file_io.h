// Whole-file reads and atomic, durable whole-file writes: the one home of both for the index's own
// files (schemas, candidate-index snapshots); and the disk space a directory occupies.
#ifndef TESSERA_INDEX_COMMON_FILE_IO_H_
#define TESSERA_INDEX_COMMON_FILE_IO_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tessera::internal {

// Replaces `path` with the concatenation of `parts`, atomically and durably: the bytes go to
// `path`.tmp, which is fsynced and renamed over `path`, then the directory is fsynced. On an error
// the temporary is removed and `path` is as it was (unless only the directory's fsync failed).
// Errors name the file (ErrnoStatus: a full disk is RESOURCE_EXHAUSTED, EIO UNAVAILABLE).
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::Span<const absl::string_view> parts);

// The file's bytes. ErrnoStatus on failure, naming the file (NOT_FOUND when it does not exist).
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// The bytes the regular files under `path` (a file, or a directory walked recursively, symbolic
// links not followed) occupy on disk: their allocated blocks (st_blocks × 512), so space a file
// has preallocated beyond its size counts and holes do not. A file hard-linked twice under
// `path` counts twice. Files that vanish or cannot be read while it walks are skipped, and a walk
// that fails part way (a directory removed meanwhile) returns what it counted; 0 for a path that
// does not exist.
int64_t AllocatedBytes(const std::string& path);

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COMMON_FILE_IO_H_
