// MaxSimScorer::Score: the one validating entry point shared by every backend. It checks the shapes
// and values a client controls, sizes the result, and hands validated inputs to ScoreImpl.
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tessera/maxsim.h"
#include "tessera/status_macros.h"

namespace tessera {
namespace {

absl::Status ValidateQuery(FloatMatrixView query) {
  if (query.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("query: data is null, expected ", query.rows,
                                                   " × ", query.cols, " fp32 values"));
  }
  if (query.rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat("query: rows ", query.rows, ", expected ≥ 1"));
  }
  if (query.cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat("query: cols ", query.cols, ", expected ≥ 1"));
  }
  const int64_t count = query.rows * query.cols;
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(query.data[i])) {
      return absl::InvalidArgumentError(absl::StrCat("query: value at row ", i / query.cols,
                                                     ", col ", i % query.cols, " is ",
                                                     query.data[i], ", expected a finite value"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateDocuments(const DocumentBatch& docs, int64_t query_dim) {
  if (docs.dtype != VectorDtype::kFloat32 && docs.dtype != VectorDtype::kFloat16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "documents: dtype ", static_cast<int>(docs.dtype), ", expected kFloat32 or kFloat16"));
  }
  if (docs.dim != query_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("documents: dim ", docs.dim, ", expected ", query_dim, " (the query's cols)"));
  }
  for (size_t d = 0; d < docs.docs.size(); ++d) {
    const DocumentRef& doc = docs.docs[d];
    if (doc.num_tokens < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("document ", d, ": num_tokens ", doc.num_tokens, ", expected ≥ 1"));
    }
    // best_tokens are int32.
    if (doc.num_tokens > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("document ", d, ": num_tokens ",
                                                     doc.num_tokens, ", expected ≤ ",
                                                     std::numeric_limits<int32_t>::max()));
    }
    if (doc.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("document ", d, ": data is null, expected ",
                                                     doc.num_tokens, " × ", docs.dim, " values"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MaxSimResult> MaxSimScorer::Score(FloatMatrixView query, const DocumentBatch& docs,
                                                 const MaxSimOptions& options) const {
  TESSERA_RETURN_IF_ERROR(ValidateQuery(query));
  TESSERA_RETURN_IF_ERROR(ValidateDocuments(docs, query.cols));
  MaxSimResult result;
  result.scores.assign(docs.docs.size(), 0.0f);
  if (options.want_best_tokens) {
    result.best_tokens.assign(docs.docs.size() * static_cast<size_t>(query.rows), 0);
  }
  TESSERA_RETURN_IF_ERROR(ScoreImpl(query, docs, options, &result));
  return result;
}

}  // namespace tessera
