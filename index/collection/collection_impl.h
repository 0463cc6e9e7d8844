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
#include "tessera/base/mutex.h"
#include "tessera/collection.h"
#include "tessera/log.h"
#include "tessera/maxsim.h"

namespace tessera::internal {

// What every collection of an engine shares.
struct CollectionContext {
  std::shared_ptr<ThreadPool> pool;
  std::shared_ptr<const MaxSimScorer> scorer;
  CollectionLimits limits;
  ShardStoreOptions store_options;
  int64_t resident_rerank_bytes = 0;  // per shard (EngineOptions::resident_rerank_bytes)
  // EngineOptions::log. Each shard (and its store) logs through it with the fields collection and
  // shard added.
  LogSink log;
};

// Largest SearchOptions::nprobe accepted (more probes than centroids are clamped anyway).
inline constexpr int kMaxNprobe = 16384;

// A search that leaves N, k′ and nprobe at their defaults scores every (matching) document of a
// shard that holds at most this many times its share of N (the documents the cascade would
// rerank): 200 documents for k = 10 on one shard. The exhaustive search then scores at most twice
// the documents the cascade reranks and skips stage 1, so it costs at most ~2× the cascade, and
// its top k is exact where the cascade's stage 1 may miss it (a 200-page collection missed an
// exhaustive top hit at N = 100). Measured (bench/search_default_benchmark.cc, k = 10, 32 query
// tokens, dim 128, one shard; process CPU time per search, medians of 12 interleaved runs on a
// 2-vCPU AMD EPYC (Zen 4) VM), exhaustive / cascade:
//   passages (64 vectors):  200 docs 0.62 (1.08 / 1.76 ms, candidate scan), 250 docs 0.69,
//                           300 docs 1.39 (centroid index from 16,384 vectors), 400 docs 1.87;
//   pages (512 vectors):    150 docs 1.47, 200 docs 1.66 (8.7 / 5.3 ms), 300 docs 2.43;
// and 24× (wall) at 3,200 passages. So the crossover lies between N and 2.5 N documents (later
// on the candidate scan, whose stage 1 costs more than exact MaxSim of the shard), and 2 N keeps
// the exhaustive default within 1.7× of the cascade.
inline constexpr int64_t kExhaustiveDefaultShareMultiple = 2;

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
  absl::StatusOr<int64_t> DeleteMatching(const Filter& filter) override;
  absl::StatusOr<int64_t> Count(const Filter& filter) const override;
  absl::StatusOr<ScrollPage> Scroll(const ScrollOptions& options) const override;
  using Collection::Get;
  absl::StatusOr<StoredDocument> Get(const std::string& id,
                                     const GetOptions& options) const override;
  absl::StatusOr<SearchResult> Search(FloatMatrixView query,
                                      const SearchOptions& options) const override;
  CollectionStats Stats() const override;
  SparseStatistics SparseStatisticsOf(absl::Span<const uint32_t> terms) const override;
  absl::Status Snapshot() override;
  // Every shard's Checkpoint under `dir` in the layout Open reads (no schema file: the engine
  // writes it), at one cut: the collection's writes (Upsert, Delete, DeleteMatching) wait while
  // the shards are checkpointed, so the copy holds each write call whole or not at all.
  // `sequences`, when not null, gets each shard's RocksDB sequence number in the copy.
  absl::Status Checkpoint(const std::string& dir, std::vector<uint64_t>* sequences = nullptr) const;

  // See Shard::SetTrainingHookForTesting (every shard gets the hook) and
  // Shard::WaitForTrainingForTesting (waits for every shard).
  void SetTrainingHookForTesting(const std::function<void()>& hook);
  void WaitForTrainingForTesting() const;
  // Shard s's Shard::SetCodeReadHookForTesting.
  void SetCodeReadHookForTesting(int s, std::function<void()> hook);
  // Shard s's codebook (Shard::CodebookForTesting).
  std::shared_ptr<const CentroidCodebook> CodebookForTesting(int s) const;

  // Marks the collection dropped: its directory (already moved aside by the engine) is deleted
  // when the last reference goes away.
  void MarkDropped(std::string moved_dir);

 private:
  struct Scored;
  // A group of a grouped search: its value and best hits, best first.
  struct ScoredGroup {
    AttributeValue value;
    std::vector<Scored> hits;
  };
  CollectionImpl(std::string dir, CollectionSchema schema, CollectionContext context);

  // The one check of a document id, for Upsert, Get and Delete alike: INVALID_ARGUMENT unless it
  // is 1 … max_id_bytes bytes of valid UTF-8 (no document can have another id).
  absl::Status ValidateId(const std::string& id) const;
  // One log line per failed write of a shard (none of its documents were acknowledged): the
  // collection, shard, operation, documents, status code and message.
  void LogWriteFailure(size_t shard, const char* operation, size_t documents,
                       const absl::Status& status) const;
  absl::Status ValidateDocument(const Document& document) const;
  // Pools a valid document into its shard write.
  absl::StatusOr<ShardWrite> PrepareWrite(const Document& document) const;
  absl::Status ValidateQuery(FloatMatrixView query, const SearchOptions& options) const;
  // The cascade of a validated query matrix (Search without a sparse query).
  absl::StatusOr<SearchResult> SearchDense(FloatMatrixView query,
                                           const SearchOptions& options) const;
  // A search with a sparse query (HybridOptions): validates, runs the lanes, and fuses them
  // (FuseLanes), or returns them unfused for a part of a collection (whole_shards).
  absl::StatusOr<SearchResult> SearchHybrid(FloatMatrixView query,
                                            const SearchOptions& options) const;
  // The sparse lane over every shard: the best `depth` by (score desc, id asc), with MaxSim as
  // dense_score when `query` has rows and the search reranks.
  absl::StatusOr<std::vector<SearchHit>> SparseLane(FloatMatrixView query,
                                                    const SparseVectorView& sparse_query,
                                                    int64_t depth, const SearchOptions& options,
                                                    SearchResult* result) const;
  // INVALID_ARGUMENT naming the first field that is not an attribute field of the schema.
  absl::Status ValidateAttributeFields(const std::vector<std::string>& fields) const;
  // The hits a search asks for: k, or a grouped search's groups × group_size (what stage 1's N
  // is sized for).
  static int64_t HitsWanted(const SearchOptions& options);

  // A search's options with their defaults resolved, per shard.
  struct ShardPlan {
    int num_candidates = 0;  // N: the caller's, or the default for the shard's stage 1
    int share = 0;           // ⌈N / whole shards⌉: the documents it reranks
    int per_token = 0;       // k′
    // Score every (matching) document: the search left stage 1 to its defaults and the shard
    // holds at most kExhaustiveDefaultShareMultiple × share documents.
    bool every_document = false;
  };
  struct SearchPlan {
    std::vector<ShardPlan> shards;
    int nprobe = 0;
  };
  SearchPlan Plan(const SearchOptions& options) const;
  // Stage 1 of shard s: its share of N, the best documents by approximate score; of documents
  // tied at the cut, those with the smaller external ids (so that a router's shard node cuts
  // where this collection does), in no particular order. nullopt when stage 1 found fewer than
  // k (a selective filter): then every matching document of the shard is to be scored. In a
  // rerank_from_codes collection, stage 1 leaves the query's centroid scores in *centroid_scores
  // for the stage 2 from codes (Shard::ScoreCodes) to reuse, where it kept them
  // (CentroidSearchOptions::centroid_scores).
  absl::StatusOr<std::optional<std::vector<uint64_t>>> NominateCandidates(
      FloatMatrixView query, size_t s, const SearchPlan& plan, const SearchOptions& options,
      CentroidScoreTable* centroid_scores) const;
  // A document to score exactly: (shard, iid).
  using Candidate = std::pair<int, uint64_t>;
  // The documents stage 2 scores: per shard, stage 1's share of N; or every matching document
  // (asked for, the share covers the shard, or too few nominees). result->exhaustive when every
  // shard's were. (*centroid_scores)[s]: what NominateCandidates left for shard s (one entry per
  // shard; an empty table where stage 1 did not run or kept none).
  absl::StatusOr<std::vector<Candidate>> SelectForRanking(
      FloatMatrixView query, const SearchPlan& plan, const SearchOptions& options,
      SearchResult* result, std::vector<CentroidScoreTable>* centroid_scores) const;
  // Stage 2: exact MaxSim over `selected`, the best options.k (score desc, id asc); adds the
  // documents scored and the fetch/rerank timings to `result`. centroid_scores: per shard, as
  // SelectForRanking left them.
  absl::StatusOr<std::vector<Scored>> RankExactly(
      FloatMatrixView query, const std::vector<std::pair<int, uint64_t>>& selected,
      const std::vector<CentroidScoreTable>& centroid_scores, const SearchOptions& options,
      SearchResult* result) const;
  // Stage 2 of a grouped search: exact MaxSim over `selected`, folded into groups by the
  // group_by field's value; the best options.groups (all of them for a part of a collection,
  // options.whole_shards > 0), each with its best options.group_size, best group first.
  absl::StatusOr<std::vector<ScoredGroup>> RankGroups(
      FloatMatrixView query, const std::vector<std::pair<int, uint64_t>>& selected,
      const std::vector<CentroidScoreTable>& centroid_scores, const SearchOptions& options,
      SearchResult* result) const;
  // Per query token, the best document vector of a scored hit and the tokens it covers. For a
  // hit scored from its codes (no best_tokens), the best vectors among the decoded ones: their
  // similarities sum to the hit's score within CompactQuery::ErrorBound.
  absl::StatusOr<std::vector<TokenMatch>> Explain(FloatMatrixView query, const Scored& entry) const;
  // MaxSim of the query against the given (shard, iid) documents, appended to `scored` (with
  // their attributes when want_attributes, read with their id and version): exact
  // (fp32) over stored rerank vectors, from the codes (Shard::ScoreCodes, within its error bound)
  // for documents stored as codes only; the latter carry no best_tokens. centroid_scores: null, or
  // per shard stage 1's centroid scores for ScoreCodes to reuse (SelectForRanking).
  absl::Status ScoreDocuments(FloatMatrixView query, bool want_best_tokens, bool want_attributes,
                              const std::vector<std::pair<int, uint64_t>>& documents,
                              const std::vector<CentroidScoreTable>* centroid_scores,
                              std::vector<Scored>* scored, SearchTimings* timings) const;

  const std::string dir_;
  const CollectionSchema schema_;
  const CollectionContext context_;
  std::vector<std::unique_ptr<Shard>> shards_;
  // Held shared by every write call across its shard writes, exclusively by Checkpoint: a
  // snapshot's cut falls between write calls.
  mutable Mutex cut_mu_;
  std::atomic<bool> dropped_{false};
  std::string dropped_dir_;
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COLLECTION_COLLECTION_IMPL_H_
