// Collections whose stage 1 is the centroid index: the switch from the exact candidate scan when a
// shard passes its threshold, recall against exhaustive search, filters and explain, and writes
// made while a training runs (before and after its swap, across a retrain and a reopen).
#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "index/centroid/centroid_codebook.h"
#include "index/centroid/centroid_index.h"
#include "index/centroid/code_maxsim.h"
#include "index/collection/collection_impl.h"
#include "index/collection/collection_test_util.h"
#include "index/storage/shard_store.h"
#include "tessera/engine.h"

namespace tessera {
namespace {

constexpr int64_t kDim = 48;

internal::CollectionImpl& Impl(Collection& collection) {
  return dynamic_cast<internal::CollectionImpl&>(collection);
}

std::string StageOf(const Collection& collection) {
  return collection.Stats().candidate_indexes.at(0);
}

// A collection whose stage 1 is the centroid index, first trained once a shard holds
// `training_vectors` rerank vectors.
CollectionSchema CentroidSchema(const std::string& name, int64_t training_vectors) {
  CollectionSchema schema = Schema(name, kDim);
  schema.candidates.factory = "centroid";
  schema.candidates.centroid_min_training_vectors = training_vectors;
  return schema;
}

// The collection of DefaultCascadeRecallAgainstExhaustive, larger: families of paraphrases and
// unrelated documents.
std::vector<Document> FamiliesAndNoise(Corpus& corpus, int families, int noise,
                                       std::vector<Document>* sources) {
  std::vector<Document> documents;
  std::uniform_int_distribution<int64_t> length(16, 64);
  for (int f = 0; f < families; ++f) {
    sources->push_back(corpus.Make(absl::StrCat("f", f, "-0"), length(corpus.rng())));
    documents.push_back(sources->back());
    for (int m = 1; m < 8; ++m) {
      documents.push_back(
          corpus.Paraphrase(sources->back(), absl::StrCat("f", f, "-", m), 0.1f * m));
    }
  }
  for (int d = 0; d < noise; ++d) {
    documents.push_back(corpus.Make(absl::StrCat("d", d), length(corpus.rng())));
  }
  std::shuffle(documents.begin(), documents.end(), corpus.rng());
  return documents;
}

void UpsertAll(Collection& collection, const std::vector<Document>& documents) {
  for (size_t begin = 0; begin < documents.size(); begin += 256) {
    const size_t end = std::min(documents.size(), begin + 256);
    ExpectAllOk(collection.Upsert(
        std::vector<Document>(documents.begin() + begin, documents.begin() + end)));
  }
}

TEST(CentroidStage, SwitchesPastTheThresholdAndKeepsRecall) {
  TempDir dir;
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok());
  CollectionSchema schema = Schema("switch", kDim);
  schema.candidates.centroid_min_vectors = 30'000;
  auto collection = (*engine)->CreateCollection(schema);
  ASSERT_TRUE(collection.ok());
  Corpus corpus(kDim, 17);
  std::vector<Document> sources;
  std::vector<Document> documents = FamiliesAndNoise(corpus, 200, 2400, &sources);
  for (Document& document : documents) {
    document.attributes["group"] = static_cast<int64_t>(document.id.size() % 3);
  }
  UpsertAll(**collection, std::vector<Document>(documents.begin(), documents.begin() + 300));
  EXPECT_EQ(StageOf(**collection), "IDMap2,Flat");
  UpsertAll(**collection, std::vector<Document>(documents.begin() + 300, documents.end()));
  Impl(**collection).WaitForTrainingForTesting();
  const CollectionStats stats = (*collection)->Stats();
  ASSERT_TRUE(absl::StartsWith(stats.candidate_indexes[0], "Centroid"))
      << stats.candidate_indexes[0];
  EXPECT_EQ(stats.candidate_vectors, stats.rerank_vectors);
  // The lists' 1-bit residuals of dim 48 are 6 bytes, plus the ordinal; the codebook is
  // amortised.
  EXPECT_LT(stats.candidate_bytes, stats.rerank_vectors * 40);

  double recall = 0, filtered_recall = 0;
  const int queries = 40;
  for (int q = 0; q < queries; ++q) {
    const std::vector<float> query = corpus.QueryFrom(sources[q * 5], 24);
    const FloatMatrixView view{query.data(), 24, kDim};
    SearchOptions options;
    auto fast = (*collection)->Search(view, options);
    options.exhaustive = true;
    auto exact = (*collection)->Search(view, options);
    ASSERT_TRUE(fast.ok() && exact.ok()) << fast.status() << exact.status();
    EXPECT_FALSE(fast->exhaustive);
    EXPECT_LE(fast->documents_scored, 400);  // the default N on the centroid index
    std::set<std::string> truth;
    for (const SearchHit& hit : exact->hits) truth.insert(hit.id);
    for (const SearchHit& hit : fast->hits) recall += truth.count(hit.id) / 10.0;

    SearchOptions filtered;
    filtered.filter.all_of.push_back(
        FilterCondition{"group", FilterCondition::Op::kEq, {int64_t{1}}});
    filtered.explain = true;
    auto fast_filtered = (*collection)->Search(view, filtered);
    filtered.exhaustive = true;
    auto exact_filtered = (*collection)->Search(view, filtered);
    ASSERT_TRUE(fast_filtered.ok() && exact_filtered.ok());
    ASSERT_EQ(fast_filtered->hits.size(), 10u);
    std::set<std::string> filtered_truth;
    for (const SearchHit& hit : exact_filtered->hits) filtered_truth.insert(hit.id);
    for (const SearchHit& hit : fast_filtered->hits) {
      EXPECT_EQ(hit.id.size() % 3, 1u) << hit.id;
      EXPECT_EQ(hit.explanation.size(), 24u);
      filtered_recall += filtered_truth.count(hit.id) / 10.0;
    }
  }
  recall /= queries;
  filtered_recall /= queries;
  std::cout << "centroid stage recall@10 " << recall << ", filtered " << filtered_recall << "\n";
  EXPECT_GE(recall, 0.95);
  EXPECT_GE(filtered_recall, 0.95);

  // The candidate vectors of the documents written before the switch are deleted from disk.
  collection->reset();
  engine->reset();
  int shards = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path() + "/collections")) {
    internal::ShardStoreOptions options;
    options.create_if_missing = false;
    auto store = internal::ShardStore::Open((entry.path() / "shard-000" / "db").string(), options);
    ASSERT_TRUE(store.ok()) << store.status();
    int64_t candidates = 0;
    ASSERT_TRUE((*store)
                    ->ForEachCandidates(0,
                                        [&candidates](uint64_t, const internal::StoredMatrix&) {
                                          ++candidates;
                                          return absl::OkStatus();
                                        })
                    .ok());
    EXPECT_EQ(candidates, 0);
    EXPECT_EQ((*store)->Stats().documents, static_cast<int64_t>(documents.size()));
    ++shards;
  }
  EXPECT_EQ(shards, 1);
}

// Arms a training hook that blocks the training (after it encoded the shard, before it catches up
// and swaps) until Release().
class TrainingGate {
 public:
  explicit TrainingGate(internal::CollectionImpl& collection) {
    collection.SetTrainingHookForTesting([this] {
      if (!armed_.exchange(false)) return;
      reached_.set_value();
      released_.wait();
    });
  }
  void Arm() {
    reached_ = std::promise<void>();
    release_ = std::promise<void>();
    released_ = release_.get_future().share();
    armed_ = true;
  }
  // True when a training reached the hook within the timeout.
  bool WaitReached() {
    return reached_.get_future().wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  }
  void Release() { release_.set_value(); }

 private:
  std::atomic<bool> armed_{false};
  std::promise<void> reached_;
  std::promise<void> release_;
  std::shared_future<void> released_;
};

// Documents written, replaced and deleted while a training runs, and the checks that they are
// found (by their own tokens) or never returned.
class LiveWrites {
 public:
  LiveWrites(Collection& collection, Corpus& corpus) : collection_(collection), corpus_(corpus) {}

  void WriteRound(int round) {
    std::vector<Document> batch;
    for (int i = 0; i < 60; ++i) {
      batch.push_back(corpus_.Make(absl::StrCat("live", round, "-", i), 40));
    }
    // Replace some of the previous round's documents and delete others.
    for (int i = 0; i < 20 && !found_.empty(); ++i) {
      const std::string id = found_.begin()->first;
      found_.erase(found_.begin());
      batch.push_back(corpus_.Make(id, 40));
    }
    std::vector<std::string> deletes;
    for (int i = 0; i < 20 && !found_.empty(); ++i) {
      deletes.push_back(found_.begin()->first);
      deleted_[found_.begin()->first] = found_.begin()->second;
      found_.erase(found_.begin());
    }
    for (const Document& document : batch) {
      found_[document.id] = document;
      deleted_.erase(document.id);
    }
    ExpectAllOk(collection_.Upsert(batch));
    ASSERT_TRUE(collection_.Delete(deletes).ok());
  }

  void Check() {
    for (const auto& [id, document] : found_) {
      auto result = collection_.Search(
          FloatMatrixView{document.tokens.data(), document.num_tokens, document.dim}, {});
      ASSERT_TRUE(result.ok()) << result.status();
      ASSERT_FALSE(result->hits.empty());
      EXPECT_EQ(result->hits[0].id, id) << "an acknowledged upsert is not found first";
    }
    for (const auto& [id, document] : deleted_) {
      EXPECT_EQ(collection_.Get(id).status().code(), absl::StatusCode::kNotFound) << id;
      SearchOptions options;
      options.k = 50;
      auto result = collection_.Search(
          FloatMatrixView{document.tokens.data(), document.num_tokens, document.dim}, options);
      ASSERT_TRUE(result.ok());
      for (const SearchHit& hit : result->hits) EXPECT_NE(hit.id, id) << "a deleted document";
    }
  }

 private:
  Collection& collection_;
  Corpus& corpus_;
  std::map<std::string, Document> found_;
  std::map<std::string, Document> deleted_;
};

// Both modes: stored rerank vectors, and rerank_from_codes, whose retraining re-encodes the
// documents (those written during it too) from their decoded codes.
TEST(CentroidStage, WritesDuringTrainingAndRetrainingAreFoundAndDeletesNeverReturned) {
  for (const bool compact : {false, true}) {
    SCOPED_TRACE(compact ? "rerank_from_codes" : "rerank vectors stored");
    TempDir dir;
    Corpus corpus(kDim, 23);
    std::vector<Document> sources;
    // ~2,500 documents of ~20 vectors: past kRetrainGrowth × the first training's ~10,000.
    const std::vector<Document> documents = FamiliesAndNoise(corpus, 60, 2000, &sources);
    {
      auto engine = Engine::Open(dir.path());
      ASSERT_TRUE(engine.ok());
      CollectionSchema schema = CentroidSchema("live", 8'000);
      schema.candidates.rerank_from_codes = compact;
      auto collection = (*engine)->CreateCollection(schema);
      ASSERT_TRUE(collection.ok());
      TrainingGate gate(Impl(**collection));
      LiveWrites live(**collection, corpus);

      // The first training: from the exact candidate scan to the centroid index.
      gate.Arm();
      UpsertAll(**collection, std::vector<Document>(documents.begin(), documents.begin() + 500));
      ASSERT_TRUE(gate.WaitReached());
      EXPECT_EQ(StageOf(**collection), "IDMap2,Flat");
      for (int round = 0; round < 3; ++round) live.WriteRound(round);
      live.Check();
      gate.Release();
      Impl(**collection).WaitForTrainingForTesting();
      ASSERT_TRUE(absl::StartsWith(StageOf(**collection), "Centroid")) << StageOf(**collection);
      live.Check();

      // A retrain once the shard has grown kRetrainGrowth times, with writes going on against the
      // old index.
      gate.Arm();
      UpsertAll(**collection, std::vector<Document>(documents.begin() + 500, documents.end()));
      const int64_t centroids = Impl(**collection).CodebookForTesting(0)->num_centroids();
      ASSERT_TRUE(gate.WaitReached());
      for (int round = 3; round < 6; ++round) live.WriteRound(round);
      live.Check();
      gate.Release();
      Impl(**collection).WaitForTrainingForTesting();
      EXPECT_GT(Impl(**collection).CodebookForTesting(0)->num_centroids(), centroids)
          << "not retrained";
      live.Check();
      for (int round = 6; round < 8; ++round) live.WriteRound(round);
      live.Check();
      ASSERT_TRUE((*collection)->Snapshot().ok());
    }
    // Reopened: the lists come back from the stored codes.
    auto engine = Engine::Open(dir.path());
    ASSERT_TRUE(engine.ok());
    auto collection = (*engine)->GetCollection("live");
    ASSERT_TRUE(collection.ok());
    ASSERT_TRUE(absl::StartsWith(StageOf(**collection), "Centroid"));
    const CollectionStats stats = (*collection)->Stats();
    EXPECT_EQ(stats.candidate_vectors, stats.rerank_vectors);
    for (int q = 0; q < 20; ++q) {
      const std::vector<float> query = corpus.QueryFrom(sources[q], 24);
      SearchOptions options;
      auto fast = (*collection)->Search(FloatMatrixView{query.data(), 24, kDim}, options);
      ASSERT_TRUE(fast.ok());
      EXPECT_EQ(fast->hits.size(), 10u);
    }
  }
}

// Sets the codebook sizing rule for one scope and restores the one before it.
class ScopedCentroidSizing {
 public:
  explicit ScopedCentroidSizing(internal::CentroidSizing sizing)
      : previous_(internal::GetCentroidSizing()) {
    internal::SetCentroidSizingForTesting(sizing);
  }
  ~ScopedCentroidSizing() { internal::SetCentroidSizingForTesting(previous_); }

 private:
  const internal::CentroidSizing previous_;
};

// A 20,000-document shard on the list-length codebook rule (not the default: see
// CentroidSizing): the codebook has what DefaultNumCentroids asks for its vectors (lists of
// 128–256 on average), comes from the two-level training (its cells stored as groups), and the
// default search (nprobe, N) keeps recall@10 ≥ 0.95 against exhaustive MaxSim over every document.
TEST(CentroidStage, ATwentyThousandDocumentShardOnTheListLengthRuleKeepsRecall) {
  ScopedCentroidSizing list_length(internal::CentroidSizing::kListLength);
  TempDir dir;
  Corpus corpus(kDim, 37);
  std::vector<Document> sources;
  const std::vector<Document> documents = FamiliesAndNoise(corpus, 500, 16'000, &sources);
  ASSERT_EQ(documents.size(), 20'000u);
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok());
  auto collection = (*engine)->CreateCollection(CentroidSchema("twenty_k", 100'000));
  ASSERT_TRUE(collection.ok());
  UpsertAll(**collection, documents);
  Impl(**collection).WaitForTrainingForTesting();
  const CollectionStats stats = (*collection)->Stats();
  const int64_t centroids = internal::DefaultNumCentroids(stats.rerank_vectors);
  EXPECT_EQ(StageOf(**collection), absl::StrCat("Centroid", centroids, ",Residual2bit"));
  EXPECT_GE(stats.rerank_vectors / centroids, 128);
  EXPECT_LT(stats.rerank_vectors / centroids, 256);
  const std::shared_ptr<const internal::CentroidCodebook> codebook =
      Impl(**collection).CodebookForTesting(0);
  ASSERT_NE(codebook, nullptr);
  EXPECT_GT(codebook->stored_groups(), 0);

  double recall = 0;
  const int queries = 50;
  for (int q = 0; q < queries; ++q) {
    const std::vector<float> query = corpus.QueryFrom(sources[q * 10], 24);
    const FloatMatrixView view{query.data(), 24, kDim};
    SearchOptions options;
    auto fast = (*collection)->Search(view, options);
    options.exhaustive = true;
    auto exact = (*collection)->Search(view, options);
    ASSERT_TRUE(fast.ok() && exact.ok()) << fast.status() << exact.status();
    EXPECT_FALSE(fast->exhaustive);
    ASSERT_EQ(exact->hits.size(), 10u);
    std::set<std::string> truth;
    for (const SearchHit& hit : exact->hits) truth.insert(hit.id);
    for (const SearchHit& hit : fast->hits) recall += truth.count(hit.id) / 10.0;
  }
  recall /= queries;
  std::cout << "20k documents, " << stats.rerank_vectors << " vectors, " << centroids
            << " centroids: recall@10 " << recall << "\n";
  EXPECT_GE(recall, 0.95);
}

// A shard that outgrows a running training retrains as soon as that training ends, without
// waiting for another write (once ingest is over, none may come).
TEST(CentroidStage, AShardThatOutgrewARunningTrainingRetrainsWhenItEnds) {
  TempDir dir;
  Corpus corpus(kDim, 29);
  std::vector<Document> sources;
  const std::vector<Document> documents = FamiliesAndNoise(corpus, 60, 1800, &sources);
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok());
  auto collection = (*engine)->CreateCollection(CentroidSchema("outgrown", 5'000));
  ASSERT_TRUE(collection.ok());
  TrainingGate gate(Impl(**collection));
  gate.Arm();
  UpsertAll(**collection, std::vector<Document>(documents.begin(), documents.begin() + 400));
  ASSERT_TRUE(gate.WaitReached());
  const int64_t first_training = (*collection)->Stats().rerank_vectors;
  // Past kRetrainGrowth × what the blocked training counted, while it still runs.
  UpsertAll(**collection, std::vector<Document>(documents.begin() + 400, documents.end()));
  const int64_t vectors = (*collection)->Stats().rerank_vectors;
  ASSERT_GE(vectors, internal::kRetrainGrowth * first_training);
  gate.Release();
  Impl(**collection).WaitForTrainingForTesting();
  // The codebook is the one for the grown shard (DefaultNumCentroids of all its vectors), not the
  // one the first training sized from its count.
  EXPECT_NE(internal::DefaultNumCentroids(first_training), internal::DefaultNumCentroids(vectors));
  EXPECT_EQ(StageOf(**collection),
            absl::StrCat("Centroid", internal::DefaultNumCentroids(vectors), ",Residual2bit"));
}

// A shard whose size calls for more centroids than its codebook has retrains, even short of
// kRetrainGrowth × what its last training counted: a training that started late (blocked here)
// must not leave a grown shard on a codebook sized for fewer vectors.
TEST(CentroidStage, AShardRetrainsWhenItsSizeCallsForMoreCentroids) {
  TempDir dir;
  Corpus corpus(kDim, 31);
  std::vector<Document> sources;
  const std::vector<Document> documents = FamiliesAndNoise(corpus, 60, 3600, &sources);
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok());
  auto collection = (*engine)->CreateCollection(CentroidSchema("late", 20'000));
  ASSERT_TRUE(collection.ok());
  TrainingGate gate(Impl(**collection));
  gate.Arm();
  // Up to the first training, which the gate holds; then to a size whose codebook is twice its.
  size_t written = 0;
  auto write_until = [&](int64_t vectors) {
    while ((*collection)->Stats().rerank_vectors < vectors && written < documents.size()) {
      const size_t end = std::min(documents.size(), written + 64);
      UpsertAll(**collection,
                std::vector<Document>(documents.begin() + written, documents.begin() + end));
      written = end;
    }
  };
  write_until(20'000);
  ASSERT_TRUE(gate.WaitReached());
  const int64_t first_training = (*collection)->Stats().rerank_vectors;
  write_until(66'000);
  const int64_t vectors = (*collection)->Stats().rerank_vectors;
  ASSERT_LT(vectors, internal::kRetrainGrowth * first_training);
  ASSERT_GT(internal::DefaultNumCentroids(vectors), internal::DefaultNumCentroids(first_training));
  gate.Release();
  Impl(**collection).WaitForTrainingForTesting();
  EXPECT_EQ(StageOf(**collection),
            absl::StrCat("Centroid", internal::DefaultNumCentroids(vectors), ",Residual2bit"));
}

// CompactQuery::ErrorBound of `query` (nq × kDim) under shard 0's codebook: how far a score
// from codes may be from the MaxSim of the decoded vectors, fp32 rounding aside.
double CodesErrorBound(Collection& collection, const std::vector<float>& query) {
  const std::shared_ptr<const internal::CentroidCodebook> codebook =
      Impl(collection).CodebookForTesting(0);
  EXPECT_NE(codebook, nullptr);
  if (codebook == nullptr) return 0.0;
  const internal::CompactQuery compact(codebook->codec(), query.data(),
                                       static_cast<int64_t>(query.size()) / kDim, nullptr, 0);
  return compact.ErrorBound();
}

// A rerank_from_codes collection over FamiliesAndNoise(corpus, families, noise) of a
// Corpus(kDim, seed), fp32 (so Get returns exactly the decoded vectors), whose shard trains its
// codebook once it holds 4,000 rerank vectors.
struct CodesCollection {
  CodesCollection(uint32_t seed, int families, int noise) : corpus(kDim, seed) {
    documents = FamiliesAndNoise(corpus, families, noise, &sources);
    for (const Document& document : documents) ids.push_back(document.id);
  }

  // Creates the collection (residual_bits 0: the default), writes the first `train_on` documents,
  // waits for the training they start and checks that stage 1 is the centroid index; then writes
  // the rest (stored as codes only: the training re-encoded the first ones and dropped their
  // rerank vectors) and waits again. Call under ASSERT_NO_FATAL_FAILURE.
  void Create(int residual_bits, size_t train_on) {
    auto opened = Engine::Open(dir.path());
    ASSERT_TRUE(opened.ok()) << opened.status();
    engine = std::move(*opened);
    CollectionSchema schema = Schema("codes", kDim);
    schema.dtype = VectorDtype::kFloat32;
    schema.candidates.rerank_from_codes = true;
    schema.candidates.residual_bits = residual_bits;
    schema.candidates.centroid_min_training_vectors = 4'000;
    auto created = engine->CreateCollection(schema);
    ASSERT_TRUE(created.ok()) << created.status();
    collection = std::move(*created);
    UpsertAll(*collection, std::vector<Document>(documents.begin(), documents.begin() + train_on));
    Impl(*collection).WaitForTrainingForTesting();
    ASSERT_TRUE(absl::StartsWith(StageOf(*collection), "Centroid")) << StageOf(*collection);
    if (train_on < documents.size()) {
      UpsertAll(*collection, std::vector<Document>(documents.begin() + train_on, documents.end()));
      Impl(*collection).WaitForTrainingForTesting();
    }
  }

  TempDir dir;
  Corpus corpus;
  std::vector<Document> sources;
  std::vector<Document> documents;
  std::vector<std::string> ids;  // the documents'
  std::unique_ptr<Engine> engine;
  std::shared_ptr<Collection> collection;
};

// rerank_from_codes scores the documents stored as codes only from their codes (compact MaxSim,
// code_maxsim.h), without decoding them: within CompactQuery::ErrorBound of the MaxSim of their
// decoded vectors (fp32 here, so Get returns exactly those), merged in one ranking with the
// documents written before the codebook (exact over their stored vectors). Exhaustive and default
// search alike; the top 10 is brute force's except at near-ties; explain names the best decoded
// vector per query token and does not change the ranking.
TEST(CentroidStage, RerankFromCodesScoresWithinTheErrorBound) {
  for (const int bits : {2, 4}) {
    SCOPED_TRACE(absl::StrCat("residual_bits ", bits));
    // The first 200 documents train the codebook; the rest are stored as codes only.
    CodesCollection codes(57, 40, 600);
    ASSERT_NO_FATAL_FAILURE(codes.Create(bits, 200));
    Collection& collection = *codes.collection;

    double largest_error = 0;
    for (int q = 0; q < 10; ++q) {
      SCOPED_TRACE(absl::StrCat("query ", q));
      const std::vector<float> query = codes.corpus.QueryFrom(codes.sources[q], 24);
      const FloatMatrixView view{query.data(), 24, kDim};
      const auto expected = BruteForce(collection, codes.ids, query, kDim);
      const std::map<std::string, double> exact(expected.begin(), expected.end());
      // The kernel's bound plus fp32 rounding (scores are ~24 × unit dot products).
      const double bound = CodesErrorBound(collection, query);
      const double tolerance = bound + 1e-4;
      ASSERT_GT(bound, 0.0);

      SearchOptions exhaustive;
      exhaustive.exhaustive = true;
      exhaustive.k = 50;
      auto result = collection.Search(view, exhaustive);
      ASSERT_TRUE(result.ok()) << result.status();
      ASSERT_EQ(result->hits.size(), 50u);
      for (size_t i = 0; i < result->hits.size(); ++i) {
        const SearchHit& hit = result->hits[i];
        const double error = std::fabs(hit.score - exact.at(hit.id));
        EXPECT_LE(error, tolerance) << hit.id << ": " << hit.score << " vs " << exact.at(hit.id)
                                    << " over the decoded vectors, bound " << bound;
        largest_error = std::max(largest_error, error);
        if (i < 10 && hit.id != expected[i].first) {  // only at a near-tie
          EXPECT_NEAR(exact.at(hit.id), expected[i].second, 2 * tolerance)
              << "rank " << i << ": " << hit.id << " instead of " << expected[i].first;
        }
      }

      // Explain: the same ranking and scores; per query token the best decoded vector.
      exhaustive.k = 10;
      exhaustive.explain = true;
      auto explained = collection.Search(view, exhaustive);
      ASSERT_TRUE(explained.ok()) << explained.status();
      ASSERT_EQ(explained->hits.size(), 10u);
      for (size_t i = 0; i < 10; ++i) {
        const SearchHit& hit = explained->hits[i];
        EXPECT_EQ(hit.id, result->hits[i].id);
        EXPECT_EQ(hit.score, result->hits[i].score);
        auto vectors = collection.Get(hit.id);
        ASSERT_TRUE(vectors.ok()) << vectors.status();
        ASSERT_EQ(hit.explanation.size(), 24u);
        double total = 0;
        for (const TokenMatch& match : hit.explanation) {
          ASSERT_GE(match.document_vector, 0);
          ASSERT_LT(match.document_vector, vectors->num_vectors());
          double best = -INFINITY;
          for (int64_t v = 0; v < vectors->num_vectors(); ++v) {
            double dot = 0;
            for (int64_t k = 0; k < kDim; ++k) {
              dot += static_cast<double>(query[match.query_token * kDim + k]) *
                     vectors->vectors[v * kDim + k];
            }
            best = std::max(best, dot);
          }
          EXPECT_NEAR(match.similarity, best, 1e-5) << hit.id << " token " << match.query_token;
          total += match.similarity;
        }
        EXPECT_NEAR(total, hit.score, tolerance) << hit.id;
      }

      // The cascade (stage 1, then its N documents scored from the codes, with the centroid
      // scores stage 1 kept): the same scores, bit for bit, as the exhaustive search's (which
      // runs no stage 1 and scores the centroids itself).
      SearchOptions cascade;
      cascade.num_candidates = 100;
      auto nominated = collection.Search(view, cascade);
      ASSERT_TRUE(nominated.ok()) << nominated.status();
      ASSERT_EQ(nominated->hits.size(), 10u);
      std::map<std::string, float> exhaustive_scores;
      for (const SearchHit& hit : result->hits) exhaustive_scores[hit.id] = hit.score;
      for (const SearchHit& hit : nominated->hits) {
        EXPECT_NEAR(hit.score, exact.at(hit.id), tolerance) << hit.id;
        const auto it = exhaustive_scores.find(hit.id);
        if (it != exhaustive_scores.end()) {
          EXPECT_EQ(hit.score, it->second) << hit.id;
        }
      }
      EXPECT_EQ(nominated->hits[0].id, result->hits[0].id);
    }
    // Scored from the codes, not from decoded floats (whose fp32 MaxSim is within ~1e-5).
    EXPECT_GT(largest_error, 1e-4);
  }
}

// An exhaustive search from codes over more documents than one scoring batch (4,096) scores the
// query's centroids once for the shard (Shard::ScoreCentroids) instead of once per batch: the
// same scores, bit for bit, as the cascade's (whose stage 1 kept its table), and within the
// kernel's bound of brute force over the decoded vectors.
TEST(CentroidStage, AnExhaustiveSearchFromCodesOverManyBatchesScoresLikeTheCascade) {
  CodesCollection codes(91, 20, 4'500);
  ASSERT_NO_FATAL_FAILURE(codes.Create(/*residual_bits=*/0, codes.documents.size()));
  Collection& collection = *codes.collection;
  ASSERT_GT(codes.documents.size(), 4'096u);

  for (int q = 0; q < 3; ++q) {
    SCOPED_TRACE(absl::StrCat("query ", q));
    const std::vector<float> query = codes.corpus.QueryFrom(codes.sources[q], 24);
    const FloatMatrixView view{query.data(), 24, kDim};
    const auto expected = BruteForce(collection, codes.ids, query, kDim);
    const std::map<std::string, double> exact(expected.begin(), expected.end());
    const double tolerance = CodesErrorBound(collection, query) + 1e-4;

    SearchOptions exhaustive;
    exhaustive.exhaustive = true;
    exhaustive.k = 1'000;  // the most a search returns: documents of both batches among them
    auto all = collection.Search(view, exhaustive);
    ASSERT_TRUE(all.ok()) << all.status();
    ASSERT_EQ(all->hits.size(), 1'000u);
    EXPECT_EQ(all->documents_scored, static_cast<int64_t>(codes.documents.size()));
    std::map<std::string, float> scores;
    for (const SearchHit& hit : all->hits) {
      EXPECT_NEAR(hit.score, exact.at(hit.id), tolerance) << hit.id;
      scores[hit.id] = hit.score;
    }
    SearchOptions cascade;
    cascade.num_candidates = 100;
    auto nominated = collection.Search(view, cascade);
    ASSERT_TRUE(nominated.ok()) << nominated.status();
    ASSERT_EQ(nominated->hits.size(), 10u);
    for (const SearchHit& hit : nominated->hits) EXPECT_EQ(hit.score, scores.at(hit.id)) << hit.id;
  }
}

// rerank_from_codes: documents written once the codebook exists store no rerank vectors; stage 2,
// Get and explain use the decoded codes, consistently; the disk holds far less; nothing retrains;
// a reopen and deletes behave as with stored vectors.
TEST(CentroidStage, RerankFromCodesScoresTheDecodedVectors) {
  TempDir dir;
  Corpus corpus(kDim, 31);
  std::vector<Document> sources;
  const std::vector<Document> documents = FamiliesAndNoise(corpus, 60, 900, &sources);
  std::vector<std::string> ids;
  for (const Document& document : documents) ids.push_back(document.id);
  constexpr int64_t kTraining = 4'000;
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok());
  CollectionSchema schema = Schema("codes", kDim);
  schema.candidates.rerank_from_codes = true;
  schema.candidates.residual_bits = 4;
  schema.candidates.centroid_min_training_vectors = kTraining;
  CollectionSchema stored_schema = schema;
  stored_schema.name = "stored";
  stored_schema.candidates.rerank_from_codes = false;
  stored_schema.candidates.factory = "centroid";
  auto codes = (*engine)->CreateCollection(schema);
  auto stored = (*engine)->CreateCollection(stored_schema);
  ASSERT_TRUE(codes.ok() && stored.ok());
  // Before the codebook: stored rerank vectors, Get returns them exactly.
  const Document& first = documents[0];
  ExpectAllOk((*codes)->Upsert({first}));
  auto exact_get = (*codes)->Get(first.id);
  ASSERT_TRUE(exact_get.ok());
  // The first 300 documents train the codebook; the rest are written with it.
  UpsertAll(**codes, std::vector<Document>(documents.begin(), documents.begin() + 300));
  Impl(**codes).WaitForTrainingForTesting();
  ASSERT_TRUE(absl::StartsWith(StageOf(**codes), "Centroid")) << StageOf(**codes);
  UpsertAll(**codes, std::vector<Document>(documents.begin() + 300, documents.end()));
  UpsertAll(**stored, documents);
  Impl(**codes).WaitForTrainingForTesting();
  Impl(**stored).WaitForTrainingForTesting();
  ASSERT_TRUE(absl::StartsWith(StageOf(**codes), "Centroid")) << StageOf(**codes);
  // The training ran at kTraining vectors and was never repeated, though the shard grew past 2×.
  EXPECT_GT((*codes)->Stats().rerank_vectors, 4 * kTraining);
  const std::string first_stage = StageOf(**codes);
  const Document later = corpus.Make("late", 40);
  ExpectAllOk((*codes)->Upsert({later}));
  ExpectAllOk((*stored)->Upsert({later}));
  ids.push_back(later.id);
  Impl(**codes).WaitForTrainingForTesting();
  EXPECT_EQ(StageOf(**codes), first_stage);

  // Decoded vectors: close to the stored ones (4-bit residuals), not equal.
  auto decoded = (*codes)->Get(later.id);
  auto original = (*stored)->Get(later.id);
  ASSERT_TRUE(decoded.ok() && original.ok()) << decoded.status() << original.status();
  ASSERT_EQ(decoded->num_vectors(), original->num_vectors());
  double error = 0, norm = 0;
  for (size_t i = 0; i < decoded->vectors.size(); ++i) {
    error += std::pow(decoded->vectors[i] - original->vectors[i], 2);
    norm += std::pow(original->vectors[i], 2);
  }
  EXPECT_GT(error, 0.0);
  EXPECT_LT(error, 0.05 * norm) << "relative squared error of the decoded vectors";

  // Scores are MaxSim over the decoded vectors Get returns, within the compact kernel's error
  // bound (and the fp16 rounding of Get's vectors); explain names real vectors.
  double recall = 0;
  for (int q = 0; q < 10; ++q) {
    const std::vector<float> query = corpus.QueryFrom(sources[q], 24);
    SearchOptions options;
    options.exhaustive = true;
    options.explain = true;
    auto result = (*codes)->Search(FloatMatrixView{query.data(), 24, kDim}, options);
    ASSERT_TRUE(result.ok()) << result.status();
    const auto expected = BruteForce(**codes, ids, query, kDim);
    const std::map<std::string, double> exact(expected.begin(), expected.end());
    // fp16 rounds each decoded value by ≤ 2⁻¹¹ of it: ≤ 24 × 2⁻¹¹ · |q_i| · |d| for vectors of
    // norm ≤ 1 (pooled unit vectors; decoding adds a little), doubled for margin.
    const double tolerance = CodesErrorBound(**codes, query) + 2 * 24 * std::ldexp(1.0, -11);
    ASSERT_EQ(result->hits.size(), 10u);
    for (size_t i = 0; i < 10; ++i) {
      const double score = exact.at(result->hits[i].id);
      EXPECT_NEAR(result->hits[i].score, score, tolerance) << result->hits[i].id;
      if (result->hits[i].id != expected[i].first) {  // only at a near-tie
        EXPECT_NEAR(score, expected[i].second, 2 * tolerance) << result->hits[i].id;
      }
      EXPECT_EQ(result->hits[i].explanation.size(), 24u);
    }
    // Against the exhaustive search over the stored vectors: the approximation keeps the top 10.
    auto reference = (*stored)->Search(FloatMatrixView{query.data(), 24, kDim}, options);
    ASSERT_TRUE(reference.ok());
    std::set<std::string> truth;
    for (const SearchHit& hit : reference->hits) truth.insert(hit.id);
    for (const SearchHit& hit : result->hits) recall += truth.count(hit.id) / 100.0;
  }
  EXPECT_GE(recall, 0.9);

  // Far less on disk: codes (4 + 24 bytes per vector) instead of fp16 vectors (96 bytes).
  ASSERT_TRUE((*codes)->Snapshot().ok() && (*stored)->Snapshot().ok());
  EXPECT_LT((*codes)->Stats().disk_bytes, 0.6 * (*stored)->Stats().disk_bytes)
      << (*codes)->Stats().disk_bytes << " vs " << (*stored)->Stats().disk_bytes;
  // Both keep their codes in codes segments once flushed (a centroid id and 48 · 4 / 8 residual
  // bytes per vector, and the files' framing); only the stored collection keeps fp16 rows in
  // rerank segments as well (48 · 2 bytes per vector).
  const CollectionStats codes_stats = (*codes)->Stats();
  const CollectionStats stored_stats = (*stored)->Stats();
  for (const CollectionStats* stats : {&codes_stats, &stored_stats}) {
    EXPECT_GE(stats->segments.code_segments, 1);
    EXPECT_GE(stats->segments.code_segment_bytes, stats->rerank_vectors * (4 + kDim * 4 / 8));
    EXPECT_EQ(stats->segments.code_unflushed_bytes, 0);
    EXPECT_EQ(stats->segments.rerank_unflushed_bytes, 0);
  }
  EXPECT_GE(stored_stats.segments.rerank_segments, 1);
  EXPECT_GE(stored_stats.segments.rerank_segment_bytes, stored_stats.rerank_vectors * kDim * 2);
  EXPECT_LT(codes_stats.segments.rerank_segment_bytes,
            stored_stats.segments.rerank_segment_bytes / 4)
      << "only the first document's rows, written before the codebook";

  // Deleted documents are gone; a reopen serves the same decoded vectors.
  ASSERT_TRUE((*codes)->Delete({documents[5].id}).ok());
  EXPECT_EQ((*codes)->Get(documents[5].id).status().code(), absl::StatusCode::kNotFound);
  const std::vector<float> before = decoded->vectors;
  codes = absl::NotFoundError("closed");
  stored = absl::NotFoundError("closed");
  engine = absl::NotFoundError("closed");
  engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok());
  codes = (*engine)->GetCollection("codes");
  ASSERT_TRUE(codes.ok());
  auto reopened = (*codes)->Get(later.id);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ(reopened->vectors, before);
  EXPECT_EQ((*codes)->Get(documents[5].id).status().code(), absl::StatusCode::kNotFound);
  // Written before the codebook, re-encoded by its training: Get decodes its codes too.
  auto again = (*codes)->Get(first.id);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->vectors.size(), exact_get->vectors.size());
  EXPECT_NE(again->vectors, exact_get->vectors);
  double first_error = 0, first_norm = 0;
  for (size_t i = 0; i < again->vectors.size(); ++i) {
    first_error += std::pow(again->vectors[i] - exact_get->vectors[i], 2);
    first_norm += std::pow(exact_get->vectors[i], 2);
  }
  EXPECT_LT(first_error, 0.05 * first_norm) << "relative squared error of the decoded vectors";
}

// Every shard database under `root`: the directories named "db".
std::vector<std::string> ShardDatabases(const std::string& root) {
  std::vector<std::string> dirs;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.is_directory() && entry.path().filename() == "db") {
      dirs.push_back(entry.path().string());
    }
  }
  return dirs;
}

// rerank_from_codes, compact mode: 4 bits by default; the training that makes the codebook
// re-encodes the documents written before it and drops their fp16 rerank and fp32 candidate
// vectors (none remains in the store, in RocksDB or in a segment), and they still answer from
// their codes; stage 1 holds exactly the live documents' codes after deletes; a reopen rebuilds
// the lists from the stored codes and answers the same, bit for bit.
TEST(CentroidStage, RerankFromCodesKeepsNoVectorsOfDocumentsWrittenBeforeTheCodebook) {
  TempDir dir;
  Corpus corpus(kDim, 43);
  std::vector<Document> sources;
  const std::vector<Document> documents = FamiliesAndNoise(corpus, 30, 500, &sources);
  std::vector<std::string> ids;
  for (const Document& document : documents) ids.push_back(document.id);
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok());
  CollectionSchema schema = Schema("codes", kDim);
  schema.num_shards = 2;
  schema.candidates.rerank_from_codes = true;  // residual_bits left at 0: the mode's default
  schema.candidates.centroid_min_training_vectors = 2'000;
  auto collection = (*engine)->CreateCollection(schema);
  ASSERT_TRUE(collection.ok()) << collection.status();
  // ~125 documents per shard train its codebook: written with fp16 rerank vectors and fp32
  // candidate vectors, which the rerank vectors' segments receive once flushed.
  UpsertAll(**collection, std::vector<Document>(documents.begin(), documents.begin() + 250));
  ASSERT_TRUE((*collection)->Snapshot().ok());  // moves the rerank rows into segments
  Impl(**collection).WaitForTrainingForTesting();
  for (int s = 0; s < 2; ++s) {
    const auto codebook = Impl(**collection).CodebookForTesting(s);
    ASSERT_NE(codebook, nullptr) << "shard " << s;
    EXPECT_EQ(codebook->codec().nbits(), 4) << "shard " << s << ": the compact mode's default";
  }
  UpsertAll(**collection, std::vector<Document>(documents.begin() + 250, documents.end()));
  // Deletes of documents written before and after the codebook.
  std::vector<std::string> deleted;
  for (size_t d = 0; d < documents.size(); d += 37) deleted.push_back(documents[d].id);
  ASSERT_TRUE((*collection)->Delete(deleted).ok());
  Impl(**collection).WaitForTrainingForTesting();
  const CollectionStats stats = (*collection)->Stats();
  EXPECT_EQ(stats.documents, static_cast<int64_t>(documents.size() - deleted.size()));
  // Stage 1's codes (stage 2's too) are the live documents' vectors, no more.
  EXPECT_EQ(stats.candidate_vectors, stats.rerank_vectors);

  // Exhaustive and default searches: brute force's top 10 over the decoded vectors (except at
  // near-ties), never a deleted document.
  const std::set<std::string> gone(deleted.begin(), deleted.end());
  std::vector<std::vector<std::pair<std::string, float>>> answers;
  std::vector<std::vector<float>> queries;
  for (int q = 0; q < 6; ++q) {
    SCOPED_TRACE(absl::StrCat("query ", q));
    queries.push_back(corpus.QueryFrom(sources[q * 5], 16));
    const std::vector<float>& query = queries.back();
    const auto expected = BruteForce(**collection, ids, query, kDim);
    const double tolerance = CodesErrorBound(**collection, query) + 2 * 16 * std::ldexp(1.0, -11);
    for (const bool exhaustive : {true, false}) {
      SearchOptions options;
      options.exhaustive = exhaustive;
      auto result = (*collection)->Search(FloatMatrixView{query.data(), 16, kDim}, options);
      ASSERT_TRUE(result.ok()) << result.status();
      ASSERT_EQ(result->hits.size(), 10u);
      std::vector<std::pair<std::string, float>> answer;
      for (size_t i = 0; i < 10; ++i) {
        const SearchHit& hit = result->hits[i];
        EXPECT_EQ(gone.count(hit.id), 0u) << hit.id << " was deleted";
        if (hit.id != expected[i].first) {  // only at a near-tie
          EXPECT_NEAR(hit.score, expected[i].second, 2 * tolerance)
              << "rank " << i << ": " << hit.id << " instead of " << expected[i].first;
        }
        answer.emplace_back(hit.id, hit.score);
      }
      if (exhaustive) answers.push_back(answer);
    }
  }

  // The store: no rerank rows (in RocksDB or in a segment) and no candidate vectors are left.
  collection = absl::NotFoundError("closed");
  engine = absl::NotFoundError("closed");
  const std::vector<std::string> databases = ShardDatabases(dir.path());
  ASSERT_EQ(databases.size(), 2u);
  int64_t documents_seen = 0;
  for (const std::string& db : databases) {
    SCOPED_TRACE(db);
    internal::ShardStoreOptions options;
    options.create_if_missing = false;
    auto store = internal::ShardStore::Open(db, options);
    ASSERT_TRUE(store.ok()) << store.status();
    std::vector<uint64_t> iids;
    ASSERT_TRUE((*store)
                    ->ForEachDocument([&](const internal::DocumentRecord& record) {
                      iids.push_back(record.iid);
                      return absl::OkStatus();
                    })
                    .ok());
    documents_seen += static_cast<int64_t>(iids.size());
    auto rerank = (*store)->MultiGetRerank(iids);
    ASSERT_TRUE(rerank.ok()) << rerank.status();
    for (size_t i = 0; i < iids.size(); ++i) {
      ASSERT_TRUE((*rerank)[i].has_value()) << "iid " << iids[i];
      EXPECT_EQ((*rerank)[i]->rows, 0) << "iid " << iids[i] << " keeps rerank rows";
    }
    int64_t candidates = 0;
    ASSERT_TRUE((*store)
                    ->ForEachCandidates(0,
                                        [&](uint64_t, const internal::StoredMatrix&) {
                                          ++candidates;
                                          return absl::OkStatus();
                                        })
                    .ok());
    EXPECT_EQ(candidates, 0) << "documents with candidate vectors";
    const internal::ShardStoreStats store_stats = (*store)->Stats();
    EXPECT_EQ(store_stats.segments.rerank_segments, 0);
    EXPECT_EQ(store_stats.segments.rerank_unflushed_bytes, 0);
  }
  EXPECT_EQ(documents_seen, static_cast<int64_t>(documents.size() - deleted.size()));

  // Reopened: the lists rebuilt from the stored codes give the same answers, bit for bit.
  engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok());
  collection = (*engine)->GetCollection("codes");
  ASSERT_TRUE(collection.ok());
  for (size_t q = 0; q < queries.size(); ++q) {
    SearchOptions options;
    options.exhaustive = true;
    auto result = (*collection)->Search(FloatMatrixView{queries[q].data(), 16, kDim}, options);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->hits.size(), 10u);
    for (size_t i = 0; i < 10; ++i) {
      EXPECT_EQ(result->hits[i].id, answers[q][i].first) << "query " << q << " rank " << i;
      EXPECT_EQ(result->hits[i].score, answers[q][i].second) << "query " << q << " rank " << i;
    }
  }
}

// The retrain race of rerank_from_codes (shard.h): stage 2 reads each candidate's codes from the
// store under the generation of the Stage1 in use. A search (and a Get, an explain) that took
// generation g, then finds it swapped out and dropped by a training before its read, reads again
// under the new generation: every live document is still scored and decoded, none is silently
// left out.
TEST(CentroidStage, RerankFromCodesReadsThroughARetrainThatDropsItsGeneration) {
  TempDir dir;
  Corpus corpus(kDim, 73);
  std::vector<Document> sources;
  const std::vector<Document> documents = FamiliesAndNoise(corpus, 30, 300, &sources);
  const std::vector<Document> first(documents.begin(), documents.begin() + 100);
  const std::vector<float> query = corpus.QueryFrom(sources[0], 16);
  std::vector<std::string> ids;
  for (const Document& document : documents) ids.push_back(document.id);
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok());
  for (const std::string mode : {"exhaustive", "cascade", "get"}) {
    SCOPED_TRACE(mode);
    CollectionSchema schema = Schema(mode, kDim);
    schema.candidates.rerank_from_codes = true;
    schema.candidates.centroid_min_training_vectors = 2'000;
    auto collection = (*engine)->CreateCollection(schema);
    ASSERT_TRUE(collection.ok()) << collection.status();
    internal::CollectionImpl& impl = Impl(**collection);
    // ~100 documents (~4,000 vectors) train generation 1.
    UpsertAll(**collection, first);
    impl.WaitForTrainingForTesting();
    const auto trained = impl.CodebookForTesting(0);
    ASSERT_NE(trained, nullptr);
    // Between the read's choice of generation 1 and its read of the codes: the rest (~21,000
    // vectors, past kRetrainGrowth × the first training) and the retraining, which swaps
    // generation 2 in and drops generation 1's codes.
    bool retrained = false;
    impl.SetCodeReadHookForTesting(0, [&] {
      UpsertAll(**collection, std::vector<Document>(documents.begin() + 100, documents.end()));
      impl.WaitForTrainingForTesting();
      retrained = impl.CodebookForTesting(0) != trained;
    });
    if (mode == "cascade") {
      // Stage 1 ran under generation 1 and kept its centroid scores; stage 2 reads generation 2's
      // codes, which it must score against generation 2's centroids: every score is within the
      // bound of the MaxSim over the vectors decoded from generation 2.
      SearchOptions options;
      options.num_candidates = 50;
      const FloatMatrixView view{query.data(), 16, kDim};
      auto result = (*collection)->Search(view, options);
      ASSERT_TRUE(result.ok()) << result.status();
      ASSERT_FALSE(result->hits.empty());
      const auto expected = BruteForce(**collection, ids, query, kDim);
      const std::map<std::string, double> exact(expected.begin(), expected.end());
      const double tolerance = CodesErrorBound(**collection, query) + 1e-4;
      for (const SearchHit& hit : result->hits) {
        EXPECT_NEAR(hit.score, exact.at(hit.id), tolerance) << hit.id;
      }
    } else if (mode == "exhaustive") {
      // Every one of the first 100 documents is scored by the search that took generation 1.
      SearchOptions options;
      options.exhaustive = true;
      options.k = 100;
      auto result = (*collection)->Search(FloatMatrixView{query.data(), 16, kDim}, options);
      ASSERT_TRUE(result.ok()) << result.status();
      std::set<std::string> scored;
      for (const SearchHit& hit : result->hits) scored.insert(hit.id);
      for (const Document& document : first) {
        EXPECT_EQ(scored.count(document.id), 1u) << document.id << " left out of the search";
      }
    } else {
      // The Get that took generation 1 decodes the document's codes of generation 2.
      auto got = (*collection)->Get(first[7].id);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_GT(got->num_vectors(), 0);
    }
    EXPECT_TRUE(retrained) << "the hook did not run, or no retraining happened";
  }
}

// rerank_from_codes retrains as the exact mode does once a shard outgrows its codebook
// (kRetrainGrowth × the vectors it was trained on, or a size that calls for more centroids),
// sampling the vectors decoded from its codes and re-encoding every live document from them: the
// codebook grows to DefaultNumCentroids of the shard's vectors (the exact mode's count), searches
// stay within CompactQuery::ErrorBound of brute force over the new decoded vectors, no rerank row
// comes back, and a reopen answers the same, bit for bit. The second quantisation of the
// re-encoded documents is measured against one quantisation by the final codebook.
TEST(CentroidStage, RerankFromCodesRetrainsFromItsDecodedCodes) {
  TempDir dir;
  Corpus corpus(kDim, 71);
  std::vector<Document> sources;
  const std::vector<Document> documents = FamiliesAndNoise(corpus, 30, 300, &sources);
  std::vector<std::string> ids;
  for (const Document& document : documents) ids.push_back(document.id);
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok());
  CollectionSchema schema = Schema("codes", kDim);
  schema.candidates.rerank_from_codes = true;
  schema.candidates.centroid_min_training_vectors = 2'000;
  auto collection = (*engine)->CreateCollection(schema);
  ASSERT_TRUE(collection.ok()) << collection.status();
  // ~100 documents (~4,000 vectors) train the first codebook.
  UpsertAll(**collection, std::vector<Document>(documents.begin(), documents.begin() + 100));
  Impl(**collection).WaitForTrainingForTesting();
  const auto first = Impl(**collection).CodebookForTesting(0);
  ASSERT_NE(first, nullptr);
  // The rest: ~21,000 vectors, past kRetrainGrowth × the first training and calling for more
  // centroids.
  UpsertAll(**collection, std::vector<Document>(documents.begin() + 100, documents.end()));
  Impl(**collection).WaitForTrainingForTesting();
  const CollectionStats stats = (*collection)->Stats();
  const auto codebook = Impl(**collection).CodebookForTesting(0);
  ASSERT_NE(codebook, nullptr);
  const int64_t expected_centroids = internal::DefaultNumCentroids(stats.rerank_vectors);
  ASSERT_GT(expected_centroids, first->num_centroids());
  EXPECT_EQ(codebook->num_centroids(), expected_centroids)
      << "first codebook " << first->num_centroids() << " at " << stats.rerank_vectors
      << " vectors: the compact shard did not retrain";
  EXPECT_EQ(StageOf(**collection), absl::StrCat("Centroid", expected_centroids, ",Residual4bit"));
  EXPECT_EQ(stats.documents, static_cast<int64_t>(documents.size()));
  EXPECT_EQ(stats.candidate_vectors, stats.rerank_vectors);

  // The loss of the second quantisation: Get decodes the re-encoded codes of the first documents;
  // encoding their stored vectors (as an exact collection keeps them, pooled, fp16) with the final
  // codebook once is the reference.
  {
    auto stored = (*engine)->CreateCollection(Schema("stored", kDim));
    ASSERT_TRUE(stored.ok()) << stored.status();
    UpsertAll(**stored, std::vector<Document>(documents.begin(), documents.begin() + 100));
    internal::CentroidIndex once(codebook);
    const int64_t code_bytes = codebook->codec().code_bytes();
    double twice_error = 0, once_error = 0, norm = 0;
    std::vector<float> decoded(kDim);
    for (size_t d = 0; d < 100; ++d) {
      auto got = (*collection)->Get(documents[d].id);
      auto reference = (*stored)->Get(documents[d].id);
      ASSERT_TRUE(got.ok() && reference.ok()) << got.status() << " " << reference.status();
      ASSERT_EQ(got->vectors.size(), reference->vectors.size());
      const int64_t rows = reference->num_vectors();
      const internal::DocumentCodes codes =
          once.Encode(FloatMatrixView{reference->vectors.data(), rows, kDim});
      for (int64_t v = 0; v < rows; ++v) {
        codebook->Decode(codes.centroids[v],
                         reinterpret_cast<const uint8_t*>(codes.codes.data()) + v * code_bytes,
                         decoded.data());
        for (int64_t k = 0; k < kDim; ++k) {
          const double x = reference->vectors[v * kDim + k];
          twice_error += std::pow(got->vectors[v * kDim + k] - x, 2);
          once_error += std::pow(decoded[k] - x, 2);
          norm += x * x;
        }
      }
    }
    std::cout << "relative squared error of the decoded vectors: " << twice_error / norm
              << " re-encoded from the first codebook's codes, " << once_error / norm
              << " encoded once by the final codebook\n";
    EXPECT_LT(twice_error, 0.05 * norm);
    EXPECT_LT(twice_error, 3 * once_error);
  }

  // Exhaustive and default searches: brute force's top 10 over the decoded vectors (except at
  // near-ties, within the bound).
  std::vector<std::vector<std::pair<std::string, float>>> answers;
  std::vector<std::vector<float>> queries;
  for (int q = 0; q < 6; ++q) {
    SCOPED_TRACE(absl::StrCat("query ", q));
    queries.push_back(corpus.QueryFrom(sources[q * 5], 16));
    const std::vector<float>& query = queries.back();
    const auto expected = BruteForce(**collection, ids, query, kDim);
    const double tolerance = CodesErrorBound(**collection, query) + 2 * 16 * std::ldexp(1.0, -11);
    for (const bool exhaustive : {true, false}) {
      SearchOptions options;
      options.exhaustive = exhaustive;
      auto result = (*collection)->Search(FloatMatrixView{query.data(), 16, kDim}, options);
      ASSERT_TRUE(result.ok()) << result.status();
      ASSERT_EQ(result->hits.size(), 10u);
      std::vector<std::pair<std::string, float>> answer;
      for (size_t i = 0; i < 10; ++i) {
        const SearchHit& hit = result->hits[i];
        if (hit.id == expected[i].first) {
          EXPECT_NEAR(hit.score, expected[i].second, tolerance) << "rank " << i;
        } else {  // only at a near-tie
          EXPECT_NEAR(hit.score, expected[i].second, 2 * tolerance)
              << "rank " << i << ": " << hit.id << " instead of " << expected[i].first;
        }
        answer.emplace_back(hit.id, hit.score);
      }
      if (exhaustive) answers.push_back(answer);
    }
  }

  // The store keeps no rerank rows; a reopen answers the same, bit for bit, on the same codebook.
  collection = absl::NotFoundError("closed");
  engine = absl::NotFoundError("closed");
  int checked = 0;
  for (const std::string& db : ShardDatabases(dir.path())) {
    if (!absl::StrContains(db, "/codes@")) continue;  // not the exact collection
    SCOPED_TRACE(db);
    ++checked;
    internal::ShardStoreOptions options;
    options.create_if_missing = false;
    auto store = internal::ShardStore::Open(db, options);
    ASSERT_TRUE(store.ok()) << store.status();
    std::vector<uint64_t> iids;
    ASSERT_TRUE((*store)
                    ->ForEachDocument([&](const internal::DocumentRecord& record) {
                      iids.push_back(record.iid);
                      return absl::OkStatus();
                    })
                    .ok());
    EXPECT_EQ(iids.size(), documents.size());
    auto rerank = (*store)->MultiGetRerank(iids);
    ASSERT_TRUE(rerank.ok()) << rerank.status();
    for (size_t i = 0; i < iids.size(); ++i) {
      ASSERT_TRUE((*rerank)[i].has_value()) << "iid " << iids[i];
      EXPECT_EQ((*rerank)[i]->rows, 0) << "iid " << iids[i] << " keeps rerank rows";
    }
  }
  EXPECT_EQ(checked, 1);
  engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok());
  collection = (*engine)->GetCollection("codes");
  ASSERT_TRUE(collection.ok());
  EXPECT_EQ(Impl(**collection).CodebookForTesting(0)->Serialize(), codebook->Serialize());
  for (size_t q = 0; q < queries.size(); ++q) {
    SearchOptions options;
    options.exhaustive = true;
    auto result = (*collection)->Search(FloatMatrixView{queries[q].data(), 16, kDim}, options);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->hits.size(), 10u);
    for (size_t i = 0; i < 10; ++i) {
      EXPECT_EQ(result->hits[i].id, answers[q][i].first) << "query " << q << " rank " << i;
      EXPECT_EQ(result->hits[i].score, answers[q][i].second) << "query " << q << " rank " << i;
    }
  }
}

}  // namespace
}  // namespace tessera
