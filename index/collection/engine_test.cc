// Engine-level checks: schema checks that keep a write from failing after it is durable, the
// checkpoint/restore pair that copies a collection between engines, and the data dir lock.
#include "tessera/engine.h"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/collection/collection_test_util.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

CollectionSchema WithFactory(const std::string& factory) {
  CollectionSchema schema;
  schema.name = "ivf";
  schema.dim = 8;
  schema.candidates.factory = factory;
  return schema;
}

// The candidate index trains an IVF index on its first 50,000 vectors, after the write that
// brings it there is durable: with more lists than that, FAISS's k-means refuses
// (FAILED_PRECONDITION "nx >= k"), which failed that write after the fact and every later open of
// the collection.
TEST(ValidateSchema, RejectsMoreCentroidsThanTrainingVectors) {
  for (const std::string factory : {"IVF65536,Flat", "IVF100000,PQ4", "IVF65536_HNSW32,Flat"}) {
    const absl::Status status = ValidateSchema(WithFactory(factory));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << factory << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(factory));
    EXPECT_THAT(status.message(), HasSubstr("50000"));
  }
  for (const std::string factory : {"IVF16,Flat", "IVF1024,PQ4", "IVF50000,Flat", "HNSW32"}) {
    EXPECT_TRUE(ValidateSchema(WithFactory(factory)).ok()) << factory;
  }
  TempDir dir;
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->CreateCollection(WithFactory("IVF65536,Flat")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*engine)->ListCollections().empty());
}

// A centroid training of fewer vectors than the smallest codebook has centroids cannot fill it
// (--centroid-min-vectors 1 trained 2 documents into a codebook of their few vectors, and the
// shard retrained forever); refused at create, naming the field.
TEST(ValidateSchema, RejectsCentroidThresholdsBelowTheSmallestCodebook) {
  for (const bool training : {false, true}) {
    for (const int64_t threshold : {int64_t{1}, int64_t{255}}) {
      CollectionSchema schema = WithFactory(training ? "centroid" : "auto");
      (training ? schema.candidates.centroid_min_training_vectors
                : schema.candidates.centroid_min_vectors) = threshold;
      const std::string field = training ? "centroid_min_training_vectors" : "centroid_min_vectors";
      const absl::Status status = ValidateSchema(schema);
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field << ": " << status;
      EXPECT_THAT(status.message(), HasSubstr(absl::StrCat(field, " ", threshold)));
      EXPECT_THAT(status.message(), HasSubstr("expected ≥ 256"));
    }
  }
  CollectionSchema smallest = WithFactory("auto");
  smallest.candidates.centroid_min_vectors = 256;
  smallest.candidates.centroid_min_training_vectors = 256;
  EXPECT_TRUE(ValidateSchema(smallest).ok()) << ValidateSchema(smallest);
  TempDir dir;
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  CollectionSchema tiny = WithFactory("auto");
  tiny.candidates.centroid_min_vectors = 1;
  EXPECT_EQ((*engine)->CreateCollection(tiny).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*engine)->ListCollections().empty());
}

// The ids and scores of a search, for comparing two collections.
std::vector<std::pair<std::string, float>> Answer(const Collection& collection,
                                                  const std::vector<float>& query, int64_t dim) {
  SearchOptions options;
  options.k = 10;
  options.exhaustive = true;
  auto result = collection.Search(FloatMatrixView{query.data(), 6, dim}, options);
  EXPECT_TRUE(result.ok()) << result.status();
  std::vector<std::pair<std::string, float>> answer;
  if (result.ok()) {
    for (const SearchHit& hit : result->hits) answer.emplace_back(hit.id, hit.score);
  }
  return answer;
}

TEST(Engine, CheckpointRestoresAsTheCollectionWasAtTheCut) {
  constexpr int64_t kDim = 16;
  TempDir source_dir, target_dir;
  auto source = Engine::Open(source_dir.path());
  auto target = Engine::Open(target_dir.path());
  ASSERT_TRUE(source.ok() && target.ok());
  CollectionSchema schema;
  schema.name = "c";
  schema.dim = kDim;
  schema.num_shards = 2;
  auto collection = (*source)->CreateCollection(schema);
  ASSERT_TRUE(collection.ok()) << collection.status();
  Corpus corpus(kDim, 11);
  std::vector<Document> documents;
  for (int i = 0; i < 60; ++i) documents.push_back(corpus.Make(absl::StrCat("d", i), 12));
  for (const UpsertOutcome& outcome : (*collection)->Upsert(documents)) {
    ASSERT_TRUE(outcome.status.ok()) << outcome.status;
  }
  const std::vector<float> query = corpus.QueryFrom(documents[7], 6);
  const auto before = Answer(**collection, query, kDim);

  const std::string copy = (*target)->StagingDirectory() + "/c";
  ASSERT_TRUE((*source)->CheckpointCollection("c", copy).ok());
  // After the cut: in the source only.
  ASSERT_TRUE((*collection)->Upsert({corpus.Paraphrase(documents[7], "late")})[0].status.ok());
  ASSERT_TRUE((*collection)->Delete({"d7"}).ok());

  // Into an engine that has no such collection, then over one that has other documents.
  ASSERT_TRUE((*target)->RestoreCollection("c", copy).ok());
  auto restored = (*target)->GetCollection("c");
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ((*restored)->Stats().documents, 60);
  EXPECT_EQ(Answer(**restored, query, kDim), before);
  EXPECT_EQ((*restored)->Get("late").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*restored)->Get("d7")->version, 1u);

  const std::string again = (*target)->StagingDirectory() + "/again";
  ASSERT_TRUE((*source)->CheckpointCollection("c", again).ok());
  ASSERT_TRUE((*target)->RestoreCollection("c", again).ok());
  restored = (*target)->GetCollection("c");
  ASSERT_TRUE(restored.ok());
  EXPECT_EQ((*restored)->Stats().documents, 60);  // 60 + late - d7
  EXPECT_TRUE((*restored)->Get("late").ok());
  EXPECT_EQ((*restored)->Get("d7").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Answer(**restored, query, kDim), Answer(**collection, query, kDim));

  // A copy restored under another name changes nothing; unknown names and taken paths fail.
  const std::string third = (*target)->StagingDirectory() + "/third";
  ASSERT_TRUE((*source)->CheckpointCollection("c", third).ok());
  EXPECT_EQ((*target)->RestoreCollection("other", third).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*target)->GetCollection("c").ok());
  EXPECT_EQ((*source)->CheckpointCollection("missing", copy + "x").code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE((*source)->CheckpointCollection("c", third).ok());  // exists

  // The restored collection is durable: it reopens with the engine.
  restored = absl::NotFoundError("closed");
  target->reset();
  target = Engine::Open(target_dir.path());
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ((*target)->ListCollections(), std::vector<std::string>{"c"});
  EXPECT_EQ((*(*target)->GetCollection("c"))->Stats().documents, 60);
}

// Two engines on one data dir: the second fails before it touches anything (the first one's
// staging and trash directories keep their files, its collections keep working), names the
// directory and the process that holds it, and opens once the first has closed.
TEST(Engine, ADataDirInUseIsRefusedAndLeftAsItIs) {
  constexpr int64_t kDim = 8;
  TempDir dir;
  auto first = Engine::Open(dir.path());
  ASSERT_TRUE(first.ok()) << first.status();
  CollectionSchema schema;
  schema.name = "x";
  schema.dim = kDim;
  auto collection = (*first)->CreateCollection(schema);
  ASSERT_TRUE(collection.ok()) << collection.status();
  Corpus corpus(kDim, 3);
  ASSERT_TRUE((*collection)->Upsert({corpus.Make("d0", 4)})[0].status.ok());
  const std::string arriving = (*first)->StagingDirectory() + "/arriving";
  const std::string dropped = dir.path() + "/trash/dropped";
  ASSERT_TRUE(std::filesystem::create_directory(arriving));
  ASSERT_TRUE(std::filesystem::create_directory(dropped));

  auto second = Engine::Open(dir.path());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("data dir '", dir.path(), "' is in use by pid ", getpid())));
  EXPECT_TRUE(std::filesystem::exists(arriving));
  EXPECT_TRUE(std::filesystem::exists(dropped));
  EXPECT_TRUE((*collection)->Get("d0").ok());
  ASSERT_TRUE((*collection)->Upsert({corpus.Make("d1", 4)})[0].status.ok());

  collection = absl::NotFoundError("closed");
  first->reset();
  auto third = Engine::Open(dir.path());
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ((*third)->ListCollections(), std::vector<std::string>{"x"});
  EXPECT_EQ((*(*third)->GetCollection("x"))->Stats().documents, 2);
  EXPECT_FALSE(std::filesystem::exists(arriving));  // a reopen empties what was unfinished
}

// On an empty data dir too: before the lock both engines opened, each created its own 'x', and
// a restart kept only one of them.
TEST(Engine, AnEmptyDataDirInUseIsRefused) {
  TempDir dir;
  const std::string data_dir = dir.path() + "/new";
  auto first = Engine::Open(data_dir);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Engine::Open(data_dir);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr(data_dir));
}

}  // namespace
}  // namespace tessera
