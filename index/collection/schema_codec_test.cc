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
  schema.pooling.hierarchical = TokenPoolingOptions{3, PoolingMethod::kReference, 1, true};
  SpatialPoolingOptions spatial;
  spatial.mode = SpatialMode::kRowWindows;
  spatial.window_rows = 4;
  spatial.window_stride = 2;
  spatial.keep_special_tokens = true;
  schema.pooling.spatial = spatial;
  schema.candidates = CandidateSpec{CandidateSpec::Kind::kGlobalMean, 5, "IVF64,PQ16"};
  schema.attributes = {{"year", AttributeType::kInt64}, {"lang", AttributeType::kString}};
  auto decoded = DecodeSchema(EncodeSchema(schema));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(EncodeSchema(*decoded), EncodeSchema(schema));
  EXPECT_EQ(decoded->name, "papers.v2");
  EXPECT_EQ(decoded->pooling.hierarchical->method, PoolingMethod::kReference);
  EXPECT_EQ(decoded->pooling.spatial->window_stride, 2);
  EXPECT_EQ(decoded->candidates.factory, "IVF64,PQ16");
  EXPECT_EQ(decoded->attributes.at("lang"), AttributeType::kString);
}

TEST(SchemaCodec, RejectsCorruptText) {
  EXPECT_EQ(DecodeSchema("garbage").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeSchema(std::string(kSchemaFormatLine) + "\ndim x\n").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeSchema(std::string(kSchemaFormatLine) + "\nhierarchical 2 median 0 0\n")
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace tessera::internal
