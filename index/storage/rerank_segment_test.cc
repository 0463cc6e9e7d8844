// Rerank and codes segments through ShardStore (the only writer of them): reads equal the RocksDB
// path byte for byte, a corrupt, truncated or missing segment is DATA_LOSS naming it, uncommitted
// files are deleted, deletes (and, for codes, dropped generations) give their space back, readers
// keep a replaced segment's mapping, checkpoints carry the segments, and neither opening a store
// nor streaming its codes leaves segment pages resident in the process. The crash safety of the
// flush is in shard_store_crash_test.
#include "index/storage/rerank_segment.h"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/common/file_io.h"
#include "index/storage/record_codec.h"
#include "index/storage/shard_store.h"
#include "index/testing/stored_matrix.h"
#include "index/testing/temp_dir.h"
#include "tessera/float16.h"

namespace tessera::internal {
namespace {

using ::testing::HasSubstr;

// Document i: fp16 mostly, some fp32, 1–40 rows of 32 columns; every 17th has no rows (stored as
// codes only), so it stays in RocksDB.
DocumentWrite MakeDoc(int i, uint32_t salt = 0) {
  DocumentWrite w;
  w.record.external_id = absl::StrCat("doc-", i);
  const int64_t rows = i % 17 == 0 ? 0 : 1 + (i * 7 + salt) % 40;
  w.record.num_tokens = std::max<int64_t>(rows, 1);
  for (int64_t r = 0; r <= std::max<int64_t>(rows, 1); ++r) {
    w.record.member_offsets.push_back(static_cast<int32_t>(r));
  }
  for (int64_t r = 0; r < std::max<int64_t>(rows, 1); ++r) {
    w.record.members.push_back(static_cast<int32_t>(r));
  }
  w.rerank = MakeMatrix(i % 5 == 0 ? VectorDtype::kFloat32 : VectorDtype::kFloat16, rows, 32,
                        static_cast<uint32_t>(i * 1000 + salt));
  return w;
}

std::string Listing(const std::string& dir) {
  std::string out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    absl::StrAppend(&out, "\n  ", entry.path().filename().string(), " ",
                    AllocatedBytes(entry.path().string()));
  }
  return out;
}

class RerankSegmentTest : public ::testing::Test {
 protected:
  std::unique_ptr<ShardStore> Open(int64_t segment_bytes = int64_t{64} << 20) {
    ShardStoreOptions options;
    options.memory = NewSharedStoreMemory(8 << 20, 8 << 20);
    options.rerank_flush_bytes = 0;  // only FlushSegments moves rows: the tests say when
    options.rerank_segment_bytes = segment_bytes;
    auto store = ShardStore::Open(dir_, options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  // Writes documents 0..n-1 and returns their iids.
  std::vector<uint64_t> WriteDocs(ShardStore* store, int n) {
    std::vector<uint64_t> iids;
    for (int start = 0; start < n; start += 50) {
      std::vector<DocumentWrite> docs;
      for (int i = start; i < std::min(n, start + 50); ++i) docs.push_back(MakeDoc(i));
      auto result = store->Write(std::move(docs), {});
      EXPECT_TRUE(result.ok()) << result.status();
      if (!result.ok()) return iids;
      iids.insert(iids.end(), result->upserted_iids.begin(), result->upserted_iids.end());
    }
    return iids;
  }

  std::vector<std::string> SegmentFiles(SegmentKind kind = SegmentKind::kRerank) const {
    std::vector<std::string> out;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      uint32_t number = 0;
      if (ParseSegmentFileName(entry.path().filename().string(), kind, &number)) {
        out.push_back(entry.path().string());
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  int64_t SegmentFileBytes(SegmentKind kind = SegmentKind::kRerank) const {
    int64_t total = 0;
    for (const std::string& path : SegmentFiles(kind)) {
      total += static_cast<int64_t>(std::filesystem::file_size(path));
    }
    return total;
  }

  // The one segment of `kind` flipped in one byte, torn, then gone: each time the open fails with
  // DATA_LOSS naming the file (and saying `what`, and "checksum" for the flipped byte, "missing"
  // when gone); finally the original is put back.
  void ExpectDamagedSegmentRefused(SegmentKind kind, absl::string_view what) {
    const std::vector<std::string> files = SegmentFiles(kind);
    ASSERT_EQ(files.size(), 1u);
    const std::string& path = files[0];
    auto original = ReadWholeFile(path);
    ASSERT_TRUE(original.ok());
    ShardStoreOptions options;
    options.rerank_flush_bytes = 0;
    auto expect_refused = [&](absl::string_view damage, absl::string_view said) {
      SCOPED_TRACE(damage);
      auto opened = ShardStore::Open(dir_, options);
      ASSERT_FALSE(opened.ok());
      EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss) << opened.status();
      EXPECT_THAT(opened.status().message(), HasSubstr(path));
      EXPECT_THAT(opened.status().message(), HasSubstr(said));
    };
    std::string corrupt = *original;
    corrupt[corrupt.size() / 2] ^= 0x40;
    ASSERT_TRUE(WriteFileAtomically(path, {corrupt}).ok());
    expect_refused("one flipped byte", "checksum");
    expect_refused("one flipped byte", what);
    ASSERT_TRUE(WriteFileAtomically(path, {absl::string_view(*original).substr(0, 1000)}).ok());
    expect_refused("torn: the tail is missing", what);
    std::filesystem::remove(path);
    expect_refused("gone", "missing");
    ASSERT_TRUE(WriteFileAtomically(path, {*original}).ok());
  }

  TempDir root_{"rerank_segment_test"};
  const std::string dir_ = root_.path() + "/db";
};

// Every iid's rows through every read path equal `want` (the matrix as written), byte for byte.
void ExpectReadsEqual(const ShardStore& store, const std::vector<uint64_t>& iids,
                      const std::vector<std::optional<StoredMatrix>>& want) {
  auto copies = store.MultiGetRerank(iids);
  ASSERT_TRUE(copies.ok()) << copies.status();
  auto views = store.ReadRerank(iids);
  ASSERT_TRUE(views.ok()) << views.status();
  for (size_t i = 0; i < iids.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("iid ", iids[i]));
    ASSERT_EQ((*copies)[i].has_value(), want[i].has_value());
    ASSERT_EQ((*views)[i] != nullptr, want[i].has_value());
    if (!want[i].has_value()) continue;
    const StoredMatrixView& view = *(*views)[i];
    EXPECT_EQ(view.dtype, want[i]->dtype);
    EXPECT_EQ(view.rows, want[i]->rows);
    EXPECT_EQ(view.cols, want[i]->cols);
    EXPECT_TRUE(view.bytes == want[i]->bytes);
    EXPECT_EQ((*copies)[i]->rows, want[i]->rows);
    EXPECT_TRUE((*copies)[i]->bytes == want[i]->bytes);
    auto one = store.GetRerank(iids[i]);
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_TRUE(one->bytes == want[i]->bytes);
  }
}

TEST(SegmentFileName, RerankNamesRoundTripAndRejectOtherNames) {
  uint32_t number = 0;
  EXPECT_EQ(SegmentFileName(SegmentKind::kRerank, 12), "rerank-00000012.seg");
  EXPECT_TRUE(ParseSegmentFileName("rerank-00000012.seg", SegmentKind::kRerank, &number));
  EXPECT_EQ(number, 12u);
  for (const char* name :
       {"rerank-00000012.seg.tmp", "rerank-12.seg", "000012.sst", "rerank-0000001x.seg"}) {
    EXPECT_FALSE(ParseSegmentFileName(name, SegmentKind::kRerank, &number)) << name;
  }
}

TEST_F(RerankSegmentTest, ReadsEqualTheRocksDbPathByteForByte) {
  auto store = Open(/*segment_bytes=*/64 << 10);  // several segments
  const std::vector<uint64_t> iids = WriteDocs(store.get(), 300);
  ASSERT_EQ(iids.size(), 300u);
  // The old path (values in RocksDB) is the reference.
  auto before = store->MultiGetRerank(iids);
  ASSERT_TRUE(before.ok()) << before.status();
  std::vector<std::optional<StoredMatrix>> want = *before;
  for (int i = 0; i < 300; ++i) {
    ASSERT_TRUE(want[i].has_value());
    ASSERT_TRUE(want[i]->bytes == MakeDoc(i).rerank.bytes) << i;
  }
  ExpectReadsEqual(*store, iids, want);
  EXPECT_EQ(store->Stats().segments.rerank_segments, 0);

  ASSERT_TRUE(store->FlushSegments().ok());
  const ShardStoreStats stats = store->Stats();
  EXPECT_GT(stats.segments.rerank_segments, 1);
  EXPECT_EQ(stats.segments.rerank_unflushed_bytes, 0);
  EXPECT_EQ(static_cast<int64_t>(SegmentFiles().size()), stats.segments.rerank_segments);
  ExpectReadsEqual(*store, iids, want);
  // An unknown iid has none.
  auto none = store->ReadRerank(std::vector<uint64_t>{999999});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ((*none)[0], nullptr);

  // Documents written after the flush are read from RocksDB beside the segments'.
  std::vector<DocumentWrite> more;
  for (int i = 300; i < 310; ++i) more.push_back(MakeDoc(i));
  auto written = store->Write(std::move(more), {});
  ASSERT_TRUE(written.ok());
  std::vector<uint64_t> all = iids;
  all.insert(all.end(), written->upserted_iids.begin(), written->upserted_iids.end());
  for (int i = 300; i < 310; ++i) want.push_back(MakeDoc(i).rerank);
  ExpectReadsEqual(*store, all, want);

  store.reset();
  store = Open();
  ASSERT_NE(store, nullptr);
  ExpectReadsEqual(*store, all, want);
}

TEST_F(RerankSegmentTest, RowsAreStoredOnceAfterTheFlush) {
  auto store = Open();
  const std::vector<uint64_t> iids = WriteDocs(store.get(), 4000);
  int64_t row_bytes = 0;
  for (int i = 0; i < 4000; ++i) row_bytes += static_cast<int64_t>(MakeDoc(i).rerank.bytes.size());
  ASSERT_TRUE(store->Flush().ok());  // FlushSegments, then the memtables
  const ShardStoreStats stats = store->Stats();
  EXPECT_GE(stats.segments.rerank_segment_bytes, row_bytes);
  // What RocksDB keeps beside the segments is far less than the rows (their pointers, the other
  // column families, the logs), not a second copy.
  EXPECT_LT(stats.disk_bytes - stats.segments.rerank_segment_bytes, row_bytes / 2)
      << "disk " << stats.disk_bytes << ", segments " << stats.segments.rerank_segment_bytes
      << ", rows " << row_bytes << Listing(dir_);
}

TEST_F(RerankSegmentTest, CorruptTruncatedOrMissingSegmentIsDataLossNamingIt) {
  {
    auto store = Open();
    WriteDocs(store.get(), 100);
    ASSERT_TRUE(store->FlushSegments().ok());
  }
  ExpectDamagedSegmentRefused(SegmentKind::kRerank, "rerank segment");
  // Put back, it opens again with every document.
  auto store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Stats().documents, 100);
}

TEST_F(RerankSegmentTest, ChecksummedReadsCatchRowsThatWentBadAfterOpen) {
  auto store = Open();
  const std::vector<uint64_t> iids = WriteDocs(store.get(), 20);
  ASSERT_TRUE(store->FlushSegments().ok());
  ASSERT_EQ(SegmentFiles().size(), 1u);
  // Overwrite the file's bytes in place (the mapping is shared, so the store sees it): every row
  // byte after the header.
  const std::string path = SegmentFiles()[0];
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  const std::string junk(256, '\x7f');
  ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), 64), static_cast<ssize_t>(junk.size()));
  ::close(fd);
  const uint64_t first = iids[1];  // iid of doc-1 (doc-0 has no rows), the first in the segment
  auto copy = store->GetRerank(first);
  ASSERT_FALSE(copy.ok());
  EXPECT_EQ(copy.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(copy.status().message(), HasSubstr(path));
}

TEST_F(RerankSegmentTest, UncommittedSegmentFilesAreDeletedAtOpen) {
  {
    auto store = Open();
    WriteDocs(store.get(), 50);
    ASSERT_TRUE(store->FlushSegments().ok());
  }
  ASSERT_EQ(SegmentFiles().size(), 1u);
  const std::string committed = SegmentFiles()[0];
  // What a crash before a commit leaves: a whole segment nobody points to, and a temporary.
  std::filesystem::copy_file(committed, dir_ + "/" + SegmentFileName(SegmentKind::kRerank, 77));
  { std::ofstream(dir_ + "/" + SegmentFileName(SegmentKind::kRerank, 78) + ".tmp") << "partial"; }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(SegmentFiles(), std::vector<std::string>{committed});
  EXPECT_FALSE(
      std::filesystem::exists(dir_ + "/" + SegmentFileName(SegmentKind::kRerank, 78) + ".tmp"));
  EXPECT_EQ(store->Stats().documents, 50);
  // Numbers go on past every segment file seen, so the deleted one's is not reused.
  std::vector<DocumentWrite> more;
  more.push_back(MakeDoc(1000));
  ASSERT_TRUE(store->Write(std::move(more), {}).ok());
  ASSERT_TRUE(store->FlushSegments().ok());
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/" + SegmentFileName(SegmentKind::kRerank, 78)));
}

TEST_F(RerankSegmentTest, DeletesGiveTheirSpaceBack) {
  auto store = Open();
  const std::vector<uint64_t> iids = WriteDocs(store.get(), 200);
  ASSERT_TRUE(store->FlushSegments().ok());
  ASSERT_EQ(SegmentFiles().size(), 1u);
  const std::string first = SegmentFiles()[0];
  const int64_t full = SegmentFileBytes();

  // Views taken now keep reading the segment after it is replaced and unlinked.
  auto held = store->ReadRerank(iids);
  ASSERT_TRUE(held.ok());

  // Delete three quarters: past the dead fraction (one half), the segment is rewritten.
  std::vector<std::string> deletes;
  for (int i = 0; i < 150; ++i) deletes.push_back(absl::StrCat("doc-", i));
  ASSERT_TRUE(store->Write({}, deletes).ok());
  EXPECT_EQ(SegmentFileBytes(), full) << "nothing is rewritten before maintenance runs";
  ASSERT_TRUE(store->FlushSegments().ok());
  ASSERT_EQ(SegmentFiles().size(), 1u);
  EXPECT_NE(SegmentFiles()[0], first);
  EXPECT_FALSE(std::filesystem::exists(first));
  const int64_t rewritten = SegmentFileBytes();
  EXPECT_LT(rewritten, full / 2) << "full " << full << ", rewritten " << rewritten;
  EXPECT_EQ(store->Stats().segments.rerank_segment_bytes, rewritten);

  std::vector<std::optional<StoredMatrix>> want(200);
  for (int i = 150; i < 200; ++i) want[i] = MakeDoc(i).rerank;
  ExpectReadsEqual(*store, iids, want);
  for (int i = 0; i < 200; ++i) {
    if ((*held)[i] == nullptr) continue;
    EXPECT_TRUE((*held)[i]->bytes == MakeDoc(i).rerank.bytes) << "held view of doc-" << i;
  }

  // Deleting the rest removes the last segment file.
  deletes.clear();
  for (int i = 150; i < 200; ++i) deletes.push_back(absl::StrCat("doc-", i));
  ASSERT_TRUE(store->Write({}, deletes).ok());
  ASSERT_TRUE(store->FlushSegments().ok());
  EXPECT_TRUE(SegmentFiles().empty());
  EXPECT_EQ(store->Stats().segments.rerank_segments, 0);

  store.reset();
  store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Stats().documents, 0);
}

TEST_F(RerankSegmentTest, BackgroundFlushMovesRowsWhileWritesGoOn) {
  ShardStoreOptions options;
  options.memory = NewSharedStoreMemory(8 << 20, 8 << 20);
  options.rerank_flush_bytes = 16 << 10;
  options.rerank_segment_bytes = 64 << 10;
  auto opened = ShardStore::Open(dir_, options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto store = *std::move(opened);
  std::vector<uint64_t> iids;
  std::vector<std::optional<StoredMatrix>> want;
  for (int round = 0; round < 20; ++round) {
    std::vector<DocumentWrite> docs;
    for (int i = 0; i < 20; ++i) docs.push_back(MakeDoc(round * 20 + i));
    auto written = store->Write(std::move(docs), {});
    ASSERT_TRUE(written.ok());
    for (int i = 0; i < 20; ++i) {
      iids.push_back(written->upserted_iids[i]);
      want.push_back(MakeDoc(round * 20 + i).rerank);
    }
    // Reads at any moment see every document, wherever its rows are.
    ExpectReadsEqual(*store, iids, want);
  }
  store.reset();  // stops the thread, whatever it was doing
  store = Open();
  ASSERT_NE(store, nullptr);
  ExpectReadsEqual(*store, iids, want);
  EXPECT_GT(store->Stats().segments.rerank_segments, 0);
}

TEST_F(RerankSegmentTest, CheckpointCarriesTheSegments) {
  auto store = Open();
  const std::vector<uint64_t> iids = WriteDocs(store.get(), 60);
  ASSERT_TRUE(store->FlushSegments().ok());
  const std::string copy = root_.path() + "/copy";
  ASSERT_TRUE(store->Checkpoint(copy, /*sequence=*/nullptr).ok());
  ShardStoreOptions options;
  options.rerank_flush_bytes = 0;
  auto reopened = ShardStore::Open(copy, options);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  std::vector<std::optional<StoredMatrix>> want;
  for (int i = 0; i < 60; ++i) want.push_back(MakeDoc(i).rerank);
  ExpectReadsEqual(**reopened, iids, want);
}

// The codes of document i under `generation`: deterministic, 1,000–3,999 bytes.
std::string CodesOf(int i, uint32_t generation) {
  std::string codes(1000 + (i * 13) % 3000, '\0');
  for (size_t b = 0; b < codes.size(); ++b) {
    codes[b] = static_cast<char>((i * 31 + b * 7 + generation * 101) & 0xff);
  }
  return codes;
}

// Documents 0..n-1 (MakeDoc), each with its codes of generation 1.
std::vector<uint64_t> WriteCodedDocs(ShardStore* store, int n) {
  std::vector<uint64_t> iids;
  for (int start = 0; start < n; start += 50) {
    std::vector<DocumentWrite> docs;
    for (int i = start; i < std::min(n, start + 50); ++i) {
      DocumentWrite w = MakeDoc(i);
      w.codes = CodesOf(i, 1);
      w.code_generation = 1;
      docs.push_back(std::move(w));
    }
    auto result = store->Write(std::move(docs), {});
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return iids;
    iids.insert(iids.end(), result->upserted_iids.begin(), result->upserted_iids.end());
  }
  return iids;
}

// Every iid's codes under `generation` through every read path (ReadCodes in place, MultiGetCodes
// copied, ForEachCodes streamed) equal `want` (std::nullopt: none).
void ExpectCodesEqual(const ShardStore& store, uint32_t generation,
                      const std::vector<uint64_t>& iids,
                      const std::vector<std::optional<std::string>>& want) {
  auto copies = store.MultiGetCodes(generation, iids);
  ASSERT_TRUE(copies.ok()) << copies.status();
  auto views = store.ReadCodes(generation, iids);
  ASSERT_TRUE(views.ok()) << views.status();
  std::map<uint64_t, std::string> streamed;
  ASSERT_TRUE(store
                  .ForEachCodes(generation,
                                [&](uint64_t iid, absl::string_view codes) {
                                  EXPECT_TRUE(streamed.emplace(iid, std::string(codes)).second)
                                      << "iid " << iid << " streamed twice";
                                  return absl::OkStatus();
                                })
                  .ok());
  size_t present = 0;
  for (size_t i = 0; i < iids.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("generation ", generation, " iid ", iids[i]));
    ASSERT_EQ((*copies)[i].has_value(), want[i].has_value());
    ASSERT_EQ((*views)[i] != nullptr, want[i].has_value());
    ASSERT_EQ(streamed.count(iids[i]), want[i].has_value() ? 1u : 0u);
    if (!want[i].has_value()) continue;
    ++present;
    EXPECT_TRUE(*(*copies)[i] == *want[i]);
    EXPECT_TRUE(*(*views)[i] == *want[i]);
    EXPECT_TRUE(streamed.at(iids[i]) == *want[i]);
  }
  EXPECT_EQ(streamed.size(), present);
}

// The resident bytes (Rss in /proc/self/smaps) of this process's mappings of `path`.
int64_t ResidentBytesOf(const std::string& file) {
  // As the kernel names it ("/tmp//x" is "/tmp/x" there).
  const std::string path = std::filesystem::path(file).lexically_normal().string();
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_mapping = false;
  int64_t total = 0;
  while (std::getline(smaps, line)) {
    // A mapping's header line: "start-end perms offset dev inode  pathname".
    const size_t dash = line.find('-');
    if (dash != std::string::npos && dash > 0 &&
        line.find_first_not_of("0123456789abcdef") == dash) {
      in_mapping = line.size() >= path.size() &&

                   line.compare(line.size() - path.size(), path.size(), path) == 0;
      continue;
    }
    if (in_mapping && line.rfind("Rss:", 0) == 0) {
      total += std::stoll(line.substr(4)) * 1024;  // "Rss:   123 kB"
    }
  }
  return total;
}

TEST(SegmentFileName, CodesNamesAreTheirOwn) {
  uint32_t number = 0;
  EXPECT_EQ(SegmentFileName(SegmentKind::kCodes, 13), "codes-00000013.seg");
  EXPECT_TRUE(ParseSegmentFileName("codes-00000013.seg", SegmentKind::kCodes, &number));
  EXPECT_EQ(number, 13u);
  EXPECT_FALSE(ParseSegmentFileName("codes-00000013.seg", SegmentKind::kRerank, &number));
  EXPECT_FALSE(ParseSegmentFileName("rerank-00000013.seg", SegmentKind::kCodes, &number));
  EXPECT_FALSE(ParseSegmentFileName("codes-00000013.seg.tmp", SegmentKind::kCodes, &number));
}

// Codes flushed into codes segments read back, in place and copied, exactly as written, from the
// generation asked for only; they are then stored once (RocksDB keeps pointers), and a reopen
// reads them the same.
TEST_F(RerankSegmentTest, CodesFlushIntoSegmentsAndReadInPlaceAsWritten) {
  auto store = Open();
  const std::vector<uint64_t> iids = WriteCodedDocs(store.get(), 3000);
  std::vector<std::pair<uint64_t, std::string>> second;
  for (int i = 0; i < 3000; i += 2) second.emplace_back(iids[i], CodesOf(i, 2));
  ASSERT_TRUE(store->PutCodes(2, second, {}).ok());
  std::vector<std::optional<std::string>> want1(3000), want2(3000);
  int64_t code_bytes = 0;
  for (int i = 0; i < 3000; ++i) {
    want1[i] = CodesOf(i, 1);
    if (i % 2 == 0) want2[i] = CodesOf(i, 2);
    code_bytes += static_cast<int64_t>(want1[i]->size() + (want2[i] ? want2[i]->size() : 0));
  }
  ExpectCodesEqual(*store, 1, iids, want1);  // from RocksDB
  EXPECT_EQ(store->Stats().segments.code_unflushed_bytes, code_bytes);
  EXPECT_EQ(store->Stats().segments.code_segments, 0);

  ASSERT_TRUE(store->Flush().ok());  // FlushSegments, then the memtables
  ExpectCodesEqual(*store, 1, iids, want1);
  ExpectCodesEqual(*store, 2, iids, want2);
  ExpectCodesEqual(*store, 3, iids, std::vector<std::optional<std::string>>(3000));
  const ShardStoreStats stats = store->Stats();
  EXPECT_EQ(stats.segments.code_unflushed_bytes, 0);
  EXPECT_GE(stats.segments.code_segments, 2);  // one generation per segment
  // Each segment is its header (64 bytes), its documents' codes each padded to a multiple of 4
  // bytes (not of 64: CodesOf's sizes mostly are not), a 32-byte table entry each and the
  // trailer (28).
  int64_t padded_bytes = 0;
  for (int i = 0; i < 3000; ++i) {
    for (const auto& codes : {want1[i], want2[i]}) {
      if (codes) padded_bytes += (static_cast<int64_t>(codes->size()) + 3) / 4 * 4;
    }
  }
  EXPECT_EQ(stats.segments.code_segment_bytes,
            padded_bytes + stats.segments.code_segments * (64 + 28) + (3000 + 1500) * 32);
  EXPECT_EQ(stats.segments.code_segment_bytes, SegmentFileBytes(SegmentKind::kCodes));
  // Stored once: what RocksDB keeps beside the segments (pointers, records, rows, logs) is far
  // less than the codes.
  EXPECT_LT(
      stats.disk_bytes - stats.segments.code_segment_bytes - stats.segments.rerank_segment_bytes,
      code_bytes / 2)
      << "disk " << stats.disk_bytes << ", codes segments " << stats.segments.code_segment_bytes
      << ", codes " << code_bytes << Listing(dir_);

  store.reset();
  store = Open();
  ASSERT_NE(store, nullptr);
  ExpectCodesEqual(*store, 1, iids, want1);
  ExpectCodesEqual(*store, 2, iids, want2);
  EXPECT_EQ(store->Stats().segments.code_unflushed_bytes, 0);
}

// A PutCodes over codes already in a segment replaces them (the segment's copy is dead), and its
// removals delete them.
// One group that writes and removes a document (an id upserted twice in one call; an upsert and a
// delete of one id in one call) leaves neither its rows nor its codes waiting for a flush that can
// never move them: after the flush nothing is unflushed, and only the surviving copy is read.
TEST_F(RerankSegmentTest, AWriteAndRemovalInOneGroupLeaveNothingUnflushed) {
  auto store = Open();
  store->SetCodeGenerations({1});
  auto coded = [](int i) {
    DocumentWrite w = MakeDoc(i);
    w.codes = CodesOf(i, 1);
    w.code_generation = 1;
    return w;
  };
  std::vector<DocumentWrite> twice;
  twice.push_back(coded(7));
  twice.push_back(coded(7));
  auto first = store->Write(std::move(twice), {});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->upserted_iids.size(), 2u);
  std::vector<DocumentWrite> then_deleted;
  then_deleted.push_back(coded(8));
  auto second = store->Write(std::move(then_deleted), {"doc-8"});
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(store->FlushSegments().ok());
  const ShardStoreStats stats = store->Stats();
  EXPECT_EQ(stats.segments.rerank_unflushed_bytes, 0);
  EXPECT_EQ(stats.segments.code_unflushed_bytes, 0);
  const std::vector<uint64_t> iids = {first->upserted_iids[0], first->upserted_iids[1],
                                      second->upserted_iids[0]};
  ExpectCodesEqual(*store, 1, iids, {std::nullopt, CodesOf(7, 1), std::nullopt});
  ExpectReadsEqual(*store, iids, {std::nullopt, MakeDoc(7).rerank, std::nullopt});
}

TEST_F(RerankSegmentTest, PutCodesReplacesAndRemovesFlushedCodes) {
  auto store = Open();
  const std::vector<uint64_t> iids = WriteCodedDocs(store.get(), 10);
  ASSERT_TRUE(store->FlushSegments().ok());
  ASSERT_TRUE(store->PutCodes(1, {{iids[3], "new codes of 3"}}, {iids[4]}).ok());
  std::vector<std::optional<std::string>> want(10);
  for (int i = 0; i < 10; ++i) want[i] = CodesOf(i, 1);
  want[3] = "new codes of 3";
  want[4] = std::nullopt;
  ExpectCodesEqual(*store, 1, iids, want);
  ASSERT_TRUE(store->FlushSegments().ok());
  ExpectCodesEqual(*store, 1, iids, want);
  store.reset();
  store = Open();
  ASSERT_NE(store, nullptr);
  ExpectCodesEqual(*store, 1, iids, want);
}

TEST_F(RerankSegmentTest, CorruptTruncatedOrMissingCodesSegmentIsDataLossNamingIt) {
  {
    auto store = Open();
    WriteCodedDocs(store.get(), 100);
    ASSERT_TRUE(store->FlushSegments().ok());
  }
  ExpectDamagedSegmentRefused(SegmentKind::kCodes, "codes segment");
  // Put back, it opens again with every document's codes.
  auto store = Open();
  ASSERT_NE(store, nullptr);
  int64_t streamed = 0;
  ASSERT_TRUE(store
                  ->ForEachCodes(1,
                                 [&](uint64_t, absl::string_view) {
                                   ++streamed;
                                   return absl::OkStatus();
                                 })
                  .ok());
  EXPECT_EQ(streamed, 100);
}

// Dropping a generation deletes its codes segments (views taken before still read them) and its
// keys, durably; the kept generation is untouched.
TEST_F(RerankSegmentTest, DroppingAGenerationDeletesItsSegments) {
  auto store = Open();
  const std::vector<uint64_t> iids = WriteCodedDocs(store.get(), 200);
  ASSERT_TRUE(store->FlushSegments().ok());
  const std::vector<std::string> first = SegmentFiles(SegmentKind::kCodes);
  ASSERT_EQ(first.size(), 1u);
  std::vector<std::pair<uint64_t, std::string>> second;
  for (int i = 0; i < 200; ++i) second.emplace_back(iids[i], CodesOf(i, 2));
  ASSERT_TRUE(store->PutCodes(2, second, {}).ok());
  ASSERT_TRUE(store->FlushSegments().ok());
  ASSERT_EQ(SegmentFiles(SegmentKind::kCodes).size(), 2u);
  auto held = store->ReadCodes(1, iids);
  ASSERT_TRUE(held.ok());

  ASSERT_TRUE(store->DropCodeGenerationsExcept(2).ok());
  EXPECT_FALSE(std::filesystem::exists(first[0]));
  ASSERT_EQ(SegmentFiles(SegmentKind::kCodes).size(), 1u);
  EXPECT_EQ(store->Stats().segments.code_segments, 1);
  std::vector<std::optional<std::string>> want2(200);
  for (int i = 0; i < 200; ++i) want2[i] = CodesOf(i, 2);
  ExpectCodesEqual(*store, 1, iids, std::vector<std::optional<std::string>>(200));
  ExpectCodesEqual(*store, 2, iids, want2);
  for (int i = 0; i < 200; ++i) {
    ASSERT_NE((*held)[i], nullptr);
    EXPECT_TRUE(*(*held)[i] == CodesOf(i, 1)) << "held view of doc-" << i;
  }
  store.reset();
  store = Open();
  ASSERT_NE(store, nullptr);
  ExpectCodesEqual(*store, 1, iids, std::vector<std::optional<std::string>>(200));
  ExpectCodesEqual(*store, 2, iids, want2);
}

// Removing documents kills their codes in the segment (the generations set by
// SetCodeGenerations); past the dead fraction the segment is rewritten without them, and once none
// is left it is deleted.
TEST_F(RerankSegmentTest, DeletesGiveTheirCodesSpaceBack) {
  auto store = Open();
  store->SetCodeGenerations({1});
  const std::vector<uint64_t> iids = WriteCodedDocs(store.get(), 200);
  ASSERT_TRUE(store->FlushSegments().ok());
  ASSERT_EQ(SegmentFiles(SegmentKind::kCodes).size(), 1u);
  const std::string first = SegmentFiles(SegmentKind::kCodes)[0];
  const int64_t full = SegmentFileBytes(SegmentKind::kCodes);
  auto held = store->ReadCodes(1, iids);
  ASSERT_TRUE(held.ok());

  std::vector<std::string> deletes;
  for (int i = 0; i < 150; ++i) deletes.push_back(absl::StrCat("doc-", i));
  ASSERT_TRUE(store->Write({}, deletes).ok());
  ASSERT_TRUE(store->FlushSegments().ok());
  ASSERT_EQ(SegmentFiles(SegmentKind::kCodes).size(), 1u);
  EXPECT_NE(SegmentFiles(SegmentKind::kCodes)[0], first);
  EXPECT_FALSE(std::filesystem::exists(first));
  const int64_t rewritten = SegmentFileBytes(SegmentKind::kCodes);
  EXPECT_LT(rewritten, full / 2) << "full " << full << ", rewritten " << rewritten;
  EXPECT_EQ(store->Stats().segments.code_segment_bytes, rewritten);
  std::vector<std::optional<std::string>> want(200);
  for (int i = 150; i < 200; ++i) want[i] = CodesOf(i, 1);
  ExpectCodesEqual(*store, 1, iids, want);
  for (int i = 0; i < 200; ++i) {
    EXPECT_TRUE(*(*held)[i] == CodesOf(i, 1)) << "held view of doc-" << i;
  }

  deletes.clear();
  for (int i = 150; i < 200; ++i) deletes.push_back(absl::StrCat("doc-", i));
  ASSERT_TRUE(store->Write({}, deletes).ok());
  ASSERT_TRUE(store->FlushSegments().ok());
  EXPECT_TRUE(SegmentFiles(SegmentKind::kCodes).empty());
  EXPECT_EQ(store->Stats().segments.code_segments, 0);
}

TEST_F(RerankSegmentTest, CheckpointCarriesTheCodesSegments) {
  auto store = Open();
  const std::vector<uint64_t> iids = WriteCodedDocs(store.get(), 60);
  ASSERT_TRUE(store->FlushSegments().ok());
  ASSERT_EQ(SegmentFiles(SegmentKind::kCodes).size(), 1u);
  const std::string copy = root_.path() + "/copy";
  ASSERT_TRUE(store->Checkpoint(copy, /*sequence=*/nullptr).ok());
  ShardStoreOptions options;
  options.rerank_flush_bytes = 0;
  auto reopened = ShardStore::Open(copy, options);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  std::vector<std::optional<std::string>> want;
  for (int i = 0; i < 60; ++i) want.push_back(CodesOf(i, 1));
  ExpectCodesEqual(**reopened, 1, iids, want);
}

// Opening a store verifies its segments without making their pages resident in the process, and
// streaming a generation's codes (ForEachCodes, as a shard's open does) leaves none resident
// either; a read in place does bring its pages in.
TEST_F(RerankSegmentTest, OpenAndCodeStreamingLeaveSegmentPagesOutOfTheProcess) {
  {
    auto store = Open();
    WriteCodedDocs(store.get(), 3000);  // ~7.5 MB of codes, ~3 MB of rows
    ASSERT_TRUE(store->FlushSegments().ok());
  }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> rerank = SegmentFiles(SegmentKind::kRerank);
  const std::vector<std::string> codes = SegmentFiles(SegmentKind::kCodes);
  ASSERT_EQ(rerank.size(), 1u);
  ASSERT_EQ(codes.size(), 1u);
  const int64_t rerank_bytes = SegmentFileBytes(SegmentKind::kRerank);
  const int64_t code_bytes = SegmentFileBytes(SegmentKind::kCodes);
  ASSERT_GT(rerank_bytes, 1 << 20);
  EXPECT_EQ(ResidentBytesOf(rerank[0]), 0) << "of " << rerank_bytes;
  EXPECT_EQ(ResidentBytesOf(codes[0]), 0) << "of " << code_bytes;

  int64_t streamed = 0;
  ASSERT_TRUE(store
                  ->ForEachCodes(1,
                                 [&](uint64_t, absl::string_view bytes) {
                                   streamed += static_cast<int64_t>(bytes.size());
                                   return absl::OkStatus();
                                 })
                  .ok());
  EXPECT_GT(streamed, code_bytes / 2);
  EXPECT_EQ(ResidentBytesOf(codes[0]), 0) << "of " << code_bytes;

  // The check can see residency: reading every row in place brings the pages in.
  std::vector<uint64_t> iids;
  ASSERT_TRUE(store
                  ->ForEachDocument([&](const DocumentRecord& record) {
                    iids.push_back(record.iid);
                    return absl::OkStatus();
                  })
                  .ok());
  auto views = store->ReadRerank(iids);
  ASSERT_TRUE(views.ok());
  uint64_t sum = 0;
  for (const auto& view : *views) {
    for (char c : view->bytes) sum += static_cast<uint8_t>(c);
  }
  EXPECT_GT(sum, 0u);
  EXPECT_GT(ResidentBytesOf(rerank[0]), rerank_bytes / 2);
}

}  // namespace
}  // namespace tessera::internal
