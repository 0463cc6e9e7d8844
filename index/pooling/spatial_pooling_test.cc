#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/pooling.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A 1-dimensional "embedding" whose value is the token index makes every mean easy to check.
std::vector<float> IndexTokens(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

FloatMatrixView View(const std::vector<float>& v) {
  return FloatMatrixView{v.data(), static_cast<int64_t>(v.size()), 1};
}

std::vector<int32_t> Members(const PooledMatrix& p, int v) {
  return std::vector<int32_t>(p.members.begin() + p.member_offsets[v],
                              p.members.begin() + p.member_offsets[v + 1]);
}

// Grid 3 × 4 after one prefix token and before one suffix token: patch (r, c) is token 1 + 4r + c.
const PatchGridLayout kLayout{3, 4, 1, 1};

TEST(SpatialPooling, RowsAndColumns) {
  const std::vector<float> tokens = IndexTokens(14);
  SpatialPoolingOptions options;
  options.mode = SpatialMode::kRows;
  auto rows = PoolPatchGrid(View(tokens), kLayout, options);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT(rows->vectors, ElementsAre(2.5f, 6.5f, 10.5f));
  EXPECT_THAT(Members(*rows, 1), ElementsAre(5, 6, 7, 8));
  EXPECT_THAT(rows->labels, ElementsAre(-1, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, -1));
  options.mode = SpatialMode::kColumns;
  auto cols = PoolPatchGrid(View(tokens), kLayout, options);
  ASSERT_TRUE(cols.ok());
  EXPECT_THAT(cols->vectors, ElementsAre(5.0f, 6.0f, 7.0f, 8.0f));
  EXPECT_THAT(Members(*cols, 0), ElementsAre(1, 5, 9));
}

TEST(SpatialPooling, TilesIncludingPartialEdgeTiles) {
  const std::vector<float> tokens = IndexTokens(14);
  SpatialPoolingOptions options;
  options.mode = SpatialMode::kTiles;
  options.tile_rows = 2;
  options.tile_cols = 3;
  auto tiles = PoolPatchGrid(View(tokens), kLayout, options);
  ASSERT_TRUE(tiles.ok());
  // Tiles: rows 0-1 × cols 0-2, rows 0-1 × col 3, row 2 × cols 0-2, row 2 × col 3.
  EXPECT_THAT(tiles->vectors, ElementsAre(4.0f, 6.0f, 10.0f, 12.0f));
  EXPECT_THAT(Members(*tiles, 1), ElementsAre(4, 8));
}

TEST(SpatialPooling, RowWindowsCoverTheLastRow) {
  const std::vector<float> tokens = IndexTokens(14);
  SpatialPoolingOptions options;
  options.mode = SpatialMode::kRowWindows;
  options.window_rows = 2;
  options.window_stride = 2;
  auto windows = PoolPatchGrid(View(tokens), kLayout, options);
  ASSERT_TRUE(windows.ok());
  // Windows rows 0-1 and, to cover row 2, rows 1-2.
  EXPECT_THAT(windows->vectors, ElementsAre(4.5f, 8.5f));
  // Row 1 belongs to both windows; its label is the first.
  EXPECT_EQ(windows->labels[5], 0);
  EXPECT_EQ(windows->labels[9], 1);
  options.window_stride = 1;
  windows = PoolPatchGrid(View(tokens), kLayout, options);
  ASSERT_TRUE(windows.ok());
  EXPECT_EQ(windows->num_vectors(), 2);
}

TEST(SpatialPooling, GlobalWithSpecialTokensKept) {
  const std::vector<float> tokens = IndexTokens(14);
  SpatialPoolingOptions options;
  options.mode = SpatialMode::kGlobal;
  options.keep_special_tokens = true;
  auto pooled = PoolPatchGrid(View(tokens), kLayout, options);
  ASSERT_TRUE(pooled.ok());
  EXPECT_THAT(pooled->vectors, ElementsAre(0.0f, 6.5f, 13.0f));
  EXPECT_EQ(pooled->labels.front(), 0);
  EXPECT_EQ(pooled->labels.back(), 2);
}

TEST(SpatialPooling, RenormalizesGridMeansOnly) {
  // dim 2: prefix token (3, 4) must stay as it is; the row means get unit length.
  const std::vector<float> tokens = {3, 4, 1, 0, 0, 1, 2, 0, 0, 2};
  SpatialPoolingOptions options;
  options.keep_special_tokens = true;
  options.renormalize = true;
  auto pooled =
      PoolPatchGrid(FloatMatrixView{tokens.data(), 5, 2}, PatchGridLayout{2, 2, 1, 0}, options);
  ASSERT_TRUE(pooled.ok());
  EXPECT_FLOAT_EQ(pooled->vectors[0], 3.0f);
  EXPECT_FLOAT_EQ(pooled->vectors[2], std::sqrt(0.5f));
  EXPECT_FLOAT_EQ(pooled->vectors[5], std::sqrt(0.5f));
}

TEST(SpatialPooling, RejectsMismatchedGridAndBadOptions) {
  const std::vector<float> tokens = IndexTokens(14);
  auto status = PoolPatchGrid(View(tokens), PatchGridLayout{3, 3, 1, 1}, {}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("= 11 tokens, but the document has 14"));
  SpatialPoolingOptions options;
  options.mode = SpatialMode::kTiles;
  options.tile_cols = 0;
  EXPECT_EQ(PoolPatchGrid(View(tokens), kLayout, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(PoolPatchGrid(View(tokens), PatchGridLayout{0, 12, 1, 1}, {}).ok());
}

TEST(SpatialPooling, ParsesModes) {
  SpatialPoolingOptions options;
  ASSERT_TRUE(ParseSpatialMode("tile:2x3", &options).ok());
  EXPECT_EQ(options.mode, SpatialMode::kTiles);
  EXPECT_EQ(options.tile_rows, 2);
  EXPECT_EQ(options.tile_cols, 3);
  ASSERT_TRUE(ParseSpatialMode("window:4:2", &options).ok());
  EXPECT_EQ(options.mode, SpatialMode::kRowWindows);
  EXPECT_EQ(options.window_rows, 4);
  EXPECT_EQ(options.window_stride, 2);
  ASSERT_TRUE(ParseSpatialMode("cols", &options).ok());
  EXPECT_EQ(options.mode, SpatialMode::kColumns);
  EXPECT_FALSE(ParseSpatialMode("tile:2", &options).ok());
  EXPECT_FALSE(ParseSpatialMode("window:0:1", &options).ok());
  EXPECT_THAT(ParseSpatialMode("diagonal", &options).message(), HasSubstr("'diagonal'"));
}

}  // namespace
}  // namespace tessera
