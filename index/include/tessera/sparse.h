// Sparse vectors (term id → weight, as SPLADE and BM25 encoders and Qdrant produce them) and the
// BM25 statistics that a router sums over shards, so that a cluster scores a sparse query with the
// collection's IDF and average length, as a standalone server does. The per-shard inverted index
// that uses them is internal (index/sparse/sparse_index.h); these are the parts that server/ and
// the clients' converters need.
#ifndef TESSERA_SPARSE_H_
#define TESSERA_SPARSE_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tessera {

// The most terms one sparse vector (a document's or a query's) may hold by default.
inline constexpr int64_t kDefaultMaxSparseTerms = 65'536;

// A borrowed sparse vector: indices[i] carries weight values[i]. A valid one (ValidateSparseVector)
// has strictly increasing indices, as many values as indices, and finite weights ≥ 0.
struct SparseVectorView {
  absl::Span<const uint32_t> indices;
  absl::Span<const float> values;
};

// An owned sparse vector.
struct SparseVector {
  std::vector<uint32_t> indices;
  std::vector<float> values;

  SparseVectorView view() const { return {indices, values}; }
};

// OK, or INVALID_ARGUMENT naming `what` (e.g. "document 'a17' sparse vector"), the offending
// position and value, and what was expected: indices and values of different lengths, more than
// `max_terms` terms, indices not strictly increasing (unsorted or duplicated), a weight that is
// negative or not finite.
absl::Status ValidateSparseVector(const SparseVectorView& vector, absl::string_view what,
                                  int64_t max_terms = kDefaultMaxSparseTerms);

// How documents' sparse vectors are scored against a query's.
//
// With `idf` (the BM25 modifier), a document's weights are term frequencies and a query term t of
// weight q_t contributes, as Lucene's BM25Similarity does (without its 1-byte length quantisation):
//   q_t · IDF(t) · tf / (tf + k1 · (1 − b + b · dl / avgdl)),
//   IDF(t) = ln(1 + (N − df_t + 0.5) / (df_t + 0.5)),
// where N is the number of live documents, df_t those with a non-zero weight for t, dl the
// document's length (the sum of its weights unless one was declared) and avgdl the mean length of
// the live documents (1 when there are none or their lengths sum to 0). A query term repeated n
// times is a weight of n. Without `idf`, a score is the dot product Σ q_t · w_t.
struct SparseScoring {
  bool idf = true;
  double k1 = 1.2;  // ≥ 0
  double b = 0.75;  // in [0, 1]
};

// OK, or INVALID_ARGUMENT naming the field (k1 negative or not finite, b outside [0, 1]).
absl::Status ValidateSparseScoring(const SparseScoring& scoring);

// The statistics that BM25 reads: what one shard holds, or (Merge) a collection's summed over its
// shards. doc_freq need only cover the terms of the query it scores.
struct SparseStatistics {
  int64_t num_documents = 0;                        // N: live documents with a sparse vector
  double total_length = 0;                          // Σ dl over them
  absl::flat_hash_map<uint32_t, int64_t> doc_freq;  // df per term

  // Adds another shard's statistics (disjoint documents) to these.
  void Merge(const SparseStatistics& other);
  // avgdl as scored: total_length / num_documents, or 1 when either is 0.
  double AverageLength() const;
};

// IDF(t) as above.
double Bm25Idf(int64_t num_documents, int64_t doc_freq);

}  // namespace tessera

#endif  // TESSERA_SPARSE_H_
