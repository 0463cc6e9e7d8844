#include "index/common/file_io.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "index/testing/temp_dir.h"

namespace tessera::internal {
namespace {

using ::testing::HasSubstr;

TEST(FileIo, WritesThePartsInOrderAndReplacesTheFile) {
  TempDir dir;
  const std::string path = dir.path() + "/file";
  const std::string binary("a\0b\xff", 4);
  ASSERT_TRUE(WriteFileAtomically(path, {"header|", binary, "", "|tail"}).ok());
  auto read = ReadWholeFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "header|" + binary + "|tail");

  // A shorter second write leaves nothing of the first, and no temporary behind.
  ASSERT_TRUE(WriteFileAtomically(path, {"x"}).ok());
  EXPECT_EQ(*ReadWholeFile(path), "x");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  ASSERT_TRUE(WriteFileAtomically(path, {}).ok());
  EXPECT_EQ(*ReadWholeFile(path), "");
}

TEST(FileIo, AFailedWriteLeavesTheFileAsItWasAndNamesTheTemporary) {
  TempDir dir;
  const std::string path = dir.path() + "/file";
  ASSERT_TRUE(WriteFileAtomically(path, {"kept"}).ok());
  // The temporary cannot be created where a directory of its name stands.
  std::filesystem::create_directory(path + ".tmp");
  const absl::Status status = WriteFileAtomically(path, {"lost"});
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("cannot create '" + path + ".tmp'"));
  EXPECT_EQ(*ReadWholeFile(path), "kept");

  const absl::Status no_directory = WriteFileAtomically(dir.path() + "/missing/file", {"x"});
  EXPECT_TRUE(absl::IsNotFound(no_directory)) << no_directory;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/missing"));
}

// ReadFileInChunks (how segments are verified at open): every byte once, in order, in chunks of at
// most the size asked; a file shorter than the size asked is DATA_LOSS naming it.
TEST(FileIo, ReadsAFileInChunks) {
  TempDir dir;
  const std::string path = dir.path() + "/file";
  std::string bytes(10000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(WriteFileAtomically(path, {bytes}).ok());
  for (size_t chunk : {size_t{1} << 20, size_t{4096}, size_t{3}}) {
    std::string read;
    size_t largest = 0;
    ASSERT_TRUE(ReadFileInChunks(path, 9999, chunk, [&](absl::string_view part) {
                  read.append(part.data(), part.size());
                  largest = std::max(largest, part.size());
                }).ok());
    EXPECT_EQ(read, bytes.substr(0, 9999)) << "chunk " << chunk;
    EXPECT_LE(largest, chunk);
  }
  const absl::Status longer = ReadFileInChunks(path, 10001, 4096, [](absl::string_view) {});
  EXPECT_EQ(longer.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(longer.message(), HasSubstr(path));
  EXPECT_THAT(longer.message(), HasSubstr("10000 bytes, 10001 expected"));
  EXPECT_EQ(ReadFileInChunks(dir.path() + "/missing", 1, 1, [](absl::string_view) {}).code(),
            absl::StatusCode::kNotFound);
}

// PrefetchMapped brings the pages under the ranges into the page cache without touching them:
// after the file's pages were evicted (fsync, then POSIX_FADV_DONTNEED), mincore finds the
// requested pages cached (the reads are asynchronous: polled for up to 10 s), given in any order,
// empty ranges and neighbours within a page included. Once they are cached, the same call advises
// nothing; with one sampled page evicted again, it advises the runs again.
TEST(FileIo, PrefetchMappedReadsTheRangesPagesAhead) {
  TempDir dir;
  const std::string path = dir.path() + "/file";
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t pages = 64;
  ASSERT_TRUE(WriteFileAtomically(path, {std::string(pages * page, 'x')}).ok());
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const char* data = (*file)->bytes().data();
  auto cached = [&](size_t p) {
    unsigned char resident = 0;
    const void* at = data + p * page;
    return ::mincore(const_cast<void*>(at), page, &resident) == 0 && (resident & 1) != 0;
  };
  const std::vector<size_t> wanted = {40, 3, 4, 20};
  if (cached(40) || cached(3) || cached(20)) {
    GTEST_SKIP() << "the file system kept the evicted pages cached";
  }
  const std::vector<absl::string_view> ranges = {
      absl::string_view(data + 40 * page + 100, 10), absl::string_view(data, 0),
      absl::string_view(data + 3 * page + page - 1, 2),  // pages 3 and 4
      absl::string_view(data + 20 * page, page)};
  // Runs from the start of page 3, 20 and 40 to their ranges' ends: page + 1, page and 110 bytes.
  EXPECT_EQ(PrefetchMapped(ranges), 2 * page + 111);
  for (int i = 0; i < 1000 && !std::all_of(wanted.begin(), wanted.end(), cached); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t p : wanted) EXPECT_TRUE(cached(p)) << "page " << p;
  EXPECT_EQ(PrefetchMapped(ranges), 0);

  ASSERT_EQ(::madvise(const_cast<char*>(data), pages * page, MADV_DONTNEED), 0);
  const int again = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(again, 0);
  ::posix_fadvise(again, 20 * page, page, POSIX_FADV_DONTNEED);
  ::close(again);
  if (cached(20)) GTEST_SKIP() << "the file system kept the evicted page cached";
  EXPECT_GT(PrefetchMapped(ranges), 0);
}

TEST(FileIo, ReadingAMissingFileIsNotFoundNamingIt) {
  TempDir dir;
  const std::string path = dir.path() + "/absent";
  const auto read = ReadWholeFile(path);
  EXPECT_TRUE(absl::IsNotFound(read.status())) << read.status();
  EXPECT_THAT(read.status().message(), HasSubstr("'" + path + "'"));
  // A directory opens, but reading it fails with EISDIR.
  const auto directory = ReadWholeFile(dir.path());
  EXPECT_TRUE(absl::IsInvalidArgument(directory.status())) << directory.status();
}

}  // namespace
}  // namespace tessera::internal
