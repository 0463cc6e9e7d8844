// The Collection implementation: ingest (validate → pool → write → index), get, delete and the
// two-stage search cascade over the collection's shards.
#ifndef TESSERA_INDEX_COLLECTION_COLLECTION_IMPL_H_
#define TESSERA_INDEX_COLLECTION_COLLECTION_IMPL_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "index/collection/shard.h"
#include "index/common/thread_pool.h"
#include "tessera/collection.h"
#include "tessera/maxsim.h"

namespace tessera::internal {

// What every collection of an engine shares.
struct CollectionContext {
  std::shared_ptr<ThreadPool> pool;
  std::shared_ptr<const MaxSimScorer> scorer;
  CollectionLimits limits;
  ShardStoreOptions store_options;
  int64_t resident_rerank_bytes = 0;  // per shard (EngineOptions::resident_rerank_bytes)
};

// Largest SearchOptions::nprobe accepted (more probes than centroids are clamped anyway).
inline constexpr int kMaxNprobe = 16384;

class CollectionImpl : public Collection {
 public:
  // Opens (or creates) the shards under `dir`. The schema must be valid.
  static absl::StatusOr<std::shared_ptr<CollectionImpl>> Open(const std::string& dir,
                                                              const CollectionSchema& schema,
                                                              CollectionContext context);
  // Removes the collection's files if it was dropped.
  ~CollectionImpl() override;

  const CollectionSchema& schema() const override { return schema_; }
  const std::string& directory() const { return dir_; }
  std::vector<UpsertOutcome> Upsert(std::vector<Document> documents) override;
  absl::StatusOr<std::vector<bool>> Delete(const std::vector<std::string>& ids) override;
  using Collection::Get;
  absl::StatusOr<StoredDocument> Get(const std::string& id,
                                     const GetOptions& options) const override;
  absl::StatusOr<SearchResult> Search(FloatMatrixView query,
                                      const SearchOptions& options) const override;
  CollectionStats Stats() const override;
  absl::Status Snapshot() override;
  // Every shard's Checkpoint under `dir` in the layout Open reads (no schema file: the engine
  // writes it).
  absl::Status Checkpoint(const std::string& dir) const;

  // See Shard::SetTrainingHookForTesting (every shard gets the hook) and
  // Shard::WaitForTrainingForTesting (waits for every shard).
  void SetTrainingHookForTesting(const std::function<void()>& hook);
  void WaitForTrainingForTesting() const;

  // Marks the collection dropped: its directory (already moved aside by the engine) is deleted
  // when the last reference goes away.
  void MarkDropped(std::string moved_dir);

 private:
  struct Scored;
  CollectionImpl(std::string dir, CollectionSchema schema, CollectionContext context);

  absl::Status ValidateDocument(const Document& document) const;
  // Pools a valid document into its store write.
  absl::StatusOr<DocumentWrite> PrepareWrite(const Document& document) const;
  absl::Status ValidateQuery(FloatMatrixView query, const SearchOptions& options) const;

  // A search's options with their defaults resolved.
  struct SearchPlan {
    int num_candidates = 0;  // N
    int per_token = 0;       // k′
    int nprobe = 0;
  };
  SearchPlan Plan(const SearchOptions& options) const;
  // A document stage 1 nominated, and its approximate MaxSim.
  struct Nominee {
    float score = 0.0f;
    int shard = 0;
    uint64_t iid = 0;
  };
  // Stage 1 over every shard: the plan's N best documents by approximate score; of documents
  // tied at the cut, those with the smaller external ids (so that a router merging shard nodes'
  // nominees cuts where this collection does), in no particular order.
  absl::StatusOr<std::vector<Nominee>> NominateCandidates(FloatMatrixView query,
                                                          const SearchPlan& plan,
                                                          const Filter& filter,
                                                          SearchTimings* timings) const;
  // A document to score exactly: (shard, iid).
  using Candidate = std::pair<int, uint64_t>;
  // SearchOptions::nominate_only: the nominees as hits, best stage-1 score first, the best
  // options.scored_share of them scored.
  absl::Status Nominate(FloatMatrixView query, const SearchPlan& plan, const SearchOptions& options,
                        SearchResult* result) const;
  // The documents stage 2 scores: SearchOptions::rerank_ids; or stage 1's N best; or every
  // matching document (asked for, N covers the collection, or too few nominees — then
  // result->exhaustive). result->documents must hold the collection's size.
  absl::StatusOr<std::vector<Candidate>> SelectForRanking(FloatMatrixView query,
                                                          const SearchPlan& plan,
                                                          const SearchOptions& options,
                                                          SearchResult* result) const;
  // SearchOptions::rerank_ids: the (shard, iid) of each stored id; ids not stored are left out.
  absl::StatusOr<std::vector<Candidate>> LookupIds(const std::vector<std::string>& ids) const;
  // Stage 2: exact MaxSim over `selected`, the best options.k (score desc, id asc); adds the
  // documents scored and the fetch/rerank timings to `result`.
  absl::StatusOr<std::vector<Scored>> RankExactly(
      FloatMatrixView query, const std::vector<std::pair<int, uint64_t>>& selected,
      const SearchOptions& options, SearchResult* result) const;
  // Per query token, the best document vector of a scored hit and the tokens it covers.
  absl::StatusOr<std::vector<TokenMatch>> Explain(FloatMatrixView query, const Scored& entry) const;
  // Exact MaxSim of the query against the given (shard, iid) documents, appended to `scored`.
  absl::Status ScoreDocuments(FloatMatrixView query, bool want_best_tokens,
                              const std::vector<std::pair<int, uint64_t>>& documents,
                              std::vector<Scored>* scored, SearchTimings* timings) const;

  const std::string dir_;
  const CollectionSchema schema_;
  const CollectionContext context_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::atomic<bool> dropped_{false};
  std::string dropped_dir_;
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COLLECTION_COLLECTION_IMPL_H_
