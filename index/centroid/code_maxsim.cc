#include "index/centroid/code_maxsim.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "index/centroid/code_scan.h"
#include "index/centroid/code_scan_kernels.h"
#include "index/kernels/cpu_kernels.h"
#include "tessera/status_macros.h"

namespace tessera::internal {

namespace {

#if defined(__SSE2__)
// Transposes 16 tokens × 16 code bytes: rows `in + t · in_stride` (t < 16, 16 bytes each) → 16
// rows `out + k · kScanBlockEntries` (code byte k of the 16 tokens). Four rounds of unpacks, each
// doubling the width of the units that already hold one code byte's tokens.
void Transpose16x16(const uint8_t* in, int64_t in_stride, uint8_t* out) {
  __m128i a[16], b[16];
  for (int t = 0; t < 16; ++t) {
    a[t] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + t * in_stride));
  }
  // b[h·8 + k]: code bytes h·8 + 0…7, 16-bit units of tokens 2k, 2k + 1.
  for (int k = 0; k < 8; ++k) {
    b[k] = _mm_unpacklo_epi8(a[2 * k], a[2 * k + 1]);
    b[k + 8] = _mm_unpackhi_epi8(a[2 * k], a[2 * k + 1]);
  }
  // a[h·8 + q·4 + m]: code bytes h·8 + q·4 + 0…3, 32-bit units of tokens 4m … 4m + 3.
  for (int h = 0; h < 2; ++h) {
    for (int m = 0; m < 4; ++m) {
      a[h * 8 + m] = _mm_unpacklo_epi16(b[h * 8 + 2 * m], b[h * 8 + 2 * m + 1]);
      a[h * 8 + m + 4] = _mm_unpackhi_epi16(b[h * 8 + 2 * m], b[h * 8 + 2 * m + 1]);
    }
  }
  // b[base + s·2 + n], base = h·8 + q·4: code bytes base + s·2 + 0…1, 64-bit units of tokens
  // 8n … 8n + 7.
  for (int base = 0; base < 16; base += 4) {
    for (int n = 0; n < 2; ++n) {
      b[base + n] = _mm_unpacklo_epi32(a[base + 2 * n], a[base + 2 * n + 1]);
      b[base + n + 2] = _mm_unpackhi_epi32(a[base + 2 * n], a[base + 2 * n + 1]);
    }
  }
  for (int k = 0; k < 16; k += 2) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k * kScanBlockEntries),
                     _mm_unpacklo_epi64(b[k], b[k + 1]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (k + 1) * kScanBlockEntries),
                     _mm_unpackhi_epi64(b[k], b[k + 1]));
  }
}
#endif

// codes: num_tokens × code_bytes, row-major → the blocked layout, every slot of the ⌈num_tokens /
// 32⌉ blocks written: the padding slots zeroed.
void BlockCodes(const uint8_t* codes, int64_t num_tokens, int64_t code_bytes, uint8_t* blocks) {
  const int64_t slots =
      (num_tokens + kScanBlockEntries - 1) / kScanBlockEntries * kScanBlockEntries;
#if defined(__SSE2__)
  // Groups of 16 tokens (half a block) by 16 × 16 tiles, the last code bytes one at a time. The
  // last tokens are copied first to a zero-padded group of 16, so that they are transposed too
  // rather than written byte by byte (PutBlockedCode); a group with no tokens is zeros.
  thread_local std::vector<uint8_t> last_group;
  for (int64_t t = 0; t < slots; t += 16) {
    uint8_t* out =
        blocks + (t / kScanBlockEntries) * ScanBlockBytes(code_bytes) + t % kScanBlockEntries;
    if (t >= num_tokens) {
      for (int64_t k = 0; k < code_bytes; ++k) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k * kScanBlockEntries),
                         _mm_setzero_si128());
      }
      continue;
    }
    const uint8_t* in = codes + t * code_bytes;
    if (t + 16 > num_tokens) {
      last_group.assign(16 * code_bytes, 0);
      std::memcpy(last_group.data(), in, (num_tokens - t) * code_bytes);
      in = last_group.data();
    }
    int64_t k = 0;
    for (; k + 16 <= code_bytes; k += 16)
      Transpose16x16(in + k, code_bytes, out + k * kScanBlockEntries);
    for (; k < code_bytes; ++k) {
      for (int64_t i = 0; i < 16; ++i) out[k * kScanBlockEntries + i] = in[i * code_bytes + k];
    }
  }
#else
  std::memset(blocks, 0, slots * code_bytes);
  for (int64_t t = 0; t < num_tokens; ++t) {
    PutBlockedCode(codes + t * code_bytes, code_bytes, t, blocks);
  }
#endif
}

}  // namespace

CompactQuery::CompactQuery(const ResidualCodec& codec, const float* queries, int64_t nq,
                           const float* centroid_scores, int64_t row_stride,
                           int64_t centroid_stride) {
  const int64_t nibbles = codec.nibbles();
  const int64_t dim = codec.dim();
  // Nibbles that carry a dimension; the rest (one at most) have all-zero tables and no error.
  const int64_t used = (dim * codec.nbits() + 3) / 4;
  levels_.resize(nq * nibbles * 16);
  steps_.resize(nq);
  biases_.resize(nq);
  std::vector<float> lut(nibbles * 16);
  ScanTables tables;
  for (int64_t i = 0; i < nq; ++i) {
    codec.BuildLookupTable(queries + i * dim, lut.data());
    QuantizeScanTables(lut.data(), nibbles, &tables);
    std::memcpy(&levels_[i * nibbles * 16], tables.levels.data(), nibbles * 16);
    steps_[i] = tables.step;
    biases_[i] = tables.bias;
    error_bound_ += static_cast<double>(used) * tables.step / 2;
  }
  args_.nq = nq;
  args_.code_bytes = codec.code_bytes();
  args_.levels = levels_.data();
  args_.steps = steps_.data();
  args_.biases = biases_.data();
  args_.centroid_scores = centroid_scores;
  args_.row_stride = row_stride;
  args_.centroid_stride = centroid_stride;
}

void CompactDocuments::Add(const DocumentCodesView& document) {
  const int64_t n = document.size;
  const size_t first_id = ids_.size();
  ids_.resize(first_id + n);
  std::memcpy(&ids_[first_id], document.centroids, n * sizeof(uint32_t));
  const int64_t blocks = (n + kScanBlockEntries - 1) / kScanBlockEntries;
  const size_t first = blocks_used_;
  blocks_used_ += blocks * ScanBlockBytes(code_bytes_);
  // Grown, never shrunk: a buffer reused after Clear() is not zero-filled again.
  if (blocks_.size() < blocks_used_) blocks_.resize(std::max(blocks_used_, 2 * blocks_.size()));
  // Every slot is written, the padding ones zeroed (they may hold an earlier document's bytes).
  BlockCodes(document.codes, n, code_bytes_, &blocks_[first]);
  num_tokens_.push_back(n);
}

void CompactDocuments::Clear() {
  ids_.clear();
  num_tokens_.clear();
  blocks_used_ = 0;
}

std::vector<CompactDocument> CompactDocuments::refs() const {
  std::vector<CompactDocument> out;
  out.reserve(num_tokens_.size());
  const uint32_t* ids = ids_.data();
  const uint8_t* blocks = blocks_.data();
  for (const int64_t n : num_tokens_) {
    out.push_back(CompactDocument{ids, blocks, n});
    ids += n;
    blocks += (n + kScanBlockEntries - 1) / kScanBlockEntries * ScanBlockBytes(code_bytes_);
  }
  return out;
}

void CompactMaxSimPortable(const CompactMaxSimArgs& args, const CompactDocument* docs,
                           int64_t num_docs, float* scores) {
  const int64_t table_bytes = 2 * args.code_bytes * 16;
  uint16_t sums[kScanBlockEntries];
  for (int64_t d = 0; d < num_docs; ++d) {
    const CompactDocument& doc = docs[d];
    const int64_t blocks = (doc.num_tokens + kScanBlockEntries - 1) / kScanBlockEntries;
    float total = 0.0f;
    for (int64_t i = 0; i < args.nq; ++i) {
      const float* row = args.centroid_scores + i * args.row_stride;
      const float step = args.steps[i];
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t b = 0; b < blocks; ++b) {
        ScanBlocksPortable(doc.blocks + b * ScanBlockBytes(args.code_bytes), 1, args.code_bytes,
                           args.levels + i * table_bytes, sums);
        const int64_t first = b * kScanBlockEntries;
        const int64_t valid = std::min(kScanBlockEntries, doc.num_tokens - first);
        for (int64_t t = 0; t < valid; ++t) {
          const float score = row[doc.centroid_ids[first + t] * args.centroid_stride] +
                              step * static_cast<float>(sums[t]);
          best = std::max(best, score);
        }
      }
      total += best + args.biases[i];
    }
    scores[d] = total;
  }
}

absl::Status ScoreCompactDocuments(const CompactQuery& query,
                                   absl::Span<const CompactDocument> docs, float* scores,
                                   CpuIsa isa) {
  for (size_t d = 0; d < docs.size(); ++d) {
    if (docs[d].num_tokens < 1 || docs[d].centroid_ids == nullptr || docs[d].blocks == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "compact document ", d, ": ", docs[d].num_tokens, " tokens (ids ",
          docs[d].centroid_ids == nullptr ? "null" : "set", ", codes ",
          docs[d].blocks == nullptr ? "null" : "set", "), expected ≥ 1 token with ids and codes"));
    }
  }
  if (isa == CpuIsa::kAuto) isa = DetectCpuIsa();
  if (!CpuSupportsIsa(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("compact MaxSim: isa ", CpuIsaName(isa), " is not supported by this CPU"));
  }
  const int64_t n = static_cast<int64_t>(docs.size());
  switch (isa) {
    case CpuIsa::kAvx512:
      CompactMaxSimAvx512(query.args(), docs.data(), n, scores);
      break;
    case CpuIsa::kAvx2:
      CompactMaxSimAvx2(query.args(), docs.data(), n, scores);
      break;
    default:
      CompactMaxSimPortable(query.args(), docs.data(), n, scores);
      break;
  }
  return absl::OkStatus();
}

absl::Status ScoreStoredCodes(const CompactQuery& query, absl::Span<const DocumentCodesView> docs,
                              float* scores, CpuIsa isa) {
  for (size_t d = 0; d < docs.size(); ++d) {
    if (docs[d].size < 1 || docs[d].centroids == nullptr || docs[d].codes == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stored codes of document ", d, ": ", docs[d].size, " tokens (ids ",
          docs[d].centroids == nullptr ? "null" : "set", ", codes ",
          docs[d].codes == nullptr ? "null" : "set", "), expected ≥ 1 token with ids and codes"));
    }
  }
  CompactDocuments batch(query.code_bytes());
  size_t first = 0;
  while (first < docs.size()) {
    batch.Clear();
    size_t end = first;
    int64_t tokens = 0;
    while (end < docs.size() && (end == first || tokens < kLayoutBatchTokens)) {
      batch.Add(docs[end]);
      tokens += docs[end].size;
      ++end;
    }
    TESSERA_RETURN_IF_ERROR(ScoreCompactDocuments(query, batch.refs(), scores + first, isa));
    first = end;
  }
  return absl::OkStatus();
}

}  // namespace tessera::internal
