// Copying a shard replica between shard nodes, for the catch-up of a stale replica (DESIGN §7;
// shard.proto's CopyReplica/ImportReplica). The node of a serving replica closes the replica to
// writes (WriteGate), checkpoints it (Engine::CheckpointCollection: RocksDB checkpoints, hard
// links) and streams the files to the target node, which writes them durably under its engine's
// staging directory and swaps them in (Engine::RestoreCollection). The gate stays closed until the
// target has swapped the copy in, so the copy holds every write the source acknowledged.
#ifndef TESSERA_SERVER_CLUSTER_REPLICA_COPY_H_
#define TESSERA_SERVER_CLUSTER_REPLICA_COPY_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/service_context.h"
#include "tessera/base/mutex.h"
#include "tessera/v1/shard.grpc.pb.h"

namespace tessera::server {

// Per local collection: writes in flight, and whether writes are closed for a copy. Thread-safe.
class WriteGate {
 public:
  // ABORTED naming the collection while it is closed; otherwise counts a write in until EndWrite.
  absl::Status BeginWrite(const std::string& collection, absl::string_view shown_name);
  void EndWrite(const std::string& collection);
  // Closes the collection to new writes and waits for those in flight. ABORTED when it is
  // already closed (another copy runs).
  absl::Status Close(const std::string& collection, absl::string_view shown_name);
  void Open(const std::string& collection);

 private:
  Mutex mu_;
  CondVar idle_;
  std::map<std::string, int> writers_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> closed_ ABSL_GUARDED_BY(mu_);
};

// Checkpoints local collection `local` of `engine` and streams it to the ShardService at
// `target_address` as replica `replica` (ImportReplica), waiting for the target to swap it in.
// The caller holds the collection's WriteGate closed. The call uses `credentials`; `cluster_key`,
// when not empty, is the API key sent to the target. Files and bytes sent go to `response`.
absl::Status SendReplicaCopy(Engine* engine, const std::string& local,
                             const v1::ShardReplica& replica, const std::string& target_address,
                             const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                             const std::string& cluster_key, v1::ShardCopyResponse* response);

// The server side of ImportReplica: `local_name` maps the replica named in the first message to
// the engine's collection name (INVALID_ARGUMENT for a bad one). The stream's files go to a fresh
// directory under the engine's staging directory, each fsynced; when the stream ends they replace
// the collection (Engine::RestoreCollection). Deletes itself when done.
grpc::ServerReadReactor<v1::ShardImportChunk>* NewImportReactor(
    const ServiceContext* context, grpc::CallbackServerContext* call,
    std::function<absl::StatusOr<std::string>(const v1::ShardReplica&)> local_name);

}  // namespace tessera::server

#endif  // TESSERA_SERVER_CLUSTER_REPLICA_COPY_H_
