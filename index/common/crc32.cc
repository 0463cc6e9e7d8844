#include "index/common/crc32.h"

#include <zlib.h>

#include <algorithm>

#include "index/common/cpu_features.h"
#include "index/common/crc32_kernels.h"

namespace tessera::internal {

uint32_t Crc32(absl::string_view bytes, uint32_t crc) {
  const auto* data = reinterpret_cast<const Bytef*>(bytes.data());
  size_t left = bytes.size();
  // Ranges of 64 bytes or more by carry-less multiplication (3.3× zlib's tables on 16 KiB here: a
  // fetched document's check was a few % of a search at 1M documents), their tail by zlib.
  const bool clmul = Cpu().pclmul && Cpu().sse41;
  if (clmul && left >= 64) {
    const size_t folded = left & ~size_t{15};
    crc = ~Crc32FoldClmul(data, folded, ~crc);
    data += folded;
    left -= folded;
  }
  // zlib's crc32 takes a uInt length: feed it in chunks so that huge ranges are covered entirely.
  uLong state = crc;
  while (left > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(left, size_t{1} << 30));
    state = crc32(state, data, chunk);
    data += chunk;
    left -= chunk;
  }
  return static_cast<uint32_t>(state);
}

}  // namespace tessera::internal
