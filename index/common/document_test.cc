#include "tessera/document.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using Op = FilterCondition::Op;

Filter One(std::string field, Op op, std::vector<AttributeValue> values) {
  Filter filter;
  filter.all_of.push_back(FilterCondition{std::move(field), op, std::move(values)});
  return filter;
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

// NaN is refused as a filter value (== NaN and in [NaN] matched every document with the field,
// != NaN none); ±inf are accepted as bounds.
TEST(Filter, ValidationRefusesNanAndAcceptsInfinities) {
  const std::map<std::string, AttributeType> fields = {{"score", AttributeType::kDouble}};
  for (Op op : {Op::kEq, Op::kNe, Op::kLt, Op::kGe}) {
    const absl::Status status = ValidateFilter(One("score", op, {std::nan("")}), fields);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(),
                HasSubstr("filter condition 0 on 'score': value nan, expected a number"));
  }
  EXPECT_THAT(ValidateFilter(One("score", Op::kIn, {0.5, std::nan("")}), fields).message(),
              HasSubstr("value nan (values[1])"));
  EXPECT_TRUE(ValidateFilter(One("score", Op::kLt, {HUGE_VAL}), fields).ok());
  EXPECT_TRUE(ValidateFilter(One("score", Op::kGt, {-HUGE_VAL}), fields).ok());
}

// A NaN no collection accepts any more (an older version stored them) is unordered: it matches
// only !=, where the three-way comparison took it for equal to everything.
TEST(Filter, AStoredNanMatchesOnlyNotEqual) {
  const Attributes attributes = {{"score", std::nan("")}};
  EXPECT_FALSE(FilterMatches(One("score", Op::kEq, {0.5}), attributes));
  EXPECT_FALSE(FilterMatches(One("score", Op::kIn, {0.5, int64_t{1}}), attributes));
  EXPECT_FALSE(FilterMatches(One("score", Op::kLe, {0.5}), attributes));
  EXPECT_FALSE(FilterMatches(One("score", Op::kGe, {0.5}), attributes));
  EXPECT_TRUE(FilterMatches(One("score", Op::kNe, {0.5}), attributes));
}

TEST(QuotedForMessage, QuotesShortValuesWholeAndCutsLongOnesAtACharacter) {
  EXPECT_EQ(QuotedForMessage(""), "''");
  EXPECT_EQ(QuotedForMessage("papers"), "'papers'");
  EXPECT_EQ(QuotedForMessage(std::string(64, 'x')), absl::StrCat("'", std::string(64, 'x'), "'"));
  EXPECT_EQ(QuotedForMessage(std::string(1 << 20, 'x')),
            absl::StrCat("'", std::string(64, 'x'), "…' (1048576 bytes)"));
  // 63 ASCII bytes, then 'é' (2 bytes) across the cut: the cut moves before it.
  const std::string accent = std::string(63, 'a') + "\xc3\xa9" + std::string(10, 'b');
  EXPECT_EQ(QuotedForMessage(accent), absl::StrCat("'", std::string(63, 'a'), "…' (75 bytes)"));
  // Bytes that are not UTF-8 (all continuation bytes) are cut at most 3 bytes early.
  EXPECT_EQ(QuotedForMessage(std::string(100, '\x80')).size(), 1 + 61 + 3 + 13u);
}

}  // namespace
}  // namespace tessera
