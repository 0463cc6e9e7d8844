// Documents as applications send them, their attributes, and attribute filters.
#ifndef TESSERA_DOCUMENT_H_
#define TESSERA_DOCUMENT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "tessera/pooling.h"

namespace tessera {

// An attribute value: an integer, a real number or a string.
using AttributeValue = std::variant<int64_t, double, std::string>;
// A document's attributes by field name (ordered, so that encodings are deterministic).
using Attributes = std::map<std::string, AttributeValue>;

enum class AttributeType { kInt64, kDouble, kString };

// The type of a value.
AttributeType TypeOf(const AttributeValue& value);
// "int64", "double", "string".
const char* AttributeTypeName(AttributeType type);

// One document to ingest: its token matrix (num_tokens × dim fp32, row-major, L2-normalised by the
// encoder), an optional patch grid layout (needed for spatial pooling) and attributes.
struct Document {
  std::string id;
  int64_t num_tokens = 0;
  int64_t dim = 0;
  std::vector<float> tokens;
  std::optional<PatchGridLayout> layout;
  Attributes attributes;
};

// One condition on an attribute. kIn matches any of `values`; the others compare with values[0].
// Integers and doubles compare numerically with each other; strings compare lexicographically.
struct FilterCondition {
  enum class Op { kEq, kNe, kLt, kLe, kGt, kGe, kIn };
  std::string field;
  Op op = Op::kEq;
  std::vector<AttributeValue> values;
};

// A conjunction of conditions; empty matches every document. A document without the field does
// not match a condition on it (not even kNe).
struct Filter {
  std::vector<FilterCondition> all_of;

  bool empty() const { return all_of.empty(); }
};

bool FilterMatches(const Filter& filter, const Attributes& attributes);

// INVALID_ARGUMENT unless every condition names a field of `fields`, has a value of a comparable
// type (numbers with numbers, strings with strings), exactly one value for ops other than kIn and
// at least one for kIn.
absl::Status ValidateFilter(const Filter& filter,
                            const std::map<std::string, AttributeType>& fields);

}  // namespace tessera

#endif  // TESSERA_DOCUMENT_H_
