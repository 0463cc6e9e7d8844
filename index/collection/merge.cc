#include "tessera/merge.h"

#include <algorithm>
#include <utility>

namespace tessera {
namespace {

// Each stage's time of the slowest part: the parts run in parallel.
void KeepSlowest(const SearchTimings& part, SearchTimings* merged) {
  merged->candidates_ms = std::max(merged->candidates_ms, part.candidates_ms);
  merged->fetch_ms = std::max(merged->fetch_ms, part.fetch_ms);
  merged->rerank_ms = std::max(merged->rerank_ms, part.rerank_ms);
  merged->total_ms = std::max(merged->total_ms, part.total_ms);
}

}  // namespace

SearchResult MergeTopK(std::vector<SearchResult> parts, int64_t k) {
  SearchResult merged;
  merged.exhaustive = !parts.empty();
  std::vector<SearchHit> hits;
  for (SearchResult& part : parts) {
    merged.documents += part.documents;
    merged.documents_scored += part.documents_scored;
    merged.num_candidates = std::max(merged.num_candidates, part.num_candidates);
    merged.exhaustive = merged.exhaustive && part.exhaustive;
    KeepSlowest(part.timings, &merged.timings);
    for (SearchHit& hit : part.hits) hits.push_back(std::move(hit));
  }
  const auto keep = static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(hits.size())));
  std::partial_sort(hits.begin(), hits.begin() + static_cast<std::ptrdiff_t>(keep), hits.end(),
                    [](const SearchHit& a, const SearchHit& b) {
                      return a.score != b.score ? a.score > b.score : a.id < b.id;
                    });
  hits.resize(keep);
  merged.hits = std::move(hits);
  return merged;
}

}  // namespace tessera
