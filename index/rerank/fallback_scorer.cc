// A MaxSimScorer that falls back to a second backend when the first fails (the GPU scorer backed by
// the CPU one).
#include <memory>
#include <string>
#include <utility>

#include "tessera/maxsim.h"

namespace tessera {
namespace {

class FallbackMaxSimScorer final : public MaxSimScorer {
 public:
  FallbackMaxSimScorer(std::shared_ptr<const MaxSimScorer> primary,
                       std::shared_ptr<const MaxSimScorer> fallback,
                       std::function<void(const absl::Status&)> on_fallback)
      : primary_(std::move(primary)),
        fallback_(std::move(fallback)),
        on_fallback_(std::move(on_fallback)),
        name_(std::string(primary_->name()) + "+" + std::string(fallback_->name())) {}

  std::string_view name() const override { return name_; }

 private:
  absl::Status ScoreImpl(FloatMatrixView query, const DocumentBatch& docs,
                         const MaxSimOptions& options, MaxSimResult* result) const override {
    absl::StatusOr<MaxSimResult> scored = primary_->Score(query, docs, options);
    if (!scored.ok() && !absl::IsInvalidArgument(scored.status())) {
      if (on_fallback_) on_fallback_(scored.status());
      scored = fallback_->Score(query, docs, options);
    }
    if (!scored.ok()) return scored.status();
    *result = std::move(*scored);
    return absl::OkStatus();
  }

  const std::shared_ptr<const MaxSimScorer> primary_;
  const std::shared_ptr<const MaxSimScorer> fallback_;
  const std::function<void(const absl::Status&)> on_fallback_;
  const std::string name_;
};

}  // namespace

std::unique_ptr<MaxSimScorer> NewFallbackMaxSimScorer(
    std::shared_ptr<const MaxSimScorer> primary, std::shared_ptr<const MaxSimScorer> fallback,
    std::function<void(const absl::Status&)> on_fallback) {
  return std::make_unique<FallbackMaxSimScorer>(std::move(primary), std::move(fallback),
                                                std::move(on_fallback));
}

}  // namespace tessera
