// Rerank segments through ShardStore (the only writer of them): reads equal the RocksDB path byte
// for byte, a corrupt, truncated or missing segment is DATA_LOSS naming it, uncommitted files are
// deleted, deletes give their space back, readers keep a replaced segment's mapping, checkpoints
// carry the segments. The crash safety of the flush is in shard_store_crash_test.
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

  std::vector<std::string> SegmentFiles() const {
    std::vector<std::string> out;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      uint32_t number = 0;
      if (ParseSegmentFileName(entry.path().filename().string(), SegmentKind::kRerank, &number)) {
        out.push_back(entry.path().string());
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  int64_t SegmentFileBytes() const {
    int64_t total = 0;
    for (const std::string& path : SegmentFiles()) {
      total += static_cast<int64_t>(std::filesystem::file_size(path));
    }
    return total;
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

TEST(RerankSegmentFileName, RoundTripsAndRejectsOtherNames) {
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
  EXPECT_EQ(store->Stats().rerank_segments, 0);

  ASSERT_TRUE(store->FlushSegments().ok());
  const ShardStoreStats stats = store->Stats();
  EXPECT_GT(stats.rerank_segments, 1);
  EXPECT_EQ(stats.rerank_unflushed_bytes, 0);
  EXPECT_EQ(static_cast<int64_t>(SegmentFiles().size()), stats.rerank_segments);
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
  EXPECT_GE(stats.rerank_segment_bytes, row_bytes);
  // What RocksDB keeps beside the segments is far less than the rows (their pointers, the other
  // column families, the logs), not a second copy.
  EXPECT_LT(stats.disk_bytes - stats.rerank_segment_bytes, row_bytes / 2)
      << "disk " << stats.disk_bytes << ", segments " << stats.rerank_segment_bytes << ", rows "
      << row_bytes << Listing(dir_);
}

TEST_F(RerankSegmentTest, CorruptTruncatedOrMissingSegmentIsDataLossNamingIt) {
  {
    auto store = Open();
    WriteDocs(store.get(), 100);
    ASSERT_TRUE(store->FlushSegments().ok());
  }
  const std::vector<std::string> files = SegmentFiles();
  ASSERT_EQ(files.size(), 1u);
  const std::string& path = files[0];
  auto original = ReadWholeFile(path);
  ASSERT_TRUE(original.ok());
  ShardStoreOptions options;
  options.rerank_flush_bytes = 0;

  // One flipped byte among the rows.
  std::string corrupt = *original;
  corrupt[corrupt.size() / 2] ^= 0x40;
  ASSERT_TRUE(WriteFileAtomically(path, {corrupt}).ok());
  auto opened = ShardStore::Open(dir_, options);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss) << opened.status();
  EXPECT_THAT(opened.status().message(), HasSubstr(path));
  EXPECT_THAT(opened.status().message(), HasSubstr("checksum"));

  // Torn: the tail is missing.
  ASSERT_TRUE(WriteFileAtomically(path, {absl::string_view(*original).substr(0, 1000)}).ok());
  opened = ShardStore::Open(dir_, options);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss) << opened.status();
  EXPECT_THAT(opened.status().message(), HasSubstr(path));

  // Gone.
  std::filesystem::remove(path);
  opened = ShardStore::Open(dir_, options);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss) << opened.status();
  EXPECT_THAT(opened.status().message(), HasSubstr(path));

  // Put back, it opens again with every document.
  ASSERT_TRUE(WriteFileAtomically(path, {*original}).ok());
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
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/" + SegmentFileName(SegmentKind::kRerank, 78) + ".tmp"));
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
  EXPECT_EQ(store->Stats().rerank_segment_bytes, rewritten);

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
  EXPECT_EQ(store->Stats().rerank_segments, 0);

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
  EXPECT_GT(store->Stats().rerank_segments, 0);
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

}  // namespace
}  // namespace tessera::internal
