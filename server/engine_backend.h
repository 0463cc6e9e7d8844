// The backend of a standalone server: the public API over the process's own Engine.
#ifndef TESSERA_SERVER_ENGINE_BACKEND_H_
#define TESSERA_SERVER_ENGINE_BACKEND_H_

#include <string>

#include "server/backend.h"
#include "server/service_context.h"

namespace tessera::server {

// `context` (its engine, config and metrics) outlives the backend.
class EngineBackend final : public Backend {
 public:
  explicit EngineBackend(const ServiceContext* context) : context_(context) {}

  // INVALID_ARGUMENT for replicas > 1: one process holds one copy.
  absl::Status CreateCollection(const v1::CreateCollectionRequest& request,
                                v1::CreateCollectionResponse* response) override;
  absl::Status DropCollection(const std::string& name) override;
  absl::Status ListCollections(v1::ListCollectionsResponse* response) override;
  absl::Status GetCollection(const std::string& name, v1::GetCollectionResponse* response) override;
  absl::Status Flush(const std::string& name) override;
  absl::Status Upsert(const v1::UpsertRequest& request, v1::UpsertResponse* response) override;
  absl::Status Delete(const v1::DeleteRequest& request, v1::DeleteResponse* response) override;
  absl::Status Count(const v1::CountRequest& request, v1::CountResponse* response) override;
  absl::Status Scroll(const v1::ScrollRequest& request, v1::ScrollResponse* response) override;
  absl::Status Get(const v1::GetRequest& request, v1::GetResponse* response) override;
  absl::Status Search(const grpc::CallbackServerContext& call, const v1::SearchRequest& request,
                      v1::SearchResponse* response) override;

 private:
  const ServiceContext* context_;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_ENGINE_BACKEND_H_
