// The status for a failed system call: errno mapped to the closest absl code.
#ifndef TESSERA_BASE_ERRNO_STATUS_H_
#define TESSERA_BASE_ERRNO_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tessera {

// "<what> '<path>': <strerror(error)>" with NOT_FOUND (ENOENT, ENOTDIR), PERMISSION_DENIED (EACCES,
// EPERM, EROFS), RESOURCE_EXHAUSTED (ENOSPC, EDQUOT, EFBIG), INVALID_ARGUMENT (EISDIR),
// UNAVAILABLE (EIO: the device failed, as for RocksDB's I/O errors) or INTERNAL.
absl::Status ErrnoStatus(int error, absl::string_view what, absl::string_view path);

}  // namespace tessera

#endif  // TESSERA_BASE_ERRNO_STATUS_H_
