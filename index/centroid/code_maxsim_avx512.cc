// The AVX-512 compact MaxSim kernel: two blocks of 32 tokens per register (code row j of block b in
// the low 256 bits, of block b + 1 in the high; an odd last block is the AVX2 kernel's), so that
// each 16-byte table, broadcast to the four 128-bit lanes, serves 64 look-ups; kRows query rows at
// a time and 16-bit sums as in the AVX2 kernel. Uses AVX-512F and BW (byte shuffles and 16-bit adds
// on 512 bits) and masked gathers that give padding tokens −∞. Compiled with its flags and
// -ffp-contract=off (CMakeLists.txt), so that the fp32 product and sum stay two roundings as in the
// portable kernel.
// GCC 12's _mm512_undefined_* (used by _mm512_reduce_max_ps) initialises a variable from itself,
// which -Wuninitialized reports at every use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "index/centroid/code_maxsim_kernels.h"

namespace tessera::internal {
namespace {

constexpr int kRows = 8;
constexpr int64_t kBlock = 32;

// A pair of blocks' centroid ids in the order of the lanes of its four groups of 16 sums: even
// tokens of block b, of block b + 1, odd tokens of b, of b + 1; and which lanes hold a token.
struct PairLanes {
  alignas(64) int32_t ids[2 * kBlock];
  __mmask16 valid[4];
};

// ids: the tokens' centroid ids, stored scaled by centroid_stride (the gathers' element offsets).
void PrepareLanes(const uint32_t* ids, int64_t count, int64_t centroid_stride, PairLanes* out) {
  for (int g = 0; g < 4; ++g) {
    out->valid[g] = 0;
    for (int k = 0; k < 16; ++k) {
      const int64_t token = (g & 1) * kBlock + 2 * k + (g >> 1);
      const bool valid = token < count;
      out->ids[g * 16 + k] = valid ? static_cast<int32_t>(ids[token] * centroid_stride) : 0;
      out->valid[g] = static_cast<__mmask16>(out->valid[g] | (valid ? 1u << k : 0u));
    }
  }
}

// best[r] = max(best[r], max over the pair's tokens of row (first_row + r)'s score); second: the
// block after first.
template <int R>
void ScorePair(const CompactMaxSimArgs& args, const uint8_t* first, const uint8_t* second,
               const PairLanes& lanes, int64_t first_row, float* best) {
  const int64_t table_bytes = 2 * args.code_bytes * 16;
  const uint8_t* tables = args.levels + first_row * table_bytes;
  const __m512i low_nibble = _mm512_set1_epi8(0x0f);
  __m512i raw[R];
  __m512i odd[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) raw[r] = odd[r] = _mm512_setzero_si512();
  for (int64_t j = 0; j < args.code_bytes; ++j) {
    const __m512i row = _mm512_inserti64x4(
        _mm512_castsi256_si512(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(first + j * kBlock))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(second + j * kBlock)), 1);
    const __m512i lo = _mm512_and_si512(row, low_nibble);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(row, 4), low_nibble);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const uint8_t* t = tables + r * table_bytes + j * 32;
      const __m512i table_lo =
          _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
      const __m512i table_hi =
          _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 16)));
      const __m512i a = _mm512_shuffle_epi8(table_lo, lo);
      const __m512i c = _mm512_shuffle_epi8(table_hi, hi);
      raw[r] = _mm512_add_epi16(raw[r], _mm512_add_epi16(a, c));
      odd[r] = _mm512_add_epi16(odd[r],
                                _mm512_add_epi16(_mm512_srli_epi16(a, 8), _mm512_srli_epi16(c, 8)));
    }
  }
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const __m512i even = _mm512_sub_epi16(raw[r], _mm512_slli_epi16(odd[r], 8));
    const __m256i halves[4] = {_mm512_castsi512_si256(even), _mm512_extracti64x4_epi64(even, 1),
                               _mm512_castsi512_si256(odd[r]),
                               _mm512_extracti64x4_epi64(odd[r], 1)};
    const float* scores = args.centroid_scores + (first_row + r) * args.row_stride;
    const __m512 step = _mm512_set1_ps(args.steps[first_row + r]);
    __m512 m = minus_inf;
    for (int g = 0; g < 4; ++g) {
      const __m512 sums = _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(halves[g]));
      const __m512i ids = _mm512_load_si512(lanes.ids + g * 16);
      const __m512 centroid = _mm512_mask_i32gather_ps(minus_inf, lanes.valid[g], ids, scores, 4);
      m = _mm512_max_ps(m, _mm512_add_ps(centroid, _mm512_mul_ps(step, sums)));
    }
    best[r] = std::max(best[r], _mm512_reduce_max_ps(m));
  }
}

// best[r] = max(best[r], the row (first_row + r)'s best score over the document's pairs of blocks).
template <int R>
void ScoreRows(const CompactMaxSimArgs& args, const CompactDocument& doc,
               const std::vector<PairLanes>& lanes, int64_t first_row, float* best) {
  const int64_t block_bytes = args.code_bytes * kBlock;
  for (int64_t p = 0; p < static_cast<int64_t>(lanes.size()); ++p) {
    const uint8_t* first = doc.blocks + 2 * p * block_bytes;
    ScorePair<R>(args, first, first + block_bytes, lanes[p], first_row, best);
  }
}

}  // namespace

void CompactMaxSimAvx512(const CompactMaxSimArgs& args, const CompactDocument* docs,
                         int64_t num_docs, float* scores) {
  std::vector<PairLanes> lanes;
  std::vector<float> best(args.nq);
  const int64_t block_bytes = args.code_bytes * kBlock;
  for (int64_t d = 0; d < num_docs; ++d) {
    const CompactDocument& doc = docs[d];
    std::fill(best.begin(), best.end(), -std::numeric_limits<float>::infinity());
    // Whole pairs of blocks here; an odd last block by the AVX2 kernel (CompactMaxSimAvx2Rows).
    const int64_t pairs = doc.num_tokens / (2 * kBlock);
    lanes.resize(pairs);
    for (int64_t p = 0; p < pairs; ++p) {
      PrepareLanes(doc.centroid_ids + p * 2 * kBlock, doc.num_tokens - p * 2 * kBlock,
                   args.centroid_stride, &lanes[p]);
    }
    if (pairs > 0) {
      int64_t i = 0;
      for (; i + kRows <= args.nq; i += kRows) ScoreRows<kRows>(args, doc, lanes, i, &best[i]);
      switch (args.nq - i) {
        case 7:
          ScoreRows<7>(args, doc, lanes, i, &best[i]);
          break;
        case 6:
          ScoreRows<6>(args, doc, lanes, i, &best[i]);
          break;
        case 5:
          ScoreRows<5>(args, doc, lanes, i, &best[i]);
          break;
        case 4:
          ScoreRows<4>(args, doc, lanes, i, &best[i]);
          break;
        case 3:
          ScoreRows<3>(args, doc, lanes, i, &best[i]);
          break;
        case 2:
          ScoreRows<2>(args, doc, lanes, i, &best[i]);
          break;
        case 1:
          ScoreRows<1>(args, doc, lanes, i, &best[i]);
          break;
        default:
          break;
      }
    }
    if (const int64_t done = pairs * 2 * kBlock; done < doc.num_tokens) {
      const CompactDocument rest{doc.centroid_ids + done, doc.blocks + 2 * pairs * block_bytes,
                                 doc.num_tokens - done};
      CompactMaxSimAvx2Rows(args, rest, best.data());
    }
    float total = 0.0f;
    for (int64_t q = 0; q < args.nq; ++q) total += best[q] + args.biases[q];
    scores[d] = total;
  }
}

}  // namespace tessera::internal
