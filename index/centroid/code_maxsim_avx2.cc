// The AVX2 compact MaxSim kernel: one block of 32 tokens per register, kRows query rows at a time
// (each code row is loaded and split into nibbles once for all of them), 16-bit sums kept the
// FAISS way: one accumulator of the raw shuffled bytes read as 16-bit lanes (even token + 256 · odd
// token, mod 2^16) and one of the odd bytes, the even sums recovered at the end. Compiled with
// -mavx2 -ffp-contract=off (CMakeLists.txt), so that the fp32 product and sum stay two roundings as
// in the portable kernel.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "index/centroid/code_maxsim_kernels.h"

namespace tessera::internal {
namespace {

constexpr int kRows = 4;
constexpr int64_t kBlock = 32;

// A block's centroid ids in the order of the lanes of its four groups of 8 sums: even tokens 0…14,
// even 16…30, odd 1…15, odd 17…31; and the lanes that hold a token (all bits set) or padding.
struct BlockLanes {
  alignas(32) int32_t ids[kBlock];
  alignas(32) int32_t valid[kBlock];
};

// ids: the tokens' centroid ids, stored scaled by centroid_stride (the gathers' element offsets).
void PrepareLanes(const uint32_t* ids, int64_t count, int64_t centroid_stride, BlockLanes* out) {
  for (int g = 0; g < 4; ++g) {
    for (int k = 0; k < 8; ++k) {
      const int64_t token = (g & 1) * 16 + 2 * k + (g >> 1);
      const bool valid = token < count;
      out->ids[g * 8 + k] = valid ? static_cast<int32_t>(ids[token] * centroid_stride) : 0;
      out->valid[g * 8 + k] = valid ? -1 : 0;
    }
  }
}

float HorizontalMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// best[r] = max(best[r], max over the block's valid tokens of row (first_row + r)'s score).
template <int R>
void ScoreBlock(const CompactMaxSimArgs& args, const uint8_t* block, const BlockLanes& lanes,
                int64_t first_row, float* best) {
  const int64_t table_bytes = 2 * args.code_bytes * 16;
  const uint8_t* tables = args.levels + first_row * table_bytes;
  const __m256i low_nibble = _mm256_set1_epi8(0x0f);
  __m256i raw[R];
  __m256i odd[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) raw[r] = odd[r] = _mm256_setzero_si256();
  for (int64_t j = 0; j < args.code_bytes; ++j) {
    const __m256i row = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + j * kBlock));
    const __m256i lo = _mm256_and_si256(row, low_nibble);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(row, 4), low_nibble);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint8_t* t = tables + r * table_bytes + j * 32;
      const __m256i table_lo =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
      const __m256i table_hi =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 16)));
      const __m256i a = _mm256_shuffle_epi8(table_lo, lo);
      const __m256i c = _mm256_shuffle_epi8(table_hi, hi);
      raw[r] = _mm256_add_epi16(raw[r], _mm256_add_epi16(a, c));
      odd[r] = _mm256_add_epi16(odd[r],
                                _mm256_add_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(c, 8)));
    }
  }
  const __m256 minus_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m256i even = _mm256_sub_epi16(raw[r], _mm256_slli_epi16(odd[r], 8));
    const __m128i halves[4] = {_mm256_castsi256_si128(even), _mm256_extracti128_si256(even, 1),
                               _mm256_castsi256_si128(odd[r]), _mm256_extracti128_si256(odd[r], 1)};
    const float* scores = args.centroid_scores + (first_row + r) * args.row_stride;
    const __m256 step = _mm256_set1_ps(args.steps[first_row + r]);
    __m256 m = minus_inf;
    for (int g = 0; g < 4; ++g) {
      const __m256 sums = _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(halves[g]));
      const __m256i ids = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes.ids + g * 8));
      const __m256 valid = _mm256_castsi256_ps(
          _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes.valid + g * 8)));
      const __m256 centroid = _mm256_mask_i32gather_ps(minus_inf, scores, ids, valid, 4);
      m = _mm256_max_ps(m, _mm256_add_ps(centroid, _mm256_mul_ps(step, sums)));
    }
    best[r] = std::max(best[r], HorizontalMax(m));
  }
}

// best[r] = max(best[r], the row (first_row + r)'s best score over the document's blocks).
template <int R>
void ScoreRows(const CompactMaxSimArgs& args, const CompactDocument& doc,
               const std::vector<BlockLanes>& lanes, int64_t first_row, float* best) {
  const int64_t block_bytes = args.code_bytes * kBlock;
  for (size_t b = 0; b < lanes.size(); ++b) {
    ScoreBlock<R>(args, doc.blocks + b * block_bytes, lanes[b], first_row, best);
  }
}

}  // namespace

void CompactMaxSimAvx2Rows(const CompactMaxSimArgs& args, const CompactDocument& doc, float* best) {
  const int64_t blocks = (doc.num_tokens + kBlock - 1) / kBlock;
  // Reused by every document this thread scores: no allocation per document.
  thread_local std::vector<BlockLanes> lanes;
  lanes.resize(blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    PrepareLanes(doc.centroid_ids + b * kBlock, doc.num_tokens - b * kBlock, args.centroid_stride,
                 &lanes[b]);
  }
  int64_t i = 0;
  for (; i + kRows <= args.nq; i += kRows) ScoreRows<kRows>(args, doc, lanes, i, &best[i]);
  switch (args.nq - i) {
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

void CompactMaxSimAvx2(const CompactMaxSimArgs& args, const CompactDocument* docs, int64_t num_docs,
                       float* scores) {
  std::vector<float> best(args.nq);
  for (int64_t d = 0; d < num_docs; ++d) {
    std::fill(best.begin(), best.end(), -std::numeric_limits<float>::infinity());
    CompactMaxSimAvx2Rows(args, docs[d], best.data());
    float total = 0.0f;
    for (int64_t q = 0; q < args.nq; ++q) total += best[q] + args.biases[q];
    scores[d] = total;
  }
}

}  // namespace tessera::internal
