// Engine-level schema checks that keep a write from failing after it is durable.
#include "tessera/engine.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/collection/collection_test_util.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

CollectionSchema WithFactory(const std::string& factory) {
  CollectionSchema schema;
  schema.name = "ivf";
  schema.dim = 8;
  schema.candidates.factory = factory;
  return schema;
}

// The candidate index trains an IVF index on its first 50,000 vectors, after the write that
// brings it there is durable: with more lists than that, FAISS's k-means refuses
// (FAILED_PRECONDITION "nx >= k"), which failed that write after the fact and every later open of
// the collection.
TEST(ValidateSchema, RejectsMoreCentroidsThanTrainingVectors) {
  for (const std::string factory : {"IVF65536,Flat", "IVF100000,PQ4", "IVF65536_HNSW32,Flat"}) {
    const absl::Status status = ValidateSchema(WithFactory(factory));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << factory << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(factory));
    EXPECT_THAT(status.message(), HasSubstr("50000"));
  }
  for (const std::string factory : {"IVF16,Flat", "IVF1024,PQ4", "IVF50000,Flat", "HNSW32"}) {
    EXPECT_TRUE(ValidateSchema(WithFactory(factory)).ok()) << factory;
  }
  TempDir dir;
  auto engine = Engine::Open(dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->CreateCollection(WithFactory("IVF65536,Flat")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*engine)->ListCollections().empty());
}

}  // namespace
}  // namespace tessera
