#include "index/collection/schema_codec.h"

#include "gtest/gtest.h"

namespace tessera::internal {
namespace {

TEST(SchemaCodec, RoundTripsEveryField) {
  CollectionSchema schema;
  schema.name = "papers.v2";
  schema.dim = 96;
  schema.dtype = VectorDtype::kFloat32;
  schema.num_shards = 3;
  // A height with no short decimal form: the text keeps every bit of it.
  schema.pooling.hierarchical =
      TokenPoolingOptions{3, PoolingMethod::kReference, 1, true, 24, 0.1 + 0.2};
  SpatialPoolingOptions spatial;
  spatial.mode = SpatialMode::kRowWindows;
  spatial.window_rows = 4;
  spatial.window_stride = 2;
  spatial.keep_special_tokens = true;
  schema.pooling.spatial = spatial;
  schema.candidates = CandidateSpec{CandidateSpec::Kind::kGlobalMean, 5, "IVF64,PQ16"};
  schema.candidates.rerank_from_codes = true;
  schema.attributes = {{"year", AttributeType::kInt64}, {"lang", AttributeType::kString}};
  auto decoded = DecodeSchema(EncodeSchema(schema));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(EncodeSchema(*decoded), EncodeSchema(schema));
  EXPECT_EQ(decoded->name, "papers.v2");
  EXPECT_EQ(decoded->pooling.hierarchical->method, PoolingMethod::kReference);
  EXPECT_EQ(decoded->pooling.hierarchical->min_vectors, 24);
  EXPECT_EQ(decoded->pooling.hierarchical->max_merge_height, 0.1 + 0.2);
  EXPECT_EQ(decoded->pooling.spatial->window_stride, 2);
  EXPECT_EQ(decoded->candidates.factory, "IVF64,PQ16");
  EXPECT_TRUE(decoded->candidates.rerank_from_codes);
  EXPECT_EQ(decoded->attributes.at("lang"), AttributeType::kString);
}

// A sparse field round-trips with every bit of k1 and b; a schema without one encodes with no
// sparse line (as schemas did before sparse fields existed) and decodes without one.
TEST(SchemaCodec, SparseFieldRoundTripsAndIsAbsentFromOldSchemas) {
  CollectionSchema schema;
  schema.name = "hybrid";
  schema.dim = 8;
  const std::string old = EncodeSchema(schema);
  EXPECT_EQ(old.find("sparse"), std::string::npos);
  auto decoded = DecodeSchema(old);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_FALSE(decoded->sparse.has_value());
  schema.sparse = SparseScoring{false, 0.1 + 0.2, 0.3};
  decoded = DecodeSchema(EncodeSchema(schema));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_TRUE(decoded->sparse.has_value());
  EXPECT_FALSE(decoded->sparse->idf);
  EXPECT_EQ(decoded->sparse->k1, 0.1 + 0.2);
  EXPECT_EQ(decoded->sparse->b, 0.3);
  EXPECT_EQ(EncodeSchema(*decoded), EncodeSchema(schema));
}

// Schemas stored before min_vectors, or before max_merge_height, existed keep pooling as they
// did: no floor and no height limit, not today's defaults.
TEST(SchemaCodec, OlderHierarchicalLinesKeepTheirPooling) {
  const std::string header = std::string(kSchemaFormatLine) + "\nname a\ndim 8\n";
  auto decoded = DecodeSchema(header + "hierarchical 2 ward 0 0\n");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->pooling.hierarchical->pool_factor, 2);
  EXPECT_EQ(decoded->pooling.hierarchical->min_vectors, 0);
  EXPECT_EQ(decoded->pooling.hierarchical->max_merge_height, 0.0);
  decoded = DecodeSchema(header + "hierarchical 2 ward 0 0 16\n");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->pooling.hierarchical->min_vectors, 16);
  EXPECT_EQ(decoded->pooling.hierarchical->max_merge_height, 0.0);
}

TEST(SchemaCodec, RejectsCorruptText) {
  EXPECT_EQ(DecodeSchema("garbage").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeSchema(std::string(kSchemaFormatLine) + "\ndim x\n").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeSchema(std::string(kSchemaFormatLine) + "\nhierarchical 2 median 0 0\n")
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeSchema(std::string(kSchemaFormatLine) + "\nhierarchical 2 ward 0 0 0 high\n")
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace tessera::internal
