#include "index/centroid/code_scan.h"

#include <algorithm>
#include <cmath>

#include "index/common/cpu_features.h"

namespace tessera::internal {

void PutBlockedCode(const uint8_t* code, int64_t code_bytes, int64_t entry, uint8_t* blocks) {
  uint8_t* at =
      blocks + (entry / kScanBlockEntries) * ScanBlockBytes(code_bytes) + entry % kScanBlockEntries;
  for (int64_t j = 0; j < code_bytes; ++j) at[j * kScanBlockEntries] = code[j];
}

void GetBlockedCode(const uint8_t* blocks, int64_t code_bytes, int64_t entry, uint8_t* code) {
  const uint8_t* at =
      blocks + (entry / kScanBlockEntries) * ScanBlockBytes(code_bytes) + entry % kScanBlockEntries;
  for (int64_t j = 0; j < code_bytes; ++j) code[j] = at[j * kScanBlockEntries];
}

void QuantizeScanTables(const float* lut, int64_t nibbles, ScanTables* out) {
  // The largest level count whose sums over every nibble fit in 16 bits.
  const int64_t max_level = std::min<int64_t>(255, 65535 / std::max<int64_t>(nibbles, 1));
  float range = 0.0f;
  out->bias = 0.0f;
  for (int64_t n = 0; n < nibbles; ++n) {
    const float* table = lut + n * 16;
    const auto [lo, hi] = std::minmax_element(table, table + 16);
    out->bias += *lo;
    range = std::max(range, *hi - *lo);
  }
  // A range so small that the step underflows to 0 (tables of subnormals: a query of tiny
  // values) or one that is not finite (tables that overflowed: a query of huge values) gets a step
  // of 1, and a NaN level becomes 0: nothing undefined reaches the float → byte conversion.
  const float step = range / static_cast<float>(max_level);
  out->step = step > 0.0f && std::isfinite(step) ? step : 1.0f;
  const float inverse = 1.0f / out->step;
  out->levels.resize(nibbles * 16);
  for (int64_t n = 0; n < nibbles; ++n) {
    const float* table = lut + n * 16;
    const float lo = *std::min_element(table, table + 16);
    for (int v = 0; v < 16; ++v) {
      const float level = std::nearbyint((table[v] - lo) * inverse);
      out->levels[n * 16 + v] =
          std::isnan(level)
              ? 0
              : static_cast<uint8_t>(std::clamp(level, 0.0f, static_cast<float>(max_level)));
    }
  }
}

void ScanBlocksPortable(const uint8_t* blocks, int64_t num_blocks, int64_t code_bytes,
                        const uint8_t* tables, uint16_t* sums) {
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t* block = blocks + b * ScanBlockBytes(code_bytes);
    uint16_t* out = sums + b * kScanBlockEntries;
    std::fill(out, out + kScanBlockEntries, 0);
    for (int64_t j = 0; j < code_bytes; ++j) {
      const uint8_t* row = block + j * kScanBlockEntries;
      const uint8_t* lo = tables + 2 * j * 16;
      const uint8_t* hi = lo + 16;
      for (int64_t i = 0; i < kScanBlockEntries; ++i) {
        out[i] = static_cast<uint16_t>(out[i] + lo[row[i] & 0x0f] + hi[row[i] >> 4]);
      }
    }
  }
}

void ScanBlocks(const uint8_t* blocks, int64_t num_blocks, int64_t code_bytes,
                const ScanTables& tables, uint16_t* sums) {
  if (Cpu().avx2) {
    ScanBlocksAvx2(blocks, num_blocks, code_bytes, tables.levels.data(), sums);
  } else {
    ScanBlocksPortable(blocks, num_blocks, code_bytes, tables.levels.data(), sums);
  }
}

}  // namespace tessera::internal
