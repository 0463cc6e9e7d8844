#include <atomic>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tessera/maxsim.h"

namespace tessera {
namespace {

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
