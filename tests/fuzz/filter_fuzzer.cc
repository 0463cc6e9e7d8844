// Fuzzes both filter decoders. The first byte picks the decoder and the declared fields:
// - even: the rest is a `tessera search --filter` expression for client/cli's
//   ParseFilterExpression ("year>=2020", "lang in en,de", ...), with the fields year (int64),
//   score (double) and lang (string) declared when bit 1 is set, none otherwise;
// - odd: the rest is a serialized tessera.v1.Filter for server/convert.h's FilterFromProto (bytes
//   protobuf cannot parse are skipped).
//
// Asserts, beyond no crash or undefined behaviour (ASan, UBSan):
// - a parsed expression names a field, has no value for "exists" / "missing", exactly one for
//   the other ops but "in", gives "prefix" a string and otherwise gives a declared field values
//   of its type (an int64 field only integers, a string field strings);
// - round trip: the filter through the client's FilterToProto and the server's FilterFromProto
//   comes back with the same fields, ops and values (doubles bit for bit);
// - ValidateFilter (against the fields above) accepts or says INVALID_ARGUMENT, and FilterMatches
//   runs on a fixed document's attributes, whatever decoded.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "client/cli/commands.h"
#include "client/cpp/client.h"
#include "server/convert.h"
#include "tests/fuzz/fuzz_util.h"

namespace tessera::fuzz {
namespace {

void CheckSameFilter(const Filter& a, const Filter& b) {
  FUZZ_CHECK(a.all_of.size() == b.all_of.size(), "condition count changed");
  for (size_t i = 0; i < a.all_of.size(); ++i) {
    const FilterCondition& x = a.all_of[i];
    const FilterCondition& y = b.all_of[i];
    FUZZ_CHECK(x.field == y.field && x.op == y.op && x.values.size() == y.values.size(),
               "condition changed in the proto round trip");
    for (size_t v = 0; v < x.values.size(); ++v) {
      FUZZ_CHECK(SameBits(x.values[v], y.values[v]), "value changed in the proto round trip");
    }
  }
}

// The filter → v1.Filter (client) → Filter (server) round trip, then validation and matching.
void CheckFilter(const Filter& filter, const std::map<std::string, AttributeType>& fields) {
  const absl::StatusOr<Filter> back =
      server::FilterFromProto(client::internal::FilterToProto(filter));
  FUZZ_CHECK(back.ok(), back.status().ToString());
  CheckSameFilter(filter, *back);
  const Attributes document = {
      {"year", int64_t{2021}}, {"score", 0.5}, {"lang", std::string("en")}};
  const absl::Status valid = ValidateFilter(filter, fields);
  FUZZ_CHECK(valid.ok() || absl::IsInvalidArgument(valid), valid.ToString());
  (void)FilterMatches(filter, document);
}

}  // namespace
}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using namespace tessera::fuzz;
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const absl::string_view rest = AsStringView(data + 1, size - 1);
  const std::map<std::string, AttributeType> schema = {{"year", AttributeType::kInt64},
                                                       {"score", AttributeType::kDouble},
                                                       {"lang", AttributeType::kString}};

  if (mode & 1) {
    v1::Filter proto;
    if (!proto.ParseFromArray(rest.data(), static_cast<int>(rest.size()))) return 0;
    const absl::StatusOr<Filter> filter = server::FilterFromProto(proto);
    if (!filter.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(filter.status()), filter.status().ToString());
      return 0;
    }
    FUZZ_CHECK(static_cast<int>(filter->all_of.size()) == proto.all_of_size(), "condition count");
    CheckFilter(*filter, schema);
    return 0;
  }

  std::map<std::string, v1::AttributeType> declared;
  if (mode & 2) {
    declared = {{"year", v1::ATTRIBUTE_TYPE_INT64},
                {"score", v1::ATTRIBUTE_TYPE_DOUBLE},
                {"lang", v1::ATTRIBUTE_TYPE_STRING}};
  }
  const absl::StatusOr<FilterCondition> condition =
      client::internal::ParseFilterExpression(rest, declared);
  if (!condition.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(condition.status()), condition.status().ToString());
    return 0;
  }
  FUZZ_CHECK(!condition->field.empty(), "no field");
  if (condition->op == FilterCondition::Op::kExists ||
      condition->op == FilterCondition::Op::kMissing) {
    FUZZ_CHECK(condition->values.empty(), "a value for exists / missing");
  } else if (condition->op != FilterCondition::Op::kIn) {
    FUZZ_CHECK(condition->values.size() == 1, "not exactly one value");
  }
  const auto field = declared.find(condition->field);
  if (condition->op == FilterCondition::Op::kPrefix) {
    // A prefix is a string whatever the field (the server refuses it on a number field).
    FUZZ_CHECK(TypeOf(condition->values[0]) == AttributeType::kString, "a prefix not a string");
  } else if (field != declared.end()) {
    for (const AttributeValue& value : condition->values) {
      const AttributeType type = TypeOf(value);
      FUZZ_CHECK(field->second == v1::ATTRIBUTE_TYPE_INT64    ? type == AttributeType::kInt64
                 : field->second == v1::ATTRIBUTE_TYPE_DOUBLE ? type == AttributeType::kDouble
                                                              : type == AttributeType::kString,
                 "a value of another type than the field's");
    }
  }
  Filter filter;
  filter.all_of.push_back(*condition);
  CheckFilter(filter, schema);
  return 0;
}
