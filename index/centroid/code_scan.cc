#include "index/centroid/code_scan.h"

#include <algorithm>
#include <cmath>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

namespace {

#if defined(__SSE2__)
// The smallest and largest of 16 floats. A table holding a NaN (inf − inf in the table of a query
// of huge values) may give a NaN bound where std::minmax_element skips it: its levels are then
// NaN, which QuantizeTable makes 0, and the scores of such a query are meaningless either way.
void TableMinMax(const float* table, float* lo, float* hi) {
  const __m128 a = _mm_loadu_ps(table), b = _mm_loadu_ps(table + 4);
  const __m128 c = _mm_loadu_ps(table + 8), d = _mm_loadu_ps(table + 12);
  __m128 mn = _mm_min_ps(_mm_min_ps(a, b), _mm_min_ps(c, d));
  __m128 mx = _mm_max_ps(_mm_max_ps(a, b), _mm_max_ps(c, d));
  mn = _mm_min_ps(mn, _mm_movehl_ps(mn, mn));
  mx = _mm_max_ps(mx, _mm_movehl_ps(mx, mx));
  *lo = _mm_cvtss_f32(_mm_min_ss(mn, _mm_shuffle_ps(mn, mn, 1)));
  *hi = _mm_cvtss_f32(_mm_max_ss(mx, _mm_shuffle_ps(mx, mx, 1)));
}

// levels[v] = the nearest level to (table[v] − lo) · inverse, clamped to [0, max_level], a NaN 0:
// max_ps(x, 0) returns 0 for a NaN x, and cvtps rounds to nearest even as std::nearbyint does
// in the default rounding mode (clamping first changes nothing: the bounds are integers).
void QuantizeTable(const float* table, float lo, float inverse, float max_level, uint8_t* levels) {
  const __m128 low = _mm_set1_ps(lo), scale = _mm_set1_ps(inverse);
  const __m128 zero = _mm_setzero_ps(), top = _mm_set1_ps(max_level);
  __m128i ints[4];
  for (int k = 0; k < 4; ++k) {
    const __m128 x = _mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(table + 4 * k), low), scale);
    ints[k] = _mm_cvtps_epi32(_mm_min_ps(_mm_max_ps(x, zero), top));
  }
  const __m128i words = _mm_packs_epi32(ints[0], ints[1]);
  const __m128i more = _mm_packs_epi32(ints[2], ints[3]);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(levels), _mm_packus_epi16(words, more));
}
#else
void TableMinMax(const float* table, float* lo, float* hi) {
  const auto [min, max] = std::minmax_element(table, table + 16);
  *lo = *min;
  *hi = *max;
}

void QuantizeTable(const float* table, float lo, float inverse, float max_level, uint8_t* levels) {
  for (int v = 0; v < 16; ++v) {
    const float level = std::nearbyint((table[v] - lo) * inverse);
    levels[v] = std::isnan(level) ? 0 : static_cast<uint8_t>(std::clamp(level, 0.0f, max_level));
  }
}
#endif

}  // namespace

void QuantizeScanTables(const float* lut, int64_t nibbles, ScanTables* out) {
  // The largest level count whose sums over every nibble fit in 16 bits.
  const int64_t max_level = std::min<int64_t>(255, 65535 / std::max<int64_t>(nibbles, 1));
  float range = 0.0f;
  out->bias = 0.0f;
  std::vector<float> lows(nibbles);
  for (int64_t n = 0; n < nibbles; ++n) {
    float hi = 0.0f;
    TableMinMax(lut + n * 16, &lows[n], &hi);
    out->bias += lows[n];
    range = std::max(range, hi - lows[n]);
  }
  // A range so small that the step underflows to 0 (tables of subnormals: a query of tiny
  // values) or one that is not finite (tables that overflowed: a query of huge values) gets a step
  // of 1, and a NaN level becomes 0: nothing undefined reaches the float → byte conversion.
  const float step = range / static_cast<float>(max_level);
  out->step = step > 0.0f && std::isfinite(step) ? step : 1.0f;
  const float inverse = 1.0f / out->step;
  out->levels.resize(nibbles * 16);
  for (int64_t n = 0; n < nibbles; ++n) {
    QuantizeTable(lut + n * 16, lows[n], inverse, static_cast<float>(max_level),
                  &out->levels[n * 16]);
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

void PrefetchScan(const uint8_t* data, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(data + at);
}

void ScanBlocks(const uint8_t* blocks, int64_t num_blocks, int64_t code_bytes,
                const ScanTables& tables, uint16_t* sums) {
  const auto kernel = Cpu().Avx512() ? ScanBlocksAvx512
                      : Cpu().avx2   ? ScanBlocksAvx2
                                     : ScanBlocksPortable;
  const int64_t block_bytes = ScanBlockBytes(code_bytes);
  // Blocks a step: an even count, so that the AVX-512 kernel's pairs never leave one over.
  const int64_t step = std::max<int64_t>(2, kScanPrefetchBytes / block_bytes / 2 * 2);
  for (int64_t b = 0; b < num_blocks; b += step) {
    const int64_t next = b + step;
    if (next < num_blocks) {
      PrefetchScan(blocks + next * block_bytes, std::min(step, num_blocks - next) * block_bytes);
    }
    kernel(blocks + b * block_bytes, std::min(step, num_blocks - b), code_bytes,
           tables.levels.data(), sums + b * kScanBlockEntries);
  }
}

}  // namespace tessera::internal
