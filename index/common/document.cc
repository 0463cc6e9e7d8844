// Attribute types, filter evaluation, and the quoting of client-sent values in messages.
#include "tessera/document.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tessera/status_macros.h"

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
    case Op::kExists:
    case Op::kMissing:
    case Op::kPrefix:
      break;  // not comparisons (ConditionMatches)
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
  if (condition.op == FilterCondition::Op::kExists) return true;
  if (condition.op == FilterCondition::Op::kMissing) return false;
  if (condition.op == FilterCondition::Op::kPrefix) {
    if (condition.values.empty() || !std::holds_alternative<std::string>(value) ||
        !std::holds_alternative<std::string>(condition.values[0])) {
      return false;
    }
    return absl::StartsWith(std::get<std::string>(value),
                            std::get<std::string>(condition.values[0]));
  }
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

Attributes SelectAttributes(Attributes attributes, const std::vector<std::string>& fields) {
  if (fields.empty()) return attributes;
  Attributes selected;
  for (const std::string& field : fields) {
    auto it = attributes.find(field);
    if (it != attributes.end()) selected.insert(std::move(*it));
  }
  return selected;
}

bool FilterMatches(const Filter& filter, const Attributes& attributes) {
  for (const FilterCondition& condition : filter.all_of) {
    const auto it = attributes.find(condition.field);
    if (it == attributes.end()) {
      if (condition.op == FilterCondition::Op::kMissing) continue;
      return false;
    }
    if (!ConditionMatches(condition, it->second)) return false;
  }
  if (!filter.any_of.empty() &&
      std::none_of(filter.any_of.begin(), filter.any_of.end(),
                   [&](const Filter& f) { return FilterMatches(f, attributes); })) {
    return false;
  }
  return std::none_of(filter.none_of.begin(), filter.none_of.end(),
                      [&](const Filter& f) { return FilterMatches(f, attributes); });
}

namespace {

// `path` names the filter inside the top-level one: "" for the top level, "any_of[1].none_of[0]"
// inside alternatives.
absl::Status ValidateFilterAt(const Filter& filter,
                              const std::map<std::string, AttributeType>& fields,
                              const std::string& path, int depth) {
  const std::string where = path.empty() ? "filter" : absl::StrCat("filter ", path);
  if (depth > kMaxFilterDepth) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": nested ", depth,
                                                   " deep, expected at most ", kMaxFilterDepth,
                                                   " (any_of / none_of inside each other)"));
  }
  using Op = FilterCondition::Op;
  for (size_t i = 0; i < filter.all_of.size(); ++i) {
    const FilterCondition& condition = filter.all_of[i];
    const auto field = fields.find(condition.field);
    if (field == fields.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " condition ", i, ": unknown field ", QuotedForMessage(condition.field),
          ", expected one of the collection's attribute fields"));
    }
    const std::string at =
        absl::StrCat(where, " condition ", i, " on ", QuotedForMessage(condition.field));
    const bool is_in = condition.op == Op::kIn;
    const bool no_value = condition.op == Op::kExists || condition.op == Op::kMissing;
    const size_t n = condition.values.size();
    if (no_value ? n != 0 : is_in ? n == 0 : n != 1) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": ", n, " values, expected ",
                                                     no_value ? "none (exists / missing)"
                                                     : is_in  ? "at least 1"
                                                              : "exactly 1"));
    }
    if (condition.op == Op::kPrefix && field->second != AttributeType::kString) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": prefix on the ",
                                                     AttributeTypeName(field->second),
                                                     " field, expected a string field"));
    }
    const bool field_is_number = field->second != AttributeType::kString;
    for (size_t v = 0; v < n; ++v) {
      const AttributeValue& value = condition.values[v];
      if (IsNumber(value) != field_is_number) {
        return absl::InvalidArgumentError(absl::StrCat(at, ": a ", AttributeTypeName(TypeOf(value)),
                                                       " value, but the field is ",
                                                       AttributeTypeName(field->second)));
      }
      // NaN equals nothing and orders with nothing: every comparison with it is vacuous.
      if (std::holds_alternative<double>(value) && std::isnan(std::get<double>(value))) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, ": value nan", is_in ? absl::StrCat(" (values[", v, "])") : "",
                         ", expected a number (±inf are allowed as bounds)"));
      }
    }
  }
  const std::string prefix = path.empty() ? "" : absl::StrCat(path, ".");
  for (size_t i = 0; i < filter.any_of.size(); ++i) {
    TESSERA_RETURN_IF_ERROR(ValidateFilterAt(filter.any_of[i], fields,
                                             absl::StrCat(prefix, "any_of[", i, "]"), depth + 1));
  }
  for (size_t i = 0; i < filter.none_of.size(); ++i) {
    TESSERA_RETURN_IF_ERROR(ValidateFilterAt(filter.none_of[i], fields,
                                             absl::StrCat(prefix, "none_of[", i, "]"), depth + 1));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateFilter(const Filter& filter,
                            const std::map<std::string, AttributeType>& fields) {
  return ValidateFilterAt(filter, fields, "", 1);
}

}  // namespace tessera
