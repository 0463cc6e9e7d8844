// The router's collection calls: create (placement), drop, list, get (statistics), flush.
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

absl::Status Router::CreateCollection(const v1::CreateCollectionRequest& request,
                                      v1::CreateCollectionResponse* response) {
  TESSERA_ASSIGN_OR_RETURN(const CollectionSchema schema,
                           server::SchemaFromProto(request.schema()));
  TESSERA_RETURN_IF_ERROR(ValidateSchema(schema));
  if (schema.name.size() > server::kMaxClusterCollectionName) {
    return absl::InvalidArgumentError(
        absl::StrCat("collection name '", schema.name, "': ", schema.name.size(),
                     " characters, a sharded collection's name has at most ",
                     server::kMaxClusterCollectionName));
  }
  const uint32_t shards = static_cast<uint32_t>(schema.num_shards);
  if (shards > server::kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_shards ", shards, ", expected 1 … ", server::kMaxShards));
  }
  const uint32_t replicas = std::max<uint32_t>(request.replicas(), 1);
  const std::vector<LiveNode> nodes = state_->LiveNodes();
  if (replicas > nodes.size()) {
    std::vector<std::string> ids;
    for (const LiveNode& node : nodes) ids.push_back(node.id);
    return absl::FailedPreconditionError(absl::StrCat(
        "replicas ", replicas, ": needs as many live shard nodes, ", nodes.size(), " live",
        ids.empty() ? "" : absl::StrCat(" (", absl::StrJoin(ids, ", "), ")")));
  }

  v1::ClusterCollection collection;
  collection.set_state(v1::ClusterCollection::CREATING);
  *collection.mutable_schema() = request.schema();
  collection.mutable_schema()->set_num_shards(shards);
  const size_t first = static_cast<size_t>(ShardOf(schema.name, static_cast<int>(nodes.size())));
  for (uint32_t s = 0; s < shards; ++s) {
    v1::ShardPlacement* placement = collection.add_shards();
    for (uint32_t r = 0; r < replicas; ++r) {
      placement->add_replicas()->set_node_id(nodes[(first + s + r) % nodes.size()].id);
    }
  }
  const std::string key = CollectionKey(schema.name);
  TESSERA_ASSIGN_OR_RETURN(const bool reserved,
                           state_->etcd()->CreateIfAbsent({{key, ToJson(collection)}}));
  if (!reserved) {
    const absl::StatusOr<std::optional<CollectionEntry>> existing = state_->Lookup(schema.name);
    if (existing.ok() && existing->has_value() &&
        (*existing)->collection.state() == v1::ClusterCollection::DROPPING) {
      std::vector<std::string> nodes;
      for (const v1::ShardPlacement& placement : (*existing)->collection.shards()) {
        for (const v1::ReplicaPlacement& replica : placement.replicas()) {
          nodes.push_back(replica.node_id());
        }
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "collection '", schema.name, "' is still being dropped: its replicas on nodes ",
          absl::StrJoin(nodes, ", "),
          " are dropped when they come back (or forgotten once they have been down for "
          "--move_lost_replicas_after_seconds); create it again then"));
    }
    return absl::AlreadyExistsError(absl::StrCat("collection '", schema.name, "' already exists"));
  }

  // Every replica at once; those created are dropped again when another fails.
  std::vector<std::pair<uint32_t, std::string>> targets;
  for (uint32_t s = 0; s < shards; ++s) {
    for (const v1::ReplicaPlacement& replica : collection.shards(static_cast<int>(s)).replicas()) {
      targets.emplace_back(s, replica.node_id());
    }
  }
  std::vector<v1::ShardCreateCollectionRequest> creates(targets.size());
  std::vector<v1::ShardCreateCollectionResponse> created(targets.size());
  const std::vector<absl::Status> statuses =
      CallTargets(targets, absl::Now() + options_.shard_call_timeout, [&](size_t i) -> MakeCall {
        *creates[i].mutable_schema() = collection.schema();
        creates[i].set_shard(targets[i].first);
        return [&, i](v1::ShardService::Stub* stub) {
          return UnaryCall(stub, &v1::ShardService::Stub::AsyncCreateCollection, &creates[i],
                           &created[i]);
        };
      });
  const auto failed = std::find_if(statuses.begin(), statuses.end(),
                                   [](const absl::Status& status) { return !status.ok(); });
  if (failed != statuses.end()) {
    const auto& [shard, node] = targets[static_cast<size_t>(failed - statuses.begin())];
    absl::Status error(failed->code(), absl::StrCat(ShardName(schema.name, shard), " on node '",
                                                    node, "': ", failed->message()));
    // Undo: drop the replicas that were created.
    std::vector<std::pair<uint32_t, std::string>> undo;
    for (size_t i = 0; i < targets.size(); ++i) {
      if (statuses[i].ok()) undo.push_back(targets[i]);
    }
    std::vector<v1::ShardDropCollectionRequest> drops(undo.size());
    std::vector<v1::ShardDropCollectionResponse> dropped(undo.size());
    CallTargets(undo, absl::Now() + options_.shard_call_timeout, [&](size_t i) -> MakeCall {
      drops[i].set_collection(schema.name);
      drops[i].set_shard(undo[i].first);
      return [&, i](v1::ShardService::Stub* stub) {
        return UnaryCall(stub, &v1::ShardService::Stub::AsyncDropCollection, &drops[i],
                         &dropped[i]);
      };
    });
    state_->etcd()->Delete(key).IgnoreError();
    return error;
  }

  // The schema with the defaults the nodes filled in, as a standalone server answers it.
  *collection.mutable_schema() = created.front().schema();
  collection.set_state(v1::ClusterCollection::READY);
  TESSERA_ASSIGN_OR_RETURN(const std::optional<KeyValue> reserved_kv, state_->etcd()->Get(key));
  if (!reserved_kv.has_value()) {
    return absl::AbortedError(absl::StrCat("collection '", schema.name, "' was dropped meanwhile"));
  }
  TESSERA_ASSIGN_OR_RETURN(
      const bool ready,
      state_->etcd()->CompareAndSwap(key, reserved_kv->mod_revision, ToJson(collection)));
  if (!ready) {
    return absl::AbortedError(absl::StrCat("collection '", schema.name, "' changed meanwhile"));
  }
  WaitUntilSeen(key);
  *response->mutable_schema() = collection.schema();
  Log("info", "collection created",
      {{"collection", schema.name},
       {"shards", std::to_string(shards)},
       {"replicas", std::to_string(replicas)}});
  return absl::OkStatus();
}

absl::Status Router::DropCollection(const std::string& name) {
  TESSERA_ASSIGN_OR_RETURN(std::optional<CollectionEntry> entry, state_->Lookup(name));
  if (!entry.has_value() || entry->collection.state() == v1::ClusterCollection::DROPPING) {
    return absl::NotFoundError(absl::StrCat("collection ", QuotedForMessage(name), " not found"));
  }
  const std::string key = CollectionKey(name);
  v1::ClusterCollection dropping = entry->collection;
  dropping.set_state(v1::ClusterCollection::DROPPING);
  TESSERA_ASSIGN_OR_RETURN(const bool marked, state_->etcd()->CompareAndSwap(
                                                  key, entry->mod_revision, ToJson(dropping)));
  if (!marked) return absl::AbortedError(absl::StrCat("collection '", name, "' changed meanwhile"));

  std::vector<std::pair<uint32_t, std::string>> targets;
  for (int s = 0; s < dropping.shards_size(); ++s) {
    for (const v1::ReplicaPlacement& replica : dropping.shards(s).replicas()) {
      targets.emplace_back(static_cast<uint32_t>(s), replica.node_id());
    }
  }
  std::vector<v1::ShardDropCollectionRequest> drops(targets.size());
  std::vector<v1::ShardDropCollectionResponse> answers(targets.size());
  const std::vector<absl::Status> statuses =
      CallTargets(targets, absl::Now() + options_.shard_call_timeout, [&](size_t i) -> MakeCall {
        drops[i].set_collection(name);
        drops[i].set_shard(targets[i].first);
        return [&, i](v1::ShardService::Stub* stub) {
          return UnaryCall(stub, &v1::ShardService::Stub::AsyncDropCollection, &drops[i],
                           &answers[i]);
        };
      });
  std::vector<char> dropped(targets.size(), 0);
  for (size_t i = 0; i < targets.size(); ++i) {
    dropped[i] = Dropped(name, targets[i].first, targets[i].second, statuses[i]) ? 1 : 0;
  }
  // The replicas a node could not drop (it is down or failed) stay listed in the DROPPING entry,
  // which FinishDrops empties as their nodes come back; the name is taken until then.
  v1::ClusterCollection pending = dropping;
  for (v1::ShardPlacement& placement : *pending.mutable_shards()) placement.clear_replicas();
  std::vector<std::string> waiting;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (dropped[i]) continue;
    pending.mutable_shards(static_cast<int>(targets[i].first))
        ->add_replicas()
        ->set_node_id(targets[i].second);
    waiting.push_back(targets[i].second);
  }
  if (waiting.empty()) {
    TESSERA_RETURN_IF_ERROR(state_->etcd()->Delete(key).status());
    WaitUntilSeen(key);
    Log("info", "collection dropped", {{"collection", name}});
    return absl::OkStatus();
  }
  TESSERA_ASSIGN_OR_RETURN(const std::optional<KeyValue> marked_kv, state_->etcd()->Get(key));
  if (marked_kv.has_value()) {
    // Not swapped: another router's FinishDrops changed it meanwhile and carries on.
    state_->etcd()->CompareAndSwap(key, marked_kv->mod_revision, ToJson(pending)).IgnoreError();
  }
  WaitUntilSeen(key);
  Log("info",
      "collection dropped; its replicas on nodes that did not answer are dropped when "
      "they come back",
      {{"collection", name}, {"nodes", absl::StrJoin(waiting, ",")}});
  return absl::OkStatus();
}

absl::Status Router::ListCollections(v1::ListCollectionsResponse* response) {
  for (const std::string& name : state_->CollectionsIn(v1::ClusterCollection::READY)) {
    response->add_names(name);
  }
  return absl::OkStatus();
}

absl::Status Router::GetCollection(const std::string& name, v1::GetCollectionResponse* response) {
  TESSERA_ASSIGN_OR_RETURN(const CollectionEntry entry, ReadyCollection(name));
  const v1::ClusterCollection& collection = entry.collection;
  *response->mutable_schema() = collection.schema();
  const uint32_t shards = ShardCount(collection);
  std::vector<v1::ShardStatsRequest> requests(shards);
  std::vector<v1::GetCollectionResponse> per_shard(shards);
  const std::vector<absl::Status> statuses = ReadShards(
      collection, name, AllShards(shards), absl::Now() + options_.shard_call_timeout, nullptr,
      [&](size_t s) -> MakeCall {
        requests[s].set_collection(name);
        requests[s].set_shard(static_cast<uint32_t>(s));
        return [&, s](v1::ShardService::Stub* stub) {
          return UnaryCall(stub, &v1::ShardService::Stub::AsyncStats, &requests[s], &per_shard[s]);
        };
      });
  CollectionStats stats;
  for (uint32_t s = 0; s < shards; ++s) {
    if (statuses[s].ok()) AddStats(server::StatsFromProto(per_shard[s].stats()), &stats);
    v1::ShardStatus* status = response->add_shards();
    status->set_shard(s);
    for (const v1::ReplicaPlacement& replica : collection.shards(static_cast<int>(s)).replicas()) {
      v1::ReplicaStatus* out = status->add_replicas();
      out->set_node_id(replica.node_id());
      const std::optional<std::string> address = state_->AddressOf(replica.node_id());
      if (address.has_value()) out->set_address(*address);
      out->set_state(!address.has_value() ? "down" : replica.stale() ? "stale" : "serving");
    }
  }
  SetStatsRatios(&stats);
  server::StatsToProto(stats, response->mutable_stats());
  return absl::OkStatus();
}

absl::Status Router::Flush(const std::string& name) {
  TESSERA_ASSIGN_OR_RETURN(const CollectionEntry entry, ReadyCollection(name));
  std::vector<std::pair<uint32_t, std::string>> targets;
  for (int s = 0; s < entry.collection.shards_size(); ++s) {
    for (const v1::ReplicaPlacement& replica : entry.collection.shards(s).replicas()) {
      if (state_->AddressOf(replica.node_id()).has_value()) {
        targets.emplace_back(static_cast<uint32_t>(s), replica.node_id());
      }
    }
  }
  std::vector<v1::ShardFlushRequest> flushes(targets.size());
  std::vector<v1::ShardFlushResponse> flushed(targets.size());
  const std::vector<absl::Status> statuses =
      CallTargets(targets, absl::Now() + options_.shard_call_timeout, [&](size_t i) -> MakeCall {
        flushes[i].set_collection(name);
        flushes[i].set_shard(targets[i].first);
        return [&, i](v1::ShardService::Stub* stub) {
          return UnaryCall(stub, &v1::ShardService::Stub::AsyncFlush, &flushes[i], &flushed[i]);
        };
      });
  for (size_t i = 0; i < targets.size(); ++i) {
    if (!statuses[i].ok()) {
      return absl::Status(statuses[i].code(),
                          absl::StrCat(ShardName(name, targets[i].first), " on node '",
                                       targets[i].second, "': ", statuses[i].message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::cluster
