// Fixed-width little-endian integers in byte buffers: the on-disk order of Tessera's records and
// segment files, whatever the host's order. Byte at a time, which compilers turn into one load or
// store on little-endian hosts.
#ifndef TESSERA_INDEX_COMMON_LITTLE_ENDIAN_H_
#define TESSERA_INDEX_COMMON_LITTLE_ENDIAN_H_

#include <cstdint>

namespace tessera::internal {

inline void StoreLittleEndian32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

inline void StoreLittleEndian64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

inline uint32_t LoadLittleEndian32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

inline uint64_t LoadLittleEndian64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COMMON_LITTLE_ENDIAN_H_
