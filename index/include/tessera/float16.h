// IEEE 754 binary16 ("fp16") storage type and conversions. Tessera stores rerank vectors as fp16
// by default (2 bytes per dimension); arithmetic is always done in fp32.
#ifndef TESSERA_FLOAT16_H_
#define TESSERA_FLOAT16_H_

#include <cstddef>
#include <cstdint>

namespace tessera {

// The bit pattern of one binary16 value. A distinct type so that fp16 buffers are not mistaken for
// integers.
struct Float16 {
  uint16_t bits;
};
static_assert(sizeof(Float16) == 2, "Float16 must be two bytes");

// Round-to-nearest-even fp32 → fp16; values beyond the fp16 range become ±inf, NaN stays NaN.
Float16 FloatToHalf(float value);
// Exact fp16 → fp32 (every fp16 value, subnormals included, is representable in fp32).
float HalfToFloat(Float16 value);

// Bulk conversions of `count` values; use F16C instructions when the CPU has them. Bit-identical to
// the scalar functions above.
void FloatToHalf(const float* src, size_t count, Float16* dst);
void HalfToFloat(const Float16* src, size_t count, float* dst);

}  // namespace tessera

#endif  // TESSERA_FLOAT16_H_
