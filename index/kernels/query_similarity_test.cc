// QuerySimilarity on every kernel this CPU runs, against a double-precision reference.
#include "index/kernels/query_similarity.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "index/kernels/cpu_kernels.h"

namespace tessera::internal {
namespace {

constexpr CpuIsa kAllIsas[] = {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kPortable};

std::vector<float> RandomValues(std::mt19937& rng, int64_t count) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& x : values) x = dist(rng);
  return values;
}

// Over query rows around the lane widths, vector counts around the micro-kernel panels and the
// prefetch distance, and odd dims: each product within 1e-5 of the sum of its terms' magnitudes
// (at least 1) of the double-precision one; padding lanes are 0.
TEST(QuerySimilarity, MatchesDoublePrecisionReference) {
  std::mt19937 rng(5);
  int checked = 0;
  for (int64_t dim : {1, 7, 64, 130, 384}) {
    for (int64_t nq : {1, 8, 15, 16, 17, 33}) {
      const std::vector<float> query = RandomValues(rng, nq * dim);
      for (int64_t n : {1, 5, 6, 12, 13, 150}) {
        const std::vector<float> vectors = RandomValues(rng, n * dim);
        for (CpuIsa isa : kAllIsas) {
          if (!CpuSupportsIsa(isa)) continue;
          const QuerySimilarity similarity({query.data(), nq, dim}, isa);
          ASSERT_GE(similarity.stride(), nq);
          std::vector<float> out(n * similarity.stride(), NAN);
          similarity.Compute(vectors.data(), n, out.data());
          for (int64_t j = 0; j < n; ++j) {
            for (int64_t i = 0; i < similarity.stride(); ++i) {
              const float got = out[j * similarity.stride() + i];
              const std::string what = absl::StrCat(CpuIsaName(isa), " dim=", dim, " nq=", nq,
                                                    " n=", n, " vector ", j, " lane ", i);
              if (i >= nq) {
                ASSERT_EQ(got, 0.0f) << what;
                continue;
              }
              double want = 0.0, scale = 0.0;
              for (int64_t k = 0; k < dim; ++k) {
                const double term = double{vectors[j * dim + k]} * query[i * dim + k];
                want += term;
                scale += std::fabs(term);
              }
              ASSERT_NEAR(got, want, 1e-5 * std::max(1.0, scale)) << what;
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// ComputeRows on scattered rows (fewer and more than one copied block, out of order) writes each
// row exactly what Compute writes for it, at the row's own place, and nothing else.
TEST(QuerySimilarity, ComputeRowsEqualsComputeAtEachRow) {
  std::mt19937 rng(11);
  int checked = 0;
  for (int64_t dim : {1, 9, 128, 384}) {
    for (int64_t nq : {1, 17, 32}) {
      const std::vector<float> query = RandomValues(rng, nq * dim);
      constexpr int64_t kRows = 300;
      const std::vector<float> vectors = RandomValues(rng, kRows * dim);
      for (int64_t count : {1, 47, 48, 49, 131}) {
        std::vector<uint32_t> ids(kRows);
        for (int64_t r = 0; r < kRows; ++r) ids[r] = static_cast<uint32_t>(r);
        std::shuffle(ids.begin(), ids.end(), rng);
        ids.resize(count);
        for (CpuIsa isa : kAllIsas) {
          if (!CpuSupportsIsa(isa)) continue;
          const QuerySimilarity similarity({query.data(), nq, dim}, isa);
          const int64_t stride = similarity.stride();
          std::vector<float> every(kRows * stride);
          similarity.Compute(vectors.data(), kRows, every.data());
          std::vector<float> out(kRows * stride, NAN);
          similarity.ComputeRows(vectors.data(), ids, out.data());
          std::vector<bool> chosen(kRows, false);
          for (uint32_t id : ids) chosen[id] = true;
          for (int64_t r = 0; r < kRows; ++r) {
            for (int64_t i = 0; i < stride; ++i) {
              const std::string what = absl::StrCat(CpuIsaName(isa), " dim=", dim, " nq=", nq,
                                                    " count=", count, " row ", r, " lane ", i);
              if (chosen[r]) {
                ASSERT_EQ(out[r * stride + i], every[r * stride + i]) << what;
              } else {
                ASSERT_TRUE(std::isnan(out[r * stride + i])) << what << " written";
              }
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace tessera::internal
