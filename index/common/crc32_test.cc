// Crc32 (carry-less multiplication for 64 bytes and more where the CPU has it, zlib's tables for
// the rest) against zlib's crc32 alone, an independent implementation of the same CRC.
#include "index/common/crc32.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <random>
#include <string>

namespace tessera::internal {
namespace {

uint32_t ZlibCrc32(const std::string& bytes, size_t offset, size_t size, uint32_t crc) {
  return static_cast<uint32_t>(
      crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + offset), static_cast<uInt>(size)));
}

TEST(Crc32, CheckValueOfTheStandard) {
  EXPECT_EQ(Crc32("123456789"), 0xCBF43926u);
  EXPECT_EQ(Crc32(std::string(100, '1')), ZlibCrc32(std::string(100, '1'), 0, 100, 0));
}

TEST(Crc32, EqualsZlibForEveryLengthOffsetAndStartingValue) {
  std::mt19937_64 rng(7);
  std::string bytes(4096 + 64, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  for (size_t size = 0; size <= 1100; ++size) {
    const size_t offset = rng() % 64;  // unaligned starts
    const uint32_t start = size % 3 == 0 ? 0 : static_cast<uint32_t>(rng());
    ASSERT_EQ(Crc32(absl::string_view(bytes).substr(offset, size), start),
              ZlibCrc32(bytes, offset, size, start))
        << "size " << size << " offset " << offset << " start " << start;
  }
  ASSERT_EQ(Crc32(absl::string_view(bytes).substr(3, 4096)), ZlibCrc32(bytes, 3, 4096, 0));
}

TEST(Crc32, ContinuesAcrossRanges) {
  std::mt19937_64 rng(9);
  std::string bytes(3000, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  for (size_t cut : {0, 1, 15, 16, 63, 64, 65, 1000, 2999, 3000}) {
    const absl::string_view all(bytes);
    EXPECT_EQ(Crc32(all.substr(cut), Crc32(all.substr(0, cut))), Crc32(all)) << cut;
  }
}

}  // namespace
}  // namespace tessera::internal
