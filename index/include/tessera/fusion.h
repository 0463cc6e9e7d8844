// Fusing the ranked answers of several retrieval lanes (a MaxSim lane and a sparse/BM25 lane) into
// one ranking: reciprocal rank fusion and a min-max normalised score fusion, each lane weighted.
// Both are deterministic: equal fused scores are ordered by ascending id. Id is a shard's iid
// (uint64_t) inside a shard, or a document's external id (std::string) at a collection or router.
#ifndef TESSERA_FUSION_H_
#define TESSERA_FUSION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tessera {

inline constexpr double kDefaultRrfK = 60.0;

template <typename Id>
struct FusionHit {
  Id id{};
  float score = 0.0f;
};

// One lane's answer, best first (its order is the ranking; RRF reads only the order), and its
// weight (finite, ≥ 0).
template <typename Id>
struct FusionLane {
  absl::Span<const FusionHit<Id>> hits;
  double weight = 1.0;
};

// score(d) = Σ over the lanes that hold d of weight / (k + rank), rank 1 for a lane's first hit.
// Returns the best `limit` fused hits (score desc, id asc). INVALID_ARGUMENT naming the field for
// limit < 0, k not finite or < 0, a weight negative or not finite, or an id twice in one lane.
template <typename Id>
absl::StatusOr<std::vector<FusionHit<Id>>> ReciprocalRankFusion(
    absl::Span<const FusionLane<Id>> lanes, int64_t limit, double k = kDefaultRrfK);

// score(d) = Σ over the lanes that hold d of weight · (s − min) / (max − min), min and max over
// that lane's hits (a lane whose hits all score the same maps them to 1). A lane's missing hit
// adds 0. Returns the best `limit` (score desc, id asc). INVALID_ARGUMENT as above, and for a
// score that is not finite.
template <typename Id>
absl::StatusOr<std::vector<FusionHit<Id>>> NormalizedScoreFusion(
    absl::Span<const FusionLane<Id>> lanes, int64_t limit);

extern template absl::StatusOr<std::vector<FusionHit<uint64_t>>> ReciprocalRankFusion(
    absl::Span<const FusionLane<uint64_t>>, int64_t, double);
extern template absl::StatusOr<std::vector<FusionHit<std::string>>> ReciprocalRankFusion(
    absl::Span<const FusionLane<std::string>>, int64_t, double);
extern template absl::StatusOr<std::vector<FusionHit<uint64_t>>> NormalizedScoreFusion(
    absl::Span<const FusionLane<uint64_t>>, int64_t);
extern template absl::StatusOr<std::vector<FusionHit<std::string>>> NormalizedScoreFusion(
    absl::Span<const FusionLane<std::string>>, int64_t);

}  // namespace tessera

#endif  // TESSERA_FUSION_H_
