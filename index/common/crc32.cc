#include "index/common/crc32.h"

#include <zlib.h>

#include <algorithm>

namespace tessera::internal {

uint32_t Crc32(absl::string_view bytes, uint32_t crc) {
  // zlib's crc32 takes a uInt length: feed it in chunks so that huge ranges are covered entirely.
  uLong state = crc;
  const auto* data = reinterpret_cast<const Bytef*>(bytes.data());
  size_t left = bytes.size();
  while (left > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(left, size_t{1} << 30));
    state = crc32(state, data, chunk);
    data += chunk;
    left -= chunk;
  }
  return static_cast<uint32_t>(state);
}

}  // namespace tessera::internal
