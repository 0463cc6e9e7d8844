// fp16 ↔ fp32 conversions: a portable bit-exact scalar path and an F16C bulk path picked at run
// time. The two agree bit for bit (both round to nearest even), which float16_test checks.
#include "tessera/float16.h"

#include <immintrin.h>

#include <cstring>

#include "index/common/cpu_features.h"

namespace tessera {
namespace {

uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

bool HasF16c() { return internal::Cpu().f16c; }

__attribute__((target("avx,f16c"))) void FloatToHalfF16c(const float* src, size_t count,
                                                         Float16* dst) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), half);
  }
  for (; i < count; ++i) dst[i] = FloatToHalf(src[i]);
}

__attribute__((target("avx,f16c"))) void HalfToFloatF16c(const Float16* src, size_t count,
                                                         float* dst) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(half));
  }
  for (; i < count; ++i) dst[i] = HalfToFloat(src[i]);
}

}  // namespace

Float16 FloatToHalf(float value) {
  const uint32_t bits = FloatBits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN; keep NaNs quiet and non-zero
    const uint16_t nan_payload = abs > 0x7f800000u ? (0x200u | ((abs >> 13) & 0x3ffu)) : 0;
    return Float16{static_cast<uint16_t>(sign | 0x7c00u | nan_payload)};
  }
  if (abs >= 0x477ff000u) {  // rounds to a value beyond 65504
    return Float16{static_cast<uint16_t>(sign | 0x7c00u)};
  }
  if (abs < 0x38800000u) {  // below the smallest normal fp16: subnormal or zero
    // Add 0.5 so that the float adder performs the round-to-nearest-even shift for us.
    const float shifted = BitsToFloat(abs) + 0.5f;
    return Float16{static_cast<uint16_t>(sign | (FloatBits(shifted) - FloatBits(0.5f)))};
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
  const uint32_t mantissa_odd = (abs >> 13) & 1u;
  const uint32_t rounded = abs + 0xc8000fffu + mantissa_odd;  // (15 - 127) << 23, plus rounding
  return Float16{static_cast<uint16_t>(sign | (rounded >> 13))};
}

float HalfToFloat(Float16 value) {
  const uint32_t sign = static_cast<uint32_t>(value.bits & 0x8000u) << 16;
  const uint32_t exponent = (value.bits >> 10) & 0x1fu;
  const uint32_t mantissa = value.bits & 0x3ffu;
  if (exponent == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa × 2^-24, exact in fp32.
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
  return BitsToFloat(sign | FloatBits(magnitude));
}

void FloatToHalf(const float* src, size_t count, Float16* dst) {
  if (HasF16c()) return FloatToHalfF16c(src, count, dst);
  for (size_t i = 0; i < count; ++i) dst[i] = FloatToHalf(src[i]);
}

void HalfToFloat(const Float16* src, size_t count, float* dst) {
  if (HasF16c()) return HalfToFloatF16c(src, count, dst);
  for (size_t i = 0; i < count; ++i) dst[i] = HalfToFloat(src[i]);
}

}  // namespace tessera
