// Merging the searches of collections that split one collection's documents by ShardOf (a
// router's shard nodes, each holding one shard) into the answer that one collection would give:
// the same hits, order and scores, cascade or exhaustive.
//
// The one collection reranks the N best stage-1 nominees over all its shards; a part knows only
// its own. So each part is searched with SearchOptions::return_nominees (its N best nominees, all
// scored exactly, with their stage-1 scores) and the merge cuts the union at the global N, as the
// one collection does (ties at the cut: smaller id first), before it takes the best k.
#ifndef TESSERA_MERGE_H_
#define TESSERA_MERGE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "tessera/collection.h"

namespace tessera {

// N for the merged search: the largest any part resolved. A part's default N depends on its own
// stage 1 (DESIGN §5), and the one collection takes the centroid default as soon as any shard uses
// it; a part that resolved less must be searched again with this N set explicitly.
int64_t MergedNumCandidates(const std::vector<SearchResult>& parts);

// The merged answer of `parts` (each searched with the same query and options, return_nominees
// set, and the same N — see MergedNumCandidates), or nullopt when the one collection would have
// fallen back to scoring every matching document (too few nominees: a selective filter) and some
// part has not: then search every part again with `exhaustive` and merge those answers.
// `exhaustive`: the parts were searched exhaustively (plain top-k answers). Hits: best k by (score
// desc, id asc); timings: the slowest part's per stage; documents_scored: the sum.
std::optional<SearchResult> MergeSearchResults(std::vector<SearchResult> parts, int64_t k,
                                               bool exhaustive);

}  // namespace tessera

#endif  // TESSERA_MERGE_H_
