// Attribute types, filter evaluation, and the quoting of client-sent values in messages.
#include "tessera/document.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

bool IsNumber(const AttributeValue& value) { return !std::holds_alternative<std::string>(value); }

double AsDouble(const AttributeValue& value) {
  return std::holds_alternative<int64_t>(value) ? static_cast<double>(std::get<int64_t>(value))
                                                : std::get<double>(value);
}

bool Comparable(const AttributeValue& a, const AttributeValue& b) {
  return IsNumber(a) == IsNumber(b);
}

// `a op b` for comparable values: int64 with int64 exactly, other numbers as IEEE doubles (so
// that a NaN is unordered: only kNe holds), strings lexicographically.
template <typename T>
bool Holds(FilterCondition::Op op, const T& a, const T& b) {
  using Op = FilterCondition::Op;
  switch (op) {
    case Op::kEq:
    case Op::kIn:
      return a == b;
    case Op::kNe:
      return !(a == b);
    case Op::kLt:
      return a < b;
    case Op::kLe:
      return a <= b;
    case Op::kGt:
      return a > b;
    case Op::kGe:
      return a >= b;
  }
  return false;
}

bool Holds(FilterCondition::Op op, const AttributeValue& a, const AttributeValue& b) {
  if (std::holds_alternative<int64_t>(a) && std::holds_alternative<int64_t>(b)) {
    return Holds(op, std::get<int64_t>(a), std::get<int64_t>(b));
  }
  if (IsNumber(a)) return Holds(op, AsDouble(a), AsDouble(b));
  return Holds(op, std::get<std::string>(a), std::get<std::string>(b));
}

bool ConditionMatches(const FilterCondition& condition, const AttributeValue& value) {
  if (condition.op == FilterCondition::Op::kIn) {
    return std::any_of(condition.values.begin(), condition.values.end(),
                       [&value](const AttributeValue& v) {
                         return Comparable(value, v) && Holds(FilterCondition::Op::kEq, value, v);
                       });
  }
  if (condition.values.empty() || !Comparable(value, condition.values[0])) return false;
  return Holds(condition.op, value, condition.values[0]);
}

}  // namespace

std::string QuotedForMessage(absl::string_view value) {
  constexpr size_t kShown = 64;
  if (value.size() <= kShown) return absl::StrCat("'", value, "'");
  size_t cut = kShown;
  // Back to the start of a character: never inside a UTF-8 sequence (continuation bytes are
  // 10xxxxxx). A value that is not UTF-8 at all is cut at kShown − 3 at most.
  while (cut > kShown - 3 && (static_cast<unsigned char>(value[cut]) & 0xc0) == 0x80) --cut;
  return absl::StrCat("'", value.substr(0, cut), "…' (", value.size(), " bytes)");
}

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
      return absl::InvalidArgumentError(absl::StrCat(
          "filter condition ", i, ": unknown field ", QuotedForMessage(condition.field),
          ", expected one of the collection's attribute fields"));
    }
    const bool is_in = condition.op == FilterCondition::Op::kIn;
    if (is_in ? condition.values.empty() : condition.values.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "filter condition ", i, " on '", condition.field, "': ", condition.values.size(),
          " values, expected ", is_in ? "at least 1" : "exactly 1"));
    }
    const bool field_is_number = field->second != AttributeType::kString;
    for (size_t v = 0; v < condition.values.size(); ++v) {
      const AttributeValue& value = condition.values[v];
      if (IsNumber(value) != field_is_number) {
        return absl::InvalidArgumentError(
            absl::StrCat("filter condition ", i, " on '", condition.field, "': a ",
                         AttributeTypeName(TypeOf(value)), " value, but the field is ",
                         AttributeTypeName(field->second)));
      }
      // NaN equals nothing and orders with nothing: every comparison with it is vacuous.
      if (std::holds_alternative<double>(value) && std::isnan(std::get<double>(value))) {
        return absl::InvalidArgumentError(
            absl::StrCat("filter condition ", i, " on '", condition.field, "': value nan",
                         is_in ? absl::StrCat(" (values[", v, "])") : "",
                         ", expected a number (±inf are allowed as bounds)"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
