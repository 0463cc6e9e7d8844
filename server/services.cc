#include "server/services.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/convert.h"
#include "server/log.h"
#include "server/request_handlers.h"
#include "tessera/status_macros.h"
#include "tessera/wire/status.h"

namespace tessera::server {
namespace {

absl::Status CheckCollectionName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("collection: empty name");
  return absl::OkStatus();
}

absl::Status RunSearch(const ServiceContext* context, const grpc::CallbackServerContext& call,
                       const v1::SearchRequest& request, v1::SearchResponse* response) {
  TESSERA_RETURN_IF_ERROR(CheckCollectionName(request.collection()));
  return context->backend->Search(call, request, response);
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
    Finish(wire::ToGrpcStatus(status));
  }

  absl::Status Process() {
    TESSERA_RETURN_IF_ERROR(CheckCollectionName(request_.collection()));
    return context_->backend->Upsert(request_, &response_);
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
  return Serve(context_, call, "CreateCollection", 0, [this, request, response] {
    return context_->backend->CreateCollection(*request, response);
  });
}

grpc::ServerUnaryReactor* AdminServiceImpl::DropCollection(grpc::CallbackServerContext* call,
                                                           const v1::DropCollectionRequest* request,
                                                           v1::DropCollectionResponse*) {
  return Serve(context_, call, "DropCollection", 0, [this, request]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(CheckCollectionName(request->name()));
    return context_->backend->DropCollection(request->name());
  });
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListCollections(grpc::CallbackServerContext* call,
                                                            const v1::ListCollectionsRequest*,
                                                            v1::ListCollectionsResponse* response) {
  return Serve(context_, call, "ListCollections", 0,
               [this, response] { return context_->backend->ListCollections(response); });
}

grpc::ServerUnaryReactor* AdminServiceImpl::GetCollection(grpc::CallbackServerContext* call,
                                                          const v1::GetCollectionRequest* request,
                                                          v1::GetCollectionResponse* response) {
  return Serve(context_, call, "GetCollection", 0, [this, request, response]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(CheckCollectionName(request->name()));
    return context_->backend->GetCollection(request->name(), response);
  });
}

grpc::ServerUnaryReactor* AdminServiceImpl::Flush(grpc::CallbackServerContext* call,
                                                  const v1::FlushRequest* request,
                                                  v1::FlushResponse*) {
  return Serve(context_, call, "Flush", 0, [this, request]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(CheckCollectionName(request->name()));
    return context_->backend->Flush(request->name());
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
                 TESSERA_RETURN_IF_ERROR(CheckCollectionName(request->collection()));
                 return context_->backend->Delete(*request, response);
               });
}

grpc::ServerUnaryReactor* IngestServiceImpl::Get(grpc::CallbackServerContext* call,
                                                 const v1::GetRequest* request,
                                                 v1::GetResponse* response) {
  return Serve(context_, call, "Get", 0, [this, request, response]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(CheckCollectionName(request->collection()));
    return context_->backend->Get(*request, response);
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
  const int64_t searches = request->searches_size();
  if (searches > context_->config.max_searches_per_batch) {
    // Refused before admission, which would count every search.
    grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
    FinishCall(context_, call, reactor, "SearchBatch", Clock::now(),
               absl::ResourceExhaustedError(absl::StrCat(
                   "searches: ", searches, " in one SearchBatch exceeds the limit of ",
                   context_->config.max_searches_per_batch, " (--max_searches_per_batch)")));
    return reactor;
  }
  // Each search counts against the admission queue's bound, as that many Search calls would.
  return Serve(
      context_, call, "SearchBatch", static_cast<int64_t>(request->ByteSizeLong()),
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
      },
      std::max<int64_t>(searches, 1));
}

grpc::ServerUnaryReactor* QueryServiceImpl::Count(grpc::CallbackServerContext* call,
                                                  const v1::CountRequest* request,
                                                  v1::CountResponse* response) {
  return Serve(context_, call, "Count", static_cast<int64_t>(request->ByteSizeLong()),
               [this, request, response]() -> absl::Status {
                 TESSERA_RETURN_IF_ERROR(CheckCollectionName(request->collection()));
                 return context_->backend->Count(*request, response);
               });
}

grpc::ServerUnaryReactor* QueryServiceImpl::Scroll(grpc::CallbackServerContext* call,
                                                   const v1::ScrollRequest* request,
                                                   v1::ScrollResponse* response) {
  return Serve(context_, call, "Scroll", static_cast<int64_t>(request->ByteSizeLong()),
               [this, request, response]() -> absl::Status {
                 TESSERA_RETURN_IF_ERROR(CheckCollectionName(request->collection()));
                 return context_->backend->Scroll(*request, response);
               });
}

}  // namespace tessera::server
