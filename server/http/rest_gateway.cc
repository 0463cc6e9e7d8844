#include "server/http/rest_gateway.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/generic/generic_stub.h>

#include <chrono>
#include <cmath>
#include <future>
#include <regex>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "server/http/json_mapping.h"
#include "server/http/openapi.h"
#include "tessera/v1/admin.pb.h"
#include "tessera/v1/ingest.grpc.pb.h"
#include "tessera/v1/query.pb.h"
#include "tessera/wire/status.h"

namespace tessera::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::MethodDescriptor;

constexpr char kJson[] = "application/json";
constexpr char kNdjson[] = "application/x-ndjson";
// Token bytes an NDJSON batch collects before it is sent as one Upsert message.
constexpr size_t kNdjsonBatchBytes = size_t{4} << 20;

const MethodDescriptor& MethodOf(const RestRoute& route) {
  const MethodDescriptor* method = FindRpc(route.rpc);
  // The route table names existing RPCs (rest_gateway_test checks every one).
  if (method == nullptr) std::abort();
  return *method;
}

// "/tessera.v1.AdminService/CreateCollection": the method path gRPC and the key check use.
std::string MethodPath(const MethodDescriptor& method) {
  return absl::StrCat("/", method.service()->full_name(), "/", method.name());
}

// The route's path template as a regex: each {field} one capture, the last of them also
// matching '/' (document ids may hold it).
std::string PathRegex(const std::string& path, std::vector<std::string>* fields) {
  std::string regex;
  size_t at = 0;
  while (true) {
    const size_t open = path.find('{', at);
    if (open == std::string::npos) break;
    const size_t close = path.find('}', open);
    regex += path.substr(at, open - at);
    fields->push_back(path.substr(open + 1, close - open - 1));
    regex += "(\\x01)";
    at = close + 1;
  }
  regex += path.substr(at);
  // A document id takes the rest of the path when nothing follows it.
  const size_t last = regex.rfind("(\\x01)");
  if (last != std::string::npos && last + 6 == regex.size() && fields->back() == "id") {
    regex.replace(last, 6, "(.*)");
  }
  // Empty values match too, so that the services name an empty name as they do over gRPC.
  return absl::StrReplaceAll(regex, {{"(\\x01)", "([^/]*)"}});
}

void Answer(httplib::Response* response, int status, const std::string& body, const char* type) {
  response->status = status;
  response->set_content(body, type);
}

void AnswerError(httplib::Response* response, const absl::Status& status) {
  Answer(response, HttpStatusOf(status.code()), ErrorJson(status), kJson);
}

// The deadline of X-Server-Timeout (seconds), if sent.
absl::Status SetDeadline(const httplib::Request& request, grpc::ClientContext* context) {
  if (!request.has_header("X-Server-Timeout")) return absl::OkStatus();
  const std::string text = request.get_header_value("X-Server-Timeout");
  double seconds = 0;
  // As a gRPC deadline, one already past fails the call with DEADLINE_EXCEEDED.
  if (!absl::SimpleAtod(text, &seconds) || !std::isfinite(seconds) || seconds > 1e9) {
    return absl::InvalidArgumentError(
        absl::StrCat("X-Server-Timeout: '", text.substr(0, 40), "', expected seconds"));
  }
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::duration_cast<std::chrono::system_clock::duration>(
                            std::chrono::duration<double>(seconds)));
  return absl::OkStatus();
}

// Sets the path parameters' fields; INVALID_ARGUMENT when the body gave one another value.
absl::Status SetPathFields(const std::vector<std::string>& fields, const httplib::Request& request,
                           Message* message) {
  for (size_t i = 0; i < fields.size(); ++i) {
    const std::string value = request.matches[i + 1];
    const FieldDescriptor* field = message->GetDescriptor()->FindFieldByName(fields[i]);
    const google::protobuf::Reflection* reflection = message->GetReflection();
    const std::string sent = reflection->GetString(*message, field);
    if (!sent.empty() && sent != value) {
      return absl::InvalidArgumentError(absl::StrCat(fields[i], ": '", sent.substr(0, 80),
                                                     "' in the body, '", value.substr(0, 80),
                                                     "' in the path (send one, or the same)"));
    }
    reflection->SetString(message, field, value);
  }
  return absl::OkStatus();
}

// One UpsertRequest sent as a one-message Upsert stream.
absl::Status CallUpsert(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context,
                        const Message& request, Message* response) {
  auto stub = v1::IngestService::NewStub(channel);
  auto stream = stub->Upsert(context);
  // A refused call (admission, draining) has already finished: Finish gives its status.
  if (stream->Write(static_cast<const v1::UpsertRequest&>(request))) stream->WritesDone();
  const bool answered = stream->Read(static_cast<v1::UpsertResponse*>(response));
  const grpc::Status status = stream->Finish();
  if (!status.ok()) return wire::FromGrpcStatus(status);
  if (!answered) return absl::InternalError("Upsert: the stream ended without a response");
  return absl::OkStatus();
}

absl::Status CallUnary(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                       grpc::ClientContext* context, const Message& request, Message* response) {
  grpc::TemplatedGenericStub<Message, Message> stub(channel);
  std::promise<grpc::Status> done;
  std::future<grpc::Status> result = done.get_future();
  stub.UnaryCall(context, method, grpc::StubOptions(), &request, response,
                 [&done](grpc::Status status) { done.set_value(std::move(status)); });
  return wire::FromGrpcStatus(result.get());
}

}  // namespace

const MethodDescriptor* FindRpc(absl::string_view rpc) {
  // Loads the files into the generated pool (and links their code into every binary).
  static const bool kLoaded = v1::CreateCollectionRequest::descriptor() != nullptr &&
                              v1::UpsertRequest::descriptor() != nullptr &&
                              v1::SearchRequest::descriptor() != nullptr;
  (void)kLoaded;
  const size_t dot = rpc.rfind('.');
  if (dot == absl::string_view::npos) return nullptr;
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          std::string(rpc.substr(0, dot)));
  return service == nullptr ? nullptr : service->FindMethodByName(std::string(rpc.substr(dot + 1)));
}

const std::vector<RestRoute>& RestRoutes() {
  static const auto* const kRoutes = new std::vector<RestRoute>{
      {"POST", "/v1/collections", "tessera.v1.AdminService.CreateCollection", RestRouteKind::kUnary,
       "CreateCollection", "Create a collection"},
      {"GET", "/v1/collections", "tessera.v1.AdminService.ListCollections", RestRouteKind::kUnary,
       "ListCollections", "List the collections"},
      {"GET", "/v1/collections/{name}", "tessera.v1.AdminService.GetCollection",
       RestRouteKind::kUnary, "GetCollection", "A collection's schema, stats and shards"},
      {"DELETE", "/v1/collections/{name}", "tessera.v1.AdminService.DropCollection",
       RestRouteKind::kUnary, "DropCollection", "Drop a collection and its data"},
      {"POST", "/v1/collections/{name}:flush", "tessera.v1.AdminService.Flush",
       RestRouteKind::kUnary, "Flush", "Flush a collection's writes to its files"},
      {"POST", "/v1/collections/{collection}/documents", "tessera.v1.IngestService.Upsert",
       RestRouteKind::kUpsert, "Upsert", "Write a batch of documents (one Upsert message)"},
      {"POST", "/v1/collections/{collection}/documents:stream", "tessera.v1.IngestService.Upsert",
       RestRouteKind::kUpsertNdjson, "UpsertStream",
       "Write documents as NDJSON (one Document per line in, one DocumentResult per line out)"},
      {"POST", "/v1/collections/{collection}/documents:delete", "tessera.v1.IngestService.Delete",
       RestRouteKind::kUnary, "Delete", "Delete documents by id"},
      {"GET", "/v1/collections/{collection}/documents/{id}", "tessera.v1.IngestService.Get",
       RestRouteKind::kUnary, "Get", "Read a stored document"},
      {"POST", "/v1/collections/{collection}/documents:get", "tessera.v1.IngestService.Get",
       RestRouteKind::kUnary, "GetByBody",
       "Read a stored document named in the body (ids too long for a URL)"},
      {"POST", "/v1/collections/{collection}:search", "tessera.v1.QueryService.Search",
       RestRouteKind::kUnary, "Search", "Search a collection"},
      {"POST", "/v1/search:batch", "tessera.v1.QueryService.SearchBatch", RestRouteKind::kUnary,
       "SearchBatch", "Several searches in one call"},
      {"POST", "/v1/collections/{collection}:count", "tessera.v1.QueryService.Count",
       RestRouteKind::kUnary, "Count", "Count the documents matching a filter"},
      {"POST", "/v1/collections/{collection}:scroll", "tessera.v1.QueryService.Scroll",
       RestRouteKind::kUnary, "Scroll", "A page of ids (and attributes) matching a filter"},
  };
  return *kRoutes;
}

int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    default:  // UNKNOWN, INTERNAL, DATA_LOSS
      return 500;
  }
}

std::string ErrorJson(const absl::Status& status) {
  google::protobuf::Value message, name;
  message.set_string_value(std::string(status.message()));
  name.set_string_value(absl::StatusCodeToString(status.code()));
  std::string json =
      absl::StrCat(R"({"error":{"code":)", HttpStatusOf(status.code()), R"(,"message":)");
  AppendJson(message, nullptr, &json);
  json += R"(,"status":)";
  AppendJson(name, nullptr, &json);
  json += R"(,"details":[]}})";
  return json;
}

RestGateway::RestGateway(std::shared_ptr<grpc::Channel> channel, RestGatewayOptions options)
    : channel_(std::move(channel)),
      options_(std::move(options)),
      openapi_(OpenApiDocument(RestRoutes())) {}

absl::Status RestGateway::Authorize(const httplib::Request& request,
                                    const std::string& method) const {
  if (options_.keys == nullptr) return absl::OkStatus();
  std::string authorization = request.get_header_value("Authorization");
  if (authorization.empty() && request.has_header("api-key")) {
    authorization = absl::StrCat("Bearer ", request.get_header_value("api-key"));
  }
  absl::Status status = options_.keys->Authorize(authorization, method);
  if (!status.ok() && options_.on_refused) options_.on_refused(method, status);
  return status;
}

void RestGateway::ServeUnary(const RestRoute& route, const httplib::Request& request,
                             httplib::Response* response) const {
  const MethodDescriptor& method = MethodOf(route);
  const std::string path = MethodPath(method);
  absl::Status status = Authorize(request, path);
  if (!status.ok()) return AnswerError(response, status);
  google::protobuf::MessageFactory* factory = google::protobuf::MessageFactory::generated_factory();
  std::unique_ptr<Message> call_request(factory->GetPrototype(method.input_type())->New());
  std::unique_ptr<Message> call_response(factory->GetPrototype(method.output_type())->New());
  if (!request.body.empty()) {
    status = JsonToMessage(request.body, call_request.get());
    if (!status.ok()) {
      status = absl::Status(status.code(), absl::StrCat("request body: ", status.message()));
    }
  }
  std::vector<std::string> fields;
  PathRegex(route.path, &fields);
  if (status.ok()) status = SetPathFields(fields, request, call_request.get());
  grpc::ClientContext context;
  if (status.ok()) status = SetDeadline(request, &context);
  if (status.ok()) {
    status = route.kind == RestRouteKind::kUpsert
                 ? CallUpsert(channel_, &context, *call_request, call_response.get())
                 : CallUnary(channel_, path, &context, *call_request, call_response.get());
  }
  if (!status.ok()) return AnswerError(response, status);
  Answer(response, 200, MessageToJson(*call_response), kJson);
}

void RestGateway::ServeUpsertNdjson(const RestRoute& route, const httplib::Request& request,
                                    httplib::Response* response,
                                    const httplib::ContentReader& content_reader) const {
  const std::string path = MethodPath(MethodOf(route));
  absl::Status status = Authorize(request, path);
  grpc::ClientContext context;
  if (status.ok()) status = SetDeadline(request, &context);
  int64_t batch_size = options_.max_documents_per_batch;
  if (status.ok() && request.has_param("batch_size")) {
    const std::string text = request.get_param_value("batch_size");
    if (!absl::SimpleAtoi(text, &batch_size) || batch_size < 1 ||
        batch_size > options_.max_documents_per_batch) {
      status = absl::InvalidArgumentError(
          absl::StrCat("batch_size: '", text.substr(0, 40), "', expected 1 to ",
                       options_.max_documents_per_batch, " (--max_documents_per_batch)"));
    }
  } else {
    batch_size = std::min<int64_t>(batch_size, 64);
  }
  if (!status.ok()) {
    content_reader([](const char*, size_t) { return true; });  // the body is not read otherwise
    return AnswerError(response, status);
  }
  const std::string collection = request.matches[1];
  auto stub = v1::IngestService::NewStub(channel_);
  auto stream = stub->Upsert(&context);

  // The lines of the batch being collected, in order: a document sent in `batch` (its index), or
  // the result of a line that did not parse (index -1).
  struct Line {
    int index;
    v1::DocumentResult failed;
  };
  std::vector<Line> lines;
  v1::UpsertRequest batch;
  batch.set_collection(collection);
  size_t batch_bytes = 0;
  std::string out;       // the NDJSON answer so far
  absl::Status failure;  // what ended the stream early
  int64_t line_number = 0;
  std::string pending;  // the body's bytes after the last newline

  const auto send = [&]() -> bool {
    if (lines.empty()) return true;
    v1::UpsertResponse answer;
    if (batch.documents_size() > 0) {
      if (!stream->Write(batch) || !stream->Read(&answer)) {
        stream->WritesDone();
        failure = wire::FromGrpcStatus(stream->Finish());
        if (failure.ok()) failure = absl::InternalError("Upsert: the stream ended early");
        stream.reset();
        return false;
      }
    }
    for (const Line& line : lines) {
      if (line.index < 0) {
        absl::StrAppend(&out, MessageToJson(line.failed), "\n");
      } else if (line.index < answer.results_size()) {
        absl::StrAppend(&out, MessageToJson(answer.results(line.index)), "\n");
      }
    }
    lines.clear();
    batch.clear_documents();
    batch_bytes = 0;
    return true;
  };
  const auto take_line = [&](absl::string_view text) -> bool {
    ++line_number;
    text = absl::StripAsciiWhitespace(text);
    if (text.empty()) return true;
    v1::Document document;
    const absl::Status parsed = JsonToMessage(text, &document);
    if (parsed.ok()) {
      batch_bytes += document.tokens().data().size();
      *batch.add_documents() = std::move(document);
      lines.push_back({batch.documents_size() - 1, {}});
    } else {
      Line line{-1, {}};
      line.failed.set_code(static_cast<int>(parsed.code()));
      line.failed.set_message(absl::StrCat("line ", line_number, ": ", parsed.message()));
      lines.push_back(std::move(line));
    }
    if (batch.documents_size() >= batch_size || batch_bytes >= kNdjsonBatchBytes) return send();
    return true;
  };
  content_reader([&](const char* data, size_t length) {
    if (!failure.ok()) return true;  // the rest of the body is read and dropped
    pending.append(data, length);
    size_t start = 0;
    for (size_t newline = pending.find('\n'); newline != std::string::npos;
         newline = pending.find('\n', start)) {
      if (!take_line(absl::string_view(pending).substr(start, newline - start))) break;
      start = newline + 1;
    }
    pending.erase(0, failure.ok() ? start : pending.size());
    return true;
  });
  if (failure.ok() && !pending.empty()) take_line(pending);
  if (failure.ok()) send();
  if (failure.ok()) {
    stream->WritesDone();
    failure = wire::FromGrpcStatus(stream->Finish());
  }
  if (!failure.ok()) {
    // Documents of the lines answered above stay written, as on a gRPC stream that fails.
    absl::StrAppend(&out, ErrorJson(failure), "\n");
    return Answer(response, HttpStatusOf(failure.code()), out, kNdjson);
  }
  Answer(response, 200, out, kNdjson);
}

void RestGateway::Register(httplib::Server* server) const {
  for (const RestRoute& route : RestRoutes()) {
    std::vector<std::string> fields;
    const std::string pattern = PathRegex(route.path, &fields);
    const std::string verb = route.verb;
    if (route.kind == RestRouteKind::kUpsertNdjson) {
      server->Post(pattern,
                   [this, &route](const httplib::Request& request, httplib::Response& response,
                                  const httplib::ContentReader& content_reader) {
                     ServeUpsertNdjson(route, request, &response, content_reader);
                   });
      continue;
    }
    auto handler = [this, &route](const httplib::Request& request, httplib::Response& response) {
      ServeUnary(route, request, &response);
    };
    if (verb == "GET") {
      server->Get(pattern, handler);
    } else if (verb == "POST") {
      server->Post(pattern, handler);
    } else if (verb == "DELETE") {
      server->Delete(pattern, handler);
    }
  }
  server->Get("/openapi.json", [this](const httplib::Request&, httplib::Response& response) {
    Answer(&response, 200, openapi_, kJson);
  });
}

}  // namespace tessera::server
