// The public gRPC services (callback API). Handlers are thin: admit the request, hand it to the
// backend (the engine, or the cluster behind a router: server/backend.h), finish with the status
// mapped in one place. API keys are
// checked before a handler runs, by the server's credentials (server/credentials.h); handlers run
// on the admission's workers, not on gRPC's threads (server/admission.h).
#ifndef TESSERA_SERVER_SERVICES_H_
#define TESSERA_SERVER_SERVICES_H_

#include <functional>
#include <string>

#include "server/service_context.h"
#include "tessera/v1/admin.grpc.pb.h"
#include "tessera/v1/ingest.grpc.pb.h"
#include "tessera/v1/query.grpc.pb.h"

namespace tessera::server {

// The snapshot handlers' pieces that a shard node's ShardService serves too
// (server/snapshot_handlers.cc): `method` names the RPC in the metrics and logs; `check_name`,
// when set, vets the new collection's name of a restore.
void SnapshotInfoToProto(const SnapshotManifest& manifest, v1::SnapshotInfo* out);
grpc::ServerWriteReactor<v1::SnapshotChunk>* NewSnapshotDownload(
    const ServiceContext* context, const v1::DownloadSnapshotRequest& request, const char* method);
grpc::ServerReadReactor<v1::RestoreSnapshotRequest>* NewSnapshotRestore(
    const ServiceContext* context, grpc::CallbackServerContext* call,
    v1::RestoreSnapshotResponse* response, const char* method,
    std::function<absl::Status(const std::string&)> check_name);

class AdminServiceImpl final : public v1::AdminService::CallbackService {
 public:
  explicit AdminServiceImpl(const ServiceContext* context) : context_(context) {}
  grpc::ServerUnaryReactor* CreateCollection(grpc::CallbackServerContext* call,
                                             const v1::CreateCollectionRequest* request,
                                             v1::CreateCollectionResponse* response) override;
  grpc::ServerUnaryReactor* DropCollection(grpc::CallbackServerContext* call,
                                           const v1::DropCollectionRequest* request,
                                           v1::DropCollectionResponse* response) override;
  grpc::ServerUnaryReactor* ListCollections(grpc::CallbackServerContext* call,
                                            const v1::ListCollectionsRequest* request,
                                            v1::ListCollectionsResponse* response) override;
  grpc::ServerUnaryReactor* GetCollection(grpc::CallbackServerContext* call,
                                          const v1::GetCollectionRequest* request,
                                          v1::GetCollectionResponse* response) override;
  grpc::ServerUnaryReactor* Flush(grpc::CallbackServerContext* call,
                                  const v1::FlushRequest* request,
                                  v1::FlushResponse* response) override;
  // Snapshots (server/snapshot_handlers.cc).
  grpc::ServerUnaryReactor* CreateSnapshot(grpc::CallbackServerContext* call,
                                           const v1::CreateSnapshotRequest* request,
                                           v1::CreateSnapshotResponse* response) override;
  grpc::ServerUnaryReactor* ListSnapshots(grpc::CallbackServerContext* call,
                                          const v1::ListSnapshotsRequest* request,
                                          v1::ListSnapshotsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteSnapshot(grpc::CallbackServerContext* call,
                                           const v1::DeleteSnapshotRequest* request,
                                           v1::DeleteSnapshotResponse* response) override;
  grpc::ServerWriteReactor<v1::SnapshotChunk>* DownloadSnapshot(
      grpc::CallbackServerContext* call, const v1::DownloadSnapshotRequest* request) override;
  grpc::ServerReadReactor<v1::RestoreSnapshotRequest>* RestoreSnapshot(
      grpc::CallbackServerContext* call, v1::RestoreSnapshotResponse* response) override;

 private:
  const ServiceContext* context_;
};

class IngestServiceImpl final : public v1::IngestService::CallbackService {
 public:
  explicit IngestServiceImpl(const ServiceContext* context) : context_(context) {}
  grpc::ServerBidiReactor<v1::UpsertRequest, v1::UpsertResponse>* Upsert(
      grpc::CallbackServerContext* call) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* call,
                                   const v1::DeleteRequest* request,
                                   v1::DeleteResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* call, const v1::GetRequest* request,
                                v1::GetResponse* response) override;

 private:
  const ServiceContext* context_;
};

class QueryServiceImpl final : public v1::QueryService::CallbackService {
 public:
  explicit QueryServiceImpl(const ServiceContext* context) : context_(context) {}
  grpc::ServerUnaryReactor* Search(grpc::CallbackServerContext* call,
                                   const v1::SearchRequest* request,
                                   v1::SearchResponse* response) override;
  grpc::ServerUnaryReactor* SearchBatch(grpc::CallbackServerContext* call,
                                        const v1::SearchBatchRequest* request,
                                        v1::SearchBatchResponse* response) override;
  grpc::ServerUnaryReactor* Count(grpc::CallbackServerContext* call,
                                  const v1::CountRequest* request,
                                  v1::CountResponse* response) override;
  grpc::ServerUnaryReactor* Scroll(grpc::CallbackServerContext* call,
                                   const v1::ScrollRequest* request,
                                   v1::ScrollResponse* response) override;

 private:
  const ServiceContext* context_;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_SERVICES_H_
