#include "tessera/fusion.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using Hits = std::vector<FusionHit<uint64_t>>;

std::vector<uint64_t> Ids(const Hits& hits) {
  std::vector<uint64_t> ids;
  for (const auto& hit : hits) ids.push_back(hit.id);
  return ids;
}

TEST(Fusion, ReciprocalRankFusionSumsWeightedReciprocalRanks) {
  const Hits dense = {{1, 0.9f}, {2, 0.8f}, {3, 0.1f}};
  const Hits sparse = {{3, 12.0f}, {1, 4.0f}};
  std::vector<FusionLane<uint64_t>> lanes = {{dense, 1.0}, {sparse, 1.0}};
  auto fused = ReciprocalRankFusion<uint64_t>(lanes, 10);
  ASSERT_TRUE(fused.ok()) << fused.status();
  // 1: 1/61 + 1/62, 3: 1/63 + 1/61, 2: 1/62.
  EXPECT_THAT(Ids(*fused), ::testing::ElementsAre(1, 3, 2));
  EXPECT_FLOAT_EQ((*fused)[0].score, 1.0 / 61 + 1.0 / 62);
  EXPECT_FLOAT_EQ((*fused)[1].score, 1.0 / 63 + 1.0 / 61);
  EXPECT_FLOAT_EQ((*fused)[2].score, 1.0 / 62);

  // Weighting the sparse lane 3× puts 3 first; k = 1 changes the scale.
  lanes[1].weight = 3.0;
  fused = ReciprocalRankFusion<uint64_t>(lanes, 2, /*k=*/1);
  ASSERT_TRUE(fused.ok());
  EXPECT_THAT(Ids(*fused), ::testing::ElementsAre(3, 1));
  EXPECT_FLOAT_EQ((*fused)[0].score, 1.0 / 4 + 3.0 / 2);
  EXPECT_FLOAT_EQ((*fused)[1].score, 1.0 / 2 + 3.0 / 3);
}

TEST(Fusion, TiesGoToTheLowerId) {
  const Hits a = {{9, 1.0f}};
  const Hits b = {{4, 1.0f}};
  const std::vector<FusionLane<uint64_t>> lanes = {{a, 1.0}, {b, 1.0}};
  EXPECT_THAT(Ids(*ReciprocalRankFusion<uint64_t>(lanes, 10)), ::testing::ElementsAre(4, 9));
  EXPECT_THAT(Ids(*NormalizedScoreFusion<uint64_t>(lanes, 10)), ::testing::ElementsAre(4, 9));

  const std::vector<FusionHit<std::string>> x = {{"b", 2.0f}}, y = {{"a", 7.0f}};
  const std::vector<FusionLane<std::string>> named = {{x, 1.0}, {y, 1.0}};
  auto fused = ReciprocalRankFusion<std::string>(named, 10);
  ASSERT_TRUE(fused.ok());
  ASSERT_EQ(fused->size(), 2u);
  EXPECT_EQ((*fused)[0].id, "a");
  EXPECT_EQ((*fused)[1].id, "b");
}

TEST(Fusion, NormalizedScoreFusionMinMaxPerLane) {
  const Hits dense = {{1, 10.0f}, {2, 5.0f}, {3, 0.0f}};  // → 1, 0.5, 0
  const Hits sparse = {{3, 2.0f}, {1, 1.0f}};             // → 1, 0
  std::vector<FusionLane<uint64_t>> lanes = {{dense, 1.0}, {sparse, 1.0}};
  auto fused = NormalizedScoreFusion<uint64_t>(lanes, 10);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_THAT(Ids(*fused), ::testing::ElementsAre(1, 3, 2));  // 1 and 3 tie at 1
  EXPECT_FLOAT_EQ((*fused)[0].score, 1.0f);
  EXPECT_FLOAT_EQ((*fused)[1].score, 1.0f);
  EXPECT_FLOAT_EQ((*fused)[2].score, 0.5f);

  lanes[0].weight = 0.25;
  lanes[1].weight = 0.75;
  fused = NormalizedScoreFusion<uint64_t>(lanes, 10);
  EXPECT_THAT(Ids(*fused), ::testing::ElementsAre(3, 1, 2));
  EXPECT_FLOAT_EQ((*fused)[0].score, 0.75f);
  EXPECT_FLOAT_EQ((*fused)[1].score, 0.25f);
  EXPECT_FLOAT_EQ((*fused)[2].score, 0.125f);

  // A lane whose hits all score the same maps them to 1; an empty lane adds nothing.
  const Hits flat = {{5, 3.0f}, {6, 3.0f}};
  const Hits none;
  const std::vector<FusionLane<uint64_t>> odd = {{flat, 2.0}, {none, 1.0}};
  fused = NormalizedScoreFusion<uint64_t>(odd, 1);
  ASSERT_EQ(fused->size(), 1u);
  EXPECT_EQ((*fused)[0].id, 5u);
  EXPECT_FLOAT_EQ((*fused)[0].score, 2.0f);
}

TEST(Fusion, RejectsBadInputNamingTheField) {
  const Hits twice = {{1, 1.0f}, {1, 0.5f}};
  const Hits nan = {{1, std::numeric_limits<float>::quiet_NaN()}};
  const Hits fine = {{1, 1.0f}};
  auto status = ReciprocalRankFusion<uint64_t>(
                    std::vector<FusionLane<uint64_t>>{{fine, 1.0}, {twice, 1.0}}, 10)
                    .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("lanes[1] holds id 1 twice"));
  status =
      NormalizedScoreFusion<uint64_t>(std::vector<FusionLane<uint64_t>>{{nan, 1.0}}, 10).status();
  EXPECT_THAT(status.message(), HasSubstr("lanes[0].hits[0].score = nan"));
  status =
      ReciprocalRankFusion<uint64_t>(std::vector<FusionLane<uint64_t>>{{fine, -1.0}}, 10).status();
  EXPECT_THAT(status.message(), HasSubstr("lanes[0].weight = -1; expected a finite weight >= 0"));
  status =
      ReciprocalRankFusion<uint64_t>(std::vector<FusionLane<uint64_t>>{{fine, 1.0}}, -2).status();
  EXPECT_THAT(status.message(), HasSubstr("limit = -2"));
  status = ReciprocalRankFusion<uint64_t>(std::vector<FusionLane<uint64_t>>{{fine, 1.0}}, 10,
                                          std::nan(""))
               .status();
  EXPECT_THAT(status.message(), HasSubstr("rrf k = nan"));
}

}  // namespace
}  // namespace tessera
