// The AVX-512 blocked code scan: two blocks per step (row j of block b in the low 256 bits, of
// block b + 1 in the high), each 16-byte table broadcast to the four 128-bit lanes, so that one
// shuffle looks up 64 entries; 16-bit sums kept as in the AVX2 kernel (raw and odd accumulators).
// An odd last block is the AVX2 kernel's. Compiled with -mavx512f -mavx512bw (CMakeLists.txt) and
// only called when the CPU has them (ScanBlocks).
// GCC 12's _mm512_undefined_* (used by _mm512_castsi256_si512) initialises a variable from itself,
// which -Wuninitialized reports at every use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "index/centroid/code_scan_kernels.h"

namespace tessera::internal {

void ScanBlocksAvx512(const uint8_t* blocks, int64_t num_blocks, int64_t code_bytes,
                      const uint8_t* tables, uint16_t* sums) {
  const int64_t block_bytes = code_bytes * kScanBlockEntries;
  const __m512i low_nibble = _mm512_set1_epi8(0x0f);
  // 64-bit units of the two unpacked halves (below) in entry order: block b's entries 0…7, 8…15,
  // 16…23, 24…31, then block b + 1's.
  const __m512i first_block = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i second_block = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  int64_t b = 0;
  for (; b + 2 <= num_blocks; b += 2) {
    const uint8_t* block = blocks + b * block_bytes;
    __m512i raw = _mm512_setzero_si512();
    __m512i odd = _mm512_setzero_si512();
    for (int64_t j = 0; j < code_bytes; ++j) {
      const uint8_t* first = block + j * kScanBlockEntries;
      const __m512i row = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(first))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(first + block_bytes)), 1);
      const __m512i lo = _mm512_and_si512(row, low_nibble);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(row, 4), low_nibble);
      const __m512i table_lo = _mm512_broadcast_i32x4(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(tables + 2 * j * 16)));
      const __m512i table_hi = _mm512_broadcast_i32x4(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(tables + (2 * j + 1) * 16)));
      const __m512i a = _mm512_shuffle_epi8(table_lo, lo);
      const __m512i c = _mm512_shuffle_epi8(table_hi, hi);
      raw = _mm512_add_epi16(raw, _mm512_add_epi16(a, c));
      odd =
          _mm512_add_epi16(odd, _mm512_add_epi16(_mm512_srli_epi16(a, 8), _mm512_srli_epi16(c, 8)));
    }
    const __m512i even = _mm512_sub_epi16(raw, _mm512_slli_epi16(odd, 8));
    // Per 128-bit lane, unpacklo interleaves entries 0…7 of its 16 (b: 0…7, 16…23; b + 1: the
    // same), unpackhi 8…15.
    const __m512i low = _mm512_unpacklo_epi16(even, odd);
    const __m512i high = _mm512_unpackhi_epi16(even, odd);
    __m512i* out = reinterpret_cast<__m512i*>(sums + b * kScanBlockEntries);
    _mm512_storeu_si512(out, _mm512_permutex2var_epi64(low, first_block, high));
    _mm512_storeu_si512(out + 1, _mm512_permutex2var_epi64(low, second_block, high));
  }
  if (b < num_blocks) {
    ScanBlocksAvx2(blocks + b * block_bytes, 1, code_bytes, tables, sums + b * kScanBlockEntries);
  }
}

}  // namespace tessera::internal
