#include "server/http/json_mapping.h"

#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "tessera/status_macros.h"
#include "tessera/v1/common.pb.h"

namespace tessera::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

const char* KindName(const Value& value) {
  switch (value.kind_case()) {
    case Value::kNullValue:
      return "null";
    case Value::kNumberValue:
      return "a number";
    case Value::kStringValue:
      return "a string";
    case Value::kBoolValue:
      return "a boolean";
    case Value::kStructValue:
      return "an object";
    case Value::kListValue:
      return "an array";
    default:
      return "nothing";
  }
}

// Nested arrays (rows × cols numbers) → the Matrix object {rows, cols, dtype, data}.
absl::Status PackMatrix(const ListValue& rows, const std::string& where, Value* out) {
  std::vector<float> values;
  size_t cols = 0;
  for (int r = 0; r < rows.values_size(); ++r) {
    const Value& row = rows.values(r);
    if (row.kind_case() != Value::kListValue) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "[", r, "]: ", KindName(row),
                       ", expected a row: an array of numbers (a matrix is an array of rows)"));
    }
    const ListValue& numbers = row.list_value();
    if (r == 0) cols = numbers.values_size();
    if (static_cast<size_t>(numbers.values_size()) != cols) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": row ", r, " holds ", numbers.values_size(),
                       " numbers, row 0 holds ", cols, " (every row has the same length)"));
    }
    for (int c = 0; c < numbers.values_size(); ++c) {
      const Value& number = numbers.values(c);
      if (number.kind_case() != Value::kNumberValue) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "[", r, "][", c, "]: ", KindName(number), ", expected a number"));
      }
      // Out-of-range values become ±inf here and are refused by the server's own check.
      values.push_back(static_cast<float>(number.number_value()));
    }
  }
  std::string bytes(values.size() * sizeof(float), '\0');
  // The wire format is little-endian, as this host (x86-64, aarch64) is.
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  Struct* matrix = out->mutable_struct_value();
  (*matrix->mutable_fields())["rows"].set_number_value(rows.values_size());
  (*matrix->mutable_fields())["cols"].set_number_value(static_cast<double>(cols));
  (*matrix->mutable_fields())["dtype"].set_string_value("DTYPE_FLOAT32");
  (*matrix->mutable_fields())["data"].set_string_value(absl::Base64Escape(bytes));
  return absl::OkStatus();
}

const FieldDescriptor* FindField(const Descriptor& type, const std::string& key) {
  for (int i = 0; i < type.field_count(); ++i) {
    if (type.field(i)->json_name() == key) return type.field(i);
  }
  return type.FindFieldByName(key);
}

// Rewrites the REST forms in `value` (an object of `type`) into proto JSON. Fields it does not
// know are left for the parser to name.
absl::Status ToProtoJson(const Descriptor& type, const std::string& where, Value* value) {
  if (value->kind_case() != Value::kStructValue) return absl::OkStatus();
  for (auto& [key, field_value] : *value->mutable_struct_value()->mutable_fields()) {
    const FieldDescriptor* field = FindField(type, key);
    if (field == nullptr || field->is_map()) continue;
    const std::string name = where.empty() ? key : absl::StrCat(where, ".", key);
    if (IsTextIdField(*field)) {
      const auto encode = [](Value* id) {
        if (id->kind_case() == Value::kStringValue) {
          id->set_string_value(absl::Base64Escape(id->string_value()));
        }
      };
      if (field->is_repeated() && field_value.kind_case() == Value::kListValue) {
        for (Value& id : *field_value.mutable_list_value()->mutable_values()) encode(&id);
      } else {
        encode(&field_value);
      }
      continue;
    }
    if (field->type() != FieldDescriptor::TYPE_MESSAGE) continue;
    const Descriptor& child = *field->message_type();
    const bool matrix = &child == v1::Matrix::descriptor();
    if (field->is_repeated()) {
      if (field_value.kind_case() != Value::kListValue) continue;
      auto* elements = field_value.mutable_list_value()->mutable_values();
      for (int i = 0; i < elements->size(); ++i) {
        const std::string element = absl::StrCat(name, "[", i, "]");
        Value* item = &(*elements)[i];
        absl::Status status = absl::OkStatus();
        if (matrix && item->kind_case() == Value::kListValue) {
          const ListValue rows = item->list_value();
          status = PackMatrix(rows, element, item);
        } else if (!matrix) {
          status = ToProtoJson(child, element, item);
        }
        if (!status.ok()) return status;
      }
    } else if (matrix && field_value.kind_case() == Value::kListValue) {
      const ListValue rows = field_value.list_value();
      TESSERA_RETURN_IF_ERROR(PackMatrix(rows, name, &field_value));
    } else if (!matrix) {
      TESSERA_RETURN_IF_ERROR(ToProtoJson(child, name, &field_value));
    }
  }
  return absl::OkStatus();
}

// Decodes the ids of `value` (an object of `type`, as protobuf printed it) into text.
void FromProtoJson(const Descriptor& type, Value* value) {
  if (value->kind_case() != Value::kStructValue) return;
  for (auto& [key, field_value] : *value->mutable_struct_value()->mutable_fields()) {
    const FieldDescriptor* field = FindField(type, key);
    if (field == nullptr || field->is_map()) continue;
    if (IsTextIdField(*field)) {
      const auto decode = [](Value* id) {
        std::string text;
        // An id that is not valid UTF-8 (the server refuses those) stays base64.
        if (id->kind_case() == Value::kStringValue &&
            absl::Base64Unescape(id->string_value(), &text) &&
            google::protobuf::internal::IsStructurallyValidUTF8(text)) {
          id->set_string_value(text);
        }
      };
      if (field_value.kind_case() == Value::kListValue) {
        for (Value& id : *field_value.mutable_list_value()->mutable_values()) decode(&id);
      } else {
        decode(&field_value);
      }
      continue;
    }
    if (field->type() != FieldDescriptor::TYPE_MESSAGE) continue;
    if (field_value.kind_case() == Value::kListValue) {
      for (Value& element : *field_value.mutable_list_value()->mutable_values()) {
        FromProtoJson(*field->message_type(), &element);
      }
    } else {
      FromProtoJson(*field->message_type(), &field_value);
    }
  }
}

// A leaf (number, string, bool, null) as protobuf's printer writes it (escapes, shortest
// round-trip numbers).
void AppendLeaf(const Value& value, std::string* out) {
  std::string text;
  google::protobuf::util::MessageToJsonString(value, &text);
  out->append(text);
}

}  // namespace

void AppendJson(const Value& value, const Descriptor* type, std::string* out) {
  if (value.kind_case() == Value::kListValue) {
    out->push_back('[');
    for (int i = 0; i < value.list_value().values_size(); ++i) {
      if (i > 0) out->push_back(',');
      AppendJson(value.list_value().values(i), type, out);
    }
    out->push_back(']');
    return;
  }
  if (value.kind_case() != Value::kStructValue) return AppendLeaf(value, out);
  const auto& fields = value.struct_value().fields();
  // A message's fields in declaration order (as protobuf prints them), other keys sorted.
  std::vector<std::pair<std::string, const Descriptor*>> keys;
  if (type != nullptr && !type->options().map_entry()) {
    for (int i = 0; i < type->field_count(); ++i) {
      const FieldDescriptor& field = *type->field(i);
      if (!fields.contains(field.json_name())) continue;
      const Descriptor* child = nullptr;
      if (field.is_map()) {
        const FieldDescriptor& map_value = *field.message_type()->map_value();
        // The map itself is an object of keys; its values are of the value's type.
        child = map_value.type() == FieldDescriptor::TYPE_MESSAGE ? field.message_type() : nullptr;
      } else if (field.type() == FieldDescriptor::TYPE_MESSAGE) {
        child = field.message_type();
      }
      keys.emplace_back(field.json_name(), child);
    }
  }
  if (keys.size() != static_cast<size_t>(fields.size())) {
    std::vector<std::string> others;
    for (const auto& [key, unused] : fields) {
      bool listed = false;
      for (const auto& [name, unused_type] : keys) listed = listed || name == key;
      if (!listed) others.push_back(key);
    }
    std::sort(others.begin(), others.end());
    // A map entry type's values: the map's value message.
    const Descriptor* element = type != nullptr && type->options().map_entry() &&
                                        type->map_value()->type() == FieldDescriptor::TYPE_MESSAGE
                                    ? type->map_value()->message_type()
                                    : nullptr;
    for (std::string& key : others) keys.emplace_back(std::move(key), element);
  }
  out->push_back('{');
  bool first = true;
  for (const auto& [key, child] : keys) {
    if (!first) out->push_back(',');
    first = false;
    Value name;
    name.set_string_value(key);
    AppendLeaf(name, out);
    out->push_back(':');
    AppendJson(fields.at(key), child, out);
  }
  out->push_back('}');
}

bool IsTextIdField(const FieldDescriptor& field) {
  return field.type() == FieldDescriptor::TYPE_BYTES &&
         (field.name() == "id" || field.name() == "ids" || field.name() == "after" ||
          field.name() == "next_after");
}

absl::Status JsonToMessage(absl::string_view json, google::protobuf::Message* message) {
  message->Clear();
  Value tree;
  google::protobuf::util::JsonParseOptions options;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &tree, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not JSON (", parsed.message().as_string(), ")"));
  }
  if (tree.kind_case() != Value::kStructValue) {
    return absl::InvalidArgumentError(absl::StrCat(KindName(tree), ", expected an object (",
                                                   message->GetDescriptor()->full_name(), ")"));
  }
  TESSERA_RETURN_IF_ERROR(ToProtoJson(*message->GetDescriptor(), "", &tree));
  std::string proto_json;
  google::protobuf::util::MessageToJsonString(tree, &proto_json);
  const auto status = google::protobuf::util::JsonStringToMessage(proto_json, message, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(message->GetDescriptor()->full_name(), ": ", status.message().as_string()));
  }
  return absl::OkStatus();
}

std::string MessageToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  std::string proto_json;
  google::protobuf::util::MessageToJsonString(message, &proto_json, options);
  Value tree;
  if (!google::protobuf::util::JsonStringToMessage(proto_json, &tree).ok()) return proto_json;
  FromProtoJson(*message.GetDescriptor(), &tree);
  std::string json;
  AppendJson(tree, message.GetDescriptor(), &json);
  return json;
}

absl::StatusOr<std::string> PackedMatrixJsonForTesting(absl::string_view json,
                                                       absl::string_view where) {
  Value tree;
  if (!google::protobuf::util::JsonStringToMessage(
           google::protobuf::StringPiece(json.data(), json.size()), &tree)
           .ok() ||
      tree.kind_case() != Value::kListValue) {
    return absl::InvalidArgumentError("not a JSON array");
  }
  Value packed;
  const absl::Status status = PackMatrix(tree.list_value(), std::string(where), &packed);
  if (!status.ok()) return status;
  std::string out;
  google::protobuf::util::MessageToJsonString(packed, &out);
  return out;
}

}  // namespace tessera::server
