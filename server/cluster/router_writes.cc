// The router's writes: upsert and delete to every live replica of each shard, and the
// acknowledgement that marks the replicas that missed one stale.
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

using server::Log;

}  // namespace

absl::StatusOr<std::set<uint32_t>> Router::Acknowledge(
    const std::string& name, const v1::ClusterCollection& seen,
    const std::map<uint32_t, ShardWrite>& writes) {
  auto serving = [](const v1::ClusterCollection& collection, uint32_t shard,
                    const std::string& node) {
    if (shard >= ShardCount(collection)) return false;
    for (const v1::ReplicaPlacement& replica :
         collection.shards(static_cast<int>(shard)).replicas()) {
      if (replica.node_id() == node) return !replica.stale();
    }
    return false;
  };
  auto acknowledged = [&](const v1::ClusterCollection& collection, uint32_t shard,
                          const ShardWrite& write) {
    return std::any_of(write.stored.begin(), write.stored.end(),
                       [&](const std::string& node) { return serving(collection, shard, node); });
  };
  std::set<uint32_t> refused;
  bool missed = false;
  for (const auto& [shard, write] : writes) missed = missed || !write.missed.empty();
  if (!missed) {  // the common case: every live replica stored it; no etcd round trip
    for (const auto& [shard, write] : writes) {
      if (!acknowledged(seen, shard, write)) refused.insert(shard);
    }
    return refused;
  }
  // Decided on etcd's current shard map, in the same compare-and-swap that records the misses.
  const std::string key = CollectionKey(name);
  for (int attempt = 0; attempt < 5; ++attempt) {
    TESSERA_ASSIGN_OR_RETURN(std::optional<KeyValue> read, state_->etcd()->Get(key));
    if (!read.has_value()) {
      return absl::NotFoundError(absl::StrCat("collection ", QuotedForMessage(name), " not found"));
    }
    v1::ClusterCollection collection;
    TESSERA_RETURN_IF_ERROR(FromJson(key, read->value, &collection));
    refused.clear();
    bool changed = false;
    for (const auto& [shard, write] : writes) {
      if (!acknowledged(collection, shard, write)) {
        refused.insert(shard);  // nothing acknowledged: nobody missed anything
        continue;
      }
      for (const std::string& node : write.missed) {
        for (v1::ReplicaPlacement& replica :
             *collection.mutable_shards(static_cast<int>(shard))->mutable_replicas()) {
          if (replica.node_id() != node) continue;
          if (!replica.stale()) {
            Log("warning", "replica missed a write; marked stale",
                {{"collection", name}, {"shard", std::to_string(shard)}, {"node", node}});
          }
          replica.set_stale(true);
          replica.set_missed_writes(replica.missed_writes() + 1);
          changed = true;
        }
      }
    }
    if (!changed) return refused;
    TESSERA_ASSIGN_OR_RETURN(const bool swapped, state_->etcd()->CompareAndSwap(
                                                     key, read->mod_revision, ToJson(collection)));
    if (swapped) return refused;
  }
  return absl::AbortedError(absl::StrCat("collection '", name, "': the shard map kept changing"));
}

template <typename Response, typename Part, typename Send, typename CountAnswers>
std::vector<Router::ReplicaCall<Response>> Router::CallReplicas(
    const v1::ClusterCollection& collection, const std::string& name, std::vector<Part>* parts,
    const std::vector<std::vector<int>>& positions, const char* items, Send send,
    CountAnswers count_answers, std::vector<std::pair<uint32_t, std::string>>* down) {
  std::vector<ReplicaCall<Response>> calls;
  std::vector<std::pair<uint32_t, std::string>> targets;
  for (uint32_t s = 0; s < parts->size(); ++s) {
    if (positions[s].empty()) continue;
    (*parts)[s].set_collection(name);
    (*parts)[s].set_shard(s);
    for (const v1::ReplicaPlacement& replica : collection.shards(static_cast<int>(s)).replicas()) {
      if (state_->AddressOf(replica.node_id()).has_value()) {
        calls.push_back(ReplicaCall<Response>{s, replica.node_id(), absl::OkStatus(), {}});
        targets.emplace_back(s, replica.node_id());
      } else {
        down->emplace_back(s, replica.node_id());
      }
    }
  }
  const std::vector<absl::Status> statuses =
      CallTargets(targets, absl::Now() + options_.shard_call_timeout, [&](size_t i) -> MakeCall {
        return [&, i](v1::ShardService::Stub* stub) {
          return send(stub, &(*parts)[calls[i].shard], &calls[i].response);
        };
      });
  for (size_t i = 0; i < calls.size(); ++i) {
    ReplicaCall<Response>& call = calls[i];
    call.status = statuses[i];
    const size_t expected = positions[call.shard].size();
    if (call.status.ok() && count_answers(call.response) != static_cast<int>(expected)) {
      call.status = absl::InternalError(absl::StrCat("node '", call.node, "' answered ",
                                                     count_answers(call.response), " results for ",
                                                     expected, " ", items));
    }
  }
  return calls;
}

template <typename Response, typename Part, typename Method, typename CountAnswers,
          typename CallersError, typename Stored>
absl::StatusOr<Router::ReplicatedWrite> Router::WriteToReplicas(
    const v1::ClusterCollection& collection, const std::string& name, std::vector<Part>* parts,
    const std::vector<std::vector<int>>& positions, const char* items, Method method,
    CountAnswers count_answers, CallersError callers_error, Stored stored) {
  // One call per (shard, live replica); replicas that are down missed the write.
  std::vector<std::pair<uint32_t, std::string>> down;
  const std::vector<ReplicaCall<Response>> calls = CallReplicas<Response>(
      collection, name, parts, positions, items,
      [method](v1::ShardService::Stub* stub, const Part* part, Response* response) {
        return UnaryCall(stub, method, part, response);
      },
      count_answers, &down);
  ReplicatedWrite write;
  write.failures.resize(parts->size());
  for (const auto& [shard, node] : down) write.writes[shard].missed.push_back(node);
  for (const auto& call : calls) {
    ShardWrite& shard_write = write.writes[call.shard];
    if (!call.status.ok()) {
      if (callers_error(call.status)) return call.status;
      write.failures[call.shard].push_back(absl::StrCat(call.node, ": ", call.status.message()));
      shard_write.missed.push_back(call.node);
      continue;
    }
    (stored(call, calls) ? shard_write.stored : shard_write.missed).push_back(call.node);
  }
  write.refused = Acknowledge(name, collection, write.writes);
  return write;
}

absl::Status Router::ShardUnavailable(const std::string& name, uint32_t shard,
                                      const std::vector<std::string>& failures,
                                      absl::string_view no_failure) {
  return absl::UnavailableError(absl::StrCat(
      ShardName(name, shard), " unavailable (",
      failures.empty() ? std::string(no_failure) : absl::StrJoin(failures, "; "), ")"));
}

Mutex* Router::WritesOf(const std::string& name) {
  MutexLock lock(&writes_mu_);
  std::unique_ptr<Mutex>& mu = writes_[name];
  if (mu == nullptr) mu = std::make_unique<Mutex>();
  return mu.get();
}

absl::Status Router::Upsert(const v1::UpsertRequest& request, v1::UpsertResponse* response) {
  ReaderMutexLock hold_writes(WritesOf(request.collection()));
  TESSERA_ASSIGN_OR_RETURN(const CollectionEntry entry, ReadyCollection(request.collection()));
  const std::string& name = request.collection();
  if (request.documents_size() > options_.max_documents_per_batch) {
    return absl::ResourceExhaustedError(absl::StrCat("documents: ", request.documents_size(),
                                                     " in one message exceeds the limit of ",
                                                     options_.max_documents_per_batch));
  }
  const uint32_t shards = ShardCount(entry.collection);
  // Each shard's part of the message, and where its documents sit in the message.
  std::vector<v1::ShardUpsertRequest> parts(shards);
  std::vector<std::vector<int>> positions(shards);
  for (int i = 0; i < request.documents_size(); ++i) {
    const auto s =
        static_cast<uint32_t>(ShardOf(request.documents(i).id(), static_cast<int>(shards)));
    *parts[s].add_documents() = request.documents(i);
    positions[s].push_back(i);
  }
  // Per document: the first replica's result, unless a replica failed the document (then that
  // failure). A replica that failed the call, or a document another replica stored, missed the
  // write.
  std::vector<v1::DocumentResult> results(static_cast<size_t>(request.documents_size()));
  std::vector<bool> merged_any(shards, false);
  using Call = ReplicaCall<v1::UpsertResponse>;
  TESSERA_ASSIGN_OR_RETURN(
      const ReplicatedWrite write,
      WriteToReplicas<v1::UpsertResponse>(
          entry.collection, name, &parts, positions, "documents",
          &v1::ShardService::Stub::AsyncUpsert,
          [](const v1::UpsertResponse& answer) { return answer.results_size(); },
          [](const absl::Status&) { return false; },
          [&](const Call& call, const std::vector<Call>& calls) {
            const bool first = !merged_any[call.shard];
            merged_any[call.shard] = true;
            bool missed_one = false;
            for (size_t j = 0; j < positions[call.shard].size(); ++j) {
              const int index = static_cast<int>(j);
              const bool stored_elsewhere =
                  std::any_of(calls.begin(), calls.end(), [&](const Call& other) {
                    return other.shard == call.shard && other.status.ok() &&
                           other.response.results(index).code() == 0;
                  });
              missed_one =
                  missed_one || (call.response.results(index).code() != 0 && stored_elsewhere);
              v1::DocumentResult& merged = results[static_cast<size_t>(positions[call.shard][j])];
              const v1::DocumentResult& result = call.response.results(index);
              if (first || (merged.code() == 0 && result.code() != 0)) merged = result;
            }
            return !missed_one;
          }));
  for (const auto& [shard, shard_write] : write.writes) {
    absl::Status failure;
    if (!write.refused.ok()) {
      failure = absl::UnavailableError(
          absl::StrCat(ShardName(name, shard), ": a replica missed the write and etcd could not ",
                       "record it: ", write.refused.status().message()));
    } else if (write.refused->count(shard) > 0) {
      failure =
          ShardUnavailable(name, shard, write.failures[shard], "no serving replica stored it");
    }
    if (failure.ok()) continue;
    for (int position : positions[shard]) {
      v1::DocumentResult& result = results[static_cast<size_t>(position)];
      result.Clear();
      result.set_id(request.documents(position).id());
      result.set_code(static_cast<int32_t>(failure.code()));
      result.set_message(std::string(failure.message()));
    }
  }
  for (v1::DocumentResult& result : results) *response->add_results() = std::move(result);
  return absl::OkStatus();
}

absl::Status Router::Delete(const v1::DeleteRequest& request, v1::DeleteResponse* response) {
  ReaderMutexLock hold_writes(WritesOf(request.collection()));
  TESSERA_ASSIGN_OR_RETURN(const CollectionEntry entry, ReadyCollection(request.collection()));
  const std::string& name = request.collection();
  const uint32_t shards = ShardCount(entry.collection);
  std::vector<v1::ShardDeleteRequest> parts(shards);
  std::vector<std::vector<int>> positions(shards);
  if (request.has_filter()) {
    TESSERA_RETURN_IF_ERROR(server::CheckDeleteByFilter(request));
    // Checked here too, so that a bad filter is the caller's error before any shard is called.
    TESSERA_RETURN_IF_ERROR(server::FilterFromProto(request.filter()).status());
    for (uint32_t s = 0; s < shards; ++s) {
      *parts[s].mutable_filter() = request.filter();
      positions[s].push_back(0);  // one answer per shard: its count
    }
  }
  for (int i = 0; i < request.ids_size(); ++i) {
    const auto s = static_cast<uint32_t>(ShardOf(request.ids(i), static_cast<int>(shards)));
    parts[s].add_ids(request.ids(i));
    positions[s].push_back(i);
  }
  // By filter: each shard's count of deleted documents, from its first replica that answered
  // (replicas hold the same documents).
  std::vector<std::optional<uint64_t>> deleted_by_shard(shards);
  std::vector<bool> existed(static_cast<size_t>(request.ids_size()), false);
  using Call = ReplicaCall<v1::DeleteResponse>;
  TESSERA_ASSIGN_OR_RETURN(
      const ReplicatedWrite write,
      WriteToReplicas<v1::DeleteResponse>(
          entry.collection, name, &parts, positions, "ids", &v1::ShardService::Stub::AsyncDelete,
          [&request](const v1::DeleteResponse& answer) {
            return request.has_filter() ? 1 : answer.existed_size();
          },
          // A request-level error every replica shares (a bad id) is the caller's.
          [](const absl::Status& status) {
            return !Retryable(status) && status.code() != absl::StatusCode::kDeadlineExceeded;
          },
          [&](const Call& call, const std::vector<Call>&) {
            if (request.has_filter()) {
              if (!deleted_by_shard[call.shard].has_value()) {
                deleted_by_shard[call.shard] = call.response.deleted();
              }
              return true;
            }
            for (size_t j = 0; j < positions[call.shard].size(); ++j) {
              if (call.response.existed(static_cast<int>(j))) {
                existed[static_cast<size_t>(positions[call.shard][j])] = true;
              }
            }
            return true;
          }));
  TESSERA_RETURN_IF_ERROR(write.refused.status());
  if (!write.refused->empty()) {
    const uint32_t shard = *write.refused->begin();
    return ShardUnavailable(name, shard, write.failures[shard], "no serving replica took it");
  }
  uint64_t deleted = 0;
  for (bool e : existed) {
    response->add_existed(e);
    deleted += e ? 1 : 0;
  }
  for (const std::optional<uint64_t>& d : deleted_by_shard) deleted += d.value_or(0);
  response->set_deleted(deleted);
  return absl::OkStatus();
}

}  // namespace tessera::cluster
