#include "tessera/wire/attribute.h"

#include <variant>

namespace tessera::wire {

void AttributeToProto(const AttributeValue& value, v1::AttributeValue* out) {
  if (const auto* i = std::get_if<int64_t>(&value)) {
    out->set_int_value(*i);
  } else if (const auto* d = std::get_if<double>(&value)) {
    out->set_double_value(*d);
  } else {
    out->set_string_value(std::get<std::string>(value));
  }
}

absl::StatusOr<AttributeValue> AttributeFromProto(const v1::AttributeValue& proto) {
  switch (proto.value_case()) {
    case v1::AttributeValue::kIntValue:
      return AttributeValue(proto.int_value());
    case v1::AttributeValue::kDoubleValue:
      return AttributeValue(proto.double_value());
    case v1::AttributeValue::kStringValue:
      return AttributeValue(proto.string_value());
    case v1::AttributeValue::VALUE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "attribute value has none of int_value, double_value, string_value set");
}

}  // namespace tessera::wire
