// Tests of the command line's JSON conventions over nlohmann::ordered_json: what ParseJson refuses
// beyond RFC 8259 (duplicate keys, deep nesting), error messages, the printing of floats, and
// round trips.
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
  EXPECT_TRUE(MustParse("null").is_null());
  EXPECT_EQ(MustParse("true"), true);
  EXPECT_EQ(MustParse(" false "), false);
  Json i = MustParse("-9223372036854775808");
  ASSERT_TRUE(i.is_number_integer());
  EXPECT_EQ(i.get<int64_t>(), std::numeric_limits<int64_t>::min());
  Json big = MustParse("18446744073709551615");
  ASSERT_TRUE(big.is_number_unsigned());
  EXPECT_EQ(big.get<uint64_t>(), std::numeric_limits<uint64_t>::max());
  EXPECT_TRUE(MustParse("2.0").is_number_float());
  EXPECT_TRUE(MustParse("1e3").is_number_float());
  EXPECT_EQ(MustParse("1E-2").get<double>(), 0.01);
  EXPECT_EQ(MustParse("-0.5").get<double>(), -0.5);
}

TEST(Json, ParsesStringsWithEscapesAndSurrogatePairs) {
  EXPECT_EQ(MustParse(R"("a\"b\\c\/d\n\t\r\b\f")"), "a\"b\\c/d\n\t\r\b\f");
  EXPECT_EQ(MustParse(R"("\u00e9\u20ac")"), "\xc3\xa9\xe2\x82\xac");
  EXPECT_EQ(MustParse(R"("\ud83d\ude00")"), "\xf0\x9f\x98\x80");
  EXPECT_EQ(MustParse("\"caf\xc3\xa9\""), "caf\xc3\xa9");  // raw UTF-8 kept
}

TEST(Json, KeepsObjectMembersInInsertionOrder) {
  Json json = MustParse(R"({"b": [1, 2.5, "x", null, {"c": true}], "a": {}})");
  ASSERT_TRUE(json.is_object());
  EXPECT_EQ(json.begin().key(), "b");  // not sorted
  const Json* b = FindMember(json, "b");
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(b->size(), 5u);
  EXPECT_EQ((*b)[4]["c"], true);
  EXPECT_EQ(FindMember(json, "missing"), nullptr);
  EXPECT_EQ(FindMember(*b, "c"), nullptr);  // not an object
}

TEST(Json, RejectsMalformedInputWithItsOffset) {
  const char* bad[] = {"",        "{",           "[1,]",        "{\"a\":1,}", "{\"a\" 1}",
                       "01",      "1.",          "-",           "1e",         "\"abc",
                       "\"\\x\"", "\"\\ud800\"", "\"\\udc00\"", "\"a\nb\"",   "tru",
                       "[1] [2]", "{1:2}",       "nan",         "+1"};
  for (const char* text : bad) {
    absl::StatusOr<Json> json = ParseJson(text);
    EXPECT_FALSE(json.ok()) << "accepted: " << text;
    if (!json.ok()) {
      EXPECT_EQ(json.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(json.status().message(), HasSubstr("offset"));
    }
  }
}

TEST(Json, RejectsDuplicateKeysAndDeepNestingThatTheRfcAllows) {
  absl::StatusOr<Json> duplicate = ParseJson(R"({"a":1,"b":{"a":2,"a":3}})");
  ASSERT_FALSE(duplicate.ok());
  EXPECT_EQ(duplicate.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(duplicate.status().message(), HasSubstr("duplicate key \"a\""));
  EXPECT_TRUE(ParseJson(R"({"a":1,"b":{"a":2}})").ok());  // the same key in another object

  std::string deep(300, '[');
  deep += std::string(300, ']');
  EXPECT_THAT(ParseJson(deep).status().message(), HasSubstr("deeper than 256"));
  std::string ok(256, '[');
  ok += std::string(256, ']');
  EXPECT_TRUE(ParseJson(ok).ok());
}

TEST(Json, DumpsCompactlyWithFloatsInTheirShortestForm) {
  Json json = Json::object();
  json["id"] = "doc \"1\"\n";
  json["score"] = JsonFloat(12.5f);
  json["small"] = JsonFloat(0.1f);  // the float's shortest form, not 0.10000000149011612
  json["two"] = 2.0;
  json["n"] = int64_t{-3};
  json["big"] = uint64_t{18446744073709551615ULL};
  json["nan"] = std::nan("");
  json["inf"] = JsonFloat(std::numeric_limits<float>::infinity());
  json["list"] = Json::array({true, nullptr, "\x01"});
  json["bad_utf8"] = "a\xff";
  EXPECT_EQ(DumpJson(json),
            R"({"id":"doc \"1\"\n","score":12.5,"small":0.1,"two":2.0,"n":-3,)"
            R"("big":18446744073709551615,"nan":null,"inf":null,"list":[true,null,"\u0001"],)"
            "\"bad_utf8\":\"a\xef\xbf\xbd\"}");
  json["n"] = 4;  // replaces in place
  EXPECT_EQ(std::next(json.begin(), 4).value(), 4);
}

TEST(Json, RoundTrips) {
  const std::string text =
      R"({"results":[{"id":"a","score":1.25,"version":3}],"timings_ms":{"total":0.5},)"
      R"("empty":[],"obj":{},"s":"\u00e9\ud83d\ude00\\","neg":-1.5e-07})";
  Json json = MustParse(text);
  Json again = MustParse(DumpJson(json));
  EXPECT_EQ(json, again);
  EXPECT_EQ(again["neg"].get<double>(), -1.5e-07);
}

}  // namespace
}  // namespace tessera::client
