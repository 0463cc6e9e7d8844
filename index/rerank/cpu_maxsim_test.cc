// Tests for the CPU MaxSim scorer: the scorer conformance suite for every kernel (skipped for an
// instruction set this CPU lacks), and what only the CPU backend has: the factory's options and
// ISA detection.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/kernels/cpu_kernels.h"
#include "index/rerank/scorer_conformance.h"
#include "tessera/maxsim.h"

namespace tessera {
namespace {

using maxsim_testing::MaxSimScorerConformance;
using maxsim_testing::MaxSimScorerValidation;
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
