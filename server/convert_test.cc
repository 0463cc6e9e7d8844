#include "server/convert.h"

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/float16.h"

namespace tessera::server {
namespace {

using ::testing::HasSubstr;

TEST(Convert, MatricesRoundTripInBothDtypes) {
  const std::vector<float> values = {0.5f, -1.25f, 3.0f, 0.0f, 1e-3f, -2.0f};
  for (VectorDtype dtype : {VectorDtype::kFloat32, VectorDtype::kFloat16}) {
    v1::Matrix matrix;
    EncodeMatrix(values.data(), 2, 3, dtype, &matrix);
    EXPECT_EQ(matrix.data().size(), 6u * (dtype == VectorDtype::kFloat32 ? 4 : 2));
    auto decoded = DecodeMatrix(matrix, 3, "m");
    ASSERT_TRUE(decoded.ok());
    for (size_t i = 0; i < values.size(); ++i) {
      const float expected =
          dtype == VectorDtype::kFloat32 ? values[i] : HalfToFloat(FloatToHalf(values[i]));
      EXPECT_EQ((*decoded)[i], expected);
    }
  }
}

TEST(Convert, MatrixErrorsNameTheField) {
  v1::Matrix matrix;
  matrix.set_rows(2);
  matrix.set_cols(3);
  matrix.set_dtype(v1::DTYPE_FLOAT32);
  matrix.set_data(std::string(23, '\0'));
  EXPECT_THAT(
      DecodeMatrix(matrix, 3, "documents[0].tokens").status().message(),
      HasSubstr("documents[0].tokens: 23 bytes of data, expected rows 2 × cols 3 × 4 = 24"));
  matrix.set_data(std::string(24, '\0'));
  EXPECT_THAT(DecodeMatrix(matrix, 4, "q").status().message(),
              HasSubstr("cols (dim) 3, expected 4"));
  matrix.set_dtype(static_cast<v1::DType>(9));
  EXPECT_THAT(DecodeMatrix(matrix, 3, "q").status().message(), HasSubstr("dtype"));
}

// tests/fuzz/upsert_fuzzer: rows = cols = 2^31 of fp32 is 2^64 bytes, which wrapped to 0 and
// matched an empty data field; the decoder then asked for a vector of 2^62 floats
// (corpus/upsert/regression-matrix-size-overflow.pb). Only a call with no expected dim gets there.
TEST(Convert, MatrixSizesPast64BitsAreRejected) {
  v1::Matrix matrix;
  matrix.set_rows(1u << 31);
  matrix.set_cols(1u << 31);
  matrix.set_dtype(v1::DTYPE_FLOAT32);
  const auto decoded = DecodeMatrix(matrix, 0, "documents[0].tokens");
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(decoded.status().message(),
              HasSubstr("0 bytes of data, expected rows 2147483648 × cols 2147483648 × 4 (over "
                        "2^64)"));
}

// tests/fuzz/upsert_fuzzer: a document of 0 tokens made DecodeMatrix memcpy into an empty
// vector's null data(), which is undefined (corpus/upsert/regression-zero-token-document.pb). It
// decodes to no values; the collection then rejects the document for its token count.
TEST(Convert, EmptyMatricesDecodeToNoValues) {
  for (const v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16}) {
    v1::Document document;
    document.set_id("empty");
    document.mutable_tokens()->set_cols(3);
    document.mutable_tokens()->set_dtype(dtype);
    const auto decoded = DocumentFromProto(document, 3, 0);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->num_tokens, 0);
    EXPECT_TRUE(decoded->tokens.empty());
  }
}

// A schema as a client sends it with every option left at its default.
v1::CollectionSchema MinimalSchema(uint32_t dim) {
  v1::CollectionSchema proto;
  proto.set_name("docs");
  proto.set_dim(dim);
  return proto;
}

TEST(Convert, SchemaRoundTripAndDefaults) {
  v1::CollectionSchema proto = MinimalSchema(128);
  auto schema = SchemaFromProto(proto);
  ASSERT_TRUE(schema.ok());
  EXPECT_EQ(schema->dtype, VectorDtype::kFloat16);
  ASSERT_TRUE(schema->pooling.hierarchical.has_value());
  EXPECT_EQ(schema->pooling.hierarchical->pool_factor, 2);
  EXPECT_EQ(schema->num_shards, 1);
  proto.mutable_hierarchical()->set_pool_factor(0);
  EXPECT_THAT(SchemaFromProto(proto).status().message(),
              HasSubstr("schema.hierarchical.pool_factor: 0, expected 1 … 64"));
  proto.mutable_hierarchical()->set_pool_factor(3);
  proto.mutable_spatial()->set_mode(v1::SpatialPooling::MODE_TILES);
  proto.mutable_spatial()->set_tile_rows(3);
  proto.mutable_spatial()->set_tile_cols(4);
  (*proto.mutable_attributes())["year"] = v1::ATTRIBUTE_TYPE_INT64;
  schema = SchemaFromProto(proto);
  ASSERT_TRUE(schema.ok());
  v1::CollectionSchema back;
  SchemaToProto(*schema, &back);
  EXPECT_EQ(back.hierarchical().pool_factor(), 3u);
  EXPECT_EQ(back.spatial().mode(), v1::SpatialPooling::MODE_TILES);
  EXPECT_EQ(back.spatial().tile_rows(), 3u);
  EXPECT_EQ(back.spatial().tile_cols(), 4u);
  EXPECT_EQ(back.attributes().at("year"), v1::ATTRIBUTE_TYPE_INT64);
  // Both poolings, kept both (spatial, then hierarchical over its output), and a schema read back
  // converts again to the same one.
  ASSERT_TRUE(schema->pooling.spatial.has_value());
  ASSERT_TRUE(schema->pooling.hierarchical.has_value());
  const auto again = SchemaFromProto(back);
  ASSERT_TRUE(again.ok()) << again.status();
  v1::CollectionSchema back_again;
  SchemaToProto(*again, &back_again);
  EXPECT_EQ(back_again.SerializeAsString(), back.SerializeAsString());
  EXPECT_EQ(back.hierarchical().max_merge_height(), kAdaptiveMergeHeight);
}

// An unset max_merge_height takes the method's default; a set one, 0 included, is kept.
TEST(Convert, MaxMergeHeightDefaultsByMethod) {
  v1::CollectionSchema proto = MinimalSchema(16);
  auto schema = SchemaFromProto(proto);
  ASSERT_TRUE(schema.ok());
  EXPECT_EQ(schema->pooling.hierarchical->max_merge_height, kAdaptiveMergeHeight);
  proto.mutable_hierarchical()->set_pool_factor(2);
  proto.mutable_hierarchical()->set_method(v1::HierarchicalPooling::METHOD_REFERENCE);
  schema = SchemaFromProto(proto);
  ASSERT_TRUE(schema.ok()) << schema.status();
  EXPECT_EQ(schema->pooling.hierarchical->max_merge_height, 0.0);
  proto.mutable_hierarchical()->set_method(v1::HierarchicalPooling::METHOD_WARD);
  proto.mutable_hierarchical()->set_max_merge_height(0.0);
  schema = SchemaFromProto(proto);
  ASSERT_TRUE(schema.ok()) << schema.status();
  EXPECT_EQ(schema->pooling.hierarchical->max_merge_height, 0.0);
  v1::CollectionSchema back;
  SchemaToProto(*schema, &back);
  EXPECT_TRUE(back.hierarchical().has_max_merge_height());
  EXPECT_EQ(back.hierarchical().max_merge_height(), 0.0);
}

// A size the spatial mode uses, sent as 0 (proto3's unset), was replaced by its default (tile
// 0×0 became 2×2, window stride 0 became 1): refused, naming the field. Sizes the mode does not
// use may be 0.
TEST(Convert, SpatialSizesTheModeUsesMustBeGiven) {
  struct Case {
    v1::SpatialPooling::Mode mode;
    uint32_t tile_rows, tile_cols, window_rows, window_stride;
    std::string message;  // empty: accepted
  };
  const std::vector<Case> cases = {
      {v1::SpatialPooling::MODE_TILES, 0, 0, 0, 0,
       "schema.spatial.tile_rows: 0, expected ≥ 1 for mode MODE_TILES"},
      {v1::SpatialPooling::MODE_TILES, 2, 0, 0, 0,
       "schema.spatial.tile_cols: 0, expected ≥ 1 for mode MODE_TILES"},
      {v1::SpatialPooling::MODE_TILES, 2, 3, 0, 0, ""},
      {v1::SpatialPooling::MODE_ROW_WINDOWS, 0, 0, 3, 0,
       "schema.spatial.window_stride: 0, expected ≥ 1 for mode MODE_ROW_WINDOWS"},
      {v1::SpatialPooling::MODE_ROW_WINDOWS, 0, 0, 0, 1,
       "schema.spatial.window_rows: 0, expected ≥ 1 for mode MODE_ROW_WINDOWS"},
      {v1::SpatialPooling::MODE_ROW_WINDOWS, 0, 0, 3, 2, ""},
      {v1::SpatialPooling::MODE_ROWS, 0, 0, 0, 0, ""},
      {v1::SpatialPooling::MODE_GLOBAL, 0, 0, 0, 0, ""},
  };
  for (const Case& c : cases) {
    v1::CollectionSchema proto = MinimalSchema(16);
    v1::SpatialPooling* spatial = proto.mutable_spatial();
    spatial->set_mode(c.mode);
    spatial->set_tile_rows(c.tile_rows);
    spatial->set_tile_cols(c.tile_cols);
    spatial->set_window_rows(c.window_rows);
    spatial->set_window_stride(c.window_stride);
    const auto schema = SchemaFromProto(proto);
    if (c.message.empty()) {
      ASSERT_TRUE(schema.ok()) << c.mode << ": " << schema.status();
      if (c.mode == v1::SpatialPooling::MODE_TILES) {
        EXPECT_EQ(schema->pooling.spatial->tile_rows, 2);
        EXPECT_EQ(schema->pooling.spatial->tile_cols, 3);
      }
      if (c.mode == v1::SpatialPooling::MODE_ROW_WINDOWS) {
        EXPECT_EQ(schema->pooling.spatial->window_rows, 3);
        EXPECT_EQ(schema->pooling.spatial->window_stride, 2);
      }
    } else {
      EXPECT_EQ(schema.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
      EXPECT_THAT(schema.status().message(), HasSubstr(c.message));
    }
  }
}

// Client-sent names in messages are cut short as ids are (a 1 MB value made the message exceed
// gRPC's header limit, which hid the status behind RESOURCE_EXHAUSTED).
TEST(Convert, EchoedIdsAndNamesAreCutShort) {
  v1::Document document;
  document.set_id(std::string(5000, 'i'));
  document.mutable_tokens()->set_dtype(v1::DTYPE_FLOAT32);
  document.mutable_tokens()->set_cols(3);
  document.mutable_tokens()->set_rows(1);
  (*document.mutable_attributes())[std::string(5000, 'a')] = v1::AttributeValue();
  auto decoded = DocumentFromProto(document, 4, 2);
  EXPECT_THAT(decoded.status().message(),
              HasSubstr(absl::StrCat("documents[2] ('", std::string(64, 'i'),
                                     "…' (5000 bytes)).tokens: cols (dim) 3, expected 4")));
  EXPECT_LT(decoded.status().message().size(), 200u);
  document.mutable_tokens()->set_cols(4);
  document.mutable_tokens()->set_data(std::string(16, '\0'));
  decoded = DocumentFromProto(document, 4, 2);
  EXPECT_THAT(decoded.status().message(),
              HasSubstr(absl::StrCat("documents[2].attributes['", std::string(64, 'a'),
                                     "…' (5000 bytes)]: no value set")));
  EXPECT_LT(decoded.status().message().size(), 200u);
  v1::CollectionSchema schema = MinimalSchema(16);
  (*schema.mutable_attributes())[std::string(5000, 'f')] = v1::ATTRIBUTE_TYPE_UNSPECIFIED;
  const absl::Status status = SchemaFromProto(schema).status();
  EXPECT_THAT(status.message(), HasSubstr("(5000 bytes)]: type 0 (unspecified)"));
  EXPECT_LT(status.message().size(), 200u);
}

TEST(Convert, StoredVectorBytesGoOutAsTheyAre) {
  StoredDocument document;
  document.id = "d";
  document.dtype = VectorDtype::kFloat16;
  document.dim = 2;
  // A signalling NaN's bits and the smallest subnormal: bytes an fp32 round trip could alter
  // (conversions quiet a signalling NaN), so only a pass-through keeps them.
  const std::string bytes = {'\x01', '\x7c', '\x01', '\x00'};
  document.vector_bytes = bytes;
  v1::GetResponse response;
  StoredDocumentToProto(document, &response);
  EXPECT_EQ(response.vectors().dtype(), v1::DTYPE_FLOAT16);
  EXPECT_EQ(response.vectors().rows(), 1u);
  EXPECT_EQ(response.vectors().cols(), 2u);
  EXPECT_EQ(response.vectors().data(), bytes);

  // A document with fp32 vectors (Get's default) is encoded in its dtype, as before.
  document.vector_bytes.clear();
  document.vectors = {0.5f, -2.0f, 1e-3f, 0.0f};
  response.Clear();
  StoredDocumentToProto(document, &response);
  EXPECT_EQ(response.vectors().rows(), 2u);
  auto decoded = DecodeMatrix(response.vectors(), 2, "vectors");
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ((*decoded)[1], -2.0f);
  EXPECT_EQ((*decoded)[2], HalfToFloat(FloatToHalf(1e-3f)));
}

// Nested filters decode to the same tree; one nested deeper than kMaxFilterDepth is refused while
// decoding, naming where, so that no request recurses past the bound.
TEST(Convert, NestedFiltersDecodeAndTooDeepIsRefused) {
  v1::Filter proto;
  v1::Condition* exists = proto.add_all_of();
  exists->set_field("lang");
  exists->set_op(v1::Condition::OP_EXISTS);
  v1::Filter* alternative = proto.add_any_of();
  v1::Condition* prefix = alternative->add_all_of();
  prefix->set_field("lang");
  prefix->set_op(v1::Condition::OP_PREFIX);
  prefix->add_values()->set_string_value("en");
  v1::Condition* missing = proto.add_none_of()->add_all_of();
  missing->set_field("year");
  missing->set_op(v1::Condition::OP_MISSING);
  absl::StatusOr<Filter> filter = FilterFromProto(proto);
  ASSERT_TRUE(filter.ok()) << filter.status();
  ASSERT_EQ(filter->all_of.size(), 1u);
  EXPECT_EQ(filter->all_of[0].op, FilterCondition::Op::kExists);
  ASSERT_EQ(filter->any_of.size(), 1u);
  EXPECT_EQ(filter->any_of[0].all_of[0].op, FilterCondition::Op::kPrefix);
  ASSERT_EQ(filter->none_of.size(), 1u);
  EXPECT_EQ(filter->none_of[0].all_of[0].op, FilterCondition::Op::kMissing);
  EXPECT_TRUE(FilterMatches(*filter, {{"lang", std::string("en-GB")}, {"year", int64_t{1}}}));
  EXPECT_FALSE(FilterMatches(*filter, {{"lang", std::string("en-GB")}}));
  EXPECT_FALSE(FilterMatches(*filter, {{"lang", std::string("de")}, {"year", int64_t{1}}}));

  v1::Filter deep;
  v1::Filter* at = &deep;
  for (int depth = 1; depth < kMaxFilterDepth; ++depth) at = at->add_none_of();
  EXPECT_TRUE(FilterFromProto(deep).ok());
  at->add_any_of();
  const absl::Status status = FilterFromProto(deep).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "filter.none_of[0].none_of[0].none_of[0].none_of[0].none_of[0].none_of[0]."
            "none_of[0].any_of[0]: nested 9 deep, expected at most 8 (any_of / none_of inside "
            "each other)");
}

TEST(Convert, DeleteTakesIdsOrAFilter) {
  v1::DeleteRequest request;
  request.add_ids("a");
  EXPECT_TRUE(CheckDeleteByFilter(request).ok());
  request.add_ids("b");
  request.mutable_filter();
  const absl::Status status = CheckDeleteByFilter(request);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "filter: set with 2 ids, expected ids or a filter, not both");
  request.clear_ids();
  EXPECT_TRUE(CheckDeleteByFilter(request).ok());
}

// The sparse field, the hybrid options and the router's statistics: defaults for what is unset,
// INVALID_ARGUMENT naming the field for what cannot mean anything, exact round trips.
TEST(Convert, SparseFieldHybridOptionsAndStatistics) {
  v1::CollectionSchema proto;
  proto.set_name("c");
  proto.set_dim(8);
  proto.mutable_sparse();
  auto schema = SchemaFromProto(proto);
  ASSERT_TRUE(schema.ok()) << schema.status();
  ASSERT_TRUE(schema->sparse.has_value());
  EXPECT_TRUE(schema->sparse->idf);
  EXPECT_EQ(schema->sparse->k1, 1.2);
  EXPECT_EQ(schema->sparse->b, 0.75);
  proto.mutable_sparse()->set_modifier(v1::SparseField::MODIFIER_NONE);
  proto.mutable_sparse()->set_b(0.0);
  schema = SchemaFromProto(proto);
  ASSERT_TRUE(schema.ok());
  EXPECT_FALSE(schema->sparse->idf);
  EXPECT_EQ(schema->sparse->b, 0.0);
  v1::CollectionSchema back;
  SchemaToProto(*schema, &back);
  EXPECT_EQ(back.sparse().modifier(), v1::SparseField::MODIFIER_NONE);
  EXPECT_EQ(back.sparse().k1(), 1.2);
  proto.mutable_sparse()->set_modifier(static_cast<v1::SparseField::Modifier>(9));
  EXPECT_THAT(SchemaFromProto(proto).status().message(), HasSubstr("schema.sparse.modifier"));
  proto.clear_sparse();
  EXPECT_FALSE(SchemaFromProto(proto)->sparse.has_value());

  v1::SearchRequest request;
  HybridOptions options;
  ASSERT_TRUE(HybridOptionsFromProto(request, &options).ok());
  EXPECT_FALSE(options.sparse_query.has_value());
  request.set_rerank(true);
  EXPECT_THAT(HybridOptionsFromProto(request, &options).message(),
              HasSubstr("sparse_query: unset, but fusion options were given"));
  request.mutable_sparse_query()->add_indices(7);
  request.mutable_sparse_query()->add_values(2.0f);
  request.set_fusion(v1::FUSION_SCORE);
  request.set_sparse_weight(0.0);
  request.set_fusion_candidates(40);
  ASSERT_TRUE(HybridOptionsFromProto(request, &options).ok());
  EXPECT_EQ(options.sparse_query->indices, std::vector<uint32_t>{7});
  EXPECT_EQ(options.fusion, FusionMethod::kScore);
  EXPECT_EQ(options.dense_weight, 1.0);
  EXPECT_EQ(options.sparse_weight, 0.0);
  EXPECT_EQ(options.rrf_k, kDefaultRrfK);
  EXPECT_EQ(options.candidates, 40);
  EXPECT_TRUE(options.rerank);
  request.set_fusion(static_cast<v1::Fusion>(5));
  EXPECT_THAT(HybridOptionsFromProto(request, &options).message(), HasSubstr("fusion: unknown"));

  SparseStatistics statistics;
  statistics.num_documents = 12;
  statistics.total_length = 0.1 + 0.2;
  statistics.doc_freq = {{9, 3}, {2, 0}, {4000000000u, 12}};
  v1::SparseStatistics wire;
  SparseStatisticsToProto(statistics, &wire);
  EXPECT_EQ(std::vector<uint32_t>(wire.terms().begin(), wire.terms().end()),
            (std::vector<uint32_t>{2, 9, 4000000000u}));
  auto decoded = SparseStatisticsFromProto(wire);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->num_documents, 12);
  EXPECT_EQ(decoded->total_length, 0.1 + 0.2);
  EXPECT_EQ(decoded->doc_freq, statistics.doc_freq);
  wire.add_terms(5);
  EXPECT_THAT(SparseStatisticsFromProto(wire).status().message(),
              HasSubstr("4 terms but 3 doc_freq"));
}

// The numbers go to the collection as sent, whatever their size (it checks them and names the
// value), so that the fuzz targets and every handler read a request the same way.
TEST(Convert, SearchOptionsAreTheRequestsUnclamped) {
  v1::SearchRequest request;
  absl::StatusOr<SearchOptions> options = SearchOptionsFromProto(request);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->k, 10);  // 0 = the default
  EXPECT_TRUE(options->filter.empty());

  request.set_k(4000000000u);
  request.set_num_candidates(4000000001u);
  request.set_per_token_candidates(4000000002u);
  request.set_nprobe(4000000003u);
  request.set_exhaustive(true);
  request.set_explain(true);
  request.set_with_attributes(true);
  request.add_attribute_fields("lang");
  request.set_group_by("year");
  request.set_group_size(4000000004u);
  request.set_groups(4000000005u);
  v1::Condition* condition = request.mutable_filter()->add_all_of();
  condition->set_field("lang");
  condition->set_op(v1::Condition::OP_EQ);
  condition->add_values()->set_string_value("en");
  options = SearchOptionsFromProto(request);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->k, 4000000000);
  EXPECT_EQ(options->num_candidates, 4000000001);
  EXPECT_EQ(options->per_token_candidates, 4000000002);
  EXPECT_EQ(options->nprobe, 4000000003);
  EXPECT_TRUE(options->exhaustive);
  EXPECT_TRUE(options->explain);
  EXPECT_TRUE(options->with_attributes);
  EXPECT_EQ(options->attribute_fields, std::vector<std::string>{"lang"});
  EXPECT_EQ(options->group_by, "year");
  EXPECT_EQ(options->group_size, 4000000004);
  EXPECT_EQ(options->groups, 4000000005);
  ASSERT_EQ(options->filter.all_of.size(), 1u);
  EXPECT_EQ(options->filter.all_of[0].values, std::vector<AttributeValue>{std::string("en")});
  // The caller's.
  EXPECT_EQ(options->whole_shards, 0);
  EXPECT_EQ(options->deadline, std::chrono::steady_clock::time_point::max());

  condition->add_values();  // no value set
  EXPECT_EQ(SearchOptionsFromProto(request).status().message(),
            "filter.all_of[0].values: a value is not set");
}

TEST(Convert, StatsRoundTripTheFieldsTheWireCarries) {
  CollectionStats stats;
  stats.documents = 5;
  stats.original_tokens = 50;
  stats.rerank_vectors = 25;
  stats.candidate_vectors = 10;
  stats.disk_bytes = 5000;
  stats.resident_bytes = 700;
  stats.candidate_bytes = 70;
  stats.training_shards = 2;
  stats.vectors_per_document = 5;
  stats.disk_bytes_per_original_token = 100;
  stats.disk_bytes_per_rerank_vector = 200;
  stats.candidate_indexes = {"IDMap2,Flat", "Centroid(256,4b)"};
  stats.segments.rerank_segments = 6;
  stats.segments.rerank_segment_bytes = 60'000'000'000;  // past 2^32
  stats.segments.rerank_unflushed_bytes = 6001;
  stats.segments.code_segments = 7;
  stats.segments.code_segment_bytes = 7002;
  stats.segments.code_unflushed_bytes = 7003;
  stats.trainings_completed = 3;  // not on the wire
  v1::CollectionStats proto;
  StatsToProto(stats, &proto);
  const CollectionStats back = StatsFromProto(proto);
  EXPECT_EQ(back.documents, 5);
  EXPECT_EQ(back.original_tokens, 50);
  EXPECT_EQ(back.rerank_vectors, 25);
  EXPECT_EQ(back.candidate_vectors, 10);
  EXPECT_EQ(back.disk_bytes, 5000);
  EXPECT_EQ(back.resident_bytes, 700);
  EXPECT_EQ(back.candidate_bytes, 70);
  EXPECT_EQ(back.training_shards, 2);
  EXPECT_EQ(back.vectors_per_document, 5.0);
  EXPECT_EQ(back.disk_bytes_per_original_token, 100.0);
  EXPECT_EQ(back.disk_bytes_per_rerank_vector, 200.0);
  EXPECT_EQ(back.candidate_indexes, stats.candidate_indexes);
  EXPECT_EQ(back.segments.rerank_segments, 6);
  EXPECT_EQ(back.segments.rerank_segment_bytes, 60'000'000'000);
  EXPECT_EQ(back.segments.rerank_unflushed_bytes, 6001);
  EXPECT_EQ(back.segments.code_segments, 7);
  EXPECT_EQ(back.segments.code_segment_bytes, 7002);
  EXPECT_EQ(back.segments.code_unflushed_bytes, 7003);
  EXPECT_EQ(back.trainings_completed, 0);
  v1::CollectionStats again;
  StatsToProto(back, &again);
  EXPECT_EQ(again.SerializeAsString(), proto.SerializeAsString());
}

// A hit from a shard node keeps its attributes; a value with none set (which no node sends) is
// left out rather than read as an empty string.
TEST(Convert, ShardHitAttributesDecode) {
  v1::ShardSearchResponse proto;
  v1::Hit* hit = proto.mutable_search()->add_hits();
  hit->set_id("a");
  (*hit->mutable_attributes())["year"].set_int_value(2020);
  (*hit->mutable_attributes())["score"].set_double_value(0.5);
  (*hit->mutable_attributes())["lang"].set_string_value("en");
  (*hit->mutable_attributes())["unset"];
  const SearchResult result = SearchResultFromShardProto(&proto);
  ASSERT_EQ(result.hits.size(), 1u);
  EXPECT_EQ(result.hits[0].attributes,
            (Attributes{{"year", int64_t{2020}}, {"score", 0.5}, {"lang", std::string("en")}}));
}

}  // namespace
}  // namespace tessera::server
