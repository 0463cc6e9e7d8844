#include "index/centroid/code_maxsim.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "index/centroid/code_scan.h"
#include "index/centroid/code_scan_kernels.h"
#include "index/rerank/cpu_maxsim_scorer.h"

namespace tessera::internal {

CompactQuery::CompactQuery(const ResidualCodec& codec, const float* queries, int64_t nq,
                           const float* centroid_scores, int64_t centroid_stride) {
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
  args_.centroid_stride = centroid_stride;
}

void CompactDocuments::Add(const uint32_t* centroid_ids, const uint8_t* codes, int64_t num_tokens) {
  ids_.insert(ids_.end(), centroid_ids, centroid_ids + num_tokens);
  const int64_t blocks = (num_tokens + kScanBlockEntries - 1) / kScanBlockEntries;
  const size_t first = blocks_.size();
  blocks_.resize(first + blocks * ScanBlockBytes(code_bytes_), 0);
  for (int64_t t = 0; t < num_tokens; ++t) {
    PutBlockedCode(codes + t * code_bytes_, code_bytes_, t, &blocks_[first]);
  }
  num_tokens_.push_back(num_tokens);
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
      const float* row = args.centroid_scores + i * args.centroid_stride;
      const float step = args.steps[i];
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t b = 0; b < blocks; ++b) {
        ScanBlocksPortable(doc.blocks + b * ScanBlockBytes(args.code_bytes), 1, args.code_bytes,
                           args.levels + i * table_bytes, sums);
        const int64_t first = b * kScanBlockEntries;
        const int64_t valid = std::min(kScanBlockEntries, doc.num_tokens - first);
        for (int64_t t = 0; t < valid; ++t) {
          const float score = row[doc.centroid_ids[first + t]] + step * static_cast<float>(sums[t]);
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

}  // namespace tessera::internal
