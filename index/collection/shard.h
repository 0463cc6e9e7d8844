// One shard of a collection: its ShardStore (RocksDB), its stage-1 index and the LiveTable of its
// live documents (live_table.h: external id, attributes, sizes, resident rerank vectors, sparse
// index) used for filtering, statistics and describing hits. The class is split by job over
// three files: shard.cc (the write path and the reads), shard_training.cc (the centroid
// training's lifecycle, below) and shard_recovery.cc (the derived state rebuilt at Open: the
// table, the resident rerank vectors, stage 1).
//
// Stage 1 is one Stage1Index (index/stage1/stage1_index.h, DESIGN §5), held through the interface:
// the shard derives each written document's stage-1 payload with it, stores the payload in the
// document's WriteBatch, indexes it, and searches, snapshots and reports it, without asking which
// implementation it has. It is one of two:
// - CandidateStage1, the exact/FAISS CandidateIndex over each document's candidate vectors, while
//   the shard is small (or when the schema names a FAISS factory);
// - CentroidStage1, the CentroidIndex over the rerank vectors themselves (centroid id + residual
//   code each), once the shard holds CandidateSpec::centroid_min_vectors rerank vectors (factory
//   "auto"). Training runs on a background thread: it trains a codebook on a sample, encodes every
//   live document into a new index while writes go on (further writes wait once they run too far
//   ahead of it: kMaxTrainingLagDocuments), then — holding the write path for the few documents
//   written meanwhile — catches up and swaps the new index in. The shard retrains the same way once
//   it holds kRetrainGrowth (4) times the vectors its codebook was trained on, or once its size
//   calls for more centroids than its codebook has (DefaultNumCentroids). A shard never goes back
//   to the candidate index; documents written with the centroid index carry codes and no candidate
//   vectors, and the switch deletes those of the documents written before.
// Which one a shard opens with, and the training that replaces it, are the only places that name
// an implementation. A write derives its payload while it holds the write path shared (encode_mu_),
// which a training's swap takes exclusively, so a payload is always indexed by the stage 1 that
// derived it.
//
// Durability of the centroid index: each trained codebook is generation g (meta keys
// "centroid_generation" and "codebook/<g>"), and every document's codes are stored under g in
// the same WriteBatch as the document. A retrain writes generation g+1 beside g and commits by
// writing "centroid_generation" = g+1; a crash before that leaves g intact (the partial g+1 is
// dropped at open). At open the lists are rebuilt from the codes of the current generation
// (documents missing codes are encoded from their rerank vectors, orphans deleted).
//
// Consistency: Apply() writes to the store (durably, group-committed with concurrent writers) and
// then updates the stage-1 index and the table in the store's commit order (commit_index), so the
// derived state always equals replaying the store. A write is visible to searches once Apply()
// returns. Atomicity: everything that can reject a write (shapes, finite values as stored, the
// stage-1 payload: Stage1Index::Derive) runs before the durable write; after it only in-memory
// structures change, and nothing in the input can fail them. Should the index fail anyway (a
// FAISS error, an allocation), the table still follows the store and the shard is *failed*: Apply,
// SearchCandidates and Snapshot return INTERNAL until the shard is reopened (which rebuilds the
// index from the store), while reads of stored documents (LookupId, GetRecord, FetchRerank,
// Describe) go on. The candidate index is rebuildable: Open() loads its snapshot and adds
// documents newer than the snapshot and drops deleted ones, or rebuilds it from the store when
// the snapshot is missing, stale or corrupt.
//
// Resident rerank vectors: up to a byte budget, the table also holds each live document's rerank
// vectors (shared, immutable), loaded at Open() and replaced or dropped with the document in
// ApplyDerived, so searches that rerank them read no storage and see exactly what the table says
// is live. A search reads the table once per batch of documents it ranks (FetchForRanking: id,
// version, attributes and resident rows in one locked pass), and describes its hits from that
// read.
//
// Rerank from codes (CandidateSpec::rerank_from_codes): once the first codebook is in use, a
// write stores its codes and a rerank matrix without rows, and the training that made the
// codebook drops the rows (and, as every training, the candidate vectors) of the documents written
// before it, in the same critical section as its commit (or at the next open after a crash in
// between): no fp16/fp32 copy remains. Stage 2 scores the documents from their codes as stored
// (4 + code_bytes bytes per vector), read in place from the store's codes segments
// (ShardStore::ReadCodes: views into the mapped files, laid out in the compact layout a few
// documents at a time as they are scored) without decoding them (FetchCodes + ScoreCodes: compact
// MaxSim, code_maxsim.h), within
// CompactQuery::ErrorBound of the fp32 MaxSim of the decoded vectors; FetchRerank (Get, training)
// and DecodeCodes (explain) decode the codes (centroid + residual) the same way. The process keeps
// no per-document copy of the codes: its centroid index holds only the lists (their 1-bit
// coarsening, as every shard's: CentroidIndex's kScanNbits), and the codes stay in the page
// cache. The retrain race: codes are read under the generation of the Stage1 in use and scored or
// decoded with its codebook (so that codes are always paired with the codebook that made them);
// a training swaps its Stage1 in before it drops the older generation's codes, so a read that
// finds a live document's codes missing while a newer Stage1 is in use reads all of them again
// under the newer one (ReadStoredCodes). A document missing under the generation in use was
// removed, and is left out.
//
// Such a shard retrains by the same rules as the others (OutgrewTraining): it has no stored
// vectors, so the training samples the vectors decoded from its codes (centroid + residual) and
// re-encodes every live document from its decoded vectors with the new codebook — a second
// quantisation (measured in centroid_stage_test: relative squared error 0.017 against 0.010 for
// one quantisation by the final codebook, dim 48, 4 bits). Generations, catch-up and swap are
// the other trainings' (above): until the commit the old codes stay the shard's and are what
// the new ones are decoded from.
//
// Sparse vectors (CollectionSchema::sparse): a document's sparse vector is part of its record
// (same WriteBatch, same durability), and the shard's SparseIndex over its live documents is
// rebuilt from the records at Open() and maintained with the table in ApplyDerived (under the
// table's lock): an upsert replaces the old vector, a delete removes it.
//
// Lock order: encode_mu_ → apply_mu_ → state_mu_, and apply_mu_ → the LiveTable's lock
// (live_table.h). state_mu_ (the stage 1 in use and the failure, held only to copy or replace
// them) and the table's lock are leaves: no lock of the shard is taken while either is held.
#ifndef TESSERA_INDEX_COLLECTION_SHARD_H_
#define TESSERA_INDEX_COLLECTION_SHARD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "index/centroid/centroid_index.h"
#include "index/centroid/code_maxsim.h"
#include "index/collection/live_table.h"
#include "index/sparse/sparse_index.h"
#include "index/stage1/stage1_index.h"
#include "index/storage/shard_store.h"
#include "tessera/base/mutex.h"
#include "tessera/collection.h"

namespace tessera::internal {

class CandidateIndex;
class ThreadPool;

struct ShardStats {
  int64_t documents = 0;
  int64_t original_tokens = 0;
  int64_t rerank_vectors = 0;
  int64_t candidate_vectors = 0;
  int64_t candidate_bytes = 0;  // memory of the stage-1 index
  int64_t disk_bytes = 0;
  int64_t resident_bytes = 0;  // rerank vectors held in memory
  std::string candidate_index;
  bool training = false;  // a centroid training runs in the background
  // Trainings since the shard opened that finished, and that failed (a closing shard's abandoned
  // training is neither).
  int64_t trainings_completed = 0;
  int64_t trainings_failed = 0;
  // The last training that finished or failed: how long it ran, and when it ended (steady clock
  // ticks since its epoch; 0: none yet).
  double last_training_seconds = 0;
  int64_t last_training_end = 0;
  // The store's append-once segment files (ShardStore::SegmentStats): fp16 rerank rows, and codes
  // of every generation.
  SegmentFigures segments;
};

// One document a search ranks (Shard::FetchForRanking): how the table described it and its rerank
// vectors, read together.
struct RankingDocument {
  std::string external_id;
  uint64_t version = 0;
  Attributes attributes;  // when asked
  // A view of its rerank vectors (resident in memory, or in place in the store), keeping what it
  // points into alive; without rows for a document stored as codes only (scored by FetchCodes +
  // ScoreCodes). Null: the document is not live (or was removed from the store since the table's
  // pass), and is to be skipped.
  std::shared_ptr<const StoredMatrixView> rerank;
};

// Stage 1 of one query on one shard: the query and, when not null or empty, the filter the
// documents must match.
struct Stage1Request : Stage1Query {
  const Filter* filter = nullptr;
};

// One document for Shard::Apply to upsert.
struct ShardWrite {
  // What the store writes; its stage-1 fields (candidates, codes) are the shard's to fill.
  DocumentWrite document;
  // The rerank vectors as pooling left them, before the storage rounding (document.rerank's
  // rows × dim, fp32), which stage 1 may derive its payload from (Stage1Source::pooled); empty:
  // document.rerank's values.
  std::vector<float> pooled;
};

// A shard retrains once it holds this many times the vectors its codebook was trained on. The
// codebook's size follows √vectors (DefaultNumCentroids), so it doubles at every 4× growth; a
// retraining in between only refreshed the sample, at the cost of re-encoding every document (on
// a 1M-document build, the one at 2× — 33M vectors — ran through the second half of the ingest and
// 9 minutes past it). 4× also bounds how far the data can drift from the sample.
inline constexpr int64_t kRetrainGrowth = 4;

// How far writes may run ahead of a training's encoding into its new index: a write that finds
// more documents than this written past the last one the training has encoded waits (Apply,
// before it encodes) until the training has encoded more or ended, for at most kMaxTrainingStall.
// During the training's first pass over the shard's documents the bound is a quarter of those
// documents, when that is more (writes at a moderate rate then never wait); in the catch-up rounds
// after it, this. Without a bound a training whose encoding is slower than the ingest chased it:
// on a 3M-document build the training that started at ~1.05M documents (65,536 centroids) was
// still catching up at 2.32M, with the old and the new index both growing, until the process ran
// out of memory. A write stall, as RocksDB stalls writes when its compactions fall behind; an
// ingest on the same cores loses no throughput (the training's encoding is work it waits for
// either way). The bound is soft: it counts iids applied (an upsert that replaces a document
// counts too), concurrent writers that pass the check together all go on, and it holds from the
// end of the codebook's k-means, not from the training's start.
inline constexpr uint64_t kMaxTrainingLagDocuments = 8192;
// The longest a write waits for a lagging training before it goes on regardless: a waiting write
// holds a server worker (shared with searches) and the collection's write side, and the server's
// shutdown waits for it. A writer is slowed to one batch per this, far below any encoding rate.
inline constexpr absl::Duration kMaxTrainingStall = absl::Seconds(5);
// Catch-up rounds a training runs without holding the write path after its first pass over the
// shard's documents; the documents written meanwhile (about kMaxTrainingLagDocuments at most) are
// then encoded with writes held.
inline constexpr int kFreeCatchUpRounds = 4;

class Shard {
 public:
  // Opens (or creates) the shard in `dir`: the store in dir/db, the candidate index snapshot at
  // dir/candidates.snapshot. Keeps up to `resident_rerank_bytes` of rerank vectors in memory.
  // `pool` (not null) runs training and stage-1 scans. The shard logs through store_options.log,
  // as its store does: a training's start and end (vectors, centroids, generation, seconds), a
  // candidate index rebuilt, a failed index update.
  static absl::StatusOr<std::unique_ptr<Shard>> Open(const std::string& dir,
                                                     const CollectionSchema& schema,
                                                     const ShardStoreOptions& store_options,
                                                     int64_t resident_rerank_bytes,
                                                     std::shared_ptr<ThreadPool> pool);
  // Stops a background training (its partial work is discarded) and closes the store.
  ~Shard();

  // Opaque metadata in the store.
  absl::Status PutMeta(const std::string& key, const std::string& value);
  absl::StatusOr<std::string> GetMeta(const std::string& key) const;

  // N for k hits when a search leaves it at 0: stage 1's Stage1Index::DefaultNumDocuments for the
  // shard's rerank vectors.
  int DefaultNumCandidates(int k) const;

  // Checks, derives each upsert's stage-1 payload, then durably writes upserts and deletes, then
  // indexes them. Returns the store's result, or:
  // - INVALID_ARGUMENT naming the document when a check fails (rerank vectors of the wrong shape,
  //   or with a value that is not finite as stored: fp16 holds |x| ≤ 65504; a payload stage 1
  //   refuses, see Stage1Index::Derive); nothing is written;
  // - the store's error when the write fails (RESOURCE_EXHAUSTED "disk full: …", UNAVAILABLE for
  //   other I/O errors; see ShardStore::Write); nothing a reader sees is written;
  // - INTERNAL when the index failed after the durable write (see the class comment), and from
  //   then on for every call until the shard is reopened.
  absl::StatusOr<WriteResult> Apply(std::vector<ShardWrite> upserts,
                                    const std::vector<std::string>& deletes);

  // Stage 1: up to request.num_documents live documents matching the filter, best approximate
  // score first (ties: lower iid). Scans are split over the shard's pool. INTERNAL when the shard
  // is failed.
  absl::StatusOr<std::vector<Stage1Hit>> SearchCandidates(const Stage1Request& request) const;

  // The sparse lane: the best k live documents matching `filter` with a sparse score > 0 for
  // `query` (validated by the caller), scored with `statistics` (null: the shard's own), best
  // first (score desc, iid asc), each with its id, version and (want_attributes) attributes.
  // INVALID_ARGUMENT when the shard has no sparse field or SparseIndex::Search refuses.
  absl::StatusOr<std::vector<SparseLaneHit>> SearchSparse(const SparseVectorView& query, int64_t k,
                                                          const Filter& filter,
                                                          const SparseStatistics* statistics,
                                                          bool want_attributes) const;
  // N, Σ dl and df of each term over the shard's live documents (all 0 without a sparse field).
  SparseStatistics SparseStatisticsOf(absl::Span<const uint32_t> terms) const;

  // Calls fn(iid, document) for every live document matching `filter`, under a reader lock.
  void ForEachLive(const Filter& filter,
                   const std::function<void(uint64_t, const LiveDocument&)>& fn) const;
  // Per iid, in order, the live document's external id, version, attributes (want_attributes,
  // copied) and resident rerank vectors, read in one locked pass of the table; std::nullopt for an
  // iid no longer live.
  std::vector<std::optional<LiveEntry>> Describe(absl::Span<const uint64_t> iids,
                                                 bool want_attributes) const;
  // The rerank vectors of each iid, copied: resident ones from memory, the others read from the
  // store and checked against their checksums (Get, explain, training), decoded from the
  // centroid codes for documents stored without them (rerank_from_codes: the codes and codebook
  // of the stage 1 in use, which a retraining samples and re-encodes); null for an iid that is
  // no longer stored.
  absl::StatusOr<std::vector<std::shared_ptr<const StoredMatrix>>> FetchRerank(
      absl::Span<const uint64_t> iids) const;
  // The search's read, one per iid in order: the document as the table describes it (id,
  // version, attributes when want_attributes) and a view of its rerank vectors, from one locked
  // pass of the table, so that a hit is described as it was scored. Resident rows are viewed in
  // memory, the others in place in the store's mapped segments (ShardStore::ReadRerank: no copy,
  // no checksum pass); documents the table no longer holds are not read. A document stored as
  // codes only comes back as a view without rows (its codes are for FetchCodes); in a
  // rerank_from_codes shard with its codebook that is every live document, and nothing is read.
  // A document not live (or removed from the store since the table's pass) has a null `rerank`.
  absl::StatusOr<std::vector<RankingDocument>> FetchForRanking(absl::Span<const uint64_t> iids,
                                                               bool want_attributes) const;
  // The rerank vectors of documents stored as codes only (rerank_from_codes), decoded from their
  // stored codes (ReadStoredCodes), as FetchRerank decodes them; null for an iid no longer stored.
  // DATA_LOSS when the shard has no codebook, or naming the iid for malformed codes.
  absl::StatusOr<std::vector<std::shared_ptr<const StoredMatrix>>> DecodeCodes(
      absl::Span<const uint64_t> iids) const;

  // Documents stored as codes only (rerank_from_codes), read for ScoreCodes: immutable once read.
  struct CodedDocuments {
    size_t requested = 0;  // the iids asked for
    // The codebook that encoded them (the one in use when they were read: a retraining may swap
    // in another meanwhile, and these codes are scored with theirs).
    std::shared_ptr<const CentroidCodebook> codebook;
    // The documents found, viewed in place where the store keeps them (valid while `held` is),
    // and each one's position among the requested iids.
    std::vector<DocumentCodesView> documents;
    std::vector<size_t> positions;
    std::vector<std::shared_ptr<const absl::string_view>> held;
  };
  // Reads the codes of each iid from the store in place (ReadStoredCodes: ShardStore::ReadCodes
  // under the generation of the Stage1 in use), copying nothing; an iid no longer stored is left
  // out. DATA_LOSS when the shard has no codebook (only rerank_from_codes documents have no rows,
  // and only once it has one), or naming the iid and generation for stored codes that do not
  // parse (size ≠ 4 + n·(4 + code_bytes), a centroid id out of range); ABORTED when trainings
  // kept swapping generations during the read.
  absl::StatusOr<CodedDocuments> FetchCodes(absl::Span<const uint64_t> iids) const;
  // MaxSim of `query` (nq × dim fp32, validated by the caller) and each document FetchCodes
  // found, scored from the codes with ScoreStoredCodes (parts split over the pool):
  // within CompactQuery::ErrorBound() (Σ_i ⌈dim · nbits / 4⌉ · step_i / 2, see code_maxsim.h)
  // plus fp32 rounding of the fp32 MaxSim of the decoded vectors. One entry per requested iid,
  // std::nullopt for those not found. The query × centroid scores come from `stage1_scores` when
  // it is this query's table under the documents' codebook (stage 1 of the same search kept it:
  // Stage1Query::centroid_scores), else are computed here, on the pool, for the centroids the
  // documents use, ScoreUsedCentroids (a large grouped codebook keeps no table; an exhaustive
  // search runs no stage 1; a training may have swapped the codebook between the two stages).
  // stage1_scores may be null. INVALID_ARGUMENT when the table it would compute has more than 2^31
  // entries (C × nq padded: a query of over 8,192 tokens at 2^18 centroids), past the kernels'
  // int32 offsets.
  absl::StatusOr<std::vector<std::optional<float>>> ScoreCodes(
      FloatMatrixView query, const CodedDocuments& documents,
      const CentroidScoreTable* stage1_scores) const;
  // The query's score of every centroid of the codebook in use (ScoreEveryCentroid, on the pool),
  // for ScoreCodes over many batches of this shard's documents (an exhaustive search); empty when
  // the shard has no codebook, the query is not nq × dim, or the table would pass
  // kMaxKeptCentroidScores.
  CentroidScoreTable ScoreCentroids(FloatMatrixView query) const;
  // The live iid of an external id (NOT_FOUND when none), and its stored record.
  absl::StatusOr<uint64_t> LookupId(const std::string& external_id) const;
  absl::StatusOr<DocumentRecord> GetRecord(uint64_t iid) const;
  int64_t num_documents() const;

  ShardStats Stats() const;
  // Flushes the store's memtables, then saves stage 1 beside the store (Stage1Index::Save: the
  // candidate index with the iid it covers; nothing for the centroid index). INTERNAL when the
  // shard is failed.
  absl::Status Snapshot() const;
  // A consistent copy of the shard's database in `dir` (must not exist), as Open expects it,
  // with the candidate index's last snapshot when there is one (Open reconciles it with the copy,
  // or rebuilds). `sequence`, when not null, gets the RocksDB sequence number the copy holds.
  absl::Status Checkpoint(const std::string& dir, uint64_t* sequence = nullptr) const;

  // The codebook in use; null while stage 1 is the candidate index.
  std::shared_ptr<const CentroidCodebook> CodebookForTesting() const;
  // Blocks until no training runs (none may be starting either).
  void WaitForTrainingForTesting() const;
  // The generation of the centroid codes in use: the number of trainings committed in the
  // shard's life (stored, so it survives a reopen); 0 while stage 1 is the candidate index.
  uint32_t CentroidGenerationForTesting() const;
  // Called by a training after it has encoded the shard's documents, before it catches up with
  // the writes made meanwhile and swaps its index in (the test may write, delete and search).
  void SetTrainingHookForTesting(std::function<void()> hook);
  // Called once, by the next read of stored codes (FetchCodes, DecodeCodes, FetchRerank), after it
  // took the Stage1 in use and before it reads their codes (the test may retrain the shard, so
  // that a training swaps its generation in and drops the one being read: the retrain race).
  void SetCodeReadHookForTesting(std::function<void()> hook);
  // The next write's index update fails with `status` after its durable write (every step still
  // runs), as a FAISS error or a failed allocation would.
  void FailNextIndexUpdateForTesting(absl::Status status);

 private:
  // The stage-1 index in use, and what the store keeps of the centroid codes for stage 2
  // (rerank_from_codes) and the next training: the generation of the codes (0 with the candidate
  // index).
  struct Stage1 {
    std::shared_ptr<Stage1Index> index;
    uint32_t generation = 0;
    // The centroid index behind `index` (null with the candidate index): its codebook decodes and
    // scores the codes stored under `generation` (FetchCodes, DecodeCodes).
    std::shared_ptr<const CentroidIndex> centroids;

    static Stage1 Centroids(std::shared_ptr<CentroidIndex> index, uint32_t generation);
  };

  // What a training works on, for its log lines and the shard's statistics.
  struct TrainingRun {
    int64_t vectors = 0;
    int64_t centroids = 0;  // 0: there was nothing to train on, and no training started
    uint32_t generation = 0;
  };

  Shard(std::string dir, const CollectionSchema& schema, std::unique_ptr<ShardStore> store,
        int64_t resident_rerank_bytes, std::shared_ptr<ThreadPool> pool, LogSink log);

  // Recovery at Open (shard_recovery.cc).
  absl::Status LoadDocuments();
  // Reads the rerank vectors of live documents, in iid order, until the budget is spent.
  absl::Status LoadResidentRerank();
  // Opens the centroid index of the stored generation, or else the candidate index.
  absl::Status LoadStage1() ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  absl::Status LoadCentroids(uint32_t generation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  absl::Status LoadOrRebuildCandidates() ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  absl::Status RebuildCandidates() ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  // Adds the stored candidate vectors of the documents above `covered` to `index` and makes it
  // the shard's stage 1.
  absl::Status InstallCandidates(std::unique_ptr<CandidateIndex> index, uint64_t covered)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);

  // The write path and the reads (shard.cc).
  Stage1 CurrentStage1() const ABSL_LOCKS_EXCLUDED(state_mu_);
  // Waits, at most kMaxTrainingStall, while a training lags the writes by more than it allows (see
  // kMaxTrainingLagDocuments), or until the shard closes.
  void WaitForTrainingLag() ABSL_LOCKS_EXCLUDED(apply_mu_);
  // OK, or the INTERNAL error a failed shard answers with.
  absl::Status FailedStatus() const ABSL_LOCKS_EXCLUDED(state_mu_);
  // Applies one committed write to the stage-1 index (the upserts' payloads, which `index`
  // derived) and the table. Every step runs; the table always ends up matching the store. Returns
  // the first error of the index.
  absl::Status ApplyDerived(Stage1Index& index, std::vector<LiveDocument> documents,
                            const std::vector<Stage1Payload>& payloads, const WriteResult& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  // The stored codes of `iids` (rerank_from_codes) read in place, one view per iid (null: none),
  // and the Stage1 whose generation they were read under (see the retrain race in the class
  // comment: read again, at most kCodeReadRetries times, when a newer Stage1 is in use by the
  // time a live document's codes are found missing).
  struct StoredCodes {
    Stage1 stage1;
    std::vector<std::shared_ptr<const absl::string_view>> codes;
  };
  static constexpr int kCodeReadRetries = 8;
  absl::StatusOr<StoredCodes> ReadStoredCodes(absl::Span<const uint64_t> iids) const;
  // One document's stored codes checked against the codebook, in place; DATA_LOSS naming the
  // shard, iid and generation otherwise.
  absl::StatusOr<DocumentCodesView> ViewStoredCodes(const CentroidCodebook& codebook, uint64_t iid,
                                                    uint32_t generation,
                                                    absl::string_view bytes) const;
  // Replaces each matrix without rows (a document stored for rerank_from_codes) by the vectors
  // decoded from its codes, or by null when it was removed since.
  absl::Status DecodeRerankFromCodes(
      absl::Span<const uint64_t> iids,
      std::vector<std::shared_ptr<const StoredMatrix>>* matrices) const;

  // The training's lifecycle (shard_training.cc).
  // Whether the shard should (re)train now: past the first training threshold, or grown to
  // kRetrainGrowth × the vectors its codebook was trained on, or to a size that calls for more
  // centroids than its codebook has.
  bool OutgrewTraining() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  // Starts a background training when the shard has outgrown its stage 1.
  void MaybeStartTraining() ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  // The training thread's body: Train(), again while the shard has outgrown what it trained on,
  // then clears training_.
  void TrainingThread();
  // Train(), then its end in the log ("training finished", "training failed", "training
  // abandoned") and in the statistics.
  absl::Status TrainAndReport();
  // Logs "training started" once it knows the sizes, which it sets in *run.
  absl::Status Train(TrainingRun* run);
  // Records that the running training has encoded every live document up to `iid` and that
  // writes may run `allowed_lag` documents ahead of it (a write waiting in WaitForTrainingLag may
  // go on).
  void SetTrainingLag(uint64_t iid, uint64_t allowed_lag) ABSL_LOCKS_EXCLUDED(apply_mu_);
  // Encodes the given live documents (read from memory or the store) into `index`, and their
  // codes into `codes`; documents no longer stored are skipped.
  absl::Status EncodeDocuments(absl::Span<const uint64_t> iids, CentroidIndex* index,
                               std::vector<std::pair<uint64_t, std::string>>* codes) const;
  // Rerank from codes, once every document has codes under the codebook in use: drops every
  // document's rerank rows from the store (ShardStore::DropAllRerankRows) and from memory.
  absl::Status DropRerankRows() ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);

  const std::string dir_;
  const CollectionSchema schema_;
  const std::unique_ptr<ShardStore> store_;
  const std::shared_ptr<ThreadPool> pool_;
  const LogSink log_;

  // Held shared by Apply from encoding a write to its commit, and exclusively by a training's
  // swap, so that no write encoded for the old index commits after the swap.
  Mutex encode_mu_;
  // The highest commit_index a write has seen from the store (set under encode_mu_, shared).
  std::atomic<uint64_t> max_commit_seen_{0};

  // Serialises ApplyDerived in commit order, and snapshots against it.
  mutable Mutex apply_mu_;
  mutable CondVar applied_;  // signalled after each ApplyDerived and when a training ends
  uint64_t next_commit_ ABSL_GUARDED_BY(apply_mu_) = 1;
  // Set and cleared under apply_mu_; atomic so that Stats() reads it without waiting for a
  // training's catch-up, which holds apply_mu_.
  std::atomic<bool> training_{false};
  // Rerank vectors the current codebook was trained on (0: no codebook).
  int64_t trained_vectors_ ABSL_GUARDED_BY(apply_mu_) = 0;
  // The highest iid ApplyDerived has applied, and, while a training encodes documents into its
  // new index, the highest iid it has encoded (kNoTrainingLag otherwise) and how many documents
  // writes may run ahead of it: Apply waits on applied_ while the first passes the second by more
  // than the third (see kMaxTrainingLagDocuments).
  static constexpr uint64_t kNoTrainingLag = ~uint64_t{0};
  uint64_t last_applied_iid_ ABSL_GUARDED_BY(apply_mu_) = 0;
  uint64_t training_encoded_through_ ABSL_GUARDED_BY(apply_mu_) = kNoTrainingLag;
  uint64_t training_allowed_lag_ ABSL_GUARDED_BY(apply_mu_) = kMaxTrainingLagDocuments;
  std::function<void()> training_hook_ ABSL_GUARDED_BY(apply_mu_);
  absl::Status index_fault_ ABSL_GUARDED_BY(apply_mu_);  // FailNextIndexUpdateForTesting

  // The training's thread (shard_training.cc), and the shard's closing, which it watches.
  std::thread trainer_;
  std::atomic<bool> stopping_{false};
  // See ShardStats (written by the training thread, read by Stats()).
  std::atomic<int64_t> trainings_completed_{0};
  std::atomic<int64_t> trainings_failed_{0};
  std::atomic<double> last_training_seconds_{0};
  std::atomic<int64_t> last_training_end_{0};

  // What a search reads of the shard's derived state, each copied or replaced under it (a leaf
  // lock): the stage 1 in use (replaced at Open and by a training's swap), and the failure (set
  // once, when an index update after a durable write failed).
  mutable Mutex state_mu_;
  Stage1 stage1_ ABSL_GUARDED_BY(state_mu_);
  absl::Status failed_ ABSL_GUARDED_BY(state_mu_);
  // Taken (once) by a const read: SetCodeReadHookForTesting.
  mutable std::function<void()> code_read_hook_ ABSL_GUARDED_BY(state_mu_);

  // The live-document table (its own lock, the last in the order). Written only at Open and in
  // ApplyDerived and DropRerankRows (apply_mu_ held).
  LiveTable live_;
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COLLECTION_SHARD_H_
