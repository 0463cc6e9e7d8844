#include "tessera/wire/matrix.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/casts.h"

namespace tessera::wire {
namespace {

// rows × cols values that exercise fp32 and fp16: signs, zeros, subnormals, out-of-fp16-range, inf,
// NaN, and ordinary values.
std::vector<float> Values(size_t count) {
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f,
                            -2.5f,
                            1e-8f,
                            std::numeric_limits<float>::denorm_min(),
                            70000.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            0.333333f};
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) {
    values[i] = i < std::size(specials) ? specials[i] : static_cast<float>(i) * 0.01f - 3.0f;
  }
  return values;
}

bool SameBits(float a, float b) {
  return absl::bit_cast<uint32_t>(a) == absl::bit_cast<uint32_t>(b);
}

TEST(WireMatrix, DtypeSize) {
  EXPECT_EQ(DtypeSize(v1::DTYPE_FLOAT32), 4u);
  EXPECT_EQ(DtypeSize(v1::DTYPE_FLOAT16), 2u);
  EXPECT_EQ(DtypeSize(v1::DTYPE_UNSPECIFIED), 0u);
  EXPECT_EQ(DtypeSize(static_cast<v1::DType>(9)), 0u);
}

TEST(WireMatrix, PacksLittleEndian) {
  const float one = 1.0f;
  std::string bytes;
  PackFloat32(&one, 1, v1::DTYPE_FLOAT32, &bytes);
  EXPECT_EQ(bytes, std::string("\x00\x00\x80\x3f", 4));
  bytes.clear();
  PackFloat32(&one, 1, v1::DTYPE_FLOAT16, &bytes);
  EXPECT_EQ(bytes, std::string("\x00\x3c", 2));
  bytes.clear();
  const Float16 half{0x3c00};
  PackFloat16(&half, 1, &bytes);
  EXPECT_EQ(bytes, std::string("\x00\x3c", 2));
}

TEST(WireMatrix, PackAppends) {
  const float values[] = {1.0f, 2.0f};
  std::string bytes = "ab";
  PackFloat32(values, 2, v1::DTYPE_FLOAT32, &bytes);
  ASSERT_EQ(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 2), "ab");
  float back[2];
  UnpackToFloat32(bytes.data() + 2, 2, v1::DTYPE_FLOAT32, back);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 2.0f);
}

// Every shape, including the empty ones, round trips through EncodeMatrix, CheckMatrix and
// UnpackToFloat32: fp32 bit for bit, fp16 as the scalar rounding gives it.
TEST(WireMatrix, OddShapesRoundTripInBothDtypes) {
  const std::pair<uint32_t, uint32_t> shapes[] = {{0, 0}, {0, 5},   {5, 0},  {1, 1},
                                                  {3, 7}, {1, 129}, {257, 3}};
  for (const auto& [rows, cols] : shapes) {
    const size_t count = static_cast<size_t>(rows) * cols;
    const std::vector<float> values = Values(count);
    for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16}) {
      SCOPED_TRACE(testing::Message() << rows << " × " << cols << " " << v1::DType_Name(dtype));
      v1::Matrix matrix;
      EncodeMatrix(values.data(), rows, cols, dtype, &matrix);
      EXPECT_EQ(matrix.rows(), rows);
      EXPECT_EQ(matrix.cols(), cols);
      EXPECT_EQ(matrix.dtype(), dtype);
      EXPECT_EQ(matrix.data().size(), count * DtypeSize(dtype));
      ASSERT_TRUE(CheckMatrix(matrix, cols, "m").ok()) << CheckMatrix(matrix, cols, "m");
      std::vector<float> back(count);
      UnpackToFloat32(matrix.data().data(), count, dtype, back.data());
      for (size_t i = 0; i < count; ++i) {
        const float expected =
            dtype == v1::DTYPE_FLOAT32 ? values[i] : HalfToFloat(FloatToHalf(values[i]));
        if (std::isnan(expected)) {
          EXPECT_TRUE(std::isnan(back[i])) << i;
        } else {
          EXPECT_TRUE(SameBits(back[i], expected)) << i << ": " << back[i] << " vs " << expected;
        }
      }
    }
  }
}

TEST(WireMatrix, Float16PacksBitForBit) {
  std::vector<Float16> halves;
  for (uint32_t bits = 0; bits < 0x10000; bits += 7) halves.push_back(Float16{uint16_t(bits)});
  std::string bytes;
  PackFloat16(halves.data(), halves.size(), &bytes);
  ASSERT_EQ(bytes.size(), 2 * halves.size());
  for (size_t i = 0; i < halves.size(); ++i) {
    const uint16_t bits = static_cast<uint8_t>(bytes[2 * i]) |
                          static_cast<uint16_t>(static_cast<uint8_t>(bytes[2 * i + 1]) << 8);
    EXPECT_EQ(bits, halves[i].bits) << i;
  }
  std::vector<float> widened(halves.size());
  UnpackToFloat32(bytes.data(), halves.size(), v1::DTYPE_FLOAT16, widened.data());
  for (size_t i = 0; i < halves.size(); ++i) {
    const float expected = HalfToFloat(halves[i]);
    EXPECT_TRUE(SameBits(widened[i], expected) || (std::isnan(expected) && std::isnan(widened[i])))
        << i;
  }
}

TEST(WireMatrix, EncodeReplacesWhatTheMatrixHeld) {
  v1::Matrix matrix;
  matrix.set_data("stale bytes");
  const float value = 0.5f;
  EncodeMatrix(&value, 1, 1, v1::DTYPE_FLOAT16, &matrix);
  EXPECT_EQ(matrix.data().size(), 2u);
}

TEST(WireMatrix, CheckNamesTheFieldAndWhatWasExpected) {
  EXPECT_TRUE(CheckMatrix(2, 3, v1::DTYPE_FLOAT32, 24, 0, "q").ok());
  EXPECT_TRUE(CheckMatrix(2, 3, v1::DTYPE_FLOAT16, 12, 3, "q").ok());
  EXPECT_EQ(CheckMatrix(2, 3, v1::DTYPE_FLOAT32, 23, 0, "documents[0].tokens").message(),
            "documents[0].tokens: 23 bytes of data, expected rows 2 × cols 3 × 4 = 24");
  EXPECT_EQ(CheckMatrix(2, 3, v1::DTYPE_FLOAT16, 24, 0, "q").message(),
            "q: 24 bytes of data, expected rows 2 × cols 3 × 2 = 12");
  EXPECT_EQ(CheckMatrix(2, 3, v1::DTYPE_UNSPECIFIED, 24, 0, "q").message(),
            "q: dtype DTYPE_UNSPECIFIED (0), expected DTYPE_FLOAT32 or DTYPE_FLOAT16");
  EXPECT_EQ(CheckMatrix(2, 3, static_cast<v1::DType>(7), 24, 0, "q").message(),
            "q: dtype 7, expected DTYPE_FLOAT32 or DTYPE_FLOAT16");
  EXPECT_EQ(CheckMatrix(2, 96, v1::DTYPE_FLOAT32, 768, 128, "query").message(),
            "query: cols (dim) 96, expected 128");
  for (const absl::Status& status : {CheckMatrix(2, 3, v1::DTYPE_FLOAT32, 23, 0, "q"),
                                     CheckMatrix(2, 3, v1::DTYPE_UNSPECIFIED, 24, 0, "q"),
                                     CheckMatrix(2, 96, v1::DTYPE_FLOAT32, 768, 128, "q")}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(WireMatrix, CheckOrderIsDtypeThenColsThenSize) {
  // Every check fails: the dtype is named first, then the dim, then the size.
  EXPECT_EQ(CheckMatrix(2, 3, v1::DTYPE_UNSPECIFIED, 1, 8, "q").message(),
            "q: dtype DTYPE_UNSPECIFIED (0), expected DTYPE_FLOAT32 or DTYPE_FLOAT16");
  EXPECT_EQ(CheckMatrix(2, 3, v1::DTYPE_FLOAT32, 1, 8, "q").message(),
            "q: cols (dim) 3, expected 8");
}

// rows × cols × itemsize past 2^64 must not wrap to a size that matches (2^31 × 2^31 × 4 = 2^64
// wraps to 0 bytes).
TEST(WireMatrix, CheckDoesNotOverflow) {
  const uint32_t big = uint32_t{1} << 31;
  EXPECT_EQ(CheckMatrix(big, big, v1::DTYPE_FLOAT32, 0, 0, "q").message(),
            "q: 0 bytes of data, expected rows 2147483648 × cols 2147483648 × 4 (over 2^64)");
  const uint32_t max = std::numeric_limits<uint32_t>::max();
  EXPECT_FALSE(CheckMatrix(max, max, v1::DTYPE_FLOAT16, 0, 0, "q").ok());
  // Below 2^64 the exact product is named.
  EXPECT_EQ(CheckMatrix(max, max, v1::DTYPE_FLOAT32, 0, 0, "q").message(),
            "q: 0 bytes of data, expected rows 4294967295 × cols 4294967295 × 4 (over 2^64)");
  EXPECT_EQ(CheckMatrix(big, 2, v1::DTYPE_FLOAT16, 0, 0, "q").message(),
            "q: 0 bytes of data, expected rows 2147483648 × cols 2 × 2 = 8589934592");
}

}  // namespace
}  // namespace tessera::wire
