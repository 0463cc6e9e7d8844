#include "tessera/base/errno_status.h"

#include <cerrno>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace tessera {

absl::Status ErrnoStatus(int error, absl::string_view what, absl::string_view path) {
  const std::string message = absl::StrCat(
      what, " '", path, "': ", std::error_code(error, std::generic_category()).message());
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(message);
    case EISDIR:
      return absl::InvalidArgumentError(message);
    case EIO:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace tessera
