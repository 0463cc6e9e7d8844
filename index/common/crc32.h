// CRC-32 (zlib's polynomial) of byte ranges of any size: the checksum of stored records, snapshots
// and codebooks.
#ifndef TESSERA_INDEX_COMMON_CRC32_H_
#define TESSERA_INDEX_COMMON_CRC32_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace tessera::internal {

// The CRC-32 of `bytes`, continuing from `crc` (the CRC of the bytes before them; 0 to start), so
// that Crc32(b, Crc32(a)) == Crc32(a + b).
uint32_t Crc32(absl::string_view bytes, uint32_t crc = 0);

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COMMON_CRC32_H_
