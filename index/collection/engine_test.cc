// Engine-level checks: schema checks that keep a write from failing after it is durable, the
// checkpoint/restore pair that copies a collection between engines, the data dir lock, the disk
// an engine's shards take (and that its statistics count), and what the engine logs through its
// sink.
#include "tessera/engine.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/candidate/candidate_index.h"
#include "index/centroid/centroid_codebook.h"
#include "index/collection/collection_impl.h"
#include "index/collection/collection_test_util.h"
#include "index/testing/allocated_bytes.h"
#include "index/testing/log_capture.h"

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

// The threads of this process (Linux: the entries of /proc/self/task).
int ProcessThreads() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++count;
  }
  return count;
}

// EngineOptions::threads sizes the engine's two pools, as its header says: one for pooling,
// stage 1 and rerank reads, one for the CPU scorer's MaxSim (the server used to build the second
// one itself, out of the engine's sight). An engine of 4 threads starts 2 × 3 workers (the calling
// thread is each pool's fourth), whether or not it is given a GPU scorer.
TEST(Engine, ThreadsSizesTheTwoPoolsItOwns) {
  for (const bool given_scorer : {false, true}) {
    TempDir dir;
    EngineOptions options;
    options.threads = 4;
    if (given_scorer) options.scorer = *NewCpuMaxSimScorer(CpuMaxSimOptions{CpuIsa::kAuto, 1});
    const int before = ProcessThreads();
    auto engine = Engine::Open(dir.path(), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EXPECT_EQ(ProcessThreads() - before, 6) << "given a scorer: " << given_scorer;
  }
}

// A scorer that always fails as a device does (not INVALID_ARGUMENT).
class FailingScorer final : public MaxSimScorer {
 public:
  std::string_view name() const override { return "failing"; }

 private:
  absl::Status ScoreImpl(FloatMatrixView, const DocumentBatch&, const MaxSimOptions&,
                         MaxSimResult*) const override {
    return absl::UnavailableError("device lost");
  }
};

// EngineOptions::scorer is tried first and the engine's own CPU scorer (on its pool) scores what
// it fails, after on_scorer_fallback: the server passes the GPU scorer this way instead of
// building a CPU scorer, and a pool for it, of its own.
TEST(Engine, ScoresOnItsCpuScorerWhatTheGivenScorerFails) {
  constexpr int64_t kDim = 16;
  TempDir plain_dir, failing_dir;
  std::atomic<int> fallbacks{0};
  std::string failure;
  EngineOptions failing_options;
  failing_options.scorer = std::make_shared<FailingScorer>();
  failing_options.on_scorer_fallback = [&](const absl::Status& status) {
    if (fallbacks.fetch_add(1) == 0) failure = std::string(status.message());
  };
  auto plain = Engine::Open(plain_dir.path());
  auto failing = Engine::Open(failing_dir.path(), failing_options);
  ASSERT_TRUE(plain.ok() && failing.ok());
  auto a = (*plain)->CreateCollection(Schema("docs", kDim));
  auto b = (*failing)->CreateCollection(Schema("docs", kDim));
  ASSERT_TRUE(a.ok() && b.ok());
  Corpus corpus(kDim, 9);
  std::vector<Document> documents;
  for (int i = 0; i < 40; ++i) documents.push_back(corpus.Make(absl::StrCat("d", i), 12));
  ExpectAllOk((*a)->Upsert(documents));
  ExpectAllOk((*b)->Upsert(documents));
  const std::vector<float> query = corpus.QueryFrom(documents[7], 6);
  const auto expected = Answer(**a, query, kDim);
  ASSERT_EQ(expected.size(), 10u);
  EXPECT_EQ(Answer(**b, query, kDim), expected);
  EXPECT_GE(fallbacks.load(), 1);
  EXPECT_EQ(failure, "device lost");
}

// OpenBLAS's threads are an explicit engine option applied at open (they were pinned to one by a
// static initialiser when the first candidate index was built); negative counts are refused.
TEST(Engine, SetsOpenBlasThreadsAtOpen) {
  TempDir first_dir, second_dir, bad_dir;
  EngineOptions options;
  options.blas_threads = 2;
  auto first = Engine::Open(first_dir.path(), options);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(internal::BlasThreads(), 2);
  auto second = Engine::Open(second_dir.path());  // the default: one
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(internal::BlasThreads(), 1);
  options.blas_threads = -1;
  auto bad = Engine::Open(bad_dir.path(), options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_THAT(bad.status().message(), HasSubstr("blas_threads -1"));
  options.blas_threads = 1;
  options.threads = -3;
  bad = Engine::Open(bad_dir.path(), options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_THAT(bad.status().message(), HasSubstr("threads -3"));
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

// Each open shard's RocksDB preallocated a 141 MiB write-ahead log (1.1 × its largest memtable)
// and a 4 MiB MANIFEST: an empty 16-shard collection raised `df` by 2.3 GB, while its statistics
// (file sizes) said 5,088 bytes.
TEST(Engine, AnEmptyCollectionTakesLittleDiskAndItsStatsSayHowMuch) {
  constexpr int kShards = 16;
  TempDir dir;
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  CollectionSchema schema = Schema("empty", 8);
  schema.num_shards = kShards;
  auto collection = (*engine)->CreateCollection(schema);
  ASSERT_TRUE(collection.ok()) << collection.status();
  const int64_t measured = MeasureAllocatedBytes(dir.path());
  const CollectionStats stats = (*collection)->Stats();
  std::printf("empty %d-shard collection: %lld bytes allocated, stats say %lld\n", kShards,
              static_cast<long long>(measured), static_cast<long long>(stats.disk_bytes));
  // Per shard: one WAL preallocation step (1 MiB), one MANIFEST step (64 KiB), and a few KiB of
  // OPTIONS, CURRENT and RocksDB's info log; 2 MiB leaves room for the filesystem's rounding.
  EXPECT_LT(measured, kShards * (int64_t{2} << 20))
      << "bytes allocated under " << dir.path() << " by an empty " << kShards
      << "-shard collection";
  // The collection is all there is in the data directory: its statistics count the same bytes
  // (up to what RocksDB's background threads append to their info logs meanwhile).
  EXPECT_NEAR(static_cast<double>(stats.disk_bytes), static_cast<double>(measured),
              kShards * (16 << 10))
      << "CollectionStats::disk_bytes " << stats.disk_bytes << ", measured " << measured;
}

// A field of a log record that the test expects.
std::string FieldOf(const LogRecord& record, const std::string& key) {
  const std::optional<std::string> value = LogCapture::Field(record, key);
  EXPECT_TRUE(value.has_value()) << "no field '" << key << "' in: " << LogCapture::Describe(record);
  return value.value_or("");
}

// Trainings were invisible: no log line, no statistic. Each one now logs its start and end
// through the engine's sink, with the shard, its vectors, centroids and duration, and is counted.
TEST(Engine, TrainingsAreLoggedThroughTheSinkAndCounted) {
  TempDir dir;
  LogCapture log;
  EngineOptions options;
  options.log = log.sink();
  auto engine = Engine::Open(dir.path(), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  CollectionSchema schema = Schema("trained", 16);
  schema.candidates.factory = "centroid";
  schema.candidates.centroid_min_training_vectors = 1'000;
  auto collection = (*engine)->CreateCollection(schema);
  ASSERT_TRUE(collection.ok()) << collection.status();
  Corpus corpus(16, 5);
  std::vector<Document> documents;
  for (int i = 0; i < 100; ++i) documents.push_back(corpus.Make(absl::StrCat("d", i), 24));
  ExpectAllOk((*collection)->Upsert(documents));
  dynamic_cast<internal::CollectionImpl&>(**collection).WaitForTrainingForTesting();

  const CollectionStats stats = (*collection)->Stats();
  ASSERT_GE(stats.rerank_vectors, 1'000);
  const std::vector<LogRecord> started = log.WithMessage("training started");
  const std::vector<LogRecord> finished = log.WithMessage("training finished");
  ASSERT_EQ(started.size(), 1u) << log.DescribeAll();
  ASSERT_EQ(finished.size(), 1u) << log.DescribeAll();
  const std::string vectors = std::to_string(stats.rerank_vectors);
  const std::string centroids = std::to_string(internal::DefaultNumCentroids(stats.rerank_vectors));
  for (const LogRecord& record : {started[0], finished[0]}) {
    EXPECT_EQ(record.severity, LogSeverity::kInfo) << LogCapture::Describe(record);
    EXPECT_EQ(FieldOf(record, "collection"), "trained");
    EXPECT_EQ(FieldOf(record, "shard"), "0");
    EXPECT_EQ(FieldOf(record, "vectors"), vectors);
    EXPECT_EQ(FieldOf(record, "centroids"), centroids);
    EXPECT_EQ(FieldOf(record, "generation"), "1");
  }
  double seconds = -1;
  ASSERT_TRUE(absl::SimpleAtod(FieldOf(finished[0], "seconds"), &seconds))
      << LogCapture::Describe(finished[0]);
  EXPECT_GE(seconds, 0.0);
  EXPECT_TRUE(log.WithMessage("training failed").empty()) << log.DescribeAll();

  EXPECT_EQ(stats.training_shards, 0);
  EXPECT_EQ(stats.trainings_completed, 1);
  EXPECT_EQ(stats.trainings_failed, 0);
  // The log line rounds to milliseconds.
  EXPECT_NEAR(stats.last_training_seconds, seconds, 0.0005);
}

}  // namespace
}  // namespace tessera
