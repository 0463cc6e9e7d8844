#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/pooling.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;

std::vector<int32_t> Members(const PooledMatrix& p, int v) {
  return std::vector<int32_t>(p.members.begin() + p.member_offsets[v],
                              p.members.begin() + p.member_offsets[v + 1]);
}

TEST(PoolDocument, SpatialThenHierarchicalRefersToOriginalTokens) {
  // Rows of a 4 × 2 grid, dim 2: rows 0 and 1 point one way, rows 2 and 3 another.
  const std::vector<float> tokens = {1, 0, 1, 0.1f, 1, 0, 1, 0.1f, 0, 1, 0.1f, 1, 0, 1, 0.1f, 1};
  PoolingSpec spec;
  spec.spatial = SpatialPoolingOptions{};
  spec.hierarchical = TokenPoolingOptions{};
  auto pooled =
      PoolDocument(FloatMatrixView{tokens.data(), 8, 2}, PatchGridLayout{4, 2, 0, 0}, spec);
  ASSERT_TRUE(pooled.ok()) << pooled.status();
  ASSERT_EQ(pooled->num_vectors(), 2);
  EXPECT_THAT(Members(*pooled, 0), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(Members(*pooled, 1), ElementsAre(4, 5, 6, 7));
  EXPECT_THAT(pooled->labels, ElementsAre(0, 0, 0, 0, 1, 1, 1, 1));
  EXPECT_FALSE(PoolDocument(FloatMatrixView{tokens.data(), 8, 2}, std::nullopt, spec).ok());
}

}  // namespace
}  // namespace tessera
