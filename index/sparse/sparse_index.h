// One shard's inverted index over its documents' sparse vectors, and its top-k search.
//
// Each term's postings (document ordinal, weight) are in insertion order, cut into blocks of
// kSparseBlockSize that keep their largest weight and smallest document length. A search runs
// Block-Max MaxScore (Ding & Suel 2011; Mallia et al. 2019): the query's terms are ordered by their
// score bound, the prefix whose bounds sum below the k-th best score so far is "non-essential"
// (only looked up for candidates from the others), and a candidate is dropped as soon as its
// partial score plus the bounds of the blocks its missing terms fall in cannot reach the k-th
// best. The answer equals the exhaustive one (SparseSearchRequest::exhaustive) exactly: the same
// ids, order and scores, since both sum a document's terms in the query's term order in double.
//
// Removal marks the document dead and updates the statistics at once; its postings stay (bounds
// stay valid upper bounds) until dead documents outnumber live ones, when the lists are compacted.
//
// Not thread-safe for writes: const methods may run concurrently with each other; Add, Remove and
// Deserialize need exclusive access (the shard holds its table lock).
#ifndef TESSERA_INDEX_SPARSE_SPARSE_INDEX_H_
#define TESSERA_INDEX_SPARSE_SPARSE_INDEX_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tessera/sparse.h"

namespace tessera::internal {

inline constexpr int kSparseBlockSize = 64;

struct SparseIndexOptions {
  SparseScoring scoring;
  int64_t max_terms = kDefaultMaxSparseTerms;  // per document and per query
};

struct SparseSearchRequest {
  SparseVectorView query;  // validated like a document's
  int64_t k = 10;          // ≥ 1
  // Keeps only the documents it returns true for (called at most once per document, and only for
  // those that could still enter the top k). Empty: every live document.
  std::function<bool(uint64_t iid)> filter;
  // The collection's statistics (SparseStatistics::Merge over its shards), covering every query
  // term; null: this shard's own. Ignored without the IDF modifier.
  const SparseStatistics* statistics = nullptr;
  // Scores every posting of the query's terms (the reference the skipping search must equal).
  bool exhaustive = false;
};

struct SparseHit {
  uint64_t iid = 0;
  float score = 0.0f;  // the double score rounded; the ranking uses the double
};

struct SparseSearchResult {
  std::vector<SparseHit> hits;   // best first; equal scores by ascending iid; only scores > 0
  int64_t postings_total = 0;    // postings (live or dead) in the query terms' lists: a full scan
  int64_t postings_scored = 0;   // postings whose contribution was computed
  int64_t documents_scored = 0;  // documents whose full score was computed
  int64_t blocks_skipped = 0;    // candidate rejections by a block bound
};

class SparseIndex {
 public:
  // INVALID_ARGUMENT for scoring options out of range (ValidateSparseScoring) or max_terms < 1.
  static absl::StatusOr<SparseIndex> Create(const SparseIndexOptions& options);

  // Indexes `vector` (validated, naming the iid) as document `iid`, replacing the iid's current
  // vector if it has one. Its length is `length` when given (finite, ≥ 0), else the sum of its
  // weights. Terms of weight 0 count in no df and hold no posting. INVALID_ARGUMENT on a bad
  // vector or length (nothing changes); RESOURCE_EXHAUSTED past 2^32 − 2 documents.
  absl::Status Add(uint64_t iid, const SparseVectorView& vector,
                   std::optional<float> length = std::nullopt);
  // Removes document `iid`; false when it is not indexed.
  bool Remove(uint64_t iid);
  bool Contains(uint64_t iid) const;

  int64_t num_documents() const { return num_live_; }
  // N, Σ dl, and df for each of `terms` (0 for a term no live document holds): what a router sums.
  SparseStatistics Statistics(absl::Span<const uint32_t> terms) const;

  // The best request.k live documents with a score > 0 that pass the filter. INVALID_ARGUMENT for
  // a bad query or k < 1, or for statistics missing a query term, with df > N, N < 0 or a length
  // that is negative or not finite.
  absl::StatusOr<SparseSearchResult> Search(const SparseSearchRequest& request) const;

  // The live documents (iid, length, vector) in a compact byte string (host byte order, for a
  // snapshot of the derived state); Deserialize rebuilds an equal index (DATA_LOSS when the bytes
  // are not one; INVALID_ARGUMENT when they hold a document these options refuse).
  std::string Serialize() const;
  static absl::StatusOr<SparseIndex> Deserialize(absl::string_view bytes,
                                                 const SparseIndexOptions& options);

  // Postings held, dead ones included (what compaction reclaims).
  int64_t num_postings() const { return num_postings_; }

 private:
  struct Block {
    uint32_t last_doc = 0;
    float max_weight = 0.0f;
    float min_length = 0.0f;
  };
  struct PostingList {
    std::vector<uint32_t> docs;  // ordinals, increasing
    std::vector<float> weights;
    std::vector<Block> blocks;  // blocks[i] covers postings [i·B, (i+1)·B)
    int64_t doc_freq = 0;       // live documents holding the term
  };
  struct Document {
    uint64_t iid = 0;
    float length = 0.0f;
    bool live = false;
    uint64_t terms_begin = 0;  // its term ids: terms_[terms_begin, terms_end)
    uint64_t terms_end = 0;
  };
  class Cursor;
  struct PreparedQuery;

  explicit SparseIndex(const SparseIndexOptions& options) : options_(options) {}

  // Rebuilds the lists and the document table without dead documents.
  void Compact();
  // Appends a posting to `list`, extending its last block or opening one.
  static void AppendPosting(PostingList* list, uint32_t doc, float weight, float length);
  // The query's terms with postings here, their scales and score bounds, and the scorer.
  absl::StatusOr<PreparedQuery> PrepareQuery(const SparseSearchRequest& request) const;
  void SearchExhaustive(const SparseSearchRequest& request, const PreparedQuery& query,
                        SparseSearchResult* result) const;
  void SearchMaxScore(const SparseSearchRequest& request, const PreparedQuery& query,
                      SparseSearchResult* result) const;

  SparseIndexOptions options_;
  absl::flat_hash_map<uint32_t, PostingList> lists_;
  std::vector<Document> documents_;  // by ordinal
  // documents_[i].length for a live document, −1 for a dead one: what the search loops read.
  std::vector<float> live_length_;
  std::vector<uint32_t> terms_;  // the documents' term ids with a posting, by ordinal
  absl::flat_hash_map<uint64_t, uint32_t> ordinal_of_;  // live iid → ordinal
  int64_t num_live_ = 0;
  double total_length_ = 0;
  int64_t num_postings_ = 0;
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_SPARSE_SPARSE_INDEX_H_
