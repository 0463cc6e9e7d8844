// Corrupt files at open: a flipped run of bytes in the middle of one collection's SST file, or a
// truncated schema file, makes that collection unavailable (DATA_LOSS naming the file) while the
// other collections of the data directory open and serve as before; a corrupt candidate index
// snapshot is only an acceleration and is rebuilt from RocksDB, with a line in the log and the
// same results as before.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/collection/collection_test_util.h"
#include "tests/integration/fault_test_util.h"

namespace tessera::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int kDocuments = 40;
constexpr int64_t kTokens = 32;

// Creates the collections and ingests kDocuments documents into each; returns them by collection.
std::map<std::string, std::map<std::string, Document>> Populate(
    const std::string& data_dir, const std::vector<std::string>& names) {
  std::map<std::string, std::map<std::string, Document>> documents;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Open(data_dir);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return documents;
  for (const std::string& name : names) {
    absl::StatusOr<std::shared_ptr<Collection>> collection =
        (*engine)->CreateCollection(FaultSchema(name));
    EXPECT_TRUE(collection.ok()) << collection.status();
    if (!collection.ok()) return documents;
    for (int i = 0; i < kDocuments; ++i) {
      Document document = FaultDocument(absl::StrCat(name, "-", i), kTokens);
      EXPECT_TRUE(UpsertOne(**collection, document).ok());
      documents[name].emplace(document.id, std::move(document));
    }
    // SST files and the candidate snapshot on disk (closing the engine snapshots as well).
    EXPECT_TRUE((*collection)->Snapshot().ok());
  }
  return documents;
}

// The largest data file of the collection's shard: its rerank vectors, mostly data blocks (an SST
// file), or, once the snapshot's flush moved them there, a rerank segment file (.seg).
fs::path LargestSst(const std::string& data_dir, const std::string& name) {
  fs::path largest;
  uintmax_t size = 0;
  for (const auto& entry : fs::directory_iterator(CollectionDir(data_dir, name) / "shard-000/db")) {
    const bool data = entry.path().extension() == ".sst" || entry.path().extension() == ".seg";
    if (data && entry.file_size() > size) {
      size = entry.file_size();
      largest = entry.path();
    }
  }
  return largest;
}

TEST(CorruptFilesAtOpen, CorruptSstMakesOnlyItsCollectionUnavailable) {
  TempDir dir;
  const auto documents = Populate(dir.path(), {"broken", "healthy"});
  ASSERT_EQ(documents.size(), 2u);
  const fs::path sst = LargestSst(dir.path(), "broken");
  ASSERT_FALSE(sst.empty());
  FlipBytes(sst, fs::file_size(sst) / 2, 64);

  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  Engine& e = **engine;
  EXPECT_EQ(e.ListCollections(), (std::vector<std::string>{"broken", "healthy"}));
  const auto unavailable = e.UnavailableCollections();
  ASSERT_EQ(unavailable.size(), 1u);
  EXPECT_EQ(unavailable[0].first, "broken");
  EXPECT_EQ(unavailable[0].second.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(unavailable[0].second.message(), HasSubstr(sst.string()));

  const absl::Status broken = e.GetCollection("broken").status();
  EXPECT_EQ(broken.code(), absl::StatusCode::kDataLoss) << broken;
  EXPECT_THAT(broken.message(), HasSubstr("collection 'broken'"));
  EXPECT_THAT(broken.message(), HasSubstr(sst.string()));
  EXPECT_EQ(e.CreateCollection(FaultSchema("broken")).status().code(),
            absl::StatusCode::kAlreadyExists);

  absl::StatusOr<std::shared_ptr<Collection>> healthy = e.GetCollection("healthy");
  ASSERT_TRUE(healthy.ok()) << healthy.status();
  ExpectExactly(**healthy, documents.at("healthy"), {}, "beside a corrupt collection");

  // The operator's way out: drop it (its files go), and the name can be used again.
  ASSERT_TRUE(e.DropCollection("broken").ok());
  EXPECT_FALSE(fs::exists(sst));
  EXPECT_EQ(e.ListCollections(), (std::vector<std::string>{"healthy"}));
  EXPECT_TRUE(e.UnavailableCollections().empty());
  absl::StatusOr<std::shared_ptr<Collection>> recreated = e.CreateCollection(FaultSchema("broken"));
  ASSERT_TRUE(recreated.ok()) << recreated.status();
  EXPECT_TRUE(UpsertOne(**recreated, FaultDocument("fresh", kTokens)).ok());
}

TEST(CorruptFilesAtOpen, UnreadableSchemaMakesOnlyItsCollectionUnavailable) {
  TempDir dir;
  const auto documents = Populate(dir.path(), {"broken", "healthy"});
  ASSERT_EQ(documents.size(), 2u);
  const fs::path schema = CollectionDir(dir.path(), "broken") / "schema";
  fs::resize_file(schema, fs::file_size(schema) / 2);

  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->ListCollections(), (std::vector<std::string>{"broken", "healthy"}));
  const absl::Status broken = (*engine)->GetCollection("broken").status();
  EXPECT_EQ(broken.code(), absl::StatusCode::kDataLoss) << broken;
  EXPECT_THAT(broken.message(), HasSubstr(schema.string()));
  absl::StatusOr<std::shared_ptr<Collection>> healthy = (*engine)->GetCollection("healthy");
  ASSERT_TRUE(healthy.ok()) << healthy.status();
  ExpectExactly(**healthy, documents.at("healthy"), {}, "beside an unreadable schema");
}

// The snapshot only saves replaying the store: a corrupt one is rebuilt, and stage 1 (which picks
// the candidates: fewer than the collection here) nominates exactly as before.
TEST(CorruptFilesAtOpen, CorruptCandidateSnapshotIsRebuiltWithIdenticalResults) {
  TempDir dir;
  const auto documents = Populate(dir.path(), {"c"});
  ASSERT_EQ(documents.size(), 1u);
  SearchOptions options;
  options.k = 5;
  options.num_candidates = 8;
  auto search_all = [&](const Collection& collection) {
    std::vector<std::vector<std::pair<std::string, float>>> results;
    for (const auto& [id, document] : documents.at("c")) {
      absl::StatusOr<SearchResult> result =
          collection.Search(FloatMatrixView{document.tokens.data(), 6, kFaultDim}, options);
      EXPECT_TRUE(result.ok()) << result.status();
      if (!result.ok()) return results;
      results.emplace_back();
      for (const SearchHit& hit : result->hits) results.back().emplace_back(hit.id, hit.score);
    }
    return results;
  };
  std::vector<std::vector<std::pair<std::string, float>>> reference;
  {
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Open(dir.path());
    ASSERT_TRUE(engine.ok()) << engine.status();
    reference = search_all(**(*engine)->GetCollection("c"));
  }
  ASSERT_EQ(reference.size(), static_cast<size_t>(kDocuments));
  const fs::path snapshot = CollectionDir(dir.path(), "c") / "shard-000/candidates.snapshot";
  ASSERT_TRUE(fs::exists(snapshot));
  FlipBytes(snapshot, fs::file_size(snapshot) / 2, 16);

  ::testing::internal::CaptureStderr();
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Open(dir.path());
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_THAT(log, HasSubstr("rebuilding the candidate index"));
  EXPECT_THAT(log, HasSubstr(snapshot.string()));
  absl::StatusOr<std::shared_ptr<Collection>> collection = (*engine)->GetCollection("c");
  ASSERT_TRUE(collection.ok()) << collection.status();
  EXPECT_EQ(search_all(**collection), reference);
  ExpectExactly(**collection, documents.at("c"), {}, "after the rebuild");
}

}  // namespace
}  // namespace tessera::testing
