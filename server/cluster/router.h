// The backend of a `--role router` server (DESIGN §7): the public API over the shard nodes that
// the cluster metadata in etcd names (server/cluster/cluster_state.h). Holds no documents.
//
// - Placement: CreateCollection puts replica r of shard s on live node (h + s + r) mod n (nodes
//   by id, h a hash of the name), so a shard's replicas are on distinct nodes and shards spread
//   evenly. The collection's key is created in state CREATING (invisible to clients), the
//   replicas are created, and one compare-and-swap makes it READY; on any failure the created
//   replicas are dropped and the key deleted.
// - Writes: a document goes to shard ShardOf(id, S) (the function a standalone collection's
//   shards use), to every live replica of it in parallel; it is acknowledged when every live
//   replica made it durable. A replica that is down or fails the write is first marked stale in
//   etcd (so that it serves no reads), then the others' results are returned; when the mark
//   cannot be recorded, or no replica took the write, the documents fail with UNAVAILABLE
//   naming the shard.
// - Reads: Get and Search go to one serving replica per shard (live, not stale; rotated per
//   call), in parallel, with the caller's deadline and cancellation; a replica that fails, or
//   does not answer within its share of the remaining time, is retried on the next one (and
//   tried last for RouterOptions::distrust_for, unless it answers meanwhile). Search
//   answers what a standalone collection with the same shard count answers (ids, order, scores;
//   tessera/merge.h) in one round: every shard reranks its share of N (⌈N / S⌉ of its best by
//   stage-1 score), as the standalone collection does in each of its S shards, and the router
//   takes the best k of their answers. A shard with no replica that answers
//   fails the call with UNAVAILABLE naming it, unless the request allows partial results (then
//   missing_shards lists it).
// - Catch-up: a thread copies every stale replica whose node is live from the first serving
//   replica of its shard (ShardService.CopyReplica: the source refuses writes to the replica with
//   ABORTED while it checkpoints it and streams it to the target, which swaps it in), then marks
//   it serving with a compare-and-swap on the revision read before the copy — a write the
//   replica missed meanwhile changed the key, and the next pass copies again. Writes to that
//   shard fail with UNAVAILABLE (retryable) while the copy runs; reads go on.
// - Lost nodes: a replica whose node has been down for RouterOptions::move_lost_replicas_after
//   (as this router saw it) moves, in one compare-and-swap, to the live node holding no replica
//   of its shard that holds the fewest replicas (ties: lower id), as a stale replica that the
//   catch-up then copies — only while the shard keeps a serving replica to copy from, so that a
//   move never drops the last copy of acknowledged writes from the map. When a node (re)joins,
//   the router drops the replicas it holds that the map has moved away from it, reading the map
//   from etcd right before each drop.
// - Snapshots (router_snapshots.cc, the router's SnapshotStore): every shard snapshotted by one
//   serving replica's node while this router holds the collection's writes (one cut of this
//   router's acknowledged writes), recorded in etcd under /tessera/snapshots/<id>; downloaded as
//   one archive of the shards' archives; restored (by id, or from an archive) placed like a create.
#ifndef TESSERA_SERVER_CLUSTER_ROUTER_H_
#define TESSERA_SERVER_CLUSTER_ROUTER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "server/backend.h"
#include "server/cluster/cluster_state.h"
#include "server/cluster/fan_out.h"
#include "tessera/base/mutex.h"
#include "tessera/collection.h"
#include "tessera/snapshot.h"
#include "tessera/v1/shard.grpc.pb.h"

namespace tessera::cluster {

struct RouterOptions {
  // Deadline of the router's calls to shard nodes that have no caller deadline to inherit:
  // writes, creating and dropping replicas, statistics.
  absl::Duration shard_call_timeout = absl::Seconds(30);
  int64_t max_message_bytes = 64 << 20;  // of the channels to shard nodes
  int64_t max_documents_per_batch = 1024;
  std::string cluster_key;  // API key sent to shard nodes (ServerConfig::cluster_key_file)
  // Of the channels to shard nodes (ServerConfig::cluster_tls_ca): TLS or plaintext.
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials =
      grpc::InsecureChannelCredentials();
  // How often the catch-up thread looks for stale replicas; zero: never.
  absl::Duration catch_up_interval = absl::Seconds(2);
  absl::Duration copy_timeout = absl::Minutes(30);  // of one replica copy
  // How long a node stays down before its replicas move to other live nodes; zero: never. Longer
  // than a node takes to restart: a node that comes back catches up far faster than a new one is
  // copied.
  absl::Duration move_lost_replicas_after = absl::Minutes(5);
  // A node whose read failed or timed out is tried after the others for this long (or until it
  // answers a call): a hung node would otherwise cost calls a share of their deadline each.
  absl::Duration distrust_for = absl::Seconds(5);
};

// Thread-safe. `state` outlives the router.
class Router final : public server::Backend {
 public:
  // Starts the catch-up thread.
  Router(ClusterState* state, RouterOptions options);
  // Stops the catch-up thread (a copy in flight is cancelled).
  ~Router() override;

  // Also FAILED_PRECONDITION when fewer live shard nodes than replicas, INVALID_ARGUMENT for a
  // name longer than server::kMaxClusterCollectionName or more than server::kMaxShards shards.
  absl::Status CreateCollection(const v1::CreateCollectionRequest& request,
                                v1::CreateCollectionResponse* response) override;
  // Replicas on nodes that are down stay listed in the DROPPING entry, whose name stays taken
  // (CreateCollection: FAILED_PRECONDITION), until they are dropped when their nodes come back or
  // forgotten once those have been down for move_lost_replicas_after.
  absl::Status DropCollection(const std::string& name) override;
  absl::Status ListCollections(v1::ListCollectionsResponse* response) override;
  absl::Status GetCollection(const std::string& name, v1::GetCollectionResponse* response) override;
  absl::Status Flush(const std::string& name) override;
  absl::Status Upsert(const v1::UpsertRequest& request, v1::UpsertResponse* response) override;
  // By ids, or by filter: every shard's live replicas delete their matches (acknowledged as a
  // delete by ids is: a replica that missed it is marked stale).
  absl::Status Delete(const v1::DeleteRequest& request, v1::DeleteResponse* response) override;
  // One serving replica per shard (as Search): the sum of the shards' counts.
  absl::Status Count(const v1::CountRequest& request, v1::CountResponse* response) override;
  // One serving replica per shard, each asked for a page as large as the caller's: the first
  // `limit` ids of their answers are the collection's page.
  absl::Status Scroll(const v1::ScrollRequest& request, v1::ScrollResponse* response) override;
  absl::Status Get(const v1::GetRequest& request, v1::GetResponse* response) override;
  absl::Status Search(const grpc::CallbackServerContext& call, const v1::SearchRequest& request,
                      v1::SearchResponse* response) override;

 private:
  friend class RouterSnapshots;  // server/cluster/router_snapshots.cc
  friend class ClusterArchive;
  friend class ClusterRestore;
  // The lock of collection `name`'s writes: Upsert and Delete hold it shared, a snapshot
  // exclusively while its shards are snapshotted, so that every shard is at one acknowledged cut
  // (this router's: with several routers writing, the cut would need a fence in etcd that every
  // router's writes wait on). Entries are never removed (one per name ever written).
  Mutex* WritesOf(const std::string& name);
  // A context for a call to a shard node with this deadline, carrying the cluster key.
  std::unique_ptr<grpc::ClientContext> ShardCall(absl::Duration timeout) const;
  std::unique_ptr<grpc::ClientContext> ShardCall(absl::Time deadline) const;
  // The stub of a live node; UNAVAILABLE naming it when it is not registered.
  absl::StatusOr<v1::ShardService::Stub*> StubOf(const std::string& node_id);
  // The READY collection `name`, else NOT_FOUND as a standalone server says it.
  absl::StatusOr<CollectionEntry> ReadyCollection(const std::string& name);
  // One write call to one replica of a shard, and how it went.
  template <typename Response>
  struct ReplicaCall {
    uint32_t shard;
    std::string node;
    absl::Status status;
    Response response;
  };
  // Sends (*parts)[s] — named for `name` and shard s here — to every live replica of each shard s
  // that has positions, at once, with the call send(stub, part, response) makes (a UnaryCall). A
  // call whose response does not hold count_answers() == one answer per position fails INTERNAL
  // (`items` names them in the message). Replicas that are down are appended to *down, not called.
  template <typename Response, typename Part, typename Send, typename CountAnswers>
  std::vector<ReplicaCall<Response>> CallReplicas(
      const v1::ClusterCollection& collection, const std::string& name, std::vector<Part>* parts,
      const std::vector<std::vector<int>>& positions, const char* items, Send send,
      CountAnswers count_answers, std::vector<std::pair<uint32_t, std::string>>* down);
  // What one write did to a shard's replicas: which stored it, which did not (down, failed).
  struct ShardWrite {
    std::vector<std::string> stored;
    std::vector<std::string> missed;
  };
  // Decides which shards' writes are acknowledged: those where a replica that stored it is
  // serving (live, not stale). When a replica missed the write, the decision is made on etcd's
  // current shard map, in the compare-and-swap that marks the replicas that missed it stale (and
  // counts the miss); `seen` (the router's view) decides otherwise. Returns the shards whose
  // write is refused (their misses are not recorded: nothing was acknowledged there).
  absl::StatusOr<std::set<uint32_t>> Acknowledge(const std::string& name,
                                                 const v1::ClusterCollection& seen,
                                                 const std::map<uint32_t, ShardWrite>& writes);
  // What a write's fan-out did (WriteToReplicas).
  struct ReplicatedWrite {
    // Per shard written: the replicas that stored the write and those that missed it.
    std::map<uint32_t, ShardWrite> writes;
    // Per shard: "<node>: <message>" of each replica whose call failed.
    std::vector<std::vector<std::string>> failures;
    // Acknowledge's answer: the shards whose write is refused.
    absl::StatusOr<std::set<uint32_t>> refused;
  };
  // The fan-out of a write (Upsert's, Delete's): CallReplicas with these arguments, each call
  // UnaryCall(stub, method, part, response) (method: the stub's Async… method), then each
  // replica sorted, in call order, into those that stored the write and those that missed it —
  // a replica that is down missed it; one whose call failed missed it, unless
  // callers_error(status) says every replica shares that failure (a bad request), which is then
  // the answer, nothing acknowledged; one whose call succeeded stored it when
  // stored(call, calls) says so (which also takes the call's answer) — then Acknowledge.
  template <typename Response, typename Part, typename Method, typename CountAnswers,
            typename CallersError, typename Stored>
  absl::StatusOr<ReplicatedWrite> WriteToReplicas(const v1::ClusterCollection& collection,
                                                  const std::string& name, std::vector<Part>* parts,
                                                  const std::vector<std::vector<int>>& positions,
                                                  const char* items, Method method,
                                                  CountAnswers count_answers,
                                                  CallersError callers_error, Stored stored);
  // UNAVAILABLE "shard 2 of collection 'papers' unavailable (<the replicas' failures>)", or with
  // `no_failure` in the parentheses when no replica's call failed.
  static absl::Status ShardUnavailable(const std::string& name, uint32_t shard,
                                       const std::vector<std::string>& failures,
                                       absl::string_view no_failure);
  // Waits until this router's view holds its own last write (so that a client reads it back
  // from the same router at once; other routers see it as their watch delivers it).
  void WaitUntilSeen(const std::string& key);
  // Each shard's request of a search, in parallel (one serving replica each,
  // retried on the next within the deadline), into (*answers)[shard].
  void SearchShards(const grpc::CallbackServerContext& call, const CollectionEntry& entry,
                    absl::Time deadline, const std::map<uint32_t, v1::ShardSearchRequest>& requests,
                    std::map<uint32_t, absl::StatusOr<SearchResult>>* answers);
  // The first round of a sparse or hybrid search: each shard's BM25 statistics for the terms
  // (one serving replica each, in parallel), summed in shard order as a standalone collection
  // sums its shards'. Any shard's failure is the call's.
  absl::StatusOr<SparseStatistics> GatherSparseStatistics(const CollectionEntry& entry,
                                                          const std::string& collection,
                                                          absl::Time deadline,
                                                          const v1::SparseVector& query);
  // The call a fan-out makes to one shard node, given the node's stub (UnaryCall).
  using MakeCall = std::function<FanOut::Start(v1::ShardService::Stub* stub)>;
  // Calls every (shard, node) of `targets` at once — make_for(i) for target i, with a context of
  // this deadline — and waits for all (FanOut): their statuses by position.
  std::vector<absl::Status> CallTargets(
      const std::vector<std::pair<uint32_t, std::string>>& targets, absl::Time deadline,
      const std::function<MakeCall(size_t)>& make_for);
  // Reads each shard of `shards` of collection `name` from one serving replica (TryReplicas),
  // all at once, and waits for all: their statuses by position. With `caller`, the shard calls
  // carry the caller's cancellation.
  std::vector<absl::Status> ReadShards(const v1::ClusterCollection& collection,
                                       const std::string& name, const std::vector<uint32_t>& shards,
                                       absl::Time deadline,
                                       const grpc::CallbackServerContext* caller,
                                       const std::function<MakeCall(size_t)>& make_for);
  // Starts `make`'s call to `node` in *fan_out with a context of this deadline carrying the
  // cluster key (and the caller's cancellation, given one); `done` gets its status when it
  // finishes — UNAVAILABLE at once when the node is not registered.
  void StartOn(FanOut* fan_out, const std::string& node, absl::Time deadline,
               const grpc::CallbackServerContext* caller, const MakeCall& make,
               std::function<void(absl::Status)> done);
  // Calls the chain's replicas in order, each after the previous one's failure (in *fan_out),
  // until one succeeds or fails with a status another replica would share; hands that status to
  // chain->done, or UNAVAILABLE naming the shard and every replica's failure. Attempt i of n gets
  // until now + (deadline - now) / (n - i): a replica that hangs (a stopped process keeps its
  // connections open) costs a share of the time, and its DEADLINE_EXCEEDED moves on to the next
  // replica while the caller's deadline has time left. A replica that fails is distrusted
  // (RouterOptions::distrust_for), one that answers is trusted again.
  struct ReplicaChain;
  void TryReplicas(FanOut* fan_out, ReplicaChain* chain, size_t attempt);
  void Distrust(const std::string& node);
  void Trust(const std::string& node);
  bool Distrusted(const std::string& node);
  // The serving replicas of a shard, rotated so that calls spread over them; distrusted nodes
  // last.
  std::vector<std::string> ReadOrder(const v1::ShardPlacement& placement);

  // Copies one stale replica on a live node from a serving one and marks it serving; false when
  // there was none to copy.
  bool CatchUpOne();
  // Starts the down timer of every node a READY or DROPPING collection places that is not live,
  // and stops those of live nodes.
  void UpdateDownTimers();
  // Whether `node` has been down for move_lost_replicas_after (never when that is zero).
  bool LostFor(const std::string& node, absl::Time now) const;
  // Moves the replicas of nodes down for move_lost_replicas_after (see above); true when a move
  // was recorded.
  bool MoveLostReplicas();
  // Drops replica `shard` of `collection` on `node`; true when it is gone (NOT_FOUND included),
  // false (logged) when the node is down or failed.
  bool DropReplica(const std::string& collection, uint32_t shard, const std::string& node);
  // Whether a drop call that ended with `status` left the replica gone (as DropReplica says).
  bool Dropped(const std::string& collection, uint32_t shard, const std::string& node,
               const absl::Status& status);
  // For each DROPPING collection: drops its listed replicas on the nodes that are live, forgets
  // those on nodes lost for good (left on their disks, logged), and deletes the key once none is
  // left.
  void FinishDrops();
  // Drops, on each node that joined since the last pass, the replicas the map does not place
  // there.
  void DropOrphanReplicas();
  // Whether the replica (collection, shard) on `node` was moved away: the collection is READY in
  // etcd now without `node` among the shard's replicas. A replica of a collection etcd does not
  // hold is left alone (logged): an etcd that lost its data must not empty the nodes.
  absl::StatusOr<bool> Orphaned(const std::string& node, const v1::ShardReplica& replica);
  void CatchUpLoop();

  ClusterState* const state_;
  const RouterOptions options_;
  std::atomic<uint64_t> rotation_{0};
  Mutex mu_;
  // By address: a node that moves gets a new channel.
  std::map<std::string, std::unique_ptr<v1::ShardService::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  Mutex distrust_mu_;
  std::map<std::string, absl::Time> distrusted_until_ ABSL_GUARDED_BY(distrust_mu_);
  Mutex stop_mu_;
  CondVar stop_cv_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;
  grpc::ClientContext* copy_call_ ABSL_GUARDED_BY(stop_mu_) = nullptr;  // to cancel at stop
  // Used by the catch-up thread only: since when each node of a placement has been seen down,
  // and the live nodes whose replicas have been checked against the map since they (re)joined.
  std::map<std::string, absl::Time> down_since_;
  std::set<std::string> checked_nodes_;
  std::thread catch_up_thread_;
  Mutex writes_mu_;
  std::map<std::string, std::unique_ptr<Mutex>> writes_ ABSL_GUARDED_BY(writes_mu_);
};

// The cluster's snapshots (the router's ServiceContext::snapshots): see router_snapshots.cc.
std::unique_ptr<SnapshotStore> NewRouterSnapshots(Router* router);

}  // namespace tessera::cluster

#endif  // TESSERA_SERVER_CLUSTER_ROUTER_H_
