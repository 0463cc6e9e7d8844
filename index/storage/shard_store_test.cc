#include "index/storage/shard_store.h"

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/storage/record_codec.h"
#include "index/storage/rocksdb_tsan_suppressions.h"
#include "index/testing/allocated_bytes.h"
#include "index/testing/stored_matrix.h"
#include "index/testing/temp_dir.h"
#include "rocksdb/db.h"
#include "tessera/float16.h"

namespace tessera::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A fresh directory per test, removed afterwards.
class ShardStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<ShardStore> OpenStore(ShardStoreOptions options = {}) {
    if (options.memory == nullptr) options.memory = NewSharedStoreMemory(8 << 20, 8 << 20);
    auto store = ShardStore::Open(dir_, options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(store).value() : nullptr;
  }

  TempDir root_{"shard_store_test"};
  const std::string dir_ = root_.path() + "/db";
};

DocumentWrite MakeDoc(const std::string& id, uint32_t salt = 0, bool fp16 = true,
                      bool layout = false) {
  DocumentWrite w;
  w.record.external_id = id;
  w.record.num_tokens = 10 + salt;
  if (layout) w.record.layout = PatchGridLayout{4, 4, 1, 0};
  w.record.attributes["n"] = static_cast<int64_t>(salt);
  w.record.attributes["x"] = 0.5 * salt;
  w.record.attributes["s"] = absl::StrCat(id, "/", salt);
  const int64_t rows = 1 + salt % 5;
  for (int64_t r = 0; r <= rows; ++r) w.record.member_offsets.push_back(static_cast<int32_t>(r));
  for (int64_t r = 0; r < rows; ++r) w.record.members.push_back(static_cast<int32_t>(r));
  w.rerank = MakeMatrix(fp16 ? VectorDtype::kFloat16 : VectorDtype::kFloat32, rows, 16,
                        static_cast<uint32_t>(std::hash<std::string>()(id)) + salt);
  w.candidates = MakeMatrix(VectorDtype::kFloat32, 1, 16, salt);
  return w;
}

std::vector<DocumentWrite> Docs(std::vector<DocumentWrite> docs) { return docs; }

void ExpectRecordMatches(const DocumentRecord& got, const DocumentWrite& want) {
  EXPECT_EQ(got.external_id, want.record.external_id);
  EXPECT_EQ(got.num_tokens, want.record.num_tokens);
  EXPECT_EQ(got.attributes, want.record.attributes);
  EXPECT_EQ(got.layout.has_value(), want.record.layout.has_value());
  EXPECT_EQ(got.member_offsets, want.record.member_offsets);
  EXPECT_EQ(got.members, want.record.members);
}

void ExpectSameMatrix(const StoredMatrix& got, const StoredMatrix& want) {
  EXPECT_EQ(got.dtype, want.dtype);
  EXPECT_EQ(got.rows, want.rows);
  EXPECT_EQ(got.cols, want.cols);
  EXPECT_TRUE(got.bytes == want.bytes);
}

std::map<uint64_t, StoredMatrix> AllCandidates(const ShardStore& store, uint64_t min_iid = 0) {
  std::map<uint64_t, StoredMatrix> out;
  const absl::Status status =
      store.ForEachCandidates(min_iid, [&](uint64_t iid, const StoredMatrix& m) -> absl::Status {
        EXPECT_TRUE(out.empty() || out.rbegin()->first < iid) << "not in iid order";
        out[iid] = m;
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

std::vector<DocumentRecord> AllRecords(const ShardStore& store) {
  std::vector<DocumentRecord> out;
  const absl::Status status = store.ForEachDocument([&](const DocumentRecord& r) {
    out.push_back(r);
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

TEST_F(ShardStoreTest, OpenMissingWithoutCreateIsNotFound) {
  ShardStoreOptions options;
  options.create_if_missing = false;
  const auto store = ShardStore::Open(dir_, options);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(store.status().message(), HasSubstr(dir_));
  EXPECT_FALSE(std::filesystem::exists(dir_));
}

TEST_F(ShardStoreTest, SecondOpenOfTheSameDirectoryFails) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const auto second = ShardStore::Open(dir_, {});
  EXPECT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr(dir_));
}

TEST_F(ShardStoreTest, WriteAndReadBack) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::vector<DocumentWrite> want = {MakeDoc("a", 1, /*fp16=*/true, /*layout=*/true),
                                           MakeDoc("b", 2, /*fp16=*/false, /*layout=*/false),
                                           MakeDoc("c", 3, true, false)};
  auto result = store->Write(want, {});
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->upserted_iids.size(), 3u);
  EXPECT_THAT(result->versions, ElementsAre(1, 1, 1));
  EXPECT_THAT(result->replaced_iids, ElementsAre(0, 0, 0));
  EXPECT_TRUE(result->deleted_iids.empty());
  EXPECT_EQ(result->commit_index, 1u);
  EXPECT_GT(result->sequence, 0u);
  EXPECT_LE(result->sequence, store->LatestSequence());
  EXPECT_TRUE(std::is_sorted(result->upserted_iids.begin(), result->upserted_iids.end()));

  for (size_t i = 0; i < want.size(); ++i) {
    const uint64_t iid = result->upserted_iids[i];
    auto looked_up = store->LookupId(want[i].record.external_id);
    ASSERT_TRUE(looked_up.ok()) << looked_up.status();
    EXPECT_EQ(*looked_up, iid);
    auto record = store->GetRecord(iid);
    ASSERT_TRUE(record.ok()) << record.status();
    EXPECT_EQ(record->iid, iid);
    EXPECT_EQ(record->version, 1u);
    ExpectRecordMatches(*record, want[i]);
    auto rerank = store->GetRerank(iid);
    ASSERT_TRUE(rerank.ok()) << rerank.status();
    ExpectSameMatrix(*rerank, want[i].rerank);
  }
  auto layout = store->GetRecord(result->upserted_iids[0])->layout;
  ASSERT_TRUE(layout.has_value());
  EXPECT_EQ(layout->rows, 4);
  EXPECT_EQ(layout->prefix_tokens, 1);

  const auto candidates = AllCandidates(*store);
  ASSERT_EQ(candidates.size(), 3u);
  for (size_t i = 0; i < want.size(); ++i) {
    ExpectSameMatrix(candidates.at(result->upserted_iids[i]), want[i].candidates);
  }
  EXPECT_EQ(store->Stats().documents, 3);
  EXPECT_GT(store->Stats().disk_bytes, 0);
  EXPECT_EQ(store->LookupId("zzz").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->GetRecord(12345).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->GetRerank(12345).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ShardStoreTest, DropAllCandidatesKeepsDocumentsAndLaterCandidates) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::vector<DocumentWrite> before = {MakeDoc("a", 1), MakeDoc("b", 2), MakeDoc("c", 3)};
  auto first = store->Write(before, {});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(store->Flush().ok());  // the candidates in an SST file, not only the memtable
  ASSERT_EQ(AllCandidates(*store).size(), 3u);

  ASSERT_TRUE(store->DropAllCandidates().ok());
  EXPECT_TRUE(AllCandidates(*store).empty());
  const DocumentWrite later = MakeDoc("d", 4);
  auto second = store->Write({later}, {});
  ASSERT_TRUE(second.ok()) << second.status();

  store.reset();  // the deletion is durable: reopened, only the later write's candidates remain
  store = OpenStore();
  ASSERT_NE(store, nullptr);
  const auto candidates = AllCandidates(*store);
  ASSERT_EQ(candidates.size(), 1u);
  ExpectSameMatrix(candidates.at(second->upserted_iids[0]), later.candidates);
  for (size_t i = 0; i < before.size(); ++i) {
    auto record = store->GetRecord(first->upserted_iids[i]);
    ASSERT_TRUE(record.ok()) << record.status();
    ExpectRecordMatches(*record, before[i]);
    auto rerank = store->GetRerank(first->upserted_iids[i]);
    ASSERT_TRUE(rerank.ok()) << rerank.status();
    ExpectSameMatrix(*rerank, before[i].rerank);
  }
  EXPECT_EQ(store->Stats().documents, 4);
}

TEST_F(ShardStoreTest, UpsertReplacesWithNewIidAndNextVersion) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  auto first = store->Write(Docs({MakeDoc("a", 1), MakeDoc("b", 1)}), {});
  ASSERT_TRUE(first.ok()) << first.status();
  const uint64_t old_iid = first->upserted_iids[0];

  const DocumentWrite replacement = MakeDoc("a", 2, /*fp16=*/false);
  auto second = store->Write({replacement}, {});
  ASSERT_TRUE(second.ok()) << second.status();
  const uint64_t new_iid = second->upserted_iids[0];
  EXPECT_GT(new_iid, first->upserted_iids[1]);
  EXPECT_THAT(second->versions, ElementsAre(2));
  EXPECT_THAT(second->replaced_iids, ElementsAre(old_iid));
  EXPECT_EQ(second->commit_index, 2u);
  EXPECT_GT(second->sequence, first->sequence);

  EXPECT_EQ(*store->LookupId("a"), new_iid);
  auto record = store->GetRecord(new_iid);
  ASSERT_TRUE(record.ok());
  EXPECT_EQ(record->version, 2u);
  ExpectRecordMatches(*record, replacement);
  ExpectSameMatrix(*store->GetRerank(new_iid), replacement.rerank);
  EXPECT_EQ(store->GetRecord(old_iid).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->GetRerank(old_iid).status().code(), absl::StatusCode::kNotFound);
  const auto candidates = AllCandidates(*store);
  EXPECT_EQ(candidates.count(old_iid), 0u);
  EXPECT_EQ(candidates.size(), 2u);
  EXPECT_EQ(AllRecords(*store).size(), 2u);
  EXPECT_EQ(store->Stats().documents, 2);

  auto third = store->Write({MakeDoc("a", 3)}, {});
  ASSERT_TRUE(third.ok());
  EXPECT_THAT(third->versions, ElementsAre(3));
}

TEST_F(ShardStoreTest, LaterUpsertInOneWriteReplacesEarlierOne) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  auto result = store->Write(Docs({MakeDoc("a", 1), MakeDoc("b", 1), MakeDoc("a", 2)}), {"b"});
  ASSERT_TRUE(result.ok()) << result.status();
  const auto& iids = result->upserted_iids;
  EXPECT_THAT(result->versions, ElementsAre(1, 1, 2));
  EXPECT_THAT(result->replaced_iids, ElementsAre(0, 0, iids[0]));
  EXPECT_THAT(result->deleted_iids, ElementsAre(iids[1]));
  const auto records = AllRecords(*store);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].iid, iids[2]);
  EXPECT_EQ(records[0].version, 2u);
  EXPECT_EQ(AllCandidates(*store).size(), 1u);
  EXPECT_EQ(store->LookupId("b").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Stats().documents, 1);
}

TEST_F(ShardStoreTest, DeleteRemovesEveryRow) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  auto written = store->Write(Docs({MakeDoc("a"), MakeDoc("b")}), {});
  ASSERT_TRUE(written.ok());
  const uint64_t a = written->upserted_iids[0];
  auto deleted = store->Write({}, {"a", "missing", "a"});
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(deleted->deleted_iids, ElementsAre(a, 0, 0));
  EXPECT_TRUE(deleted->upserted_iids.empty());
  EXPECT_EQ(store->LookupId("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->GetRecord(a).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->GetRerank(a).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(AllCandidates(*store).count(a), 0u);
  EXPECT_EQ(store->Stats().documents, 1);

  // A new life starts at version 1 again.
  auto again = store->Write({MakeDoc("a", 5)}, {});
  ASSERT_TRUE(again.ok());
  EXPECT_THAT(again->versions, ElementsAre(1));
  EXPECT_THAT(again->replaced_iids, ElementsAre(0));
  EXPECT_GT(again->upserted_iids[0], written->upserted_iids[1]);
}

TEST_F(ShardStoreTest, InvalidWritesAreRejectedWholesale) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  DocumentWrite bad = MakeDoc("bad");
  bad.rerank.bytes.pop_back();
  auto result = store->Write(Docs({MakeDoc("good"), bad}), {});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("'bad'"));
  DocumentWrite anonymous = MakeDoc("");
  EXPECT_EQ(store->Write({anonymous}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  DocumentWrite negative = MakeDoc("neg");
  negative.candidates.rows = -1;
  EXPECT_EQ(store->Write({negative}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->LookupId("good").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Stats().documents, 0);
  // Rejected requests take no commit index.
  auto ok = store->Write({MakeDoc("good")}, {});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->commit_index, 1u);
}

TEST_F(ShardStoreTest, MultiGetRerank) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  std::vector<DocumentWrite> docs = {MakeDoc("a", 1), MakeDoc("b", 2, false), MakeDoc("c", 3),
                                     MakeDoc("d", 4)};
  auto result = store->Write(docs, {});
  ASSERT_TRUE(result.ok());
  const std::vector<uint64_t> old = result->upserted_iids;
  // Some values in SST files, the changes below in the memtable: MultiGet reads both.
  ASSERT_TRUE(store->Flush().ok());
  // d deleted, a replaced (its old iid goes), e added.
  const DocumentWrite new_a = MakeDoc("a", 11);
  const DocumentWrite e_doc = MakeDoc("e", 5, false);
  auto changed = store->Write({new_a, e_doc}, {"d"});
  ASSERT_TRUE(changed.ok());
  const uint64_t a = changed->upserted_iids[0];
  const uint64_t e = changed->upserted_iids[1];
  const std::vector<uint64_t> request = {old[2], old[3], a, 999, old[0], old[2], e, old[1]};
  auto matrices = store->MultiGetRerank(request);
  ASSERT_TRUE(matrices.ok()) << matrices.status();
  ASSERT_EQ(matrices->size(), request.size());
  // Present iids: exactly what was written, in request order (duplicates too); absent ones
  // (deleted, replaced, never assigned): std::nullopt.
  const std::vector<const StoredMatrix*> want = {&docs[2].rerank, nullptr,        &new_a.rerank,
                                                 nullptr,         nullptr,        &docs[2].rerank,
                                                 &e_doc.rerank,   &docs[1].rerank};
  for (size_t i = 0; i < request.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("entry ", i, ", iid ", request[i]));
    ASSERT_EQ((*matrices)[i].has_value(), want[i] != nullptr);
    if (want[i] != nullptr) ExpectSameMatrix(*(*matrices)[i], *want[i]);
  }

  auto none = store->MultiGetRerank({});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  const std::vector<uint64_t> all_absent = {old[3], 999, 1000};
  auto absent = store->MultiGetRerank(all_absent);
  ASSERT_TRUE(absent.ok()) << absent.status();
  ASSERT_EQ(absent->size(), all_absent.size());
  for (const std::optional<StoredMatrix>& matrix : *absent) EXPECT_FALSE(matrix.has_value());
}

TEST_F(ShardStoreTest, MultiGetCodes) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  // Removals delete the codes of generations 1 and 2.
  store->SetCodeGenerations({1, 2});
  std::vector<DocumentWrite> docs = {MakeDoc("a", 1), MakeDoc("b", 2), MakeDoc("c", 3),
                                     MakeDoc("d", 4)};
  docs[0].codes = std::string("codes of a\0\xff", 12);
  docs[0].code_generation = 1;
  docs[1].codes = "codes of b";
  docs[1].code_generation = 1;
  docs[3].codes = "codes of d";
  docs[3].code_generation = 1;
  // c has no codes.
  auto result = store->Write(docs, {});
  ASSERT_TRUE(result.ok());
  const std::vector<uint64_t> iids = result->upserted_iids;
  ASSERT_TRUE(store->PutCodes(2, {{iids[1], "b in generation 2"}}, {}).ok());
  ASSERT_TRUE(store->Write({}, {"d"}).ok());

  const std::vector<uint64_t> request = {iids[1], iids[2], iids[0], iids[3], 999, iids[1]};
  auto codes = store->MultiGetCodes(1, request);
  ASSERT_TRUE(codes.ok()) << codes.status();
  EXPECT_THAT(*codes, ElementsAre(std::optional<std::string>("codes of b"), std::nullopt,
                                  std::optional<std::string>(docs[0].codes), std::nullopt,
                                  std::nullopt, std::optional<std::string>("codes of b")));
  auto second = store->MultiGetCodes(2, request);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_THAT(*second, ElementsAre(std::optional<std::string>("b in generation 2"), std::nullopt,
                                   std::nullopt, std::nullopt, std::nullopt,
                                   std::optional<std::string>("b in generation 2")));
  auto none = store->MultiGetCodes(1, {});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

// Every generation but the kept one loses its codes, durably; a drop with nothing left to drop
// (what every open of a trained shard calls) writes nothing, and neither does DropAllCandidates.
TEST_F(ShardStoreTest, DropCodeGenerationsExceptKeepsOneGenerationAndIsFreeWhenNothingIsLeft) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  auto written = store->Write({MakeDoc("a", 1), MakeDoc("b", 2)}, {});
  ASSERT_TRUE(written.ok()) << written.status();
  const std::vector<uint64_t> iids = written->upserted_iids;
  for (uint32_t generation : {1u, 2u}) {
    ASSERT_TRUE(store
                    ->PutCodes(generation,
                               {{iids[0], absl::StrCat("a", generation)},
                                {iids[1], absl::StrCat("b", generation)}},
                               {})
                    .ok());
  }
  // Generations 1 and 2 in codes segments, 3 still in RocksDB: both are dropped the same way.
  ASSERT_TRUE(store->FlushSegments().ok());
  ASSERT_TRUE(store->PutCodes(3, {{iids[0], "a3"}, {iids[1], "b3"}}, {}).ok());
  EXPECT_EQ(store->Stats().segments.code_segments, 2);
  auto codes_of = [&](uint32_t generation) {
    std::vector<std::string> codes;
    EXPECT_TRUE(store
                    ->ForEachCodes(generation,
                                   [&](uint64_t, absl::string_view bytes) {
                                     codes.emplace_back(bytes);
                                     return absl::OkStatus();
                                   })
                    .ok());
    return codes;
  };
  ASSERT_TRUE(store->DropCodeGenerationsExcept(2).ok());
  EXPECT_EQ(store->Stats().segments.code_segments, 1);
  store.reset();
  store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(codes_of(1).empty());
  EXPECT_THAT(codes_of(2), ElementsAre("a2", "b2"));
  EXPECT_TRUE(codes_of(3).empty());

  ASSERT_TRUE(store->DropAllCandidates().ok());
  const uint64_t sequence = store->LatestSequence();
  ASSERT_TRUE(store->DropCodeGenerationsExcept(2).ok());
  ASSERT_TRUE(store->DropAllCandidates().ok());
  EXPECT_EQ(store->LatestSequence(), sequence);
  EXPECT_THAT(codes_of(2), ElementsAre("a2", "b2"));
}

TEST_F(ShardStoreTest, ScansAreInIidOrderAndHonourMinIid) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  std::vector<uint64_t> iids;
  // More than 255 documents, so that iid keys cross a byte boundary.
  for (int batch = 0; batch < 6; ++batch) {
    std::vector<DocumentWrite> docs;
    for (int i = 0; i < 50; ++i) docs.push_back(MakeDoc(absl::StrCat("d", batch, "-", i), i));
    auto result = store->Write(std::move(docs), {});
    ASSERT_TRUE(result.ok());
    iids.insert(iids.end(), result->upserted_iids.begin(), result->upserted_iids.end());
  }
  ASSERT_TRUE(store->Flush().ok());
  const auto records = AllRecords(*store);
  ASSERT_EQ(records.size(), iids.size());
  for (size_t i = 0; i < iids.size(); ++i) EXPECT_EQ(records[i].iid, iids[i]);

  const uint64_t min_iid = iids[270];
  const auto candidates = AllCandidates(*store, min_iid);
  ASSERT_EQ(candidates.size(), iids.size() - 270);
  EXPECT_EQ(candidates.begin()->first, min_iid);
  EXPECT_TRUE(AllCandidates(*store, iids.back() + 1).empty());

  // fn's error stops the scan and is returned.
  int calls = 0;
  const absl::Status stopped = store->ForEachDocument([&](const DocumentRecord&) {
    return ++calls == 3 ? absl::CancelledError("enough") : absl::OkStatus();
  });
  EXPECT_EQ(stopped.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(calls, 3);
}

TEST_F(ShardStoreTest, ScanSeesASnapshot) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write(Docs({MakeDoc("a"), MakeDoc("b"), MakeDoc("c")}), {}).ok());
  int seen = 0;
  const absl::Status status = store->ForEachDocument([&](const DocumentRecord&) {
    // Writes during the scan are not seen by it.
    if (seen++ == 0) {
      EXPECT_TRUE(store->Write({MakeDoc("z")}, {"b", "c"}).ok());
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(seen, 3);
  EXPECT_EQ(AllRecords(*store).size(), 2u);
}

TEST_F(ShardStoreTest, ReopenKeepsEverythingAndNeverReusesIids) {
  uint64_t max_iid = 0;
  std::map<std::string, uint64_t> live;
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->PutMeta("schema", std::string("\0dim=128", 8)).ok());
    auto result = store->Write(Docs({MakeDoc("a", 1), MakeDoc("b", 2), MakeDoc("c", 3)}), {});
    ASSERT_TRUE(result.ok());
    auto replaced = store->Write({MakeDoc("b", 4)}, {});
    ASSERT_TRUE(replaced.ok());
    // Delete the document with the largest iid, so that only the persisted counter knows it.
    auto deleted = store->Write({}, {"b"});
    ASSERT_TRUE(deleted.ok());
    max_iid = replaced->upserted_iids[0];
    EXPECT_THAT(deleted->deleted_iids, ElementsAre(max_iid));
    live = {{"a", result->upserted_iids[0]}, {"c", result->upserted_iids[2]}};
  }
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  auto meta = store->GetMeta("schema");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(*meta, std::string("\0dim=128", 8));
  EXPECT_EQ(store->GetMeta("other").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Stats().documents, 2);
  for (const auto& [id, iid] : live) {
    EXPECT_EQ(*store->LookupId(id), iid);
    auto record = store->GetRecord(iid);
    ASSERT_TRUE(record.ok());
    ExpectRecordMatches(*record, MakeDoc(id, id == "a" ? 1 : 3));
    ExpectSameMatrix(*store->GetRerank(iid), MakeDoc(id, id == "a" ? 1 : 3).rerank);
  }
  EXPECT_EQ(store->LookupId("b").status().code(), absl::StatusCode::kNotFound);
  auto next = store->Write(Docs({MakeDoc("b", 9), MakeDoc("a", 9)}), {});
  ASSERT_TRUE(next.ok());
  EXPECT_GT(next->upserted_iids[0], max_iid);
  EXPECT_THAT(next->versions, ElementsAre(1, 2));
  // Commit indices restart at 1 with each Open.
  EXPECT_EQ(next->commit_index, 1u);

  ShardStoreOptions existing_only;
  existing_only.create_if_missing = false;
  store.reset();
  EXPECT_TRUE(ShardStore::Open(dir_, existing_only).ok());
}

TEST_F(ShardStoreTest, MetaIsOpaqueAndOverwritable) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->GetMeta("k").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store->PutMeta("k", "v1").ok());
  ASSERT_TRUE(store->PutMeta("k", "").ok());
  auto value = store->GetMeta("k");
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(*value, "");
  // The store's own counters are not visible as caller metadata.
  EXPECT_EQ(store->GetMeta("next_iid").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->GetMeta("s/next_iid").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ShardStoreTest, UnsyncedWritesWork) {
  ShardStoreOptions options;
  options.sync = false;
  auto store = OpenStore(options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write({MakeDoc("a")}, {}).ok());
  EXPECT_EQ(store->SyncedWritesForTesting(), 0);
  EXPECT_EQ(store->Stats().documents, 1);
}

// Eight writers: every request is acknowledged once with unique iids, everything is readable,
// and the leader committed several requests per WAL sync.
TEST_F(ShardStoreTest, ConcurrentWritersAreGroupCommitted) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  constexpr int kThreads = 8;
  constexpr int kWritesPerThread = 60;
  std::vector<std::vector<WriteResult>> results(kThreads);
  std::atomic<bool> stop_readers{false};
  std::atomic<int> failures{0};

  // A reader alongside the writers: scans and point reads must stay consistent.
  std::thread reader([&] {
    while (!stop_readers.load()) {
      std::set<uint64_t> docs;
      const absl::Status status = store->ForEachDocument([&](const DocumentRecord& r) {
        docs.insert(r.iid);
        return absl::OkStatus();
      });
      if (!status.ok()) failures.fetch_add(1);
      for (uint64_t iid : docs) {
        // Only deletes could remove it, and this test has none; replaces happen only in the
        // writers' own ids, so a NOT_FOUND here is allowed for a replaced iid.
        auto rerank = store->GetRerank(iid);
        if (!rerank.ok() && rerank.status().code() != absl::StatusCode::kNotFound) {
          failures.fetch_add(1);
        }
        break;
      }
      (void)store->Stats();
    }
  });

  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < kWritesPerThread; ++i) {
        std::vector<DocumentWrite> docs;
        const int n = 1 + i % 3;
        for (int j = 0; j < n; ++j) {
          docs.push_back(MakeDoc(absl::StrCat("t", t, "-", i, "-", j), t * 1000 + i));
        }
        // Every fifth write also replaces this thread's first document.
        if (i % 5 == 4) docs.push_back(MakeDoc(absl::StrCat("t", t, "-0-0"), i));
        auto result = store->Write(std::move(docs), {});
        if (!result.ok()) {
          failures.fetch_add(1);
          continue;
        }
        results[t].push_back(std::move(result).value());
      }
    });
  }
  for (std::thread& w : writers) w.join();
  stop_readers = true;
  reader.join();
  ASSERT_EQ(failures.load(), 0);

  std::set<uint64_t> iids;
  std::set<uint64_t> commit_indices;
  std::map<uint64_t, uint64_t> sequence_by_commit;
  size_t upserts = 0;
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(results[t].size(), static_cast<size_t>(kWritesPerThread));
    for (const WriteResult& r : results[t]) {
      for (uint64_t iid : r.upserted_iids) EXPECT_TRUE(iids.insert(iid).second) << iid;
      upserts += r.upserted_iids.size();
      EXPECT_TRUE(commit_indices.insert(r.commit_index).second);
      sequence_by_commit[r.commit_index] = r.sequence;
    }
  }
  const int requests = kThreads * kWritesPerThread;
  ASSERT_EQ(commit_indices.size(), static_cast<size_t>(requests));
  EXPECT_EQ(*commit_indices.begin(), 1u);
  EXPECT_EQ(*commit_indices.rbegin(), static_cast<uint64_t>(requests));
  uint64_t previous = 0;
  for (const auto& [index, sequence] : sequence_by_commit) {
    EXPECT_GE(sequence, previous) << "commit " << index;
    previous = sequence;
  }

  // Everything is there with the content of its last write.
  int64_t expected_documents = 0;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kWritesPerThread; ++i) {
      for (int j = 0; j < 1 + i % 3; ++j) {
        const std::string id = absl::StrCat("t", t, "-", i, "-", j);
        ++expected_documents;
        auto iid = store->LookupId(id);
        ASSERT_TRUE(iid.ok()) << id;
        auto record = store->GetRecord(*iid);
        ASSERT_TRUE(record.ok()) << id;
        const uint32_t salt = (i == 0 && j == 0) ? kWritesPerThread - 1 : t * 1000 + i;
        ExpectRecordMatches(*record, MakeDoc(id, salt));
        ExpectSameMatrix(*store->GetRerank(*iid), MakeDoc(id, salt).rerank);
        if (i == 0 && j == 0) {
          EXPECT_EQ(record->version, 1u + kWritesPerThread / 5);
        }
      }
    }
  }
  EXPECT_EQ(store->Stats().documents, expected_documents);
  EXPECT_EQ(AllRecords(*store).size(), static_cast<size_t>(expected_documents));
  EXPECT_EQ(AllCandidates(*store).size(), static_cast<size_t>(expected_documents));

  const int64_t synced = store->SyncedWritesForTesting();
  std::cout << "group commit: " << requests << " requests (" << upserts << " upserts) in " << synced
            << " WAL-synced writes\n";
  EXPECT_LT(synced, requests);
  EXPECT_GT(synced, 0);
}

// Opens the database behind the store's back, as a test that tampers with it.
class RawDb {
 public:
  explicit RawDb(const std::string& dir) {
    std::vector<std::string> names;
    EXPECT_TRUE(rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir, &names).ok());
    std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
    for (const std::string& name : names) descriptors.emplace_back(name, rocksdb::Options());
    rocksdb::DB* db = nullptr;
    const rocksdb::Status s =
        rocksdb::DB::Open(rocksdb::Options(), dir, descriptors, &handles_, &db);
    EXPECT_TRUE(s.ok()) << s.ToString();
    db_.reset(db);
    for (size_t i = 0; i < names.size(); ++i) by_name_[names[i]] = handles_[i];
  }
  ~RawDb() {
    for (auto* handle : handles_) db_->DestroyColumnFamilyHandle(handle);
    EXPECT_TRUE(db_->Close().ok());
  }
  rocksdb::DB* db() { return db_.get(); }
  rocksdb::ColumnFamilyHandle* cf(const std::string& name) { return by_name_.at(name); }

 private:
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  std::map<std::string, rocksdb::ColumnFamilyHandle*> by_name_;
};

TEST_F(ShardStoreTest, CorruptValuesAreDataLoss) {
  uint64_t a = 0, b = 0, c = 0;
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    auto result = store->Write(Docs({MakeDoc("a"), MakeDoc("b"), MakeDoc("c")}), {});
    ASSERT_TRUE(result.ok());
    a = result->upserted_iids[0];
    b = result->upserted_iids[1];
    c = result->upserted_iids[2];
  }
  {
    RawDb raw(dir_);
    // Garbage into a's rerank value; one flipped vector byte in b's; c's doc record truncated.
    ASSERT_TRUE(raw.db()->Put({}, raw.cf("rerank"), EncodeIidKey(a), "garbage bytes").ok());
    std::string value;
    ASSERT_TRUE(raw.db()->Get({}, raw.cf("rerank"), EncodeIidKey(b), &value).ok());
    value[value.size() / 2] ^= 0x40;
    ASSERT_TRUE(raw.db()->Put({}, raw.cf("rerank"), EncodeIidKey(b), value).ok());
    ASSERT_TRUE(raw.db()->Get({}, raw.cf("docs"), EncodeIidKey(c), &value).ok());
    value.resize(value.size() - 3);
    ASSERT_TRUE(raw.db()->Put({}, raw.cf("docs"), EncodeIidKey(c), value).ok());
    // Garbage for a's codes under generation 1; b's are fine.
    ASSERT_TRUE(raw.db()->Put({}, raw.cf("codes"), EncodeCodesKey(1, a), "garbage bytes").ok());
    ASSERT_TRUE(
        raw.db()->Put({}, raw.cf("codes"), EncodeCodesKey(1, b), EncodeCodesValue("b")).ok());
  }
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const auto bad_a = store->GetRerank(a);
  EXPECT_EQ(bad_a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad_a.status().message(), HasSubstr(absl::StrCat("rerank CF, iid ", a)));
  EXPECT_THAT(bad_a.status().message(), HasSubstr(dir_));
  const auto bad_b = store->GetRerank(b);
  EXPECT_EQ(bad_b.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad_b.status().message(), HasSubstr("checksum mismatch"));
  const std::vector<uint64_t> both = {c, b};
  EXPECT_EQ(store->MultiGetRerank(both).status().code(), absl::StatusCode::kDataLoss);
  // An absent iid in the batch does not hide a corrupt one.
  const std::vector<uint64_t> absent_and_corrupt = {999, c, a};
  const auto mixed = store->MultiGetRerank(absent_and_corrupt);
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(mixed.status().message(), HasSubstr(absl::StrCat("rerank CF, iid ", a)));
  const std::vector<uint64_t> coded = {999, b, a};
  EXPECT_EQ(store->MultiGetCodes(1, coded).status().code(), absl::StatusCode::kDataLoss);
  const std::vector<uint64_t> coded_fine = {999, b};
  const auto fine = store->MultiGetCodes(1, coded_fine);
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_THAT(*fine, ElementsAre(std::nullopt, std::optional<std::string>("b")));
  EXPECT_TRUE(store->GetRecord(a).ok());
  EXPECT_TRUE(store->GetRerank(c).ok());
  const auto bad_c = store->GetRecord(c);
  EXPECT_EQ(bad_c.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad_c.status().message(), HasSubstr(absl::StrCat("docs CF, iid ", c)));
  const absl::Status scan =
      store->ForEachDocument([](const DocumentRecord&) { return absl::OkStatus(); });
  EXPECT_EQ(scan.code(), absl::StatusCode::kDataLoss);
  // Replacing c needs its old version, which is lost: the write fails, nothing else does.
  EXPECT_EQ(store->Write({MakeDoc("c")}, {}).status().code(), absl::StatusCode::kDataLoss);
  // Deleting it does not need the record, and a later upsert starts over.
  ASSERT_TRUE(store->Write({}, {"c"}).ok());
  auto fresh = store->Write({MakeDoc("c")}, {});
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_THAT(fresh->versions, ElementsAre(1));
}

TEST_F(ShardStoreTest, StatsCountDiskBytes) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t empty = store->Stats().disk_bytes;
  std::vector<DocumentWrite> docs;
  for (int i = 0; i < 100; ++i) {
    DocumentWrite doc = MakeDoc(absl::StrCat("big", i), i);
    doc.rerank = MakeMatrix(VectorDtype::kFloat16, 64, 128, i);
    docs.push_back(std::move(doc));
  }
  ASSERT_TRUE(store->Write(std::move(docs), {}).ok());
  const int64_t in_wal = store->Stats().disk_bytes;
  EXPECT_GT(in_wal, empty);
  EXPECT_GT(in_wal, 100 * 64 * 128 * 2);
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_GT(store->Stats().disk_bytes, 100 * 64 * 128 * 2);
  EXPECT_EQ(store->Stats().documents, 100);
}

// An open store with a write in its WAL takes little disk, and its stats say how much: RocksDB's
// own WAL preallocation step (1.1 × the 128 MiB rerank memtable) took 141 MiB per open shard,
// which the stats (file sizes) did not count.
TEST_F(ShardStoreTest, AnOpenStoreTakesLittleDiskAndStatsCountWhatItTakes) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write({MakeDoc("a")}, {}).ok());
  const int64_t measured = MeasureAllocatedBytes(dir_);
  // One WAL preallocation step (kWalPreallocationBytes, 1 MiB), the MANIFEST's (64 KiB), and a
  // few KiB of OPTIONS, CURRENT and the info log.
  EXPECT_LT(measured, int64_t{2} << 20) << "bytes allocated under " << dir_;
  // Only the info log may grow in between (RocksDB logs from background threads).
  EXPECT_NEAR(static_cast<double>(store->Stats().disk_bytes), static_cast<double>(measured),
              64 << 10);
}

}  // namespace
}  // namespace tessera::internal
