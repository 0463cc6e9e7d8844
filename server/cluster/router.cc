// The router's core: construction, channels and calls to shard nodes, the fan-out shapes
// (CallTargets, ReadShards) and replica trust. The public API is in router_collections.cc,
// router_writes.cc, router_reads.cc and router_snapshots.cc; upkeep in router_replicas.cc.
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

}  // namespace tessera::cluster
