#include "index/pooling/ward_linkage.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::internal {
namespace {

using ::testing::ElementsAre;

struct Points {
  int n = 0;
  int dim = 0;
  std::vector<double> x;  // n × dim
};

Points RandomPoints(int n, int dim, std::mt19937& rng) {
  std::normal_distribution<double> normal;
  Points p{n, dim, std::vector<double>(n * dim)};
  for (double& v : p.x) v = normal(rng);
  return p;
}

std::vector<double> EuclideanMatrix(const Points& p) {
  std::vector<double> d(p.n * p.n, 0.0);
  for (int i = 0; i < p.n; ++i) {
    for (int j = 0; j < p.n; ++j) {
      double s = 0;
      for (int k = 0; k < p.dim; ++k) {
        const double diff = p.x[i * p.dim + k] - p.x[j * p.dim + k];
        s += diff * diff;
      }
      d[i * p.n + j] = std::sqrt(s);
    }
  }
  return d;
}

// Independent reference: textbook greedy Ward on Euclidean points, recomputing every cluster
// distance from centroids (SciPy's convention: sqrt(2·|A||B| / (|A|+|B|)) · ‖μA − μB‖).
std::vector<double> GreedyWardHeights(const Points& p, std::vector<std::vector<int>>* partitions) {
  std::vector<std::vector<int>> clusters;
  for (int i = 0; i < p.n; ++i) clusters.push_back({i});
  auto centroid = [&p](const std::vector<int>& c) {
    std::vector<double> mu(p.dim, 0.0);
    for (int i : c)
      for (int k = 0; k < p.dim; ++k) mu[k] += p.x[i * p.dim + k] / c.size();
    return mu;
  };
  std::vector<double> heights;
  while (clusters.size() > 1) {
    double best = INFINITY;
    size_t bi = 0, bj = 0;
    for (size_t i = 0; i < clusters.size(); ++i) {
      for (size_t j = i + 1; j < clusters.size(); ++j) {
        const auto a = centroid(clusters[i]), b = centroid(clusters[j]);
        double s = 0;
        for (int k = 0; k < p.dim; ++k) s += (a[k] - b[k]) * (a[k] - b[k]);
        const double na = clusters[i].size(), nb = clusters[j].size();
        const double d = std::sqrt(2.0 * na * nb / (na + nb) * s);
        if (d < best) best = d, bi = i, bj = j;
      }
    }
    heights.push_back(best);
    clusters[bi].insert(clusters[bi].end(), clusters[bj].begin(), clusters[bj].end());
    clusters.erase(clusters.begin() + bj);
    if (partitions) {
      std::vector<int> labels(p.n);
      for (size_t c = 0; c < clusters.size(); ++c)
        for (int i : clusters[c]) labels[i] = static_cast<int>(c);
      // Store as canonical first-appearance labels for comparison.
      std::vector<int> canon(p.n), map(p.n, -1);
      int next = 0;
      for (int i = 0; i < p.n; ++i) {
        if (map[labels[i]] < 0) map[labels[i]] = next++;
        canon[i] = map[labels[i]];
      }
      partitions->push_back(canon);
    }
  }
  return heights;
}

TEST(WardLinkage, HeightsMatchGreedyCentroidWard) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 40; ++trial) {
    const Points p = RandomPoints(2 + trial % 23, 1 + trial % 7, rng);
    std::vector<double> d = EuclideanMatrix(p);
    const std::vector<WardMerge> merges = WardLinkage(d, p.n);
    const std::vector<double> expected = GreedyWardHeights(p, nullptr);
    ASSERT_EQ(merges.size(), expected.size());
    for (size_t m = 0; m < merges.size(); ++m) {
      EXPECT_NEAR(merges[m].height, expected[m], 1e-9 * (1 + expected[m])) << trial << " " << m;
    }
  }
}

TEST(WardLinkage, CutMatchesGreedyPartitionsAtEveryLevel) {
  std::mt19937 rng(2);
  for (int trial = 0; trial < 30; ++trial) {
    const Points p = RandomPoints(3 + trial % 20, 4, rng);
    std::vector<double> d = EuclideanMatrix(p);
    const std::vector<WardMerge> merges = WardLinkage(d, p.n);
    std::vector<std::vector<int>> partitions;  // partitions[m]: after m + 1 merges
    GreedyWardHeights(p, &partitions);
    // SciPy's binary search never cuts below the second merge, so start at n − 2 clusters.
    for (int clusters = 1; clusters <= p.n - 2; ++clusters) {
      const std::vector<int32_t> labels = CutAtMaxClusters(merges, p.n, clusters);
      const std::vector<int>& expected = partitions[p.n - clusters - 1];
      EXPECT_EQ(std::vector<int>(labels.begin(), labels.end()), expected)
          << "trial " << trial << " clusters " << clusters;
    }
    // CutAfterMerges reaches every level, n − 1 clusters included.
    for (int clusters = 1; clusters <= p.n - 1; ++clusters) {
      const std::vector<int32_t> labels = CutAfterMerges(merges, p.n, p.n - clusters);
      const std::vector<int>& expected = partitions[p.n - clusters - 1];
      EXPECT_EQ(std::vector<int>(labels.begin(), labels.end()), expected)
          << "trial " << trial << " clusters " << clusters << " (CutAfterMerges)";
    }
  }
}

TEST(WardLinkage, MergesAreSortedByHeightAndTwoPointCase) {
  std::vector<double> d = {0, 3, 3, 0};
  const std::vector<WardMerge> merges = WardLinkage(d, 2);
  ASSERT_EQ(merges.size(), 1u);
  EXPECT_EQ(merges[0].a, 0);
  EXPECT_EQ(merges[0].b, 1);
  EXPECT_EQ(merges[0].height, 3.0);
  EXPECT_THAT(CutAtMaxClusters(merges, 2, 1), ElementsAre(0, 0));
  EXPECT_THAT(CutAtMaxClusters(merges, 2, 2), ElementsAre(0, 1));
}

// Points 0, 1, 10, 11 on a line: the two pairs merge at the same height 1, so asking for at most 3
// clusters yields 2, as SciPy's maxclust does.
TEST(WardLinkage, TiedHeightsCanLeaveFewerClusters) {
  const Points p{4, 1, {0.0, 1.0, 10.0, 11.0}};
  std::vector<double> d = EuclideanMatrix(p);
  const std::vector<WardMerge> merges = WardLinkage(d, 4);
  ASSERT_EQ(merges.size(), 3u);
  EXPECT_EQ(merges[0].height, merges[1].height);
  EXPECT_THAT(CutAtMaxClusters(merges, 4, 3), ElementsAre(0, 0, 1, 1));
  EXPECT_THAT(CutAtMaxClusters(merges, 4, 2), ElementsAre(0, 0, 1, 1));
  EXPECT_THAT(CutAtMaxClusters(merges, 4, 1), ElementsAre(0, 0, 0, 0));
}

TEST(WardLinkage, DeterministicBitForBit) {
  std::mt19937 rng(3);
  const Points p = RandomPoints(64, 8, rng);
  std::vector<double> d1 = EuclideanMatrix(p), d2 = EuclideanMatrix(p);
  const auto m1 = WardLinkage(d1, p.n), m2 = WardLinkage(d2, p.n);
  ASSERT_EQ(m1.size(), m2.size());
  for (size_t i = 0; i < m1.size(); ++i) {
    EXPECT_EQ(m1[i].a, m2[i].a);
    EXPECT_EQ(m1[i].b, m2[i].b);
    EXPECT_EQ(m1[i].height, m2[i].height);
  }
}

}  // namespace
}  // namespace tessera::internal
