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
//   call), in parallel, with the caller's deadline and cancellation; a replica that fails is
//   retried on the next one while time remains. Search merges the shards' exact top k by
//   (score desc, id asc): the answer equals a standalone collection's with the same shard
//   count. A shard with no replica that answers fails the call with UNAVAILABLE naming it,
//   unless the request allows partial results (then missing_shards lists it).
// Not yet: a stale replica catching up (it stays out of reads until it is recreated).
#ifndef TESSERA_SERVER_CLUSTER_ROUTER_H_
#define TESSERA_SERVER_CLUSTER_ROUTER_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "index/common/mutex.h"
#include "server/backend.h"
#include "server/cluster/cluster_state.h"
#include "tessera/v1/shard.grpc.pb.h"

namespace tessera::cluster {

struct RouterOptions {
  // Deadline of the router's calls to shard nodes that have no caller deadline to inherit:
  // writes, creating and dropping replicas, statistics.
  absl::Duration shard_call_timeout = absl::Seconds(30);
  int64_t max_message_bytes = 64 << 20;  // of the channels to shard nodes
  int64_t max_documents_per_batch = 1024;
};

// Thread-safe. `state` outlives the router.
class Router final : public server::Backend {
 public:
  Router(ClusterState* state, RouterOptions options) : state_(state), options_(options) {}

  // Also FAILED_PRECONDITION when fewer live shard nodes than replicas, INVALID_ARGUMENT for a
  // name longer than server::kMaxClusterCollectionName or more than server::kMaxShards shards.
  absl::Status CreateCollection(const v1::CreateCollectionRequest& request,
                                v1::CreateCollectionResponse* response) override;
  // Replicas on nodes that are down stay on their disks (logged).
  absl::Status DropCollection(const std::string& name) override;
  absl::Status ListCollections(v1::ListCollectionsResponse* response) override;
  absl::Status GetCollection(const std::string& name, v1::GetCollectionResponse* response) override;
  absl::Status Flush(const std::string& name) override;
  absl::Status Upsert(const v1::UpsertRequest& request, v1::UpsertResponse* response) override;
  absl::Status Delete(const v1::DeleteRequest& request, v1::DeleteResponse* response) override;
  absl::Status Get(const v1::GetRequest& request, v1::GetResponse* response) override;
  absl::Status Search(const grpc::CallbackServerContext& call, const v1::SearchRequest& request,
                      v1::SearchResponse* response) override;

 private:
  // The stub of a live node; UNAVAILABLE naming it when it is not registered.
  absl::StatusOr<v1::ShardService::Stub*> StubOf(const std::string& node_id);
  // The READY collection `name`, else NOT_FOUND as a standalone server says it.
  absl::StatusOr<CollectionEntry> ReadyCollection(const std::string& name);
  // Records in etcd that these replicas ((shard, node) pairs) missed a write.
  absl::Status MarkStale(const std::string& name,
                         const std::vector<std::pair<uint32_t, std::string>>& replicas);
  // Waits until this router's view holds its own last write (so that a client reads it back
  // from the same router at once; other routers see it as their watch delivers it).
  void WaitUntilSeen(const std::string& key);
  // The serving replicas of a shard, rotated so that calls spread over them.
  std::vector<std::string> ReadOrder(const v1::ShardPlacement& placement);

  ClusterState* const state_;
  const RouterOptions options_;
  std::atomic<uint64_t> rotation_{0};
  tessera::internal::Mutex mu_;
  // By address: a node that moves gets a new channel.
  std::map<std::string, std::unique_ptr<v1::ShardService::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::cluster

#endif  // TESSERA_SERVER_CLUSTER_ROUTER_H_
