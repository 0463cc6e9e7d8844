// Attribute types and filter evaluation.
#include "tessera/document.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

bool IsNumber(const AttributeValue& value) { return !std::holds_alternative<std::string>(value); }

double AsDouble(const AttributeValue& value) {
  return std::holds_alternative<int64_t>(value) ? static_cast<double>(std::get<int64_t>(value))
                                                : std::get<double>(value);
}

// -1, 0, 1; only called on comparable values (both numbers or both strings).
int Compare(const AttributeValue& a, const AttributeValue& b) {
  if (std::holds_alternative<int64_t>(a) && std::holds_alternative<int64_t>(b)) {
    const int64_t x = std::get<int64_t>(a), y = std::get<int64_t>(b);
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (IsNumber(a)) {
    const double x = AsDouble(a), y = AsDouble(b);
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  const int c = std::get<std::string>(a).compare(std::get<std::string>(b));
  return c < 0 ? -1 : (c > 0 ? 1 : 0);
}

bool Comparable(const AttributeValue& a, const AttributeValue& b) {
  return IsNumber(a) == IsNumber(b);
}

bool ConditionMatches(const FilterCondition& condition, const AttributeValue& value) {
  using Op = FilterCondition::Op;
  if (condition.op == Op::kIn) {
    return std::any_of(condition.values.begin(), condition.values.end(),
                       [&value](const AttributeValue& v) {
                         return Comparable(value, v) && Compare(value, v) == 0;
                       });
  }
  if (condition.values.empty() || !Comparable(value, condition.values[0])) return false;
  const int c = Compare(value, condition.values[0]);
  switch (condition.op) {
    case Op::kEq:
      return c == 0;
    case Op::kNe:
      return c != 0;
    case Op::kLt:
      return c < 0;
    case Op::kLe:
      return c <= 0;
    case Op::kGt:
      return c > 0;
    case Op::kGe:
      return c >= 0;
    case Op::kIn:
      break;
  }
  return false;
}

}  // namespace

AttributeType TypeOf(const AttributeValue& value) {
  if (std::holds_alternative<int64_t>(value)) return AttributeType::kInt64;
  if (std::holds_alternative<double>(value)) return AttributeType::kDouble;
  return AttributeType::kString;
}

const char* AttributeTypeName(AttributeType type) {
  switch (type) {
    case AttributeType::kInt64:
      return "int64";
    case AttributeType::kDouble:
      return "double";
    case AttributeType::kString:
      return "string";
  }
  return "unknown";
}

bool FilterMatches(const Filter& filter, const Attributes& attributes) {
  for (const FilterCondition& condition : filter.all_of) {
    const auto it = attributes.find(condition.field);
    if (it == attributes.end() || !ConditionMatches(condition, it->second)) return false;
  }
  return true;
}

absl::Status ValidateFilter(const Filter& filter,
                            const std::map<std::string, AttributeType>& fields) {
  for (size_t i = 0; i < filter.all_of.size(); ++i) {
    const FilterCondition& condition = filter.all_of[i];
    const auto field = fields.find(condition.field);
    if (field == fields.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("filter condition ", i, ": unknown field '", condition.field,
                       "', expected one of the collection's attribute fields"));
    }
    const bool is_in = condition.op == FilterCondition::Op::kIn;
    if (is_in ? condition.values.empty() : condition.values.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "filter condition ", i, " on '", condition.field, "': ", condition.values.size(),
          " values, expected ", is_in ? "at least 1" : "exactly 1"));
    }
    const bool field_is_number = field->second != AttributeType::kString;
    for (const AttributeValue& value : condition.values) {
      if (IsNumber(value) != field_is_number) {
        return absl::InvalidArgumentError(
            absl::StrCat("filter condition ", i, " on '", condition.field, "': a ",
                         AttributeTypeName(TypeOf(value)), " value, but the field is ",
                         AttributeTypeName(field->second)));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
