// The internal ShardService (proto/tessera/v1/shard.proto) of a `--role shard` node: the replicas
// of cluster collections' shards that the node holds, served over its one Engine. Handlers are
// thin, as the public ones (server/services.h): the same conversions and checks, run on the
// admission's workers, API keys checked by the transport (ShardService needs the admin scope).
//
// Replica naming: shard i of the cluster collection "papers" is the local collection
// "papers.shard-i" (i in decimal, no leading zeros), created with one local shard. The suffix uses
// only characters of the collection-name rule, and the map is one-to-one: the last ".shard-"
// separates the cluster name (which may itself contain ".shard-") from the index. A shard node's
// engine holds replicas only. So that every replica name keeps to the rule's 128 characters, a
// cluster collection's name has at most kMaxClusterCollectionName characters and a shard index
// is below kMaxShards (the schema's num_shards bound). Messages from the engine name the cluster
// collection, never the local one, so that they read as the public API's do.
#ifndef TESSERA_SERVER_CLUSTER_SHARD_SERVICE_H_
#define TESSERA_SERVER_CLUSTER_SHARD_SERVICE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "server/cluster/replica_copy.h"
#include "server/service_context.h"
#include "tessera/v1/shard.grpc.pb.h"

namespace tessera::server {

inline constexpr uint32_t kMaxShards = tessera::kMaxShards;
// 128 minus the longest suffix, ".shard-255".
inline constexpr size_t kMaxClusterCollectionName = 118;

// "<collection>.shard-<shard>".
std::string ReplicaName(absl::string_view collection, uint32_t shard);
// The (collection, shard) of a replica's local name; nullopt for a name ReplicaName does not
// produce.
std::optional<std::pair<std::string, uint32_t>> ParseReplicaName(absl::string_view local_name);

// Thread-safe (state is the engine's). `context` outlives the service.
class ShardServiceImpl final : public v1::ShardService::CallbackService {
 public:
  ShardServiceImpl(const ServiceContext* context, std::string node_id)
      : context_(context), node_id_(std::move(node_id)) {}

  // Every method answers INVALID_ARGUMENT for an empty collection name or a shard ≥ kMaxShards,
  // NOT_FOUND for a replica the node does not hold, and otherwise what the public method of the
  // same name answers for the replica's collection.
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* call,
                                 const v1::ShardInfoRequest* request,
                                 v1::ShardInfoResponse* response) override;
  // Also INVALID_ARGUMENT for shard ≥ schema.num_shards or a name longer than
  // kMaxClusterCollectionName; ALREADY_EXISTS for a replica the node holds.
  grpc::ServerUnaryReactor* CreateCollection(grpc::CallbackServerContext* call,
                                             const v1::ShardCreateCollectionRequest* request,
                                             v1::ShardCreateCollectionResponse* response) override;
  grpc::ServerUnaryReactor* DropCollection(grpc::CallbackServerContext* call,
                                           const v1::ShardDropCollectionRequest* request,
                                           v1::ShardDropCollectionResponse* response) override;
  // RESOURCE_EXHAUSTED beyond max_documents_per_batch; otherwise OK with a result per document.
  grpc::ServerUnaryReactor* Upsert(grpc::CallbackServerContext* call,
                                   const v1::ShardUpsertRequest* request,
                                   v1::UpsertResponse* response) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* call,
                                   const v1::ShardDeleteRequest* request,
                                   v1::DeleteResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* call,
                                const v1::ShardGetRequest* request,
                                v1::GetResponse* response) override;
  grpc::ServerUnaryReactor* GetSparseStatistics(grpc::CallbackServerContext* call,
                                                const v1::ShardSparseStatisticsRequest* request,
                                                v1::SparseStatistics* response) override;
  grpc::ServerUnaryReactor* Count(grpc::CallbackServerContext* call,
                                  const v1::ShardCountRequest* request,
                                  v1::CountResponse* response) override;
  grpc::ServerUnaryReactor* Scroll(grpc::CallbackServerContext* call,
                                   const v1::ShardScrollRequest* request,
                                   v1::ScrollResponse* response) override;
  grpc::ServerUnaryReactor* Search(grpc::CallbackServerContext* call,
                                   const v1::ShardSearchRequest* request,
                                   v1::ShardSearchResponse* response) override;
  // The replica's schema under the cluster name (num_shards the cluster's) and its statistics.
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* call,
                                  const v1::ShardStatsRequest* request,
                                  v1::GetCollectionResponse* response) override;
  grpc::ServerUnaryReactor* Flush(grpc::CallbackServerContext* call,
                                  const v1::ShardFlushRequest* request,
                                  v1::ShardFlushResponse* response) override;
  // Closes the replica to writes (Upsert and Delete answer ABORTED), copies it to the target
  // node and reopens it once the target has swapped the copy in (server/cluster/replica_copy.h).
  // ABORTED when a copy of the replica already runs.
  grpc::ServerUnaryReactor* CopyReplica(grpc::CallbackServerContext* call,
                                        const v1::ShardCopyRequest* request,
                                        v1::ShardCopyResponse* response) override;
  grpc::ServerReadReactor<v1::ShardImportChunk>* ImportReplica(
      grpc::CallbackServerContext* call, v1::ShardImportResponse* response) override;
  // Snapshots of replicas with the node's SnapshotStore, for a router's cluster snapshots.
  grpc::ServerUnaryReactor* CreateReplicaSnapshot(grpc::CallbackServerContext* call,
                                                  const v1::ShardSnapshotRequest* request,
                                                  v1::ShardSnapshotResponse* response) override;
  grpc::ServerUnaryReactor* DeleteReplicaSnapshot(grpc::CallbackServerContext* call,
                                                  const v1::DeleteSnapshotRequest* request,
                                                  v1::DeleteSnapshotResponse* response) override;
  grpc::ServerWriteReactor<v1::SnapshotChunk>* DownloadReplicaSnapshot(
      grpc::CallbackServerContext* call, const v1::DownloadSnapshotRequest* request) override;
  grpc::ServerReadReactor<v1::RestoreSnapshotRequest>* RestoreReplicaSnapshot(
      grpc::CallbackServerContext* call, v1::RestoreSnapshotResponse* response) override;

 private:
  const ServiceContext* context_;
  const std::string node_id_;
  WriteGate gate_;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_CLUSTER_SHARD_SERVICE_H_
