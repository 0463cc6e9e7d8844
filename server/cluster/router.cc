#include "server/cluster/router.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/cluster/fan_out.h"
#include "server/convert.h"
#include "server/log.h"
#include "server/shard_service.h"
#include "tessera/collection.h"
#include "tessera/document.h"
#include "tessera/merge.h"
#include "tessera/status_macros.h"
#include "tessera/wire/status.h"

namespace tessera::cluster {
namespace {

using server::Log;
using wire::FromGrpcStatus;

using Clock = std::chrono::steady_clock;

// The shards 0 … n - 1.
std::vector<uint32_t> AllShards(uint32_t n) {
  std::vector<uint32_t> shards(n);
  for (uint32_t s = 0; s < n; ++s) shards[s] = s;
  return shards;
}

// A failure that another replica may not have: try the next one.
bool Retryable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDataLoss:
      return true;
    default:
      return false;
  }
}

// A call to a shard node: with `key` as the API key when there is one.
std::unique_ptr<grpc::ClientContext> WithKey(std::unique_ptr<grpc::ClientContext> context,
                                             const std::string& key) {
  if (!key.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", key));
  return context;
}

std::string CollectionKey(const std::string& name) {
  return absl::StrCat(kCollectionsPrefix, name);
}

uint32_t ShardCount(const v1::ClusterCollection& collection) {
  return static_cast<uint32_t>(collection.shards_size());
}

// "shard 2 of collection 'papers'".
std::string ShardName(const std::string& collection, uint32_t shard) {
  return absl::StrCat("shard ", shard, " of collection '", collection, "'");
}

// Collection `name` as etcd holds it now, when it is in `state`; nullopt otherwise (absent, in
// another state, or unreadable: the caller's pass tries again later).
std::optional<CollectionEntry> ReadIn(const ClusterState& cluster, const std::string& name,
                                      v1::ClusterCollection::State state) {
  absl::StatusOr<std::optional<CollectionEntry>> read = cluster.ReadFromEtcd(name);
  if (!read.ok() || !read->has_value() || (*read)->collection.state() != state) {
    return std::nullopt;
  }
  return *std::move(*read);
}

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

Router::Router(ClusterState* state, RouterOptions options)
    : state_(state), options_(std::move(options)) {
  if (options_.catch_up_interval > absl::ZeroDuration()) {
    catch_up_thread_ = std::thread([this] { CatchUpLoop(); });
  }
}

Router::~Router() {
  {
    MutexLock lock(&stop_mu_);
    stop_ = true;
    if (copy_call_ != nullptr) copy_call_->TryCancel();
  }
  stop_cv_.SignalAll();
  if (catch_up_thread_.joinable()) catch_up_thread_.join();
}

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

std::unique_ptr<grpc::ClientContext> Router::ShardCall(absl::Duration timeout) const {
  return ShardCall(absl::Now() + timeout);
}

std::unique_ptr<grpc::ClientContext> Router::ShardCall(absl::Time deadline) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(deadline));
  return WithKey(std::move(context), options_.cluster_key);
}

absl::StatusOr<v1::ShardService::Stub*> Router::StubOf(const std::string& node_id) {
  const std::optional<std::string> address = state_->AddressOf(node_id);
  if (!address.has_value()) {
    return absl::UnavailableError(absl::StrCat("node '", node_id, "' is down"));
  }
  MutexLock lock(&mu_);
  std::unique_ptr<v1::ShardService::Stub>& stub = stubs_[*address];
  if (stub == nullptr) {
    grpc::ChannelArguments arguments;
    arguments.SetMaxReceiveMessageSize(static_cast<int>(options_.max_message_bytes));
    arguments.SetMaxSendMessageSize(static_cast<int>(options_.max_message_bytes));
    stub = v1::ShardService::NewStub(
        grpc::CreateCustomChannel(*address, options_.channel_credentials, arguments));
  }
  return stub.get();
}

void Router::WaitUntilSeen(const std::string& key) {
  // A read returns the store's current revision, which covers this router's last write.
  absl::StatusOr<RangeResult> now = state_->etcd()->GetPrefix(key);
  if (now.ok()) state_->WaitForRevision(now->revision, absl::Seconds(5));
}

absl::StatusOr<CollectionEntry> Router::ReadyCollection(const std::string& name) {
  TESSERA_ASSIGN_OR_RETURN(std::optional<CollectionEntry> entry, state_->Lookup(name));
  if (!entry.has_value() || entry->collection.state() != v1::ClusterCollection::READY) {
    return absl::NotFoundError(absl::StrCat("collection ", QuotedForMessage(name), " not found"));
  }
  return *std::move(entry);
}

std::vector<std::string> Router::ReadOrder(const v1::ShardPlacement& placement) {
  std::vector<std::string> serving;
  for (const v1::ReplicaPlacement& replica : placement.replicas()) {
    if (!replica.stale() && state_->AddressOf(replica.node_id()).has_value()) {
      serving.push_back(replica.node_id());
    }
  }
  if (!serving.empty()) {
    const uint64_t turn = rotation_.fetch_add(1, std::memory_order_relaxed);
    std::rotate(serving.begin(), serving.begin() + static_cast<ptrdiff_t>(turn % serving.size()),
                serving.end());
  }
  // A node that failed or hung lately is tried last: a stopped process that keeps its
  // connections open would otherwise cost every call that picks it a share of its deadline until
  // its lease expires.
  std::stable_partition(serving.begin(), serving.end(),
                        [this](const std::string& node) { return !Distrusted(node); });
  return serving;
}

struct Router::ReplicaChain {
  std::string shard_name;
  std::vector<std::string> order;
  absl::Time deadline;
  const grpc::CallbackServerContext* caller = nullptr;
  MakeCall make;
  std::vector<std::string> failures;
  std::function<void(absl::Status)> done;
};

void Router::StartOn(FanOut* fan_out, const std::string& node, absl::Time deadline,
                     const grpc::CallbackServerContext* caller, const MakeCall& make,
                     std::function<void(absl::Status)> done) {
  absl::StatusOr<v1::ShardService::Stub*> stub = StubOf(node);
  if (!stub.ok()) return done(stub.status());
  std::unique_ptr<grpc::ClientContext> context =
      caller == nullptr
          ? ShardCall(deadline)
          : WithKey(grpc::ClientContext::FromCallbackServerContext(*caller), options_.cluster_key);
  // gRPC keeps the earlier of the caller's deadline and this one.
  context->set_deadline(absl::ToChronoTime(deadline));
  fan_out->Call(
      std::move(context), make(*stub),
      [done = std::move(done)](const grpc::Status& status) { done(FromGrpcStatus(status)); });
}

void Router::TryReplicas(FanOut* fan_out, ReplicaChain* chain, size_t attempt) {
  const size_t n = chain->order.size();
  if (attempt == n) {
    if (chain->failures.empty()) chain->failures.emplace_back("no serving replica");
    return chain->done(absl::UnavailableError(absl::StrCat(
        chain->shard_name, " unavailable (", absl::StrJoin(chain->failures, "; "), ")")));
  }
  const absl::Time now = absl::Now();
  const bool last = attempt + 1 == n;
  const absl::Time attempt_deadline =
      last ? chain->deadline : now + (chain->deadline - now) / static_cast<double>(n - attempt);
  StartOn(fan_out, chain->order[attempt], attempt_deadline, chain->caller, chain->make,
          [this, fan_out, chain, attempt, last](absl::Status status) {
            const std::string& node = chain->order[attempt];
            const bool attempt_timed_out =
                absl::IsDeadlineExceeded(status) && !last && absl::Now() < chain->deadline;
            if (status.ok()) Trust(node);
            if (status.ok() || (!Retryable(status) && !attempt_timed_out)) {
              return chain->done(std::move(status));
            }
            Log("warning", "replica failed; trying the next",
                {{"shard", chain->shard_name},
                 {"node", node},
                 {"error", std::string(status.message())}});
            Distrust(node);
            chain->failures.push_back(absl::StrCat(node, ": ", status.message()));
            TryReplicas(fan_out, chain, attempt + 1);
          });
}

std::vector<absl::Status> Router::CallTargets(
    const std::vector<std::pair<uint32_t, std::string>>& targets, absl::Time deadline,
    const std::function<MakeCall(size_t)>& make_for) {
  std::vector<absl::Status> statuses(targets.size());
  FanOut fan_out;
  for (size_t i = 0; i < targets.size(); ++i) {
    StartOn(&fan_out, targets[i].second, deadline, nullptr, make_for(i),
            [&statuses, i](absl::Status status) { statuses[i] = std::move(status); });
  }
  fan_out.Wait();
  return statuses;
}

std::vector<absl::Status> Router::ReadShards(const v1::ClusterCollection& collection,
                                             const std::string& name,
                                             const std::vector<uint32_t>& shards,
                                             absl::Time deadline,
                                             const grpc::CallbackServerContext* caller,
                                             const std::function<MakeCall(size_t)>& make_for) {
  std::vector<absl::Status> statuses(shards.size());
  std::vector<ReplicaChain> chains(shards.size());
  FanOut fan_out;
  for (size_t i = 0; i < shards.size(); ++i) {
    ReplicaChain& chain = chains[i];
    chain.shard_name = ShardName(name, shards[i]);
    chain.order = ReadOrder(collection.shards(static_cast<int>(shards[i])));
    chain.deadline = deadline;
    chain.caller = caller;
    chain.make = make_for(i);
    chain.done = [&statuses, i](absl::Status status) { statuses[i] = std::move(status); };
    TryReplicas(&fan_out, &chain, 0);
  }
  fan_out.Wait();
  return statuses;
}

void Router::Distrust(const std::string& node) {
  const absl::Time until = absl::Now() + options_.distrust_for;
  MutexLock lock(&distrust_mu_);
  const bool fresh = distrusted_until_.count(node) == 0;
  distrusted_until_[node] = until;
  if (fresh) {
    Log("warning", "shard node tried last for a while",
        {{"node", node}, {"seconds", absl::StrCat(absl::ToDoubleSeconds(options_.distrust_for))}});
  }
}

void Router::Trust(const std::string& node) {
  MutexLock lock(&distrust_mu_);
  distrusted_until_.erase(node);
}

bool Router::Distrusted(const std::string& node) {
  MutexLock lock(&distrust_mu_);
  const auto it = distrusted_until_.find(node);
  if (it == distrusted_until_.end()) return false;
  if (absl::Now() < it->second) return true;
  distrusted_until_.erase(it);
  return false;
}

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
  // One call per (shard, live replica); replicas that are down missed the write.
  std::vector<std::pair<uint32_t, std::string>> down;
  std::vector<ReplicaCall<v1::UpsertResponse>> calls = CallReplicas<v1::UpsertResponse>(
      entry.collection, name, &parts, positions, "documents",
      [](v1::ShardService::Stub* stub, const v1::ShardUpsertRequest* part,
         v1::UpsertResponse* answer) {
        return UnaryCall(stub, &v1::ShardService::Stub::AsyncUpsert, part, answer);
      },
      [](const v1::UpsertResponse& answer) { return answer.results_size(); }, &down);

  // Per document: the first replica's result, unless a replica failed the document (then that
  // failure). A replica that failed the call, or a document another replica stored, missed the
  // write.
  std::vector<v1::DocumentResult> results(static_cast<size_t>(request.documents_size()));
  std::map<uint32_t, ShardWrite> writes;
  std::vector<std::vector<std::string>> failures(shards);
  std::vector<bool> merged_any(shards, false);
  for (const auto& [shard, node] : down) writes[shard].missed.push_back(node);
  for (const auto& call : calls) {
    ShardWrite& write = writes[call.shard];
    if (!call.status.ok()) {
      failures[call.shard].push_back(absl::StrCat(call.node, ": ", call.status.message()));
      write.missed.push_back(call.node);
      continue;
    }
    const bool first = !merged_any[call.shard];
    merged_any[call.shard] = true;
    bool missed_one = false;
    for (size_t j = 0; j < positions[call.shard].size(); ++j) {
      const int index = static_cast<int>(j);
      const bool stored_elsewhere = std::any_of(calls.begin(), calls.end(), [&](const auto& other) {
        return other.shard == call.shard && other.status.ok() &&
               other.response.results(index).code() == 0;
      });
      missed_one = missed_one || (call.response.results(index).code() != 0 && stored_elsewhere);
      v1::DocumentResult& merged = results[static_cast<size_t>(positions[call.shard][j])];
      const v1::DocumentResult& result = call.response.results(index);
      if (first || (merged.code() == 0 && result.code() != 0)) merged = result;
    }
    (missed_one ? write.missed : write.stored).push_back(call.node);
  }
  absl::StatusOr<std::set<uint32_t>> refused = Acknowledge(name, entry.collection, writes);
  for (const auto& [shard, write] : writes) {
    absl::Status failure;
    if (!refused.ok()) {
      failure = absl::UnavailableError(
          absl::StrCat(ShardName(name, shard), ": a replica missed the write and etcd could not ",
                       "record it: ", refused.status().message()));
    } else if (refused->count(shard) > 0) {
      if (failures[shard].empty()) failures[shard].emplace_back("no serving replica stored it");
      failure = absl::UnavailableError(absl::StrCat(ShardName(name, shard), " unavailable (",
                                                    absl::StrJoin(failures[shard], "; "), ")"));
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
  std::vector<std::pair<uint32_t, std::string>> down;
  std::vector<ReplicaCall<v1::DeleteResponse>> calls = CallReplicas<v1::DeleteResponse>(
      entry.collection, name, &parts, positions, "ids",
      [](v1::ShardService::Stub* stub, const v1::ShardDeleteRequest* part,
         v1::DeleteResponse* answer) {
        return UnaryCall(stub, &v1::ShardService::Stub::AsyncDelete, part, answer);
      },
      [&request](const v1::DeleteResponse& answer) {
        return request.has_filter() ? 1 : answer.existed_size();
      },
      &down);
  // By filter: each shard's count of deleted documents, from its first replica that answered
  // (replicas hold the same documents).
  std::vector<std::optional<uint64_t>> deleted_by_shard(shards);
  std::vector<bool> existed(static_cast<size_t>(request.ids_size()), false);
  std::map<uint32_t, ShardWrite> writes;
  std::vector<std::vector<std::string>> failures(shards);
  for (const auto& [shard, node] : down) writes[shard].missed.push_back(node);
  for (const auto& call : calls) {
    ShardWrite& write = writes[call.shard];
    if (!call.status.ok()) {
      // A request-level error every replica shares (a bad id) is the caller's.
      if (!Retryable(call.status) && call.status.code() != absl::StatusCode::kDeadlineExceeded) {
        return call.status;
      }
      failures[call.shard].push_back(absl::StrCat(call.node, ": ", call.status.message()));
      write.missed.push_back(call.node);
      continue;
    }
    write.stored.push_back(call.node);
    if (request.has_filter()) {
      if (!deleted_by_shard[call.shard].has_value()) {
        deleted_by_shard[call.shard] = call.response.deleted();
      }
      continue;
    }
    for (size_t j = 0; j < positions[call.shard].size(); ++j) {
      if (call.response.existed(static_cast<int>(j))) {
        existed[static_cast<size_t>(positions[call.shard][j])] = true;
      }
    }
  }
  TESSERA_ASSIGN_OR_RETURN(const std::set<uint32_t> refused,
                           Acknowledge(name, entry.collection, writes));
  if (!refused.empty()) {
    const uint32_t shard = *refused.begin();
    if (failures[shard].empty()) failures[shard].emplace_back("no serving replica took it");
    return absl::UnavailableError(absl::StrCat(ShardName(name, shard), " unavailable (",
                                               absl::StrJoin(failures[shard], "; "), ")"));
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
