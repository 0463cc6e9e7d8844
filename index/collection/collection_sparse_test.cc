// Sparse vectors in a collection, against independent references: the sparse lane's answers
// equal a brute-force BM25 (Lucene's formula) over the live documents as written — after
// deletes, after upserts that replace or drop a document's sparse vector, and after a reopen
// that rebuilds the index from the stored records; a hybrid search of one collection equals its
// parts' lanes merged and fused (what a router does), and its fused scores equal RRF over the
// lanes searched alone; bad sparse input is refused naming the field and the value.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/collection/collection_test_util.h"
#include "tessera/engine.h"
#include "tessera/merge.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
constexpr int64_t kDim = 16;
constexpr uint32_t kVocabulary = 60;

CollectionSchema SparseSchema(const std::string& name, int shards) {
  CollectionSchema schema;
  schema.name = name;
  schema.dim = kDim;
  schema.num_shards = shards;
  schema.attributes = {{"group", AttributeType::kInt64}};
  schema.sparse = SparseScoring{};
  return schema;
}

// Term frequencies of a few terms of a Zipf-like vocabulary, in random order (the collection
// sorts them).
SparseVector RandomTerms(std::mt19937& rng) {
  std::set<uint32_t> terms;
  const int n = 1 + static_cast<int>(rng() % 12);
  while (static_cast<int>(terms.size()) < n) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    terms.insert(static_cast<uint32_t>(kVocabulary * u * u));
  }
  std::vector<uint32_t> order(terms.begin(), terms.end());
  std::shuffle(order.begin(), order.end(), rng);
  SparseVector vector;
  for (uint32_t term : order) {
    vector.indices.push_back(term);
    vector.values.push_back(static_cast<float>(1 + rng() % 4));
  }
  return vector;
}

// Brute-force BM25 (SparseScoring's formula) over `live`, the documents' sparse vectors by id:
// the best k with a score > 0 among those `keep` accepts, ranked as the collection ranks (the
// score rounded to float desc, id asc).
std::vector<std::pair<std::string, float>> Bm25(const std::map<std::string, SparseVector>& live,
                                                const std::map<std::string, int64_t>& groups,
                                                const SparseVector& query, int64_t k,
                                                const std::function<bool(int64_t)>& keep,
                                                const SparseScoring& scoring = {}) {
  int64_t n = 0;
  double total_length = 0;
  std::map<uint32_t, int64_t> df;
  for (const auto& [id, vector] : live) {
    ++n;
    for (size_t i = 0; i < vector.indices.size(); ++i) {
      total_length += vector.values[i];
      if (vector.values[i] > 0) ++df[vector.indices[i]];
    }
  }
  const double avgdl = n > 0 && total_length > 0 ? total_length / n : 1.0;
  std::vector<std::pair<std::string, float>> scored;
  for (const auto& [id, vector] : live) {
    if (keep && !keep(groups.at(id))) continue;
    double length = 0;
    std::map<uint32_t, double> tf;
    for (size_t i = 0; i < vector.indices.size(); ++i) {
      length += vector.values[i];
      tf[vector.indices[i]] = vector.values[i];
    }
    double score = 0;
    for (size_t i = 0; i < query.indices.size(); ++i) {
      const auto it = tf.find(query.indices[i]);
      if (it == tf.end() || it->second <= 0) continue;
      const double idf =
          std::log(1.0 + (n - df[query.indices[i]] + 0.5) / (df[query.indices[i]] + 0.5));
      score += query.values[i] * idf * it->second /
               (it->second + scoring.k1 * (1 - scoring.b + scoring.b * length / avgdl));
    }
    if (score > 0) scored.emplace_back(id, static_cast<float>(score));
  }
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (static_cast<int64_t>(scored.size()) > k) scored.resize(k);
  return scored;
}

SparseVector Sorted(SparseVector v) {
  std::vector<size_t> order(v.indices.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return v.indices[a] < v.indices[b]; });
  SparseVector sorted;
  for (size_t i : order) {
    sorted.indices.push_back(v.indices[i]);
    sorted.values.push_back(v.values[i]);
  }
  return sorted;
}

struct Fixture {
  TempDir dir;
  std::unique_ptr<Engine> engine;
  std::shared_ptr<Collection> collection;
  std::map<std::string, SparseVector> live;  // documents with a sparse vector
  std::map<std::string, int64_t> groups;     // every live document's group
  std::vector<Document> documents;
};

void Open(Fixture* f, const std::string& name) {
  f->collection.reset();
  f->engine.reset();
  auto engine = Engine::Open(f->dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  f->engine = std::move(*engine);
  auto collection = f->engine->GetCollection(name);
  ASSERT_TRUE(collection.ok()) << collection.status();
  f->collection = *collection;
}

void Fill(Fixture* f, const std::string& name, int shards, int n, uint32_t seed) {
  auto engine = Engine::Open(f->dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  f->engine = std::move(*engine);
  auto collection = f->engine->CreateCollection(SparseSchema(name, shards));
  ASSERT_TRUE(collection.ok()) << collection.status();
  f->collection = *collection;
  Corpus corpus(kDim, seed, 16);
  std::mt19937 rng(seed);
  for (int d = 0; d < n; ++d) {
    Document document = corpus.Make(absl::StrCat("doc-", d), 1 + static_cast<int64_t>(rng() % 8));
    document.attributes["group"] = static_cast<int64_t>(rng() % 4);
    f->groups[document.id] = std::get<int64_t>(document.attributes["group"]);
    if (rng() % 10 != 0) {  // one in ten without a sparse vector
      document.sparse = RandomTerms(rng);
      f->live[document.id] = Sorted(*document.sparse);
    }
    f->documents.push_back(std::move(document));
  }
  ExpectAllOk(f->collection->Upsert(f->documents));
}

void ExpectSparseEqualsBruteForce(const Fixture& f, uint32_t seed, int queries) {
  std::mt19937 rng(seed);
  for (int q = 0; q < queries; ++q) {
    const SparseVector query = RandomTerms(rng);
    const int64_t k = 1 + static_cast<int64_t>(rng() % 15);
    SearchOptions options;
    options.k = k;
    options.hybrid.sparse_query = query;
    std::function<bool(int64_t)> keep;
    if (q % 3 == 1) {
      FilterCondition condition{"group", FilterCondition::Op::kLe, {int64_t{1}}};
      options.filter.all_of.push_back(condition);
      keep = [](int64_t group) { return group <= 1; };
    }
    absl::StatusOr<SearchResult> result =
        f.collection->Search(FloatMatrixView{nullptr, 0, kDim}, options);
    ASSERT_TRUE(result.ok()) << result.status();
    const auto expected = Bm25(f.live, f.groups, Sorted(query), k, keep);
    ASSERT_EQ(result->hits.size(), expected.size()) << "query " << q;
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(result->hits[i].id, expected[i].first) << "query " << q << " rank " << i;
      EXPECT_NEAR(result->hits[i].score, expected[i].second, 1e-5 * expected[i].second)
          << "query " << q << " rank " << i;
      ASSERT_TRUE(result->hits[i].sparse_score.has_value());
      EXPECT_EQ(*result->hits[i].sparse_score, result->hits[i].score);
    }
  }
}

TEST(CollectionSparseTest, SparseLaneEqualsBruteForceBm25ThroughWritesAndReopen) {
  Fixture f;
  Fill(&f, "sparse", 3, 300, 7);
  ExpectSparseEqualsBruteForce(f, 11, 30);

  // Deletes, upserts that replace a sparse vector, and upserts that drop one.
  std::vector<std::string> deleted;
  for (int d = 0; d < 300; d += 7) deleted.push_back(absl::StrCat("doc-", d));
  ASSERT_TRUE(f.collection->Delete(deleted).ok());
  for (const std::string& id : deleted) {
    f.live.erase(id);
    f.groups.erase(id);
  }
  std::mt19937 rng(5);
  std::vector<Document> replaced;
  for (int d = 1; d < 300; d += 5) {
    Document document = f.documents[d];
    if (d % 7 == 0) continue;  // deleted
    if (d % 2 == 0) {
      document.sparse.reset();
      f.live.erase(document.id);
    } else {
      document.sparse = RandomTerms(rng);
      f.live[document.id] = Sorted(*document.sparse);
    }
    replaced.push_back(std::move(document));
  }
  ExpectAllOk(f.collection->Upsert(replaced));
  ExpectSparseEqualsBruteForce(f, 12, 30);

  // Get returns the stored vector, sorted.
  const auto stored = f.collection->Get(f.live.begin()->first);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_TRUE(stored->sparse.has_value());
  EXPECT_EQ(stored->sparse->indices, f.live.begin()->second.indices);
  EXPECT_EQ(stored->sparse->values, f.live.begin()->second.values);

  // Recovery: the index is rebuilt from the stored records.
  Open(&f, "sparse");
  ExpectSparseEqualsBruteForce(f, 12, 30);
  ExpectSparseEqualsBruteForce(f, 13, 30);
}

TEST(CollectionSparseTest, StatisticsAreTheCollectionsNotTheShards) {
  Fixture f;
  Fill(&f, "stats", 4, 120, 3);
  std::vector<uint32_t> terms;
  for (uint32_t t = 0; t < kVocabulary; ++t) terms.push_back(t);
  const SparseStatistics statistics = f.collection->SparseStatisticsOf(terms);
  EXPECT_EQ(statistics.num_documents, static_cast<int64_t>(f.live.size()));
  double total = 0;
  std::map<uint32_t, int64_t> df;
  for (const auto& [id, vector] : f.live) {
    for (size_t i = 0; i < vector.indices.size(); ++i) {
      total += vector.values[i];
      ++df[vector.indices[i]];
    }
  }
  EXPECT_EQ(statistics.total_length, total);
  for (uint32_t t : terms) EXPECT_EQ(statistics.doc_freq.at(t), df[t]) << "term " << t;
}

// A hybrid search of one collection of S shards, and its S parts (one shard each, the documents
// split by ShardOf) searched with whole_shards = S and the statistics summed over the parts, then
// MergeLanes + FuseLanes: the router's scheme. The answers must be equal: ids, order, scores.
TEST(CollectionSparseTest, HybridOfPartsMergedEqualsTheWholeCollection) {
  constexpr int kShards = 3;
  Fixture f;
  Fill(&f, "whole", kShards, 240, 21);
  std::vector<std::shared_ptr<Collection>> parts;
  for (int s = 0; s < kShards; ++s) {
    auto part = f.engine->CreateCollection(SparseSchema(absl::StrCat("part", s), 1));
    ASSERT_TRUE(part.ok()) << part.status();
    std::vector<Document> mine;
    for (const Document& document : f.documents) {
      if (ShardOf(document.id, kShards) == s) mine.push_back(document);
    }
    ExpectAllOk((*part)->Upsert(mine));
    parts.push_back(*part);
  }
  Corpus corpus(kDim, 99, 16);
  std::mt19937 rng(8);
  for (int q = 0; q < 24; ++q) {
    const Document& source = f.documents[rng() % f.documents.size()];
    std::vector<float> query = corpus.QueryFrom(source, 4);
    SearchOptions options;
    options.k = 1 + static_cast<int64_t>(rng() % 10);
    options.hybrid.sparse_query = RandomTerms(rng);
    options.hybrid.fusion = q % 2 == 0 ? FusionMethod::kRrf : FusionMethod::kScore;
    options.hybrid.sparse_weight = q % 4 < 2 ? 1.0 : 0.5;
    options.hybrid.rerank = q % 3 == 2;
    options.hybrid.candidates = q % 5 == 0 ? 30 : 0;
    options.with_attributes = q % 2 == 1;
    if (q % 6 == 3) {
      options.group_by = "group";
      options.group_size = 2;
      options.groups = 3;
    }
    if (q % 4 == 3)
      options.filter.all_of.push_back({"group", FilterCondition::Op::kNe, {int64_t{2}}});
    FloatMatrixView view{query.data(), 4, kDim};
    if (q % 8 == 7) {
      view = FloatMatrixView{nullptr, 0, kDim};  // sparse only
      options.hybrid.rerank = false;
    }
    absl::StatusOr<SearchResult> whole = f.collection->Search(view, options);
    ASSERT_TRUE(whole.ok()) << whole.status();

    SparseStatistics statistics;
    for (const auto& part : parts) {
      statistics.Merge(part->SparseStatisticsOf(options.hybrid.sparse_query->indices));
    }
    std::vector<SearchResult> answers;
    SearchOptions part_options = options;
    part_options.whole_shards = kShards;
    part_options.hybrid.statistics = statistics;
    for (const auto& part : parts) {
      absl::StatusOr<SearchResult> answer = part->Search(view, part_options);
      ASSERT_TRUE(answer.ok()) << answer.status();
      ASSERT_TRUE(answer->lanes);
      answers.push_back(*std::move(answer));
    }
    absl::StatusOr<SearchResult> merged = FuseLanes(
        MergeLanes(std::move(answers), HybridLaneDepth(options, 10000)), view.rows > 0, options);
    ASSERT_TRUE(merged.ok()) << merged.status();
    auto same = [&](const std::vector<SearchHit>& a, const std::vector<SearchHit>& b) {
      ASSERT_EQ(a.size(), b.size()) << "query " << q;
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].id, b[i].id) << "query " << q << " rank " << i;
        EXPECT_EQ(a[i].score, b[i].score) << "query " << q << " rank " << i;
        EXPECT_EQ(a[i].dense_score, b[i].dense_score) << "query " << q << " rank " << i;
        EXPECT_EQ(a[i].sparse_score, b[i].sparse_score) << "query " << q << " rank " << i;
        EXPECT_EQ(a[i].attributes, b[i].attributes) << "query " << q << " rank " << i;
      }
    };
    same(whole->hits, merged->hits);
    ASSERT_EQ(whole->groups.size(), merged->groups.size()) << "query " << q;
    for (size_t g = 0; g < whole->groups.size(); ++g) {
      EXPECT_EQ(whole->groups[g].value, merged->groups[g].value);
      same(whole->groups[g].hits, merged->groups[g].hits);
    }
    if (options.group_by.empty()) EXPECT_FALSE(whole->hits.empty()) << "query " << q;
  }
}

// The fused score of each hit is Σ weight / (rrf_k + rank) over the lanes searched alone.
TEST(CollectionSparseTest, RrfScoresAreTheLanesRanks) {
  Fixture f;
  Fill(&f, "rrf", 2, 150, 31);
  Corpus corpus(kDim, 5, 16);
  std::mt19937 rng(4);
  for (int q = 0; q < 10; ++q) {
    std::vector<float> query = corpus.QueryFrom(f.documents[rng() % f.documents.size()], 3);
    const FloatMatrixView view{query.data(), 3, kDim};
    const SparseVector sparse = RandomTerms(rng);
    constexpr int64_t kDepth = 20;
    SearchOptions dense_options;
    dense_options.k = kDepth;
    auto dense = f.collection->Search(view, dense_options);
    ASSERT_TRUE(dense.ok()) << dense.status();
    SearchOptions sparse_options;
    sparse_options.k = kDepth;
    sparse_options.hybrid.sparse_query = sparse;
    auto sparse_only = f.collection->Search(FloatMatrixView{nullptr, 0, kDim}, sparse_options);
    ASSERT_TRUE(sparse_only.ok()) << sparse_only.status();
    std::map<std::string, double> expected;
    for (size_t r = 0; r < dense->hits.size(); ++r) {
      expected[dense->hits[r].id] += 1.0 / (kDefaultRrfK + r + 1);
    }
    for (size_t r = 0; r < sparse_only->hits.size(); ++r) {
      expected[sparse_only->hits[r].id] += 0.5 / (kDefaultRrfK + r + 1);
    }
    SearchOptions options;
    options.k = 10;
    options.hybrid.sparse_query = sparse;
    options.hybrid.candidates = kDepth;
    options.hybrid.sparse_weight = 0.5;
    auto hybrid = f.collection->Search(view, options);
    ASSERT_TRUE(hybrid.ok()) << hybrid.status();
    ASSERT_EQ(hybrid->hits.size(), std::min<size_t>(10, expected.size()));
    double previous = INFINITY;
    for (const SearchHit& hit : hybrid->hits) {
      ASSERT_TRUE(expected.count(hit.id)) << hit.id;
      EXPECT_NEAR(hit.score, expected[hit.id], 1e-6) << hit.id;
      EXPECT_LE(hit.score, previous);
      previous = hit.score;
      EXPECT_TRUE(hit.dense_score.has_value() || hit.sparse_score.has_value());
    }
  }
}

TEST(CollectionSparseTest, BadSparseInputIsRefusedNamingFieldAndValue) {
  TempDir dir;
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok());
  auto dense_only = (*engine)->CreateCollection(Schema("dense", kDim));
  ASSERT_TRUE(dense_only.ok());
  auto sparse = (*engine)->CreateCollection(SparseSchema("withsparse", 1));
  ASSERT_TRUE(sparse.ok());
  Corpus corpus(kDim, 1, 8);
  auto refused = [&](Collection& collection, SparseVector vector) {
    Document document = corpus.Make("a17", 3);
    document.sparse = std::move(vector);
    const std::vector<UpsertOutcome> outcomes = collection.Upsert({document});
    EXPECT_EQ(outcomes[0].status.code(), absl::StatusCode::kInvalidArgument);
    return std::string(outcomes[0].status.message());
  };
  EXPECT_THAT(refused(**dense_only, {{1, 2}, {1.0f, 1.0f}}),
              HasSubstr("document 'a17': sparse vector of 2 terms, but collection 'dense' "
                        "declares no sparse field"));
  EXPECT_THAT(refused(**sparse, {{1, 2}, {1.0f, NAN}}), HasSubstr("values[1] = nan (term 2)"));
  EXPECT_THAT(refused(**sparse, {{1, 2}, {1.0f, -1.0f}}), HasSubstr("values[1] = -1 (term 2)"));
  EXPECT_THAT(refused(**sparse, {{4, 9, 4}, {1.0f, 1.0f, 1.0f}}),
              HasSubstr("document 'a17': sparse: indices[1] = 4 repeats indices[0] = 4"));
  EXPECT_THAT(refused(**sparse, {{1, 2, 3}, {1.0f, 1.0f}}),
              HasSubstr("document 'a17': sparse: 3 indices but 2 values"));

  SearchOptions options;
  options.hybrid.sparse_query = SparseVector{{3, 3}, {1.0f, 1.0f}};
  auto search = (*sparse)->Search(FloatMatrixView{nullptr, 0, kDim}, options);
  EXPECT_EQ(search.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(search.status().message(), HasSubstr("sparse_query: indices[1] = 3 repeats"));
  options.hybrid.sparse_query = SparseVector{{3}, {1.0f}};
  search = (*dense_only)->Search(FloatMatrixView{nullptr, 0, kDim}, options);
  EXPECT_EQ(search.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(search.status().message(),
              HasSubstr("sparse_query: collection 'dense' declares no sparse field"));
  options.hybrid.rerank = true;
  search = (*sparse)->Search(FloatMatrixView{nullptr, 0, kDim}, options);
  EXPECT_THAT(search.status().message(), HasSubstr("rerank: a sparse-only search"));
  options.hybrid.rerank = false;
  options.hybrid.rrf_k = -1;
  search = (*sparse)->Search(FloatMatrixView{nullptr, 0, kDim}, options);
  EXPECT_THAT(search.status().message(), HasSubstr("rrf_k -1, expected a finite value >= 0"));

  CollectionSchema bad = SparseSchema("badb", 1);
  bad.sparse->b = 1.5;
  EXPECT_THAT(std::string((*engine)->CreateCollection(bad).status().message()),
              HasSubstr("sparse field: sparse scoring: b = 1.5; expected a value in [0, 1]"));
}

}  // namespace
}  // namespace tessera
