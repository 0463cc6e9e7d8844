#include "tessera/merge.h"

#include <algorithm>
#include <utility>

namespace tessera {
namespace {

// (score desc, id asc): the order of every answer.
bool RanksBefore(const SearchHit& a, const SearchHit& b) {
  return a.score != b.score ? a.score > b.score : a.id < b.id;
}

// (stage-1 score desc, id asc): the one collection's cut of its nominees.
bool NominatedBefore(const SearchHit& a, const SearchHit& b) {
  return *a.candidate_score != *b.candidate_score ? *a.candidate_score > *b.candidate_score
                                                  : a.id < b.id;
}

}  // namespace

int64_t MergedNumCandidates(const std::vector<SearchResult>& parts) {
  int64_t num_candidates = 0;
  for (const SearchResult& part : parts) {
    num_candidates = std::max(num_candidates, part.num_candidates);
  }
  return num_candidates;
}

std::optional<SearchResult> MergeSearchResults(std::vector<SearchResult> parts, int64_t k,
                                               bool exhaustive) {
  SearchResult merged;
  merged.num_candidates = MergedNumCandidates(parts);
  bool every_part_scored_all = true;  // each part held no more than N documents
  for (const SearchResult& part : parts) {
    merged.documents += part.documents;
    merged.documents_scored += part.documents_scored;
    every_part_scored_all = every_part_scored_all && part.documents <= merged.num_candidates;
    merged.timings.candidates_ms =
        std::max(merged.timings.candidates_ms, part.timings.candidates_ms);
    merged.timings.fetch_ms = std::max(merged.timings.fetch_ms, part.timings.fetch_ms);
    merged.timings.rerank_ms = std::max(merged.timings.rerank_ms, part.timings.rerank_ms);
    merged.timings.total_ms = std::max(merged.timings.total_ms, part.timings.total_ms);
  }
  std::vector<SearchHit> hits;
  for (SearchResult& part : parts) {
    for (SearchHit& hit : part.hits) hits.push_back(std::move(hit));
  }
  // The one collection scores every matching document when asked to, or when N covers it: then
  // every part has scored all of its own (it holds no more than the total).
  merged.exhaustive = exhaustive || merged.num_candidates >= merged.documents;
  if (!merged.exhaustive) {
    auto nominated_end = std::partition(hits.begin(), hits.end(), [](const SearchHit& hit) {
      return hit.candidate_score.has_value();
    });
    auto cut = nominated_end;
    if (nominated_end - hits.begin() > merged.num_candidates) {
      cut = hits.begin() + merged.num_candidates;
      std::nth_element(hits.begin(), cut - 1, nominated_end, NominatedBefore);
      // nth_element leaves the elements before the N-th no worse than it: the cut.
    }
    const int64_t selected = cut - hits.begin();
    if (selected < std::min(k, merged.documents)) {
      // Too few nominees: the one collection scores every matching document.
      if (!every_part_scored_all) return std::nullopt;
      merged.exhaustive = true;
    } else {
      hits.erase(cut, hits.end());
    }
  }
  const auto keep = static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(hits.size())));
  std::partial_sort(hits.begin(), hits.begin() + static_cast<std::ptrdiff_t>(keep), hits.end(),
                    RanksBefore);
  hits.resize(keep);
  for (SearchHit& hit : hits) hit.candidate_score.reset();
  merged.hits = std::move(hits);
  return merged;
}

}  // namespace tessera
