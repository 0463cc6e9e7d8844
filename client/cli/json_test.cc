// Tests of the command line's JSON value: parsing (RFC 8259 corner cases and errors), printing,
// and round trips.
#include "client/cli/json.h"

#include <cmath>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::client {
namespace {

using ::testing::HasSubstr;

Json MustParse(const std::string& text) {
  absl::StatusOr<Json> json = ParseJson(text);
  EXPECT_TRUE(json.ok()) << text << ": " << json.status();
  return json.ok() ? *json : Json();
}

TEST(Json, ParsesScalarsKeepingIntegersApartFromDoubles) {
  EXPECT_EQ(MustParse("null").type(), Json::Type::kNull);
  EXPECT_EQ(MustParse("true").bool_value(), true);
  EXPECT_EQ(MustParse(" false ").bool_value(), false);
  Json i = MustParse("-9223372036854775808");
  EXPECT_EQ(i.type(), Json::Type::kInt);
  EXPECT_EQ(i.int_value(), std::numeric_limits<int64_t>::min());
  Json big = MustParse("9223372036854775808");  // one past int64: a double
  EXPECT_EQ(big.type(), Json::Type::kDouble);
  EXPECT_EQ(big.double_value(), 9223372036854775808.0);
  EXPECT_EQ(MustParse("2.0").type(), Json::Type::kDouble);
  EXPECT_EQ(MustParse("1e3").type(), Json::Type::kDouble);
  EXPECT_EQ(MustParse("1E-2").double_value(), 0.01);
  EXPECT_EQ(MustParse("-0.5").double_value(), -0.5);
  EXPECT_EQ(MustParse("0").int_value(), 0);
}

TEST(Json, ParsesStringsWithEscapesAndSurrogatePairs) {
  EXPECT_EQ(MustParse(R"("a\"b\\c\/d\n\t\r\b\f")").string_value(), "a\"b\\c/d\n\t\r\b\f");
  EXPECT_EQ(MustParse(R"("\u00e9\u20ac")").string_value(), "\xc3\xa9\xe2\x82\xac");
  EXPECT_EQ(MustParse(R"("\ud83d\ude00")").string_value(), "\xf0\x9f\x98\x80");
  EXPECT_EQ(MustParse("\"caf\xc3\xa9\"").string_value(), "caf\xc3\xa9");  // raw UTF-8 kept
}

TEST(Json, ParsesNestedContainersInOrder) {
  Json json = MustParse(R"({"b": [1, 2.5, "x", null, {"c": true}], "a": {}})");
  ASSERT_EQ(json.type(), Json::Type::kObject);
  ASSERT_EQ(json.members().size(), 2u);
  EXPECT_EQ(json.members()[0].first, "b");  // insertion order, not sorted
  const Json* b = json.Find("b");
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(b->array().size(), 5u);
  EXPECT_EQ(b->array()[0].int_value(), 1);
  EXPECT_EQ(b->array()[1].double_value(), 2.5);
  EXPECT_EQ(b->array()[2].string_value(), "x");
  EXPECT_TRUE(b->array()[3].is_null());
  EXPECT_EQ(b->array()[4].Find("c")->bool_value(), true);
  EXPECT_EQ(json.Find("missing"), nullptr);
  EXPECT_EQ(json.Find("a")->members().size(), 0u);
}

TEST(Json, RejectsMalformedInputWithItsOffset) {
  const char* bad[] = {
      "",    "{",       "[1,]",  "{\"a\":1,}",        "{\"a\" 1}",   "01",          "1.",
      "-",   "1e",      "\"abc", "\"\\x\"",           "\"\\ud800\"", "\"\\udc00\"", "\"a\nb\"",
      "tru", "[1] [2]", "{1:2}", "{\"a\":1,\"a\":2}", "nan",         "+1"};
  for (const char* text : bad) {
    absl::StatusOr<Json> json = ParseJson(text);
    EXPECT_FALSE(json.ok()) << "accepted: " << text;
    if (!json.ok()) {
      EXPECT_EQ(json.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(json.status().message(), HasSubstr("offset"));
    }
  }
  std::string deep(300, '[');
  deep += std::string(300, ']');
  EXPECT_THAT(ParseJson(deep).status().message(), HasSubstr("deeper"));
}

TEST(Json, DumpsCompactly) {
  Json json = Json::Object();
  json.Set("id", "doc \"1\"\n");
  json.Set("score", 12.5f);
  json.Set("small", 0.1f);  // the float's shortest form, not 0.10000000149011612
  json.Set("two", 2.0);
  json.Set("n", int64_t{-3});
  json.Set("big", uint64_t{18446744073709551615ULL});
  json.Set("nan", std::nan(""));
  json.Set("inf", std::numeric_limits<double>::infinity());
  Json list = Json::Array();
  list.Push(true);
  list.Push(Json());
  list.Push("\x01");
  json.Set("list", std::move(list));
  EXPECT_EQ(json.Dump(),
            R"({"id":"doc \"1\"\n","score":12.5,"small":0.1,"two":2.0,"n":-3,)"
            R"("big":18446744073709551616.0,"nan":null,"inf":null,"list":[true,null,"\u0001"]})");
  json.Set("n", 4);  // replaces in place
  EXPECT_EQ(json.members()[4].second.int_value(), 4);
}

TEST(Json, RoundTrips) {
  const std::string text =
      R"({"results":[{"id":"a","score":1.25,"version":3}],"timings_ms":{"total":0.5},)"
      R"("empty":[],"obj":{},"s":"\u00e9\ud83d\ude00\\","neg":-1.5e-07})";
  Json json = MustParse(text);
  Json again = MustParse(json.Dump());
  EXPECT_EQ(json, again);
  EXPECT_EQ(again.Find("neg")->double_value(), -1.5e-07);
}

}  // namespace
}  // namespace tessera::client
