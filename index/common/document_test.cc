#include "tessera/document.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using Op = FilterCondition::Op;

Filter One(std::string field, Op op, std::vector<AttributeValue> values) {
  return Filter{{FilterCondition{std::move(field), op, std::move(values)}}};
}

TEST(Filter, ComparesNumbersAcrossIntAndDouble) {
  const Attributes attributes = {{"year", int64_t{2020}}, {"score", 0.5}, {"lang", "en"}};
  EXPECT_TRUE(FilterMatches(One("year", Op::kEq, {int64_t{2020}}), attributes));
  EXPECT_TRUE(FilterMatches(One("year", Op::kGe, {2019.5}), attributes));
  EXPECT_FALSE(FilterMatches(One("year", Op::kLt, {int64_t{2020}}), attributes));
  EXPECT_TRUE(FilterMatches(One("score", Op::kLe, {int64_t{1}}), attributes));
  EXPECT_TRUE(FilterMatches(One("lang", Op::kIn, {"de", "en"}), attributes));
  EXPECT_FALSE(FilterMatches(One("lang", Op::kNe, {"en"}), attributes));
  EXPECT_TRUE(FilterMatches(One("lang", Op::kGt, {"de"}), attributes));
  // A missing field matches nothing, not even kNe.
  EXPECT_FALSE(FilterMatches(One("missing", Op::kNe, {"x"}), attributes));
  // Conjunction.
  Filter both = One("year", Op::kEq, {int64_t{2020}});
  both.all_of.push_back(FilterCondition{"lang", Op::kEq, {"fr"}});
  EXPECT_FALSE(FilterMatches(both, attributes));
  EXPECT_TRUE(FilterMatches(Filter{}, attributes));
}

TEST(Filter, ValidationNamesTheProblem) {
  const std::map<std::string, AttributeType> fields = {{"year", AttributeType::kInt64},
                                                       {"lang", AttributeType::kString}};
  EXPECT_TRUE(ValidateFilter(One("year", Op::kGt, {2.5}), fields).ok());
  EXPECT_THAT(ValidateFilter(One("colour", Op::kEq, {"red"}), fields).message(),
              HasSubstr("unknown field 'colour'"));
  EXPECT_THAT(ValidateFilter(One("lang", Op::kEq, {int64_t{3}}), fields).message(),
              HasSubstr("a int64 value, but the field is string"));
  EXPECT_THAT(ValidateFilter(One("year", Op::kEq, {}), fields).message(),
              HasSubstr("0 values, expected exactly 1"));
  EXPECT_THAT(ValidateFilter(One("year", Op::kIn, {}), fields).message(),
              HasSubstr("expected at least 1"));
}

}  // namespace
}  // namespace tessera
