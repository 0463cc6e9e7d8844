// The centroid index: stage 1 for large shards (DESIGN §5), after PLAID and WARP.
//
// Every indexed vector lives in the inverted list of its centroid as (document ordinal, residual
// code: the 1-bit coarsening of the codec's code, kScanNbits). A search scores the query tokens
// against the centroids with the MaxSim micro-kernels (all of them, or for a large codebook those
// of each token's nearest groups: ProbedGroups), probes the `nprobe` best centroids of each token,
// and scores the codes in those lists without decoding them: ⟨q, centroid + residual⟩ = ⟨q,
// centroid⟩ + Σ_n lut_q[n][code nibble n] (the scan codec's per-query lookup tables, quantised to
// bytes and applied to 32 codes at a time by code_scan.h; the quantisation errs by at most step/2
// per nibble). Each token has a *missing estimate*: the score of its last (nprobe-th) probed
// centroid — the most a vector of an unprobed list could score, give or take its residual and, with
// groups, a centroid of an unscored group that outscores it (WARP's imputation). Per (token,
// document) the token contributes the missing estimate plus its *margin*: how far its best vector
// of the document scores above the estimate (0 when none does), rounded to the nearest multiple of
// the query's margin unit, and one unit when it is positive but less (MarginLevelCap); a
// document's approximate MaxSim sums the contributions over the tokens. The top documents by that
// sum — among those with at least one vector above its token's estimate — go to the exact rerank.
//
// A search runs in three parallel passes: per query token, the selection of its probes and its
// tables (which together set the query's margin unit); per query token, the code scan, which
// gives each entry of its probed lists its margin in units (a byte); then per tile of document
// ordinals (a list's ordinals ascend, so a tile is one run of each list; a thread's share of the
// ordinals, up to 524,288), the per-document accumulation in a dense scratch (a byte of margin and
// 16 bits of sum per document; a branch-free byte maximum per entry; per token a fold over the
// tile, or over the token's own entries when they are few: kSparseFoldRatio) and a bounded heap of
// the tile's best. At 1M documents stage 1 then reads ~70 MB of codes, ordinals and margins per
// query, and is bound by that memory traffic on the 2-core machine (docs/notes/2026-12-04.md).
//
// Documents are removed by tombstones; the lists are compacted (and ordinals renumbered) once the
// dead vectors pass kCompactionFraction of all vectors.
//
// The lists hold the 1-bit coarsening of each code (ResidualCodec::Coarsened: the top bit of each
// dimension's bucket, a split at the training sample's median), whatever the codec's width:
// stage 1 streams dim / 8 bytes a vector (16 at dim 128), and the approximate scores above are
// those of the coarse codec. Its job is to find candidates for an exact or compact rerank, and
// that needs no more (kScanNbits). The codec's own codes (2 or 4 bits) serve training and stage 2
// from codes (rerank_from_codes), which reads each document's codes from the shard's store, not
// from this index (Shard::FetchCodes: ShardStore::ReadCodes, in place in the codes segments). Why
// stage 2 does not gather codes from the lists: a vector's code lies there byte-transposed, one
// byte per 32-byte row of its block (and coarsened), so gathering it touches code_bytes / 2 cache
// lines; measured (BM_GatherCompact, since removed from bench/code_maxsim_benchmark.cc; AMD EPYC
// Zen 4, shared) a gather from the lists through a per-document directory (8 bytes per vector)
// ran at 45k documents of 64 vectors per CPU second at 4 bits, 3.7× the time of scoring them,
// while a document's row-major codes as stored are laid out with one transpose of contiguous bytes
// (~2.6M documents/s, BM_CompactLayout). Memory per vector at dim 128: the list entry's 20 bytes
// (4 of ordinal, 16 of 1-bit code) and the document tables' share; the codes stage 2 reads (68
// bytes at 4 bits) stay in the store's files (page cache, not the process's memory).
//
// Thread-safe: searches run concurrently with each other under a shared lock; Add and Remove take
// it exclusively. The codebook is immutable and shared.
#ifndef TESSERA_INDEX_CENTROID_CENTROID_INDEX_H_
#define TESSERA_INDEX_CENTROID_CENTROID_INDEX_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "index/centroid/centroid_codebook.h"
#include "index/centroid/code_scan.h"
#include "index/centroid/document_codes.h"
#include "tessera/base/mutex.h"
#include "tessera/matrix.h"

namespace tessera::internal {

class ThreadPool;
class QuerySimilarity;

// One document's encoded vectors: its centroid ids and residual codes, as stored.
struct DocumentCodes {
  std::vector<uint32_t> centroids;  // n
  std::string codes;                // n × code_bytes
  int64_t size() const { return static_cast<int64_t>(centroids.size()); }
};

// Byte form of DocumentCodes (the store adds its own envelope and checksum):
//   u32 n | n × u32 centroid id | n × code_bytes code bytes.
std::string SerializeDocumentCodes(const DocumentCodes& codes);
// DATA_LOSS when the bytes do not hold n codes of code_bytes each, or a centroid id is
// ≥ num_centroids (the message says which and what was expected).
absl::StatusOr<DocumentCodes> ParseDocumentCodes(absl::string_view bytes, int64_t code_bytes,
                                                 int64_t num_centroids);

// The same bytes read in place (checked as ParseDocumentCodes checks them): the ids start at byte
// 4, the codes (size × code_bytes, row-major) after them. Valid while the bytes are.
absl::StatusOr<DocumentCodesView> ViewDocumentCodes(absl::string_view bytes, int64_t code_bytes,
                                                    int64_t num_centroids);

// Centroids probed per query token when a search leaves nprobe at 0: √C / 5 rounded up to a
// multiple of 8, at least 16 — 16 at 4,096 centroids, 24 at 8,192, 32 at 16,384, 40 at 32,768
// (1M documents). With C growing as √vectors, a token then scans a share of the shard that
// shrinks as it grows (vectors^-1/4). Measured against exhaustive on the synthetic /
// real-embedding 1M shards (docs/notes/2026-12-05.md): recall@10 0.972 / 0.978 at 40, with stage 1
// 1.2–1.5 ms (12–15%) faster than at 48 (1.000 / 0.988, P50 at the 15 ms target's edge); 64 found
// 1.000 / 0.996 for a third more stage-1 time and 32 only 0.87 / 0.965 (the synthetic corpus
// splits each topic's isotropic noise over ~32 near-equal centroids); 32 at 16,384 found
// 0.973 / 0.988. Under the list-length codebook rule (CentroidSizing::kListLength, not the
// default) it stops at kMaxDefaultNprobe (from 16,384 centroids on), as WARP's fixed nprobe of 32:
// the lists no longer grow with the shard, so neither do a token's scanned codes (~4,000–8,000).
// Too few on the synthetic 100k-document shard: recall@10 0.758 at 32 and 0.959 at 48, against
// 0.971 for the √ rule's 16,384 centroids at 32 (docs/notes/2026-12-06-codebook-rules.md).
inline constexpr int kMaxDefaultNprobe = 32;
// Bits per dimension of the codes stage 1 scans (CentroidIndex's default scan_nbits): 1, the top
// bit of each dimension's bucket, whatever the codec's width. Stage 1 only has to put the true
// top k among the N documents the rerank scores, and half the bytes of 2-bit lists is half its
// memory traffic. Measured on the resampled shards (Intel Xeon, AVX-512; docs/results.md, "Stage
// 1 on 1-bit codes"): at 100k documents recall@10 0.994 at N = 400 with 1-bit lists and with
// 2-bit ones, stage 1 2.12 against 2.80 ms at P50; at 1M 0.961 against 0.970 at N = 400 (0.968 at
// 500, 0.974 at 600: DefaultNumCandidates grows from 2^25 vectors on), stage 1 10.6–10.9 against
// 13.2–14.7 ms; on the four real sets the same nDCG@10 as 2 bits.
inline constexpr int kScanNbits = 1;
int DefaultNprobe(int64_t num_centroids);

// Stage 1 folds a token's per-document margins into the documents' sums by a second pass over
// the token's own entries when a tile of ordinals has more than kSparseFoldRatio of them per
// entry, and by a vectorised pass over the whole tile otherwise. An entry of the second pass is a
// scattered read-modify-write, an ordinal of the dense pass a few streamed bytes: on the
// 1M-document shard of the √ codebook rule (a token's entries ~4–8% of a tile's ordinals) the
// scattered pass for every token measured slower than the dense one (stage 1 9.8–9.9 against
// 8.9–9.2 ms with float margins and sums; docs/notes/2026-12-04.md), while a codebook that grows
// with the shard (short lists) leaves a token ~1% of them. Both give the same sums, bit for bit.
inline constexpr int64_t kSparseFoldRatio = 32;

// Stage 1 keeps a document's margin for the current token in a byte and its sum over the tokens in
// 16 bits, counted in the query's *margin unit*: the highest margin any of its tokens could reach
// (the token's best probed centroid's score plus the most its residual tables add, less its
// estimate) over MarginLevelCap(query tokens). No margin exceeds the cap, and each is rounded to
// the nearest unit, a positive one under half a unit to one (a document some token found above
// its estimate stays a candidate): a margin is off by at most half a unit, or less than one when it
// counts one unit for less than half (a unit is ~1/255 of a token's score range, ~17 of the
// largest table step at dim 128).
// The scan writes each entry's margin as a byte, and the tiles' scatter is a byte maximum into a
// scratch of 3 bytes a document instead of float margins and sums (8 bytes, 2 MiB of margins a
// thread at 1M documents, past a core's L2) and a fold of 16 bytes a document per token. Measured
// (docs/results.md, "Stage 1 in bytes"; Intel Xeon, Ice Lake, alternated with the float binary):
// at 1M documents stage 1 at P50 0.62–0.85×, the query 0.66–0.89×; at 100k the same time
// (0.94–1.03×); recall@10 0.972 and 0.991 against 0.972 and 0.992. The cap: 255 (a byte), or
// 65,535 / tokens when that is less, so that the 16-bit sums never overflow (queries of more than
// 257 tokens, whose unit is then coarser). A search takes at most kMaxCentroidQueryTokens tokens,
// a unit each.
int MarginLevelCap(int64_t query_tokens);
inline constexpr int64_t kMaxCentroidQueryTokens = 65535;

// Documents a shard sends to the exact rerank for k hits when a search leaves N at 0, with a
// centroid index of `vectors` vectors: max(c·k, 10·c) with c = 10·√(vectors / 2^18) clamped to
// [10, 40], times max(1, √(vectors / 2^25)) — max(10·k, 100), the exact candidate scan's rule, up
// to 262,144 vectors, 20 per hit at ~1M vectors, 40 from ~4.2M (65,536 documents of 64 vectors) to
// 2^25 (~520k documents), then growing with √vectors again (~55 per hit at 1M documents, ~96 at
// 3M). The approximate scores rank coarser the more documents sit near the top 10: measured top-10
// agreement with exhaustive (docs/notes/2026-12-05.md) at N = 100 was ≥ 0.993 on the real sets of
// 98k–622k vectors, while the 2.56M-vector (40k-document) shard needed ~300 and the 6.4M ones 400
// for recall@10 ≥ 0.97. With 2-bit lists 400 still gave 0.962 (compact) and 0.9765 (exact) at 64M
// vectors, but 0.938 at 192M (3M documents, compact; 800 gave 0.972), where the √ codebook rule's
// lists are longer; the 1-bit lists (kScanNbits) at 64M gave 0.961 at 400, 0.968 at 500 and 0.974
// at 600, hence the growth from 2^25 on instead of 2^26.
int DefaultNumCandidates(int64_t k, int64_t vectors);

// Groups of centroids (CentroidGroups, ~64 centroids each) whose members a query token scores
// when the codebook has groups (beyond CentroidCodebook::kExactAssignmentCentroids centroids):
// those whose means score highest, nprobe / 2 of them and at least 8 — 20 of 512 (1,280
// centroids of 32,768) at the 1M-document default. Its nprobe best centroids are then almost
// always the exact ones: on the 1M-document shards recall@10 was the same as when every centroid
// was scored, and stage 1 ~1 ms (8%) faster (docs/notes/2026-12-05.md).
int ProbedGroups(int nprobe);

// A query's score of every centroid of a codebook, token-major: query row i's score of centroid c
// at scores[i · num_centroids + c] (the values QuerySimilarity computes). What a centroid search
// scored for its probes, kept for the stage 2 from codes (Shard::ScoreCodes) when asked for.
struct CentroidScoreTable {
  std::shared_ptr<const CentroidCodebook> codebook;  // whose centroids; null: no table
  int64_t nq = 0;
  std::unique_ptr<float[]> scores;  // nq × codebook->num_centroids()
};

// The table of `queries` (nq × codebook->dim() fp32) against every centroid of `codebook`,
// centroids split over `pool` (null: the calling thread). The search computes its probes' scores
// with it when asked for its table; the exhaustive search from codes once per shard, instead of
// once per batch of documents it scores.
CentroidScoreTable ScoreEveryCentroid(std::shared_ptr<const CentroidCodebook> codebook,
                                      FloatMatrixView queries, ThreadPool* pool);

// The query × centroid scores a stage 2 from codes needs when stage 1 left none (`similarity`: the
// query's), centroid-major as QuerySimilarity::Compute writes them: centroid c's scores of the
// query's rows at table[c · similarity.stride()], so that a token's scores lie in one or two cache
// lines for the compact kernel's gathers. The rows of the centroids in which one of `documents`
// has a token hold the values Compute gives them; the others are unspecified (not read). Those
// centroids are scattered over the codebook (the 400 candidates of 64 vectors of the 100k shard's
// default use ~60% of its 16,384 centroids, and some of every run of 8), so their rows are gathered
// (QuerySimilarity::ComputeRows); when nearly all are used (a small codebook: the real sets'
// 2,048), the whole codebook is scored in place, which costs less than gathering it
// (BM_CentroidTable: ~13% less a row). Split over `pool` (not null).
std::unique_ptr<float[]> ScoreUsedCentroids(const CentroidCodebook& codebook,
                                            const QuerySimilarity& similarity,
                                            absl::Span<const DocumentCodesView> documents,
                                            ThreadPool* pool);

struct CentroidSearchOptions {
  int nprobe = 0;  // centroids probed per query token (clamped to the count); 0: DefaultNprobe
  int64_t num_documents = 100;  // documents returned
  // Not null: score every centroid against every query row and leave the table here, for a stage
  // 2 that scores codes and so needs the candidates' centroid scores anyway, unless it would pass
  // kMaxKeptCentroidScores values or the codebook has groups and more than
  // kMaxKeptTableCentroids centroids (then it is left empty, and stage 2 scores the centroids its
  // documents use: ScoreUsedCentroids). With groups the probed groups' members are read from the
  // table instead of scored one group at a time, so the probes, and the hits, are the same.
  CentroidScoreTable* centroid_scores = nullptr;
};

// The largest query × centroid table a search keeps for its stage 2 (64 MiB of fp32: 32 query
// tokens × 2^19 centroids, 1,024 × 16,384), per shard, held until the search has ranked; a larger
// one is not worth its memory, and stage 2 then scores the centroids its documents use itself.
inline constexpr int64_t kMaxKeptCentroidScores = int64_t{1} << 24;
// The largest grouped codebook whose table a search computes for its stage 2. Up to it (the real
// sets' 2,048 and 4,096 centroids) the candidates use nearly every centroid, and one table in stage
// 1 costs less than scoring the probed groups one token at a time and a table in stage 2 besides
// (Xeon-2, the short set beside a build: compact QPS 0.64-0.83x the exact mode's with the table
// left to stage 2, 0.81-0.95x with it kept). Beyond it the groups are far cheaper than the table,
// and the candidates use a part of the codebook: at 1M documents (32,768 centroids) stage 1 is
// 2-3 ms faster without the table and stage 2's table of the ~60% used costs 1.1-1.5 ms
// (docs/results.md, "Rerank from codes").
inline constexpr int64_t kMaxKeptTableCentroids = 4096;

struct CentroidHit {
  uint64_t doc = 0;
  float score = 0.0f;  // approximate MaxSim (see above)
};

struct CentroidIndexStats {
  int64_t documents = 0;
  int64_t vectors = 0;       // live
  int64_t dead_vectors = 0;  // tombstoned, not yet compacted
  int64_t memory_bytes = 0;  // codebook + lists + document tables
};

class CentroidIndex {
 public:
  // scan_nbits: the width of the codes the lists hold and stage 1 scores, the top scan_nbits bits
  // of each dimension's bucket (ResidualCodec::Coarsened); one at least, and at or above the
  // codec's width the codec's own codes. Add still takes the codebook's codes.
  explicit CentroidIndex(std::shared_ptr<const CentroidCodebook> codebook,
                         int scan_nbits = kScanNbits);
  const CentroidCodebook& codebook() const { return *codebook_; }
  // The codec whose codes the lists hold and stage 1 scores: the codebook's coarsening to
  // scan_nbits, or the codebook's own.
  const ResidualCodec& scan_codec() const { return scan_codec_; }
  std::shared_ptr<const CentroidCodebook> shared_codebook() const { return codebook_; }

  // Encodes a document's vectors (rows × dim fp32) with the codebook.
  DocumentCodes Encode(FloatMatrixView vectors) const;
  // Encodes several documents in one pass, codes[i] for documents[i] (the same codes as one
  // Encode each; cheaper per vector, since the assignment scores thousands of rows at once).
  std::vector<DocumentCodes> Encode(absl::Span<const FloatMatrixView> documents) const;

  // Adds a document's encoded vectors, replacing any it had. INVALID_ARGUMENT for no vectors, a
  // code size that does not match the codec or a centroid id out of range.
  absl::Status Add(uint64_t doc, const DocumentCodes& codes);
  // Tombstones a document (a no-op for an unknown one); may compact the lists.
  void Remove(uint64_t doc);
  bool Contains(uint64_t doc) const;

  // The top options.num_documents documents by approximate MaxSim for the query (nq × dim fp32),
  // best first (ties: lower doc), among those for which `accept` returns true (null: all). Tokens
  // are split over `pool` when not null (the caller works too); `accept` runs on the calling
  // thread only. INVALID_ARGUMENT for a query of the wrong dim or no rows.
  absl::StatusOr<std::vector<CentroidHit>> Search(FloatMatrixView queries,
                                                  const CentroidSearchOptions& options,
                                                  const std::function<bool(uint64_t doc)>* accept,
                                                  ThreadPool* pool) const;

  // The documents indexed, ascending.
  std::vector<uint64_t> Documents() const;
  CentroidIndexStats Stats() const;

  static constexpr double kCompactionFraction = 0.2;

 private:
  struct List {
    std::vector<uint32_t> ordinals;  // per entry: the document's ordinal, ascending
    // The entries' codes (scan_codec_'s) in blocks of kScanBlockEntries (code_scan.h); the last
    // block's unused entries are zero.
    std::vector<uint8_t> blocks;
  };
  // One probed list of a query token: an entry scores offset + step · (its tables' sum).
  struct Probe {
    const List* list = nullptr;
    float offset = 0.0f;  // the centroid's score + the tables' bias
    int64_t levels = 0;   // where the list's margins start in TokenScan::levels
  };
  // One query token's probes, its tables and, once scanned, each probed entry's margin in units.
  struct TokenScan {
    std::vector<Probe> probes;
    ScanTables tables;
    float missing = 0.0f;
    // The highest margin a vector of its probed lists could reach: the best probe's offset plus
    // step · the largest sum the tables can give, less the estimate.
    float reach = 0.0f;
    std::unique_ptr<uint8_t[]> levels;
  };
  // The query's margin unit and cap (MarginLevelCap).
  struct MarginScale {
    float unit = 1.0f;
    int cap = 255;
  };
  static MarginScale QueryMarginScale(absl::Span<const TokenScan> tokens);

  // One query token: selects its nprobe best centroids and builds its tables. The candidates:
  // with groups `near`, (score, id) of the centroids of its ProbedGroups(nprobe) nearest groups
  // (CentroidCodebook::ScoreNearCentroids), and centroid_scores null; otherwise every centroid,
  // its scores in centroid_scores (C values).
  void SelectProbes(const float* query, const float* centroid_scores,
                    const std::vector<std::pair<float, uint32_t>>* near, int nprobe,
                    TokenScan* out) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Scores the codes of a token's probed lists, each entry's margin in the query's units.
  void ScanProbes(const MarginScale& scale, TokenScan* token) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Appends (ordinal, approximate MaxSim) for the live documents of the tile of ordinals
  // [first_ordinal, end_ordinal) that some token found above its estimate: the best `keep` of
  // them (BetterOrdinal), or all with keep < 0.
  void ScoreTile(absl::Span<const TokenScan> tokens, const MarginScale& scale,
                 uint32_t first_ordinal, uint32_t end_ordinal, float missing_sum, int64_t keep,
                 std::vector<std::pair<uint32_t, float>>* out) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // (ordinal, score) a ranks before b: the higher score, then the lower document id.
  bool BetterOrdinal(const std::pair<uint32_t, float>& a, const std::pair<uint32_t, float>& b) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void CompactLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t MemoryBytesLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<const CentroidCodebook> codebook_;
  const int64_t code_bytes_;  // of the codebook's codes, as Add takes them
  const ResidualCodec scan_codec_;
  const int64_t scan_code_bytes_;  // of the lists' codes

  mutable Mutex mu_;
  std::vector<List> lists_ ABSL_GUARDED_BY(mu_);
  // Document tables, by ordinal (ordinals are dense; dead ones stay until compaction).
  std::vector<uint64_t> ordinal_doc_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> ordinal_vectors_ ABSL_GUARDED_BY(mu_);
  std::vector<uint8_t> ordinal_dead_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint32_t> doc_ordinal_ ABSL_GUARDED_BY(mu_);  // live only
  int64_t live_vectors_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dead_vectors_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_CENTROID_CENTROID_INDEX_H_
