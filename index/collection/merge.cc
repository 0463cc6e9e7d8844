#include "tessera/merge.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "tessera/fusion.h"
#include "tessera/status_macros.h"

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

namespace {

// The best `depth` of `hits` by (score desc, id asc).
void KeepBest(std::vector<SearchHit>* hits, int64_t depth) {
  const auto keep =
      static_cast<size_t>(std::min<int64_t>(std::max<int64_t>(depth, 0), hits->size()));
  std::partial_sort(hits->begin(), hits->begin() + static_cast<std::ptrdiff_t>(keep), hits->end(),
                    Better);
  hits->resize(keep);
}

}  // namespace

int64_t HybridLaneDepth(const SearchOptions& options, int64_t max_depth) {
  int64_t depth = options.hybrid.candidates;
  if (depth <= 0) {
    depth = options.group_by.empty()
                ? options.k
                : (options.groups > 0 ? options.groups : options.k) * options.group_size;
  }
  return std::max<int64_t>(1, std::min(depth, max_depth));
}

SearchResult MergeLanes(std::vector<SearchResult> parts, int64_t depth) {
  SearchResult merged;
  merged.exhaustive = !parts.empty();
  merged.lanes = true;
  for (SearchResult& part : parts) {
    MergeCounts(part, &merged);
    for (SearchHit& hit : part.dense_lane) merged.dense_lane.push_back(std::move(hit));
    for (SearchHit& hit : part.sparse_lane) merged.sparse_lane.push_back(std::move(hit));
  }
  KeepBest(&merged.dense_lane, depth);
  KeepBest(&merged.sparse_lane, depth);
  return merged;
}

absl::StatusOr<SearchResult> FuseLanes(SearchResult lanes, bool has_dense_lane,
                                       const SearchOptions& options) {
  const HybridOptions& hybrid = options.hybrid;
  SearchResult result;
  result.timings = lanes.timings;
  result.documents = lanes.documents;
  result.documents_scored = lanes.documents_scored;
  result.num_candidates = lanes.num_candidates;
  result.exhaustive = lanes.exhaustive;
  const int64_t depth =
      static_cast<int64_t>(std::max(lanes.dense_lane.size(), lanes.sparse_lane.size()));
  std::vector<SearchHit> ranking;
  if (!has_dense_lane) {
    ranking = std::move(lanes.sparse_lane);
    for (SearchHit& hit : ranking) hit.sparse_score = hit.score;
  } else {
    // Each document once, with what either lane knows of it.
    absl::flat_hash_map<std::string, SearchHit> by_id;
    std::vector<FusionHit<std::string>> dense, sparse;
    for (SearchHit& hit : lanes.dense_lane) {
      dense.push_back({hit.id, hit.score});
      hit.dense_score = hit.score;
      by_id.emplace(hit.id, std::move(hit));
    }
    for (SearchHit& hit : lanes.sparse_lane) {
      sparse.push_back({hit.id, hit.score});
      auto [it, inserted] = by_id.try_emplace(hit.id);
      if (inserted) {
        it->second = std::move(hit);
        it->second.sparse_score = it->second.score;
      } else {
        it->second.sparse_score = hit.score;
        if (!it->second.dense_score.has_value()) it->second.dense_score = hit.dense_score;
      }
    }
    const FusionLane<std::string> fusion_lanes[] = {{dense, hybrid.dense_weight},
                                                    {sparse, hybrid.sparse_weight}};
    const int64_t limit = static_cast<int64_t>(by_id.size());
    absl::StatusOr<std::vector<FusionHit<std::string>>> fused =
        hybrid.fusion == FusionMethod::kRrf
            ? ReciprocalRankFusion<std::string>(fusion_lanes, limit, hybrid.rrf_k)
            : NormalizedScoreFusion<std::string>(fusion_lanes, limit);
    TESSERA_RETURN_IF_ERROR(fused.status());
    for (const FusionHit<std::string>& entry : *fused) {
      SearchHit& hit = by_id.at(entry.id);
      hit.score = entry.score;
      ranking.push_back(std::move(hit));
    }
    if (hybrid.rerank) {
      // The fused ranking's best L, ordered by their exact MaxSim.
      if (static_cast<int64_t>(ranking.size()) > depth) ranking.resize(depth);
      for (SearchHit& hit : ranking) {
        // Every candidate has one: the dense lane's hits, and the sparse lane's scored by their
        // part when the search reranks.
        hit.score = hit.dense_score.value_or(0.0f);
      }
      std::sort(ranking.begin(), ranking.end(), Better);
    }
  }
  auto finish = [&options](SearchHit& hit) {
    if (options.with_attributes) {
      hit.attributes = SelectAttributes(std::move(hit.attributes), options.attribute_fields);
    } else {
      hit.attributes.clear();
    }
  };
  if (!options.group_by.empty()) {
    if (static_cast<int64_t>(ranking.size()) > depth) ranking.resize(depth);
    // The ranking is best first: a group's members arrive in order, and groups in the order of
    // their best hit.
    std::map<AttributeValue, size_t> group_of;
    const int64_t wanted = options.groups > 0 ? options.groups : options.k;
    for (SearchHit& hit : ranking) {
      const auto value = hit.attributes.find(options.group_by);
      if (value == hit.attributes.end()) continue;  // in no group
      auto [it, inserted] = group_of.try_emplace(value->second, result.groups.size());
      if (inserted) {
        if (static_cast<int64_t>(result.groups.size()) >= wanted) {
          group_of.erase(it);
          continue;
        }
        result.groups.push_back(SearchGroup{value->second, {}});
      }
      SearchGroup& group = result.groups[it->second];
      if (static_cast<int64_t>(group.hits.size()) >= options.group_size) continue;
      finish(hit);
      group.hits.push_back(std::move(hit));
    }
    return result;
  }
  if (static_cast<int64_t>(ranking.size()) > options.k) ranking.resize(options.k);
  for (SearchHit& hit : ranking) finish(hit);
  result.hits = std::move(ranking);
  return result;
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
  total->segments += part.segments;
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
