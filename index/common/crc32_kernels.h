// Internal entry point of the carry-less-multiplication CRC-32 (crc32.h), in its own translation
// unit compiled with -msse4.1 -mpclmul and only called after a run-time CPU check; plain
// declarations, so that no inline code of a shared header is compiled with those flags.
#ifndef TESSERA_INDEX_COMMON_CRC32_KERNELS_H_
#define TESSERA_INDEX_COMMON_CRC32_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace tessera::internal {

// The CRC register after `size` bytes (a multiple of 16, at least 64), from register `state`:
// the pre- and post-inverted form, i.e. ~Crc32(bytes, ~state) in crc32.h's terms.
uint32_t Crc32FoldClmul(const uint8_t* data, size_t size, uint32_t state);

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COMMON_CRC32_KERNELS_H_
