// Document attribute values (tessera/document.h: int64 | double | string) ↔ v1::AttributeValue, a
// oneof of the same three kinds. Stateless, thread-safe.
#ifndef TESSERA_WIRE_ATTRIBUTE_H_
#define TESSERA_WIRE_ATTRIBUTE_H_

#include "absl/status/statusor.h"
#include "tessera/document.h"
#include "tessera/v1/common.pb.h"

namespace tessera::wire {

// Sets the oneof member of `value`'s kind in `out` (int64 → int_value, double → double_value,
// string → string_value), clearing whichever was set before.
void AttributeToProto(const AttributeValue& value, v1::AttributeValue* out);

// The value of the member that is set. INVALID_ARGUMENT when none is (VALUE_NOT_SET): callers that
// can name the field say which in their own message.
absl::StatusOr<AttributeValue> AttributeFromProto(const v1::AttributeValue& proto);

}  // namespace tessera::wire

#endif  // TESSERA_WIRE_ATTRIBUTE_H_
