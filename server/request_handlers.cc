#include "server/request_handlers.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/convert.h"
#include "server/log.h"
#include "tessera/status_macros.h"
#include "tessera/wire/status.h"

namespace tessera::server {

void FinishCall(const ServiceContext* context, grpc::CallbackServerContext* call,
                grpc::ServerUnaryReactor* reactor, const char* method, Clock::time_point start,
                const absl::Status& status) {
  const std::string code = absl::StatusCodeToString(status.code());
  context->metrics->RecordRpc(
      method, code, std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  if (!status.ok() && !absl::IsNotFound(status) && !absl::IsInvalidArgument(status)) {
    Log("warning", "rpc failed",
        {{"method", method},
         {"code", code},
         {"message", std::string(status.message())},
         {"peer", call->peer()}});
  }
  reactor->Finish(wire::ToGrpcStatus(status));
}

Clock::time_point DeadlineOf(const grpc::CallbackServerContext& call) {
  const auto deadline = call.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return Clock::time_point::max();
  return Clock::now() + (deadline - std::chrono::system_clock::now());
}

absl::Time AdmissionDeadline(const grpc::CallbackServerContext& call) {
  const auto deadline = call.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

absl::Status StillWanted(const grpc::CallbackServerContext& call) {
  if (call.IsCancelled()) return absl::CancelledError("the client cancelled the call");
  if (DeadlineOf(call) <= Clock::now()) {
    return absl::DeadlineExceededError("the deadline passed while the call waited for a worker");
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* Serve(const ServiceContext* context, grpc::CallbackServerContext* call,
                                const char* method, int64_t request_bytes,
                                std::function<absl::Status()> body, int64_t units) {
  const Clock::time_point start = Clock::now();
  grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
  Admission* admission = context->admission;
  absl::Status admitted = admission->BeginCall();
  if (admitted.ok()) {
    admitted = admission->Submit(
        request_bytes,
        [=, body = std::move(body)]() {
          absl::Status status = StillWanted(*call);
          if (status.ok()) status = body();
          FinishCall(context, call, reactor, method, start, status);
          admission->EndCall();
        },
        AdmissionDeadline(*call), units);
    if (!admitted.ok()) admission->EndCall();
  }
  if (!admitted.ok()) FinishCall(context, call, reactor, method, start, admitted);
  return reactor;
}

absl::StatusOr<SearchResult> SearchCollection(const ServiceContext* context,
                                              const grpc::CallbackServerContext& call,
                                              Collection& collection,
                                              const v1::SearchRequest& request,
                                              int64_t whole_shards,
                                              const v1::SparseStatistics* sparse_statistics) {
  // A sparse-only search may leave the query matrix unset.
  const bool sparse_only =
      request.has_sparse_query() && request.query().rows() == 0 && request.query().data().empty();
  std::vector<float> query;
  if (!sparse_only) {
    TESSERA_ASSIGN_OR_RETURN(query,
                             DecodeMatrix(request.query(), collection.schema().dim, "query"));
  }
  TESSERA_ASSIGN_OR_RETURN(SearchOptions options, SearchOptionsFromProto(request));
  options.deadline = DeadlineOf(call);
  options.whole_shards = whole_shards;
  if (sparse_statistics != nullptr && options.hybrid.sparse_query.has_value()) {
    TESSERA_ASSIGN_OR_RETURN(options.hybrid.statistics,
                             SparseStatisticsFromProto(*sparse_statistics));
  }
  const FloatMatrixView view =
      sparse_only ? FloatMatrixView{nullptr, 0, collection.schema().dim}
                  : FloatMatrixView{query.data(), request.query().rows(), request.query().cols()};
  TESSERA_ASSIGN_OR_RETURN(SearchResult result, collection.Search(view, options));
  context->metrics->RecordSearchStages(result.timings.candidates_ms, result.timings.fetch_ms,
                                       result.timings.rerank_ms);
  return result;
}

absl::Status UpsertDocuments(const ServiceContext* context, Collection& collection,
                             const google::protobuf::RepeatedPtrField<v1::Document>& documents,
                             v1::UpsertResponse* response,
                             const std::function<std::string(absl::string_view)>& message_of) {
  if (documents.size() > context->config.max_documents_per_batch) {
    return absl::ResourceExhaustedError(absl::StrCat("documents: ", documents.size(),
                                                     " in one message exceeds the limit of ",
                                                     context->config.max_documents_per_batch));
  }
  const int64_t dim = collection.schema().dim;
  std::vector<Document> decoded;
  std::vector<absl::Status> early(documents.size());
  for (int i = 0; i < documents.size(); ++i) {
    absl::StatusOr<Document> document = DocumentFromProto(documents.Get(i), dim, i);
    if (document.ok()) {
      decoded.push_back(std::move(*document));
    } else {
      early[i] = document.status();
    }
  }
  int64_t tokens = 0;
  for (const Document& document : decoded) tokens += document.num_tokens;
  const std::vector<UpsertOutcome> outcomes = collection.Upsert(std::move(decoded));
  int64_t accepted = 0, vectors = 0;
  size_t next = 0;
  for (int i = 0; i < documents.size(); ++i) {
    v1::DocumentResult* result = response->add_results();
    result->set_id(documents.Get(i).id());
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
    result->set_message(message_of ? message_of(status.message()) : std::string(status.message()));
  }
  context->metrics->RecordDocuments(accepted, documents.size() - accepted, tokens, vectors);
  return absl::OkStatus();
}

}  // namespace tessera::server
