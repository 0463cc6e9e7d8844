// Collection and engine behaviour against independent references: brute-force MaxSim over what
// Get() returns, exhaustive search for recall, reopen for durability.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/collection/collection_test_util.h"
#include "tessera/engine.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// The regular files under `dir` whose names `wanted` accepts: how many, and their sizes.
struct FilesOnDisk {
  int64_t count = 0;
  int64_t bytes = 0;
};
FilesOnDisk FilesUnder(const std::string& dir,
                       const std::function<bool(const std::string& name)>& wanted) {
  FilesOnDisk files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() && wanted(entry.path().filename().string())) {
      ++files.count;
      files.bytes += static_cast<int64_t>(entry.file_size());
    }
  }
  return files;
}

// Property: exhaustive search (and N ≥ collection size) equals brute force over stored vectors,
// across random dimensions, dtypes, shard counts, pool factors and document lengths.
TEST(CollectionSearch, ExhaustiveEqualsBruteForce) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 6; ++trial) {
    TempDir dir;
    auto engine = Engine::Open(dir.path());
    ASSERT_TRUE(engine.ok()) << engine.status();
    const int64_t dim = std::vector<int64_t>{8, 16, 48, 64, 96, 128}[trial];
    CollectionSchema schema = Schema(absl::StrCat("c", trial), dim);
    schema.dtype = trial % 2 ? VectorDtype::kFloat32 : VectorDtype::kFloat16;
    schema.num_shards = 1 + trial % 3;
    schema.pooling.hierarchical->pool_factor = 1 + trial % 3;
    auto collection = (*engine)->CreateCollection(schema);
    ASSERT_TRUE(collection.ok()) << collection.status();
    Corpus corpus(dim, 100 + trial);
    std::vector<Document> documents;
    std::vector<std::string> ids;
    std::uniform_int_distribution<int64_t> length(1, 40);
    for (int d = 0; d < 120; ++d) {
      documents.push_back(corpus.Make(absl::StrCat("doc-", d), length(rng)));
      ids.push_back(documents.back().id);
    }
    ExpectAllOk((*collection)->Upsert(documents));
    for (int q = 0; q < 4; ++q) {
      const std::vector<float> query = corpus.QueryFrom(documents[q * 7], 1 + q * 5);
      const auto expected = BruteForce(**collection, ids, query, dim);
      for (bool exhaustive : {true, false}) {
        SearchOptions options;
        options.k = 15;
        options.exhaustive = exhaustive;
        options.num_candidates = exhaustive ? 0 : 1000;  // N ≥ collection size
        auto result = (*collection)
                          ->Search(FloatMatrixView{query.data(),
                                                   static_cast<int64_t>(query.size()) / dim, dim},
                                   options);
        ASSERT_TRUE(result.ok()) << result.status();
        EXPECT_TRUE(result->exhaustive);
        ASSERT_EQ(result->hits.size(), 15u);
        for (size_t h = 0; h < result->hits.size(); ++h) {
          EXPECT_EQ(result->hits[h].id, expected[h].first) << "trial " << trial << " hit " << h;
          EXPECT_NEAR(result->hits[h].score, expected[h].second,
                      1e-5 * std::max(1.0, std::abs(expected[h].second)));
        }
      }
    }
  }
}

// Recall of the default cascade against exhaustive search on a structured corpus: 150 families
// of paraphrases (a source document and 11 rewrites of increasing distance, so a query's true top
// 10 is well defined) among 1,800 unrelated documents, all drawn from shared topic directions.
TEST(CollectionSearch, DefaultCascadeRecallAgainstExhaustive) {
  TempDir dir;
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok());
  const int64_t dim = 64;
  auto collection = (*engine)->CreateCollection(Schema("recall", dim));
  ASSERT_TRUE(collection.ok());
  Corpus corpus(dim, 7);
  std::vector<Document> documents, sources;
  std::uniform_int_distribution<int64_t> length(16, 64);
  for (int f = 0; f < 150; ++f) {
    sources.push_back(corpus.Make(absl::StrCat("f", f, "-0"), length(corpus.rng())));
    documents.push_back(sources.back());
    for (int m = 1; m < 12; ++m) {
      documents.push_back(
          corpus.Paraphrase(sources.back(), absl::StrCat("f", f, "-", m), 0.08f * m));
    }
  }
  for (int d = 0; d < 1800; ++d) {
    documents.push_back(corpus.Make(absl::StrCat("d", d), length(corpus.rng())));
  }
  std::shuffle(documents.begin(), documents.end(), corpus.rng());
  for (size_t begin = 0; begin < documents.size(); begin += 500) {
    const size_t end = std::min(documents.size(), begin + 500);
    ExpectAllOk(
        (*collection)
            ->Upsert(std::vector<Document>(documents.begin() + begin, documents.begin() + end)));
  }
  double recall = 0;
  int64_t scored = 0;
  const int queries = 40;
  for (int q = 0; q < queries; ++q) {
    const std::vector<float> query = corpus.QueryFrom(sources[q * 3], 24);
    const FloatMatrixView view{query.data(), 24, dim};
    SearchOptions options;
    auto fast = (*collection)->Search(view, options);
    options.exhaustive = true;
    auto exact = (*collection)->Search(view, options);
    ASSERT_TRUE(fast.ok() && exact.ok());
    EXPECT_FALSE(fast->exhaustive);
    std::set<std::string> truth;
    for (const SearchHit& hit : exact->hits) truth.insert(hit.id);
    for (const SearchHit& hit : fast->hits) recall += truth.count(hit.id) / 10.0;
    scored += fast->documents_scored;
  }
  recall /= queries;
  std::cout << "recall@10 " << recall << ", documents scored exactly per query " << scored / queries
            << " of " << documents.size() << "\n";
  EXPECT_GE(recall, 0.98);
  EXPECT_LE(scored / queries, static_cast<int64_t>(documents.size()) / 10);
}

// A small shard is searched exhaustively by default (kExhaustiveDefaultShareMultiple): stage 1 here
// is as coarse as it gets — one mean vector per document — and ranks the one document holding the
// query's exact token (its other tokens point away) below 200 documents that lean towards the
// query everywhere, so the cascade's N = 100 never reaches it. 200 documents: the most that
// kExhaustiveDefaultShareMultiple (2) × N = 100 covers. The default search scores every
// document and equals brute force; an explicit N still limits the rerank to N.
TEST(CollectionSearch, SmallCollectionsAreSearchedExhaustivelyByDefault) {
  TempDir dir;
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  constexpr int64_t kDim = 16;
  CollectionSchema schema = Schema("small", kDim);
  schema.pooling.hierarchical->pool_factor = 1;  // the needle keeps its exact token
  schema.candidates.kind = CandidateSpec::Kind::kGlobalMean;
  auto collection = (*engine)->CreateCollection(schema);
  ASSERT_TRUE(collection.ok()) << collection.status();
  auto document = [](const std::string& id, const std::vector<std::vector<float>>& rows) {
    Document out;
    out.id = id;
    out.num_tokens = static_cast<int64_t>(rows.size());
    out.dim = kDim;
    for (const auto& row : rows) out.tokens.insert(out.tokens.end(), row.begin(), row.end());
    out.tokens = Normalized(out.tokens, kDim);
    return out;
  };
  auto axes = [](float along_query, int axis) {
    std::vector<float> row(kDim, 0.0f);
    row[0] = along_query;
    row[axis] = 1.0f;
    return row;
  };
  std::vector<Document> documents;
  std::vector<std::string> ids;
  for (int d = 0; d < 199; ++d) {
    // Every token at cosine 0.55 … 0.8 from the query: a mean close to it.
    const float lean = 0.66f + 0.67f * static_cast<float>(d) / 199.0f;
    std::vector<std::vector<float>> rows;
    for (int t = 0; t < 4; ++t) rows.push_back(axes(lean, 1 + (d + 5 * t) % (kDim - 1)));
    documents.push_back(document(absl::StrCat("lean-", d), rows));
  }
  std::vector<std::vector<float>> needle = {axes(1.0f, 0)};
  for (int t = 0; t < 3; ++t) needle.push_back(axes(-0.6f, 3 + t));
  documents.push_back(document("needle", needle));
  for (const Document& d : documents) ids.push_back(d.id);
  ExpectAllOk((*collection)->Upsert(documents));
  const std::vector<float> query = axes(1.0f, 0);
  const FloatMatrixView view{query.data(), 1, kDim};
  const auto expected = BruteForce(**collection, ids, query, kDim);
  ASSERT_EQ(expected[0].first, "needle");

  SearchOptions options;
  auto result = (*collection)->Search(view, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->exhaustive);
  EXPECT_EQ(result->documents_scored, 200);
  ASSERT_EQ(result->hits.size(), 10u);
  for (size_t h = 0; h < result->hits.size(); ++h) {
    EXPECT_EQ(result->hits[h].id, expected[h].first) << "hit " << h;
    EXPECT_NEAR(result->hits[h].score, expected[h].second, 1e-5) << "hit " << h;
  }

  // The cascade, asked for: N = 100 (the default N for k = 10) documents reranked, and the needle
  // is not among them.
  options.num_candidates = 100;
  auto cascade = (*collection)->Search(view, options);
  ASSERT_TRUE(cascade.ok()) << cascade.status();
  EXPECT_FALSE(cascade->exhaustive);
  EXPECT_EQ(cascade->documents_scored, 100);
  EXPECT_EQ(cascade->num_candidates, 100);
  ASSERT_EQ(cascade->hits.size(), 10u);
  EXPECT_NE(cascade->hits[0].id, "needle");
  // So does a caller who tunes stage 1 (k′) and leaves N at its default.
  options.num_candidates = 0;
  options.per_token_candidates = 100;
  auto tuned = (*collection)->Search(view, options);
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  EXPECT_FALSE(tuned->exhaustive);
  EXPECT_EQ(tuned->documents_scored, 100);

  // One more document and the shard is past 2 × N: the default is the cascade again.
  ExpectAllOk((*collection)->Upsert({document("one-more", {axes(0.1f, 2)})}));
  auto larger = (*collection)->Search(view, SearchOptions{});
  ASSERT_TRUE(larger.ok()) << larger.status();
  EXPECT_FALSE(larger->exhaustive);
  EXPECT_EQ(larger->documents_scored, 100);
}

TEST(CollectionSearch, SelectiveFilterStillReturnsK) {
  TempDir dir;
  auto engine = Engine::Open(dir.path());
  const int64_t dim = 32;
  auto collection = (*engine)->CreateCollection(Schema("filtered", dim));
  ASSERT_TRUE(collection.ok());
  Corpus corpus(dim, 3);
  std::vector<Document> documents;
  for (int d = 0; d < 2000; ++d) {
    documents.push_back(corpus.Make(absl::StrCat("d", d), 20));
    documents.back().attributes["group"] = int64_t{d % 100};  // group 7: 1% of documents
    documents.back().attributes["lang"] = d % 2 ? "en" : "de";
  }
  ExpectAllOk((*collection)->Upsert(documents));
  const std::vector<float> query = corpus.QueryFrom(documents[3], 8);
  SearchOptions options;
  options.k = 10;
  options.filter.all_of.push_back(FilterCondition{"group", FilterCondition::Op::kEq, {int64_t{7}}});
  auto result = (*collection)->Search(FloatMatrixView{query.data(), 8, dim}, options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->hits.size(), 10u);
  for (const SearchHit& hit : result->hits) {
    const int d = std::stoi(hit.id.substr(1));
    EXPECT_EQ(d % 100, 7) << hit.id;
  }
  // Unknown field and type mismatch are rejected.
  options.filter.all_of[0].field = "colour";
  EXPECT_THAT(
      (*collection)->Search(FloatMatrixView{query.data(), 8, dim}, options).status().message(),
      HasSubstr("unknown field 'colour'"));
}

TEST(CollectionWrites, UpsertReplacesAndDeleteRemoves) {
  TempDir dir;
  auto engine = Engine::Open(dir.path());
  const int64_t dim = 16;
  auto collection = (*engine)->CreateCollection(Schema("writes", dim));
  ASSERT_TRUE(collection.ok());
  Corpus corpus(dim, 5);
  std::vector<Document> documents;
  for (int d = 0; d < 50; ++d) documents.push_back(corpus.Make(absl::StrCat("d", d), 12));
  ExpectAllOk((*collection)->Upsert(documents));
  // The query matches d9 best; replace d9 with unrelated content, then delete d8.
  const std::vector<float> query = corpus.QueryFrom(documents[9], 6);
  const FloatMatrixView view{query.data(), 6, dim};
  auto before = (*collection)->Search(view, SearchOptions{});
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->hits[0].id, "d9");
  EXPECT_EQ(before->hits[0].version, 1u);
  Document replacement = corpus.Make("d9", 12);
  auto outcomes = (*collection)->Upsert({replacement});
  ExpectAllOk(outcomes);
  EXPECT_EQ(outcomes[0].version, 2u);
  auto stored = (*collection)->Get("d9");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->version, 2u);
  auto after = (*collection)->Search(view, SearchOptions{});
  ASSERT_TRUE(after.ok());
  for (const SearchHit& hit : after->hits) {
    if (hit.id == "d9") {
      EXPECT_EQ(hit.version, 2u);
    }
  }
  EXPECT_LT(after->hits[0].id == "d9" ? after->hits[0].score : 0.0f, before->hits[0].score);
  auto deleted = (*collection)->Delete({"d8", "nope"});
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, (std::vector<bool>{true, false}));
  EXPECT_EQ((*collection)->Get("d8").status().code(), absl::StatusCode::kNotFound);
  SearchOptions all;
  all.k = 100;
  all.exhaustive = true;
  auto everything = (*collection)->Search(view, all);
  ASSERT_TRUE(everything.ok());
  EXPECT_EQ(everything->hits.size(), 49u);
  for (const SearchHit& hit : everything->hits) EXPECT_NE(hit.id, "d8");
  EXPECT_EQ((*collection)->Stats().documents, 49);
}

TEST(CollectionWrites, BadInputIsRejectedAndChangesNothing) {
  TempDir dir;
  auto engine = Engine::Open(dir.path());
  const int64_t dim = 16;
  auto collection = (*engine)->CreateCollection(Schema("bad", dim));
  ASSERT_TRUE(collection.ok());
  Corpus corpus(dim, 9);
  ExpectAllOk((*collection)->Upsert({corpus.Make("keep", 10)}));
  const StoredDocument original = *(*collection)->Get("keep");

  std::vector<Document> bad;
  bad.push_back(corpus.Make("keep", 10));
  bad.back().dim = 8;  // wrong dimension (same id: must not replace)
  bad.push_back(corpus.Make("keep", 10));
  bad.back().tokens[5] = NAN;
  bad.push_back(corpus.Make("keep", 10));
  bad.back().tokens[5] = INFINITY;
  bad.push_back(corpus.Make("empty", 1));
  bad.back().num_tokens = 0;
  bad.back().tokens.clear();
  bad.push_back(corpus.Make("", 3));
  bad.push_back(corpus.Make(std::string(2000, 'x'), 3));
  bad.push_back(corpus.Make(std::string("\xff\xfe"), 3));
  bad.push_back(corpus.Make("attr", 3));
  bad.back().attributes["colour"] = "red";
  bad.push_back(corpus.Make("attr-type", 3));
  bad.back().attributes["group"] = "seven";
  bad.push_back(corpus.Make("huge", 3));
  bad.back().num_tokens = kMaxHierarchicalPoolingTokens + 1;
  const auto outcomes = (*collection)->Upsert(bad);
  const std::vector<std::string> expected = {"dim 8, collection 'bad' expects 16",
                                             "is not finite",
                                             "is not finite",
                                             "num_tokens 0",
                                             "document id is empty",
                                             "document id of 2000 bytes",
                                             "not valid UTF-8",
                                             "attribute 'colour' is not a field",
                                             "attribute 'group' is string, expected int64",
                                             "exceeds the limit"};
  ASSERT_EQ(outcomes.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(outcomes[i].status.code(), absl::StatusCode::kInvalidArgument) << i;
    EXPECT_THAT(outcomes[i].status.message(), HasSubstr(expected[i])) << i;
  }
  const StoredDocument now = *(*collection)->Get("keep");
  EXPECT_EQ(now.version, original.version);
  EXPECT_EQ(now.vectors, original.vectors);
  EXPECT_EQ((*collection)->Stats().documents, 1);

  // Search-side validation.
  const std::vector<float> query(4 * dim, 0.25f);
  SearchOptions options;
  options.k = 0;
  EXPECT_THAT(
      (*collection)->Search(FloatMatrixView{query.data(), 4, dim}, options).status().message(),
      HasSubstr("k 0"));
  options.k = 1001;  // the limits are the collection's alone (the server checks none itself)
  EXPECT_THAT(
      (*collection)->Search(FloatMatrixView{query.data(), 4, dim}, options).status().message(),
      HasSubstr("k 1001 exceeds the limit of 1000"));
  options.k = 10;
  options.num_candidates = 5;
  EXPECT_THAT(
      (*collection)->Search(FloatMatrixView{query.data(), 4, dim}, options).status().message(),
      HasSubstr("num_candidates 5 is below k 10"));
  options.num_candidates = 10001;
  EXPECT_THAT(
      (*collection)->Search(FloatMatrixView{query.data(), 4, dim}, options).status().message(),
      HasSubstr("num_candidates 10001 exceeds the limit of 10000"));
  EXPECT_THAT((*collection)
                  ->Search(FloatMatrixView{query.data(), 8, 8}, SearchOptions{})
                  .status()
                  .message(),
              HasSubstr("query: dim 8"));
  EXPECT_THAT((*collection)
                  ->Search(FloatMatrixView{query.data(), 0, dim}, SearchOptions{})
                  .status()
                  .message(),
              HasSubstr("query: 0 tokens, expected at least 1"));

  // Engine-level errors.
  EXPECT_EQ((*engine)->CreateCollection(Schema("bad", dim)).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ((*engine)->GetCollection("missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*engine)->DropCollection("missing").code(), absl::StatusCode::kNotFound);
  CollectionSchema invalid = Schema("broken", dim);
  invalid.candidates.factory = "NotAnIndex42";
  EXPECT_EQ((*engine)->CreateCollection(invalid).status().code(),
            absl::StatusCode::kInvalidArgument);
  invalid = Schema("no/slash", dim);
  EXPECT_EQ((*engine)->CreateCollection(invalid).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->ListCollections(), (std::vector<std::string>{"bad"}));
}

// What the server refuses, refused by the library itself: NaN and ±inf attributes, token and
// query values whose MaxSim products could overflow fp32 (3e38 scored inf and ranked first), and
// ids that Upsert refuses given to Get and Delete (they answered NOT_FOUND / false).
TEST(CollectionWrites, HostileValuesAndIdsAreRefusedAndChangeNothing) {
  TempDir dir;
  auto engine = Engine::Open(dir.path());
  const int64_t dim = 16;
  CollectionSchema schema = Schema("hostile", dim);
  schema.dtype = VectorDtype::kFloat32;
  schema.attributes["score"] = AttributeType::kDouble;
  auto collection = (*engine)->CreateCollection(schema);
  ASSERT_TRUE(collection.ok());
  Corpus corpus(dim, 13);
  ExpectAllOk((*collection)->Upsert({corpus.Make("keep", 10)}));

  std::vector<Document> bad;
  for (double value :
       {static_cast<double>(NAN), static_cast<double>(INFINITY), -static_cast<double>(INFINITY)}) {
    bad.push_back(corpus.Make("attr", 3));
    bad.back().attributes["score"] = value;
  }
  for (float value : {3e38f, -70000.0f}) {
    bad.push_back(corpus.Make("big", 3));
    bad.back().tokens[17] = value;  // token 1, dimension 1
  }
  const auto outcomes = (*collection)->Upsert(bad);
  const std::vector<std::vector<std::string>> expected = {
      {"'attr'", "attribute 'score' is nan", "expected a finite number"},
      {"attribute 'score' is inf", "expected a finite number"},
      {"attribute 'score' is -inf", "expected a finite number"},
      {"'big'", "value 3e+38 at token 1, dimension 1", "largest magnitude accepted, 65504"},
      {"value -70000 at token 1, dimension 1", "largest magnitude accepted, 65504"}};
  ASSERT_EQ(outcomes.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(outcomes[i].status.code(), absl::StatusCode::kInvalidArgument) << i;
    for (const std::string& fragment : expected[i]) {
      EXPECT_THAT(outcomes[i].status.message(), HasSubstr(fragment)) << i;
    }
  }
  EXPECT_EQ((*collection)->Stats().documents, 1);

  // The bound itself is accepted, and the scores against it stay finite.
  Document edge = corpus.Make("edge", 3);
  std::fill(edge.tokens.begin(), edge.tokens.end(), kMaxVectorValue);
  ExpectAllOk((*collection)->Upsert({edge}));
  std::vector<float> query(4 * dim, kMaxVectorValue);
  auto result = (*collection)->Search(FloatMatrixView{query.data(), 4, dim}, SearchOptions{});
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->hits.size(), 2u);
  EXPECT_EQ(result->hits[0].id, "edge");
  EXPECT_TRUE(std::isfinite(result->hits[0].score)) << result->hits[0].score;
  query[dim + 3] = -3e38f;
  EXPECT_THAT(
      (*collection)->Search(FloatMatrixView{query.data(), 4, dim}, SearchOptions{}).status(),
      ::testing::AllOf(
          ::testing::Property(&absl::Status::code, absl::StatusCode::kInvalidArgument),
          ::testing::Property(&absl::Status::message,
                              HasSubstr("query: value -3e+38 at token 1, dimension 3 exceeds the "
                                        "largest magnitude accepted, 65504"))));

  // Ids no document can have: INVALID_ARGUMENT, as Upsert says; nothing is deleted.
  const std::vector<std::pair<std::string, std::string>> ids = {
      {"", "document id is empty"},
      {std::string(1 << 20, 'x'), "document id of 1048576 bytes, expected at most 1024"},
      {"ab\xff\xfe", "document id is not valid UTF-8"}};
  for (const auto& [id, message] : ids) {
    const absl::Status get = (*collection)->Get(id).status();
    EXPECT_EQ(get.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(get.message(), HasSubstr(message));
    EXPECT_LT(get.message().size(), 200u);
    const absl::Status deleted = (*collection)->Delete({"keep", id}).status();
    EXPECT_EQ(deleted.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(deleted.message(), HasSubstr(absl::StrCat("ids[1]: ", message)));
  }
  EXPECT_TRUE((*collection)->Get("keep").ok());
  EXPECT_EQ((*collection)->Stats().documents, 2);
}

// Filters on a double field of finite values: each op and threshold selects exactly the
// documents plain comparisons select, and NaN as a filter value is refused (it made == match
// every document with the field and != none).
TEST(CollectionSearch, FiltersOnDoublesSelectWhatComparisonsSelect) {
  TempDir dir;
  auto engine = Engine::Open(dir.path());
  const int64_t dim = 8;
  CollectionSchema schema = Schema("scores", dim);
  schema.attributes["score"] = AttributeType::kDouble;
  auto collection = (*engine)->CreateCollection(schema);
  ASSERT_TRUE(collection.ok());
  Corpus corpus(dim, 17);
  std::vector<Document> documents;
  std::map<std::string, double> scores;
  const double values[] = {-1.5, 0.0, 0.25, 0.5, 0.5, 1.0, 2.0, 1e300, -1e300};
  for (int d = 0; d < 45; ++d) {
    documents.push_back(corpus.Make(absl::StrCat("d", d), 4));
    if (d % 5 == 4) continue;  // without the field
    const double score = values[d % 9];
    documents.back().attributes["score"] = score;
    scores[documents.back().id] = score;
  }
  ExpectAllOk((*collection)->Upsert(documents));
  const std::vector<float> query = corpus.QueryFrom(documents[0], 3);
  using Op = FilterCondition::Op;
  const std::vector<std::pair<Op, std::function<bool(double, double)>>> ops = {
      {Op::kEq, [](double a, double b) { return a == b; }},
      {Op::kNe, [](double a, double b) { return a != b; }},
      {Op::kLt, [](double a, double b) { return a < b; }},
      {Op::kLe, [](double a, double b) { return a <= b; }},
      {Op::kGt, [](double a, double b) { return a > b; }},
      {Op::kGe, [](double a, double b) { return a >= b; }},
      {Op::kIn, [](double a, double b) { return a == b; }}};
  for (const auto& [op, holds] : ops) {
    for (double threshold :
         {0.5, -1.5, 0.3, 1e300, static_cast<double>(INFINITY), -static_cast<double>(INFINITY)}) {
      SearchOptions options;
      options.k = 100;
      options.exhaustive = true;
      options.filter.all_of.push_back(FilterCondition{"score", op, {threshold}});
      auto result = (*collection)->Search(FloatMatrixView{query.data(), 3, dim}, options);
      ASSERT_TRUE(result.ok()) << result.status();
      std::set<std::string> found, wanted;
      for (const SearchHit& hit : result->hits) found.insert(hit.id);
      for (const auto& [id, score] : scores) {
        if (holds(score, threshold)) wanted.insert(id);
      }
      EXPECT_EQ(found, wanted) << "op " << static_cast<int>(op) << " " << threshold;
    }
  }
  for (Op op : {Op::kEq, Op::kNe, Op::kGe, Op::kIn}) {
    SearchOptions options;
    options.filter.all_of.push_back(FilterCondition{"score", op, {0.5, static_cast<double>(NAN)}});
    if (op != Op::kIn)
      options.filter.all_of[0].values.erase(options.filter.all_of[0].values.begin());
    const absl::Status status =
        (*collection)->Search(FloatMatrixView{query.data(), 3, dim}, options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << static_cast<int>(op);
    EXPECT_THAT(status.message(), HasSubstr("on 'score': value nan"));
  }
}

// Reopening replays nothing it should not and loses nothing; a missing or corrupt candidate
// snapshot is rebuilt from RocksDB with identical results.
TEST(CollectionDurability, ReopenAndSnapshotLossGiveIdenticalResults) {
  TempDir dir;
  const int64_t dim = 32;
  Corpus corpus(dim, 21);
  std::vector<Document> documents;
  for (int d = 0; d < 400; ++d) documents.push_back(corpus.Make(absl::StrCat("d", d), 24));
  const std::vector<float> query = corpus.QueryFrom(documents[17], 10);
  const FloatMatrixView view{query.data(), 10, dim};
  SearchOptions options;
  options.k = 20;
  options.num_candidates = 100;

  std::vector<SearchHit> reference;
  {
    auto engine = Engine::Open(dir.path());
    CollectionSchema schema = Schema("durable", dim);
    schema.num_shards = 2;
    auto collection = (*engine)->CreateCollection(schema);
    ASSERT_TRUE(collection.ok());
    ExpectAllOk(
        (*collection)->Upsert(std::vector<Document>(documents.begin(), documents.begin() + 300)));
    ASSERT_TRUE((*collection)->Snapshot().ok());
    // Writes after the snapshot: replayed on open.
    ExpectAllOk(
        (*collection)->Upsert(std::vector<Document>(documents.begin() + 300, documents.end())));
    ASSERT_TRUE((*collection)->Delete({"d1", "d2"}).ok());
    auto result = (*collection)->Search(view, options);
    ASSERT_TRUE(result.ok());
    reference = result->hits;
  }
  auto check = [&](const std::string& what) {
    auto engine = Engine::Open(dir.path());
    ASSERT_TRUE(engine.ok()) << what << ": " << engine.status();
    auto collection = (*engine)->GetCollection("durable");
    ASSERT_TRUE(collection.ok()) << what;
    EXPECT_EQ((*collection)->Stats().documents, 398) << what;
    auto result = (*collection)->Search(view, options);
    ASSERT_TRUE(result.ok()) << what;
    ASSERT_EQ(result->hits.size(), reference.size()) << what;
    for (size_t h = 0; h < reference.size(); ++h) {
      EXPECT_EQ(result->hits[h].id, reference[h].id) << what << " " << h;
      EXPECT_EQ(result->hits[h].score, reference[h].score) << what << " " << h;
    }
  };
  check("reopen");
  fs::path snapshot;
  for (const auto& entry : fs::directory_iterator(fs::path(dir.path()) / "collections")) {
    snapshot = entry.path() / "shard-000/candidates.snapshot";
  }
  ASSERT_TRUE(fs::exists(snapshot));
  fs::remove(snapshot);
  check("snapshot deleted");
  {
    std::fstream file(snapshot, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(file.good());
    file.seekp(100);
    file.put('\x5a');
  }
  check("snapshot corrupted");
  fs::resize_file(snapshot, fs::file_size(snapshot) / 2);
  check("snapshot truncated");
}

// The segment figures are the store's files: before a flush (the 64 MiB threshold is far off) the
// fp16 rerank rows all wait in RocksDB and there is no segment; Snapshot flushes them into
// rerank-*.seg files whose sizes on disk add up to rerank_segment_bytes; later writes wait again.
TEST(CollectionStats, SegmentFiguresAreTheFilesOnDisk) {
  TempDir dir;
  const int64_t dim = 16;
  Corpus corpus(dim, 41);
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  CollectionSchema schema = Schema("segments", dim);
  schema.num_shards = 2;
  auto collection = (*engine)->CreateCollection(schema);
  ASSERT_TRUE(collection.ok()) << collection.status();
  ASSERT_FALSE(schema.candidates.rerank_from_codes) << "the exact mode: fp16 rerank rows";
  std::vector<Document> documents;
  for (int d = 0; d < 80; ++d) documents.push_back(corpus.Make(absl::StrCat("d", d), 6 + d % 9));
  ExpectAllOk((*collection)->Upsert(documents));
  // The rerank-*.seg files under the collection's shard directories.
  const auto segment_files = [&] {
    return FilesUnder(dir.path(), [](const std::string& name) {
      return name.rfind("rerank-", 0) == 0 && name.size() > 4 &&
             name.compare(name.size() - 4, 4, ".seg") == 0;
    });
  };

  const CollectionStats before = (*collection)->Stats();
  ASSERT_GT(before.rerank_vectors, 0);
  EXPECT_EQ(before.segments.rerank_segments, 0);
  EXPECT_EQ(before.segments.rerank_segment_bytes, 0);
  EXPECT_EQ(before.segments.rerank_unflushed_bytes, before.rerank_vectors * dim * 2)
      << "every stored fp16 row, " << before.rerank_vectors << " rows of " << dim;
  EXPECT_EQ(segment_files().count, 0);

  ASSERT_TRUE((*collection)->Snapshot().ok());
  const CollectionStats flushed = (*collection)->Stats();
  const FilesOnDisk flushed_files = segment_files();
  EXPECT_GE(flushed.segments.rerank_segments, 1);
  EXPECT_EQ(flushed.segments.rerank_segments, flushed_files.count);
  EXPECT_GT(flushed.segments.rerank_segment_bytes, 0);
  EXPECT_EQ(flushed.segments.rerank_segment_bytes, flushed_files.bytes);
  EXPECT_GE(flushed.segments.rerank_segment_bytes, before.segments.rerank_unflushed_bytes)
      << "the rows and more";
  EXPECT_EQ(flushed.segments.rerank_unflushed_bytes, 0);
  EXPECT_LE(flushed.segments.rerank_segment_bytes, flushed.disk_bytes);
  // No codes in the exact mode.
  for (const CollectionStats& stats : {before, flushed}) {
    EXPECT_EQ(stats.segments.code_segments, 0);
    EXPECT_EQ(stats.segments.code_segment_bytes, 0);
    EXPECT_EQ(stats.segments.code_unflushed_bytes, 0);
  }

  // A later write waits in RocksDB for the next flush; the segments stay as they are.
  const Document late = corpus.Make("late", 8);
  ExpectAllOk((*collection)->Upsert({late}));
  const CollectionStats after = (*collection)->Stats();
  EXPECT_EQ(after.segments.rerank_segments, flushed.segments.rerank_segments);
  EXPECT_EQ(after.segments.rerank_segment_bytes, flushed.segments.rerank_segment_bytes);
  EXPECT_EQ(after.segments.rerank_unflushed_bytes,
            (after.rerank_vectors - flushed.rerank_vectors) * dim * 2);
  EXPECT_GT(after.segments.rerank_unflushed_bytes, 0);
}

// A flush leaves no write-ahead log of what it flushed behind: the log of an ingest holds every row
// it wrote, and RocksDB deleted it only at its next purge of obsolete files (a collection measured
// twice its size right after its flush).
TEST(CollectionStats, AFlushLeavesNoWriteAheadLogBehind) {
  TempDir dir;
  const int64_t dim = 384;
  Corpus corpus(dim, 43);
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto collection = (*engine)->CreateCollection(Schema("wal", dim));
  ASSERT_TRUE(collection.ok()) << collection.status();
  for (int batch = 0; batch < 44; ++batch) {
    std::vector<Document> documents;
    for (int d = 0; d < 32; ++d) {
      documents.push_back(corpus.Make(absl::StrCat("d", batch, "-", d), 188));
    }
    ExpectAllOk((*collection)->Upsert(documents));
  }
  while ((*collection)->Stats().training_shards > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE((*collection)->Snapshot().ok());
  const FilesOnDisk logs = FilesUnder(
      dir.path(), [](const std::string& name) { return fs::path(name).extension() == ".log"; });
  EXPECT_LT(logs.bytes, int64_t{1} << 20);
}

// Resident rerank vectors (none, part of the collection, all of it) give the results of brute
// force over Get() through upserts, replacements, deletes and a reopen, and the budget is kept.
TEST(CollectionSearch, ResidentRerankVectorsEqualStoredOnes) {
  const int64_t dim = 24;
  Corpus corpus(dim, 31);
  std::vector<Document> documents;
  std::vector<std::string> ids;
  for (int d = 0; d < 90; ++d) {
    documents.push_back(corpus.Make(absl::StrCat("d", d), 10 + d % 17));
    ids.push_back(documents.back().id);
  }
  // fp16 rerank vectors, p = 2: ~37 kB in all, so 12 kB per shard holds part of them.
  for (int64_t budget : {int64_t{0}, int64_t{12000}, int64_t{1} << 30}) {
    SCOPED_TRACE(absl::StrCat("budget ", budget));
    TempDir dir;
    EngineOptions engine_options;
    engine_options.resident_rerank_bytes = budget;
    auto check = [&](const Collection& collection, const std::string& what) {
      const CollectionStats stats = collection.Stats();
      EXPECT_LE(stats.resident_bytes, budget * 2) << what;  // two shards, a budget each
      if (budget == 0) {
        EXPECT_EQ(stats.resident_bytes, 0) << what;
      }
      if (budget > 1000000) {
        EXPECT_EQ(stats.resident_bytes, stats.rerank_vectors * dim * 2) << what;
      }
      if (budget == 12000) {
        EXPECT_GT(stats.resident_bytes, 0) << what;
        EXPECT_LT(stats.resident_bytes, stats.rerank_vectors * dim * 2) << what;
      }
      for (int q = 0; q < 3; ++q) {
        const std::vector<float> query = corpus.QueryFrom(documents[q * 13], 6);
        const auto expected = BruteForce(collection, ids, query, dim);
        SearchOptions options;
        options.k = 30;
        options.exhaustive = true;
        auto result = collection.Search(FloatMatrixView{query.data(), 6, dim}, options);
        ASSERT_TRUE(result.ok()) << what << ": " << result.status();
        ASSERT_EQ(result->hits.size(), 30u) << what;
        for (size_t h = 0; h < result->hits.size(); ++h) {
          EXPECT_EQ(result->hits[h].id, expected[h].first) << what << " hit " << h;
          EXPECT_NEAR(result->hits[h].score, expected[h].second,
                      1e-5 * std::max(1.0, std::abs(expected[h].second)))
              << what;
        }
      }
    };
    {
      auto engine = Engine::Open(dir.path(), engine_options);
      ASSERT_TRUE(engine.ok()) << engine.status();
      CollectionSchema schema = Schema("resident", dim);
      schema.num_shards = 2;
      auto collection = (*engine)->CreateCollection(schema);
      ASSERT_TRUE(collection.ok()) << collection.status();
      ExpectAllOk((*collection)->Upsert(documents));
      check(**collection, "after upsert");
      // Replace documents the queries are drawn from and delete others: resident copies follow.
      ExpectAllOk((*collection)->Upsert({corpus.Make("d0", 20), corpus.Make("d13", 5)}));
      ASSERT_TRUE((*collection)->Delete({"d26", "d40"}).ok());
      check(**collection, "after replace and delete");
    }
    auto engine = Engine::Open(dir.path(), engine_options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto collection = (*engine)->GetCollection("resident");
    ASSERT_TRUE(collection.ok());
    check(**collection, "after reopen");
  }
}

TEST(CollectionExplain, PointsAtTheCoveredTokens) {
  TempDir dir;
  auto engine = Engine::Open(dir.path());
  const int64_t dim = 16;
  auto collection = (*engine)->CreateCollection(Schema("explain", dim));
  ASSERT_TRUE(collection.ok());
  Corpus corpus(dim, 4);
  Document document = corpus.Make("page", 30);
  ExpectAllOk((*collection)->Upsert({document}));
  const std::vector<float> query = corpus.QueryFrom(document, 5);
  SearchOptions options;
  options.explain = true;
  auto result = (*collection)->Search(FloatMatrixView{query.data(), 5, dim}, options);
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result->hits.size(), 1u);
  const SearchHit& hit = result->hits[0];
  ASSERT_EQ(hit.explanation.size(), 5u);
  const StoredDocument stored = *(*collection)->Get("page");
  double total = 0;
  for (const TokenMatch& match : hit.explanation) {
    total += match.similarity;
    const int32_t v = match.document_vector;
    EXPECT_EQ(match.covered_tokens,
              std::vector<int32_t>(stored.members.begin() + stored.member_offsets[v],
                                   stored.members.begin() + stored.member_offsets[v + 1]));
    // The best vector really is the best: no stored vector beats it.
    for (int64_t w = 0; w < stored.num_vectors(); ++w) {
      double dot = 0;
      for (int64_t k = 0; k < dim; ++k) {
        dot += query[match.query_token * dim + k] * stored.vectors[w * dim + k];
      }
      EXPECT_LE(dot, match.similarity + 1e-5);
    }
  }
  EXPECT_NEAR(total, hit.score, 1e-4);
}

TEST(CollectionConcurrency, SearchesDuringWritesSeeAcknowledgedDocuments) {
  TempDir dir;
  EngineOptions engine_options;
  engine_options.threads = 2;
  auto engine = Engine::Open(dir.path(), engine_options);
  const int64_t dim = 16;
  CollectionSchema schema = Schema("busy", dim);
  schema.num_shards = 2;
  auto collection = (*engine)->CreateCollection(schema);
  ASSERT_TRUE(collection.ok());
  std::vector<Document> documents;
  {
    Corpus corpus(dim, 8);
    for (int d = 0; d < 300; ++d) documents.push_back(corpus.Make(absl::StrCat("d", d), 10));
  }
  std::atomic<int> acknowledged{0};
  std::atomic<bool> failed{false};
  std::thread writer([&] {
    for (int d = 0; d < 300; d += 3) {
      auto outcomes =
          (*collection)
              ->Upsert(std::vector<Document>(documents.begin() + d, documents.begin() + d + 3));
      for (const auto& outcome : outcomes) failed = failed || !outcome.status.ok();
      if (d % 30 == 0 && d > 0) {
        auto deleted = (*collection)->Delete({absl::StrCat("d", d - 30)});
        failed = failed || !deleted.ok();
      }
      acknowledged = d + 3;
    }
  });
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      while (acknowledged < 300) {
        const int seen = acknowledged;
        if (seen == 0) continue;
        // The last acknowledged document is found by an exhaustive search for its own tokens.
        const Document& target = documents[seen - 1];
        SearchOptions options;
        options.k = 3;
        options.exhaustive = r == 0;
        auto result =
            (*collection)
                ->Search(FloatMatrixView{target.tokens.data(), target.num_tokens, dim}, options);
        if (!result.ok() || result->hits.empty() || result->hits[0].id != target.id) {
          failed = true;
        }
      }
    });
  }
  writer.join();
  for (std::thread& reader : readers) reader.join();
  EXPECT_FALSE(failed);
  EXPECT_EQ((*collection)->Stats().documents, 300 - 9);
}

TEST(Engine, DropWhileSearchingAndRecreate) {
  TempDir dir;
  auto engine = Engine::Open(dir.path());
  const int64_t dim = 16;
  auto collection = (*engine)->CreateCollection(Schema("dropme", dim));
  ASSERT_TRUE(collection.ok());
  Corpus corpus(dim, 12);
  std::vector<Document> documents;
  for (int d = 0; d < 100; ++d) documents.push_back(corpus.Make(absl::StrCat("d", d), 10));
  ExpectAllOk((*collection)->Upsert(documents));
  std::shared_ptr<Collection> held = std::move(*collection);
  ASSERT_TRUE((*engine)->DropCollection("dropme").ok());
  // The holder can still search; the name is free again.
  const std::vector<float> query = corpus.QueryFrom(documents[0], 4);
  auto result = held->Search(FloatMatrixView{query.data(), 4, dim}, SearchOptions{});
  ASSERT_TRUE(result.ok());
  EXPECT_FALSE(result->hits.empty());
  auto again = (*engine)->CreateCollection(Schema("dropme", dim));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->Stats().documents, 0);
  held.reset();
  EXPECT_TRUE(fs::is_empty(fs::path(dir.path()) / "trash"));
}

}  // namespace
}  // namespace tessera
