// The router's reads: search (one round, or two for a sparse query's statistics), count,
// scroll and get, each shard from one serving replica.
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/cluster/fan_out.h"
#include "server/cluster/router.h"
#include "server/cluster/router_internal.h"
#include "server/cluster/shard_service.h"
#include "server/convert.h"
#include "server/log.h"
#include "tessera/collection.h"
#include "tessera/document.h"
#include "tessera/merge.h"
#include "tessera/status_macros.h"
#include "tessera/wire/status.h"

namespace tessera::cluster {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

absl::Status Router::Count(const v1::CountRequest& request, v1::CountResponse* response) {
  TESSERA_ASSIGN_OR_RETURN(const CollectionEntry entry, ReadyCollection(request.collection()));
  TESSERA_RETURN_IF_ERROR(server::FilterFromProto(request.filter()).status());
  const uint32_t shards = ShardCount(entry.collection);
  const absl::Time deadline = absl::Now() + options_.shard_call_timeout;
  std::vector<v1::ShardCountRequest> parts(shards);
  std::vector<v1::CountResponse> counts(shards);
  const std::vector<absl::Status> statuses = ReadShards(
      entry.collection, request.collection(), AllShards(shards), deadline, nullptr,
      [&](size_t s) -> MakeCall {
        parts[s].set_collection(request.collection());
        parts[s].set_shard(static_cast<uint32_t>(s));
        *parts[s].mutable_filter() = request.filter();
        return [&, s](v1::ShardService::Stub* stub) {
          return UnaryCall(stub, &v1::ShardService::Stub::AsyncCount, &parts[s], &counts[s]);
        };
      });
  uint64_t total = 0;
  for (uint32_t s = 0; s < shards; ++s) {
    TESSERA_RETURN_IF_ERROR(statuses[s]);
    total += counts[s].count();
  }
  response->set_count(total);
  return absl::OkStatus();
}

absl::Status Router::Scroll(const v1::ScrollRequest& request, v1::ScrollResponse* response) {
  TESSERA_ASSIGN_OR_RETURN(const CollectionEntry entry, ReadyCollection(request.collection()));
  TESSERA_RETURN_IF_ERROR(server::ScrollOptionsFromProto(request).status());
  const uint32_t shards = ShardCount(entry.collection);
  const absl::Time deadline = absl::Now() + options_.shard_call_timeout;
  std::vector<v1::ShardScrollRequest> parts(shards);
  std::vector<v1::ScrollResponse> pages(shards);
  const std::vector<absl::Status> statuses = ReadShards(
      entry.collection, request.collection(), AllShards(shards), deadline, nullptr,
      [&](size_t s) -> MakeCall {
        parts[s].set_shard(static_cast<uint32_t>(s));
        *parts[s].mutable_scroll() = request;
        return [&, s](v1::ShardService::Stub* stub) {
          return UnaryCall(stub, &v1::ShardService::Stub::AsyncScroll, &parts[s], &pages[s]);
        };
      });
  std::vector<v1::ScrolledDocument> documents;
  bool more = false;
  for (uint32_t s = 0; s < shards; ++s) {
    TESSERA_RETURN_IF_ERROR(statuses[s]);
    more = more || !pages[s].next_after().empty();
    for (v1::ScrolledDocument& document : *pages[s].mutable_documents()) {
      documents.push_back(std::move(document));
    }
  }
  std::sort(
      documents.begin(), documents.end(),
      [](const v1::ScrolledDocument& a, const v1::ScrolledDocument& b) { return a.id() < b.id(); });
  const size_t limit = request.limit() == 0 ? 100 : request.limit();
  if (documents.size() > limit) {
    documents.resize(limit);
    more = true;
  }
  if (more && !documents.empty()) response->set_next_after(documents.back().id());
  for (v1::ScrolledDocument& document : documents) {
    *response->add_documents() = std::move(document);
  }
  return absl::OkStatus();
}

absl::Status Router::Get(const v1::GetRequest& request, v1::GetResponse* response) {
  TESSERA_ASSIGN_OR_RETURN(const CollectionEntry entry, ReadyCollection(request.collection()));
  const uint32_t shards = ShardCount(entry.collection);
  const auto s = static_cast<uint32_t>(ShardOf(request.id(), static_cast<int>(shards)));
  v1::ShardGetRequest get;
  get.set_collection(request.collection());
  get.set_shard(s);
  get.set_id(request.id());
  return ReadShards(entry.collection, request.collection(), {s},
                    absl::Now() + options_.shard_call_timeout, nullptr,
                    [&](size_t) -> MakeCall {
                      return [&](v1::ShardService::Stub* stub) {
                        return UnaryCall(stub, &v1::ShardService::Stub::AsyncGet, &get, response);
                      };
                    })
      .front();
}

void Router::SearchShards(const grpc::CallbackServerContext& call, const CollectionEntry& entry,
                          absl::Time deadline,
                          const std::map<uint32_t, v1::ShardSearchRequest>& requests,
                          std::map<uint32_t, absl::StatusOr<SearchResult>>* answers) {
  std::vector<const v1::ShardSearchRequest*> calls;
  std::vector<uint32_t> shards;
  for (const auto& [shard, request] : requests) {
    calls.push_back(&request);
    shards.push_back(shard);
  }
  std::vector<v1::ShardSearchResponse> shard_answers(calls.size());
  // The caller's cancellation reaches the shards; its deadline too.
  const std::vector<absl::Status> statuses = ReadShards(
      entry.collection, calls.empty() ? std::string() : calls.front()->search().collection(),
      shards, deadline, &call, [&](size_t i) -> MakeCall {
        return [&, i](v1::ShardService::Stub* stub) {
          return UnaryCall(stub, &v1::ShardService::Stub::AsyncSearch, calls[i], &shard_answers[i]);
        };
      });
  for (size_t i = 0; i < calls.size(); ++i) {
    if (statuses[i].ok()) {
      (*answers)[shards[i]] = server::SearchResultFromShardProto(&shard_answers[i]);
    } else {
      (*answers)[shards[i]] = statuses[i];
    }
  }
}

namespace {

// The answers that came back, moved out of *answers in shard order. A shard that failed
// UNAVAILABLE goes to *missing when the request allows partial results; any other failure is
// the call's.
absl::Status Gather(std::map<uint32_t, absl::StatusOr<SearchResult>>* answers,
                    const v1::SearchRequest& request, std::set<uint32_t>* missing,
                    std::vector<SearchResult>* parts) {
  for (auto& [s, answer] : *answers) {
    if (answer.ok()) {
      parts->push_back(*std::move(answer));
    } else if (answer.status().code() == absl::StatusCode::kUnavailable &&
               request.allow_partial_results()) {
      missing->insert(s);
    } else {
      return answer.status();
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SparseStatistics> Router::GatherSparseStatistics(const CollectionEntry& entry,
                                                                const std::string& collection,
                                                                absl::Time deadline,
                                                                const v1::SparseVector& query) {
  const uint32_t num_shards = ShardCount(entry.collection);
  std::vector<v1::ShardSparseStatisticsRequest> requests(num_shards);
  std::vector<v1::SparseStatistics> answers(num_shards);
  const std::vector<absl::Status> statuses =
      ReadShards(entry.collection, collection, AllShards(num_shards), deadline, nullptr,
                 [&](size_t s) -> MakeCall {
                   requests[s].set_collection(collection);
                   requests[s].set_shard(static_cast<uint32_t>(s));
                   *requests[s].mutable_terms() = query.indices();
                   return [&, s](v1::ShardService::Stub* stub) {
                     return UnaryCall(stub, &v1::ShardService::Stub::AsyncGetSparseStatistics,
                                      &requests[s], &answers[s]);
                   };
                 });
  SparseStatistics statistics;
  for (uint32_t s = 0; s < num_shards; ++s) {
    TESSERA_RETURN_IF_ERROR(statuses[s]);
    TESSERA_ASSIGN_OR_RETURN(const SparseStatistics part,
                             server::SparseStatisticsFromProto(answers[s]));
    statistics.Merge(part);
  }
  return statistics;
}

absl::Status Router::Search(const grpc::CallbackServerContext& call,
                            const v1::SearchRequest& request, v1::SearchResponse* response) {
  const Clock::time_point start = Clock::now();
  TESSERA_ASSIGN_OR_RETURN(const CollectionEntry entry, ReadyCollection(request.collection()));
  const uint32_t num_shards = ShardCount(entry.collection);
  // The caller's deadline, or the router's own bound for a call without one.
  const absl::Time caller_deadline = absl::FromChrono(call.deadline());
  const absl::Time deadline = std::min(caller_deadline, absl::Now() + options_.shard_call_timeout);
  const int64_t k = request.k() == 0 ? 10 : request.k();
  // One round (tessera/merge.h): every shard reranks its share of N as a shard of num_shards,
  // and the best k of their answers are a standalone collection's.
  const Clock::time_point fanout_start = Clock::now();
  // A sparse or hybrid search takes two rounds: the collection's BM25 statistics first, then the
  // search, every shard scoring with them (tessera/merge.h: MergeLanes, FuseLanes).
  std::optional<v1::SparseStatistics> sparse_statistics;
  if (request.has_sparse_query()) {
    TESSERA_ASSIGN_OR_RETURN(
        const SparseStatistics statistics,
        GatherSparseStatistics(entry, request.collection(), deadline, request.sparse_query()));
    sparse_statistics.emplace();
    server::SparseStatisticsToProto(statistics, &*sparse_statistics);
  }
  std::map<uint32_t, v1::ShardSearchRequest> requests;
  for (uint32_t s = 0; s < num_shards; ++s) {
    v1::ShardSearchRequest& search = requests[s];
    search.set_shard(s);
    search.set_whole_shards(num_shards);
    *search.mutable_search() = request;
    if (sparse_statistics.has_value()) *search.mutable_sparse_statistics() = *sparse_statistics;
  }
  std::map<uint32_t, absl::StatusOr<SearchResult>> answers;
  SearchShards(call, entry, deadline, requests, &answers);
  std::set<uint32_t> missing;
  std::vector<SearchResult> parts;
  TESSERA_RETURN_IF_ERROR(Gather(&answers, request, &missing, &parts));
  if (request.has_sparse_query()) {
    SearchOptions options;
    options.k = k;
    options.group_by = request.group_by();
    options.group_size = request.group_size();
    options.groups = request.groups();
    options.with_attributes = request.with_attributes();
    options.attribute_fields.assign(request.attribute_fields().begin(),
                                    request.attribute_fields().end());
    TESSERA_RETURN_IF_ERROR(server::HybridOptionsFromProto(request, &options.hybrid));
    const int64_t depth = HybridLaneDepth(options, CollectionLimits{}.max_num_candidates);
    TESSERA_ASSIGN_OR_RETURN(
        const SearchResult fused,
        FuseLanes(MergeLanes(std::move(parts), depth), request.query().rows() > 0, options));
    server::SearchResultToProto(fused, response);
    for (uint32_t s : missing) response->add_missing_shards(s);
    response->mutable_timings()->set_fanout_ms(
        std::chrono::duration<double, std::milli>(Clock::now() - fanout_start).count());
    response->mutable_timings()->set_total_ms(
        std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    return absl::OkStatus();
  }
  // A grouped search's parts hold every group among what they scored (SearchOptions::group_by).
  const SearchResult merged =
      request.group_by().empty()
          ? MergeTopK(std::move(parts), k)
          : MergeGroups(std::move(parts), request.groups() == 0 ? k : request.groups(),
                        request.group_size());
  const double fanout_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - fanout_start).count();
  server::SearchResultToProto(merged, response);
  for (uint32_t s : missing) response->add_missing_shards(s);
  response->mutable_timings()->set_fanout_ms(fanout_ms);
  response->mutable_timings()->set_total_ms(
      std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  return absl::OkStatus();
}

}  // namespace tessera::cluster
