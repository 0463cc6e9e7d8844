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

// A file of `pages` pages written and then evicted from the page cache (fsync, then
// POSIX_FADV_DONTNEED), mapped; and whether page p of the mapping is cached (mincore).
class EvictedFile {
 public:
  static constexpr size_t kPages = 64;

  EvictedFile() : page_(static_cast<size_t>(::sysconf(_SC_PAGESIZE))) {
    path_ = dir_.path() + "/file";
    EXPECT_TRUE(WriteFileAtomically(path_, {std::string(kPages * page_, 'x')}).ok());
    Evict(0, 0);
    auto file = MappedFile::Open(path_);
    EXPECT_TRUE(file.ok()) << file.status();
    if (file.ok()) file_ = *std::move(file);
  }
  size_t page() const { return page_; }
  const char* data() const { return file_->bytes().data(); }
  bool Cached(size_t p) const {
    unsigned char resident = 0;
    const void* at = data() + p * page_;
    return ::mincore(const_cast<void*>(at), page_, &resident) == 0 && (resident & 1) != 0;
  }
  // Evicts `length` bytes from `offset` (0: to the end), unmapping them from this process first.
  void Evict(size_t offset, size_t length) const {
    if (file_ != nullptr) ::madvise(const_cast<char*>(data()), kPages * page_, MADV_DONTNEED);
    const int fd = ::open(path_.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fsync(fd);
    ::posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(length),
                    POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  // Polls for up to 10 s: the reads ahead are asynchronous.
  bool AwaitCached(const std::vector<size_t>& pages) const {
    auto all = [&] {
      return std::all_of(pages.begin(), pages.end(), [&](size_t p) { return Cached(p); });
    };
    for (int i = 0; i < 1000 && !all(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return all();
  }

 private:
  TempDir dir_;
  std::string path_;
  const size_t page_;
  std::shared_ptr<const MappedFile> file_;
};

// PrefetchMapped brings the pages under the ranges into the page cache without touching them:
// after the file's pages were evicted, mincore finds the requested pages cached, given in any
// order, empty ranges and neighbours within a page included; it advises them whether cached or not.
TEST(FileIo, PrefetchMappedReadsTheRangesPagesAhead) {
  EvictedFile file;
  const size_t page = file.page();
  const char* data = file.data();
  if (file.Cached(40) || file.Cached(3) || file.Cached(20)) {
    GTEST_SKIP() << "the file system kept the evicted pages cached";
  }
  const std::vector<absl::string_view> ranges = {
      absl::string_view(data + 40 * page + 100, 10), absl::string_view(data, 0),
      absl::string_view(data + 3 * page + page - 1, 2),  // pages 3 and 4
      absl::string_view(data + 20 * page, page)};
  // Runs from the start of page 3, 20 and 40 to their ranges' ends: page + 1, page and 110 bytes.
  EXPECT_EQ(PrefetchMapped(ranges), 2 * page + 111);
  for (size_t p : {40, 3, 4, 20}) EXPECT_TRUE(file.AwaitCached({p})) << "page " << p;
  EXPECT_EQ(PrefetchMapped(ranges), 2 * page + 111);
}

// MappedReadAhead advises a read whose sampled pages miss, and skips the advice only from the
// kCachedReadsToSkip-th read in a row whose sample was all cached; one miss starts the count again.
TEST(FileIo, MappedReadAheadSkipsOnlyAfterAStreakOfCachedReads) {
  EvictedFile file;
  const size_t page = file.page();
  const char* data = file.data();
  if (file.Cached(20) || file.Cached(40)) {
    GTEST_SKIP() << "the file system kept the evicted pages cached";
  }
  const std::vector<absl::string_view> ranges = {absl::string_view(data + 40 * page, 10),
                                                 absl::string_view(data + 20 * page, 10)};
  MappedReadAhead read_ahead;
  EXPECT_EQ(read_ahead.Read(ranges), 2 * 10);
  ASSERT_TRUE(file.AwaitCached({20, 40}));
  for (int i = 1; i < MappedReadAhead::kCachedReadsToSkip; ++i) {
    EXPECT_EQ(read_ahead.Read(ranges), 2 * 10) << "cached read " << i;
  }
  EXPECT_EQ(read_ahead.Read(ranges), 0);
  EXPECT_EQ(read_ahead.Read(ranges), 0);

  file.Evict(20 * page, page);
  if (file.Cached(20)) GTEST_SKIP() << "the file system kept the evicted page cached";
  EXPECT_EQ(read_ahead.Read(ranges), 2 * 10);
  ASSERT_TRUE(file.AwaitCached({20, 40}));
  EXPECT_EQ(read_ahead.Read(ranges), 2 * 10);  // one cached read in a row, not a streak
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
