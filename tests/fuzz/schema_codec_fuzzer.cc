// Fuzzes the collection schema's stored text form (index/collection/schema_codec.h), read back
// from <collection>/schema and each shard's meta column family when a collection opens.
//
// Asserts, beyond no crash or undefined behaviour (ASan, UBSan):
// - a rejected text is DATA_LOSS;
// - round trip: a decoded schema encodes to a text that decodes to a schema with the same encoding
//   (EncodeSchema is a fixed point), which is how Collection::Open compares stored schemas;
// - ValidateSchema, which the engine runs on every schema it opens, accepts it or says
//   INVALID_ARGUMENT.
#include <cstddef>
#include <cstdint>
#include <string>

#include "index/collection/schema_codec.h"
#include "tessera/collection.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using namespace tessera::internal;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<CollectionSchema> schema = DecodeSchema(text);
  if (!schema.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(schema.status()), schema.status().ToString());
    return 0;
  }
  const std::string encoded = EncodeSchema(*schema);
  const absl::StatusOr<CollectionSchema> again = DecodeSchema(encoded);
  FUZZ_CHECK(again.ok(), again.status().ToString() + " for\n" + encoded);
  FUZZ_CHECK(EncodeSchema(*again) == encoded, "EncodeSchema is not a fixed point:\n" + encoded);
  const absl::Status valid = ValidateSchema(*schema);
  FUZZ_CHECK(valid.ok() || absl::IsInvalidArgument(valid), valid.ToString());
  return 0;
}
