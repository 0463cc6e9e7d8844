#include "tessera/merge.h"

#include <algorithm>
#include <map>
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

bool Better(const SearchHit& a, const SearchHit& b) {
  return a.score != b.score ? a.score > b.score : a.id < b.id;
}

// The fields every merge sums or keeps the slowest of.
void MergeCounts(const SearchResult& part, SearchResult* merged) {
  merged->documents += part.documents;
  merged->documents_scored += part.documents_scored;
  merged->num_candidates = std::max(merged->num_candidates, part.num_candidates);
  merged->exhaustive = merged->exhaustive && part.exhaustive;
  KeepSlowest(part.timings, &merged->timings);
}

}  // namespace

SearchResult MergeGroups(std::vector<SearchResult> parts, int64_t groups, int64_t group_size) {
  SearchResult merged;
  merged.exhaustive = !parts.empty();
  std::map<AttributeValue, std::vector<SearchHit>> by_value;
  for (SearchResult& part : parts) {
    MergeCounts(part, &merged);
    for (SearchGroup& group : part.groups) {
      std::vector<SearchHit>& hits = by_value[group.value];
      for (SearchHit& hit : group.hits) hits.push_back(std::move(hit));
    }
  }
  for (auto& [value, hits] : by_value) {
    if (hits.empty()) continue;
    std::sort(hits.begin(), hits.end(), Better);
    if (static_cast<int64_t>(hits.size()) > group_size) hits.resize(group_size);
    merged.groups.push_back(SearchGroup{value, std::move(hits)});
  }
  std::sort(
      merged.groups.begin(), merged.groups.end(),
      [](const SearchGroup& a, const SearchGroup& b) { return Better(a.hits[0], b.hits[0]); });
  if (static_cast<int64_t>(merged.groups.size()) > groups) merged.groups.resize(groups);
  return merged;
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

void AddStats(const CollectionStats& part, CollectionStats* total) {
  total->documents += part.documents;
  total->original_tokens += part.original_tokens;
  total->rerank_vectors += part.rerank_vectors;
  total->candidate_vectors += part.candidate_vectors;
  total->disk_bytes += part.disk_bytes;
  total->resident_bytes += part.resident_bytes;
  total->candidate_bytes += part.candidate_bytes;
  total->training_shards += part.training_shards;
  total->trainings_completed += part.trainings_completed;
  total->trainings_failed += part.trainings_failed;
  total->candidate_indexes.insert(total->candidate_indexes.end(), part.candidate_indexes.begin(),
                                  part.candidate_indexes.end());
}

void SetStatsRatios(CollectionStats* stats) {
  auto ratio = [](int64_t a, int64_t b) {
    return b == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(b);
  };
  stats->vectors_per_document = ratio(stats->rerank_vectors, stats->documents);
  stats->disk_bytes_per_original_token = ratio(stats->disk_bytes, stats->original_tokens);
  stats->disk_bytes_per_rerank_vector = ratio(stats->disk_bytes, stats->rerank_vectors);
}

}  // namespace tessera
