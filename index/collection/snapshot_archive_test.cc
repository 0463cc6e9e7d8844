// The snapshot archive's framing (tessera/snapshot.h): the head the writer encodes, byte for byte,
// and the reader against archives built here by hand — in every chunking, and refusing a flipped
// byte, a truncated file, a cut end marker and trailing bytes with DATA_LOSS naming the file.
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/common/crc32.h"
#include "tessera/snapshot.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

std::string U32(uint32_t value) {
  std::string out;
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  return out;
}

// Magic, manifest length and CRC-32 (little-endian), the manifest, the entries, the end marker.
std::string HandBuiltArchive(const std::string& manifest, const std::vector<std::string>& files) {
  std::string archive = "TSNAPv1\n";
  archive += U32(static_cast<uint32_t>(manifest.size()));
  archive += U32(internal::Crc32(manifest));
  archive += manifest;
  for (const std::string& file : files) archive += file;
  archive += "TSNAPEND";
  return archive;
}

// Logs what the reader hands over; its manifest is the entries' names, one a line, each entry
// checked against the CRC-32 of the bytes `files` holds for it.
class RecordingHandler : public SnapshotArchiveReader::Handler {
 public:
  explicit RecordingHandler(std::vector<std::string> files, bool with_crc = true)
      : files_(std::move(files)), with_crc_(with_crc) {}

  absl::StatusOr<std::vector<SnapshotArchiveEntry>> OnManifest(absl::string_view text) override {
    absl::StrAppend(&log, "manifest[", text, "]");
    if (!manifest_error.ok()) return manifest_error;
    std::vector<SnapshotArchiveEntry> entries;
    for (size_t i = 0; i < files_.size(); ++i) {
      SnapshotArchiveEntry entry;
      entry.name = absl::StrCat("file-", i);
      entry.size = static_cast<int64_t>(files_[i].size());
      if (with_crc_) entry.crc32 = internal::Crc32(files_[i]);
      entries.push_back(entry);
    }
    return entries;
  }
  absl::Status OnEntryBegin(size_t index) override {
    absl::StrAppend(&log, " begin", index);
    bytes.emplace_back();
    return absl::OkStatus();
  }
  absl::Status OnEntryBytes(size_t index, absl::string_view piece) override {
    EXPECT_FALSE(piece.empty());
    EXPECT_EQ(index + 1, bytes.size());
    bytes.back().append(piece.data(), piece.size());
    return absl::OkStatus();
  }
  absl::Status OnEntryEnd(size_t index) override {
    absl::StrAppend(&log, " end", index);
    return absl::OkStatus();
  }

  std::string log;
  std::vector<std::string> bytes;  // per entry begun, what arrived
  absl::Status manifest_error;

 private:
  const std::vector<std::string> files_;
  const bool with_crc_;
};

const std::vector<std::string>& Files() {
  static const auto* files =
      new std::vector<std::string>{"first file's bytes", "", std::string(300, '\x7f') + "end"};
  return *files;
}

constexpr char kManifest[] = "file-0\nfile-1\nfile-2\n";

// Feeds `archive` to a reader in pieces of `chunk` bytes; the first error of Add.
absl::Status Feed(SnapshotArchiveReader* reader, absl::string_view archive, size_t chunk) {
  for (size_t at = 0; at < archive.size(); at += chunk) {
    absl::Status status = reader->Add(archive.substr(at, chunk));
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

TEST(SnapshotArchiveWriter, HeadAndEndMarkerAreTheV1Framing) {
  // "manifest\n": 9 bytes, CRC-32 0x44adbd6b (zlib's crc32), both little-endian.
  EXPECT_EQ(EncodeSnapshotArchiveHead("manifest\n"),
            std::string("TSNAPv1\n\x09\x00\x00\x00\x6b\xbd\xad\x44manifest\n", 25));
  EXPECT_EQ(SnapshotArchiveEndMarker(), "TSNAPEND");
  EXPECT_EQ(EncodeSnapshotArchiveHead(kManifest) + Files()[0] + Files()[1] + Files()[2] +
                std::string(SnapshotArchiveEndMarker()),
            HandBuiltArchive(kManifest, Files()));
}

TEST(SnapshotArchiveReader, ReadsAHandBuiltArchiveInAnyChunking) {
  const std::string archive = HandBuiltArchive(kManifest, Files());
  for (const size_t chunk : {size_t{1}, size_t{2}, size_t{7}, size_t{64}, archive.size()}) {
    RecordingHandler handler(Files());
    SnapshotArchiveReader reader(&handler);
    ASSERT_TRUE(Feed(&reader, archive, chunk).ok()) << "chunk " << chunk;
    EXPECT_TRUE(reader.Finish().ok()) << reader.Finish();
    EXPECT_TRUE(reader.ended());
    EXPECT_EQ(reader.current_entry(), std::nullopt);
    EXPECT_EQ(handler.log,
              absl::StrCat("manifest[", kManifest, "] begin0 end0 begin1 end1 begin2 end2"))
        << "chunk " << chunk;
    EXPECT_EQ(handler.bytes, Files()) << "chunk " << chunk;
  }
}

TEST(SnapshotArchiveReader, FlippedByteInAFileIsDataLossNamingIt) {
  std::string archive = HandBuiltArchive(kManifest, Files());
  // The last file's last byte, just before the end marker.
  archive[archive.size() - 9] ^= 0x20;
  RecordingHandler handler(Files());
  SnapshotArchiveReader reader(&handler);
  const absl::Status status = Feed(&reader, archive, 5);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("snapshot file 'file-2': CRC-32 "));
  EXPECT_EQ(handler.log, absl::StrCat("manifest[", kManifest, "] begin0 end0 begin1 end1 begin2"));
  // The error is final.
  EXPECT_EQ(reader.Add("more"), status);
  EXPECT_EQ(reader.Finish(), status);
}

TEST(SnapshotArchiveReader, EntryWithoutChecksumIsNotChecked) {
  std::string archive = HandBuiltArchive(kManifest, Files());
  archive[archive.size() - 9] ^= 0x20;
  RecordingHandler handler(Files(), /*with_crc=*/false);
  SnapshotArchiveReader reader(&handler);
  ASSERT_TRUE(Feed(&reader, archive, 5).ok());
  EXPECT_TRUE(reader.Finish().ok());
  EXPECT_EQ(handler.bytes[2].back(), static_cast<char>('d' ^ 0x20));
}

TEST(SnapshotArchiveReader, EmptyFileIsCheckedToo) {
  // The manifest says file-1 is empty with a CRC-32 an empty file cannot have.
  class WrongEmptyChecksum : public RecordingHandler {
   public:
    WrongEmptyChecksum() : RecordingHandler(Files()) {}
    absl::StatusOr<std::vector<SnapshotArchiveEntry>> OnManifest(absl::string_view text) override {
      absl::StatusOr<std::vector<SnapshotArchiveEntry>> entries =
          RecordingHandler::OnManifest(text);
      (*entries)[1].crc32 = 0x1234abcd;
      return entries;
    }
  } handler;
  SnapshotArchiveReader reader(&handler);
  const absl::Status status = reader.Add(HandBuiltArchive(kManifest, Files()));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("snapshot file 'file-1': CRC-32 00000000, the manifest says 1234abcd"));
}

TEST(SnapshotArchiveReader, FlippedByteInTheManifestIsDataLoss) {
  std::string archive = HandBuiltArchive(kManifest, Files());
  archive[16 + 3] ^= 0x01;  // in the manifest's text, after magic, length and CRC-32
  RecordingHandler handler(Files());
  SnapshotArchiveReader reader(&handler);
  const absl::Status status = reader.Add(archive);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("the manifest fails its CRC-32"));
  EXPECT_EQ(handler.log, "");
}

TEST(SnapshotArchiveReader, TruncatedArchiveSaysWhere) {
  const std::string archive = HandBuiltArchive(kManifest, Files());
  const size_t end_of_file_0 = 16 + std::string(kManifest).size() + Files()[0].size();
  const struct {
    size_t cut;
    std::optional<size_t> entry;
    std::string where;
  } cases[] = {
      {0, std::nullopt, "snapshot archive truncated in its manifest"},
      {12, std::nullopt, "snapshot archive truncated in its manifest"},
      {20, std::nullopt, "snapshot archive truncated in its manifest"},
      {end_of_file_0 - 4, 0, "snapshot archive truncated in file 'file-0' (14 of 18 bytes)"},
      {end_of_file_0 + 100, 2, "snapshot archive truncated in file 'file-2' (100 of 303 bytes)"},
      // The end marker cut: all of it, or its last 3 bytes.
      {archive.size() - 8, std::nullopt, "snapshot archive truncated before its end marker"},
      {archive.size() - 3, std::nullopt, "snapshot archive truncated before its end marker"},
  };
  for (const auto& c : cases) {
    RecordingHandler handler(Files());
    SnapshotArchiveReader reader(&handler);
    ASSERT_TRUE(Feed(&reader, absl::string_view(archive).substr(0, c.cut), 3).ok()) << c.cut;
    EXPECT_FALSE(reader.ended());
    EXPECT_EQ(reader.current_entry(), c.entry) << c.cut;
    const absl::Status status = reader.Finish();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << c.cut;
    EXPECT_EQ(status.message(), c.where) << c.cut;
  }
}

TEST(SnapshotArchiveReader, WrongEndMarkerOrTrailingBytesAreDataLoss) {
  const std::string archive = HandBuiltArchive(kManifest, Files());
  {
    std::string wrong = archive;
    wrong.back() = 'X';
    RecordingHandler handler(Files());
    SnapshotArchiveReader reader(&handler);
    const absl::Status status = reader.Add(wrong);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_THAT(status.message(), HasSubstr("end marker is wrong"));
  }
  for (const size_t chunk : {size_t{1}, archive.size() + 2}) {
    RecordingHandler handler(Files());
    SnapshotArchiveReader reader(&handler);
    const absl::Status status = Feed(&reader, archive + "xy", chunk);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_THAT(status.message(), HasSubstr("after its end marker"));
    EXPECT_EQ(reader.Finish(), status);
  }
}

TEST(SnapshotArchiveReader, RefusesWhatIsNotAnArchive) {
  RecordingHandler handler(Files());
  SnapshotArchiveReader reader(&handler);
  const absl::Status status = reader.Add("TSNAPv2\nrest");
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("does not start with TSNAPv1"));
}

TEST(SnapshotArchiveReader, ManifestLongerThanTheBoundIsDataLoss) {
  const std::string archive = HandBuiltArchive(kManifest, Files());
  RecordingHandler handler(Files());
  SnapshotArchiveReader reader(&handler, /*max_manifest_bytes=*/8);
  const absl::Status status = reader.Add(archive);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("manifest of 21 bytes, expected at most 8"));
}

TEST(SnapshotArchiveReader, HandlerErrorStopsTheReader) {
  const std::string archive = HandBuiltArchive(kManifest, Files());
  RecordingHandler handler(Files());
  handler.manifest_error = absl::AlreadyExistsError("collection 'x' already exists");
  SnapshotArchiveReader reader(&handler);
  EXPECT_EQ(reader.Add(archive), handler.manifest_error);
  EXPECT_EQ(reader.Add("more"), handler.manifest_error);
  EXPECT_EQ(reader.Finish(), handler.manifest_error);
  EXPECT_EQ(handler.log, absl::StrCat("manifest[", kManifest, "]"));
}

}  // namespace
}  // namespace tessera
