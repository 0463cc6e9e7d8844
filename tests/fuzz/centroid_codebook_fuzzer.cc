// Fuzzes the centroid codebook snapshot reader, CentroidCodebook::Parse (index/centroid/
// centroid_codebook.h), with the residual codec's tables inside it (ResidualCodec::Parse): the
// bytes a shard reads back from its meta column family at open.
//
// Input: byte 0 is a mode, the rest the codebook bytes. Mode bit 0 clear: the trailing CRC-32 is
// recomputed, so that the fuzzer reaches the fields behind it; set: the bytes are parsed as they
// are.
//
// Asserts, beyond no crash or undefined behaviour (ASan, UBSan):
// - a rejected codebook is DATA_LOSS;
// - round trip: a parsed codebook serializes to exactly the input bytes;
// - a parsed codebook is usable: encoding vectors gives centroid ids below num_centroids and codes
//   that decode, and a CentroidIndex over it adds and searches documents.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "index/centroid/centroid_codebook.h"
#include "index/centroid/centroid_index.h"
#include "index/common/crc32.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using namespace tessera::internal;
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if (!(data[0] & 1) && bytes.size() >= 4) {
    const uint32_t crc = Crc32(absl::string_view(bytes).substr(0, bytes.size() - 4));
    for (int i = 0; i < 4; ++i) bytes[bytes.size() - 4 + i] = static_cast<char>(crc >> (8 * i));
  }
  absl::StatusOr<std::unique_ptr<CentroidCodebook>> parsed = CentroidCodebook::Parse(bytes);
  if (!parsed.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(parsed.status()), parsed.status().ToString());
    return 0;
  }
  std::shared_ptr<const CentroidCodebook> codebook = std::move(*parsed);
  FUZZ_CHECK(codebook->Serialize() == bytes, "the codebook serializes to other bytes");

  // Three documents of two vectors each.
  const int64_t dim = codebook->dim();
  std::vector<float> vectors(2 * dim);
  for (int64_t i = 0; i < 2 * dim; ++i) vectors[i] = (i % 2 == 0 ? 1.0f : -1.0f) / std::sqrt(dim);
  CentroidIndex index(codebook);
  for (uint64_t doc = 1; doc <= 3; ++doc) {
    vectors[doc % (2 * dim)] *= -1.0f;
    const DocumentCodes codes = index.Encode(FloatMatrixView{vectors.data(), 2, dim});
    FUZZ_CHECK(codes.size() == 2, "Encode count");
    std::vector<float> decoded(dim);
    for (int64_t v = 0; v < 2; ++v) {
      FUZZ_CHECK(codes.centroids[v] < static_cast<uint64_t>(codebook->num_centroids()),
                 absl::StrCat("centroid id ", codes.centroids[v]));
      codebook->Decode(
          codes.centroids[v],
          reinterpret_cast<const uint8_t*>(codes.codes.data()) + v * codebook->codec().code_bytes(),
          decoded.data());
    }
    const absl::Status added = index.Add(doc, codes);
    FUZZ_CHECK(added.ok(), added.ToString());
  }
  CentroidSearchOptions options;
  options.num_documents = 3;
  const absl::StatusOr<std::vector<CentroidHit>> hits =
      index.Search(FloatMatrixView{vectors.data(), 2, dim}, options, nullptr, nullptr);
  FUZZ_CHECK(hits.ok(), hits.status().ToString());
  FUZZ_CHECK(hits->size() <= 3, "more hits than asked for");
  for (const CentroidHit& hit : *hits) {
    FUZZ_CHECK(hit.doc >= 1 && hit.doc <= 3, absl::StrCat("hit on document ", hit.doc));
  }
  return 0;
}
