// REST/JSON beside gRPC, in the same process: each route maps one public RPC, its JSON body and
// answer the RPC's request and response messages in protobuf's JSON mapping
// (server/http/json_mapping.h). A route is served by calling that RPC through the server's
// in-process channel, so that every request goes through the same services, admission,
// deadlines, metrics and status mapping as a gRPC call: there is no second implementation. The
// API key (Authorization: Bearer KEY, or api-key: KEY) is checked here, by the same
// ApiKeys::Authorize as the gRPC transport with the RPC's method path, since the in-process
// channel has no transport to check it.
//
// A failed call answers the HTTP status that Google's API design guide maps its gRPC code to,
// with the body {"error": {"code": HTTP status, "message": ..., "status": "NOT_FOUND",
// "details": []}}. An X-Server-Timeout: SECONDS header sets the call's deadline.
//
// Upserts come in two forms: one UpsertRequest per HTTP request, and an NDJSON stream (one
// Document per line in, one DocumentResult per line out, in order) sent as the messages of one
// Upsert stream: each batch of lines is written durably before more of the body is read, so a
// client that sends faster than the server writes is held back by TCP (back-pressure).
#ifndef TESSERA_SERVER_HTTP_REST_GATEWAY_H_
#define TESSERA_SERVER_HTTP_REST_GATEWAY_H_

#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/auth.h"
#include "server/credentials.h"

namespace tessera::server {

enum class RestRouteKind {
  kUnary,         // a unary RPC: one JSON request, one JSON response
  kUpsert,        // one UpsertRequest as a one-message Upsert stream
  kUpsertNdjson,  // NDJSON: Documents in, DocumentResults out, over one Upsert stream
};

struct RestRoute {
  const char* verb;  // GET, POST, DELETE
  // OpenAPI path template; each {field} is a path parameter that sets that field of the request
  // (the last one may contain '/', URL-encoded or not).
  const char* path;
  const char* rpc;  // full method name: tessera.v1.AdminService.CreateCollection
  RestRouteKind kind;
  const char* operation_id;
  const char* summary;
};

// The RPC of a route's `rpc` name; null for none.
const google::protobuf::MethodDescriptor* FindRpc(absl::string_view rpc);

// Every route of the REST API, in the order /openapi.json lists them.
const std::vector<RestRoute>& RestRoutes();

// The HTTP status of a gRPC code (Google's API design guide: INVALID_ARGUMENT 400, NOT_FOUND
// 404, ALREADY_EXISTS 409, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, ...).
int HttpStatusOf(absl::StatusCode code);
// The error body of `status` (not OK).
std::string ErrorJson(const absl::Status& status);

struct RestGatewayOptions {
  const ApiKeys* keys = nullptr;  // null: no authentication
  RefusalObserver on_refused;     // called for every request a key check refused
  // Documents per Upsert message of an NDJSON stream at most (--max_documents_per_batch).
  int64_t max_documents_per_batch = 1024;
};

// Thread-safe; serves on httplib's threads, each blocking in its RPC.
class RestGateway {
 public:
  // `channel`: the gRPC server's in-process channel; the server outlives the gateway's use.
  RestGateway(std::shared_ptr<grpc::Channel> channel, RestGatewayOptions options);

  // Adds the routes and GET /openapi.json to `server`.
  void Register(httplib::Server* server) const;

  // OK when the request's key may call `method` (a gRPC method path, or "GET /metrics"); else
  // the refusal, reported to on_refused. OK for every request without keys.
  absl::Status Authorize(const httplib::Request& request, const std::string& method) const;

 private:
  void ServeUnary(const RestRoute& route, const httplib::Request& request,
                  httplib::Response* response) const;
  void ServeUpsertNdjson(const RestRoute& route, const httplib::Request& request,
                         httplib::Response* response,
                         const httplib::ContentReader& content_reader) const;

  const std::shared_ptr<grpc::Channel> channel_;
  const RestGatewayOptions options_;
  const std::string openapi_;  // the /openapi.json document, built once
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_HTTP_REST_GATEWAY_H_
