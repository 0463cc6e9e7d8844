// Reciprocal rank fusion and min-max normalised score fusion (tessera/fusion.h).
#include "tessera/fusion.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "tessera/status_macros.h"

namespace tessera {
namespace {

std::string IdText(uint64_t id) { return absl::StrCat(id); }
std::string IdText(const std::string& id) {
  return absl::StrCat("'", id.size() > 64 ? id.substr(0, 64) + "..." : id, "'");
}

template <typename Id>
absl::Status ValidateLanes(absl::Span<const FusionLane<Id>> lanes, int64_t limit,
                           bool check_scores) {
  if (limit < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fusion: limit = ", limit, "; expected a value >= 0"));
  }
  for (size_t l = 0; l < lanes.size(); ++l) {
    const double weight = lanes[l].weight;
    if (!std::isfinite(weight) || weight < 0) {
      return absl::InvalidArgumentError(absl::StrCat("fusion: lanes[", l, "].weight = ", weight,
                                                     "; expected a finite weight >= 0"));
    }
    absl::flat_hash_set<Id> seen;
    seen.reserve(lanes[l].hits.size());
    for (size_t i = 0; i < lanes[l].hits.size(); ++i) {
      const FusionHit<Id>& hit = lanes[l].hits[i];
      if (!seen.insert(hit.id).second) {
        return absl::InvalidArgumentError(absl::StrCat("fusion: lanes[", l, "] holds id ",
                                                       IdText(hit.id),
                                                       " twice; expected each id once per lane"));
      }
      if (check_scores && !std::isfinite(hit.score)) {
        return absl::InvalidArgumentError(absl::StrCat("fusion: lanes[", l, "].hits[", i,
                                                       "].score = ", hit.score,
                                                       "; expected a finite score"));
      }
    }
  }
  return absl::OkStatus();
}

// The best `limit` of the accumulated scores, (score desc, id asc).
template <typename Id>
std::vector<FusionHit<Id>> BestOf(absl::flat_hash_map<Id, double> fused, int64_t limit) {
  std::vector<std::pair<double, Id>> all;
  all.reserve(fused.size());
  for (auto& [id, score] : fused) all.emplace_back(score, id);
  const auto better = [](const std::pair<double, Id>& a, const std::pair<double, Id>& b) {
    if (a.first != b.first) return a.first > b.first;
    return a.second < b.second;
  };
  const size_t keep = std::min(all.size(), static_cast<size_t>(limit));
  std::partial_sort(all.begin(), all.begin() + keep, all.end(), better);
  std::vector<FusionHit<Id>> out;
  out.reserve(keep);
  for (size_t i = 0; i < keep; ++i) {
    out.push_back({std::move(all[i].second), static_cast<float>(all[i].first)});
  }
  return out;
}

}  // namespace

template <typename Id>
absl::StatusOr<std::vector<FusionHit<Id>>> ReciprocalRankFusion(
    absl::Span<const FusionLane<Id>> lanes, int64_t limit, double k) {
  if (!std::isfinite(k) || k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fusion: rrf k = ", k, "; expected a finite value >= 0"));
  }
  TESSERA_RETURN_IF_ERROR(ValidateLanes(lanes, limit, /*check_scores=*/false));
  absl::flat_hash_map<Id, double> fused;
  for (const FusionLane<Id>& lane : lanes) {
    for (size_t i = 0; i < lane.hits.size(); ++i) {
      fused[lane.hits[i].id] += lane.weight / (k + static_cast<double>(i + 1));
    }
  }
  return BestOf(std::move(fused), limit);
}

template <typename Id>
absl::StatusOr<std::vector<FusionHit<Id>>> NormalizedScoreFusion(
    absl::Span<const FusionLane<Id>> lanes, int64_t limit) {
  TESSERA_RETURN_IF_ERROR(ValidateLanes(lanes, limit, /*check_scores=*/true));
  absl::flat_hash_map<Id, double> fused;
  for (const FusionLane<Id>& lane : lanes) {
    if (lane.hits.empty()) continue;
    double lo = lane.hits[0].score, hi = lane.hits[0].score;
    for (const FusionHit<Id>& hit : lane.hits) {
      lo = std::min<double>(lo, hit.score);
      hi = std::max<double>(hi, hit.score);
    }
    const double range = hi - lo;
    for (const FusionHit<Id>& hit : lane.hits) {
      const double normalized = range > 0 ? (hit.score - lo) / range : 1.0;
      fused[hit.id] += lane.weight * normalized;
    }
  }
  return BestOf(std::move(fused), limit);
}

template absl::StatusOr<std::vector<FusionHit<uint64_t>>> ReciprocalRankFusion(
    absl::Span<const FusionLane<uint64_t>>, int64_t, double);
template absl::StatusOr<std::vector<FusionHit<std::string>>> ReciprocalRankFusion(
    absl::Span<const FusionLane<std::string>>, int64_t, double);
template absl::StatusOr<std::vector<FusionHit<uint64_t>>> NormalizedScoreFusion(
    absl::Span<const FusionLane<uint64_t>>, int64_t);
template absl::StatusOr<std::vector<FusionHit<std::string>>> NormalizedScoreFusion(
    absl::Span<const FusionLane<std::string>>, int64_t);

}  // namespace tessera
