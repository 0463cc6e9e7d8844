// MergeSearchResults against its definition: the merged searches of collections that each hold
// one shard of a collection's documents equal the search of that one collection (ids, order,
// scores, documents scored), through the cascade, its exhaustive fallbacks, ties at the stage-1
// cut and filters; and their statistics added up (AddStats) equal that collection's.
#include "tessera/merge.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "index/collection/collection_impl.h"
#include "index/collection/collection_test_util.h"
#include "tessera/engine.h"

namespace tessera {
namespace {

constexpr int kShards = 3;
constexpr int64_t kDim = 32;

// The parts searched as a router searches its shard nodes: each as one of kShards shards, and
// the best k of their answers.
SearchResult SearchParts(const std::vector<std::shared_ptr<Collection>>& parts,
                         FloatMatrixView query, SearchOptions options) {
  options.whole_shards = kShards;
  std::vector<SearchResult> answers;
  for (const auto& part : parts) {
    auto answer = part->Search(query, options);
    EXPECT_TRUE(answer.ok()) << answer.status();
    if (answer.ok()) answers.push_back(*std::move(answer));
  }
  return MergeTopK(std::move(answers), options.k);
}

struct Collections {
  TempDir dir;
  std::unique_ptr<Engine> engine;
  std::shared_ptr<Collection> whole;
  std::vector<std::shared_ptr<Collection>> parts;
  std::vector<Document> documents;
};

std::vector<std::shared_ptr<Collection>> Everything(const Collections& setup) {
  std::vector<std::shared_ptr<Collection>> all = setup.parts;
  all.push_back(setup.whole);
  return all;
}

// `num_documents` documents, plus exact copies of some under other ids (ties everywhere), in one
// collection of kShards shards and in kShards one-shard collections split by ShardOf.
void Build(Collections* setup, int num_documents, const std::string& factory) {
  auto engine = Engine::Open(setup->dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  setup->engine = *std::move(engine);
  CollectionSchema schema = Schema("whole", kDim);
  schema.num_shards = kShards;
  schema.candidates.factory = factory;
  schema.candidates.centroid_min_training_vectors = 1024;
  auto whole = setup->engine->CreateCollection(schema);
  ASSERT_TRUE(whole.ok()) << whole.status();
  setup->whole = *whole;
  for (int p = 0; p < kShards; ++p) {
    schema.name = absl::StrCat("part-", p);
    schema.num_shards = 1;
    auto part = setup->engine->CreateCollection(schema);
    ASSERT_TRUE(part.ok()) << part.status();
    setup->parts.push_back(*part);
  }
  Corpus corpus(kDim, 21, /*num_topics=*/32);
  for (int d = 0; d < num_documents; ++d) {
    setup->documents.push_back(corpus.Make(absl::StrCat("d", d), 24));
    if (d % 10 == 0) {
      Document copy = setup->documents.back();
      copy.id = absl::StrCat("copy", d);
      setup->documents.push_back(std::move(copy));
    }
  }
  for (size_t d = 0; d < setup->documents.size(); ++d) {
    setup->documents[d].attributes["group"] = static_cast<int64_t>(d % 100);
    setup->documents[d].attributes["lang"] = d % 2 ? "en" : "de";
  }
  // The same documents in the same order on both sides, in batches as a client sends them.
  for (size_t begin = 0; begin < setup->documents.size(); begin += 64) {
    const std::vector<Document> batch(
        setup->documents.begin() + static_cast<std::ptrdiff_t>(begin),
        setup->documents.begin() +
            static_cast<std::ptrdiff_t>(std::min(setup->documents.size(), begin + 64)));
    ExpectAllOk(setup->whole->Upsert(batch));
    std::vector<std::vector<Document>> split(kShards);
    for (const Document& document : batch) split[ShardOf(document.id, kShards)].push_back(document);
    for (int p = 0; p < kShards; ++p) ExpectAllOk(setup->parts[p]->Upsert(split[p]));
    // A centroid index trains in the background on what its shard holds when it starts: let
    // each shard and its part train on the same documents.
    for (const auto& collection : Everything(*setup)) {
      dynamic_cast<internal::CollectionImpl&>(*collection).WaitForTrainingForTesting();
    }
  }
}

// How the one collection answered the searches ExpectSameAnswers compared.
struct Answered {
  int cascade = 0;       // stage 1, then the exact rerank of N
  int scored_whole = 0;  // not asked for, yet exhaustive: N covered it, or too few nominees
};

void ExpectSameAnswers(const Collections& setup, Answered* answered) {
  Corpus queries(kDim, 5, /*num_topics=*/32);
  struct Case {
    std::string name;
    SearchOptions options;
  };
  std::vector<Case> cases(7);
  cases[0].name = "defaults";
  cases[1].name = "N=20";
  cases[1].options.num_candidates = 20;
  cases[2].name = "k=5 N=5 k'=8";
  cases[2].options.k = 5;
  cases[2].options.num_candidates = 5;
  cases[2].options.per_token_candidates = 8;
  cases[3].name = "exhaustive";
  cases[3].options.exhaustive = true;
  cases[4].name = "lang=en";
  cases[4].options.filter.all_of.push_back(
      FilterCondition{"lang", FilterCondition::Op::kEq, {std::string("en")}});
  cases[5].name = "group=7 k=30 (fallback: 17 match)";
  cases[5].options.k = 30;
  cases[5].options.filter.all_of.push_back(
      FilterCondition{"group", FilterCondition::Op::kEq, {int64_t{7}}});
  cases[6].name = "explain";
  cases[6].options.explain = true;
  for (int q = 0; q < 8; ++q) {
    const std::vector<float> query =
        queries.QueryFrom(setup.documents[(q * 37) % setup.documents.size()], 6);
    const FloatMatrixView view{query.data(), 6, kDim};
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat("query ", q, ", ", c.name));
      auto expected = setup.whole->Search(view, c.options);
      ASSERT_TRUE(expected.ok()) << expected.status();
      if (!expected->exhaustive) ++answered->cascade;
      if (expected->exhaustive && !c.options.exhaustive) ++answered->scored_whole;
      const SearchResult merged = SearchParts(setup.parts, view, c.options);
      EXPECT_EQ(merged.exhaustive, expected->exhaustive);
      EXPECT_EQ(merged.documents_scored, expected->documents_scored);
      EXPECT_EQ(merged.num_candidates, expected->num_candidates);
      ASSERT_EQ(merged.hits.size(), expected->hits.size());
      for (size_t i = 0; i < merged.hits.size(); ++i) {
        EXPECT_EQ(merged.hits[i].id, expected->hits[i].id) << "rank " << i;
        EXPECT_EQ(merged.hits[i].score, expected->hits[i].score) << "rank " << i;
        EXPECT_EQ(merged.hits[i].version, expected->hits[i].version) << "rank " << i;
        ASSERT_EQ(merged.hits[i].explanation.size(), expected->hits[i].explanation.size());
        for (size_t t = 0; t < merged.hits[i].explanation.size(); ++t) {
          EXPECT_EQ(merged.hits[i].explanation[t].document_vector,
                    expected->hits[i].explanation[t].document_vector);
          EXPECT_EQ(merged.hits[i].explanation[t].covered_tokens,
                    expected->hits[i].explanation[t].covered_tokens);
        }
      }
    }
  }
}

TEST(MergeSearchResults, EqualsOneCollectionOnTheExactScan) {
  Collections setup;
  Build(&setup, 1500, "auto");
  Answered answered;
  ExpectSameAnswers(setup, &answered);
  EXPECT_GE(answered.cascade, 40);
  EXPECT_GE(answered.scored_whole, 8);  // the group=7 filter leaves too few nominees
}

TEST(MergeSearchResults, EqualsOneCollectionOnTheCentroidIndex) {
  Collections setup;
  Build(&setup, 1500, "centroid");
  for (const auto& collection : Everything(setup)) {
    for (const std::string& index : collection->Stats().candidate_indexes) {
      EXPECT_EQ(index.rfind("Centroid", 0), 0u) << index;
    }
  }
  Answered answered;
  ExpectSameAnswers(setup, &answered);
  EXPECT_GE(answered.cascade, 40);
}

TEST(MergeSearchResults, SmallCollectionsAreScoredWhole) {
  Collections setup;
  Build(&setup, 60, "auto");
  // By default N (100) covers every document; N=20 and N=5 do not.
  Answered answered;
  ExpectSameAnswers(setup, &answered);
  EXPECT_GE(answered.scored_whole, 8 * 4);  // defaults, lang, group, explain
  EXPECT_GE(answered.cascade, 8);
}

// MergeTopK: the best k by exact score, ties by id; sums of the counts; exhaustive only when
// every part was.
TEST(MergeSearchResults, MergeTopKRanksByScoreThenId) {
  auto hit = [](std::string id, float score) {
    SearchHit h;
    h.id = std::move(id);
    h.score = score;
    return h;
  };
  std::vector<SearchResult> answers(3);
  answers[0].hits = {hit("c", 0.9f), hit("e", 0.1f)};
  answers[0].documents_scored = 4;
  answers[0].documents = 10;
  answers[0].exhaustive = true;
  answers[1].hits = {hit("a", 0.5f)};
  answers[1].documents_scored = 3;
  answers[1].documents = 11;
  answers[1].num_candidates = 40;
  answers[2].hits = {hit("b", 0.9f)};
  answers[2].documents_scored = 5;
  answers[2].documents = 12;
  answers[2].exhaustive = true;
  answers[2].num_candidates = 100;
  answers[2].timings.candidates_ms = 2.0;
  answers[1].timings.candidates_ms = 3.0;
  const SearchResult merged = MergeTopK(answers, 2);
  ASSERT_EQ(merged.hits.size(), 2u);
  EXPECT_EQ(merged.hits[0].id, "b");  // 0.9 tied: by id
  EXPECT_EQ(merged.hits[1].id, "c");
  EXPECT_EQ(merged.documents_scored, 12);
  EXPECT_EQ(merged.documents, 33);
  EXPECT_EQ(merged.num_candidates, 100);
  EXPECT_EQ(merged.timings.candidates_ms, 3.0);  // the slowest part's
  EXPECT_FALSE(merged.exhaustive);
  answers[1].exhaustive = true;
  EXPECT_TRUE(MergeTopK(answers, 10).exhaustive);
  EXPECT_EQ(MergeTopK(answers, 10).hits.size(), 4u);
}

TEST(MergeSearchResults, WholeShardsIsValidated) {
  Collections setup;
  Build(&setup, 30, "auto");
  const std::vector<float> query(2 * kDim, 0.1f);
  const FloatMatrixView view{query.data(), 2, kDim};
  SearchOptions options;
  options.whole_shards = 2;  // fewer than the collection's own 3
  EXPECT_EQ(setup.whole->Search(view, options).status().message(),
            "whole_shards 2, expected 0 or 3 … 256");
  options.whole_shards = 257;
  EXPECT_EQ(setup.parts[0]->Search(view, options).status().message(),
            "whole_shards 257, expected 0 or 1 … 256");
  options.whole_shards = 3;
  EXPECT_TRUE(setup.whole->Search(view, options).ok());
}

// The statistics of the parts, added up, are the one collection's: every count, the stage-1 index
// of each shard in shard order, and the ratios of the sums. (Disk bytes differ: each part is a
// database of its own.)
TEST(MergeStats, PartsAddUpToTheOneCollection) {
  Collections setup;
  Build(&setup, 200, "auto");
  CollectionStats total;
  for (const auto& part : setup.parts) AddStats(part->Stats(), &total);
  SetStatsRatios(&total);
  const CollectionStats whole = setup.whole->Stats();
  EXPECT_EQ(total.documents, whole.documents);
  EXPECT_EQ(total.documents, static_cast<int64_t>(setup.documents.size()));
  EXPECT_EQ(total.original_tokens, whole.original_tokens);
  EXPECT_EQ(total.rerank_vectors, whole.rerank_vectors);
  EXPECT_EQ(total.candidate_vectors, whole.candidate_vectors);
  EXPECT_EQ(total.training_shards, whole.training_shards);
  EXPECT_EQ(total.candidate_indexes, whole.candidate_indexes);
  // Nothing flushed yet: every row waits in RocksDB, in the parts as in the whole.
  EXPECT_GT(whole.segments.rerank_unflushed_bytes, 0);
  EXPECT_EQ(total.segments.rerank_unflushed_bytes, whole.segments.rerank_unflushed_bytes);
  EXPECT_DOUBLE_EQ(total.vectors_per_document, whole.vectors_per_document);
  EXPECT_GT(total.disk_bytes, 0);
  EXPECT_DOUBLE_EQ(total.disk_bytes_per_rerank_vector,
                   static_cast<double>(total.disk_bytes) / total.rerank_vectors);
}

TEST(MergeStats, SumsCountsAndDerivesRatiosFromTheSums) {
  CollectionStats a;
  a.documents = 3;
  a.original_tokens = 30;
  a.rerank_vectors = 15;
  a.candidate_vectors = 6;
  a.disk_bytes = 3000;
  a.resident_bytes = 100;
  a.candidate_bytes = 10;
  a.training_shards = 1;
  a.trainings_completed = 2;
  a.trainings_failed = 1;
  a.candidate_indexes = {"IDMap2,Flat"};
  a.segments.rerank_segments = 2;
  a.segments.rerank_segment_bytes = 2000;
  a.segments.rerank_unflushed_bytes = 200;
  a.segments.code_segments = 3;
  a.segments.code_segment_bytes = 300;
  a.segments.code_unflushed_bytes = 30;
  a.vectors_per_document = 99;  // a part's own ratios do not enter the sums
  a.last_training_seconds = 7;
  CollectionStats b;
  b.documents = 1;
  b.original_tokens = 10;
  b.rerank_vectors = 5;
  b.disk_bytes = 1000;
  b.candidate_indexes = {"Centroid(256,4b)", "Flat"};
  b.segments.rerank_segments = 1;
  b.segments.rerank_segment_bytes = 1000;
  b.segments.rerank_unflushed_bytes = 100;
  b.segments.code_segments = 4;
  b.segments.code_segment_bytes = 400;
  b.segments.code_unflushed_bytes = 40;
  CollectionStats total;
  AddStats(a, &total);
  AddStats(b, &total);
  SetStatsRatios(&total);
  EXPECT_EQ(total.documents, 4);
  EXPECT_EQ(total.original_tokens, 40);
  EXPECT_EQ(total.rerank_vectors, 20);
  EXPECT_EQ(total.candidate_vectors, 6);
  EXPECT_EQ(total.disk_bytes, 4000);
  EXPECT_EQ(total.resident_bytes, 100);
  EXPECT_EQ(total.candidate_bytes, 10);
  EXPECT_EQ(total.training_shards, 1);
  EXPECT_EQ(total.trainings_completed, 2);
  EXPECT_EQ(total.trainings_failed, 1);
  EXPECT_EQ(total.segments.rerank_segments, 3);
  EXPECT_EQ(total.segments.rerank_segment_bytes, 3000);
  EXPECT_EQ(total.segments.rerank_unflushed_bytes, 300);
  EXPECT_EQ(total.segments.code_segments, 7);
  EXPECT_EQ(total.segments.code_segment_bytes, 700);
  EXPECT_EQ(total.segments.code_unflushed_bytes, 70);
  EXPECT_EQ(total.candidate_indexes,
            (std::vector<std::string>{"IDMap2,Flat", "Centroid(256,4b)", "Flat"}));
  EXPECT_EQ(total.vectors_per_document, 5.0);
  EXPECT_EQ(total.disk_bytes_per_original_token, 100.0);
  EXPECT_EQ(total.disk_bytes_per_rerank_vector, 200.0);
  EXPECT_EQ(total.last_training_seconds, 0.0);  // the caller's to set

  CollectionStats empty;
  empty.disk_bytes = 512;  // a schema file, no documents
  SetStatsRatios(&empty);
  EXPECT_EQ(empty.vectors_per_document, 0.0);
  EXPECT_EQ(empty.disk_bytes_per_original_token, 0.0);
  EXPECT_EQ(empty.disk_bytes_per_rerank_vector, 0.0);
}

}  // namespace
}  // namespace tessera
