// The blocked code scan against direct computation: the block layout round-trips, the portable,
// AVX2 and AVX-512 kernels give the sums of the tables over each entry's nibbles (integers:
// exactly), and quantised scores stay within the stated bound of the float tables' scores.
#include "index/centroid/code_scan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "index/common/cpu_features.h"

namespace tessera::internal {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Entries' codes, unblocked: entries × code_bytes.
std::vector<uint8_t> Blocked(const std::vector<uint8_t>& codes, int64_t code_bytes) {
  const int64_t entries = static_cast<int64_t>(codes.size()) / code_bytes;
  const int64_t blocks = (entries + kScanBlockEntries - 1) / kScanBlockEntries;
  std::vector<uint8_t> out(blocks * ScanBlockBytes(code_bytes), 0);
  for (int64_t e = 0; e < entries; ++e) {
    PutBlockedCode(&codes[e * code_bytes], code_bytes, e, out.data());
  }
  return out;
}

TEST(CodeScan, BlockLayoutRoundTrips) {
  const int64_t code_bytes = 5, entries = 77;
  const std::vector<uint8_t> codes = RandomBytes(entries * code_bytes, 1);
  const std::vector<uint8_t> blocks = Blocked(codes, code_bytes);
  ASSERT_EQ(blocks.size(), 3 * ScanBlockBytes(code_bytes));
  std::vector<uint8_t> code(code_bytes);
  for (int64_t e = 0; e < entries; ++e) {
    GetBlockedCode(blocks.data(), code_bytes, e, code.data());
    ASSERT_EQ(
        std::vector<uint8_t>(codes.begin() + e * code_bytes, codes.begin() + (e + 1) * code_bytes),
        code)
        << e;
  }
  // Byte j of entry 33 (block 1, position 1) sits at block 1's row j.
  EXPECT_EQ(blocks[ScanBlockBytes(code_bytes) + 2 * kScanBlockEntries + 1],
            codes[33 * code_bytes + 2]);
}

// Every kernel the CPU has gives the exact sums, for one to five blocks (the AVX-512 kernel takes
// two at a time and an odd last one with AVX2), random tables and all-255 tables whose sums reach
// 65,280 (code_bytes 128: 256 nibbles), where the 16-bit accumulator of raw bytes wraps.
TEST(CodeScan, KernelsSumTheTablesOverEveryNibble) {
  for (const int64_t code_bytes : {1, 16, 32, 64, 128}) {
    for (const bool saturated : {false, true}) {
      for (int64_t num_blocks = 1; num_blocks <= 5; ++num_blocks) {
        const int64_t entries = num_blocks * kScanBlockEntries;
        const std::vector<uint8_t> codes = RandomBytes(entries * code_bytes, 2 + num_blocks);
        const std::vector<uint8_t> blocks = Blocked(codes, code_bytes);
        std::vector<uint8_t> tables = RandomBytes(2 * code_bytes * 16, 3);
        if (saturated) std::fill(tables.begin(), tables.end(), 255);
        std::vector<uint16_t> portable(entries);
        ScanBlocksPortable(blocks.data(), num_blocks, code_bytes, tables.data(), portable.data());
        const std::string where = "code_bytes " + std::to_string(code_bytes) + ", " +
                                  std::to_string(num_blocks) + " blocks" +
                                  (saturated ? ", all-255 tables" : "");
        for (int64_t e = 0; e < entries; ++e) {
          int64_t want = 0;
          for (int64_t j = 0; j < code_bytes; ++j) {
            const uint8_t byte = codes[e * code_bytes + j];
            want += tables[2 * j * 16 + (byte & 15)] + tables[(2 * j + 1) * 16 + (byte >> 4)];
          }
          ASSERT_EQ(portable[e], want) << where << ", entry " << e;
        }
        if (Cpu().avx2) {
          std::vector<uint16_t> avx2(entries);
          ScanBlocksAvx2(blocks.data(), num_blocks, code_bytes, tables.data(), avx2.data());
          EXPECT_EQ(avx2, portable) << "avx2, " << where;
        }
        if (Cpu().Avx512()) {
          std::vector<uint16_t> avx512(entries);
          ScanBlocksAvx512(blocks.data(), num_blocks, code_bytes, tables.data(), avx512.data());
          EXPECT_EQ(avx512, portable) << "avx512, " << where;
        }
      }
    }
  }
}

// ScanBlocks scans kScanPrefetchBytes of blocks at a time (prefetching the next): over counts of
// blocks that end inside, at and past a step's bounds, its sums are the portable kernel's.
TEST(CodeScan, ScanningInStepsGivesTheKernelsSums) {
  for (const int64_t code_bytes : {16, 32, 48}) {
    const int64_t step_blocks = kScanPrefetchBytes / ScanBlockBytes(code_bytes);
    for (const int64_t num_blocks :
         {int64_t{1}, step_blocks - 1, step_blocks, step_blocks + 1, 3 * step_blocks + 3}) {
      const int64_t entries = num_blocks * kScanBlockEntries;
      const std::vector<uint8_t> blocks = RandomBytes(entries * code_bytes, 7 + num_blocks);
      ScanTables tables;
      tables.levels = RandomBytes(2 * code_bytes * 16, 11);
      std::vector<uint16_t> want(entries), got(entries);
      ScanBlocksPortable(blocks.data(), num_blocks, code_bytes, tables.levels.data(), want.data());
      ScanBlocks(blocks.data(), num_blocks, code_bytes, tables, got.data());
      EXPECT_EQ(got, want) << "code_bytes " << code_bytes << ", " << num_blocks << " blocks";
    }
  }
}

TEST(CodeScan, QuantisedScoresStayWithinHalfAStepPerNibble) {
  for (int64_t nibbles : {4, 64, 128, 600}) {
    std::mt19937_64 rng(nibbles);
    std::normal_distribution<float> normal(0.0f, 0.01f);
    std::vector<float> lut(nibbles * 16);
    for (float& v : lut) v = normal(rng);
    ScanTables tables;
    QuantizeScanTables(lut.data(), nibbles, &tables);
    const int64_t max_level = std::min<int64_t>(255, 65535 / nibbles);
    const int64_t code_bytes = nibbles / 2;
    const int64_t entries = 2 * kScanBlockEntries;
    const std::vector<uint8_t> codes = RandomBytes(entries * code_bytes, 5);
    const std::vector<uint8_t> blocks = Blocked(codes, code_bytes);
    std::vector<uint16_t> sums(entries);
    ScanBlocks(blocks.data(), 2, code_bytes, tables, sums.data());
    for (int64_t e = 0; e < entries; ++e) {
      double exact = 0.0;
      int64_t top = 0;  // the largest sum possible, to check the 16-bit bound
      for (int64_t j = 0; j < code_bytes; ++j) {
        const uint8_t byte = codes[e * code_bytes + j];
        exact += lut[2 * j * 16 + (byte & 15)] + lut[(2 * j + 1) * 16 + (byte >> 4)];
        top += 2 * max_level;
      }
      ASSERT_LE(top, 65535);
      const double approx = tables.bias + tables.step * sums[e];
      ASSERT_LE(std::abs(approx - exact), nibbles * tables.step * 0.5 + 1e-6)
          << nibbles << " " << e;
    }
    // Every level is used up to the maximum: the widest table spans them all.
    EXPECT_EQ(*std::max_element(tables.levels.begin(), tables.levels.end()), max_level);
    // Each level is its value's nearest (ties to even, as std::nearbyint), counted from its
    // table's minimum; the bias is the sum of the minima in nibble order.
    float bias = 0.0f;
    for (int64_t n = 0; n < nibbles; ++n) {
      const float* table = &lut[n * 16];
      const float lo = *std::min_element(table, table + 16);
      bias += lo;
      for (int v = 0; v < 16; ++v) {
        const float level = std::nearbyint((table[v] - lo) * (1.0f / tables.step));
        ASSERT_EQ(tables.levels[n * 16 + v], static_cast<uint8_t>(level)) << n << " " << v;
      }
    }
    EXPECT_EQ(tables.bias, bias);
  }
}

// A value halfway between two levels goes to the even one, as std::nearbyint rounds.
TEST(CodeScan, QuantisationRoundsTiesToEven) {
  // One table spanning [0, 255]: 255 levels, a step of exactly 1.
  const std::vector<float> lut = {0.0f,  255.0f, 0.5f,   1.5f,   2.5f, 3.5f,  100.5f, 101.5f,
                                  0.49f, 0.51f,  254.5f, 253.5f, 7.0f, 8.25f, 9.75f,  10.5f};
  ScanTables tables;
  QuantizeScanTables(lut.data(), 1, &tables);
  ASSERT_EQ(tables.step, 1.0f);
  const std::vector<uint8_t> expected = {0, 255, 0,   2,   2, 4, 100, 102,
                                         0, 1,   254, 254, 7, 8, 10,  10};
  EXPECT_EQ(tables.levels, expected);
}

// tests/fuzz/search_fuzzer found a query of tiny (but normal) values whose lookup tables held
// subnormals: the step underflowed to 0, 0 × (1 / 0) made a NaN level, and converting it to a byte
// is undefined (corpus/search/regression-subnormal-lookup-tables). Tables that overflowed (a query
// of huge values) made the same NaN from inf − inf.
TEST(CodeScan, QuantisationOfSubnormalOrOverflowedTablesIsDefined) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const float inf = std::numeric_limits<float>::infinity();
  ScanTables tables;

  std::vector<float> subnormal(16, 0.0f);  // range 2 · denorm_min: range / 255 underflows to 0
  subnormal[1] = tiny;
  subnormal[2] = 2 * tiny;
  QuantizeScanTables(subnormal.data(), 1, &tables);
  EXPECT_EQ(tables.step, 1.0f);
  EXPECT_EQ(tables.levels, std::vector<uint8_t>(16, 0));

  const std::vector<float> overflowed(16, inf);  // inf − inf
  QuantizeScanTables(overflowed.data(), 1, &tables);
  EXPECT_EQ(tables.step, 1.0f);
  EXPECT_EQ(tables.levels, std::vector<uint8_t>(16, 0));

  std::vector<float> unbounded(16, 1.0f);  // range inf: the step would be inf, 1 / step 0
  unbounded[0] = -inf;
  QuantizeScanTables(unbounded.data(), 1, &tables);
  EXPECT_EQ(tables.step, 1.0f);
  std::vector<uint8_t> expected(16, 255);
  expected[0] = 0;
  EXPECT_EQ(tables.levels, expected);
}

}  // namespace
}  // namespace tessera::internal
