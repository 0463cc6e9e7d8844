// Internal entry points of the compact MaxSim kernel (code_maxsim.h), one per instruction set. The
// AVX2 and AVX-512 ones live in their own translation units compiled with their flags and are only
// called after a run-time CPU check; like code_scan_kernels.h this header is plain declarations, so
// that no inline function of a shared header is compiled with vector flags.
#ifndef TESSERA_INDEX_CENTROID_CODE_MAXSIM_KERNELS_H_
#define TESSERA_INDEX_CENTROID_CODE_MAXSIM_KERNELS_H_

#include <cstdint>

namespace tessera::internal {

// One document in the compact layout (code_maxsim.h). Not owned.
struct CompactDocument {
  // num_tokens centroid ids, each < the codebook's centroid count.
  const uint32_t* centroid_ids = nullptr;
  // ⌈num_tokens / 32⌉ blocks of code_bytes × 32 bytes, byte-transposed as code_scan.h's lists:
  // byte k of token t at blocks[(t / 32) · code_bytes · 32 + k · 32 + t % 32]. The bytes of the
  // padding slots of the last block are read but never affect a score.
  const uint8_t* blocks = nullptr;
  int64_t num_tokens = 0;
};

// A prepared query as the kernels read it (CompactQuery owns the arrays).
struct CompactMaxSimArgs {
  int64_t nq = 0;
  int64_t code_bytes = 0;
  // nq × (2 · code_bytes) × 16 levels: row i's table of nibble n at levels[(i · 2 · code_bytes +
  // n) · 16]. Every row's sum over its nibbles fits in 16 bits.
  const uint8_t* levels = nullptr;
  const float* steps = nullptr;   // nq
  const float* biases = nullptr;  // nq
  // Query row i's score of centroid c at centroid_scores[i · row_stride + c · centroid_stride]:
  // token-major (row_stride C, centroid_stride 1) or centroid-major (row_stride 1,
  // centroid_stride ≥ nq), with (C − 1) · centroid_stride < 2^31 (the gathers' int32 indices).
  const float* centroid_scores = nullptr;
  int64_t row_stride = 0;
  int64_t centroid_stride = 1;
};

// scores[d] for each of docs[0, num_docs), every num_tokens ≥ 1. All three compute the same
// integer sums and the same fp32 operations in the same order, so their scores are bit-identical:
// m_i = max over tokens t of (score(i, cid_t) + steps[i] · sum_it) — score(i, c) the table
// above, sum_it converted to float, a product then a sum — and score = Σ_i (m_i + biases[i]),
// i ascending.
void CompactMaxSimPortable(const CompactMaxSimArgs& args, const CompactDocument* docs,
                           int64_t num_docs, float* scores);
void CompactMaxSimAvx2(const CompactMaxSimArgs& args, const CompactDocument* docs, int64_t num_docs,
                       float* scores);
void CompactMaxSimAvx512(const CompactMaxSimArgs& args, const CompactDocument* docs,
                         int64_t num_docs, float* scores);
// best[i] = max(best[i], m_i of `doc`) for every row i < args.nq, with AVX2: the AVX-512 kernel,
// which pairs the blocks of a call's documents in turn, scores the call's last block this way when
// their count is odd (half a register of padding otherwise).
void CompactMaxSimAvx2Rows(const CompactMaxSimArgs& args, const CompactDocument& doc, float* best);

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_CENTROID_CODE_MAXSIM_KERNELS_H_
