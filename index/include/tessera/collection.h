// Collections: named sets of documents with one schema, stored in S RocksDB-backed shards in this
// process (document → shard by a stable hash of its id), searched with the two-stage cascade of
// DESIGN §2: FAISS candidates over coarse candidate vectors, then exact MaxSim over the pooled
// rerank vectors.
#ifndef TESSERA_COLLECTION_H_
#define TESSERA_COLLECTION_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tessera/document.h"
#include "tessera/fusion.h"
#include "tessera/matrix.h"
#include "tessera/pooling.h"
#include "tessera/sparse.h"

namespace tessera {

// How candidate vectors (the only vectors in FAISS) are derived from a document.
struct CandidateSpec {
  enum class Kind {
    // Ward pooling of the rerank vectors by `pool_factor` (coarser than the rerank vectors).
    kPooled,
    // One vector per document: the L2-normalised mean of its rerank vectors.
    kGlobalMean,
  };
  Kind kind = Kind::kPooled;
  int pool_factor = 4;
  // Stage 1 of each shard:
  //   "auto"      the exact scan of the candidate vectors while the shard holds fewer than
  //               centroid_min_vectors rerank vectors, the centroid index beyond (trained in the
  //               background when the shard passes the threshold; it stays once trained);
  //   "centroid"  the centroid index from the first document on (trained once the shard holds
  //               centroid_min_training_vectors rerank vectors, exact scan until then);
  //   otherwise   a FAISS index_factory string for the candidate vectors ("Flat", "HNSW32", …).
  std::string factory = "auto";
  // The centroid index (DESIGN §5): k-means centroids over the rerank vectors, each vector stored
  // as its centroid id and a residual code of residual_bits ∈ {2, 4} bits per dimension; 0: the
  // mode's default (EffectiveResidualBits): 4 with rerank_from_codes, where the codes are stage
  // 2's vectors (nDCG@10 −0.5% to +0.0% of exact fp16 at 4 bits on the four real sets, −0.9% to
  // +1.2% at 2; docs/results.md, "Rerank from codes"), and 2 otherwise, where they only rank
  // candidates for the exact rerank.
  int residual_bits = 0;
  // "auto" switches at the training threshold: on every real set measured, from 98k vectors
  // on, the centroid index found the exact top 10 as often as the candidate scan or more at
  // equal N, at 2.2–3.1× its speed (docs/notes/2026-12-05.md, "Stage 1 defaults from the
  // real sets"). Both thresholds are at least 256, the smallest codebook's centroids
  // (ValidateSchema); centroid_min_training_vectors 0 is the mode's default
  // (EffectiveMinTrainingVectors).
  int64_t centroid_min_vectors = 16'384;
  int64_t centroid_min_training_vectors = 0;
  // Stage 2 scores the vectors decoded from the centroid codes (centroid + residual, PLAID's
  // approach) instead of stored rerank vectors: documents written once a shard has its codebook
  // store no rerank vectors (about 8× less disk at residual_bits 4, 16× at 2). Such documents are
  // scored from their codes without decoding them (compact MaxSim: per-query lookup tables
  // quantised to 8 bits), so a score is within CompactQuery::ErrorBound (code_maxsim.h: Σ over
  // query tokens of ⌈dim · residual_bits / 4⌉ · step / 2, step = the token's largest table range
  // / 255) of the MaxSim of the decoded vectors; explain and Get return the decoded vectors.
  // Needs factory "auto" or "centroid" and then behaves as "centroid" (a shard trains once it
  // holds EffectiveMinTrainingVectors vectors, 65,536 by default; the documents written before
  // are encoded by that training, which then drops their rerank and candidate vectors: no
  // fp16/fp32 copy remains). Stage 1 scans the codes' 2-bit coarsening in the centroid index's
  // lists; stage 2 reads each candidate's codes in place from the shard's codes segments. Such a
  // shard retrains as the others do, from the vectors its codes decode to, and re-encodes every
  // document from them.
  bool rerank_from_codes = false;
};

// The residual bits of a CandidateSpec: residual_bits, or the mode's default when it is 0.
inline int EffectiveResidualBits(const CandidateSpec& spec) {
  if (spec.residual_bits != 0) return spec.residual_bits;
  return spec.rerank_from_codes ? 4 : 2;
}

// The first training's threshold of a CandidateSpec: centroid_min_training_vectors, or the mode's
// default when it is 0: 16,384 vectors, and 65,536 with rerank_from_codes. A compact shard
// retrains from its decoded codes (no vectors remain), so each retraining quantises the
// documents it re-encodes once more; starting at 4× the vectors saves one such pass (the
// retraining follows at every 4× growth). On the real sets that took 4-bit nDCG@10 from 99.0% to
// 99.6% of exact fp16 on cranfield and from 99.4% to 99.9% on scifact (docs/results.md, "Rerank
// from codes"); until the first training a compact shard stores fp16 vectors (~16 MiB at dim 128).
inline int64_t EffectiveMinTrainingVectors(const CandidateSpec& spec) {
  if (spec.centroid_min_training_vectors != 0) return spec.centroid_min_training_vectors;
  return spec.rerank_from_codes ? 65'536 : 16'384;
}

// The most shards a collection may have.
inline constexpr int kMaxShards = 256;

struct CollectionSchema {
  std::string name;                           // [A-Za-z0-9_.-]{1,128}
  int64_t dim = 0;                            // 1 … 4096
  VectorDtype dtype = VectorDtype::kFloat16;  // rerank vector storage
  // Rerank vectors. Default: hierarchical Ward pooling with factor 2, merges up to
  // kAdaptiveMergeHeight.
  PoolingSpec pooling = DefaultPooling();
  CandidateSpec candidates;
  // Attribute fields documents may carry and filters may use.
  std::map<std::string, AttributeType> attributes;
  int num_shards = 1;  // 1 … kMaxShards
  // The sparse field (hybrid retrieval): when set, documents may carry a sparse vector
  // (Document::sparse), indexed per shard in inverted lists, and searches may give a sparse query
  // (SearchOptions::sparse_query), scored as SparseScoring says (BM25 with the IDF modifier, else
  // the dot product).
  std::optional<SparseScoring> sparse;

  static PoolingSpec DefaultPooling() {
    PoolingSpec spec;
    spec.hierarchical = TokenPoolingOptions{};
    spec.hierarchical->max_merge_height = DefaultMaxMergeHeight(spec.hierarchical->method);
    return spec;
  }
};

// INVALID_ARGUMENT naming the first field out of range.
absl::Status ValidateSchema(const CollectionSchema& schema);

// The shard a document id belongs to (num_shards ≥ 1): FNV-1a 64 of its bytes, modulo the shard
// count. Stable across processes and versions: it decides where data lives on disk, and a
// router's shard nodes split a collection as a local collection's shards do.
int ShardOf(absl::string_view id, int num_shards);

// Limits on what one request may carry; enforced with INVALID_ARGUMENT.
struct CollectionLimits {
  int64_t max_tokens_per_document = kMaxHierarchicalPoolingTokens;
  int64_t max_id_bytes = 1024;
  int max_k = 1000;
  int max_num_candidates = 10000;
  int max_query_tokens = 1024;
  int max_group_size = 100;      // SearchOptions::group_size
  int max_scroll_limit = 10000;  // ScrollOptions::limit
};

// How a search with both a query matrix and a sparse query fuses its two lanes' answers
// (tessera/fusion.h).
enum class FusionMethod {
  kRrf,    // reciprocal rank fusion: Σ weight / (rrf_k + rank)
  kScore,  // min-max normalised scores, weighted and summed
};

// The sparse and hybrid parts of a search (SearchOptions::hybrid).
//
// A search gives a query matrix (the dense lane: the MaxSim cascade), a sparse query (the sparse
// lane: the best documents by SparseScoring over the shards' inverted lists, Block-Max MaxScore),
// or both. Both lanes apply the search's filter. The lane depth L is `candidates` (0: the hits
// asked for, k or groups × group_size). Sparse only: the sparse lane's best k, scored by it.
// Both: each lane's best L over the whole collection, fused (`fusion`, `dense_weight`,
// `sparse_weight`, `rrf_k`) into one ranking of at most 2L documents, whose best k are the answer
// with the fused score as their score — or, with `rerank`, the fused ranking's best L reordered by
// exact MaxSim (score desc, id asc), whose best k are the answer with their MaxSim as score (the
// lanes choose the candidates, MaxSim orders them). Grouped (group_by) sparse or hybrid searches
// group the final ranking's best L (fused, or reranked) as SearchOptions::group_by says. Each hit
// carries the lane scores it has (SearchHit::dense_score, sparse_score).
//
// With the IDF modifier, the statistics (N, avgdl, df) are the whole collection's: a collection
// sums its shards' (SparseStatistics::Merge, in shard order); a part of a collection
// (SearchOptions::whole_shards) uses `statistics`, which a router gathers from every shard
// (Collection::SparseStatisticsOf) before it searches.
struct HybridOptions {
  std::optional<SparseVector> sparse_query;  // indices unique, any order; weights finite, ≥ 0
  FusionMethod fusion = FusionMethod::kRrf;
  double dense_weight = 1.0;   // finite, ≥ 0
  double sparse_weight = 1.0;  // finite, ≥ 0
  double rrf_k = kDefaultRrfK;
  int64_t candidates = 0;  // L: 0 … CollectionLimits::max_num_candidates, 0 = the hits asked for
  bool rerank = false;     // needs a query matrix
  // The collection's statistics for the sparse query's terms, for a part of a collection; null:
  // this collection's own.
  std::optional<SparseStatistics> statistics;
};

struct SearchOptions {
  // 1 … CollectionLimits::max_k. 64-bit so that any value a caller holds (a uint32 off the wire)
  // reaches the collection's check, and its message, unchanged.
  int64_t k = 10;
  // N: documents scored exactly after stage 1, k … CollectionLimits::max_num_candidates, split
  // over the S shards: each reranks the ⌈N / S⌉ best of its documents by its own stage-1 scores
  // (its stage 1 ranks by its own codebook; a cut over all shards' estimates would favour a
  // shard whose estimates run high), or all of them when they are no more. 0 = the default,
  // per shard: max(10·k, 100) while it scans its candidate vectors exactly; on the centroid
  // index, max(c·k, 10·c) with c from 10 (up to 262,144 vectors) to 40 (from ~4.2M vectors)
  // (DefaultNumCandidates in index/centroid/centroid_index.h); capped at
  // CollectionLimits::max_num_candidates. When N, k′ and nprobe are all left at 0, a shard that
  // holds at most twice its share of the default N (200 documents for k = 10 on one shard) is
  // scored exhaustively instead: there that costs about what the cascade does, and the answer is
  // exact (kExhaustiveDefaultShareMultiple in index/collection/collection_impl.h).
  int64_t num_candidates = 0;
  // k′: candidate vectors fetched per query token by the candidate-vector scan (a shard's stage 1
  // while it has no centroid index, which probes `nprobe` centroids instead), 0 … 100000. 0 = the
  // default, max(N, 64). 64-bit for the same reason as k.
  int64_t per_token_candidates = 0;
  // Centroid index: centroids probed per query token, 0 … 16384. 0 = the default: √C / 5 of a
  // shard's C centroids, rounded up to a multiple of 8, at least 16 (40 at 1M documents).
  int64_t nprobe = 0;
  Filter filter;
  // Skip stage 1 and score every (matching) document exactly.
  bool exhaustive = false;
  // Per hit and query token: the best document vector, its similarity and the original tokens (or
  // patches) it covers.
  bool explain = false;
  // Give up with DEADLINE_EXCEEDED once this time has passed (checked between stages and chunks);
  // the default never expires.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // A search of one part of a collection split by ShardOf over several (a router's shard node
  // holds one shard of `whole_shards`): each shard's share of N is then ⌈N / whole_shards⌉
  // instead of ⌈N / num_shards⌉, so that the parts' answers merge (tessera/merge.h) into the
  // whole collection's. 0: this collection is the whole; else num_shards … kMaxShards.
  int64_t whole_shards = 0;
  // Return each hit's attributes (SearchHit::attributes), read from the shard's table of live
  // documents together with the hit's id and version (no read per hit). attribute_fields: only
  // these fields (each a schema field); empty: all of them.
  bool with_attributes = false;
  std::vector<std::string> attribute_fields;
  // Grouped results (Qdrant's query_groups): when group_by names an attribute field, the answer is
  // SearchResult::groups — the best `groups` groups of documents with equal values of the field,
  // ranked by their best hit, each with its best `group_size` hits (score desc, id asc; groups tied
  // on their best score by that hit's id asc). Documents without the field are in no group. Exact
  // under the cascade: every document stage 2 scores is scored exactly (its exact MaxSim decides
  // its group's rank), but only the documents stage 1 nominates are scored — the N of
  // num_candidates, sized here for groups × group_size hits — so a group sees only its members
  // among them; exhaustive (or a collection no bigger than N) sees every member. groups: 1 …
  // CollectionLimits::max_k, 0 = k; group_size: 1 … CollectionLimits::max_group_size. With
  // whole_shards set (a part of a collection), every group among the scored documents comes back,
  // so that the parts merge exactly (tessera/merge.h: MergeGroups).
  std::string group_by;
  int64_t group_size = 1;
  int64_t groups = 0;
  // Sparse and hybrid retrieval (see HybridOptions). A search with a sparse query may give an
  // empty query matrix (0 rows): sparse only.
  HybridOptions hybrid;
};

struct TokenMatch {
  int32_t query_token = 0;
  int32_t document_vector = 0;
  float similarity = 0.0f;
  std::vector<int32_t> covered_tokens;
};

struct SearchHit {
  std::string id;
  float score = 0.0f;  // exact MaxSim over the stored rerank vectors
  uint64_t version = 0;
  std::vector<TokenMatch> explanation;  // when asked; one entry per query token
  Attributes attributes;                // SearchOptions::with_attributes
  // A sparse or hybrid search: the hit's MaxSim (when known: it was in the dense lane, or the
  // fused candidates were reranked) and its sparse score (when it was in the sparse lane).
  std::optional<float> dense_score;
  std::optional<float> sparse_score;
};

// One group of a grouped search (SearchOptions::group_by).
struct SearchGroup {
  AttributeValue value;         // the group_by field's value its documents share
  std::vector<SearchHit> hits;  // best first
};

struct SearchTimings {
  double candidates_ms = 0;
  double fetch_ms = 0;
  double rerank_ms = 0;
  double total_ms = 0;
};

struct SearchResult {
  // Best first; equal scores ordered by ascending id. Empty for a grouped search.
  std::vector<SearchHit> hits;
  // A grouped search's groups, best first (SearchOptions::group_by).
  std::vector<SearchGroup> groups;
  SearchTimings timings;
  int64_t documents_scored = 0;  // exact MaxSim evaluations
  // Stage 1 was skipped: asked, N ≥ the collection's size, or every shard small enough for the
  // exhaustive default.
  bool exhaustive = false;
  int64_t num_candidates = 0;  // N as resolved from SearchOptions and the collection's stage 1
  int64_t documents = 0;       // documents in the collection when the search began
  // A sparse or hybrid search of a part of a collection (SearchOptions::whole_shards): the lanes'
  // best L, unfused (tessera/merge.h: MergeLanes, then FuseLanes), in place of hits and groups.
  // dense_lane: score = MaxSim; sparse_lane: score = the sparse score, dense_score = MaxSim when
  // the search reranks.
  bool lanes = false;
  std::vector<SearchHit> dense_lane;
  std::vector<SearchHit> sparse_lane;
};

// A stored document as Get returns it.
struct StoredDocument {
  std::string id;
  uint64_t version = 0;
  int64_t num_tokens = 0;  // as sent, before pooling
  std::optional<PatchGridLayout> layout;
  Attributes attributes;
  VectorDtype dtype = VectorDtype::kFloat16;  // how the rerank vectors are stored
  int64_t dim = 0;
  // The rerank vectors, decoded to fp32: num_vectors × dim. Empty when Get was asked for
  // GetOptions::stored_bytes.
  std::vector<float> vectors;
  // Only with GetOptions::stored_bytes: the rerank vectors as stored, num_vectors × dim values of
  // `dtype`, row-major, little-endian IEEE 754 binary16 (2 bytes each) or binary32 (4 bytes each)
  // — the packing of tessera.v1.Matrix data.
  std::string vector_bytes;
  // Vector v covers original tokens members[member_offsets[v] .. member_offsets[v + 1]).
  std::vector<int32_t> member_offsets;
  std::vector<int32_t> members;
  std::optional<SparseVector> sparse;  // as stored: indices increasing

  int64_t num_vectors() const {
    if (dim == 0) return 0;
    if (!vectors.empty() || vector_bytes.empty()) return static_cast<int64_t>(vectors.size()) / dim;
    const int64_t row_bytes = dim * (dtype == VectorDtype::kFloat16 ? 2 : 4);
    return static_cast<int64_t>(vector_bytes.size()) / row_bytes;
  }
};

struct GetOptions {
  // Return the rerank vectors in their stored bytes (StoredDocument::vector_bytes) instead of
  // decoded to fp32 (StoredDocument::vectors): for a caller that passes them on as they are, as
  // the server does onto the wire, with no fp16 → fp32 → fp16 round trip.
  bool stored_bytes = false;
};

// One page of Collection::Scroll.
struct ScrollOptions {
  Filter filter;
  // Documents with ids strictly greater than this (bytewise); empty: from the first.
  std::string after;
  int64_t limit = 100;  // 1 … CollectionLimits::max_scroll_limit
  // Attributes of each document (all, or attribute_fields), as SearchOptions::with_attributes.
  bool with_attributes = false;
  std::vector<std::string> attribute_fields;
};

struct ScrolledDocument {
  std::string id;
  uint64_t version = 0;
  Attributes attributes;  // when asked
};

struct ScrollPage {
  std::vector<ScrolledDocument> documents;  // ascending id
  // The `after` of the next page; empty when this page reached the end.
  std::string next_after;
};

struct UpsertOutcome {
  absl::Status status;   // per document; a bad document does not fail the others
  uint64_t version = 0;  // when OK
  int64_t num_vectors = 0;
};

// Segment files: the stored fp16 rerank rows, and (for rerank_from_codes) the centroid codes of
// every generation, moved out of RocksDB into append-once files once a shard's unflushed values
// pass the store's flush threshold (64 MiB) and on Snapshot (the Flush RPC). One shard's store
// reports them; a collection's are its shards' added up (+=).
struct SegmentFigures {
  int64_t rerank_segments = 0;         // rerank segment files
  int64_t rerank_segment_bytes = 0;    // bytes those files occupy (their sizes)
  int64_t rerank_unflushed_bytes = 0;  // bytes of rerank rows in RocksDB until the next flush
  int64_t code_segments = 0;           // codes segment files
  int64_t code_segment_bytes = 0;      // bytes those files occupy (their sizes)
  int64_t code_unflushed_bytes = 0;    // bytes of codes in RocksDB until the next flush

  SegmentFigures& operator+=(const SegmentFigures& other) {
    rerank_segments += other.rerank_segments;
    rerank_segment_bytes += other.rerank_segment_bytes;
    rerank_unflushed_bytes += other.rerank_unflushed_bytes;
    code_segments += other.code_segments;
    code_segment_bytes += other.code_segment_bytes;
    code_unflushed_bytes += other.code_unflushed_bytes;
    return *this;
  }
};

struct CollectionStats {
  int64_t documents = 0;
  int64_t original_tokens = 0;
  int64_t rerank_vectors = 0;
  int64_t candidate_vectors = 0;
  // What the collection's directory occupies on disk: the allocated blocks (st_blocks × 512) of
  // its files (RocksDB's SST files, write-ahead logs with their preallocated space, MANIFEST,
  // OPTIONS, info logs; candidate index snapshots; the schema file), as `du` counts them.
  int64_t disk_bytes = 0;
  double vectors_per_document = 0;
  double disk_bytes_per_original_token = 0;
  double disk_bytes_per_rerank_vector = 0;
  // Per shard, its stage 1: a FAISS index ("IDMap2,Flat" for the exact scan) or the centroid
  // index ("Centroid16384,Residual2bit").
  std::vector<std::string> candidate_indexes;
  int64_t resident_bytes = 0;  // rerank vectors held in memory (EngineOptions)
  // Memory held by the candidate structures (candidate vectors, or centroids + codes + lists).
  int64_t candidate_bytes = 0;
  // Shards training a centroid index in the background right now (searches and writes go on
  // against their current stage 1 meanwhile).
  int training_shards = 0;
  // Trainings of its shards since the collection opened: finished, and failed (a failed training
  // leaves stage 1 as it was).
  int64_t trainings_completed = 0;
  int64_t trainings_failed = 0;
  // How long the shards' most recent training (finished or failed) ran; 0 before the first.
  double last_training_seconds = 0;
  // The shards' segment files (see SegmentFigures), included in disk_bytes.
  SegmentFigures segments;
};

// Thread-safe: upserts, deletes, gets and searches may run concurrently; a write is visible to
// every search that starts after it is acknowledged.
class Collection {
 public:
  virtual ~Collection() = default;

  virtual const CollectionSchema& schema() const = 0;

  // Validates, pools, stores (one durable WriteBatch per shard) and indexes the documents. Returns
  // one outcome per document, in order. An id that appears twice in one call: the last one wins.
  // A document is refused (INVALID_ARGUMENT) with a token value that is not finite or exceeds
  // kMaxVectorValue in magnitude, or a double attribute that is not finite.
  virtual std::vector<UpsertOutcome> Upsert(std::vector<Document> documents) = 0;
  // Deletes by id; returns per id whether it existed. INVALID_ARGUMENT naming ids[i] for an id
  // that Upsert would refuse (empty, over CollectionLimits::max_id_bytes, not UTF-8): nothing is
  // deleted then.
  virtual absl::StatusOr<std::vector<bool>> Delete(const std::vector<std::string>& ids) = 0;
  // Deletes every document matching `filter` (ValidateFilter: INVALID_ARGUMENT), acknowledged as
  // Delete is: durably written when it returns, in one WriteBatch per shard. Returns how many it
  // deleted. Each shard takes its matching ids, then deletes them by id: a document whose upsert
  // runs concurrently (not acknowledged before this call began) may be deleted although its new
  // version does not match. An empty filter is refused (INVALID_ARGUMENT): deleting everything is
  // dropping the collection.
  virtual absl::StatusOr<int64_t> DeleteMatching(const Filter& filter) = 0;
  // The number of live documents matching `filter` (empty: all). INVALID_ARGUMENT for a bad one.
  virtual absl::StatusOr<int64_t> Count(const Filter& filter) const = 0;
  // The live documents matching options.filter with ids after options.after, ascending by id, at
  // most options.limit. INVALID_ARGUMENT for a bad filter, limit or attribute field. A document
  // written after a page was taken shows up in a later page when its id comes after that page's.
  virtual absl::StatusOr<ScrollPage> Scroll(const ScrollOptions& options) const = 0;
  // NOT_FOUND for an unknown id, INVALID_ARGUMENT for one that Upsert would refuse. The rerank
  // vectors come decoded to fp32 unless options.stored_bytes asks for them as stored.
  virtual absl::StatusOr<StoredDocument> Get(const std::string& id,
                                             const GetOptions& options) const = 0;
  absl::StatusOr<StoredDocument> Get(const std::string& id) const { return Get(id, GetOptions{}); }
  // query: nq × dim fp32, values finite and within ±kMaxVectorValue. INVALID_ARGUMENT for a bad
  // query or options.
  virtual absl::StatusOr<SearchResult> Search(FloatMatrixView query,
                                              const SearchOptions& options) const = 0;
  virtual CollectionStats Stats() const = 0;
  // The statistics a sparse query over `terms` is scored with (SparseStatistics::Merge over the
  // shards, in shard order): what a router sums over its shard nodes. N = 0 without a sparse
  // field.
  virtual SparseStatistics SparseStatisticsOf(absl::Span<const uint32_t> terms) const = 0;
  // Flushes RocksDB's memtables to SST files (the WAL they covered becomes obsolete, so disk
  // statistics show the steady state) and writes the candidate index snapshots so the next open
  // need not replay.
  virtual absl::Status Snapshot() = 0;
};

}  // namespace tessera

#endif  // TESSERA_COLLECTION_H_
