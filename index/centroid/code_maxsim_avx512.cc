// The AVX-512 compact MaxSim kernel: two blocks of 32 tokens per register (code row j of one block
// in the low 256 bits, of the next in the high), so that each 16-byte table, broadcast to the four
// 128-bit lanes, serves 64 look-ups; kRows query rows at a time and 16-bit sums as in the AVX2
// kernel. The blocks of all the documents of a call are paired in turn, across documents: a
// document of one block (the short set's 32 vectors) or of an odd count shares its register with
// the next document's block instead of half a register of padding or the AVX2 kernel; only the
// call's last block, when the count is odd, goes to the AVX2 kernel. Uses AVX-512F and BW (byte
// shuffles and 16-bit adds on 512 bits) and masked gathers that give padding tokens −∞. Compiled
// with its flags and -ffp-contract=off (CMakeLists.txt), so that the fp32 product and sum stay
// two roundings as in the portable kernel.
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
// Pairs scored for every query row before the next ones: 512 tokens, whose codes (32 KiB at dim
// 128 and 4 bits, 96 KiB at dim 384) stay in the core's cache while each group of kRows rows'
// tables is read once per pair.
constexpr int64_t kPairsPerRun = 8;

// One block of a document: its codes, centroid ids and tokens (≤ 32), and the document's index.
struct Block {
  const uint8_t* codes;
  const uint32_t* ids;
  int64_t tokens;
  int64_t doc;
};

// A pair of blocks' centroid ids in the order of the lanes of its four groups of 16 sums: even
// tokens of the first block, of the second, odd tokens of the first, of the second; and which lanes
// hold a token.
struct PairLanes {
  alignas(64) int32_t ids[2 * kBlock];
  __mmask16 valid[4];
};

// The tokens' centroid ids are stored scaled by centroid_stride (the gathers' element offsets).
void PrepareLanes(const Block& first, const Block& second, int64_t centroid_stride,
                  PairLanes* out) {
  for (int g = 0; g < 4; ++g) {
    const Block& block = (g & 1) == 0 ? first : second;
    out->valid[g] = 0;
    for (int k = 0; k < 16; ++k) {
      const int64_t token = 2 * k + (g >> 1);
      const bool valid = token < block.tokens;
      out->ids[g * 16 + k] = valid ? static_cast<int32_t>(block.ids[token] * centroid_stride) : 0;
      out->valid[g] = static_cast<__mmask16>(out->valid[g] | (valid ? 1u << k : 0u));
    }
  }
}

// For r < R: best_first[r] = max(best_first[r], max over the first block's tokens of row
// (first_row + r)'s score), best_second[r] the same for the second block (the same array when both
// blocks are one document's).
template <int R>
void ScorePair(const CompactMaxSimArgs& args, const Block& first_block, const Block& second_block,
               const PairLanes& lanes, int64_t first_row, float* best_first, float* best_second) {
  const int64_t table_bytes = 2 * args.code_bytes * 16;
  const uint8_t* tables = args.levels + first_row * table_bytes;
  const uint8_t* first = first_block.codes;
  const uint8_t* second = second_block.codes;
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
  const bool one_document = best_first == best_second;
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const __m512i even = _mm512_sub_epi16(raw[r], _mm512_slli_epi16(odd[r], 8));
    const __m256i halves[4] = {_mm512_castsi512_si256(even), _mm512_extracti64x4_epi64(even, 1),
                               _mm512_castsi512_si256(odd[r]),
                               _mm512_extracti64x4_epi64(odd[r], 1)};
    const float* scores = args.centroid_scores + (first_row + r) * args.row_stride;
    const __m512 step = _mm512_set1_ps(args.steps[first_row + r]);
    __m512 m[2] = {minus_inf, minus_inf};  // the first block's tokens, the second's
    for (int g = 0; g < 4; ++g) {
      const __m512 sums = _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(halves[g]));
      const __m512i ids = _mm512_load_si512(lanes.ids + g * 16);
      const __m512 centroid = _mm512_mask_i32gather_ps(minus_inf, lanes.valid[g], ids, scores, 4);
      m[g & 1] = _mm512_max_ps(m[g & 1], _mm512_add_ps(centroid, _mm512_mul_ps(step, sums)));
    }
    if (one_document) {
      best_first[r] = std::max(best_first[r], _mm512_reduce_max_ps(_mm512_max_ps(m[0], m[1])));
    } else {
      best_first[r] = std::max(best_first[r], _mm512_reduce_max_ps(m[0]));
      best_second[r] = std::max(best_second[r], _mm512_reduce_max_ps(m[1]));
    }
  }
}

// For the pairs [begin, end) of `blocks` (pair p: blocks 2p and 2p + 1): best[doc · nq + first_row
// + r] = max(itself, the row's best score over the pair's tokens of that document), r < R.
template <int R>
void ScoreRows(const CompactMaxSimArgs& args, const std::vector<Block>& blocks,
               const std::vector<PairLanes>& lanes, int64_t begin, int64_t end, int64_t first_row,
               float* best) {
  for (int64_t p = begin; p < end; ++p) {
    const Block& first = blocks[2 * p];
    const Block& second = blocks[2 * p + 1];
    ScorePair<R>(args, first, second, lanes[p], first_row, &best[first.doc * args.nq + first_row],
                 &best[second.doc * args.nq + first_row]);
  }
}

}  // namespace

void CompactMaxSimAvx512(const CompactMaxSimArgs& args, const CompactDocument* docs,
                         int64_t num_docs, float* scores) {
  // Reused by every call on this thread: no allocation per call once they have grown.
  thread_local std::vector<Block> blocks;
  thread_local std::vector<PairLanes> lanes;
  thread_local std::vector<float> best;
  const int64_t block_bytes = args.code_bytes * kBlock;
  blocks.clear();
  for (int64_t d = 0; d < num_docs; ++d) {
    const CompactDocument& doc = docs[d];
    for (int64_t first = 0; first < doc.num_tokens; first += kBlock) {
      blocks.push_back(Block{doc.blocks + first / kBlock * block_bytes, doc.centroid_ids + first,
                             std::min(kBlock, doc.num_tokens - first), d});
    }
  }
  const int64_t pairs = static_cast<int64_t>(blocks.size()) / 2;
  lanes.resize(pairs);
  for (int64_t p = 0; p < pairs; ++p) {
    PrepareLanes(blocks[2 * p], blocks[2 * p + 1], args.centroid_stride, &lanes[p]);
  }
  best.assign(num_docs * args.nq, -std::numeric_limits<float>::infinity());
  for (int64_t begin = 0; begin < pairs; begin += kPairsPerRun) {
    const int64_t end = std::min(pairs, begin + kPairsPerRun);
    int64_t i = 0;
    for (; i + kRows <= args.nq; i += kRows) {
      ScoreRows<kRows>(args, blocks, lanes, begin, end, i, best.data());
    }
    switch (args.nq - i) {
      case 7:
        ScoreRows<7>(args, blocks, lanes, begin, end, i, best.data());
        break;
      case 6:
        ScoreRows<6>(args, blocks, lanes, begin, end, i, best.data());
        break;
      case 5:
        ScoreRows<5>(args, blocks, lanes, begin, end, i, best.data());
        break;
      case 4:
        ScoreRows<4>(args, blocks, lanes, begin, end, i, best.data());
        break;
      case 3:
        ScoreRows<3>(args, blocks, lanes, begin, end, i, best.data());
        break;
      case 2:
        ScoreRows<2>(args, blocks, lanes, begin, end, i, best.data());
        break;
      case 1:
        ScoreRows<1>(args, blocks, lanes, begin, end, i, best.data());
        break;
      default:
        break;
    }
  }
  // An odd count of blocks: the last one by the AVX2 kernel (CompactMaxSimAvx2Rows).
  if (blocks.size() % 2 == 1) {
    const Block& last = blocks.back();
    CompactMaxSimAvx2Rows(args, CompactDocument{last.ids, last.codes, last.tokens},
                          &best[last.doc * args.nq]);
  }
  for (int64_t d = 0; d < num_docs; ++d) {
    float total = 0.0f;
    for (int64_t q = 0; q < args.nq; ++q) total += best[d * args.nq + q] + args.biases[q];
    scores[d] = total;
  }
}

}  // namespace tessera::internal
