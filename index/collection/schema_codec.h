// The collection schema's persistent form: a small "key value" text, one field per line, headed by
// a format line. Stored as <collection>/schema and in every shard's meta column family.
#ifndef TESSERA_INDEX_COLLECTION_SCHEMA_CODEC_H_
#define TESSERA_INDEX_COLLECTION_SCHEMA_CODEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "tessera/collection.h"

namespace tessera::internal {

inline constexpr char kSchemaFormatLine[] = "tessera-collection-schema 1";

std::string EncodeSchema(const CollectionSchema& schema);
// DATA_LOSS for text that is not a valid encoding.
absl::StatusOr<CollectionSchema> DecodeSchema(const std::string& text);

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COLLECTION_SCHEMA_CODEC_H_
