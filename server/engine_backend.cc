#include "server/engine_backend.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/convert.h"
#include "server/log.h"
#include "server/request_handlers.h"
#include "tessera/status_macros.h"

namespace tessera::server {

absl::Status EngineBackend::CreateCollection(const v1::CreateCollectionRequest& request,
                                             v1::CreateCollectionResponse* response) {
  if (request.replicas() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicas ", request.replicas(),
                     ": a standalone server holds one copy; replicas need a cluster (--role "
                     "router)"));
  }
  TESSERA_ASSIGN_OR_RETURN(const CollectionSchema schema, SchemaFromProto(request.schema()));
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                           context_->engine->CreateCollection(schema));
  SchemaToProto(collection->schema(), response->mutable_schema());
  Log("info", "collection created", {{"collection", schema.name}});
  return absl::OkStatus();
}

absl::Status EngineBackend::DropCollection(const std::string& name) {
  TESSERA_RETURN_IF_ERROR(context_->engine->DropCollection(name));
  Log("info", "collection dropped", {{"collection", name}});
  return absl::OkStatus();
}

absl::Status EngineBackend::ListCollections(v1::ListCollectionsResponse* response) {
  for (const std::string& name : context_->engine->ListCollections()) response->add_names(name);
  return absl::OkStatus();
}

absl::Status EngineBackend::GetCollection(const std::string& name,
                                          v1::GetCollectionResponse* response) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                           context_->engine->GetCollection(name));
  SchemaToProto(collection->schema(), response->mutable_schema());
  StatsToProto(collection->Stats(), response->mutable_stats());
  return absl::OkStatus();
}

absl::Status EngineBackend::Flush(const std::string& name) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                           context_->engine->GetCollection(name));
  return collection->Snapshot();
}

absl::Status EngineBackend::Upsert(const v1::UpsertRequest& request, v1::UpsertResponse* response) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                           context_->engine->GetCollection(request.collection()));
  return UpsertDocuments(context_, *collection, request.documents(), response);
}

absl::Status EngineBackend::Delete(const v1::DeleteRequest& request, v1::DeleteResponse* response) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                           context_->engine->GetCollection(request.collection()));
  if (request.has_filter()) {
    TESSERA_RETURN_IF_ERROR(CheckDeleteByFilter(request));
    TESSERA_ASSIGN_OR_RETURN(const Filter filter, FilterFromProto(request.filter()));
    TESSERA_ASSIGN_OR_RETURN(const int64_t deleted, collection->DeleteMatching(filter));
    response->set_deleted(static_cast<uint64_t>(deleted));
    return absl::OkStatus();
  }
  const std::vector<std::string> ids(request.ids().begin(), request.ids().end());
  TESSERA_ASSIGN_OR_RETURN(const std::vector<bool> existed, collection->Delete(ids));
  uint64_t deleted = 0;
  for (bool e : existed) {
    response->add_existed(e);
    deleted += e ? 1 : 0;
  }
  response->set_deleted(deleted);
  return absl::OkStatus();
}

absl::Status EngineBackend::Count(const v1::CountRequest& request, v1::CountResponse* response) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                           context_->engine->GetCollection(request.collection()));
  TESSERA_ASSIGN_OR_RETURN(const Filter filter, FilterFromProto(request.filter()));
  TESSERA_ASSIGN_OR_RETURN(const int64_t count, collection->Count(filter));
  response->set_count(static_cast<uint64_t>(count));
  return absl::OkStatus();
}

absl::Status EngineBackend::Scroll(const v1::ScrollRequest& request, v1::ScrollResponse* response) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                           context_->engine->GetCollection(request.collection()));
  TESSERA_ASSIGN_OR_RETURN(const ScrollOptions options, ScrollOptionsFromProto(request));
  TESSERA_ASSIGN_OR_RETURN(ScrollPage page, collection->Scroll(options));
  ScrollPageToProto(std::move(page), response);
  return absl::OkStatus();
}

absl::Status EngineBackend::Get(const v1::GetRequest& request, v1::GetResponse* response) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                           context_->engine->GetCollection(request.collection()));
  // The vectors as stored: they go onto the wire in the same bytes, with no fp32 round trip.
  GetOptions options;
  options.stored_bytes = true;
  TESSERA_ASSIGN_OR_RETURN(StoredDocument document, collection->Get(request.id(), options));
  StoredDocumentToProto(std::move(document), response);
  return absl::OkStatus();
}

absl::Status EngineBackend::Search(const grpc::CallbackServerContext& call,
                                   const v1::SearchRequest& request, v1::SearchResponse* response) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                           context_->engine->GetCollection(request.collection()));
  TESSERA_ASSIGN_OR_RETURN(SearchResult result,
                           SearchCollection(context_, call, *collection, request));
  SearchResultToProto(result, response);
  return absl::OkStatus();
}

}  // namespace tessera::server
