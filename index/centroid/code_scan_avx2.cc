// The AVX2 blocked code scan: one block row (32 entries' byte j) per step, both nibbles looked up
// with vpshufb in 16-entry byte tables broadcast to both lanes, 16-bit sums kept the FAISS way: one
// accumulator of the raw shuffled bytes read as 16-bit lanes (even entry + 256 · odd entry, mod
// 2^16) and one of the odd bytes, the even sums recovered at the end (raw − 256 · odd): six
// operations per row besides the shuffles, against eight with a mask of each half. Compiled with
// -mavx2 (CMakeLists.txt).
#include <immintrin.h>

#include "index/centroid/code_scan_kernels.h"

namespace tessera::internal {

void ScanBlocksAvx2(const uint8_t* blocks, int64_t num_blocks, int64_t code_bytes,
                    const uint8_t* tables, uint16_t* sums) {
  const __m256i low_nibble = _mm256_set1_epi8(0x0f);
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t* block = blocks + b * code_bytes * kScanBlockEntries;
    __m256i raw = _mm256_setzero_si256();  // entries (0, 1), (2, 3), … as 16-bit lanes
    __m256i odd = _mm256_setzero_si256();  // entries 1, 3, …, 15 | 17, 19, …, 31
    for (int64_t j = 0; j < code_bytes; ++j) {
      const __m256i row =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + j * kScanBlockEntries));
      const __m256i lo = _mm256_and_si256(row, low_nibble);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(row, 4), low_nibble);
      const __m256i table_lo = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(tables + 2 * j * 16)));
      const __m256i table_hi = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(tables + (2 * j + 1) * 16)));
      const __m256i a = _mm256_shuffle_epi8(table_lo, lo);
      const __m256i c = _mm256_shuffle_epi8(table_hi, hi);
      raw = _mm256_add_epi16(raw, _mm256_add_epi16(a, c));
      odd =
          _mm256_add_epi16(odd, _mm256_add_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(c, 8)));
    }
    // entries 0, 2, …, 14 | 16, 18, …, 30
    const __m256i even = _mm256_sub_epi16(raw, _mm256_slli_epi16(odd, 8));
    // Per lane, unpacklo interleaves entries 0…7 (16…23), unpackhi 8…15 (24…31).
    const __m256i first = _mm256_unpacklo_epi16(even, odd);
    const __m256i second = _mm256_unpackhi_epi16(even, odd);
    __m256i* out = reinterpret_cast<__m256i*>(sums + b * kScanBlockEntries);
    _mm256_storeu_si256(out, _mm256_permute2x128_si256(first, second, 0x20));
    _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(first, second, 0x31));
  }
}

}  // namespace tessera::internal
