// Fuzzes the shard store's value and key codecs (index/storage/record_codec.h) — the bytes read
// back from RocksDB — and the centroid codes payload they carry (ParseDocumentCodes,
// index/centroid/centroid_index.h).
//
// Input: byte 0 picks the decoder in its low 3 bits (0 document, 1 matrix, 2 id, 3 counter,
// 4 meta, 5 codes, 6 keys, 7 document) and, in bits 3-5, the code size for ParseDocumentCodes;
// bit 7 set keeps the value's CRC-32 as given, clear recomputes it, so that the fuzzer reaches the
// payload parsers behind the checksum. The rest is the value (or key). A document is decoded for
// the iid its own payload names (the mismatch check has unit tests).
//
// Asserts, beyond no crash or undefined behaviour (ASan, UBSan):
// - a failed decode is DATA_LOSS;
// - round trip: what decodes re-encodes to exactly the input bytes (documents, matrices, ids,
//   counters, meta and codes values, document codes, iid and codes keys) — the encodings are
//   canonical, so anything else means the decoder accepted bytes its encoder never writes; a
//   document of the older kind (kDocument) re-encodes as kPackedDocument, which must decode and
//   re-encode to itself;
// - a decoded matrix passes ValidateMatrix.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "index/centroid/centroid_index.h"
#include "index/common/crc32.h"
#include "index/storage/record_codec.h"
#include "tests/fuzz/fuzz_util.h"

namespace tessera::fuzz {
namespace {

uint64_t LoadU64(absl::string_view bytes, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[at + i])) << (8 * i);
  return v;
}

template <typename T>
bool Decoded(const absl::StatusOr<T>& result) {
  FUZZ_CHECK(result.ok() || absl::IsDataLoss(result.status()), result.status().ToString());
  return result.ok();
}

void CheckRoundTrip(const std::string& encoded, absl::string_view input, const char* what) {
  FUZZ_CHECK(encoded == input, absl::StrCat(what, ": decoded value re-encodes to other bytes"));
}

}  // namespace
}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using namespace tessera::fuzz;
  using namespace tessera::internal;
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::string value(reinterpret_cast<const char*>(data + 1), size - 1);
  if (!(mode & 0x80) && value.size() >= 4) {
    const uint32_t crc = Crc32(absl::string_view(value).substr(0, value.size() - 4));
    for (int i = 0; i < 4; ++i) value[value.size() - 4 + i] = static_cast<char>(crc >> (8 * i));
  }
  const uint64_t iid = value.size() >= 10 ? LoadU64(value, 2) : 1;

  switch (mode & 7) {
    case 1: {
      const absl::StatusOr<StoredMatrix> matrix = DecodeStoredMatrix(value, "rerank", iid);
      if (!Decoded(matrix)) break;
      FUZZ_CHECK(ValidateMatrix(*matrix, "matrix").ok(), ValidateMatrix(*matrix, "m").ToString());
      CheckRoundTrip(EncodeStoredMatrix(*matrix), value, "matrix");
      break;
    }
    case 2: {
      const absl::StatusOr<uint64_t> id = DecodeIdValue(value, "external id");
      if (Decoded(id)) CheckRoundTrip(EncodeIdValue(*id), value, "id");
      break;
    }
    case 3: {
      const absl::StatusOr<uint64_t> counter = DecodeCounterValue(value, "s/counter");
      if (Decoded(counter)) CheckRoundTrip(EncodeCounterValue(*counter), value, "counter");
      break;
    }
    case 4: {
      const absl::StatusOr<std::string> meta = DecodeMetaValue(value, "u/key");
      if (Decoded(meta)) CheckRoundTrip(EncodeMetaValue(*meta), value, "meta");
      break;
    }
    case 5: {
      const absl::StatusOr<std::string> codes = DecodeCodesValue(value, 1, iid);
      if (!Decoded(codes)) break;
      CheckRoundTrip(EncodeCodesValue(*codes), value, "codes value");
      const int64_t code_bytes = 1 + ((mode >> 3) & 7);
      const absl::StatusOr<DocumentCodes> parsed = ParseDocumentCodes(*codes, code_bytes, 256);
      if (!Decoded(parsed)) break;
      FUZZ_CHECK(static_cast<int64_t>(parsed->codes.size()) == parsed->size() * code_bytes,
                 "document codes size");
      for (uint32_t centroid : parsed->centroids) FUZZ_CHECK(centroid < 256, "centroid id");
      CheckRoundTrip(SerializeDocumentCodes(*parsed), *codes, "document codes");
      break;
    }
    case 6: {
      uint64_t key_iid = 0;
      uint32_t generation = 0;
      if (DecodeIidKey(value, &key_iid)) CheckRoundTrip(EncodeIidKey(key_iid), value, "iid key");
      if (DecodeCodesKey(value, &generation, &key_iid)) {
        CheckRoundTrip(EncodeCodesKey(generation, key_iid), value, "codes key");
      }
      break;
    }
    default: {
      const absl::StatusOr<DocumentRecord> record = DecodeDocumentRecord(value, iid);
      if (!Decoded(record)) break;
      FUZZ_CHECK(record->iid == iid, "document iid");
      const std::string encoded = EncodeDocumentRecord(*record);
      if (HasKind(value, RecordKind::kPackedDocument)) {
        CheckRoundTrip(encoded, value, "document");
      } else {  // a kDocument value (u32 membership) re-encodes packed, to the same record
        const absl::StatusOr<DocumentRecord> again = DecodeDocumentRecord(encoded, iid);
        FUZZ_CHECK(again.ok(), "re-encoded document decodes");
        CheckRoundTrip(EncodeDocumentRecord(*again), encoded, "re-encoded document");
      }
      break;
    }
  }
  return 0;
}
