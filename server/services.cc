#include "server/services.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/convert.h"
#include "server/handler_util.h"
#include "server/log.h"
#include "server/status_util.h"
#include "tessera/status_macros.h"

namespace tessera::server {
namespace {

absl::Status CheckCollectionName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("collection: empty name");
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Collection>> FindCollection(const ServiceContext* context,
                                                           const std::string& name) {
  TESSERA_RETURN_IF_ERROR(CheckCollectionName(name));
  return context->engine->GetCollection(name);
}

absl::Status RunSearch(const ServiceContext* context, const grpc::CallbackServerContext& call,
                       const v1::SearchRequest& request, v1::SearchResponse* response) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                           FindCollection(context, request.collection()));
  return SearchCollection(context, call, *collection, request, response);
}

// One Upsert stream: each request message is validated, written durably and answered by one
// response, in order. A request-level problem (unknown collection, too many documents) ends the
// stream with its status; what earlier messages wrote stays written.
class UpsertReactor final : public grpc::ServerBidiReactor<v1::UpsertRequest, v1::UpsertResponse> {
 public:
  UpsertReactor(const ServiceContext* context, grpc::CallbackServerContext* call)
      : context_(context), call_(call), start_(Clock::now()) {
    const absl::Status admitted = context_->admission->BeginCall();
    if (!admitted.ok()) {
      Done(admitted);
      return;
    }
    open_ = true;
    StartRead(&request_);
  }

  // Each message is processed on an admission worker; the next is read only after its response
  // is written, so at most one message of a stream is in flight.
  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side (or the call broke)
      Done(call_->IsCancelled() ? absl::CancelledError() : absl::OkStatus());
      return;
    }
    const absl::Status admitted = context_->admission->Submit(
        static_cast<int64_t>(request_.ByteSizeLong()),
        [this] {
          absl::Status status = StillWanted(*call_);
          if (status.ok()) {
            response_.Clear();
            status = Process();
          }
          if (!status.ok()) {
            Done(status);
            return;
          }
          StartWrite(&response_);
        },
        AdmissionDeadline(*call_));
    if (!admitted.ok()) Done(admitted);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Done(absl::CancelledError());
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override {
    if (open_) context_->admission->EndCall();
    context_->metrics->RecordRpc(
        "Upsert", absl::StatusCodeToString(final_code_),
        std::chrono::duration<double, std::milli>(Clock::now() - start_).count());
    delete this;
  }

 private:
  // Ends the stream with `status`, mapped to gRPC's here.
  void Done(const absl::Status& status) {
    final_code_ = status.code();
    Finish(ToGrpcStatus(status));
  }

  absl::Status Process() {
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                             FindCollection(context_, request_.collection()));
    return UpsertDocuments(context_, *collection, request_.documents(), &response_);
  }

  const ServiceContext* context_;
  grpc::CallbackServerContext* call_;
  const Clock::time_point start_;
  absl::StatusCode final_code_ = absl::StatusCode::kOk;
  bool open_ = false;  // counted by the admission as an open call
  v1::UpsertRequest request_;
  v1::UpsertResponse response_;
};

}  // namespace

grpc::ServerUnaryReactor* AdminServiceImpl::CreateCollection(
    grpc::CallbackServerContext* call, const v1::CreateCollectionRequest* request,
    v1::CreateCollectionResponse* response) {
  return Serve(context_, call, "CreateCollection", 0, [this, request, response]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(const CollectionSchema schema, SchemaFromProto(request->schema()));
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                             context_->engine->CreateCollection(schema));
    SchemaToProto(collection->schema(), response->mutable_schema());
    Log("info", "collection created", {{"collection", schema.name}});
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminServiceImpl::DropCollection(grpc::CallbackServerContext* call,
                                                           const v1::DropCollectionRequest* request,
                                                           v1::DropCollectionResponse*) {
  return Serve(context_, call, "DropCollection", 0, [this, request]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(CheckCollectionName(request->name()));
    TESSERA_RETURN_IF_ERROR(context_->engine->DropCollection(request->name()));
    Log("info", "collection dropped", {{"collection", request->name()}});
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListCollections(grpc::CallbackServerContext* call,
                                                            const v1::ListCollectionsRequest*,
                                                            v1::ListCollectionsResponse* response) {
  return Serve(context_, call, "ListCollections", 0, [this, response]() -> absl::Status {
    for (const std::string& name : context_->engine->ListCollections()) response->add_names(name);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminServiceImpl::GetCollection(grpc::CallbackServerContext* call,
                                                          const v1::GetCollectionRequest* request,
                                                          v1::GetCollectionResponse* response) {
  return Serve(context_, call, "GetCollection", 0, [this, request, response]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                             FindCollection(context_, request->name()));
    SchemaToProto(collection->schema(), response->mutable_schema());
    StatsToProto(collection->Stats(), response->mutable_stats());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminServiceImpl::Flush(grpc::CallbackServerContext* call,
                                                  const v1::FlushRequest* request,
                                                  v1::FlushResponse*) {
  return Serve(context_, call, "Flush", 0, [this, request]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                             FindCollection(context_, request->name()));
    return collection->Snapshot();
  });
}

grpc::ServerBidiReactor<v1::UpsertRequest, v1::UpsertResponse>* IngestServiceImpl::Upsert(
    grpc::CallbackServerContext* call) {
  return new UpsertReactor(context_, call);
}

grpc::ServerUnaryReactor* IngestServiceImpl::Delete(grpc::CallbackServerContext* call,
                                                    const v1::DeleteRequest* request,
                                                    v1::DeleteResponse* response) {
  return Serve(context_, call, "Delete", static_cast<int64_t>(request->ByteSizeLong()),
               [this, request, response]() -> absl::Status {
                 TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                                          FindCollection(context_, request->collection()));
                 const std::vector<std::string> ids(request->ids().begin(), request->ids().end());
                 TESSERA_ASSIGN_OR_RETURN(const std::vector<bool> existed, collection->Delete(ids));
                 for (bool e : existed) response->add_existed(e);
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* IngestServiceImpl::Get(grpc::CallbackServerContext* call,
                                                 const v1::GetRequest* request,
                                                 v1::GetResponse* response) {
  return Serve(context_, call, "Get", 0, [this, request, response]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                             FindCollection(context_, request->collection()));
    // The vectors as stored: they go onto the wire in the same bytes, with no fp32 round trip.
    GetOptions options;
    options.stored_bytes = true;
    TESSERA_ASSIGN_OR_RETURN(StoredDocument document, collection->Get(request->id(), options));
    StoredDocumentToProto(std::move(document), response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QueryServiceImpl::Search(grpc::CallbackServerContext* call,
                                                   const v1::SearchRequest* request,
                                                   v1::SearchResponse* response) {
  return Serve(
      context_, call, "Search", static_cast<int64_t>(request->ByteSizeLong()),
      [this, call, request, response] { return RunSearch(context_, *call, *request, response); });
}

grpc::ServerUnaryReactor* QueryServiceImpl::SearchBatch(grpc::CallbackServerContext* call,
                                                        const v1::SearchBatchRequest* request,
                                                        v1::SearchBatchResponse* response) {
  return Serve(context_, call, "SearchBatch", static_cast<int64_t>(request->ByteSizeLong()),
               [this, call, request, response]() -> absl::Status {
                 for (int i = 0; i < request->searches_size(); ++i) {
                   const absl::Status search =
                       RunSearch(context_, *call, request->searches(i), response->add_responses());
                   if (!search.ok()) {
                     return absl::Status(search.code(),
                                         absl::StrCat("searches[", i, "]: ", search.message()));
                   }
                 }
                 return absl::OkStatus();
               });
}

}  // namespace tessera::server
