// The REST gateway's JSON for the public API's messages: protobuf's own JSON mapping
// (google::protobuf::util), with two conveniences a REST client needs, both driven by the
// messages' descriptors:
//  - a tessera.v1.Matrix may also be sent as nested JSON arrays of numbers (rows × cols, sent as
//    float32), besides the proto form {rows, cols, dtype, data: base64 of the packed values};
//  - document ids (bytes fields named `id` or `ids`, which the protos define as UTF-8 text
//    carried as bytes) are JSON strings of the text itself, not base64, in both directions.
#ifndef TESSERA_SERVER_HTTP_JSON_MAPPING_H_
#define TESSERA_SERVER_HTTP_JSON_MAPPING_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/struct.pb.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera::server {

// Whether `field` is a document id: a bytes field named id or ids, or a scroll cursor (after,
// next_after, which hold an id) — UTF-8 text in JSON.
bool IsTextIdField(const google::protobuf::FieldDescriptor& field);

// Parses `json` into `message` (cleared first). Unknown fields are refused. INVALID_ARGUMENT
// naming the field (e.g. "searches[1].query: row 2 holds 31 numbers, row 0 holds 32") or
// quoting the JSON parser for anything malformed ("not JSON (...)", "tessera.v1.SearchRequest:
// ...").
absl::Status JsonToMessage(absl::string_view json, google::protobuf::Message* message);

// `value` as compact JSON: the fields of an object of message `type` (may be null) in
// declaration order, as protobuf prints them, any other keys sorted.
void AppendJson(const google::protobuf::Value& value, const google::protobuf::Descriptor* type,
                std::string* out);

// `message` as JSON: lowerCamelCase names, every field printed (defaults too), ids as text.
std::string MessageToJson(const google::protobuf::Message& message);

// The float32 matrix of `json` (nested arrays, rows × cols) packed as a tessera.v1.Matrix's
// JSON object; exposed for tests. `where` names the field in errors.
absl::StatusOr<std::string> PackedMatrixJsonForTesting(absl::string_view json,
                                                       absl::string_view where);

}  // namespace tessera::server

#endif  // TESSERA_SERVER_HTTP_JSON_MAPPING_H_
