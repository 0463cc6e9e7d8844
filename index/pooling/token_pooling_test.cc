#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/pooling.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

std::vector<float> Normalized(std::vector<float> v, int dim) {
  for (size_t r = 0; r < v.size() / dim; ++r) {
    double s = 0;
    for (int k = 0; k < dim; ++k) s += v[r * dim + k] * v[r * dim + k];
    for (int k = 0; k < dim; ++k) v[r * dim + k] /= std::sqrt(s);
  }
  return v;
}

// `groups` well-separated topics, each with `per_group` near-duplicate tokens, rows shuffled.
std::vector<float> TopicTokens(int groups, int per_group, int dim, std::mt19937& rng,
                               std::vector<int>* topic_of_row) {
  std::normal_distribution<float> normal;
  std::vector<float> centers(groups * dim);
  for (float& v : centers) v = normal(rng);
  centers = Normalized(centers, dim);
  std::vector<int> order(groups * per_group);
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i) / per_group;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<float> tokens(order.size() * dim);
  for (size_t r = 0; r < order.size(); ++r)
    for (int k = 0; k < dim; ++k)
      tokens[r * dim + k] = centers[order[r] * dim + k] + 0.01f * normal(rng);
  *topic_of_row = order;
  return Normalized(tokens, dim);
}

FloatMatrixView View(const std::vector<float>& v, int dim) {
  return FloatMatrixView{v.data(), static_cast<int64_t>(v.size()) / dim, dim};
}

class TokenPoolingMethodTest : public ::testing::TestWithParam<PoolingMethod> {};

TEST_P(TokenPoolingMethodTest, RecoversNearDuplicateTopics) {
  std::mt19937 rng(5);
  const int dim = 32, groups = 8, per_group = 4;
  std::vector<int> topic;
  const std::vector<float> tokens = TopicTokens(groups, per_group, dim, rng, &topic);
  TokenPoolingOptions options;
  options.pool_factor = per_group;
  options.method = GetParam();
  auto pooled = PoolTokens(View(tokens, dim), options);
  ASSERT_TRUE(pooled.ok()) << pooled.status();
  ASSERT_EQ(pooled->num_vectors(), groups);
  // Same topic ⇔ same cluster.
  for (size_t i = 0; i < topic.size(); ++i)
    for (size_t j = 0; j < topic.size(); ++j)
      EXPECT_EQ(topic[i] == topic[j], pooled->labels[i] == pooled->labels[j]) << i << " " << j;
  // Each vector is the mean of its members.
  for (int64_t v = 0; v < pooled->num_vectors(); ++v) {
    std::vector<double> mean(dim, 0.0);
    const int begin = pooled->member_offsets[v], end = pooled->member_offsets[v + 1];
    for (int m = begin; m < end; ++m) {
      EXPECT_EQ(pooled->labels[pooled->members[m]], v);
      for (int k = 0; k < dim; ++k) mean[k] += tokens[pooled->members[m] * dim + k];
    }
    for (int k = 0; k < dim; ++k)
      EXPECT_NEAR(pooled->vectors[v * dim + k], mean[k] / (end - begin), 1e-6);
  }
}

TEST_P(TokenPoolingMethodTest, KeepsFloorNOverPClustersWithoutTies) {
  std::mt19937 rng(6);
  std::normal_distribution<float> normal;
  for (int n : {2, 3, 5, 17, 64, 129}) {
    for (int p : {2, 3, 4}) {
      std::vector<float> tokens(n * 16);
      for (float& v : tokens) v = normal(rng);
      tokens = Normalized(tokens, 16);
      TokenPoolingOptions options;
      options.pool_factor = p;
      options.method = GetParam();
      auto pooled = PoolTokens(View(tokens, 16), options);
      ASSERT_TRUE(pooled.ok()) << pooled.status();
      EXPECT_EQ(pooled->num_vectors(), std::max(n / p, 1)) << "n " << n << " p " << p;
      EXPECT_EQ(pooled->labels.size(), static_cast<size_t>(n));
      // Labels are numbered by first appearance.
      int next = 0;
      for (int32_t label : pooled->labels) {
        EXPECT_LE(label, next);
        if (label == next) ++next;
      }
    }
  }
}

TEST_P(TokenPoolingMethodTest, DeterministicBitForBit) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> tokens(200 * 64);
  for (float& v : tokens) v = normal(rng);
  TokenPoolingOptions options;
  options.method = GetParam();
  auto a = PoolTokens(View(tokens, 64), options);
  auto b = PoolTokens(View(tokens, 64), options);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->labels, b->labels);
  EXPECT_EQ(0, std::memcmp(a->vectors.data(), b->vectors.data(), a->vectors.size() * 4));
}

INSTANTIATE_TEST_SUITE_P(Methods, TokenPoolingMethodTest,
                         ::testing::Values(PoolingMethod::kWard, PoolingMethod::kReference));

TEST(TokenPooling, ProtectedTokensComeFirstUnchanged) {
  std::mt19937 rng(8);
  std::vector<int> topic;
  const int dim = 8;
  std::vector<float> tokens = TopicTokens(3, 4, dim, rng, &topic);
  TokenPoolingOptions options;
  options.pool_factor = 4;
  options.protected_tokens = 2;
  options.renormalize = true;
  // Scale the protected rows so that renormalising them would be visible.
  for (int k = 0; k < 2 * dim; ++k) tokens[k] *= 3.0f;
  auto pooled = PoolTokens(View(tokens, dim), options);
  ASSERT_TRUE(pooled.ok()) << pooled.status();
  ASSERT_EQ(pooled->num_vectors(), 2 + std::max(10 / 4, 1));
  for (int k = 0; k < 2 * dim; ++k) EXPECT_EQ(pooled->vectors[k], tokens[k]);
  EXPECT_EQ(pooled->labels[0], 0);
  EXPECT_EQ(pooled->labels[1], 1);
  for (int64_t v = 2; v < pooled->num_vectors(); ++v) {
    double s = 0;
    for (int k = 0; k < dim; ++k) s += pooled->vectors[v * dim + k] * pooled->vectors[v * dim + k];
    EXPECT_NEAR(s, 1.0, 1e-6);
  }
}

TEST(TokenPooling, PoolFactorOneKeepsEveryToken) {
  const std::vector<float> tokens = {1, 0, 0, 1, 1, 0};
  TokenPoolingOptions options;
  options.pool_factor = 1;
  auto pooled = PoolTokens(View(tokens, 2), options);
  ASSERT_TRUE(pooled.ok());
  EXPECT_EQ(pooled->vectors, tokens);
  EXPECT_EQ(pooled->labels, (std::vector<int32_t>{0, 1, 2}));
}

// The floor keeps short documents unpooled and cuts medium ones at min_vectors clusters of the same
// Ward tree: the n / p partition without the floor must be a coarsening of the floored one.
TEST(TokenPooling, MinVectorsFloorsTheClusterCount) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const int dim = 16;
  auto random_tokens = [&](int n) {
    std::vector<float> tokens(n * dim);
    for (float& v : tokens) v = normal(rng);
    return Normalized(tokens, dim);
  };
  TokenPoolingOptions floored;
  floored.pool_factor = 2;
  floored.min_vectors = 32;

  const std::vector<float> short_doc = random_tokens(30);
  auto pooled = PoolTokens(View(short_doc, dim), floored);
  ASSERT_TRUE(pooled.ok()) << pooled.status();
  EXPECT_EQ(pooled->vectors, short_doc);

  const std::vector<float> medium = random_tokens(40);
  pooled = PoolTokens(View(medium, dim), floored);
  TokenPoolingOptions plain = floored;
  plain.min_vectors = 0;
  auto coarse = PoolTokens(View(medium, dim), plain);
  ASSERT_TRUE(pooled.ok() && coarse.ok());
  EXPECT_EQ(pooled->num_vectors(), 32);
  EXPECT_EQ(coarse->num_vectors(), 20);
  std::vector<int32_t> coarse_of_fine(32, -1);
  for (size_t i = 0; i < pooled->labels.size(); ++i) {
    int32_t& mapped = coarse_of_fine[pooled->labels[i]];
    if (mapped == -1) mapped = coarse->labels[i];
    EXPECT_EQ(mapped, coarse->labels[i]) << "token " << i << " splits a coarse cluster";
  }

  const std::vector<float> long_doc = random_tokens(100);
  pooled = PoolTokens(View(long_doc, dim), floored);
  coarse = PoolTokens(View(long_doc, dim), plain);
  ASSERT_TRUE(pooled.ok() && coarse.ok());
  EXPECT_EQ(pooled->labels, coarse->labels);  // n / p = 50 ≥ 32: the floor changes nothing

  floored.min_vectors = -1;
  EXPECT_THAT(PoolTokens(View(medium, dim), floored).status().message(),
              HasSubstr("min_vectors -1"));
}

// Every cluster of `labels` (numbered 0, 1, …) lies within one group of `groups` (one entry per
// token, like labels).
void ExpectEachClusterWithin(const std::vector<int32_t>& labels, const std::vector<int>& groups,
                             const std::string& what) {
  ASSERT_EQ(labels.size(), groups.size());
  std::vector<int> group_of_cluster(labels.size(), -1);
  for (size_t i = 0; i < labels.size(); ++i) {
    int& group = group_of_cluster[labels[i]];
    if (group == -1) group = groups[i];
    EXPECT_EQ(group, groups[i]) << "token " << i << "'s cluster spans more than one " << what;
  }
}

// A merge-height limit stops the n / p cut before it merges distant tokens: 8 topics of 4
// near-duplicates pooled by 8 would be cut into 4 clusters, so every cluster would mix two topics;
// with the limit, the near-duplicates merge (heights ~0.01) and the topics (cosine distance ~1
// apart) do not: exactly one cluster per topic.
TEST(TokenPooling, MaxMergeHeightKeepsDistantTokensApart) {
  std::mt19937 rng(17);
  const int dim = 32, groups = 8, per_group = 4;
  std::vector<int> topic;
  const std::vector<float> tokens = TopicTokens(groups, per_group, dim, rng, &topic);
  TokenPoolingOptions options;
  options.pool_factor = 8;
  auto plain = PoolTokens(View(tokens, dim), options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->num_vectors(), 4);

  options.max_merge_height = 0.3;
  auto limited = PoolTokens(View(tokens, dim), options);
  ASSERT_TRUE(limited.ok()) << limited.status();
  ASSERT_EQ(limited->num_vectors(), groups);
  ExpectEachClusterWithin(limited->labels, topic, "topic");
  // The limit only stops merges early on the same tree: each limited cluster lies within one
  // plain cluster, and a limit above every height changes nothing.
  ExpectEachClusterWithin(limited->labels, plain->labels, "plain cluster");
  options.max_merge_height = 1e9;
  auto unlimited = PoolTokens(View(tokens, dim), options);
  ASSERT_TRUE(unlimited.ok());
  EXPECT_EQ(unlimited->labels, plain->labels);
  EXPECT_EQ(unlimited->vectors, plain->vectors);

  for (double bad :
       {-0.1, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    options.max_merge_height = bad;
    EXPECT_THAT(PoolTokens(View(tokens, dim), options).status().message(),
                HasSubstr("max_merge_height"));
  }
}

TEST(TokenPooling, SingleTokenAndAllProtected) {
  const std::vector<float> one = {0.6f, 0.8f};
  auto pooled = PoolTokens(View(one, 2), TokenPoolingOptions{});
  ASSERT_TRUE(pooled.ok());
  EXPECT_EQ(pooled->vectors, one);
  TokenPoolingOptions options;
  options.protected_tokens = 5;
  const std::vector<float> two = {1, 0, 0, 1};
  pooled = PoolTokens(View(two, 2), options);
  ASSERT_TRUE(pooled.ok());
  EXPECT_EQ(pooled->vectors, two);
}

TEST(TokenPooling, RejectsInvalidInput) {
  const std::vector<float> ok = {1, 0, 0, 1};
  TokenPoolingOptions options;
  auto status = PoolTokens(FloatMatrixView{ok.data(), 0, 2}, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("num_tokens 0"));
  status = PoolTokens(FloatMatrixView{ok.data(), 2, 0}, options).status();
  EXPECT_THAT(status.message(), HasSubstr("dim 0"));
  std::vector<float> bad = ok;
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  status = PoolTokens(View(bad, 2), options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("token 1, dimension 1 is not finite"));
  bad[3] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(PoolTokens(View(bad, 2), options).ok());
  options.pool_factor = 0;
  status = PoolTokens(View(ok, 2), options).status();
  EXPECT_THAT(status.message(), HasSubstr("pool_factor 0"));
  options.pool_factor = 2;
  options.protected_tokens = -1;
  EXPECT_EQ(PoolTokens(View(ok, 2), options).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<float> huge((kMaxHierarchicalPoolingTokens + 1) * 2, 0.5f);
  options.protected_tokens = 0;
  status = PoolTokens(View(huge, 2), options).status();
  EXPECT_THAT(status.message(), HasSubstr("exceeds the hierarchical pooling limit"));
}

TEST(TokenPooling, ParsesMethodNames) {
  EXPECT_EQ(*ParsePoolingMethod("ward"), PoolingMethod::kWard);
  EXPECT_EQ(*ParsePoolingMethod("reference"), PoolingMethod::kReference);
  EXPECT_THAT(ParsePoolingMethod("average").status().message(), HasSubstr("'average'"));
}

}  // namespace
}  // namespace tessera
