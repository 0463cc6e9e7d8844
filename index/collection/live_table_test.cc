#include "index/collection/live_table.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tessera::internal {
namespace {

// A rerank matrix of `rows` × 4 fp32 values (16 bytes a row), filled with `fill`.
std::shared_ptr<const StoredMatrix> Rows(int64_t rows, char fill) {
  return std::make_shared<const StoredMatrix>(
      StoredMatrix{VectorDtype::kFloat32, rows, 4, std::string(rows * 16, fill)});
}

LiveDocument Document(const std::string& id, int64_t tokens, int64_t rows, char fill,
                      const std::string& colour) {
  LiveDocument document;
  document.external_id = id;
  document.attributes = {{"colour", colour}};
  document.num_tokens = tokens;
  document.num_rerank_vectors = rows;
  document.rerank = Rows(rows, fill);
  return document;
}

// A committed write of `documents` as the store reports it: upsert i becomes iids[i] with
// versions[i], replacing replaced[i] (0: none).
WriteResult Committed(std::vector<uint64_t> iids, std::vector<uint64_t> versions,
                      std::vector<uint64_t> replaced, std::vector<uint64_t> deleted = {}) {
  WriteResult result;
  result.upserted_iids = std::move(iids);
  result.versions = std::move(versions);
  result.replaced_iids = std::move(replaced);
  result.deleted_iids = std::move(deleted);
  return result;
}

std::string Colour(const LiveEntry& entry) {
  const auto it = entry.attributes.find("colour");
  return it == entry.attributes.end() ? "<none>" : std::get<std::string>(it->second);
}

// The one-pass lookup of a mixed batch (live, resident or not, never live, removed), after
// upserts, a replacement and a delete, and the budget's accounting through them.
TEST(LiveTable, LookupDescribesAMixedBatchInOnePass) {
  // 160 bytes: a 2-row document takes 32, a 4-row one 64.
  LiveTable table(160, std::nullopt);
  std::vector<LiveDocument> first;
  first.push_back(Document("a", 5, 2, 'a', "red"));    // iid 1: 32 bytes, resident (32)
  first.push_back(Document("b", 7, 4, 'b', "blue"));   // iid 2: 64 bytes, resident (96)
  first.push_back(Document("c", 9, 4, 'c', "green"));  // iid 3: 64 bytes, resident (160)
  first.push_back(Document("d", 3, 2, 'd', "red"));    // iid 4: 32 bytes, over budget
  ASSERT_TRUE(
      table.Apply(std::move(first), Committed({1, 2, 3, 4}, {1, 1, 1, 1}, {0, 0, 0, 0})).ok());
  LiveTotals totals = table.Totals();
  EXPECT_EQ(totals.documents, 4);
  EXPECT_EQ(totals.original_tokens, 5 + 7 + 9 + 3);
  EXPECT_EQ(totals.rerank_vectors, 2 + 4 + 4 + 2);
  EXPECT_EQ(totals.resident_bytes, 160);

  // "b" again (iid 5 replaces 2, version 2, 2 rows: 32 bytes), and "c" deleted (iid 3).
  std::vector<LiveDocument> second;
  second.push_back(Document("b", 4, 2, 'B', "yellow"));
  ASSERT_TRUE(table.Apply(std::move(second), Committed({5}, {2}, {2}, {3})).ok());
  totals = table.Totals();
  EXPECT_EQ(totals.documents, 3);  // a, d, b
  EXPECT_EQ(totals.original_tokens, 5 + 3 + 4);
  EXPECT_EQ(totals.rerank_vectors, 2 + 2 + 2);
  EXPECT_EQ(totals.resident_bytes, 32 + 32);  // a and the new b; d never became resident

  const std::vector<uint64_t> batch = {4, 99, 5, 2, 1, 3};
  const std::vector<std::optional<LiveEntry>> entries = table.Lookup(batch, true);
  ASSERT_EQ(entries.size(), batch.size());
  ASSERT_TRUE(entries[0].has_value());
  EXPECT_EQ(entries[0]->external_id, "d");
  EXPECT_EQ(entries[0]->version, 1u);
  EXPECT_EQ(Colour(*entries[0]), "red");
  EXPECT_EQ(entries[0]->rerank, nullptr) << "iid 4 did not fit in the budget";
  EXPECT_FALSE(entries[1].has_value()) << "iid 99 was never live";
  ASSERT_TRUE(entries[2].has_value());
  EXPECT_EQ(entries[2]->external_id, "b");
  EXPECT_EQ(entries[2]->version, 2u);
  EXPECT_EQ(Colour(*entries[2]), "yellow");
  ASSERT_NE(entries[2]->rerank, nullptr);
  EXPECT_EQ(entries[2]->rerank->rows, 2);
  EXPECT_EQ(entries[2]->rerank->bytes, std::string(32, 'B')) << "the new version's rows";
  EXPECT_FALSE(entries[3].has_value()) << "iid 2 was replaced by iid 5";
  ASSERT_TRUE(entries[4].has_value());
  EXPECT_EQ(entries[4]->external_id, "a");
  EXPECT_EQ(Colour(*entries[4]), "red");
  ASSERT_NE(entries[4]->rerank, nullptr);
  EXPECT_EQ(entries[4]->rerank->bytes, std::string(32, 'a'));
  EXPECT_FALSE(entries[5].has_value()) << "iid 3 was deleted";

  // Without attributes: the same ids and versions, no attributes copied.
  const std::vector<std::optional<LiveEntry>> bare = table.Lookup(batch, false);
  ASSERT_TRUE(bare[2].has_value());
  EXPECT_EQ(bare[2]->external_id, "b");
  EXPECT_EQ(bare[2]->version, 2u);
  EXPECT_TRUE(bare[2]->attributes.empty());

  // The freed bytes take a new document (iid 6, 64 bytes: 64 + 64 ≤ 160) but not iid 4, which
  // stays non-resident.
  std::vector<LiveDocument> third;
  third.push_back(Document("e", 1, 4, 'e', "blue"));
  ASSERT_TRUE(table.Apply(std::move(third), Committed({6}, {1}, {0})).ok());
  EXPECT_EQ(table.Totals().resident_bytes, 128);
  const std::vector<std::shared_ptr<const StoredMatrix>> resident = table.Resident({4, 6, 3});
  EXPECT_EQ(resident[0], nullptr);
  ASSERT_NE(resident[1], nullptr);
  EXPECT_EQ(resident[1]->rows, 4);
  EXPECT_EQ(resident[2], nullptr);

  // Dropping rows (rerank from codes) gives back only what was resident.
  table.DropResident({6, 4, 99});
  totals = table.Totals();
  EXPECT_EQ(totals.resident_bytes, 64);
  EXPECT_EQ(totals.documents, 4) << "dropping rows keeps the documents";
  EXPECT_EQ(table.Lookup({6}, false)[0]->rerank, nullptr);

  EXPECT_EQ(table.LiveIidsAbove(0), (std::vector<uint64_t>{1, 4, 5, 6}));
  EXPECT_EQ(table.LiveIidsAbove(4), (std::vector<uint64_t>{5, 6}));
  EXPECT_EQ(table.NotLive({1, 2, 3, 6, 7}), (std::vector<uint64_t>{2, 3, 7}));
  EXPECT_EQ(table.RerankVectorsOf({1, 3, 6}), 2 + 4);
}

// At open: stored documents, then their rows made resident in iid order until the budget is
// spent; rows-less documents (reranked from codes) are skipped, a missing matrix is NOT_FOUND.
TEST(LiveTable, AddResidentStopsAtTheBudget) {
  LiveTable table(80, std::nullopt);
  for (uint64_t iid = 1; iid <= 4; ++iid) {
    DocumentRecord record;
    record.iid = iid;
    record.external_id = "doc" + std::to_string(iid);
    record.version = iid;
    record.num_tokens = 10;
    record.member_offsets = {0, 5, 10};  // 2 rerank vectors
    ASSERT_TRUE(table.AddStored(record).ok());
  }
  EXPECT_EQ(table.Totals().rerank_vectors, 8);
  EXPECT_EQ(table.Totals().resident_bytes, 0);

  std::vector<std::optional<StoredMatrix>> matrices;
  matrices.push_back(*Rows(2, '1'));                                  // 32 bytes
  matrices.push_back(StoredMatrix{VectorDtype::kFloat32, 0, 4, {}});  // codes only: skipped
  matrices.push_back(*Rows(2, '3'));                                  // 32 bytes: 64
  matrices.push_back(*Rows(2, '4'));                                  // 32 more: over 80
  const absl::StatusOr<bool> fitted = table.AddResident({1, 2, 3, 4}, &matrices);
  ASSERT_TRUE(fitted.ok()) << fitted.status();
  EXPECT_FALSE(*fitted) << "the budget was spent at iid 4";
  EXPECT_EQ(table.Totals().resident_bytes, 64);
  const std::vector<std::optional<LiveEntry>> entries = table.Lookup({1, 2, 3, 4}, false);
  ASSERT_NE(entries[0]->rerank, nullptr);
  EXPECT_EQ(entries[0]->rerank->bytes, std::string(32, '1'));
  EXPECT_EQ(entries[1]->rerank, nullptr);
  ASSERT_NE(entries[2]->rerank, nullptr);
  EXPECT_EQ(entries[2]->rerank->bytes, std::string(32, '3'));
  EXPECT_EQ(entries[3]->rerank, nullptr);
  EXPECT_EQ(entries[3]->external_id, "doc4");
  EXPECT_EQ(entries[3]->version, 4u);

  LiveTable other(1000, std::nullopt);
  DocumentRecord record;
  record.iid = 7;
  record.external_id = "x";
  record.member_offsets = {0, 1};
  ASSERT_TRUE(other.AddStored(record).ok());
  std::vector<std::optional<StoredMatrix>> none(1);
  const absl::StatusOr<bool> missing = other.AddResident({7}, &none);
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("iid 7"), std::string::npos) << missing.status();
}

}  // namespace
}  // namespace tessera::internal
