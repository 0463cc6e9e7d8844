// Tests for the fallback scorer (GPU → CPU): the scorer conformance suite with a primary that
// always fails (every call is scored by the fallback) and with the CPU scorer as both primary and
// fallback (the fallback is never taken), and how it reports a fallback.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "index/rerank/scorer_conformance.h"
#include "tessera/maxsim.h"

namespace tessera {
namespace {

using maxsim_testing::MaxSimScorerConformance;
using maxsim_testing::MaxSimScorerValidation;
using maxsim_testing::ScorerFactory;

// A backend whose device is gone: every call fails the way a lost GPU does.
class UnavailableScorer final : public MaxSimScorer {
 public:
  std::string_view name() const override { return "unavailable"; }

 private:
  absl::Status ScoreImpl(FloatMatrixView, const DocumentBatch&, const MaxSimOptions&,
                         MaxSimResult*) const override {
    return absl::UnavailableError("device lost");
  }
};

absl::StatusOr<std::shared_ptr<const MaxSimScorer>> CpuScorer(int num_threads) {
  CpuMaxSimOptions options;
  options.num_threads = num_threads;
  absl::StatusOr<std::unique_ptr<MaxSimScorer>> scorer = NewCpuMaxSimScorer(options);
  if (!scorer.ok()) return scorer.status();
  return std::shared_ptr<const MaxSimScorer>(*std::move(scorer));
}

std::vector<ScorerFactory> FallbackFactories() {
  ScorerFactory failing_primary;
  failing_primary.name = "failing_primary";
  failing_primary.make = [](int num_threads) -> absl::StatusOr<std::unique_ptr<MaxSimScorer>> {
    absl::StatusOr<std::shared_ptr<const MaxSimScorer>> cpu = CpuScorer(num_threads);
    if (!cpu.ok()) return cpu.status();
    return NewFallbackMaxSimScorer(
        std::make_shared<UnavailableScorer>(), *std::move(cpu), [](const absl::Status& status) {
          EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
        });
  };
  failing_primary.takes_threads = true;

  ScorerFactory cpu_primary;
  cpu_primary.name = "cpu_primary";
  cpu_primary.make = [](int num_threads) -> absl::StatusOr<std::unique_ptr<MaxSimScorer>> {
    absl::StatusOr<std::shared_ptr<const MaxSimScorer>> primary = CpuScorer(num_threads);
    absl::StatusOr<std::shared_ptr<const MaxSimScorer>> fallback = CpuScorer(num_threads);
    if (!primary.ok()) return primary.status();
    if (!fallback.ok()) return fallback.status();
    return NewFallbackMaxSimScorer(
        *std::move(primary), *std::move(fallback),
        [](const absl::Status& status) { ADD_FAILURE() << "unexpected fallback: " << status; });
  };
  cpu_primary.takes_threads = true;
  return {failing_primary, cpu_primary};
}

INSTANTIATE_TEST_SUITE_P(Fallback, MaxSimScorerConformance,
                         ::testing::ValuesIn(FallbackFactories()));
INSTANTIATE_TEST_SUITE_P(Fallback, MaxSimScorerValidation,
                         ::testing::ValuesIn(FallbackFactories()));

TEST(FallbackMaxSimScorer, UsesTheFallbackAndReportsIt) {
  std::shared_ptr<const MaxSimScorer> cpu = *NewCpuMaxSimScorer();
  std::atomic<int> fallbacks{0};
  auto scorer = NewFallbackMaxSimScorer(std::make_shared<UnavailableScorer>(), cpu,
                                        [&](const absl::Status& status) {
                                          EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
                                          ++fallbacks;
                                        });
  const std::vector<float> query = {1, 0, 0, 1};
  const std::vector<float> doc = {0.5f, 0.5f, 1, 0};
  const std::vector<DocumentRef> refs = {{doc.data(), 2}};
  const DocumentBatch batch{VectorDtype::kFloat32, 2, refs};
  auto result = scorer->Score(FloatMatrixView{query.data(), 2, 2}, batch);
  ASSERT_TRUE(result.ok()) << result.status();
  // max(0.5, 1) + max(0.5, 0) = 1.5
  EXPECT_FLOAT_EQ(result->scores[0], 1.5f);
  EXPECT_EQ(fallbacks, 1);
  EXPECT_EQ(scorer->name(), "unavailable+" + std::string(cpu->name()));
  // Bad input is the caller's fault: no fallback.
  EXPECT_FALSE(scorer->Score(FloatMatrixView{query.data(), 1, 4}, batch).ok());
  EXPECT_EQ(fallbacks, 1);
}

}  // namespace
}  // namespace tessera
