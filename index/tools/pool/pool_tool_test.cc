#include "index/tools/pool/pool_tool.h"

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/npy.h"
#include "tessera/npz.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> Args(std::vector<std::string> flags) {
  flags.insert(flags.begin(), "tessera-pool");
  return flags;
}

TEST(PoolToolArgs, ParsesHierarchicalAndSpatialFlags) {
  auto config = ParsePoolToolArgs(
      Args({"--input", "a.npz", "--output", "b.npz", "--pool-factor", "3", "--method", "reference",
            "--protect", "1", "--renormalize", "--min-vectors", "24"}));
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->spec.hierarchical.has_value());
  EXPECT_EQ(config->spec.hierarchical->pool_factor, 3);
  EXPECT_EQ(config->spec.hierarchical->method, PoolingMethod::kReference);
  EXPECT_EQ(config->spec.hierarchical->protected_tokens, 1);
  EXPECT_EQ(config->spec.hierarchical->min_vectors, 24);
  EXPECT_TRUE(config->spec.hierarchical->renormalize);
  EXPECT_EQ(config->spec.hierarchical->max_merge_height, 0.0);  // reference: no limit by default
  EXPECT_FALSE(config->spec.spatial.has_value());

  config = ParsePoolToolArgs(Args({"--input", "a.npz", "--output", "b.npz"}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->spec.hierarchical->max_merge_height, kAdaptiveMergeHeight);  // ward
  config =
      ParsePoolToolArgs(Args({"--input", "a.npz", "--output", "b.npz", "--max-merge-height", "0"}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->spec.hierarchical->max_merge_height, 0.0);
  config = ParsePoolToolArgs(
      Args({"--input", "a.npz", "--output", "b.npz", "--max-merge-height", "-1"}));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()),
              HasSubstr("--max-merge-height '-1', expected a finite number ≥ 0"));

  config = ParsePoolToolArgs(Args({"--input", "a.npz", "--output", "b.npz", "--grid", "32x32",
                                   "--prefix", "6", "--suffix", "2", "--spatial", "tile:4x4"}));
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->layout.has_value());
  EXPECT_EQ(config->layout->rows, 32);
  EXPECT_EQ(config->layout->prefix_tokens, 6);
  EXPECT_EQ(config->layout->suffix_tokens, 2);
  ASSERT_TRUE(config->spec.spatial.has_value());
  EXPECT_EQ(config->spec.spatial->mode, SpatialMode::kTiles);
  EXPECT_FALSE(config->spec.hierarchical.has_value());
}

TEST(PoolToolArgs, RejectsBadFlagsNamingThem) {
  EXPECT_THAT(ParsePoolToolArgs(Args({"--output", "b.npz"})).status().message(),
              HasSubstr("--input is required"));
  EXPECT_THAT(
      ParsePoolToolArgs(Args({"--input", "a", "--output", "b", "--grid", "32"})).status().message(),
      HasSubstr("--grid '32'"));
  EXPECT_THAT(ParsePoolToolArgs(Args({"--input", "a", "--output", "b", "--spatial", "rows"}))
                  .status()
                  .message(),
              HasSubstr("needs --grid"));
  EXPECT_THAT(ParsePoolToolArgs(Args({"--input", "a", "--output", "b", "--pool-factor", "0"}))
                  .status()
                  .message(),
              HasSubstr("--pool-factor '0'"));
  EXPECT_THAT(
      ParsePoolToolArgs(Args({"--input", "a", "--output", "b", "--bogus"})).status().message(),
      HasSubstr("unknown argument '--bogus'"));
}

class PoolToolRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("pool_tool_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(PoolToolRunTest, PoolsEveryDocumentLikeTheLibrary) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> a(40 * 16), b(9 * 16);
  for (float& v : a) v = normal(rng);
  for (float& v : b) v = normal(rng);
  std::vector<Float16> b_half(b.size());
  FloatToHalf(b.data(), b.size(), b_half.data());
  HalfToFloat(b_half.data(), b_half.size(), b.data());  // what the tool will read
  const std::string input = (dir_ / "in.npz").string(), output = (dir_ / "out.npz").string();
  ASSERT_TRUE(WriteNpzFile(input, {{"doc-a", NpyArray::FromFloat32(40, 16, a.data())},
                                   {"doc-b", NpyArray::FromFloat16(9, 16, b_half.data())}})
                  .ok());
  auto config = ParsePoolToolArgs(
      Args({"--input", input, "--output", output, "--pool-factor", "3", "--threads", "2"}));
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(RunPoolTool(*config).ok());

  auto written = ReadNpzFile(output);
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_EQ(written->size(), 4u);
  EXPECT_EQ((*written)[0].first, "doc-a");
  EXPECT_EQ((*written)[1].first, "doc-a.labels");
  EXPECT_EQ((*written)[3].first, "doc-b.labels");
  TokenPoolingOptions options;  // the tool's default limit for ward, as a collection's
  options.pool_factor = 3;
  options.max_merge_height = kAdaptiveMergeHeight;
  const std::vector<float>* sources[] = {&a, &b};
  for (int d = 0; d < 2; ++d) {
    const std::vector<float>& source = *sources[d];
    auto expected = PoolTokens(
        FloatMatrixView{source.data(), static_cast<int64_t>(source.size()) / 16, 16}, options);
    ASSERT_TRUE(expected.ok());
    auto vectors = (*written)[2 * d].second.ToFloat32();
    ASSERT_TRUE(vectors.ok());
    EXPECT_EQ(*vectors, expected->vectors);
    auto labels = (*written)[2 * d + 1].second.ToInt64();
    ASSERT_TRUE(labels.ok());
    EXPECT_EQ(std::vector<int32_t>(labels->begin(), labels->end()), expected->labels);
  }
}

TEST_F(PoolToolRunTest, ReportsTheDocumentThatFails) {
  const std::string input = (dir_ / "in.npz").string(), output = (dir_ / "out.npz").string();
  const std::vector<float> tokens(12, 0.5f);
  ASSERT_TRUE(WriteNpzFile(input, {{"page-7", NpyArray::FromFloat32(12, 1, tokens.data())}}).ok());
  auto config = ParsePoolToolArgs(
      Args({"--input", input, "--output", output, "--grid", "3x3", "--spatial", "rows"}));
  ASSERT_TRUE(config.ok());
  const absl::Status status = RunPoolTool(*config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("document 'page-7'"));
  EXPECT_FALSE(std::filesystem::exists(output));
}

}  // namespace
}  // namespace tessera
