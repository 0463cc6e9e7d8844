// Validation of sparse vectors and scoring options, and the BM25 statistics (tessera/sparse.h).
#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tessera/sparse.h"

namespace tessera {

absl::Status ValidateSparseVector(const SparseVectorView& vector, absl::string_view what,
                                  int64_t max_terms) {
  const size_t n = vector.indices.size();
  if (vector.values.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", n, " indices but ",
                                                   vector.values.size(),
                                                   " values; expected one value per index"));
  }
  if (static_cast<int64_t>(n) > max_terms) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", n, " terms; at most ", max_terms, " are allowed"));
  }
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && vector.indices[i] <= vector.indices[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": indices[", i, "] = ", vector.indices[i],
          vector.indices[i] == vector.indices[i - 1] ? " repeats" : " is below", " indices[", i - 1,
          "] = ", vector.indices[i - 1], "; expected strictly increasing term ids"));
    }
    const float value = vector.values[i];
    if (!std::isfinite(value) || value < 0.0f) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": values[", i, "] = ", value, " (term ",
                                                     vector.indices[i],
                                                     "); expected a finite weight >= 0"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSparseScoring(const SparseScoring& scoring) {
  if (!std::isfinite(scoring.k1) || scoring.k1 < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse scoring: k1 = ", scoring.k1, "; expected a finite value >= 0"));
  }
  if (!(scoring.b >= 0 && scoring.b <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse scoring: b = ", scoring.b, "; expected a value in [0, 1]"));
  }
  return absl::OkStatus();
}

void SparseStatistics::Merge(const SparseStatistics& other) {
  num_documents += other.num_documents;
  total_length += other.total_length;
  for (const auto& [term, df] : other.doc_freq) doc_freq[term] += df;
}

double SparseStatistics::AverageLength() const {
  if (num_documents <= 0 || !(total_length > 0)) return 1.0;
  return total_length / static_cast<double>(num_documents);
}

double Bm25Idf(int64_t num_documents, int64_t doc_freq) {
  const double n = static_cast<double>(num_documents);
  const double df = static_cast<double>(doc_freq);
  return std::log(1.0 + (n - df + 0.5) / (df + 0.5));
}

}  // namespace tessera
