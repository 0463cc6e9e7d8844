// Tests for ErrnoStatus: the absl code each errno maps to, and the message naming what failed.
#include "tessera/base/errno_status.h"

#include <cerrno>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

TEST(ErrnoStatus, MapsErrnoToTheClosestCode) {
  struct Case {
    int error;
    absl::StatusCode code;
  };
  const Case cases[] = {
      {ENOENT, absl::StatusCode::kNotFound},
      {ENOTDIR, absl::StatusCode::kNotFound},
      {EACCES, absl::StatusCode::kPermissionDenied},
      {EPERM, absl::StatusCode::kPermissionDenied},
      {EROFS, absl::StatusCode::kPermissionDenied},
      {ENOSPC, absl::StatusCode::kResourceExhausted},
      {EDQUOT, absl::StatusCode::kResourceExhausted},
      {EFBIG, absl::StatusCode::kResourceExhausted},
      {EISDIR, absl::StatusCode::kInvalidArgument},
      {EIO, absl::StatusCode::kUnavailable},
      {EBADF, absl::StatusCode::kInternal},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ErrnoStatus(c.error, "cannot open", "/x").code(), c.code) << "errno " << c.error;
  }
}

TEST(ErrnoStatus, MessageNamesTheOperationThePathAndTheError) {
  const absl::Status status = ErrnoStatus(ENOENT, "cannot open", "/data/a.sst");
  EXPECT_THAT(status.message(), HasSubstr("cannot open '/data/a.sst': "));
  EXPECT_THAT(status.message(), HasSubstr("No such file or directory"));
}

}  // namespace
}  // namespace tessera
