// Tests for the CPU MaxSim scorer: the scorer conformance suite for every kernel (skipped for an
// instruction set this CPU lacks), and what only the CPU backend has: stage 1's QuerySimilarity,
// the factory's options and ISA detection.
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/rerank/cpu_maxsim_scorer.h"
#include "index/rerank/scorer_conformance.h"
#include "tessera/maxsim.h"

namespace tessera {
namespace {

using maxsim_testing::ComputeReference;
using maxsim_testing::MaxSimScorerConformance;
using maxsim_testing::MaxSimScorerValidation;
using maxsim_testing::OwnedDocs;
using maxsim_testing::RandomValues;
using maxsim_testing::Reference;
using maxsim_testing::ScorerFactory;
using ::testing::HasSubstr;

constexpr CpuIsa kAllIsas[] = {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kPortable};

ScorerFactory CpuFactory(CpuIsa isa) {
  ScorerFactory factory;
  factory.name = internal::CpuIsaName(isa);
  factory.unavailable = [isa]() -> std::string {
    if (internal::CpuSupportsIsa(isa)) return "";
    return absl::StrCat("this CPU lacks ", internal::CpuIsaName(isa));
  };
  factory.make = [isa](int num_threads) {
    CpuMaxSimOptions options;
    options.isa = isa;
    options.num_threads = num_threads;
    return NewCpuMaxSimScorer(options);
  };
  factory.takes_threads = true;
  return factory;
}

std::vector<ScorerFactory> CpuFactories() {
  std::vector<ScorerFactory> factories;
  for (CpuIsa isa : kAllIsas) factories.push_back(CpuFactory(isa));
  return factories;
}

INSTANTIATE_TEST_SUITE_P(Cpu, MaxSimScorerConformance, ::testing::ValuesIn(CpuFactories()));
INSTANTIATE_TEST_SUITE_P(Cpu, MaxSimScorerValidation, ::testing::ValuesIn(CpuFactories()));

// Stage 1's similarity blocks: every kernel against the double-precision reference (each vector
// a one-token document), over query rows around the lane widths, vector counts around the
// micro-kernel panels and prefetch distance, and odd dims; padding lanes are 0.
TEST(QuerySimilarity, MatchesDoublePrecisionReference) {
  std::mt19937 rng(5);
  int checked = 0;
  for (int64_t dim : {1, 7, 64, 130, 384}) {
    for (int64_t nq : {1, 8, 15, 16, 17, 33}) {
      const std::vector<float> query = RandomValues(rng, nq * dim);
      for (int64_t n : {1, 5, 6, 12, 13, 150}) {
        OwnedDocs vectors(VectorDtype::kFloat32, dim);
        for (int64_t j = 0; j < n; ++j) vectors.Add(RandomValues(rng, dim));
        const Reference ref = ComputeReference(query, nq, vectors);
        for (CpuIsa isa : kAllIsas) {
          if (!internal::CpuSupportsIsa(isa)) continue;
          const internal::QuerySimilarity similarity({query.data(), nq, dim}, isa);
          ASSERT_GE(similarity.stride(), nq);
          std::vector<float> flat;
          for (const std::vector<float>& v : vectors.values)
            flat.insert(flat.end(), v.begin(), v.end());
          std::vector<float> out(n * similarity.stride(), NAN);
          similarity.Compute(flat.data(), n, out.data());
          for (int64_t j = 0; j < n; ++j) {
            for (int64_t i = 0; i < similarity.stride(); ++i) {
              const float got = out[j * similarity.stride() + i];
              const std::string what =
                  absl::StrCat(internal::CpuIsaName(isa), " dim=", dim, " nq=", nq, " n=", n,
                               " vector ", j, " lane ", i);
              if (i >= nq) {
                ASSERT_EQ(got, 0.0f) << what;
                continue;
              }
              ASSERT_NEAR(got, ref.sims[j][i], 1e-5 * ref.sim_scale[j * nq + i]) << what;
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(NewCpuMaxSimScorer, RejectsNegativeThreadCount) {
  CpuMaxSimOptions options;
  options.num_threads = -1;
  absl::StatusOr<std::unique_ptr<MaxSimScorer>> scorer = NewCpuMaxSimScorer(options);
  ASSERT_FALSE(scorer.ok());
  EXPECT_EQ(scorer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(scorer.status().message()), HasSubstr("num_threads -1"));
}

TEST(NewCpuMaxSimScorer, AutoPicksTheDetectedIsa) {
  absl::StatusOr<std::unique_ptr<MaxSimScorer>> scorer = NewCpuMaxSimScorer();
  ASSERT_TRUE(scorer.ok()) << scorer.status();
  const CpuIsa best = DetectCpuIsa();
  EXPECT_NE(best, CpuIsa::kAuto);
  EXPECT_EQ((*scorer)->name(), absl::StrCat("cpu-", internal::CpuIsaName(best)));
}

TEST(NewCpuMaxSimScorer, UnsupportedIsaIsFailedPrecondition) {
  for (CpuIsa isa : kAllIsas) {
    if (internal::CpuSupportsIsa(isa)) continue;
    CpuMaxSimOptions options;
    options.isa = isa;
    absl::StatusOr<std::unique_ptr<MaxSimScorer>> scorer = NewCpuMaxSimScorer(options);
    ASSERT_FALSE(scorer.ok());
    EXPECT_EQ(scorer.status().code(), absl::StatusCode::kFailedPrecondition);
    return;
  }
  GTEST_SKIP() << "this CPU supports every ISA";
}

TEST(DetectCpuIsa, PortableAlwaysSupported) {
  EXPECT_TRUE(internal::CpuSupportsIsa(CpuIsa::kPortable));
  EXPECT_TRUE(internal::CpuSupportsIsa(DetectCpuIsa()));
}

}  // namespace
}  // namespace tessera
