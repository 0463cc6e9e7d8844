// The residual quantiser of the centroid index: a vector is stored as its centroid and the residual
// (vector − centroid) coded in `nbits` ∈ {2, 4} bits per dimension (stage 1 may scan a coarsening
// of them to fewer bits, down to 1: Coarsened).
//
// Each dimension has its own 2^nbits buckets: cutoffs at the quantiles of that dimension's training
// residuals, and a decoded value (weight) per bucket equal to the mean training residual that fell
// in it. ColBERTv2 shares one set of cutoffs and weights across dimensions; per-dimension buckets
// cost nothing at search time (the lookup tables below absorb them) and follow each dimension's
// spread, which varies by an order of magnitude in real embeddings.
//
// Codes are packed little-endian within a byte: dimension d occupies bits
// [(d·nbits) mod 8, +nbits) of byte ⌊d·nbits / 8⌋; unused trailing bits are zero.
//
// Immutable after Train/Parse; every method is const and thread-safe.
#ifndef TESSERA_INDEX_CENTROID_RESIDUAL_CODEC_H_
#define TESSERA_INDEX_CENTROID_RESIDUAL_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera::internal {

class ResidualCodec {
 public:
  // residuals: n × dim fp32, row-major, n ≥ 1. INVALID_ARGUMENT for nbits ∉ {2, 4}, dim < 1 or
  // n < 1.
  static absl::StatusOr<ResidualCodec> Train(const float* residuals, int64_t n, int64_t dim,
                                             int nbits);
  // The bytes AppendTo wrote, starting at *offset (advanced past them). DATA_LOSS when malformed.
  static absl::StatusOr<ResidualCodec> Parse(absl::string_view bytes, size_t* offset);
  void AppendTo(std::string* out) const;

  int64_t dim() const { return dim_; }
  int nbits() const { return nbits_; }
  // Bytes of one vector's code: ⌈dim · nbits / 8⌉.
  int64_t code_bytes() const { return code_bytes_; }
  // 2^nbits − 1 ascending cutoffs of dimension d, and 2^nbits weights (decoded values).
  const float* cutoffs(int64_t d) const { return &cutoffs_[d * (buckets() - 1)]; }
  const float* weights(int64_t d) const { return &weights_[d * buckets()]; }

  // residual: dim values → code: code_bytes() bytes.
  void Encode(const float* residual, uint8_t* code) const;

  // The coarsening of this codec to nbits < nbits() bits (a 4-bit codec's to 2 or 1, a 2-bit
  // codec's to 1): coarse bucket j of dimension d merges this codec's buckets j·m … j·m + m − 1,
  // m = 2^(nbits() − nbits) (the cutoffs between them are the training's quantiles at j / 2^nbits,
  // which are an nbits codec's on the same sample), weighing each by the mean of their m weights
  // (buckets of equal mass on the sample). Its Encode(r) is CoarsenCode(Encode(r), nbits).
  ResidualCodec Coarsened(int nbits) const;
  // code: a code of this codec → out: Coarsened(nbits)'s code of the same residual, the top nbits
  // bits of each dimension's bucket (nbits < nbits()).
  void CoarsenCode(const uint8_t* code, int nbits, uint8_t* out) const;
  // code → out: dim values, the decoded residual.
  void Decode(const uint8_t* code, float* out) const;

  // Nibbles of one code (two per byte); nbits 1, 2 and 4 never split a dimension across two.
  int64_t nibbles() const { return 2 * code_bytes_; }
  // The per-nibble lookup tables of a query row, for scoring codes without decoding them
  // (code_scan.h): lut: nibbles() × 16 values, lut[n·16 + v] = Σ over the dimensions d packed in
  // nibble n (code bits [4n, 4n + 4)) of query[d] · weight(d, bits of d in v). Then ⟨query,
  // decoded residual of code⟩ = Σ_n lut[n·16 + nibble n of code] (up to fp32 rounding order).
  void BuildLookupTable(const float* query, float* lut) const;

 private:
  ResidualCodec(int64_t dim, int nbits, std::vector<float> cutoffs, std::vector<float> weights);
  int buckets() const { return 1 << nbits_; }

  int64_t dim_ = 0;
  int nbits_ = 0;
  int64_t code_bytes_ = 0;
  std::vector<float> cutoffs_;  // dim × (2^nbits − 1)
  // (2^nbits − 1) × dim: cutoffs_ transposed, so that Encode compares a cutoff across dimensions
  // in vector registers.
  std::vector<float> cutoffs_by_bucket_;
  std::vector<float> weights_;  // dim × 2^nbits
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_CENTROID_RESIDUAL_CODEC_H_
