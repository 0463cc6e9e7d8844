// What the public services (server/services.h) serve from: the local engine of a standalone
// server (server/engine_backend.h) or the shard nodes behind a router (server/cluster/router.h).
// The services own admission, deadlines, metrics and the status mapping; a backend turns one
// request into its response. Clients cannot tell the two apart, except by the cluster fields a
// router fills in (GetCollectionResponse.shards, Timings.fanout_ms, missing_shards).
#ifndef TESSERA_SERVER_BACKEND_H_
#define TESSERA_SERVER_BACKEND_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "tessera/v1/admin.pb.h"
#include "tessera/v1/ingest.pb.h"
#include "tessera/v1/query.pb.h"

namespace tessera::server {

// Thread-safe. Every method returns the public API's errors: INVALID_ARGUMENT naming the field,
// NOT_FOUND for an unknown collection, and so on; a collection name has been checked non-empty.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual absl::Status CreateCollection(const v1::CreateCollectionRequest& request,
                                        v1::CreateCollectionResponse* response) = 0;
  virtual absl::Status DropCollection(const std::string& name) = 0;
  virtual absl::Status ListCollections(v1::ListCollectionsResponse* response) = 0;
  virtual absl::Status GetCollection(const std::string& name,
                                     v1::GetCollectionResponse* response) = 0;
  virtual absl::Status Flush(const std::string& name) = 0;
  // One message of an Upsert stream: OK with one result per document, in order, or the
  // request-level error that ends the stream.
  virtual absl::Status Upsert(const v1::UpsertRequest& request, v1::UpsertResponse* response) = 0;
  // By ids, or by filter (DeleteRequest.filter; not both).
  virtual absl::Status Delete(const v1::DeleteRequest& request, v1::DeleteResponse* response) = 0;
  virtual absl::Status Count(const v1::CountRequest& request, v1::CountResponse* response) = 0;
  virtual absl::Status Scroll(const v1::ScrollRequest& request, v1::ScrollResponse* response) = 0;
  virtual absl::Status Get(const v1::GetRequest& request, v1::GetResponse* response) = 0;
  // `call` gives the caller's deadline and cancellation.
  virtual absl::Status Search(const grpc::CallbackServerContext& call,
                              const v1::SearchRequest& request, v1::SearchResponse* response) = 0;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_BACKEND_H_
