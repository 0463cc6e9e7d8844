// Batches of lookups in a hash table larger than the caches (absl's flat_hash_map, or any map with
// its prefetch(key)): a stage-2 batch's documents lie anywhere in the shard's tables (the live
// table of 1M documents is ~200 MB), so each find would wait on its own cache misses. Asking for
// the entry a few lookups ahead lets those misses overlap.
#ifndef TESSERA_INDEX_COMMON_PREFETCHED_LOOKUP_H_
#define TESSERA_INDEX_COMMON_PREFETCHED_LOOKUP_H_

#include <cstddef>

#include "absl/types/span.h"

namespace tessera::internal {

// How many lookups ahead the entry is asked for: enough to cover a miss to memory with the finds
// in between, few enough that the prefetched lines are still in L1 when they are read.
inline constexpr size_t kLookupPrefetchDistance = 8;

// Before looking up keys[i]: asks `map` for the entry of keys[i + kLookupPrefetchDistance], if
// there is one.
template <typename Map, typename Key>
void PrefetchAhead(const Map& map, absl::Span<const Key> keys, size_t i) {
  if (i + kLookupPrefetchDistance < keys.size()) map.prefetch(keys[i + kLookupPrefetchDistance]);
}

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COMMON_PREFETCHED_LOOKUP_H_
