// CRC-32 (zlib's reflected polynomial 0xEDB88320) by carry-less multiplication: four 128-bit lanes
// folded 64 bytes at a time, then into one, then reduced to 32 bits (Barrett), as in Intel's
// "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ" and zlib-ng/Chromium's
// crc32_simd. The constants are x^k mod P(x) for the fold distances, bit-reflected. Compiled with
// -msse4.1 -mpclmul (CMakeLists.txt) and called only after a run-time CPU check (crc32.cc).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "index/common/crc32_kernels.h"

namespace tessera::internal {

uint32_t Crc32FoldClmul(const uint8_t* data, size_t size, uint32_t state) {
  alignas(16) static const uint64_t kFold512[] = {0x0154442bd4, 0x01c6e41596};  // x^(4·128±32)
  alignas(16) static const uint64_t kFold128[] = {0x01751997d0, 0x00ccaa009e};  // x^(128±32)
  alignas(16) static const uint64_t kFold64[] = {0x0163cd6124, 0x0000000000};   // x^64
  alignas(16) static const uint64_t kBarrett[] = {0x01db710641, 0x01f7011641};  // P(x), μ
  auto load = [](const uint8_t* at) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
  };
  auto fold = [](__m128i x, __m128i k, __m128i next) {
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x11), next),
                         _mm_clmulepi64_si128(x, k, 0x00));
  };
  __m128i x1 = _mm_xor_si128(load(data), _mm_cvtsi32_si128(static_cast<int>(state)));
  __m128i x2 = load(data + 16);
  __m128i x3 = load(data + 32);
  __m128i x4 = load(data + 48);
  data += 64;
  size -= 64;
  __m128i k = _mm_load_si128(reinterpret_cast<const __m128i*>(kFold512));
  for (; size >= 64; data += 64, size -= 64) {
    x1 = fold(x1, k, load(data));
    x2 = fold(x2, k, load(data + 16));
    x3 = fold(x3, k, load(data + 32));
    x4 = fold(x4, k, load(data + 48));
  }
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(kFold128));
  x1 = fold(x1, k, x2);
  x1 = fold(x1, k, x3);
  x1 = fold(x1, k, x4);
  for (; size >= 16; data += 16, size -= 16) x1 = fold(x1, k, load(data));

  // 128 → 64 bits.
  const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
  __m128i x2r = _mm_clmulepi64_si128(x1, k, 0x10);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2r);
  k = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kFold64));
  x2r = _mm_srli_si128(x1, 4);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k, 0x00), x2r);
  // Barrett reduction to 32 bits.
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(kBarrett));
  x2r = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), k, 0x10);
  x2r = _mm_clmulepi64_si128(_mm_and_si128(x2r, low32), k, 0x00);
  x1 = _mm_xor_si128(x1, x2r);
  return static_cast<uint32_t>(_mm_extract_epi32(x1, 1));
}

}  // namespace tessera::internal
