// Tests of the command line without a server: flag parsing, usage errors and their exit code,
// the schema that `collections create` builds, --filter expressions, the --json formats, and
// progress lines.
#include "client/cli/commands.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/args.h"
#include "client/cli/progress.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::client {
namespace {

using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr FlagSpec kSpecs[] = {{"k", true}, {"json", false}, {"filter", true}, {"help", false}};

TEST(ParseArgs, MixesFlagsAndPositionals) {
  const std::vector<std::string> args = {"search", "papers",      "--k",  "5",
                                         "--json", "--filter",    "a==1", "--filter=b<2",
                                         "--",     "--not-a-flag"};
  auto parsed = ParseArgs(args, kSpecs);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->positionals, ElementsAre("search", "papers", "--not-a-flag"));
  EXPECT_EQ(parsed->Get("k"), "5");
  EXPECT_TRUE(parsed->Has("json"));
  EXPECT_THAT(parsed->GetAll("filter"), ElementsAre("a==1", "b<2"));
  EXPECT_FALSE(parsed->Get("missing").has_value());
  // A single dash is a positional (a negative number, an id), except -h.
  parsed = ParseArgs(std::vector<std::string>{"-5", "-h"}, kSpecs);
  ASSERT_TRUE(parsed.ok());
  EXPECT_THAT(parsed->positionals, ElementsAre("-5"));
  EXPECT_TRUE(parsed->Has("help"));
}

TEST(ParseArgs, RejectsUnknownAndMalformedFlags) {
  EXPECT_THAT(ParseArgs(std::vector<std::string>{"--nope"}, kSpecs).status().message(),
              HasSubstr("unknown flag --nope"));
  EXPECT_THAT(ParseArgs(std::vector<std::string>{"--k"}, kSpecs).status().message(),
              HasSubstr("needs a value"));
  EXPECT_THAT(ParseArgs(std::vector<std::string>{"--json=yes"}, kSpecs).status().message(),
              HasSubstr("takes no value"));
}

TEST(FlagValues, ParseNumbersAndDurations) {
  EXPECT_EQ(*ParseUint32Flag("k", "10"), 10u);
  EXPECT_FALSE(ParseUint32Flag("k", "0", 1).ok());
  EXPECT_FALSE(ParseUint32Flag("k", "-1").ok());
  EXPECT_FALSE(ParseUint32Flag("k", "ten").ok());
  EXPECT_EQ(*ParseDoubleFlag("max-rate", "2.5"), 2.5);
  EXPECT_FALSE(ParseDoubleFlag("max-rate", "-1").ok());
  EXPECT_EQ(*ParseTimeoutFlag("timeout", "30s"), absl::Seconds(30));
  EXPECT_EQ(*ParseTimeoutFlag("timeout", "500ms"), absl::Milliseconds(500));
  EXPECT_EQ(*ParseTimeoutFlag("timeout", "1.5"), absl::Milliseconds(1500));
  EXPECT_EQ(*ParseTimeoutFlag("timeout", "2m"), absl::Minutes(2));
  EXPECT_EQ(*ParseTimeoutFlag("timeout", "0"), absl::InfiniteDuration());
  EXPECT_EQ(*ParseTimeoutFlag("timeout", "none"), absl::InfiniteDuration());
  EXPECT_THAT(ParseTimeoutFlag("timeout", "soon").status().message(), HasSubstr("--timeout"));
}

int RunCli(const std::vector<std::string>& args, std::string* out = nullptr,
           std::string* err = nullptr) {
  std::ostringstream out_stream;
  std::ostringstream err_stream;
  const int code = RunTesseraCli(args, out_stream, err_stream);
  if (out != nullptr) *out = out_stream.str();
  if (err != nullptr) *err = err_stream.str();
  return code;
}

// `tessera --version`: the project's version from CMake (and the git revision), exit 0, no
// server needed. Before it existed, --version was an unknown flag (exit 2).
TEST(RunTesseraCli, VersionPrintsTheProjectVersion) {
  std::string out;
  std::string err;
  EXPECT_EQ(RunCli({"--version"}, &out, &err), kExitOk) << err;
  EXPECT_THAT(out, StartsWith(std::string("tessera ") + TESSERA_PROJECT_VERSION));
  EXPECT_THAT(out, EndsWith("\n"));
  EXPECT_EQ(err, "");
}

TEST(RunTesseraCli, CommandHelpShowsThatCommandOnly) {
  std::string out;
  EXPECT_EQ(RunCli({"search", "--help"}, &out), kExitOk);
  EXPECT_THAT(out, HasSubstr("  search NAME --query Q.npy"));
  EXPECT_THAT(out, HasSubstr("EXPR: FIELD==V"));  // its continuation lines
  EXPECT_THAT(out, Not(HasSubstr("collections create")));
  EXPECT_THAT(out, Not(HasSubstr("Global flags:")));
  out.clear();
  EXPECT_EQ(RunCli({"collections", "create", "--help"}, &out), kExitOk);
  EXPECT_THAT(out, HasSubstr("collections create NAME --dim D"));
  EXPECT_THAT(out, HasSubstr("MODE: ward (default)"));
  EXPECT_THAT(out, Not(HasSubstr("collections list")));
  out.clear();
  EXPECT_EQ(RunCli({"delete", "-h"}, &out), kExitOk);  // both forms
  EXPECT_THAT(out, HasSubstr("delete NAME ID..."));
  EXPECT_THAT(out, HasSubstr("delete NAME (--filter EXPR"));
  EXPECT_THAT(out, HasSubstr("every document matching"));
  EXPECT_THAT(out, Not(HasSubstr("count NAME")));
  out.clear();
  EXPECT_EQ(RunCli({"frobnicate", "--help"}, &out), kExitOk);  // unknown: everything
  EXPECT_EQ(out, TesseraUsage());
  // Every command's help names it.
  for (const char* command : {"collections list", "collections get", "collections drop", "ingest",
                              "get", "count", "scroll", "stats", "flush"}) {
    std::vector<std::string> words = absl::StrSplit(command, ' ');
    EXPECT_THAT(CommandUsage(words), HasSubstr(absl::StrCat("  ", command))) << command;
    EXPECT_NE(CommandUsage(words), TesseraUsage()) << command;
  }
}

TEST(RunTesseraCli, UsageErrorsExitWithTwoBeforeConnecting) {
  std::string out;
  std::string err;
  EXPECT_EQ(RunCli({"--help"}, &out), kExitOk);
  EXPECT_THAT(out, HasSubstr("collections create NAME --dim D"));
  const std::vector<std::vector<std::string>> bad = {
      {},
      {"frobnicate"},
      {"collections"},
      {"collections", "rename", "a"},
      {"stats"},
      {"stats", "a", "b"},
      {"get", "a"},
      {"delete", "a"},
      {"stats", "a", "--k", "3"},
      {"search", "a"},
      {"search", "a", "--query", "q.npy", "--k", "0"},
      {"collections", "create", "a"},
      {"collections", "create", "a", "--dim", "8", "--pooling", "diagonal"},
      {"ingest", "a", "f.npz", "--streams", "0"},
      {"--timeout", "soon", "stats", "a"},
      {"--bogus", "stats", "a"},
      {"search", "a", "--sparse-query", "3:x"},
      {"search", "a", "--sparse-query", "3"},
      {"search", "a", "--query", "q.npy", "--fusion", "rrf"},
      {"search", "a", "--sparse-query", "3:1", "--fusion", "max"},
      {"collections", "create", "a", "--dim", "8", "--sparse-b", "0.5"},
  };
  for (const auto& args : bad) {
    EXPECT_EQ(RunCli(args, &out, &err), kExitUsage) << ::testing::PrintToString(args);
    EXPECT_THAT(err, HasSubstr("tessera: ")) << ::testing::PrintToString(args);
  }
}

TEST(RunTesseraCli, ServerErrorsExitWithOneAndTheCode) {
  std::string err;
  // Nothing listens on port 1.
  EXPECT_EQ(
      RunCli({"--addr", "127.0.0.1:1", "--timeout", "300ms", "collections", "list"}, nullptr, &err),
      kExitError);
  EXPECT_THAT(err, HasSubstr("tessera: UNAVAILABLE: "));
}

ParsedArgs CreateArgs(const std::vector<std::string>& flags) {
  std::vector<std::string> args = {"collections", "create", "c"};
  args.insert(args.end(), flags.begin(), flags.end());
  static constexpr FlagSpec kCreate[] = {{"dim", true},
                                         {"pool-factor", true},
                                         {"pooling", true},
                                         {"dtype", true},
                                         {"shards", true},
                                         {"attribute", true},
                                         {"factory", true},
                                         {"candidates", true},
                                         {"candidate-pool-factor", true},
                                         {"protected-tokens", true},
                                         {"residual-bits", true},
                                         {"min-vectors", true},
                                         {"max-merge-height", true},
                                         {"rerank-from-codes", false},
                                         {"renormalize", false},
                                         {"keep-special-tokens", false},
                                         {"sparse", false},
                                         {"sparse-k1", true},
                                         {"sparse-b", true},
                                         {"sparse-no-idf", false}};
  return *ParseArgs(args, kCreate);
}

TEST(SchemaFromArgs, HierarchicalDefaultsAndFlags) {
  auto schema = internal::SchemaFromArgs("papers", CreateArgs({"--dim", "128"}));
  ASSERT_TRUE(schema.ok()) << schema.status();
  EXPECT_EQ(schema->name(), "papers");
  EXPECT_EQ(schema->dim(), 128u);
  EXPECT_EQ(schema->dtype(), v1::DTYPE_FLOAT16);
  ASSERT_TRUE(schema->has_hierarchical());
  EXPECT_EQ(schema->hierarchical().pool_factor(), 2u);
  EXPECT_EQ(schema->hierarchical().method(), v1::HierarchicalPooling::METHOD_WARD);
  // Unset: the server applies its default for the method.
  EXPECT_FALSE(schema->hierarchical().has_max_merge_height());
  EXPECT_FALSE(schema->has_spatial());
  EXPECT_FALSE(schema->has_candidates());

  schema = internal::SchemaFromArgs("papers", CreateArgs({"--dim",
                                                          "96",
                                                          "--pooling",
                                                          "reference",
                                                          "--pool-factor",
                                                          "3",
                                                          "--dtype",
                                                          "fp32",
                                                          "--shards",
                                                          "4",
                                                          "--attribute",
                                                          "year:int64",
                                                          "--attribute",
                                                          "w:double",
                                                          "--attribute",
                                                          "lang:string",
                                                          "--factory",
                                                          "HNSW32",
                                                          "--candidate-pool-factor",
                                                          "6",
                                                          "--protected-tokens",
                                                          "1",
                                                          "--renormalize"}));
  ASSERT_TRUE(schema.ok()) << schema.status();
  EXPECT_EQ(schema->dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(schema->hierarchical().method(), v1::HierarchicalPooling::METHOD_REFERENCE);
  EXPECT_EQ(schema->hierarchical().pool_factor(), 3u);
  EXPECT_EQ(schema->hierarchical().protected_tokens(), 1u);
  EXPECT_TRUE(schema->hierarchical().renormalize());
  EXPECT_EQ(schema->num_shards(), 4u);
  EXPECT_EQ(schema->attributes().at("year"), v1::ATTRIBUTE_TYPE_INT64);
  EXPECT_EQ(schema->attributes().at("w"), v1::ATTRIBUTE_TYPE_DOUBLE);
  EXPECT_EQ(schema->attributes().at("lang"), v1::ATTRIBUTE_TYPE_STRING);
  EXPECT_EQ(schema->candidates().kind(), v1::CandidateVectors::KIND_POOLED);
  EXPECT_EQ(schema->candidates().pool_factor(), 6u);
  EXPECT_EQ(schema->candidates().factory(), "HNSW32");
  EXPECT_THAT(internal::DescribeSchema(*schema),
              HasSubstr("dim 96, fp32, reference pooling p=3, candidates pooled p=6 (HNSW32), "
                        "4 shards, attributes lang:string w:double year:int64"));
}

TEST(SchemaFromArgs, PoolingFloorAndRerankFromCodes) {
  auto schema = internal::SchemaFromArgs(
      "pages", CreateArgs({"--dim", "128", "--min-vectors", "24", "--residual-bits", "4",
                           "--rerank-from-codes"}));
  ASSERT_TRUE(schema.ok()) << schema.status();
  EXPECT_EQ(schema->hierarchical().min_vectors(), 24u);
  EXPECT_EQ(schema->candidates().residual_bits(), 4u);
  EXPECT_TRUE(schema->candidates().rerank_from_codes());
  EXPECT_THAT(internal::DescribeSchema(*schema),
              HasSubstr("ward pooling p=2 (at least 24 vectors)"));
  schema = internal::SchemaFromArgs(
      "pages", CreateArgs({"--dim", "128", "--pooling", "rows", "--min-vectors", "24"}));
  EXPECT_FALSE(schema.ok());
}

TEST(SchemaFromArgs, SparseField) {
  auto schema = internal::SchemaFromArgs("hybrid", CreateArgs({"--dim", "8", "--sparse"}));
  ASSERT_TRUE(schema.ok()) << schema.status();
  ASSERT_TRUE(schema->has_sparse());
  EXPECT_EQ(schema->sparse().modifier(), v1::SparseField::MODIFIER_IDF);
  EXPECT_FALSE(schema->sparse().has_k1());
  schema =
      internal::SchemaFromArgs("hybrid", CreateArgs({"--dim", "8", "--sparse", "--sparse-k1", "0.9",
                                                     "--sparse-b", "0.4", "--sparse-no-idf"}));
  ASSERT_TRUE(schema.ok()) << schema.status();
  EXPECT_EQ(schema->sparse().modifier(), v1::SparseField::MODIFIER_NONE);
  EXPECT_EQ(schema->sparse().k1(), 0.9);
  EXPECT_EQ(schema->sparse().b(), 0.4);
  EXPECT_THAT(internal::DescribeSchema(*schema), EndsWith(", sparse field (dot product)"));
  schema->mutable_sparse()->set_modifier(v1::SparseField::MODIFIER_IDF);
  EXPECT_THAT(internal::DescribeSchema(*schema), EndsWith(", sparse field (BM25 k1 0.9 b 0.4)"));
  EXPECT_FALSE(internal::SchemaFromArgs("plain", CreateArgs({"--dim", "8"}))->has_sparse());
}

// A schema with spatial and hierarchical pooling (the server keeps both: spatial, then
// hierarchical over its vectors) was shown with its spatial part only.
TEST(DescribeSchema, ShowsSpatialThenHierarchicalPooling) {
  v1::CollectionSchema schema;
  schema.set_dim(16);
  schema.mutable_spatial()->set_mode(v1::SpatialPooling::MODE_TILES);
  schema.mutable_spatial()->set_tile_rows(2);
  schema.mutable_spatial()->set_tile_cols(3);
  EXPECT_THAT(internal::DescribeSchema(schema), HasSubstr("spatial pooling tile:2x3, cand"));
  EXPECT_EQ(FindMember(internal::SchemaToJson(schema)["pooling"], "then"), nullptr);
  schema.mutable_hierarchical()->set_pool_factor(3);
  EXPECT_THAT(internal::DescribeSchema(schema),
              HasSubstr("spatial pooling tile:2x3, then ward pooling p=3, cand"));
  const Json json = internal::SchemaToJson(schema);
  const Json* then = FindMember(json["pooling"], "then");
  ASSERT_NE(then, nullptr);
  EXPECT_EQ(DumpJson(*then),
            R"({"kind":"hierarchical","method":"ward","pool_factor":3,"protected_tokens":0,)"
            R"("min_vectors":0,"max_merge_height":0.0,"renormalize":false})");
}

TEST(SchemaFromArgs, MaxMergeHeight) {
  auto schema =
      internal::SchemaFromArgs("pages", CreateArgs({"--dim", "128", "--max-merge-height", "0.25"}));
  ASSERT_TRUE(schema.ok()) << schema.status();
  ASSERT_TRUE(schema->hierarchical().has_max_merge_height());
  EXPECT_EQ(schema->hierarchical().max_merge_height(), 0.25);
  EXPECT_THAT(internal::DescribeSchema(*schema),
              HasSubstr("ward pooling p=2 (merges up to height 0.25)"));
  // 0 is sent as given (no limit), not left unset.
  schema =
      internal::SchemaFromArgs("pages", CreateArgs({"--dim", "128", "--max-merge-height", "0"}));
  ASSERT_TRUE(schema.ok()) << schema.status();
  EXPECT_TRUE(schema->hierarchical().has_max_merge_height());
  EXPECT_THAT(internal::DescribeSchema(*schema), Not(HasSubstr("merges up to")));
  schema =
      internal::SchemaFromArgs("pages", CreateArgs({"--dim", "128", "--max-merge-height", "low"}));
  ASSERT_FALSE(schema.ok());
  EXPECT_THAT(schema.status().message(),
              HasSubstr("--max-merge-height expects a number, got 'low'"));
  schema = internal::SchemaFromArgs(
      "pages", CreateArgs({"--dim", "128", "--pooling", "rows", "--max-merge-height", "0.3"}));
  EXPECT_FALSE(schema.ok());
}

TEST(SchemaFromArgs, SpatialModes) {
  struct Case {
    std::string pooling;
    v1::SpatialPooling::Mode mode;
  } cases[] = {{"rows", v1::SpatialPooling::MODE_ROWS},
               {"cols", v1::SpatialPooling::MODE_COLUMNS},
               {"global", v1::SpatialPooling::MODE_GLOBAL},
               {"tile:2x4", v1::SpatialPooling::MODE_TILES},
               {"window:3:2", v1::SpatialPooling::MODE_ROW_WINDOWS}};
  for (const Case& c : cases) {
    auto schema = internal::SchemaFromArgs(
        "pages", CreateArgs({"--dim", "128", "--pooling", c.pooling, "--keep-special-tokens",
                             "--candidates", "global"}));
    ASSERT_TRUE(schema.ok()) << c.pooling << ": " << schema.status();
    ASSERT_TRUE(schema->has_spatial()) << c.pooling;
    EXPECT_FALSE(schema->has_hierarchical());
    EXPECT_EQ(schema->spatial().mode(), c.mode);
    EXPECT_TRUE(schema->spatial().keep_special_tokens());
    EXPECT_EQ(schema->candidates().kind(), v1::CandidateVectors::KIND_GLOBAL_MEAN);
    if (c.mode == v1::SpatialPooling::MODE_TILES) {
      EXPECT_EQ(schema->spatial().tile_rows(), 2u);
      EXPECT_EQ(schema->spatial().tile_cols(), 4u);
    }
    if (c.mode == v1::SpatialPooling::MODE_ROW_WINDOWS) {
      EXPECT_EQ(schema->spatial().window_rows(), 3u);
      EXPECT_EQ(schema->spatial().window_stride(), 2u);
    }
  }
}

TEST(SchemaFromArgs, RejectsBadFlags) {
  const std::vector<std::vector<std::string>> bad = {
      {},
      {"--dim", "0"},
      {"--dim", "8", "--dtype", "int8"},
      {"--dim", "8", "--pooling", "tile:2"},
      {"--dim", "8", "--pooling", "tile:0x2"},
      {"--dim", "8", "--pooling", "window:2"},
      {"--dim", "8", "--pooling", "rows", "--pool-factor", "2"},
      {"--dim", "8", "--keep-special-tokens"},
      {"--dim", "8", "--attribute", "year"},
      {"--dim", "8", "--attribute", "year:date"},
      {"--dim", "8", "--attribute", "a:int64", "--attribute", "a:string"},
      {"--dim", "8", "--candidates", "sometimes"},
      {"--dim", "8", "--candidates", "global", "--candidate-pool-factor", "2"},
      {"--dim", "8", "--pool-factor", "0"},
  };
  for (const auto& flags : bad) {
    EXPECT_EQ(internal::SchemaFromArgs("c", CreateArgs(flags)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << ::testing::PrintToString(flags);
  }
}

const std::map<std::string, v1::AttributeType> kFields = {{"year", v1::ATTRIBUTE_TYPE_INT64},
                                                          {"w", v1::ATTRIBUTE_TYPE_DOUBLE},
                                                          {"lang", v1::ATTRIBUTE_TYPE_STRING}};

TEST(ParseFilterExpression, OperatorsAndTypedValues) {
  struct Case {
    std::string expression;
    FilterCondition::Op op;
    std::string field;
    std::vector<AttributeValue> values;
  } cases[] = {
      {"year==2020", FilterCondition::Op::kEq, "year", {int64_t{2020}}},
      {"year = 2020", FilterCondition::Op::kEq, "year", {int64_t{2020}}},
      {"year!=1", FilterCondition::Op::kNe, "year", {int64_t{1}}},
      {"year<1", FilterCondition::Op::kLt, "year", {int64_t{1}}},
      {"year<=1", FilterCondition::Op::kLe, "year", {int64_t{1}}},
      {"year>1", FilterCondition::Op::kGt, "year", {int64_t{1}}},
      {" year >= 1 ", FilterCondition::Op::kGe, "year", {int64_t{1}}},
      {"w>=2", FilterCondition::Op::kGe, "w", {2.0}},  // the schema says double
      {"lang==2020", FilterCondition::Op::kEq, "lang", {std::string("2020")}},
      {"lang=='a b'", FilterCondition::Op::kEq, "lang", {std::string("a b")}},
      {"lang in en,fr", FilterCondition::Op::kIn, "lang", {std::string("en"), std::string("fr")}},
      {"lang in [\"a,b\", c]",
       FilterCondition::Op::kIn,
       "lang",
       {std::string("a,b"), std::string("c")}},
      {"year in 1, 2", FilterCondition::Op::kIn, "year", {int64_t{1}, int64_t{2}}},
      // Fields the schema does not declare: guessed (the server then names the unknown field).
      {"other==3", FilterCondition::Op::kEq, "other", {int64_t{3}}},
      {"other==3.5", FilterCondition::Op::kEq, "other", {3.5}},
      {"other==x", FilterCondition::Op::kEq, "other", {std::string("x")}},
      {"other==\"3\"", FilterCondition::Op::kEq, "other", {std::string("3")}},
  };
  for (const Case& c : cases) {
    auto condition = internal::ParseFilterExpression(c.expression, kFields);
    ASSERT_TRUE(condition.ok()) << c.expression << ": " << condition.status();
    EXPECT_EQ(condition->op, c.op) << c.expression;
    EXPECT_EQ(condition->field, c.field) << c.expression;
    EXPECT_EQ(condition->values, c.values) << c.expression;
  }
}

TEST(ParseFilterExpression, RejectsMalformedExpressions) {
  for (const char* expression : {"year", "==3", "year==", "year==abc", "w<fast", "year=>3"}) {
    EXPECT_EQ(internal::ParseFilterExpression(expression, kFields).status().code(),
              absl::StatusCode::kInvalidArgument)
        << expression;
  }
}

TEST(JsonOutput, SearchResult) {
  SearchResult result;
  result.hits.push_back(SearchHit{"doc-1", 12.5f, 2, {}});
  result.hits.push_back(SearchHit{"doc-2", 0.1f, 1, {TokenMatch{0, 3, 0.75f, {4, 5}}}});
  result.timings = SearchTimings{1.5, 0.25, 2.0, 4.0};
  result.documents_scored = 100;
  EXPECT_EQ(DumpJson(internal::SearchResultToJson(result, false)),
            R"({"results":[{"id":"doc-1","score":12.5,"version":2},)"
            R"({"id":"doc-2","score":0.1,"version":1}],)"
            R"("timings_ms":{"candidates":1.5,"fetch":0.25,"rerank":2.0,"total":4.0},)"
            R"("documents_scored":100,"exhaustive":false})");
  const std::string explained = DumpJson(internal::SearchResultToJson(result, true));
  EXPECT_THAT(explained, HasSubstr(R"("explanation":[])"));
  EXPECT_THAT(explained, HasSubstr(R"("explanation":[{"query_token":0,"document_vector":3,)"
                                   R"("similarity":0.75,"covered_tokens":[4,5]}])"));
}

TEST(JsonOutput, StoredDocument) {
  StoredDocument document;
  document.id = "d";
  document.version = 3;
  document.num_tokens = 4;
  document.num_vectors = 2;
  document.dim = 2;
  document.stored_dtype = v1::DTYPE_FLOAT16;
  document.vectors = {1, 0, 0.5f, -0.5f};
  document.member_offsets = {0, 3, 4};
  document.members = {0, 1, 3, 2};
  document.attributes = {{"lang", std::string("en")}, {"w", 0.5}, {"year", int64_t{2020}}};
  EXPECT_EQ(DumpJson(internal::StoredDocumentToJson(document, false)),
            R"({"id":"d","version":3,"num_tokens":4,"num_vectors":2,"dim":2,"dtype":"fp16",)"
            R"("attributes":{"lang":"en","w":0.5,"year":2020},"layout":null})");
  document.layout = PatchLayout{1, 2, 1, 1};
  EXPECT_EQ(DumpJson(internal::StoredDocumentToJson(document, true)),
            R"({"id":"d","version":3,"num_tokens":4,"num_vectors":2,"dim":2,"dtype":"fp16",)"
            R"("attributes":{"lang":"en","w":0.5,"year":2020},)"
            R"("layout":{"rows":1,"cols":2,"prefix":1,"suffix":1},)"
            R"("vectors":[[1.0,0.0],[0.5,-0.5]],"members":[[0,1,3],[2]]})");
}

TEST(JsonOutput, Stats) {
  v1::CollectionStats stats;
  stats.set_documents(300);
  stats.set_original_tokens(4800);
  stats.set_rerank_vectors(2400);
  stats.set_candidate_vectors(1200);
  stats.set_disk_bytes(123456);
  stats.set_vectors_per_document(8);
  stats.set_disk_bytes_per_original_token(25.72);
  stats.set_disk_bytes_per_rerank_vector(51.44);
  stats.add_candidate_indexes("IDMap2,Flat");
  stats.set_resident_bytes(614400);
  stats.set_candidate_bytes(98304);
  stats.set_training_shards(1);
  stats.set_rerank_segments(2);
  stats.set_rerank_segment_bytes(67108864);
  stats.set_rerank_unflushed_bytes(4096);
  stats.set_code_segments(3);
  stats.set_code_segment_bytes(8192);
  stats.set_code_unflushed_bytes(512);
  EXPECT_EQ(DumpJson(internal::StatsToJson("papers", stats)),
            R"({"collection":"papers","documents":300,"original_tokens":4800,)"
            R"("rerank_vectors":2400,"candidate_vectors":1200,"disk_bytes":123456,)"
            R"("vectors_per_document":8.0,"disk_bytes_per_original_token":25.72,)"
            R"("disk_bytes_per_rerank_vector":51.44,"candidate_indexes":["IDMap2,Flat"],)"
            R"("resident_bytes":614400,"candidate_bytes":98304,"training_shards":1,)"
            R"("rerank_segments":2,"rerank_segment_bytes":67108864,"rerank_unflushed_bytes":4096,)"
            R"("code_segments":3,"code_segment_bytes":8192,"code_unflushed_bytes":512})");
}

TEST(TextOutput, SearchTableEscapesIds) {
  SearchResult result;
  result.hits.push_back(SearchHit{"doc-1", 12.5f, 2, {}});
  // An id that would clear the screen, forge a second row and read backwards.
  result.hits.push_back(SearchHit{"\x1b[2J\n   9  forged\u202E", 0.5f, 1, {}});
  result.documents_scored = 2;
  const std::string text = internal::SearchResultToText(result);
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_EQ(text.find("\u202E"), std::string::npos) << text;
  EXPECT_THAT(text, HasSubstr("   2  \\x1b[2J\\n   9  forged\\u202e      0.500000  1\n"));
  // One header, two rows, the timings: four lines, the columns aligned on the escaped id.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 4) << text;
  // The escaped id is 27 characters: doc-1 is padded to them, then two spaces and the score.
  EXPECT_THAT(text, HasSubstr("   1  doc-1" + std::string(22 + 2 + 3, ' ') + "12.500000  2\n"));
}

TEST(TextOutput, StoredDocumentEscapesIdAndAttributes) {
  StoredDocument document;
  document.id = std::string("evil\0\x1b]0;title\a", 15);
  document.version = 1;
  document.attributes = {{"na\nme", std::string("v\x1b[31mred\u2067")}, {"n", int64_t{3}}};
  const std::string text = internal::StoredDocumentToText(document, false);
  EXPECT_THAT(text, HasSubstr("id          evil\\x00\\x1b]0;title\\x07\n"));
  EXPECT_THAT(text, HasSubstr("attributes  n=3 na\\nme='v\\x1b[31mred\\u2067'\n"));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 6) << text;
  for (const char c : text) {
    EXPECT_TRUE(c == '\n' || static_cast<unsigned char>(c) >= 0x20) << text;
  }
}

TEST(Progress, Lines) {
  EXPECT_EQ(FormatEta(absl::Seconds(5)), "0:05");
  EXPECT_EQ(FormatEta(absl::Seconds(125)), "2:05");
  EXPECT_EQ(FormatEta(absl::Seconds(3723)), "1:02:03");
  EXPECT_EQ(FormatProgressLine("ingest papers", 150, 300, absl::Seconds(2), 0),
            "ingest papers: 150/300 docs (50%), 75.0 docs/s, ETA 0:02");
  EXPECT_EQ(FormatProgressLine("ingest", 150, 300, absl::Seconds(0.1), 10),
            "ingest [#####     ] 150/300 docs  1500 docs/s  ETA 0:01");
  EXPECT_EQ(FormatProgressLine("ingest", 0, 300, absl::Seconds(1), 0),
            "ingest: 0/300 docs (0%), 0.0 docs/s, ETA ?");
  EXPECT_EQ(FormatProgressLine("ingest", 300, 300, absl::Seconds(3), 0),
            "ingest: 300/300 docs (100%), 100 docs/s, ETA 0:00");
}

}  // namespace
}  // namespace tessera::client
