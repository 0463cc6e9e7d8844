// How the server handles a request, whichever service it comes in on (the public services in
// services.cc, the internal shard service in cluster/shard_service.cc): a unary call admitted, run
// on an admission worker and finished with its mapped status and metrics (Serve), its deadlines,
// and the bodies of a search and of one upsert message once the collection is resolved.
#ifndef TESSERA_SERVER_REQUEST_HANDLERS_H_
#define TESSERA_SERVER_REQUEST_HANDLERS_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/service_context.h"
#include "tessera/collection.h"
#include "tessera/v1/ingest.pb.h"
#include "tessera/v1/query.pb.h"
#include "tessera/v1/shard.pb.h"

namespace tessera::server {

using Clock = std::chrono::steady_clock;

// Finishes a unary call with `status`, mapped to gRPC's here and nowhere else, and records its
// metrics under `method`.
void FinishCall(const ServiceContext* context, grpc::CallbackServerContext* call,
                grpc::ServerUnaryReactor* reactor, const char* method, Clock::time_point start,
                const absl::Status& status);

// The engine deadline for a call: the client's deadline, if any.
Clock::time_point DeadlineOf(const grpc::CallbackServerContext& call);
// The same for the admission: a request that could not start before it is refused.
absl::Time AdmissionDeadline(const grpc::CallbackServerContext& call);
// CANCELLED or DEADLINE_EXCEEDED for a call that ended while it waited for a worker, else OK.
absl::Status StillWanted(const grpc::CallbackServerContext& call);

// One unary call (already authorised by the transport, server/credentials.h): admitted with the
// request's size and its units of work (Admission::Submit), then `body` (returns absl::Status and
// fills the response) runs on an admission worker and the call finishes with its status — or at
// once with the admission's refusal.
grpc::ServerUnaryReactor* Serve(const ServiceContext* context, grpc::CallbackServerContext* call,
                                const char* method, int64_t request_bytes,
                                std::function<absl::Status()> body, int64_t units = 1);

// A search of `collection`: the request's query and options as the public API reads them
// (numbers unclamped: the collection checks them and names the value); as one of whole_shards
// shards of a router's collection when not 0 (SearchOptions::whole_shards).
absl::StatusOr<SearchResult> SearchCollection(
    const ServiceContext* context, const grpc::CallbackServerContext& call, Collection& collection,
    const v1::SearchRequest& request, int64_t whole_shards = 0,
    const v1::SparseStatistics* sparse_statistics = nullptr);

// One Upsert message's documents written to `collection`: one result per document, in order (a
// rejected document does not fail the others); RESOURCE_EXHAUSTED when the message holds more
// than max_documents_per_batch. `message_of` may rewrite each result's message.
absl::Status UpsertDocuments(
    const ServiceContext* context, Collection& collection,
    const google::protobuf::RepeatedPtrField<v1::Document>& documents, v1::UpsertResponse* response,
    const std::function<std::string(absl::string_view)>& message_of = nullptr);

}  // namespace tessera::server

#endif  // TESSERA_SERVER_REQUEST_HANDLERS_H_
