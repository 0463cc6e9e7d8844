// The router's upkeep of replicas, from its catch-up thread: copying stale replicas from a
// serving one, moving the replicas of nodes lost for good, finishing drops, dropping orphans.
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
using wire::FromGrpcStatus;

// The live node (a key of `held`, which counts each live node's replicas), holding no replica of
// `placement`, with the fewest replicas (ties: lower id); nullopt when every live node holds one.
std::optional<std::string> MoveTarget(const v1::ShardPlacement& placement,
                                      const std::map<std::string, int>& held) {
  std::optional<std::string> target;
  int fewest = 0;
  for (const auto& [node, count] : held) {
    const bool holds = std::any_of(
        placement.replicas().begin(), placement.replicas().end(),
        [&node = node](const v1::ReplicaPlacement& replica) { return replica.node_id() == node; });
    if (holds || (target.has_value() && count >= fewest)) continue;
    target = node;
    fewest = count;
  }
  return target;
}

}  // namespace

void Router::CatchUpLoop() {
  MutexLock lock(&stop_mu_);
  while (!stop_) {
    stop_mu_.Unlock();
    UpdateDownTimers();
    DropOrphanReplicas();
    FinishDrops();
    const bool moved = MoveLostReplicas();
    const bool copied = CatchUpOne();
    stop_mu_.Lock();
    if (!moved && !copied) stop_cv_.WaitWithTimeout(&stop_mu_, options_.catch_up_interval);
  }
}

bool Router::CatchUpOne() {
  for (const std::string& name : state_->CollectionsIn(v1::ClusterCollection::READY)) {
    // The shard map as etcd has it now: its revision guards the final compare-and-swap.
    std::optional<CollectionEntry> read = ReadIn(*state_, name, v1::ClusterCollection::READY);
    if (!read.has_value()) continue;
    const std::string key = CollectionKey(name);
    v1::ClusterCollection& collection = read->collection;
    for (int s = 0; s < collection.shards_size(); ++s) {
      v1::ShardPlacement* placement = collection.mutable_shards(s);
      // The first serving replica in placement order: every router picks the same source, whose
      // write gate lets one copy of the replica run at a time.
      const v1::ReplicaPlacement* source = nullptr;
      for (const v1::ReplicaPlacement& replica : placement->replicas()) {
        if (!replica.stale() && state_->AddressOf(replica.node_id()).has_value()) {
          source = &replica;
          break;
        }
      }
      if (source == nullptr) continue;
      for (v1::ReplicaPlacement& target : *placement->mutable_replicas()) {
        const std::optional<std::string> address = state_->AddressOf(target.node_id());
        if (!target.stale() || !address.has_value()) continue;
        absl::StatusOr<v1::ShardService::Stub*> stub = StubOf(source->node_id());
        if (!stub.ok()) return false;
        v1::ShardCopyRequest copy;
        copy.set_collection(name);
        copy.set_shard(static_cast<uint32_t>(s));
        copy.set_target_address(*address);
        v1::ShardCopyResponse copied;
        auto context = ShardCall(options_.copy_timeout);
        {
          MutexLock lock(&stop_mu_);
          if (stop_) return false;
          copy_call_ = context.get();
        }
        const absl::Status status =
            FromGrpcStatus((*stub)->CopyReplica(context.get(), copy, &copied));
        {
          MutexLock lock(&stop_mu_);
          copy_call_ = nullptr;
        }
        if (!status.ok()) {
          Log("warning", "replica catch-up failed; retrying later",
              {{"collection", name},
               {"shard", std::to_string(s)},
               {"from", source->node_id()},
               {"to", target.node_id()},
               {"error", std::string(status.message())}});
          return false;
        }
        target.set_stale(false);
        absl::StatusOr<bool> marked =
            state_->etcd()->CompareAndSwap(key, read->mod_revision, ToJson(collection));
        Log(marked.ok() && *marked ? "info" : "warning",
            marked.ok() && *marked ? "replica caught up"
                                   : "replica copied, but the shard map changed meanwhile; "
                                     "copying again",
            {{"collection", name},
             {"shard", std::to_string(s)},
             {"from", source->node_id()},
             {"to", target.node_id()},
             {"bytes", std::to_string(copied.bytes())},
             {"writes_paused_s", std::to_string(copied.seconds())}});
        return true;
      }
    }
  }
  return false;
}

void Router::UpdateDownTimers() {
  const absl::Time now = absl::Now();
  std::set<std::string> placed;
  for (const auto state : {v1::ClusterCollection::READY, v1::ClusterCollection::DROPPING}) {
    for (const std::string& name : state_->CollectionsIn(state)) {
      const absl::StatusOr<std::optional<CollectionEntry>> entry = state_->Lookup(name);
      if (!entry.ok() || !entry->has_value()) continue;
      for (const v1::ShardPlacement& placement : (*entry)->collection.shards()) {
        for (const v1::ReplicaPlacement& replica : placement.replicas()) {
          placed.insert(replica.node_id());
        }
      }
    }
  }
  for (auto it = down_since_.begin(); it != down_since_.end();) {
    it = placed.count(it->first) > 0 ? std::next(it) : down_since_.erase(it);
  }
  for (const std::string& node : placed) {
    if (state_->AddressOf(node).has_value()) {
      down_since_.erase(node);
    } else {
      down_since_.emplace(node, now);
    }
  }
}

bool Router::LostFor(const std::string& node, absl::Time now) const {
  if (options_.move_lost_replicas_after <= absl::ZeroDuration()) return false;
  const auto down = down_since_.find(node);
  return down != down_since_.end() && now - down->second >= options_.move_lost_replicas_after;
}

bool Router::MoveLostReplicas() {
  if (options_.move_lost_replicas_after <= absl::ZeroDuration()) return false;
  const absl::Time now = absl::Now();
  // The shard maps as etcd has them now: their revisions guard the moves.
  std::vector<CollectionEntry> reads;
  for (const std::string& name : state_->CollectionsIn(v1::ClusterCollection::READY)) {
    std::optional<CollectionEntry> read = ReadIn(*state_, name, v1::ClusterCollection::READY);
    if (read.has_value()) reads.push_back(*std::move(read));
  }
  // Replicas per live node.
  std::map<std::string, int> held;
  for (const LiveNode& node : state_->LiveNodes()) held[node.id] = 0;
  for (const CollectionEntry& read : reads) {
    for (const v1::ShardPlacement& placement : read.collection.shards()) {
      for (const v1::ReplicaPlacement& replica : placement.replicas()) {
        const auto live = held.find(replica.node_id());
        if (live != held.end()) ++live->second;
      }
    }
  }

  bool moved = false;
  for (CollectionEntry& read : reads) {
    struct Move {
      int shard;
      std::string from;
      std::string to;
    };
    std::vector<Move> moves;
    for (int s = 0; s < read.collection.shards_size(); ++s) {
      v1::ShardPlacement* placement = read.collection.mutable_shards(s);
      const bool has_source =
          std::any_of(placement->replicas().begin(), placement->replicas().end(),
                      [&held](const v1::ReplicaPlacement& r) {
                        return !r.stale() && held.count(r.node_id()) > 0;
                      });
      if (!has_source) continue;
      for (v1::ReplicaPlacement& replica : *placement->mutable_replicas()) {
        if (!LostFor(replica.node_id(), now)) continue;
        const std::optional<std::string> target = MoveTarget(*placement, held);
        if (!target.has_value()) continue;
        moves.push_back(Move{s, replica.node_id(), *target});
        ++held[*target];
        replica.Clear();
        replica.set_node_id(*target);
        replica.set_stale(true);  // the catch-up copies it from a serving replica
      }
    }
    if (moves.empty()) continue;
    const absl::StatusOr<bool> swapped = state_->etcd()->CompareAndSwap(
        CollectionKey(read.collection.schema().name()), read.mod_revision, ToJson(read.collection));
    const bool recorded = swapped.ok() && *swapped;
    moved |= recorded;
    for (const Move& move : moves) {
      Log(recorded ? "info" : "warning",
          recorded ? "replica of a lost node moved"
                   : "replica of a lost node not moved: the shard map changed meanwhile or etcd "
                     "failed; retrying",
          {{"collection", read.collection.schema().name()},
           {"shard", std::to_string(move.shard)},
           {"from", move.from},
           {"to", move.to},
           {"down_s", std::to_string(absl::ToInt64Seconds(now - down_since_[move.from]))}});
    }
  }
  return moved;
}

bool Router::DropReplica(const std::string& collection, uint32_t shard, const std::string& node) {
  absl::StatusOr<v1::ShardService::Stub*> stub = StubOf(node);
  if (!stub.ok()) return false;
  v1::ShardDropCollectionRequest drop;
  drop.set_collection(collection);
  drop.set_shard(shard);
  v1::ShardDropCollectionResponse dropped;
  auto context = ShardCall(options_.shard_call_timeout);
  return Dropped(collection, shard, node,
                 FromGrpcStatus((*stub)->DropCollection(context.get(), drop, &dropped)));
}

bool Router::Dropped(const std::string& collection, uint32_t shard, const std::string& node,
                     const absl::Status& status) {
  if (status.code() == absl::StatusCode::kUnavailable && !state_->AddressOf(node).has_value()) {
    return false;  // the node is down (StubOf's refusal): not worth a warning per retry
  }
  if (!status.ok() && status.code() != absl::StatusCode::kNotFound) {
    Log("warning", "replica not dropped; retrying",
        {{"collection", collection},
         {"shard", std::to_string(shard)},
         {"node", node},
         {"error", std::string(status.message())}});
    return false;
  }
  return true;
}

void Router::FinishDrops() {
  const absl::Time now = absl::Now();
  for (const std::string& name : state_->CollectionsIn(v1::ClusterCollection::DROPPING)) {
    std::optional<CollectionEntry> read = ReadIn(*state_, name, v1::ClusterCollection::DROPPING);
    if (!read.has_value()) continue;
    const std::string key = CollectionKey(name);
    v1::ClusterCollection& collection = read->collection;
    // What is left: the replicas not yet dropped, on nodes neither live nor lost for good.
    bool changed = false;
    bool left = false;
    for (int s = 0; s < collection.shards_size(); ++s) {
      auto* replicas = collection.mutable_shards(s)->mutable_replicas();
      for (int r = replicas->size() - 1; r >= 0; --r) {
        const std::string node = replicas->Get(r).node_id();
        const bool live = state_->AddressOf(node).has_value();
        if (live && !DropReplica(name, static_cast<uint32_t>(s), node)) {
          left = true;
          continue;
        }
        if (!live && !LostFor(node, now)) {
          left = true;
          continue;
        }
        if (!live) {
          Log("warning", "replica of a dropped collection on a lost node; left on its disk",
              {{"collection", name}, {"shard", std::to_string(s)}, {"node", node}});
        }
        replicas->DeleteSubrange(r, 1);
        changed = true;
      }
    }
    if (changed) {
      const absl::StatusOr<bool> swapped =
          state_->etcd()->CompareAndSwap(key, read->mod_revision, ToJson(collection));
      if (!swapped.ok() || !*swapped) continue;
    }
    if (left) continue;
    // Emptied first, then deleted: nothing changes an entry without replicas any more.
    if (state_->etcd()->Delete(key).ok()) {
      Log("info", "collection dropped on every node that held it", {{"collection", name}});
    }
  }
}

absl::StatusOr<bool> Router::Orphaned(const std::string& node, const v1::ShardReplica& replica) {
  TESSERA_ASSIGN_OR_RETURN(const std::optional<CollectionEntry> read,
                           state_->ReadFromEtcd(replica.collection()));
  if (!read.has_value()) {
    Log("warning", "replica of a collection the cluster does not hold; left on its node's disk",
        {{"collection", replica.collection()},
         {"shard", std::to_string(replica.shard())},
         {"node", node}});
    return false;
  }
  const v1::ClusterCollection& collection = read->collection;
  // Being created or dropped: that router's job.
  if (collection.state() != v1::ClusterCollection::READY) return false;
  if (replica.shard() >= static_cast<uint32_t>(collection.shards_size())) return true;
  const auto& replicas = collection.shards(static_cast<int>(replica.shard())).replicas();
  return std::none_of(replicas.begin(), replicas.end(),
                      [&node](const v1::ReplicaPlacement& r) { return r.node_id() == node; });
}

void Router::DropOrphanReplicas() {
  std::set<std::string> live;
  for (const LiveNode& node : state_->LiveNodes()) live.insert(node.id);
  // A node that left is checked again when it comes back.
  for (auto it = checked_nodes_.begin(); it != checked_nodes_.end();) {
    it = live.count(*it) > 0 ? std::next(it) : checked_nodes_.erase(it);
  }
  for (const std::string& node : live) {
    if (checked_nodes_.count(node) > 0) continue;
    absl::StatusOr<v1::ShardService::Stub*> stub = StubOf(node);
    if (!stub.ok()) continue;
    v1::ShardInfoResponse info;
    auto context = ShardCall(options_.shard_call_timeout);
    if (!(*stub)->Info(context.get(), v1::ShardInfoRequest{}, &info).ok()) continue;
    bool checked = true;  // every replica checked; else again on the next pass
    for (const v1::ShardReplica& replica : info.replicas()) {
      const absl::StatusOr<bool> orphaned = Orphaned(node, replica);
      if (!orphaned.ok() || !*orphaned) {
        checked &= orphaned.ok();
        continue;
      }
      if (!DropReplica(replica.collection(), replica.shard(), node)) {  // logged
        checked = false;
        continue;
      }
      Log("info", "replica moved away from its node dropped there",
          {{"collection", replica.collection()},
           {"shard", std::to_string(replica.shard())},
           {"node", node}});
    }
    if (checked) checked_nodes_.insert(node);
  }
}

}  // namespace tessera::cluster
