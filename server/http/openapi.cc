#include "server/http/openapi.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "server/http/json_mapping.h"
#include "tessera/base/version.h"
#include "tessera/v1/common.pb.h"
#include "tessera/v1/ingest.pb.h"

namespace tessera::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Struct;
using google::protobuf::Value;

Value& At(Value* object, const std::string& key) {
  return (*object->mutable_struct_value()->mutable_fields())[key];
}
Value String(const std::string& text) {
  Value value;
  value.set_string_value(text);
  return value;
}
Value Ref(const std::string& schema) {
  Value value;
  At(&value, "$ref") = String(absl::StrCat("#/components/schemas/", schema));
  return value;
}
Value Schema(const char* type, const char* format = nullptr) {
  Value value;
  At(&value, "type") = String(type);
  if (format != nullptr) At(&value, "format") = String(format);
  return value;
}

class SchemaBuilder {
 public:
  explicit SchemaBuilder(Value* schemas) : schemas_(schemas) {}

  // Adds `type` and every message it holds; returns its schema's name.
  std::string Add(const Descriptor& type) {
    std::string name = type.full_name();
    if (!seen_.insert(name).second) return name;
    Value schema = Schema("object");
    Value& properties = At(&schema, "properties");
    properties.mutable_struct_value();
    for (int i = 0; i < type.field_count(); ++i) {
      const FieldDescriptor& field = *type.field(i);
      At(&properties, field.json_name()) = FieldSchema(field);
    }
    At(schemas_, name) = std::move(schema);
    return name;
  }

 private:
  Value FieldSchema(const FieldDescriptor& field) {
    if (field.is_map()) {
      Value schema = Schema("object");
      At(&schema, "additionalProperties") = SingleSchema(*field.message_type()->map_value());
      return schema;
    }
    Value single = SingleSchema(field);
    if (!field.is_repeated()) return single;
    Value schema = Schema("array");
    At(&schema, "items") = std::move(single);
    return schema;
  }

  Value SingleSchema(const FieldDescriptor& field) {
    switch (field.cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        return Schema("integer", "int32");
      case FieldDescriptor::CPPTYPE_UINT32: {
        Value schema = Schema("integer", "int64");
        At(&schema, "minimum").set_number_value(0);
        At(&schema, "maximum").set_number_value(4294967295.0);
        return schema;
      }
      case FieldDescriptor::CPPTYPE_INT64:
        return Schema("string", "int64");
      case FieldDescriptor::CPPTYPE_UINT64:
        return Schema("string", "uint64");
      case FieldDescriptor::CPPTYPE_FLOAT:
        return Schema("number", "float");
      case FieldDescriptor::CPPTYPE_DOUBLE:
        return Schema("number", "double");
      case FieldDescriptor::CPPTYPE_BOOL:
        return Schema("boolean");
      case FieldDescriptor::CPPTYPE_ENUM: {
        Value schema = Schema("string");
        Value& values = At(&schema, "enum");
        for (int i = 0; i < field.enum_type()->value_count(); ++i) {
          *values.mutable_list_value()->add_values() = String(field.enum_type()->value(i)->name());
        }
        return schema;
      }
      case FieldDescriptor::CPPTYPE_STRING:
        if (field.type() == FieldDescriptor::TYPE_BYTES && !IsTextIdField(field)) {
          return Schema("string", "byte");
        }
        return Schema("string");
      case FieldDescriptor::CPPTYPE_MESSAGE: {
        const std::string name = Add(*field.message_type());
        if (field.message_type() != v1::Matrix::descriptor()) return Ref(name);
        // A matrix: the packed object, or rows × cols numbers.
        Value rows = Schema("array");
        At(&At(&rows, "items"), "type") = String("array");
        At(&At(&At(&rows, "items"), "items"), "type") = String("number");
        Value schema;
        Value& one_of = At(&schema, "oneOf");
        *one_of.mutable_list_value()->add_values() = Ref(name);
        *one_of.mutable_list_value()->add_values() = std::move(rows);
        return schema;
      }
    }
    return Schema("string");
  }

  Value* schemas_;
  std::set<std::string> seen_;
};

Value JsonContent(Value schema, const char* type = "application/json") {
  Value content;
  At(&At(&content, type), "schema") = std::move(schema);
  return content;
}

}  // namespace

std::string OpenApiDocument(const std::vector<RestRoute>& routes) {
  Value document;
  At(&document, "openapi") = String("3.0.3");
  Value& info = At(&document, "info");
  At(&info, "title") = String("Tessera REST API");
  At(&info, "version") = String(VersionString());
  At(&info, "description") = String(
      "The public gRPC API of tessera-server (tessera.v1) over HTTP/JSON, in protobuf's JSON "
      "mapping: document ids as text, a matrix as base64 packed bytes or nested arrays of "
      "numbers. Errors: {\"error\": {code, message, status, details}} with the HTTP status "
      "of the gRPC code. X-Server-Timeout: SECONDS sets a call's deadline.");
  Value& components = At(&document, "components");
  Value& schemas = At(&components, "schemas");
  schemas.mutable_struct_value();
  SchemaBuilder builder(&schemas);

  Value error = Schema("object");
  Value& error_body = At(&At(&error, "properties"), "error");
  error_body = Schema("object");
  At(&At(&error_body, "properties"), "code") = Schema("integer", "int32");
  At(&At(&error_body, "properties"), "message") = Schema("string");
  At(&At(&error_body, "properties"), "status") = Schema("string");
  At(&At(&error_body, "properties"), "details") = Schema("array");
  At(&At(&At(&error_body, "properties"), "details"), "items") = Schema("object");
  At(&schemas, "Error") = std::move(error);

  Value& security_schemes = At(&components, "securitySchemes");
  At(&At(&security_schemes, "bearer"), "type") = String("http");
  At(&At(&security_schemes, "bearer"), "scheme") = String("bearer");
  At(&At(&security_schemes, "apiKey"), "type") = String("apiKey");
  At(&At(&security_schemes, "apiKey"), "in") = String("header");
  At(&At(&security_schemes, "apiKey"), "name") = String("api-key");
  Value& security = At(&document, "security");
  At(security.mutable_list_value()->add_values(), "bearer").mutable_list_value();
  At(security.mutable_list_value()->add_values(), "apiKey").mutable_list_value();
  security.mutable_list_value()->add_values()->mutable_struct_value();  // none (no --api_keys)

  Value& paths = At(&document, "paths");
  for (const RestRoute& route : routes) {
    const google::protobuf::MethodDescriptor* method = FindRpc(route.rpc);
    if (method == nullptr) continue;
    const bool ndjson = route.kind == RestRouteKind::kUpsertNdjson;
    Value operation;
    At(&operation, "operationId") = String(route.operation_id);
    At(&operation, "summary") = String(route.summary);
    At(&operation, "description") =
        String(absl::StrCat("gRPC: ", method->service()->full_name(), "/", method->name()));
    Value& tags = At(&operation, "tags");
    *tags.mutable_list_value()->add_values() = String(method->service()->name());
    const std::string path = route.path;
    Value& parameters = At(&operation, "parameters");
    parameters.mutable_list_value();
    for (size_t open = path.find('{'); open != std::string::npos; open = path.find('{', open + 1)) {
      const std::string name = path.substr(open + 1, path.find('}', open) - open - 1);
      Value* parameter = parameters.mutable_list_value()->add_values();
      At(parameter, "name") = String(name);
      At(parameter, "in") = String("path");
      At(parameter, "required").set_bool_value(true);
      At(parameter, "schema") = Schema("string");
    }
    Value timeout;
    At(&timeout, "name") = String("X-Server-Timeout");
    At(&timeout, "in") = String("header");
    At(&timeout, "required").set_bool_value(false);
    At(&timeout, "description") = String("The call's deadline, in seconds.");
    At(&timeout, "schema") = Schema("number");
    *parameters.mutable_list_value()->add_values() = std::move(timeout);
    if (ndjson) {
      Value batch;
      At(&batch, "name") = String("batch_size");
      At(&batch, "in") = String("query");
      At(&batch, "required").set_bool_value(false);
      At(&batch, "description") =
          String("Documents per Upsert message (default 64, at most --max_documents_per_batch).");
      At(&batch, "schema") = Schema("integer", "int32");
      *parameters.mutable_list_value()->add_values() = std::move(batch);
    }
    const std::string input = builder.Add(*method->input_type());
    const std::string output = builder.Add(*method->output_type());
    if (std::string(route.verb) == "POST") {
      Value& body = At(&operation, "requestBody");
      At(&body, "required").set_bool_value(!ndjson && path.find('{') == std::string::npos);
      At(&body, "content") = ndjson ? JsonContent(Ref(builder.Add(*v1::Document::descriptor())),
                                                  "application/x-ndjson")
                                    : JsonContent(Ref(input));
    }
    Value& responses = At(&operation, "responses");
    Value& ok = At(&responses, "200");
    At(&ok, "description") = String(ndjson ? "One DocumentResult per line, in order" : "OK");
    At(&ok, "content") = ndjson ? JsonContent(Ref(builder.Add(*v1::DocumentResult::descriptor())),
                                              "application/x-ndjson")
                                : JsonContent(Ref(output));
    Value& failed = At(&responses, "default");
    At(&failed, "description") = String("The call failed: its gRPC code as an HTTP status");
    At(&failed, "content") = JsonContent(Ref("Error"));
    std::string verb = route.verb;
    for (char& c : verb) c = static_cast<char>(std::tolower(c));
    At(&At(&paths, path), verb) = std::move(operation);
  }
  // The operational endpoints.
  const auto plain = [&](const char* path, const char* id, const char* summary, bool json) {
    Value operation;
    At(&operation, "operationId") = String(id);
    At(&operation, "summary") = String(summary);
    At(&operation, "security").mutable_list_value();
    Value& ok = At(&At(&operation, "responses"), "200");
    At(&ok, "description") = String("OK");
    At(&ok, "content") =
        json ? JsonContent(Schema("object")) : JsonContent(Schema("string"), "text/plain");
    if (std::string(path) == "/healthz") {
      At(&At(&At(&operation, "responses"), "503"), "description") = String("draining");
    }
    At(&At(&paths, path), "get") = std::move(operation);
  };
  plain("/healthz", "Healthz", "200 while serving, 503 while draining (no key needed)", false);
  plain("/openapi.json", "OpenApi", "This document (no key needed)", true);
  plain("/metrics", "Metrics", "Prometheus metrics (a read key when --api_keys is set)", false);
  At(&At(&paths, "/metrics"), "get").mutable_struct_value()->mutable_fields()->erase("security");

  std::string json;
  AppendJson(document, nullptr, &json);
  return json;
}

}  // namespace tessera::server
