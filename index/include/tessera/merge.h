// Merging the searches of collections that split one collection's documents by ShardOf (a
// router's shard nodes, each holding one shard) into the answer that one collection would give:
// the same hits, order and scores, cascade or exhaustive.
//
// The one collection reranks, in each of its S shards, that shard's share of N (⌈N / S⌉ of its
// best stage-1 nominees; SearchOptions::num_candidates) and keeps the best k of all. So a part
// searched with SearchOptions::whole_shards = S reranks what the one collection reranks in that
// shard, and the best k of the parts' answers are the one collection's: one round, and the parts
// together rerank the N documents the one collection does.
#ifndef TESSERA_MERGE_H_
#define TESSERA_MERGE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/collection.h"

namespace tessera {

// The best k of the parts' answers by (score desc, id asc); timings: the
// slowest part's per stage; documents_scored and documents: the sums; exhaustive when every part
// was.
SearchResult MergeTopK(std::vector<SearchResult> parts, int64_t k);

// The grouped answer of the one collection from its parts' grouped answers, each searched with
// whole_shards (so each holds every group among the documents it scored, with its best
// group_size): per value, the best group_size of the parts' hits; the best `groups` groups by
// their best hit (score desc, id asc). The other fields as MergeTopK's.
SearchResult MergeGroups(std::vector<SearchResult> parts, int64_t groups, int64_t group_size);

// Sparse and hybrid searches (HybridOptions). The parts' lanes (SearchResult::lanes, each part
// searched with whole_shards and the collection's sparse statistics) merged into the whole
// collection's: each lane's best `depth` by (score desc, id asc). The other fields as
// MergeTopK's. What a collection computes over its own shards before FuseLanes.
SearchResult MergeLanes(std::vector<SearchResult> parts, int64_t depth);

// The answer of a sparse or hybrid search from the whole collection's lanes (each its best L,
// L = HybridLaneDepth): sparse only (no dense lane: has_dense_lane false) the sparse lane; else
// the lanes fused as options.hybrid says, optionally reranked by MaxSim; then grouped
// (options.group_by) or cut to options.k, with attributes as options.with_attributes asks.
// INVALID_ARGUMENT for fusion options out of range (tessera/fusion.h).
absl::StatusOr<SearchResult> FuseLanes(SearchResult lanes, bool has_dense_lane,
                                       const SearchOptions& options);

// L: options.hybrid.candidates, or the hits the search asks for (k, or groups × group_size),
// at most `max_depth`.
int64_t HybridLaneDepth(const SearchOptions& options, int64_t max_depth);

// The statistics of the one collection from its parts' (a collection's shards, a router's shard
// nodes): AddStats sums each part's counts (documents, tokens, vectors, bytes, training shards,
// trainings completed and failed, segment files) into `total` and appends its candidate_indexes;
// once every part is in, SetStatsRatios derives the ratios from the sums (0 where the divisor is
// 0). last_training_seconds is the most recent training's, which only the caller can tell:
// AddStats leaves it alone.
void AddStats(const CollectionStats& part, CollectionStats* total);
void SetStatsRatios(CollectionStats* stats);

}  // namespace tessera

#endif  // TESSERA_MERGE_H_
