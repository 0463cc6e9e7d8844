// Helpers shared by the token and spatial pooling implementations.
#ifndef TESSERA_INDEX_POOLING_POOLING_INTERNAL_H_
#define TESSERA_INDEX_POOLING_POOLING_INTERNAL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "tessera/matrix.h"
#include "tessera/pooling.h"

namespace tessera::internal {

// INVALID_ARGUMENT unless tokens has ≥ 1 row, ≥ 1 column, non-null data and only finite values.
absl::Status ValidateTokenMatrix(FloatMatrixView tokens);

// Builds a PooledMatrix from groups of input rows: vector v is the mean of rows groups[v] (summed
// in double, in ascending row order), L2-normalised where renormalize[v] is true (an empty
// vector: none). Labels cover every row of `tokens`; rows in no group get -1.
PooledMatrix MeanOfGroups(FloatMatrixView tokens, const std::vector<std::vector<int32_t>>& groups,
                          const std::vector<bool>& renormalize);

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_POOLING_POOLING_INTERNAL_H_
