#include "index/stage1/stage1_index.h"

#include "absl/strings/str_cat.h"

namespace tessera::internal {

absl::StatusOr<std::vector<Stage1Payload>> Stage1Index::Derive(
    absl::Span<const Stage1Source> documents, ThreadPool* pool) const {
  for (const Stage1Source& document : documents) {
    const StoredMatrix* stored = document.stored;
    if (stored == nullptr || stored->rows < 1 || stored->cols != dim_) {
      return absl::InvalidArgumentError(absl::StrCat(
          document.what, ": ", stored == nullptr ? 0 : stored->rows, " × ",
          stored == nullptr ? 0 : stored->cols, " rerank vectors, expected ≥ 1 × ", dim_));
    }
    if (document.pooled.data != nullptr &&
        (document.pooled.rows != stored->rows || document.pooled.cols != dim_)) {
      return absl::InvalidArgumentError(
          absl::StrCat(document.what, ": ", document.pooled.rows, " × ", document.pooled.cols,
                       " pooled vectors for ", stored->rows, " × ", dim_, " stored ones"));
    }
  }
  return DeriveImpl(documents, pool);
}

absl::StatusOr<std::vector<Stage1Hit>> Stage1Index::Search(
    const Stage1Query& query, const std::function<bool(uint64_t)>* accept, ThreadPool* pool) const {
  if (query.query.rows < 1 || query.query.cols != dim_) {
    return absl::InvalidArgumentError(absl::StrCat("stage 1: query of ", query.query.rows, " × ",
                                                   query.query.cols, ", expected ≥ 1 × ", dim_));
  }
  return SearchImpl(query, accept, pool);
}

}  // namespace tessera::internal
