// Tests of the ingest input side: the JSONL sidecar, pairing it with the .npz arrays, content
// hashes, and the upsert form of a document. (The streams are covered end to end by
// tests/e2e/cli_e2e_test.py against the real server.)
#include "client/cli/ingest.h"

#include <cstring>
#include <string>
#include <vector>

#include "client/cli/ingest_journal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::client {
namespace {

using ::testing::HasSubstr;

const std::map<std::string, v1::AttributeType> kTypes = {{"year", v1::ATTRIBUTE_TYPE_INT64},
                                                         {"weight", v1::ATTRIBUTE_TYPE_DOUBLE},
                                                         {"lang", v1::ATTRIBUTE_TYPE_STRING}};

TEST(ParseMetaJsonl, ReadsIdsAttributesAndLayouts) {
  const std::string text =
      R"({"id": "a", "attributes": {"year": 2021, "weight": 2, "lang": "en", "x": 0.5}})"
      "\n\n"
      R"({"id": 17, "layout": {"rows": 2, "cols": 3, "prefix": 1, "suffix": 0}, "text": "ignored"})"
      "\n"
      R"({"id": "c", "attributes": null, "layout": {"rows": 1, "cols": 1, "prefix_tokens": 2, "suffix_tokens": 3}})"
      "\n";
  auto meta = ParseMetaJsonl(text, "meta.jsonl", kTypes);
  ASSERT_TRUE(meta.ok()) << meta.status();
  ASSERT_EQ(meta->size(), 3u);
  const DocumentMeta& a = meta->at("a");
  EXPECT_EQ(a.attributes.at("year"), AttributeValue(int64_t{2021}));
  EXPECT_EQ(a.attributes.at("weight"), AttributeValue(2.0));  // the schema says double
  EXPECT_EQ(a.attributes.at("lang"), AttributeValue(std::string("en")));
  EXPECT_EQ(a.attributes.at("x"), AttributeValue(0.5));
  EXPECT_FALSE(a.layout.has_value());
  const DocumentMeta& b = meta->at("17");
  ASSERT_TRUE(b.layout.has_value());
  EXPECT_EQ(*b.layout, (PatchLayout{2, 3, 1, 0}));
  EXPECT_TRUE(b.attributes.empty());
  EXPECT_EQ(*meta->at("c").layout, (PatchLayout{1, 1, 2, 3}));
}

TEST(ParseMetaJsonl, ReadsSparseVectors) {
  auto meta = ParseMetaJsonl(R"({"id": "a", "sparse": {"indices": [9, 2], "values": [1, 2.5]}})",
                             "meta.jsonl", kTypes);
  ASSERT_TRUE(meta.ok()) << meta.status();
  ASSERT_TRUE(meta->at("a").sparse.has_value());
  EXPECT_EQ(meta->at("a").sparse->indices, (std::vector<uint32_t>{9, 2}));
  EXPECT_EQ(meta->at("a").sparse->values, (std::vector<float>{1.0f, 2.5f}));
  for (const char* bad : {R"({"id": "a", "sparse": [1, 2]})",
                          R"({"id": "a", "sparse": {"indices": [-1], "values": [1]}})",
                          R"({"id": "a", "sparse": {"indices": [1], "values": ["x"]}})"}) {
    EXPECT_THAT(ParseMetaJsonl(bad, "meta.jsonl", kTypes).status().message(),
                HasSubstr("meta.jsonl:1: \"sparse\""))
        << bad;
  }
}

TEST(ParseMetaJsonl, ErrorsNameTheLine) {
  struct Case {
    std::string text;
    std::string expected;
  } cases[] = {
      {"{\"id\": \"a\"}\n{\"id\": }", "meta.jsonl:2:"},
      {"[1]", "expected a JSON object"},
      {"{\"attributes\": {}}", "\"id\""},
      {"{\"id\": true}", "\"id\""},
      {"{\"id\": \"a\", \"attributes\": {\"flag\": true}}", "attribute 'flag'"},
      {"{\"id\": \"a\", \"attributes\": {\"list\": [1]}}", "attribute 'list'"},
      {"{\"id\": \"a\", \"attributes\": [1]}", "\"attributes\" must be an object"},
      {"{\"id\": \"a\", \"layout\": {\"rows\": 2}}", "\"cols\""},
      {"{\"id\": \"a\", \"layout\": {\"rows\": -1, \"cols\": 2}}", "non-negative"},
      {"{\"id\": \"a\", \"layout\": {\"rows\": 1.5, \"cols\": 2}}", "non-negative"},
      {"{\"id\": \"a\", \"layout\": 3}", "must be an object"},
      {"{\"id\": \"a\"}\n{\"id\": \"a\"}", "meta.jsonl:2: id 'a' appears twice"},
  };
  for (const Case& c : cases) {
    absl::Status status = ParseMetaJsonl(c.text, "meta.jsonl", kTypes).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(status.message(), HasSubstr(c.expected)) << c.text;
  }
}

NpyArray Matrix(int64_t rows, int64_t cols, float start) {
  std::vector<float> values(rows * cols);
  for (size_t i = 0; i < values.size(); ++i) values[i] = start + i;
  return NpyArray::FromFloat32(rows, cols, values.data());
}

TEST(PrepareIngestInput, PairsArraysWithMetaAndSkipsPoolLabels) {
  NpzEntries entries;
  entries.emplace_back("a", Matrix(2, 4, 0));
  entries.emplace_back("a.labels", NpyArray::FromInt32(std::vector<int32_t>{0, 1}));
  entries.emplace_back("b", Matrix(3, 4, 1));
  entries.emplace_back("vector", NpyArray::FromFloat32(std::vector<float>{1, 2, 3}));
  entries.emplace_back("ints", NpyArray::FromInt64(std::vector<int64_t>{1, 2}));
  std::map<std::string, DocumentMeta> meta;
  meta["b"].attributes = {{"year", int64_t{1999}}};
  meta["b"].layout = PatchLayout{1, 3, 0, 0};
  meta["nobody"] = DocumentMeta{};

  IngestInput input = PrepareIngestInput(std::move(entries), std::move(meta));
  ASSERT_EQ(input.items.size(), 2u);
  EXPECT_EQ(input.items[0].id, "a");
  EXPECT_TRUE(input.items[0].attributes.empty());
  EXPECT_EQ(input.items[1].id, "b");
  EXPECT_EQ(input.items[1].attributes.at("year"), AttributeValue(int64_t{1999}));
  EXPECT_EQ(*input.items[1].layout, (PatchLayout{1, 3, 0, 0}));
  EXPECT_EQ(input.label_arrays, 1u);
  EXPECT_EQ(input.unmatched_meta, 1u);
  ASSERT_EQ(input.invalid.size(), 2u);
  EXPECT_EQ(input.invalid[0].first, "vector");
  EXPECT_THAT(input.invalid[0].second.message(), HasSubstr("expected 2"));
  EXPECT_EQ(input.invalid[1].first, "ints");
  EXPECT_THAT(input.invalid[1].second.message(), HasSubstr("int64"));

  const IngestItem& b = input.items[1];
  EXPECT_EQ(
      b.content_hash,
      DocumentContentHash("float32", b.tokens.shape,
                          absl::string_view(reinterpret_cast<const char*>(b.tokens.data.data()),
                                            b.tokens.data.size()),
                          b.layout, b.attributes));
  EXPECT_NE(input.items[0].content_hash, input.items[1].content_hash);
}

TEST(PrepareIngestInput, HashChangesWithAttributesOnly) {
  auto hash_with = [](Attributes attributes) {
    NpzEntries entries;
    entries.emplace_back("a", Matrix(2, 4, 0));
    std::map<std::string, DocumentMeta> meta;
    meta["a"].attributes = std::move(attributes);
    return PrepareIngestInput(std::move(entries), std::move(meta)).items[0].content_hash;
  };
  EXPECT_EQ(hash_with({{"year", int64_t{1}}}), hash_with({{"year", int64_t{1}}}));
  EXPECT_NE(hash_with({{"year", int64_t{1}}}), hash_with({{"year", int64_t{2}}}));
}

TEST(ToDocumentInput, SendsFloat32AndFloat16BytesAsTheyAre) {
  IngestItem item;
  item.id = "a";
  item.tokens = Matrix(2, 3, 0.5f);
  item.layout = PatchLayout{1, 2, 0, 0};
  item.attributes = {{"lang", std::string("en")}};
  auto document = ToDocumentInput(item);
  ASSERT_TRUE(document.ok()) << document.status();
  EXPECT_EQ(document->id, "a");
  EXPECT_EQ(document->tokens.dtype, v1::DTYPE_FLOAT32);
  EXPECT_EQ(document->tokens.rows, 2u);
  EXPECT_EQ(document->tokens.cols, 3u);
  EXPECT_EQ(document->tokens.data.size(), 24u);
  EXPECT_EQ(std::memcmp(document->tokens.data.data(), item.tokens.data.data(), 24), 0);
  EXPECT_EQ(*document->layout, (PatchLayout{1, 2, 0, 0}));
  EXPECT_EQ(document->attributes, item.attributes);

  const std::vector<Float16> halves = {FloatToHalf(1.0f), FloatToHalf(-2.0f)};
  item.tokens = NpyArray::FromFloat16(1, 2, halves.data());
  document = ToDocumentInput(item);
  ASSERT_TRUE(document.ok());
  EXPECT_EQ(document->tokens.dtype, v1::DTYPE_FLOAT16);
  auto values = document->tokens.ToFloat32();
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(*values, (std::vector<float>{1.0f, -2.0f}));

  const double doubles[] = {0.25, -4.0};
  item.tokens = NpyArray::FromBytes(NpyDtype::kFloat64, {1, 2}, doubles);
  document = ToDocumentInput(item);
  ASSERT_TRUE(document.ok());
  EXPECT_EQ(document->tokens.dtype, v1::DTYPE_FLOAT32);
  values = document->tokens.ToFloat32();
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(*values, (std::vector<float>{0.25f, -4.0f}));
}

TEST(IngestSummary, JsonListsFailures) {
  IngestSummary summary;
  summary.documents = 3;
  summary.stored = 1;
  summary.skipped = 1;
  summary.failures.emplace_back("bad", absl::InvalidArgumentError("dim 3, expected 4"));
  summary.seconds = 0.5;
  summary.journal_path = "x.npz.tessera-ingest";
  EXPECT_FALSE(summary.ok());
  EXPECT_EQ(DumpJson(summary.ToJson()),
            R"({"documents":3,"stored":1,"skipped":1,"failed":1,"unacknowledged":0,)"
            R"("seconds":0.5,"docs_per_second":2.0,"journal":"x.npz.tessera-ingest",)"
            R"("failures":[{"id":"bad","code":"INVALID_ARGUMENT","message":"dim 3, expected 4"}],)"
            R"("error":null})");
}

}  // namespace
}  // namespace tessera::client
