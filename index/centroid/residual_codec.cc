#include "index/centroid/residual_codec.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera::internal {
namespace {

template <typename T>
void AppendPod(const T& value, std::string* out) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <typename T>
bool ReadPod(absl::string_view bytes, size_t* offset, T* value) {
  if (*offset > bytes.size() || bytes.size() - *offset < sizeof(T)) return false;
  std::memcpy(value, bytes.data() + *offset, sizeof(T));
  *offset += sizeof(T);
  return true;
}

// Per byte of `from`-bit fields (8 / from of them): the top `to` bits of each, packed in field
// order into 8 · to / from bits. One table per coarsening the codecs allow (4 → 2, 4 → 1, 2 → 1).
const std::array<uint8_t, 256>& TopBitsTable(int from, int to) {
  const auto make = [](int from, int to) {
    std::array<uint8_t, 256> table{};
    for (int byte = 0; byte < 256; ++byte) {
      int packed = 0;
      for (int field = 0; field < 8 / from; ++field) {
        const int value = (byte >> (field * from)) & ((1 << from) - 1);
        packed |= (value >> (from - to)) << (field * to);
      }
      table[byte] = static_cast<uint8_t>(packed);
    }
    return table;
  };
  static const std::array<uint8_t, 256> kFourToTwo = make(4, 2);
  static const std::array<uint8_t, 256> kFourToOne = make(4, 1);
  static const std::array<uint8_t, 256> kTwoToOne = make(2, 1);
  if (from == 4) return to == 2 ? kFourToTwo : kFourToOne;
  return kTwoToOne;
}

// out[j] = the looked-up bits of code bytes j · 8 / kWidth onwards, kWidth bits each, in order
// (bytes past the code's end count as none).
template <int kWidth>
void PackTopBits(const std::array<uint8_t, 256>& top, const uint8_t* code, int64_t code_bytes,
                 int64_t out_bytes, uint8_t* out) {
  constexpr int kPerByte = 8 / kWidth;
  for (int64_t j = 0; j < out_bytes; ++j) {
    const int64_t first = j * kPerByte;
    int packed = 0;
    if (first + kPerByte <= code_bytes) {
      for (int k = 0; k < kPerByte; ++k) packed |= top[code[first + k]] << (k * kWidth);
    } else {
      for (int k = 0; first + k < code_bytes; ++k) packed |= top[code[first + k]] << (k * kWidth);
    }
    out[j] = static_cast<uint8_t>(packed);
  }
}

}  // namespace

ResidualCodec::ResidualCodec(int64_t dim, int nbits, std::vector<float> cutoffs,
                             std::vector<float> weights)
    : dim_(dim),
      nbits_(nbits),
      code_bytes_((dim * nbits + 7) / 8),
      cutoffs_(std::move(cutoffs)),
      weights_(std::move(weights)) {
  const int cuts = buckets() - 1;
  cutoffs_by_bucket_.resize(cutoffs_.size());
  for (int64_t d = 0; d < dim_; ++d) {
    for (int b = 0; b < cuts; ++b) cutoffs_by_bucket_[b * dim_ + d] = cutoffs_[d * cuts + b];
  }
}

absl::StatusOr<ResidualCodec> ResidualCodec::Train(const float* residuals, int64_t n, int64_t dim,
                                                   int nbits) {
  if (nbits != 2 && nbits != 4) {
    return absl::InvalidArgumentError(absl::StrCat("residual nbits ", nbits, ", expected 2 or 4"));
  }
  if (dim < 1 || n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("residual codec training: ", n, " × ", dim, " residuals, expected ≥ 1 × 1"));
  }
  const int buckets = 1 << nbits;
  std::vector<float> cutoffs(dim * (buckets - 1));
  std::vector<float> weights(dim * buckets);
  std::vector<float> column(n);
  for (int64_t d = 0; d < dim; ++d) {
    for (int64_t i = 0; i < n; ++i) column[i] = residuals[i * dim + d];
    std::sort(column.begin(), column.end());
    float* cut = &cutoffs[d * (buckets - 1)];
    for (int b = 1; b < buckets; ++b)
      cut[b - 1] = column[std::min<int64_t>(n - 1, b * n / buckets)];
    // The weight of a bucket is the mean of the values Encode would put in it (value ≥ cutoff
    // goes up), so that decoding is unbiased on the training sample.
    int64_t begin = 0;
    for (int b = 0; b < buckets; ++b) {
      int64_t end =
          b + 1 < buckets
              ? std::lower_bound(column.begin() + begin, column.end(), cut[b]) - column.begin()
              : n;
      double sum = 0.0;
      for (int64_t i = begin; i < end; ++i) sum += column[i];
      float weight;
      if (end > begin) {
        weight = static_cast<float>(sum / static_cast<double>(end - begin));
      } else {
        // An empty bucket (repeated values): its cutoff is as good a value as any.
        weight = b == 0 ? cut[0] : cut[b - 1];
      }
      weights[d * buckets + b] = weight;
      begin = end;
    }
  }
  return ResidualCodec(dim, nbits, std::move(cutoffs), std::move(weights));
}

void ResidualCodec::AppendTo(std::string* out) const {
  AppendPod(static_cast<int64_t>(dim_), out);
  AppendPod(static_cast<int32_t>(nbits_), out);
  out->append(reinterpret_cast<const char*>(cutoffs_.data()), cutoffs_.size() * sizeof(float));
  out->append(reinterpret_cast<const char*>(weights_.data()), weights_.size() * sizeof(float));
}

absl::StatusOr<ResidualCodec> ResidualCodec::Parse(absl::string_view bytes, size_t* offset) {
  int64_t dim = 0;
  int32_t nbits = 0;
  if (!ReadPod(bytes, offset, &dim) || !ReadPod(bytes, offset, &nbits) || dim < 1 ||
      dim > (int64_t{1} << 20) || (nbits != 2 && nbits != 4)) {
    return absl::DataLossError("residual codec: malformed header");
  }
  const int buckets = 1 << nbits;
  // Checked before allocating, so that a garbage dim cannot ask for more than the bytes hold.
  const size_t need = static_cast<size_t>(dim) * (2 * buckets - 1) * sizeof(float);
  if (bytes.size() - *offset < need) {
    return absl::DataLossError(absl::StrCat("residual codec: ", bytes.size() - *offset,
                                            " bytes of tables, expected ", need));
  }
  std::vector<float> cutoffs(dim * (buckets - 1));
  std::vector<float> weights(dim * buckets);
  std::memcpy(cutoffs.data(), bytes.data() + *offset, cutoffs.size() * sizeof(float));
  *offset += cutoffs.size() * sizeof(float);
  std::memcpy(weights.data(), bytes.data() + *offset, weights.size() * sizeof(float));
  *offset += weights.size() * sizeof(float);
  // Training only ever writes finite tables; a NaN or infinity would poison every lookup table
  // built from them (and their quantisation to bytes).
  for (const std::vector<float>* table : {&cutoffs, &weights}) {
    for (size_t i = 0; i < table->size(); ++i) {
      if (!std::isfinite((*table)[i])) {
        return absl::DataLossError(
            absl::StrCat("residual codec: ", table == &cutoffs ? "cutoff " : "weight ", i, " is ",
                         (*table)[i], ", expected a finite value"));
      }
    }
  }
  return ResidualCodec(dim, nbits, std::move(cutoffs), std::move(weights));
}

void ResidualCodec::Encode(const float* residual, uint8_t* code) const {
  std::memset(code, 0, code_bytes_);
  const int cuts = buckets() - 1;
  // Each dimension's bucket is the number of its cutoffs at or below the value (ascending
  // cutoffs), counted a cutoff at a time over a block of dimensions: compares the compiler runs
  // across the block in vector registers (a dimension at a time, over its cutoffs, was 6% of a
  // compact build's CPU).
  constexpr int64_t kBlock = 64;
  int32_t bucket[kBlock];
  for (int64_t d0 = 0; d0 < dim_; d0 += kBlock) {
    const int64_t width = std::min(kBlock, dim_ - d0);
    std::fill(bucket, bucket + width, 0);
    for (int b = 0; b < cuts; ++b) {
      const float* cut = &cutoffs_by_bucket_[b * dim_ + d0];
      for (int64_t k = 0; k < width; ++k) bucket[k] += residual[d0 + k] >= cut[k] ? 1 : 0;
    }
    for (int64_t k = 0; k < width; ++k) {
      const int64_t bit = (d0 + k) * nbits_;
      code[bit >> 3] |= static_cast<uint8_t>(bucket[k] << (bit & 7));
    }
  }
}

ResidualCodec ResidualCodec::Coarsened(int nbits) const {
  const int merged = 1 << (nbits_ - nbits);  // fine buckets per coarse one
  const int coarse_buckets = 1 << nbits;
  std::vector<float> coarse_cutoffs(dim_ * (coarse_buckets - 1));
  std::vector<float> coarse_weights(dim_ * coarse_buckets);
  for (int64_t d = 0; d < dim_; ++d) {
    for (int j = 0; j < coarse_buckets; ++j) {
      if (j + 1 < coarse_buckets) {
        coarse_cutoffs[d * (coarse_buckets - 1) + j] = cutoffs(d)[merged * (j + 1) - 1];
      }
      const float* w = weights(d) + merged * j;
      float sum = 0.0f;
      for (int b = 0; b < merged; ++b) sum += w[b];
      coarse_weights[d * coarse_buckets + j] = sum / static_cast<float>(merged);
    }
  }
  return ResidualCodec(dim_, nbits, std::move(coarse_cutoffs), std::move(coarse_weights));
}

void ResidualCodec::CoarsenCode(const uint8_t* code, int nbits, uint8_t* out) const {
  // A byte of this code holds 8 / nbits_ whole dimensions, each of which gives its top nbits bits:
  // 8 · nbits / nbits_ bits of the result per byte, looked up (a per-dimension loop made opening a
  // 1M-document shard, which lists 64M codes, take 54–61 s instead of 31–33 on Xeon-2).
  const std::array<uint8_t, 256>& top = TopBitsTable(nbits_, nbits);
  const int64_t out_bytes = (dim_ * nbits + 7) / 8;
  if (8 * nbits / nbits_ == 4) {
    PackTopBits<4>(top, code, code_bytes_, out_bytes, out);
  } else {
    PackTopBits<2>(top, code, code_bytes_, out_bytes, out);
  }
}

void ResidualCodec::Decode(const uint8_t* code, float* out) const {
  const int mask = buckets() - 1;
  for (int64_t d = 0; d < dim_; ++d) {
    const int64_t bit = d * nbits_;
    out[d] = weights(d)[(code[bit >> 3] >> (bit & 7)) & mask];
  }
}

void ResidualCodec::BuildLookupTable(const float* query, float* lut) const {
  // nbits 4 and 2 (the index's widths) get loops the compiler vectorises: a stage-1 scan and a
  // compact rerank build these tables for every query row (dim 384 at 4 bits: 6,144 values a row),
  // which the generic loop's indexed loads made a visible share of a small collection's query.
  if (nbits_ == 4) {
    for (int64_t d = 0; d < dim_; ++d) {
      const float q = query[d];
      const float* w = weights(d);
      float* row = lut + d * 16;
      for (int v = 0; v < 16; ++v) row[v] = q * w[v];
    }
    std::fill(lut + dim_ * 16, lut + nibbles() * 16, 0.0f);  // an odd dim's padding nibble
    return;
  }
  if (nbits_ == 2) {
    // Nibble n holds dimensions 2n (bits 0–1) and 2n + 1 (bits 2–3; none past an odd dim).
    for (int64_t n = 0; n < nibbles(); ++n) {
      float low[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      float high[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (2 * n < dim_) {
        for (int b = 0; b < 4; ++b) low[b] = query[2 * n] * weights(2 * n)[b];
      }
      if (2 * n + 1 < dim_) {
        for (int b = 0; b < 4; ++b) high[b] = query[2 * n + 1] * weights(2 * n + 1)[b];
      }
      float* row = lut + n * 16;
      for (int h = 0; h < 4; ++h) {
        for (int b = 0; b < 4; ++b) row[h * 4 + b] = low[b] + high[h];
      }
    }
    return;
  }
  const int per_nibble = 4 / nbits_;
  const int mask = buckets() - 1;
  for (int64_t n = 0; n < nibbles(); ++n) {
    float* row = lut + n * 16;
    std::fill(row, row + 16, 0.0f);
    for (int t = 0; t < per_nibble; ++t) {
      const int64_t d = n * per_nibble + t;
      if (d >= dim_) break;
      const float* w = weights(d);
      const float q = query[d];
      const int shift = t * nbits_;
      for (int v = 0; v < 16; ++v) row[v] += q * w[(v >> shift) & mask];
    }
  }
}

}  // namespace tessera::internal
