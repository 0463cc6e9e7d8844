#include "server/services.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/convert.h"
#include "server/log.h"
#include "server/status_util.h"
#include "tessera/status_macros.h"

namespace tessera::server {
namespace {

using Clock = std::chrono::steady_clock;

const char* CodeName(grpc::StatusCode code) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  const int index = static_cast<int>(code);
  return index >= 0 && index <= 16 ? kNames[index] : "UNKNOWN";
}

// Finishes a unary call, recording its metrics. Returns the reactor to hand back to gRPC.
grpc::ServerUnaryReactor* Finish(const ServiceContext* context, grpc::CallbackServerContext* call,
                                 const char* method, Clock::time_point start,
                                 const grpc::Status& status) {
  context->metrics->RecordRpc(
      method, CodeName(status.error_code()),
      std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  if (!status.ok() && status.error_code() != grpc::StatusCode::NOT_FOUND &&
      status.error_code() != grpc::StatusCode::INVALID_ARGUMENT) {
    Log("warning", "rpc failed",
        {{"method", method},
         {"code", CodeName(status.error_code())},
         {"message", status.error_message()},
         {"peer", call->peer()}});
  }
  grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

// The engine deadline for a call: the client's deadline, if any.
Clock::time_point DeadlineOf(const grpc::CallbackServerContext& call) {
  const auto deadline = call.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return Clock::time_point::max();
  return Clock::now() + (deadline - std::chrono::system_clock::now());
}

absl::StatusOr<std::shared_ptr<Collection>> FindCollection(const ServiceContext* context,
                                                           const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("collection: empty name");
  return context->engine->GetCollection(name);
}

absl::Status RunSearch(const ServiceContext* context, const grpc::CallbackServerContext& call,
                       const v1::SearchRequest& request, v1::SearchResponse* response) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                           FindCollection(context, request.collection()));
  const ServerConfig& config = context->config;
  if (request.query().rows() == 0) {
    return absl::InvalidArgumentError("query: 0 tokens, expected at least 1");
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<float> query,
                           DecodeMatrix(request.query(), collection->schema().dim, "query"));
  SearchOptions options;
  options.k = request.k() == 0 ? 10 : static_cast<int>(std::min<uint32_t>(request.k(), 1u << 30));
  if (options.k > config.max_k) {
    return absl::InvalidArgumentError(
        absl::StrCat("k ", request.k(), " exceeds the limit of ", config.max_k));
  }
  if (request.num_candidates() > static_cast<uint64_t>(config.max_num_candidates)) {
    return absl::InvalidArgumentError(absl::StrCat("num_candidates ", request.num_candidates(),
                                                   " exceeds the limit of ",
                                                   config.max_num_candidates));
  }
  options.num_candidates = static_cast<int>(request.num_candidates());
  if (options.num_candidates != 0 && options.num_candidates < options.k) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_candidates ", options.num_candidates, " is below k ", options.k));
  }
  options.per_token_candidates =
      static_cast<int>(std::min<uint32_t>(request.per_token_candidates(), 100000));
  // Clamped below int's range; the collection names the accepted range.
  options.nprobe = static_cast<int>(std::min<uint32_t>(request.nprobe(), 1u << 30));
  TESSERA_ASSIGN_OR_RETURN(options.filter, FilterFromProto(request.filter()));
  options.exhaustive = request.exhaustive();
  options.explain = request.explain();
  options.deadline = DeadlineOf(call);
  const FloatMatrixView view{query.data(), request.query().rows(), request.query().cols()};
  TESSERA_ASSIGN_OR_RETURN(SearchResult result, collection->Search(view, options));
  context->metrics->RecordSearchStages(result.timings.candidates_ms, result.timings.fetch_ms,
                                       result.timings.rerank_ms);
  SearchResultToProto(result, response);
  return absl::OkStatus();
}

// One Upsert stream: each request message is validated, written durably and answered by one
// response, in order. A request-level problem (unknown collection, too many documents) ends the
// stream with its status; what earlier messages wrote stays written.
class UpsertReactor final : public grpc::ServerBidiReactor<v1::UpsertRequest, v1::UpsertResponse> {
 public:
  UpsertReactor(const ServiceContext* context, grpc::CallbackServerContext* call)
      : context_(context), call_(call), start_(Clock::now()) {
    const grpc::Status allowed = context_->keys->Check(*call_, Scope::kWrite);
    if (!allowed.ok()) {
      Done(allowed);
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side (or the call broke)
      Done(call_->IsCancelled() ? grpc::Status::CANCELLED : grpc::Status::OK);
      return;
    }
    if (call_->IsCancelled()) {
      Done(grpc::Status::CANCELLED);
      return;
    }
    response_.Clear();
    const absl::Status status = Process();
    if (!status.ok()) {
      Done(ToGrpcStatus(status));
      return;
    }
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Done(grpc::Status::CANCELLED);
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override {
    context_->metrics->RecordRpc(
        "Upsert", CodeName(final_code_),
        std::chrono::duration<double, std::milli>(Clock::now() - start_).count());
    delete this;
  }

 private:
  void Done(const grpc::Status& status) {
    final_code_ = status.error_code();
    Finish(status);
  }

  absl::Status Process() {
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                             FindCollection(context_, request_.collection()));
    if (request_.documents_size() > context_->config.max_documents_per_batch) {
      return absl::ResourceExhaustedError(absl::StrCat("documents: ", request_.documents_size(),
                                                       " in one message exceeds the limit of ",
                                                       context_->config.max_documents_per_batch));
    }
    const int64_t dim = collection->schema().dim;
    std::vector<Document> documents;
    std::vector<int> positions;  // request index of each document sent to the engine
    std::vector<absl::Status> early(request_.documents_size());
    for (int i = 0; i < request_.documents_size(); ++i) {
      absl::StatusOr<Document> document = DocumentFromProto(request_.documents(i), dim, i);
      if (document.ok()) {
        positions.push_back(i);
        documents.push_back(std::move(*document));
      } else {
        early[i] = document.status();
      }
    }
    int64_t tokens = 0;
    for (const Document& document : documents) tokens += document.num_tokens;
    const std::vector<UpsertOutcome> outcomes = collection->Upsert(std::move(documents));
    int64_t accepted = 0, vectors = 0;
    size_t next = 0;
    for (int i = 0; i < request_.documents_size(); ++i) {
      v1::DocumentResult* result = response_.add_results();
      result->set_id(request_.documents(i).id());
      absl::Status status = early[i];
      if (status.ok()) {
        const UpsertOutcome& outcome = outcomes[next++];
        status = outcome.status;
        result->set_version(outcome.version);
        result->set_num_vectors(static_cast<uint32_t>(outcome.num_vectors));
        if (status.ok()) {
          ++accepted;
          vectors += outcome.num_vectors;
        }
      }
      result->set_code(static_cast<int32_t>(status.code()));
      result->set_message(std::string(status.message()));
    }
    context_->metrics->RecordDocuments(accepted, request_.documents_size() - accepted, tokens,
                                       vectors);
    return absl::OkStatus();
  }

  const ServiceContext* context_;
  grpc::CallbackServerContext* call_;
  const Clock::time_point start_;
  grpc::StatusCode final_code_ = grpc::StatusCode::OK;
  v1::UpsertRequest request_;
  v1::UpsertResponse response_;
};

}  // namespace

grpc::ServerUnaryReactor* AdminServiceImpl::CreateCollection(
    grpc::CallbackServerContext* call, const v1::CreateCollectionRequest* request,
    v1::CreateCollectionResponse* response) {
  const Clock::time_point start = Clock::now();
  grpc::Status status = context_->keys->Check(*call, Scope::kAdmin);
  if (status.ok()) {
    absl::StatusOr<CollectionSchema> schema = SchemaFromProto(request->schema());
    if (schema.ok()) {
      auto collection = context_->engine->CreateCollection(*schema);
      if (collection.ok()) {
        SchemaToProto((*collection)->schema(), response->mutable_schema());
        Log("info", "collection created", {{"collection", schema->name}});
      }
      status = ToGrpcStatus(collection.status());
    } else {
      status = ToGrpcStatus(schema.status());
    }
  }
  return Finish(context_, call, "CreateCollection", start, status);
}

grpc::ServerUnaryReactor* AdminServiceImpl::DropCollection(grpc::CallbackServerContext* call,
                                                           const v1::DropCollectionRequest* request,
                                                           v1::DropCollectionResponse*) {
  const Clock::time_point start = Clock::now();
  grpc::Status status = context_->keys->Check(*call, Scope::kAdmin);
  if (status.ok()) {
    status = ToGrpcStatus(context_->engine->DropCollection(request->name()));
    if (status.ok()) Log("info", "collection dropped", {{"collection", request->name()}});
  }
  return Finish(context_, call, "DropCollection", start, status);
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListCollections(grpc::CallbackServerContext* call,
                                                            const v1::ListCollectionsRequest*,
                                                            v1::ListCollectionsResponse* response) {
  const Clock::time_point start = Clock::now();
  const grpc::Status status = context_->keys->Check(*call, Scope::kRead);
  if (status.ok()) {
    for (const std::string& name : context_->engine->ListCollections()) response->add_names(name);
  }
  return Finish(context_, call, "ListCollections", start, status);
}

grpc::ServerUnaryReactor* AdminServiceImpl::GetCollection(grpc::CallbackServerContext* call,
                                                          const v1::GetCollectionRequest* request,
                                                          v1::GetCollectionResponse* response) {
  const Clock::time_point start = Clock::now();
  grpc::Status status = context_->keys->Check(*call, Scope::kRead);
  if (status.ok()) {
    auto collection = FindCollection(context_, request->name());
    if (collection.ok()) {
      SchemaToProto((*collection)->schema(), response->mutable_schema());
      StatsToProto((*collection)->Stats(), response->mutable_stats());
    }
    status = ToGrpcStatus(collection.status());
  }
  return Finish(context_, call, "GetCollection", start, status);
}

grpc::ServerUnaryReactor* AdminServiceImpl::Flush(grpc::CallbackServerContext* call,
                                                  const v1::FlushRequest* request,
                                                  v1::FlushResponse*) {
  const Clock::time_point start = Clock::now();
  grpc::Status status = context_->keys->Check(*call, Scope::kWrite);
  if (status.ok()) {
    auto collection = FindCollection(context_, request->name());
    status = ToGrpcStatus(collection.ok() ? (*collection)->Snapshot() : collection.status());
  }
  return Finish(context_, call, "Flush", start, status);
}

grpc::ServerBidiReactor<v1::UpsertRequest, v1::UpsertResponse>* IngestServiceImpl::Upsert(
    grpc::CallbackServerContext* call) {
  return new UpsertReactor(context_, call);
}

grpc::ServerUnaryReactor* IngestServiceImpl::Delete(grpc::CallbackServerContext* call,
                                                    const v1::DeleteRequest* request,
                                                    v1::DeleteResponse* response) {
  const Clock::time_point start = Clock::now();
  grpc::Status status = context_->keys->Check(*call, Scope::kWrite);
  if (status.ok()) {
    auto collection = FindCollection(context_, request->collection());
    if (collection.ok()) {
      const std::vector<std::string> ids(request->ids().begin(), request->ids().end());
      auto existed = (*collection)->Delete(ids);
      if (existed.ok()) {
        for (bool e : *existed) response->add_existed(e);
      }
      status = ToGrpcStatus(existed.status());
    } else {
      status = ToGrpcStatus(collection.status());
    }
  }
  return Finish(context_, call, "Delete", start, status);
}

grpc::ServerUnaryReactor* IngestServiceImpl::Get(grpc::CallbackServerContext* call,
                                                 const v1::GetRequest* request,
                                                 v1::GetResponse* response) {
  const Clock::time_point start = Clock::now();
  grpc::Status status = context_->keys->Check(*call, Scope::kRead);
  if (status.ok()) {
    auto collection = FindCollection(context_, request->collection());
    if (collection.ok()) {
      auto document = (*collection)->Get(request->id());
      if (document.ok()) StoredDocumentToProto(*document, response);
      status = ToGrpcStatus(document.status());
    } else {
      status = ToGrpcStatus(collection.status());
    }
  }
  return Finish(context_, call, "Get", start, status);
}

grpc::ServerUnaryReactor* QueryServiceImpl::Search(grpc::CallbackServerContext* call,
                                                   const v1::SearchRequest* request,
                                                   v1::SearchResponse* response) {
  const Clock::time_point start = Clock::now();
  grpc::Status status = context_->keys->Check(*call, Scope::kRead);
  if (status.ok()) status = ToGrpcStatus(RunSearch(context_, *call, *request, response));
  return Finish(context_, call, "Search", start, status);
}

grpc::ServerUnaryReactor* QueryServiceImpl::SearchBatch(grpc::CallbackServerContext* call,
                                                        const v1::SearchBatchRequest* request,
                                                        v1::SearchBatchResponse* response) {
  const Clock::time_point start = Clock::now();
  grpc::Status status = context_->keys->Check(*call, Scope::kRead);
  for (int i = 0; status.ok() && i < request->searches_size(); ++i) {
    const absl::Status search =
        RunSearch(context_, *call, request->searches(i), response->add_responses());
    if (!search.ok()) {
      status = ToGrpcStatus(
          absl::Status(search.code(), absl::StrCat("searches[", i, "]: ", search.message())));
    }
  }
  return Finish(context_, call, "SearchBatch", start, status);
}

}  // namespace tessera::server
