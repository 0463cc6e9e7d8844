#include "tessera/float16.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

// Independent reference: the exact value of every fp16 bit pattern from its definition.
double HalfValue(uint16_t bits) {
  const int sign = (bits & 0x8000) ? -1 : 1;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

TEST(Float16, DecodesEveryFiniteBitPatternExactly) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const int exponent = (bits >> 10) & 0x1f;
    const float value = HalfToFloat(Float16{static_cast<uint16_t>(bits)});
    if (exponent == 0x1f) {
      EXPECT_TRUE((bits & 0x3ff) ? std::isnan(value) : std::isinf(value)) << bits;
    } else {
      EXPECT_EQ(static_cast<double>(value), HalfValue(bits)) << bits;
    }
  }
}

TEST(Float16, RoundTripsEveryHalfValue) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    if (((bits >> 10) & 0x1f) == 0x1f && (bits & 0x3ff)) continue;  // NaN payloads may differ
    const Float16 half{static_cast<uint16_t>(bits)};
    EXPECT_EQ(FloatToHalf(HalfToFloat(half)).bits, half.bits) << bits;
  }
}

// The encoder must pick the nearest fp16 value, ties to the even mantissa: compare with a search
// over the two neighbours using exact double arithmetic.
TEST(Float16, RoundsToNearestEven) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-26.0f, 17.0f);
  for (int trial = 0; trial < 200000; ++trial) {
    float value = std::exp2(exponent(rng)) * ((rng() & 1) ? -1.0f : 1.0f);
    const Float16 half = FloatToHalf(value);
    const double got = HalfValue(half.bits);
    if (std::fabs(value) >= 65520.0f) {
      EXPECT_TRUE(std::isinf(HalfToFloat(half))) << value;
      continue;
    }
    for (int step : {-1, 1}) {
      const uint16_t neighbour_bits = static_cast<uint16_t>(half.bits + step);
      if (((neighbour_bits >> 10) & 0x1f) == 0x1f) continue;
      if ((neighbour_bits & 0x7fff) == 0x7fff) continue;
      const double neighbour = HalfValue(neighbour_bits);
      const double err_got = std::fabs(got - value), err_nb = std::fabs(neighbour - value);
      EXPECT_LE(err_got, err_nb) << value;
      if (err_got == err_nb) {
        EXPECT_EQ(half.bits & 1, 0) << value;
      }
    }
  }
}

TEST(Float16, SpecialValues) {
  EXPECT_EQ(FloatToHalf(0.0f).bits, 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f).bits, 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f).bits, 0x3c00);
  EXPECT_EQ(FloatToHalf(65504.0f).bits, 0x7bff);
  EXPECT_EQ(FloatToHalf(1e6f).bits, 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()).bits, 0xfc00);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Float16, BulkConversionMatchesScalar) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> values(1003);
  for (float& v : values) v = normal(rng);
  values[5] = 1e-7f;  // subnormal in fp16
  std::vector<Float16> halves(values.size());
  FloatToHalf(values.data(), values.size(), halves.data());
  std::vector<float> back(values.size());
  HalfToFloat(halves.data(), halves.size(), back.data());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(halves[i].bits, FloatToHalf(values[i]).bits) << i;
    EXPECT_EQ(back[i], HalfToFloat(halves[i])) << i;
  }
}

}  // namespace
}  // namespace tessera
