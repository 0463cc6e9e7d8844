// Stage 2 from codes ("compact MaxSim"): MaxSim(q, d) = Σ_i max_j ⟨q_i, c_{cid_j} + r_j⟩ of a query
// against documents stored as centroid ids + residual codes, computed without decoding a vector:
//   ⟨q_i, c_{cid_j}⟩ is read from a query × centroid score table (nq × C fp32, token- or
//     centroid-major: Shard::ScoreCodes computes the latter for its candidates' centroids), and
//   ⟨q_i, r_j⟩ from the per-nibble lookup tables of q_i (ResidualCodec::BuildLookupTable),
//     quantised to uint8 levels exactly as stage 1's scan does (QuantizeScanTables: per-table
//     minimum → bias, one shared step per query row, ≤ 255 levels with every sum in 16 bits).
// A code is 2 · code_bytes nibbles, so one query row's residual score of 32 tokens is 2 ·
// code_bytes byte shuffles (vpshufb) of 32 lookups each (64 with AVX-512, two blocks per register),
// summed in 16-bit lanes; the exact fp32 work is one gather of a centroid score, one product and
// one sum per (query row, token).
//
// Why look-up tables and not NextPlaid's form, an int8 query times uint8 per-dimension residual
// weights with VNNI's vpdpbusd (64 multiply-adds per instruction, after decoding each code to
// bytes with one vpermb per 16 tokens × 4 dimensions): measured on one core of an AMD EPYC
// (Zen 4, AVX-512 VNNI + VBMI) by bench/code_maxsim_benchmark.cc's BM_Int8VnniPrototype, 32
// query rows × 1,000 documents of 64 tokens at dim 128, the int8 form was no faster at nbits 4
// (~175k documents/s either way) and 1.6× slower at nbits 2 (~190k against ~290k/s: a nibble
// holds two dimensions, so the tables halve the work where the product does not), and its
// worst-case error is 2.3–3.2× this kernel's (two roundings, the query's to 127 levels a side and
// the weights', against one rounding to 255 levels). So this kernel needs AVX-512BW (byte shuffles
// and 16-bit adds on 512 bits), not VNNI. On Zen 4 the AVX-512 kernel gains little over AVX2
// (512-bit operations issue as two 256-bit halves); on an Intel Xeon with AVX-512 (AMX, VNNI) it
// scores 1.23-1.28x the AVX2 kernel's documents per second (BM_CompactMaxSim, 2026-12-06), once
// it pairs blocks across documents (code_maxsim_avx512.cc).
//
// Document layout (CompactDocument): the centroid ids as stored (num_tokens uint32), and the codes
// byte-transposed in blocks of 32 tokens, the layout of stage 1's inverted lists (code_scan.h), so
// that one 32-byte load brings code byte k of 32 tokens. CompactDocuments builds it from row-major
// codes (the store's per-document form) with 16 × 16 byte transposes: ~0.36 µs per document of 64
// tokens at nbits 4 and dim 128 (BM_CompactLayout), ~6% of scoring it; a gather straight from the
// lists would be a copy per (token, code byte) as PutBlockedCode does.
//
// Error bound: each table value is rounded to its nearest level, an error of ≤ step_i / 2 per
// nibble of query row i, so every token's ⟨q_i, c + r⟩ is within N · step_i / 2 of the fp32 value
// (N = ⌈dim · nbits / 4⌉ nibbles carry dimensions; the padding nibble's table is all zeros), the
// max over tokens is within the same bound (|max a − max b| ≤ max |a − b|), and the score within
// CompactQuery::ErrorBound() = Σ_i N · step_i / 2, plus fp32 rounding (of the tables, the centroid
// scores and the sums: ~1e-6 relative). step_i = (largest nibble table range of q_i) / 255 for
// codes of up to 257 nibbles (dim 128: nbits 4 → 128 nibbles, nbits 2 → 64), range / ⌊65535 /
// nibbles⌋ beyond (a precondition: at most 65,535 nibbles, dim ≤ 131,070 at nbits 2). Measured, the
// error is far below the worst case: at dim 128 and 32 query rows, ≤ 0.036 against a bound of 1.63
// (nbits 4) and ≤ 0.026 against 0.74 (nbits 2) over 100 documents of 64 tokens.
//
// Kernels: portable, AVX2 and AVX-512 (F + BW, CpuSupportsIsa(kAvx512)) compute the same 16-bit
// sums and the same fp32 operations in the same order: their scores are bit-identical.
#ifndef TESSERA_INDEX_CENTROID_CODE_MAXSIM_H_
#define TESSERA_INDEX_CENTROID_CODE_MAXSIM_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "index/centroid/code_maxsim_kernels.h"
#include "index/centroid/document_codes.h"
#include "index/centroid/residual_codec.h"
#include "tessera/maxsim.h"

namespace tessera::internal {

// A query prepared for compact MaxSim: its rows' quantised lookup tables and a pointer to its
// centroid scores. Immutable after construction; any number of threads may score with one.
class CompactQuery {
 public:
  // queries: nq × codec.dim() fp32, row-major, nq ≥ 1, finite. centroid_scores: query row i's
  // score ⟨q_i, c⟩ of centroid c at centroid_scores[i · row_stride + c · centroid_stride]; not
  // copied, must outlive the query. Token-major (stage 1's nq × C table): row_stride = C,
  // centroid_stride = 1; centroid-major (QuerySimilarity::Compute's output, C × stride()):
  // row_stride = 1, centroid_stride = stride(). (C − 1) · centroid_stride < 2^31.
  CompactQuery(const ResidualCodec& codec, const float* queries, int64_t nq,
               const float* centroid_scores, int64_t row_stride, int64_t centroid_stride = 1);

  int64_t nq() const { return args_.nq; }
  int64_t code_bytes() const { return args_.code_bytes; }
  // The worst-case quantisation error of a score: Σ_i N · step_i / 2 (see above).
  double ErrorBound() const { return error_bound_; }
  const CompactMaxSimArgs& args() const { return args_; }

 private:
  std::vector<uint8_t> levels_;
  std::vector<float> steps_;
  std::vector<float> biases_;
  double error_bound_ = 0.0;
  CompactMaxSimArgs args_;
};

// Documents in the compact layout, owned: appended one at a time from their stored codes.
class CompactDocuments {
 public:
  explicit CompactDocuments(int64_t code_bytes) : code_bytes_(code_bytes) {}

  // document.size ≥ 1, its codes of code_bytes bytes each. Padding slots are zeroed. Invalidates
  // earlier refs().
  void Add(const DocumentCodesView& document);
  // Forgets every document and keeps the memory, for the next batch.
  void Clear();

  // One CompactDocument per Add, in order, pointing into this object.
  std::vector<CompactDocument> refs() const;
  int64_t size() const { return static_cast<int64_t>(num_tokens_.size()); }

 private:
  int64_t code_bytes_;
  std::vector<uint32_t> ids_;    // every document's ids back to back
  std::vector<uint8_t> blocks_;  // every document's blocks back to back, in [0, blocks_used_)
  size_t blocks_used_ = 0;
  std::vector<int64_t> num_tokens_;
};

// scores[d] = MaxSim of `query` and docs[d] (docs.size() values), within query.ErrorBound() of the
// fp32 MaxSim of the decoded vectors. isa: kAuto (DetectCpuIsa()) or one the CPU supports. Runs on
// the calling thread; thread-safe. INVALID_ARGUMENT when a document has no tokens (or a null
// array), FAILED_PRECONDITION when the CPU lacks `isa`. A centroid id ≥ C is not checked (the
// caller's, as stage 1's lists).
absl::Status ScoreCompactDocuments(const CompactQuery& query,
                                   absl::Span<const CompactDocument> docs, float* scores,
                                   CpuIsa isa = CpuIsa::kAuto);

// Tokens laid out per batch by ScoreStoredCodes: ~96 KiB of blocks at dim 384 and 4 bits, so that
// a batch is scored while it is in the core's cache.
inline constexpr int64_t kLayoutBatchTokens = 512;

// scores[d] = MaxSim of `query` and docs[d], codes read where they are stored (the store's
// row-major form): bit-identical to ScoreCompactDocuments over a CompactDocuments of the same
// documents, which this lays out kLayoutBatchTokens tokens at a time in a buffer of its own and
// scores batch by batch. Why not a layout of every candidate first (the fetch stage's until
// 2026-12-06): on cranfield at dim 384 and 4 bits, laying out 100 candidates took 0.43 ms of a
// 2.6 ms search (a zero fill and 1.8 MB written, then read back from memory), against 0.09 ms
// for the exact mode's fetch. Thread-safe; runs on the calling thread. INVALID_ARGUMENT naming
// the document when one has no tokens or a null array; otherwise as ScoreCompactDocuments.
absl::Status ScoreStoredCodes(const CompactQuery& query, absl::Span<const DocumentCodesView> docs,
                              float* scores, CpuIsa isa = CpuIsa::kAuto);

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_CENTROID_CODE_MAXSIM_H_
