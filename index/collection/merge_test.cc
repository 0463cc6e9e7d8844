// MergeSearchResults against its definition: the merged searches of collections that each hold
// one shard of a collection's documents equal the search of that one collection (ids, order,
// scores), through the cascade, its exhaustive fallbacks, ties at the stage-1 cut and filters.
#include "tessera/merge.h"

#include <optional>
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

// The parts searched as a router searches its shard nodes: round 1 (nominate_only, scoring the
// best scored_share of N; again with the merged N for a part that resolved less), round 2
// (rerank_ids of the cut not scored yet, or exhaustive).
SearchResult SearchParts(const std::vector<std::shared_ptr<Collection>>& parts,
                         FloatMatrixView query, const SearchOptions& options, double scored_share) {
  auto search = [&](const std::shared_ptr<Collection>& part, const SearchOptions& with) {
    auto answer = part->Search(query, with);
    EXPECT_TRUE(answer.ok()) << answer.status();
    return answer.ok() ? *std::move(answer) : SearchResult{};
  };
  std::optional<NominationCut> cut;
  if (!options.exhaustive) {
    SearchOptions nominate = options;
    nominate.nominate_only = true;
    nominate.scored_share = scored_share;
    std::vector<SearchResult> nominations;
    for (const auto& part : parts) nominations.push_back(search(part, nominate));
    const int64_t num_candidates = MergedNumCandidates(nominations);
    for (size_t p = 0; p < parts.size(); ++p) {
      if (nominations[p].num_candidates == num_candidates) continue;
      SearchOptions again = nominate;
      again.num_candidates = num_candidates;
      nominations[p] = search(parts[p], again);
    }
    cut = CutNominations(std::move(nominations), options.k);
  }
  std::vector<SearchResult> answers;
  if (cut.has_value()) answers.push_back(std::move(cut->scored));
  for (size_t p = 0; p < parts.size(); ++p) {
    SearchOptions round2 = options;
    if (cut.has_value()) {
      if (cut->rerank_ids[p].empty()) continue;
      round2.rerank_ids = cut->rerank_ids[p];
    } else {
      round2.exhaustive = true;
    }
    answers.push_back(search(parts[p], round2));
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
      // Round 1 scoring nothing (every document of the cut goes to round 2), a few per part,
      // or every nominee.
      for (double scored_share : {0.0, 0.5, 1.0}) {
        SCOPED_TRACE(absl::StrCat("scored_share ", scored_share));
        const SearchResult merged = SearchParts(setup.parts, view, c.options, scored_share);
        EXPECT_EQ(merged.exhaustive, expected->exhaustive);
        if (scored_share == 0) EXPECT_EQ(merged.documents_scored, expected->documents_scored);
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

// The cut on stage-1 scores takes, of documents tied at it, the smaller ids; the nominees'
// exact scores then decide.
TEST(MergeSearchResults, CutsTiesByIdAndRanksByExactScore) {
  auto hit = [](std::string id, float score) {
    SearchHit h;
    h.id = std::move(id);
    h.score = score;
    return h;
  };
  std::vector<SearchResult> nominations(2);
  for (SearchResult& part : nominations) {
    part.num_candidates = 3;
    part.documents = 10;
  }
  for (auto [id, score] : {std::pair{"a", 2.0f}, {"c", 1.0f}, {"e", 0.5f}}) {
    nominations[0].hits.push_back(hit(id, 0));
    nominations[0].hits.back().candidate_score = score;
  }
  for (auto [id, score] : {std::pair{"b", 1.0f}, {"d", 1.0f}, {"f", 0.4f}}) {
    nominations[1].hits.push_back(hit(id, 0));
    nominations[1].hits.back().candidate_score = score;
  }
  // Cut at 3 by stage-1 score: a (2.0), then b and c of the tied b, c, d. Round 1 scored c.
  nominations[0].hits[1].score = 0.9f;
  nominations[0].hits[0].scored = nominations[0].hits[2].scored = false;
  for (SearchHit& h : nominations[1].hits) h.scored = false;
  auto cut = CutNominations(nominations, 2);
  ASSERT_TRUE(cut.has_value());
  EXPECT_EQ(cut->rerank_ids[0], (std::vector<std::string>{"a"}));
  EXPECT_EQ(cut->rerank_ids[1], (std::vector<std::string>{"b"}));
  ASSERT_EQ(cut->scored.hits.size(), 1u);
  EXPECT_EQ(cut->scored.hits[0].id, "c");
  // Fewer nominees than k, or N covering the documents: every matching document is scored.
  EXPECT_FALSE(CutNominations(nominations, 7).has_value());
  nominations[0].documents = nominations[1].documents = 1;
  EXPECT_FALSE(CutNominations(nominations, 2).has_value());

  std::vector<SearchResult> answers(3);
  answers[0] = std::move(cut->scored);  // c, 0.9
  answers[1].hits = {hit("a", 0.5f)};
  answers[1].documents_scored = 1;
  answers[2].hits = {hit("b", 0.9f)};
  answers[2].documents_scored = 1;
  const SearchResult merged = MergeTopK(answers, 2);
  ASSERT_EQ(merged.hits.size(), 2u);
  EXPECT_EQ(merged.hits[0].id, "b");  // 0.9 tied: by id
  EXPECT_EQ(merged.hits[1].id, "c");
  EXPECT_EQ(merged.documents_scored, 2);  // round 1 scored none of the hand-made nominations
  EXPECT_FALSE(merged.exhaustive);
}

TEST(MergeSearchResults, RoundOptionsAreValidated) {
  Collections setup;
  Build(&setup, 30, "auto");
  const std::vector<float> query(2 * kDim, 0.1f);
  const FloatMatrixView view{query.data(), 2, kDim};
  SearchOptions options;
  options.nominate_only = true;
  options.exhaustive = true;
  EXPECT_EQ(setup.whole->Search(view, options).status().message(),
            "nominate_only: stage 1 alone, expected without exhaustive and rerank_ids");
  options = SearchOptions{};
  options.nominate_only = true;
  options.scored_share = 1.5;
  EXPECT_EQ(setup.whole->Search(view, options).status().message(),
            "scored_share 1.5, expected 0 … 1");
  options = SearchOptions{};
  options.rerank_ids.assign(10001, "d1");
  EXPECT_EQ(setup.whole->Search(view, options).status().message(),
            "rerank_ids: 10001 ids exceeds the limit of 10000");
  // Ids not stored are skipped; stored ones are scored whatever stage 1 would say.
  options.rerank_ids = {"nope", "d3", "d7"};
  auto result = setup.whole->Search(view, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->documents_scored, 2);
  ASSERT_EQ(result->hits.size(), 2u);
}

}  // namespace
}  // namespace tessera
