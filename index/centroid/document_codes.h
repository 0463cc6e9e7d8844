// A document's codes as the store holds them, read in place: what stage 2 from codes scores
// (ScoreStoredCodes, code_maxsim.h) and what ViewDocumentCodes (centroid_index.h) checks and
// returns.
#ifndef TESSERA_INDEX_CENTROID_DOCUMENT_CODES_H_
#define TESSERA_INDEX_CENTROID_DOCUMENT_CODES_H_

#include <cstdint>
#include <cstring>

namespace tessera::internal {

// size tokens: their centroid ids (little-endian u32, not necessarily 4-byte aligned), then
// their codes (size × code_bytes, row-major). Not owned: valid while the bytes are.
struct DocumentCodesView {
  int64_t size = 0;
  const char* centroids = nullptr;  // size × u32, little-endian, not necessarily 4-byte aligned
  const uint8_t* codes = nullptr;
  uint32_t centroid(int64_t v) const {
    uint32_t id;
    std::memcpy(&id, centroids + v * sizeof(uint32_t), sizeof(id));
    return id;
  }
  // The ids as an array, when their address allows it (always for bytes at a 4-byte-aligned
  // address: a segment's and a heap string's); null otherwise.
  const uint32_t* aligned_centroids() const {
    return reinterpret_cast<uintptr_t>(centroids) % alignof(uint32_t) == 0
               ? reinterpret_cast<const uint32_t*>(centroids)
               : nullptr;
  }
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_CENTROID_DOCUMENT_CODES_H_
