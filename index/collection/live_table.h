// The live-document table of one shard: per live document its external id, version, attributes
// and sizes, up to a byte budget its rerank vectors (resident: searches that rerank them read no
// storage), and the SparseIndex over the live documents' sparse vectors. Filters, statistics and
// a search's description of its hits are answered from it.
//
// Thread-safe: one reader-writer lock (mu_) guards everything; it is a leaf of the shard's lock
// order except while a filtered stage-1 search runs under it (Filtered), which takes only the
// stage-1 index's own locks. Every read that a search makes of the table for a batch of documents
// (Lookup) is one locked pass, so that an id, version, attributes and resident rows returned
// together are of the same instant. The shard writes it only in commit order (Shard::ApplyDerived,
// under the shard's apply_mu_), so that it always equals replaying the store.
//
// Resident budget: a document's rerank vectors are kept when they fit in what is left of the
// budget at the time they arrive (AddResident at open, in iid order; Apply for a write); they are
// dropped with the document, or by DropResident (rerank from codes), and the bytes go back to the
// budget. A document that did not fit stays non-resident for its life.
#ifndef TESSERA_INDEX_COLLECTION_LIVE_TABLE_H_
#define TESSERA_INDEX_COLLECTION_LIVE_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "index/sparse/sparse_index.h"
#include "index/storage/shard_store.h"
#include "tessera/base/mutex.h"
#include "tessera/collection.h"

namespace tessera::internal {

// What the table keeps per live document.
struct LiveDocument {
  std::string external_id;
  uint64_t version = 0;
  Attributes attributes;
  int64_t num_tokens = 0;
  int64_t num_rerank_vectors = 0;
  // The stored rerank vectors when resident; null when the budget was spent.
  std::shared_ptr<const StoredMatrix> rerank;
  // Only on its way from Shard::Apply to LiveTable::Apply, which moves it into the sparse index:
  // the table does not keep it.
  std::optional<SparseVector> sparse;
};

// One live document as one locked pass of the table saw it (LiveTable::Lookup).
struct LiveEntry {
  std::string external_id;
  uint64_t version = 0;
  Attributes attributes;  // when asked
  // The resident rerank vectors (shared, immutable); null when not resident.
  std::shared_ptr<const StoredMatrix> rerank;
};

// One hit of a shard's sparse lane, described from the table in the same lookup as the search.
struct SparseLaneHit {
  uint64_t iid = 0;
  float score = 0.0f;
  std::string external_id;
  uint64_t version = 0;
  Attributes attributes;  // when asked
};

// The table's totals (ShardStats).
struct LiveTotals {
  int64_t documents = 0;
  int64_t original_tokens = 0;
  int64_t rerank_vectors = 0;
  int64_t resident_bytes = 0;  // rerank vectors held in memory
};

class LiveTable {
 public:
  // Keeps up to `resident_budget` bytes of rerank vectors (< 0: as 0). `sparse`: the collection's
  // sparse field (validated with its schema), or none.
  LiveTable(int64_t resident_budget, const std::optional<SparseScoring>& sparse);
  LiveTable(const LiveTable&) = delete;
  LiveTable& operator=(const LiveTable&) = delete;

  int64_t resident_budget() const { return resident_budget_; }
  bool has_sparse() const { return has_sparse_; }

  // At open: adds a stored document, not resident, with its sparse vector when it has one and the
  // table a sparse field. DATA_LOSS naming the iid when the sparse index refuses the vector.
  absl::Status AddStored(const DocumentRecord& record) ABSL_LOCKS_EXCLUDED(mu_);
  // At open: makes the live documents `iids` resident with `matrices` (one per iid, in order),
  // until the budget is spent; a matrix without rows (a document reranked from its codes) is
  // skipped. Returns false once the budget is spent (the rest are not made resident), true when
  // all fitted. NOT_FOUND naming the iid when a matrix is absent (a live document always has a
  // rerank row). Moves the matrices it keeps.
  absl::StatusOr<bool> AddResident(absl::Span<const uint64_t> iids,
                                   std::vector<std::optional<StoredMatrix>>* matrices)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Applies one committed write, in commit order: per upsert i (documents[i], its version from
  // `result`) removes the document it replaced and adds it, resident when its rerank vectors fit;
  // removes the deleted ones. Every step runs; returns the sparse index's first error.
  absl::Status Apply(std::vector<LiveDocument> documents, const WriteResult& result)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the resident rerank vectors of `iids` (rerank from codes: the store dropped their rows)
  // and gives their bytes back to the budget; iids not live or not resident are skipped.
  void DropResident(absl::Span<const uint64_t> iids) ABSL_LOCKS_EXCLUDED(mu_);

  // The search's read, in one locked pass: per iid, in order, the document's id, version,
  // attributes (want_attributes) and resident rerank vectors, or std::nullopt when it is not live.
  std::vector<std::optional<LiveEntry>> Lookup(absl::Span<const uint64_t> iids,
                                               bool want_attributes) const ABSL_LOCKS_EXCLUDED(mu_);
  // The resident rerank vectors of each iid; null for one not live or not resident.
  std::vector<std::shared_ptr<const StoredMatrix>> Resident(absl::Span<const uint64_t> iids) const
      ABSL_LOCKS_EXCLUDED(mu_);
  bool Contains(uint64_t iid) const ABSL_LOCKS_EXCLUDED(mu_);
  // Of `iids`, those not live, in order.
  std::vector<uint64_t> NotLive(absl::Span<const uint64_t> iids) const ABSL_LOCKS_EXCLUDED(mu_);
  // Live iids above `after`, ascending.
  std::vector<uint64_t> LiveIidsAbove(uint64_t after) const ABSL_LOCKS_EXCLUDED(mu_);
  // Σ rerank vectors of the live documents among `iids`.
  int64_t RerankVectorsOf(absl::Span<const uint64_t> iids) const ABSL_LOCKS_EXCLUDED(mu_);

  // Calls fn(iid, document) for every live document matching `filter`, under the reader lock.
  void ForEachLive(const Filter& filter,
                   const std::function<void(uint64_t, const LiveDocument&)>& fn) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Calls fn(accept) under the reader lock, where accept(iid) says whether iid is live and its
  // attributes match `filter` (a stage-1 search's filter, consistent over the whole search).
  template <typename Fn>
  auto Filtered(const Filter& filter, Fn&& fn) const ABSL_LOCKS_EXCLUDED(mu_) {
    ReaderMutexLock lock(&mu_);
    const std::function<bool(uint64_t)> accept = [this, &filter](uint64_t iid) {
      mu_.AssertReaderHeld();
      return LiveAndMatches(iid, filter);
    };
    return fn(accept);
  }

  // The sparse lane (see Shard::SearchSparse); FAILED_PRECONDITION without a sparse field.
  absl::StatusOr<std::vector<SparseLaneHit>> SearchSparse(const SparseVectorView& query, int64_t k,
                                                          const Filter& filter,
                                                          const SparseStatistics* statistics,
                                                          bool want_attributes) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // N, Σ dl and df of each term over the live documents (all 0 without a sparse field).
  SparseStatistics SparseStatisticsOf(absl::Span<const uint32_t> terms) const
      ABSL_LOCKS_EXCLUDED(mu_);

  int64_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t rerank_vectors() const ABSL_LOCKS_EXCLUDED(mu_);
  LiveTotals Totals() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void AddLive(uint64_t iid, LiveDocument document) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveLive(uint64_t iid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether iid is live and its attributes match `filter`.
  bool LiveAndMatches(uint64_t iid, const Filter& filter) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const int64_t resident_budget_;

  mutable Mutex mu_;
  absl::flat_hash_map<uint64_t, LiveDocument> live_ ABSL_GUARDED_BY(mu_);
  int64_t original_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rerank_vectors_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t resident_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The live documents' sparse vectors; empty without a sparse field.
  std::optional<SparseIndex> sparse_ ABSL_GUARDED_BY(mu_);
  const bool has_sparse_;  // sparse_ has a value (set once, at construction)
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COLLECTION_LIVE_TABLE_H_
