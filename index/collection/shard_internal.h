// What the files of the Shard class (shard.cc, shard_training.cc, shard_recovery.cc) share: the
// names of what a shard keeps beside its documents, and the size of its batched reads.
#ifndef TESSERA_INDEX_COLLECTION_SHARD_INTERNAL_H_
#define TESSERA_INDEX_COLLECTION_SHARD_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace tessera::internal::shard_files {

// The candidate index's snapshot, beside the store's directory.
inline constexpr char kSnapshotFile[] = "candidates.snapshot";
// Meta keys of the centroid index: "<generation> <trained vectors>", and each generation's
// codebook.
inline constexpr char kGenerationKey[] = "centroid_generation";
inline std::string CodebookKey(uint32_t generation) {
  return absl::StrCat("codebook/", generation);
}
// Documents read per MultiGet when loading resident rerank vectors or encoding for a training.
inline constexpr size_t kReadBatch = 256;

}  // namespace tessera::internal::shard_files

#endif  // TESSERA_INDEX_COLLECTION_SHARD_INTERNAL_H_
