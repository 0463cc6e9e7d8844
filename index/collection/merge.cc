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

int64_t MergedNumCandidates(const std::vector<SearchResult>& nominations) {
  int64_t num_candidates = 0;
  for (const SearchResult& part : nominations) {
    num_candidates = std::max(num_candidates, part.num_candidates);
  }
  return num_candidates;
}

std::optional<NominationCut> CutNominations(std::vector<SearchResult> nominations, int64_t k) {
  const int64_t num_candidates = MergedNumCandidates(nominations);
  int64_t documents = 0;
  struct Nominee {
    float score;
    SearchHit* hit;
    size_t part;
  };
  std::vector<Nominee> nominees;
  NominationCut cut;
  for (size_t p = 0; p < nominations.size(); ++p) {
    SearchResult& part = nominations[p];
    documents += part.documents;
    cut.scored.documents_scored += part.documents_scored;
    KeepSlowest(part.timings, &cut.scored.timings);
    for (SearchHit& hit : part.hits) {
      nominees.push_back(Nominee{hit.candidate_score.value_or(0.0f), &hit, p});
    }
  }
  // The one collection scores every matching document when N covers it.
  if (num_candidates >= documents) return std::nullopt;
  if (static_cast<int64_t>(nominees.size()) > num_candidates) {
    // (stage-1 score desc, id asc): the one collection's cut of its nominees.
    const auto end = nominees.begin() + num_candidates;
    std::nth_element(nominees.begin(), end - 1, nominees.end(),
                     [](const Nominee& a, const Nominee& b) {
                       return a.score != b.score ? a.score > b.score : a.hit->id < b.hit->id;
                     });
    nominees.erase(end, nominees.end());
  }
  // Too few nominees for k (a selective filter): it scores every matching document too.
  if (static_cast<int64_t>(nominees.size()) < std::min(k, documents)) return std::nullopt;
  cut.rerank_ids.resize(nominations.size());
  for (const Nominee& nominee : nominees) {
    if (nominee.hit->scored) {
      cut.scored.hits.push_back(std::move(*nominee.hit));
    } else {
      cut.rerank_ids[nominee.part].push_back(std::move(nominee.hit->id));
    }
  }
  return cut;
}

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
