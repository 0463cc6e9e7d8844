// Merging the searches of collections that split one collection's documents by ShardOf (a
// router's shard nodes, each holding one shard) into the answer that one collection would give:
// the same hits, order and scores, cascade or exhaustive.
//
// The one collection reranks the N best stage-1 nominees over all its shards; a part knows only
// its own. So a merged search takes two rounds:
//   1. every part nominates (SearchOptions::nominate_only): its N best ids with stage-1 scores;
//   2. CutNominations cuts their union at the N best, as the one collection does (ties at the
//      cut: smaller id first), and each part reranks its ids of the cut (SearchOptions::
//      rerank_ids); MergeTopK takes the best k of their answers.
// A part can score its likely share of the cut in round 1 already (SearchOptions::
// scored_share): round 2 is then needed only for the parts whose share was larger.
// When the one collection would score every matching document (N covers the collection, or a
// filter leaves fewer nominees than k), round 2 is an exhaustive search of every part instead.
// Without scored_share the parts together rerank N documents, as the one collection does.
#ifndef TESSERA_MERGE_H_
#define TESSERA_MERGE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/collection.h"

namespace tessera {

// N for the merged search: the largest any part resolved. A part's default N depends on its own
// stage 1 (DESIGN §5), and the one collection takes the centroid default as soon as any shard uses
// it; a part that resolved less must nominate again with this N set explicitly.
int64_t MergedNumCandidates(const std::vector<SearchResult>& nominations);

// Round 1 → round 2. `nominations`: every part's nominate_only answer for the same query and
// options, with the same N (MergedNumCandidates).
struct NominationCut {
  // Per part, in the order of `nominations`: the ids of the cut it did not score in round 1;
  // round 2 reranks them (SearchOptions::rerank_ids; a part with none need not be searched).
  std::vector<std::vector<std::string>> rerank_ids;
  // The documents of the cut that round 1 scored (SearchOptions::scored_share), to merge with
  // round 2's answers (MergeTopK); documents_scored counts all of round 1's exact scoring.
  SearchResult scored;
};
// nullopt when the one collection scores every matching document: then search every part with
// `exhaustive` and merge those answers with MergeTopK.
std::optional<NominationCut> CutNominations(std::vector<SearchResult> nominations, int64_t k);

// The best k of the parts' round-2 (or exhaustive) answers by (score desc, id asc); timings: the
// slowest part's per stage; documents_scored and documents: the sums; exhaustive when every part
// was.
SearchResult MergeTopK(std::vector<SearchResult> parts, int64_t k);

}  // namespace tessera

#endif  // TESSERA_MERGE_H_
