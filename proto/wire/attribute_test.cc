#include "tessera/wire/attribute.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/base/casts.h"

namespace tessera::wire {
namespace {

using ::testing::HasSubstr;

AttributeValue RoundTrip(const AttributeValue& value) {
  v1::AttributeValue proto;
  AttributeToProto(value, &proto);
  absl::StatusOr<AttributeValue> back = AttributeFromProto(proto);
  EXPECT_TRUE(back.ok()) << back.status();
  return back.ok() ? *back : AttributeValue();
}

TEST(WireAttribute, EveryKindRoundTrips) {
  for (int64_t i : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min(),
                    std::numeric_limits<int64_t>::max()}) {
    v1::AttributeValue proto;
    AttributeToProto(i, &proto);
    EXPECT_EQ(proto.value_case(), v1::AttributeValue::kIntValue);
    EXPECT_EQ(proto.int_value(), i);
    EXPECT_EQ(RoundTrip(i), AttributeValue(i));
  }
  const std::vector<double> doubles = {0.0,
                                       -0.0,
                                       0.25,
                                       -1e308,
                                       std::numeric_limits<double>::denorm_min(),
                                       std::numeric_limits<double>::infinity(),
                                       -std::numeric_limits<double>::infinity(),
                                       std::numeric_limits<double>::quiet_NaN()};
  for (double d : doubles) {
    v1::AttributeValue proto;
    AttributeToProto(d, &proto);
    EXPECT_EQ(proto.value_case(), v1::AttributeValue::kDoubleValue);
    const AttributeValue back = RoundTrip(d);
    ASSERT_TRUE(std::holds_alternative<double>(back));
    // Bit for bit: -0.0 stays negative, NaN stays NaN.
    const double got = std::get<double>(back);
    EXPECT_EQ(absl::bit_cast<uint64_t>(got), absl::bit_cast<uint64_t>(d)) << d;
  }
  for (const std::string& s :
       {std::string(), std::string("en"), std::string("a\0b", 3), std::string(100000, 'x')}) {
    v1::AttributeValue proto;
    AttributeToProto(s, &proto);
    EXPECT_EQ(proto.value_case(), v1::AttributeValue::kStringValue);
    EXPECT_EQ(RoundTrip(s), AttributeValue(s));
  }
}

TEST(WireAttribute, KindsStayApart) {
  // An int64 1 and a double 1.0 are different values on the wire and back.
  EXPECT_TRUE(std::holds_alternative<int64_t>(RoundTrip(int64_t{1})));
  EXPECT_TRUE(std::holds_alternative<double>(RoundTrip(1.0)));
  EXPECT_TRUE(std::holds_alternative<std::string>(RoundTrip(std::string("1"))));
}

TEST(WireAttribute, ToProtoReplacesTheKindSetBefore) {
  v1::AttributeValue proto;
  proto.set_string_value("old");
  AttributeToProto(int64_t{7}, &proto);
  EXPECT_EQ(proto.value_case(), v1::AttributeValue::kIntValue);
  EXPECT_EQ(proto.string_value(), "");
  AttributeToProto(2.5, &proto);
  EXPECT_EQ(proto.value_case(), v1::AttributeValue::kDoubleValue);
  EXPECT_EQ(proto.int_value(), 0);
}

TEST(WireAttribute, NoValueSetIsInvalidArgument) {
  const absl::StatusOr<AttributeValue> value = AttributeFromProto(v1::AttributeValue());
  EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(value.status().message(), HasSubstr("none of int_value, double_value, string_value"));
}

}  // namespace
}  // namespace tessera::wire
