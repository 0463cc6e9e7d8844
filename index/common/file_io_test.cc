#include "index/common/file_io.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

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
