#include "index/common/dir_lock.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "index/testing/temp_dir.h"

namespace tessera::internal {
namespace {

using ::testing::HasSubstr;

TEST(DirLock, ASecondHolderInThisProcessIsRefusedUntilTheFirstGoes) {
  TempDir dir;
  const std::string data_dir = dir.path() + "/data";  // created by Acquire
  auto first = DirLock::Acquire(data_dir);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->path(), data_dir + "/LOCK");

  const auto second = DirLock::Acquire(data_dir);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("data dir '", data_dir, "' is in use by pid ", getpid())));
  EXPECT_THAT(second.status().message(), HasSubstr(data_dir + "/LOCK"));

  first->reset();
  EXPECT_TRUE(DirLock::Acquire(data_dir).ok());
}

// Another process holding the lock is named by its pid; when it exits without releasing anything
// (as after SIGKILL), the kernel frees the lock and the stale LOCK file does not block.
TEST(DirLock, NamesTheHoldingProcessAndIsFreedWhenItExits) {
  TempDir dir;
  int ready[2], release[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(release), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto lock = DirLock::Acquire(dir.path());
    const char ok = lock.ok() ? '1' : '0';
    (void)!write(ready[1], &ok, 1);
    char ignored;
    (void)!read(release[0], &ignored, 1);
    _exit(0);  // no destructor runs: only the kernel releases the lock
  }
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, '1');

  const auto refused = DirLock::Acquire(dir.path());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr(absl::StrCat("data dir '", dir.path(), "' is in use by pid ", child, " ")));

  ASSERT_EQ(write(release[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  auto after = DirLock::Acquire(dir.path());
  EXPECT_TRUE(after.ok()) << after.status();
  for (int fd : {ready[0], ready[1], release[0], release[1]}) close(fd);
}

TEST(DirLock, ADirectoryThatCannotBeCreatedIsNamed) {
  TempDir dir;
  const std::string file = dir.path() + "/file";
  std::FILE* f = std::fopen(file.c_str(), "w");  // a file where a directory should be
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  const auto status = DirLock::Acquire(file + "/data").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;  // ENOTDIR
  EXPECT_THAT(status.message(), HasSubstr(file + "/data"));
}

}  // namespace
}  // namespace tessera::internal
