// The query surface beyond plain search, against independent references: nested filters
// (any_of / none_of, exists / missing, prefix) through Count, Scroll, filtered search and
// DeleteMatching against a brute-force evaluator over the documents as written; grouped results
// against a brute-force grouping of exhaustive exact MaxSim; attributes in hits against Get.
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

CollectionSchema QuerySchema(const std::string& name, int shards) {
  CollectionSchema schema;
  schema.name = name;
  schema.dim = kDim;
  schema.num_shards = shards;
  schema.attributes = {{"group", AttributeType::kInt64},
                       {"lang", AttributeType::kString},
                       {"score", AttributeType::kDouble}};
  return schema;
}

const std::vector<std::string> kLangs = {"en", "de", "fr", "en-GB", "en-US", "e", ""};

// Each field missing one time in ten.
Attributes RandomAttributes(std::mt19937& rng) {
  Attributes attributes;
  if (rng() % 10 != 0) attributes["group"] = static_cast<int64_t>(rng() % 6);
  if (rng() % 10 != 0) attributes["lang"] = kLangs[rng() % kLangs.size()];
  if (rng() % 10 != 0) attributes["score"] = static_cast<double>(rng() % 100) / 100.0;
  return attributes;
}

FilterCondition RandomCondition(std::mt19937& rng) {
  using Op = FilterCondition::Op;
  FilterCondition condition;
  const int field = static_cast<int>(rng() % 3);
  condition.field = field == 0 ? "group" : field == 1 ? "lang" : "score";
  auto value = [&]() -> AttributeValue {
    if (field == 0) return static_cast<int64_t>(rng() % 7) - 1;
    if (field == 1) return kLangs[rng() % kLangs.size()];
    // Numbers compare with numbers: an int64 bound on the double field too.
    if (rng() % 3 == 0) return static_cast<int64_t>(rng() % 2);
    return static_cast<double>(rng() % 110) / 100.0;
  };
  const std::vector<Op> ops = {Op::kEq, Op::kNe, Op::kLt,     Op::kLe,     Op::kGt,
                               Op::kGe, Op::kIn, Op::kExists, Op::kMissing};
  condition.op = (field == 1 && rng() % 3 == 0) ? Op::kPrefix : ops[rng() % ops.size()];
  if (condition.op == Op::kIn) {
    const int n = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < n; ++i) condition.values.push_back(value());
  } else if (condition.op != Op::kExists && condition.op != Op::kMissing) {
    condition.values.push_back(value());
  }
  return condition;
}

Filter RandomFilter(std::mt19937& rng, int depth) {
  Filter filter;
  const int conditions = static_cast<int>(rng() % 3);
  for (int i = 0; i < conditions; ++i) filter.all_of.push_back(RandomCondition(rng));
  if (depth < 4) {
    const int any = static_cast<int>(rng() % 3);
    for (int i = 0; i < any; ++i) filter.any_of.push_back(RandomFilter(rng, depth + 1));
    const int none = static_cast<int>(rng() % 2);
    for (int i = 0; i < none; ++i) filter.none_of.push_back(RandomFilter(rng, depth + 1));
  }
  return filter;
}

// The reference: the definition in tessera/document.h, spelled out independently of
// FilterMatches (numbers compared as doubles: every value here is exact in a double).
bool ReferenceCondition(const FilterCondition& c, const Attributes& attributes) {
  using Op = FilterCondition::Op;
  const auto it = attributes.find(c.field);
  if (c.op == Op::kMissing) return it == attributes.end();
  if (it == attributes.end()) return false;
  if (c.op == Op::kExists) return true;
  const AttributeValue& v = it->second;
  auto compare = [&](const AttributeValue& bound) -> int {  // sign of v − bound
    if (std::holds_alternative<std::string>(v)) {
      const std::string& a = std::get<std::string>(v);
      const std::string& b = std::get<std::string>(bound);
      return a < b ? -1 : a == b ? 0 : 1;
    }
    auto number = [](const AttributeValue& x) {
      return std::holds_alternative<int64_t>(x) ? static_cast<double>(std::get<int64_t>(x))
                                                : std::get<double>(x);
    };
    const double a = number(v), b = number(bound);
    return a < b ? -1 : a == b ? 0 : 1;
  };
  switch (c.op) {
    case Op::kEq:
      return compare(c.values[0]) == 0;
    case Op::kNe:
      return compare(c.values[0]) != 0;
    case Op::kLt:
      return compare(c.values[0]) < 0;
    case Op::kLe:
      return compare(c.values[0]) <= 0;
    case Op::kGt:
      return compare(c.values[0]) > 0;
    case Op::kGe:
      return compare(c.values[0]) >= 0;
    case Op::kIn:
      for (const AttributeValue& bound : c.values) {
        if (compare(bound) == 0) return true;
      }
      return false;
    case Op::kPrefix: {
      const std::string& a = std::get<std::string>(v);
      const std::string& p = std::get<std::string>(c.values[0]);
      return a.size() >= p.size() && a.compare(0, p.size(), p) == 0;
    }
    default:
      return false;
  }
}

bool Reference(const Filter& filter, const Attributes& attributes) {
  bool all = true;
  for (const FilterCondition& c : filter.all_of) all = all && ReferenceCondition(c, attributes);
  bool any = filter.any_of.empty();
  for (const Filter& f : filter.any_of) any = any || Reference(f, attributes);
  bool none = true;
  for (const Filter& f : filter.none_of) none = none && !Reference(f, attributes);
  return all && any && none;
}

struct Fixture {
  TempDir dir;
  std::unique_ptr<Engine> engine;
  std::shared_ptr<Collection> collection;
  std::map<std::string, Attributes> written;  // id → attributes, ids ascending
  std::vector<Document> documents;
};

void Fill(Fixture* f, const std::string& name, int shards, int n, uint32_t seed) {
  auto engine = Engine::Open(f->dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  f->engine = std::move(*engine);
  auto collection = f->engine->CreateCollection(QuerySchema(name, shards));
  ASSERT_TRUE(collection.ok()) << collection.status();
  f->collection = *collection;
  Corpus corpus(kDim, seed, 16);
  std::mt19937 rng(seed);
  for (int d = 0; d < n; ++d) {
    Document document = corpus.Make(absl::StrCat("doc-", d), 1 + static_cast<int64_t>(rng() % 12));
    document.attributes = RandomAttributes(rng);
    f->written[document.id] = document.attributes;
    f->documents.push_back(std::move(document));
  }
  ExpectAllOk(f->collection->Upsert(f->documents));
}

// Every id a scroll through `filter` returns, page by page (and the pages' sizes are checked).
std::vector<std::string> ScrollAll(const Collection& collection, const Filter& filter,
                                   int64_t limit) {
  std::vector<std::string> ids;
  ScrollOptions options;
  options.filter = filter;
  options.limit = limit;
  for (int page = 0; page < 10000; ++page) {
    auto result = collection.Scroll(options);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) break;
    for (const ScrolledDocument& d : result->documents) ids.push_back(d.id);
    if (result->next_after.empty()) break;
    EXPECT_EQ(static_cast<int64_t>(result->documents.size()), limit);
    options.after = result->next_after;
  }
  return ids;
}

// Property: 300 random filters (nested up to 4 deep; every op) select the same documents through
// Count, Scroll and an exhaustive filtered search as the reference evaluator does.
TEST(CollectionQuery, RandomFiltersEqualBruteForce) {
  Fixture f;
  Fill(&f, "filters", 3, 400, 7);
  std::mt19937 rng(99);
  const std::vector<float> probe = Normalized(std::vector<float>(kDim, 1.0f), kDim);
  int nonempty = 0, partial = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const Filter filter = RandomFilter(rng, 1);
    std::vector<std::string> expected;
    for (const auto& [id, attributes] : f.written) {
      if (Reference(filter, attributes)) expected.push_back(id);
    }
    nonempty += expected.empty() ? 0 : 1;
    partial += !expected.empty() && expected.size() < f.written.size() ? 1 : 0;
    auto count = f.collection->Count(filter);
    ASSERT_TRUE(count.ok()) << count.status();
    ASSERT_EQ(*count, static_cast<int64_t>(expected.size())) << "trial " << trial;
    ASSERT_EQ(ScrollAll(*f.collection, filter, 1 + trial % 50), expected) << "trial " << trial;
    SearchOptions options;
    options.k = 1000;
    options.exhaustive = trial % 2 == 0;  // and the cascade's fallback for selective filters
    options.filter = filter;
    auto result = f.collection->Search(FloatMatrixView{probe.data(), 1, kDim}, options);
    ASSERT_TRUE(result.ok()) << result.status();
    std::vector<std::string> found;
    for (const SearchHit& hit : result->hits) found.push_back(hit.id);
    std::sort(found.begin(), found.end());
    if (options.exhaustive) {
      ASSERT_EQ(found, expected) << "trial " << trial;
    } else {
      for (const std::string& id : found) {
        ASSERT_TRUE(std::binary_search(expected.begin(), expected.end(), id)) << id;
      }
    }
  }
  // The generator reaches both kinds of answer.
  EXPECT_GT(partial, 100);
}

// Property: DeleteMatching deletes exactly what the reference selects, durably (after reopen).
TEST(CollectionQuery, DeleteMatchingDeletesExactlyTheMatches) {
  Fixture f;
  Fill(&f, "deletes", 2, 300, 8);
  std::mt19937 rng(5);
  int64_t total_deleted = 0;
  for (int round = 0; round < 6; ++round) {
    Filter filter;
    do {
      filter = RandomFilter(rng, 2);
    } while (filter.empty());
    int64_t expected = 0;
    for (auto it = f.written.begin(); it != f.written.end();) {
      if (Reference(filter, it->second)) {
        ++expected;
        it = f.written.erase(it);
      } else {
        ++it;
      }
    }
    auto deleted = f.collection->DeleteMatching(filter);
    ASSERT_TRUE(deleted.ok()) << deleted.status();
    EXPECT_EQ(*deleted, expected);
    total_deleted += *deleted;
  }
  EXPECT_GT(total_deleted, 0);
  f.collection.reset();
  f.engine.reset();
  auto engine = Engine::Open(f.dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto collection = (*engine)->GetCollection("deletes");
  ASSERT_TRUE(collection.ok());
  std::vector<std::string> expected;
  for (const auto& [id, unused] : f.written) expected.push_back(id);
  EXPECT_EQ(ScrollAll(**collection, Filter{}, 64), expected);
}

// Grouped results equal a brute-force grouping of brute-force exact MaxSim (over what Get
// returns), for exhaustive searches and a cascade whose N covers the collection; and the parts of
// a collection split by ShardOf merge (MergeGroups) into the whole collection's groups.
TEST(CollectionQuery, GroupsEqualBruteForceGrouping) {
  Fixture f;
  Fill(&f, "groups", 3, 240, 9);
  std::vector<std::string> ids;
  for (const auto& [id, unused] : f.written) ids.push_back(id);
  Corpus corpus(kDim, 31, 16);
  for (int q = 0; q < 6; ++q) {
    const std::vector<float> query = corpus.QueryFrom(f.documents[q * 11], 3 + q);
    const auto exact = BruteForce(*f.collection, ids, query, kDim);
    for (const std::string field : {"group", "lang"}) {
      const int64_t group_size = 1 + q % 3, groups = 2 + q % 4;
      // The reference: members by group value in exact order; groups by their best member.
      std::map<AttributeValue, std::vector<std::pair<std::string, double>>> members;
      for (const auto& [id, score] : exact) {
        const Attributes& attributes = f.written.at(id);
        const auto value = attributes.find(field);
        if (value == attributes.end()) continue;
        auto& list = members[value->second];
        if (static_cast<int64_t>(list.size()) < group_size) list.emplace_back(id, score);
      }
      std::vector<std::pair<AttributeValue, std::vector<std::pair<std::string, double>>>> ranked(
          members.begin(), members.end());
      std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
        const auto& x = a.second[0];
        const auto& y = b.second[0];
        return x.second != y.second ? x.second > y.second : x.first < y.first;
      });
      if (static_cast<int64_t>(ranked.size()) > groups) ranked.resize(groups);
      for (bool exhaustive : {true, false}) {
        SearchOptions options;
        options.group_by = field;
        options.group_size = group_size;
        options.groups = groups;
        options.exhaustive = exhaustive;
        options.num_candidates = exhaustive ? 0 : 1000;
        auto result = f.collection->Search(FloatMatrixView{query.data(), 3 + q, kDim}, options);
        ASSERT_TRUE(result.ok()) << result.status();
        EXPECT_TRUE(result->hits.empty());
        ASSERT_EQ(result->groups.size(), ranked.size()) << field;
        for (size_t g = 0; g < ranked.size(); ++g) {
          EXPECT_EQ(result->groups[g].value, ranked[g].first) << field << " group " << g;
          ASSERT_EQ(result->groups[g].hits.size(), ranked[g].second.size());
          for (size_t h = 0; h < ranked[g].second.size(); ++h) {
            EXPECT_EQ(result->groups[g].hits[h].id, ranked[g].second[h].first);
            EXPECT_NEAR(result->groups[g].hits[h].score, ranked[g].second[h].second, 1e-4);
          }
        }
      }
    }
  }
}

// A collection split over three one-shard collections by ShardOf (as a router's shard nodes hold
// it): each part searched with whole_shards = 3 returns all its groups, and MergeGroups gives the
// whole collection's answer, cascade included.
TEST(CollectionQuery, PartsMergeIntoTheWholeCollectionsGroups) {
  Fixture f;
  Fill(&f, "whole", 3, 300, 10);
  std::vector<std::shared_ptr<Collection>> parts;
  for (int s = 0; s < 3; ++s) {
    auto part = f.engine->CreateCollection(QuerySchema(absl::StrCat("part", s), 1));
    ASSERT_TRUE(part.ok()) << part.status();
    parts.push_back(*part);
  }
  for (const Document& document : f.documents) {
    ExpectAllOk(parts[ShardOf(document.id, 3)]->Upsert({document}));
  }
  Corpus corpus(kDim, 32, 16);
  for (int q = 0; q < 4; ++q) {
    const std::vector<float> query = corpus.QueryFrom(f.documents[q * 13], 4);
    SearchOptions options;
    options.group_by = q % 2 ? "lang" : "group";
    options.group_size = 2;
    options.groups = 3;
    options.with_attributes = true;
    options.num_candidates = q < 2 ? 0 : 40;  // the cascade, and its default
    const FloatMatrixView view{query.data(), 4, kDim};
    auto whole = f.collection->Search(view, options);
    ASSERT_TRUE(whole.ok()) << whole.status();
    std::vector<SearchResult> answers;
    SearchOptions part_options = options;
    part_options.whole_shards = 3;
    for (const auto& part : parts) {
      auto answer = part->Search(view, part_options);
      ASSERT_TRUE(answer.ok()) << answer.status();
      answers.push_back(*std::move(answer));
    }
    const SearchResult merged = MergeGroups(std::move(answers), 3, 2);
    ASSERT_EQ(merged.groups.size(), whole->groups.size());
    for (size_t g = 0; g < merged.groups.size(); ++g) {
      EXPECT_EQ(merged.groups[g].value, whole->groups[g].value);
      ASSERT_EQ(merged.groups[g].hits.size(), whole->groups[g].hits.size());
      for (size_t h = 0; h < merged.groups[g].hits.size(); ++h) {
        EXPECT_EQ(merged.groups[g].hits[h].id, whole->groups[g].hits[h].id);
        EXPECT_EQ(merged.groups[g].hits[h].score, whole->groups[g].hits[h].score);
        EXPECT_EQ(merged.groups[g].hits[h].attributes, whole->groups[g].hits[h].attributes);
      }
    }
  }
}

// with_attributes: each hit carries what Get returns for it (all fields, or the named ones).
TEST(CollectionQuery, HitAttributesEqualGet) {
  Fixture f;
  Fill(&f, "attributes", 2, 120, 11);
  Corpus corpus(kDim, 33, 16);
  const std::vector<float> query = corpus.QueryFrom(f.documents[5], 4);
  for (const std::vector<std::string>& fields :
       std::vector<std::vector<std::string>>{{}, {"lang"}, {"group", "score"}}) {
    SearchOptions options;
    options.k = 50;
    options.with_attributes = true;
    options.attribute_fields = fields;
    auto result = f.collection->Search(FloatMatrixView{query.data(), 4, kDim}, options);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->hits.size(), 50u);
    for (const SearchHit& hit : result->hits) {
      auto stored = f.collection->Get(hit.id);
      ASSERT_TRUE(stored.ok());
      Attributes expected = stored->attributes;
      if (!fields.empty()) {
        for (auto it = expected.begin(); it != expected.end();) {
          it = std::count(fields.begin(), fields.end(), it->first) ? std::next(it)
                                                                   : expected.erase(it);
        }
      }
      EXPECT_EQ(hit.attributes, expected) << hit.id;
    }
    // Without the option, no attributes.
    options.with_attributes = false;
    result = f.collection->Search(FloatMatrixView{query.data(), 4, kDim}, options);
    ASSERT_TRUE(result.ok());
    for (const SearchHit& hit : result->hits) EXPECT_TRUE(hit.attributes.empty());
  }
}

TEST(CollectionQuery, BadInputNamesFieldValueAndExpectation) {
  Fixture f;
  Fill(&f, "bad", 1, 10, 12);
  const std::vector<float> probe = Normalized(std::vector<float>(kDim, 1.0f), kDim);
  const FloatMatrixView view{probe.data(), 1, kDim};
  auto search_error = [&](const SearchOptions& options) {
    auto result = f.collection->Search(view, options);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(result.status().message());
  };
  SearchOptions options;
  options.group_by = "colour";
  EXPECT_EQ(search_error(options),
            "group_by: unknown field 'colour', expected one of the collection's attribute fields");
  options.group_by = "group";
  options.group_size = 0;
  EXPECT_EQ(search_error(options), "group_size 0, expected 1 … 100");
  options.group_size = 1;
  options.groups = 1001;
  EXPECT_EQ(search_error(options), "groups 1001, expected 1 … 1000 or 0 (k)");
  options = SearchOptions{};
  options.with_attributes = true;
  options.attribute_fields = {"lang", "colour"};
  EXPECT_EQ(search_error(options),
            "attribute_fields[1]: unknown field 'colour', expected one of the collection's "
            "attribute fields");
  // Nested 9 deep.
  Filter deep;
  deep.all_of.push_back({"group", FilterCondition::Op::kExists, {}});
  for (int d = 0; d < 8; ++d) {
    Filter outer;
    outer.any_of.push_back(deep);
    deep = outer;
  }
  options = SearchOptions{};
  options.filter = deep;
  EXPECT_THAT(
      search_error(options),
      HasSubstr(": nested 9 deep, expected at most 8 (any_of / none_of inside each other)"));
  EXPECT_EQ(f.collection->Count(deep).status().code(), absl::StatusCode::kInvalidArgument);
  options.filter = Filter{};
  options.filter.none_of.resize(1);
  options.filter.none_of[0].all_of.push_back({"group", FilterCondition::Op::kPrefix, {"1"}});
  EXPECT_EQ(
      search_error(options),
      "filter none_of[0] condition 0 on 'group': prefix on the int64 field, expected a string "
      "field");
  options.filter.none_of[0].all_of[0] = {"lang", FilterCondition::Op::kExists, {"en"}};
  EXPECT_EQ(search_error(options),
            "filter none_of[0] condition 0 on 'lang': 1 values, expected none (exists / missing)");
  auto deleted = f.collection->DeleteMatching(Filter{});
  EXPECT_EQ(deleted.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(deleted.status().message(), HasSubstr("filter: empty"));
  ScrollOptions scroll;
  scroll.limit = 0;
  EXPECT_EQ(f.collection->Scroll(scroll).status().message(), "limit 0, expected 1 … 10000");
  auto count = f.collection->Count(Filter{});
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 10);
}

}  // namespace
}  // namespace tessera
