// One shard of a collection: its ShardStore (RocksDB), its CandidateIndex (FAISS) and an in-memory
// table of its live documents (external id, attributes, sizes) used for filtering and statistics.
//
// Consistency: Apply() writes to the store (durably, group-committed with concurrent writers) and
// then updates the candidate index and the table in the store's commit order (commit_index), so the
// derived state always equals replaying the store. A write is visible to searches once Apply()
// returns. The candidate index is rebuildable: Open() loads its snapshot and adds documents newer
// than the snapshot and drops deleted ones, or rebuilds it from the store when the snapshot is
// missing, stale or corrupt.
//
// Resident rerank vectors: up to a byte budget, the table also holds each live document's rerank
// vectors (shared, immutable), loaded at Open() and replaced or dropped with the document in
// ApplyDerived, so searches that rerank them read no storage and see exactly what the table says
// is live.
#ifndef TESSERA_INDEX_COLLECTION_SHARD_H_
#define TESSERA_INDEX_COLLECTION_SHARD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "index/candidate/candidate_index.h"
#include "index/common/mutex.h"
#include "index/storage/shard_store.h"
#include "tessera/collection.h"

namespace tessera::internal {

// What the shard keeps in memory per live document.
struct LiveDocument {
  std::string external_id;
  uint64_t version = 0;
  Attributes attributes;
  int64_t num_tokens = 0;
  int64_t num_rerank_vectors = 0;
  // The stored rerank vectors when resident; null when the budget was spent.
  std::shared_ptr<const StoredMatrix> rerank;
};

struct ShardStats {
  int64_t documents = 0;
  int64_t original_tokens = 0;
  int64_t rerank_vectors = 0;
  int64_t candidate_vectors = 0;
  int64_t disk_bytes = 0;
  int64_t resident_bytes = 0;  // rerank vectors held in memory
  std::string candidate_index;
};

class Shard {
 public:
  // Opens (or creates) the shard in `dir`: the store in dir/db, the snapshot at
  // dir/candidates.snapshot. Keeps up to `resident_rerank_bytes` of rerank vectors in memory.
  static absl::StatusOr<std::unique_ptr<Shard>> Open(const std::string& dir,
                                                     const CollectionSchema& schema,
                                                     const ShardStoreOptions& store_options,
                                                     int64_t resident_rerank_bytes = 0);

  ShardStore& store() { return *store_; }
  const ShardStore& store() const { return *store_; }

  // Durably writes upserts and deletes, then indexes them. Returns the store's result.
  absl::StatusOr<WriteResult> Apply(std::vector<DocumentWrite> upserts,
                                    const std::vector<std::string>& deletes);

  // Stage 1: for each query row, up to k candidate hits among documents matching `filter`; exact
  // scans are split over `pool` (see CandidateIndex::Search).
  absl::StatusOr<std::vector<std::vector<CandidateHit>>> SearchCandidates(FloatMatrixView query,
                                                                          int k,
                                                                          const Filter& filter,
                                                                          ThreadPool* pool) const;

  // Calls fn(iid, document) for every live document matching `filter`, under a reader lock.
  void ForEachLive(const Filter& filter,
                   const std::function<void(uint64_t, const LiveDocument&)>& fn) const;
  // The live document's external id and version; false if iid is no longer live.
  bool Describe(uint64_t iid, std::string* external_id, uint64_t* version) const;
  // The rerank vectors of a live document when they are resident; null otherwise (not live, or
  // beyond the budget: read them from the store).
  std::shared_ptr<const StoredMatrix> ResidentRerank(uint64_t iid) const;
  int64_t num_documents() const;

  ShardStats Stats() const;
  // Flushes the store's memtables, then saves the candidate index with the iid it covers.
  absl::Status Snapshot() const;

 private:
  Shard(std::string dir, std::unique_ptr<ShardStore> store, int64_t resident_rerank_bytes);
  absl::Status LoadDocuments();
  // Reads the rerank vectors of live documents, in iid order, until the budget is spent.
  absl::Status LoadResidentRerank();
  absl::Status LoadOrRebuildCandidates(const CandidateIndexOptions& options)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  absl::Status RebuildCandidates(const CandidateIndexOptions& options)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  // Applies one committed write to the candidate index and the table.
  absl::Status ApplyDerived(std::vector<LiveDocument> documents,
                            const std::vector<StoredMatrix>& candidates, const WriteResult& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  void AddLive(uint64_t iid, LiveDocument document) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_mu_);
  void RemoveLive(uint64_t iid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_mu_);

  const std::string dir_;
  std::unique_ptr<ShardStore> store_;
  std::unique_ptr<CandidateIndex> candidates_;

  // Serialises ApplyDerived in commit order, and snapshots against it.
  mutable Mutex apply_mu_;
  CondVar applied_;  // signalled after each ApplyDerived
  uint64_t next_commit_ ABSL_GUARDED_BY(apply_mu_) = 1;
  // The highest iid the candidate index reflects (what a snapshot covers).
  uint64_t max_indexed_iid_ ABSL_GUARDED_BY(apply_mu_) = 0;

  // The live-document table. Written only inside ApplyDerived (apply_mu_ held, then table_mu_).
  mutable Mutex table_mu_;
  absl::flat_hash_map<uint64_t, LiveDocument> live_ ABSL_GUARDED_BY(table_mu_);
  int64_t original_tokens_ ABSL_GUARDED_BY(table_mu_) = 0;
  int64_t rerank_vectors_ ABSL_GUARDED_BY(table_mu_) = 0;
  const int64_t resident_budget_;
  int64_t resident_bytes_ ABSL_GUARDED_BY(table_mu_) = 0;
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COLLECTION_SHARD_H_
