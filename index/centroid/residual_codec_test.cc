// ResidualCodec against direct computation: bucket assignment by the cutoffs, decoding to the
// bucket means, lookup-table scores equal to inner products with the decoded residual, and the
// byte form.
#include "index/centroid/residual_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tessera::internal {
namespace {

std::vector<float> Gaussian(int64_t n, int64_t dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n * dim);
  // Each dimension its own spread, as in real embeddings.
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t d = 0; d < dim; ++d) {
      std::normal_distribution<float> normal(0.0f, 0.02f * (1 + d % 7));
      v[i * dim + d] = normal(rng);
    }
  }
  return v;
}

class ResidualCodecTest : public ::testing::TestWithParam<int> {};

TEST_P(ResidualCodecTest, BucketsAreQuantilesAndWeightsAreBucketMeans) {
  const int nbits = GetParam();
  // dim 10: the last byte is partly used; 133: Encode's blocks of 64 dimensions, the last partial.
  for (const int64_t dim : {10, 133}) {
    SCOPED_TRACE(dim);
    const int64_t n = 4000;
    const std::vector<float> x = Gaussian(n, dim, 1);
    absl::StatusOr<ResidualCodec> codec = ResidualCodec::Train(x.data(), n, dim, nbits);
    ASSERT_TRUE(codec.ok()) << codec.status();
    EXPECT_EQ(codec->code_bytes(), (dim * nbits + 7) / 8);
    const int buckets = 1 << nbits;
    std::vector<uint8_t> code(codec->code_bytes());
    std::vector<double> sum(dim * buckets, 0.0);
    std::vector<int64_t> count(dim * buckets, 0);
    for (int64_t i = 0; i < n; ++i) {
      codec->Encode(&x[i * dim], code.data());
      for (int64_t d = 0; d < dim; ++d) {
        const int bucket = (code[d * nbits / 8] >> (d * nbits % 8)) & (buckets - 1);
        // The bucket is the number of cutoffs at or below the value.
        int expected = 0;
        for (int b = 0; b + 1 < buckets; ++b) expected += x[i * dim + d] >= codec->cutoffs(d)[b];
        ASSERT_EQ(bucket, expected);
        sum[d * buckets + bucket] += x[i * dim + d];
        ++count[d * buckets + bucket];
      }
    }
    for (int64_t d = 0; d < dim; ++d) {
      for (int b = 0; b < buckets; ++b) {
        // Quantile cutoffs: every bucket holds about n / buckets training values.
        EXPECT_NEAR(count[d * buckets + b], static_cast<double>(n) / buckets,
                    static_cast<double>(n) / buckets * 0.05 + 2)
            << d << " " << b;
        EXPECT_NEAR(codec->weights(d)[b], sum[d * buckets + b] / count[d * buckets + b], 1e-6);
      }
    }
  }
}

TEST_P(ResidualCodecTest, LookupTableScoresEqualInnerProductsWithDecodedResiduals) {
  const int nbits = GetParam();
  const int64_t n = 2000, dim = 128;
  const std::vector<float> x = Gaussian(n, dim, 2);
  absl::StatusOr<ResidualCodec> codec = ResidualCodec::Train(x.data(), n, dim, nbits);
  ASSERT_TRUE(codec.ok()) << codec.status();
  const std::vector<float> queries = Gaussian(8, dim, 3);
  std::vector<float> lut(codec->nibbles() * 16);
  std::vector<uint8_t> code(codec->code_bytes());
  std::vector<float> decoded(dim);
  double error = 0.0, energy = 0.0;
  for (int q = 0; q < 8; ++q) {
    codec->BuildLookupTable(&queries[q * dim], lut.data());
    for (int64_t i = 0; i < 200; ++i) {
      codec->Encode(&x[i * dim], code.data());
      codec->Decode(code.data(), decoded.data());
      double direct = 0.0, table = 0.0;
      for (int64_t d = 0; d < dim; ++d) direct += double{queries[q * dim + d]} * decoded[d];
      for (int64_t j = 0; j < codec->code_bytes(); ++j) {
        table += lut[2 * j * 16 + (code[j] & 15)] + lut[(2 * j + 1) * 16 + (code[j] >> 4)];
      }
      ASSERT_NEAR(table, direct, 1e-5);
      if (q == 0) {
        for (int64_t d = 0; d < dim; ++d) {
          error += std::pow(decoded[d] - x[i * dim + d], 2);
          energy += std::pow(x[i * dim + d], 2);
        }
      }
    }
  }
  // Quantisation keeps most of the residual: a Gaussian's optimal 2-bit quantiser leaves 11.8%
  // of its energy, 4 bits 0.95%; equal-mass buckets with mean weights leave about 14.3% and 2.3%.
  EXPECT_LT(error / energy, nbits == 2 ? 0.15 : 0.03);
}

// An odd dim leaves the last nibble half (nbits 2) or wholly (nbits 4) without a dimension: its
// table values must be exactly the missing dimension's 0, whatever the tables' prior contents.
TEST_P(ResidualCodecTest, LookupTablesOfAnOddDimCountNothingForThePadding) {
  const int nbits = GetParam();
  const int64_t n = 1000, dim = 37;
  const std::vector<float> x = Gaussian(n, dim, 5);
  absl::StatusOr<ResidualCodec> codec = ResidualCodec::Train(x.data(), n, dim, nbits);
  ASSERT_TRUE(codec.ok()) << codec.status();
  const std::vector<float> query = Gaussian(1, dim, 6);
  std::vector<float> lut(codec->nibbles() * 16, 1e6f);
  codec->BuildLookupTable(query.data(), lut.data());
  std::vector<uint8_t> code(codec->code_bytes());
  std::vector<float> decoded(dim);
  for (int64_t i = 0; i < 100; ++i) {
    codec->Encode(&x[i * dim], code.data());
    // Set the padding bits (they are 0 in a code) to every value: the table must not see them.
    code.back() |= nbits == 4 ? 0xf0 : 0xfc;
    codec->Decode(code.data(), decoded.data());
    double direct = 0.0, table = 0.0;
    for (int64_t d = 0; d < dim; ++d) direct += double{query[d]} * decoded[d];
    for (int64_t j = 0; j < codec->code_bytes(); ++j) {
      table += lut[2 * j * 16 + (code[j] & 15)] + lut[(2 * j + 1) * 16 + (code[j] >> 4)];
    }
    ASSERT_NEAR(table, direct, 1e-5) << i;
  }
}

TEST_P(ResidualCodecTest, ByteFormRoundTrips) {
  const int nbits = GetParam();
  const std::vector<float> x = Gaussian(500, 16, 4);
  absl::StatusOr<ResidualCodec> codec = ResidualCodec::Train(x.data(), 500, 16, nbits);
  ASSERT_TRUE(codec.ok());
  std::string bytes = "prefix";
  codec->AppendTo(&bytes);
  size_t offset = 6;
  absl::StatusOr<ResidualCodec> parsed = ResidualCodec::Parse(bytes, &offset);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(offset, bytes.size());
  std::vector<uint8_t> a(codec->code_bytes()), b(codec->code_bytes());
  for (int i = 0; i < 500; ++i) {
    codec->Encode(&x[i * 16], a.data());
    parsed->Encode(&x[i * 16], b.data());
    ASSERT_EQ(a, b);
  }
  offset = 6;
  EXPECT_EQ(ResidualCodec::Parse(bytes.substr(0, bytes.size() - 1), &offset).status().code(),
            absl::StatusCode::kDataLoss);
}

INSTANTIATE_TEST_SUITE_P(Bits, ResidualCodecTest, ::testing::Values(2, 4));

TEST(ResidualCodec, CoarseningIsTheTwoBitCodecOfTheSameSample) {
  // dim 10: a code whose last byte is partly used, at both widths.
  const int64_t n = 4000, dim = 10;
  const std::vector<float> x = Gaussian(n, dim, 5);
  absl::StatusOr<ResidualCodec> fine = ResidualCodec::Train(x.data(), n, dim, 4);
  absl::StatusOr<ResidualCodec> two_bit = ResidualCodec::Train(x.data(), n, dim, 2);
  ASSERT_TRUE(fine.ok() && two_bit.ok());
  const ResidualCodec coarse = fine->Coarsened(2);
  ASSERT_EQ(coarse.nbits(), 2);
  ASSERT_EQ(coarse.code_bytes(), two_bit->code_bytes());
  for (int64_t d = 0; d < dim; ++d) {
    for (int j = 0; j < 3; ++j) {
      // The quantiles at 1/4, 2/4 and 3/4 of the same sorted sample.
      EXPECT_EQ(coarse.cutoffs(d)[j], two_bit->cutoffs(d)[j]) << "dim " << d << " cutoff " << j;
    }
    for (int j = 0; j < 4; ++j) {
      // Equal-mass buckets: the mean of the four means is the merged bucket's mean, up to ties.
      EXPECT_NEAR(coarse.weights(d)[j], two_bit->weights(d)[j],
                  1e-3 * std::abs(two_bit->weights(d)[j]) + 1e-6)
          << "dim " << d << " weight " << j;
    }
  }
  // Coarsening a code is encoding with the coarse codec, on the sample and on values outside it.
  std::vector<float> probe = Gaussian(500, dim, 6);
  for (int64_t d = 0; d < dim; ++d) probe[d] = coarse.cutoffs(d)[d % 3];  // exactly on a cutoff
  for (int64_t d = 0; d < dim; ++d) probe[dim + d] = (d % 2 ? 1.0f : -1.0f);
  std::vector<uint8_t> code(fine->code_bytes()), coarsened(coarse.code_bytes()),
      direct(coarse.code_bytes());
  for (int64_t i = 0; i < 500; ++i) {
    fine->Encode(&probe[i * dim], code.data());
    std::fill(coarsened.begin(), coarsened.end(), 0xff);
    fine->CoarsenCode(code.data(), 2, coarsened.data());
    coarse.Encode(&probe[i * dim], direct.data());
    ASSERT_EQ(coarsened, direct) << "row " << i;
  }
}

// The 1-bit coarsening (stage 1's scan) of a 4-bit and of a 2-bit codec trained on one sample:
// both split each dimension at the sample's median (the fine codecs' middle cutoff), with the
// means of the halves as weights, and coarsening a code is encoding with the coarse codec. dim 13:
// a last byte partly used at every width.
TEST(ResidualCodec, OneBitCoarseningSplitsEachDimensionAtItsMedian) {
  const int64_t n = 4000, dim = 13;
  const std::vector<float> x = Gaussian(n, dim, 8);
  std::vector<float> probe = Gaussian(500, dim, 9);
  for (const int fine_nbits : {4, 2}) {
    absl::StatusOr<ResidualCodec> fine = ResidualCodec::Train(x.data(), n, dim, fine_nbits);
    ASSERT_TRUE(fine.ok());
    const ResidualCodec coarse = fine->Coarsened(1);
    ASSERT_EQ(coarse.nbits(), 1);
    ASSERT_EQ(coarse.code_bytes(), 2);
    const int middle = (1 << fine_nbits) / 2;
    for (int64_t d = 0; d < dim; ++d) {
      std::vector<float> column(n);
      for (int64_t i = 0; i < n; ++i) column[i] = x[i * dim + d];
      std::sort(column.begin(), column.end());
      EXPECT_EQ(coarse.cutoffs(d)[0], column[n / 2]) << "dim " << d;
      EXPECT_EQ(coarse.cutoffs(d)[0], fine->cutoffs(d)[middle - 1]) << "dim " << d;
      // The halves' means (equal-mass buckets), up to the float sums' rounding.
      const int64_t half = n / 2;  // n is even: both halves hold `half` values
      double low = 0.0, high = 0.0;
      for (int64_t i = 0; i < half; ++i) low += column[i];
      for (int64_t i = half; i < n; ++i) high += column[i];
      EXPECT_NEAR(coarse.weights(d)[0], low / static_cast<double>(half), 1e-4) << "dim " << d;
      EXPECT_NEAR(coarse.weights(d)[1], high / static_cast<double>(half), 1e-4) << "dim " << d;
    }
    for (int64_t d = 0; d < dim; ++d) probe[d] = coarse.cutoffs(d)[0];  // exactly on the cutoff
    std::vector<uint8_t> code(fine->code_bytes()), coarsened(2), direct(2);
    for (int64_t i = 0; i < 500; ++i) {
      fine->Encode(&probe[i * dim], code.data());
      std::fill(coarsened.begin(), coarsened.end(), 0xff);
      fine->CoarsenCode(code.data(), 1, coarsened.data());
      coarse.Encode(&probe[i * dim], direct.data());
      ASSERT_EQ(coarsened, direct) << fine_nbits << " bits, row " << i;
    }
  }
}

// tests/fuzz/centroid_codebook_fuzzer found a codebook whose tables held a NaN (with a valid
// checksum): it parsed, and the NaN reached the quantisation of the search's lookup tables, a
// float → byte conversion that is undefined (corpus/centroid_codebook/regression-nan-weight).
TEST(ResidualCodec, ParseRejectsNonFiniteTables) {
  const int64_t dim = 4;
  const std::vector<float> x = Gaussian(100, dim, 5);
  absl::StatusOr<ResidualCodec> codec = ResidualCodec::Train(x.data(), 100, dim, 2);
  ASSERT_TRUE(codec.ok()) << codec.status();
  std::string bytes;
  codec->AppendTo(&bytes);
  const size_t first_cutoff = 12;  // after i64 dim, i32 nbits
  const size_t some_weight = first_cutoff + (dim * 3 + 5) * sizeof(float);
  for (const size_t at : {first_cutoff, some_weight}) {
    for (const float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity()}) {
      std::string damaged = bytes;
      std::memcpy(&damaged[at], &bad, sizeof(bad));
      size_t offset = 0;
      const absl::StatusOr<ResidualCodec> parsed = ResidualCodec::Parse(damaged, &offset);
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss) << at << " " << bad;
      EXPECT_NE(parsed.status().message().find("expected a finite value"), std::string::npos)
          << parsed.status();
    }
  }
}

TEST(ResidualCodec, ParseRejectsTablesLargerThanTheBytes) {
  std::string bytes;
  const int64_t dim = int64_t{1} << 20;  // the largest dim Parse takes: 120 MiB of tables
  const int32_t nbits = 4;
  bytes.append(reinterpret_cast<const char*>(&dim), sizeof(dim));
  bytes.append(reinterpret_cast<const char*>(&nbits), sizeof(nbits));
  size_t offset = 0;
  EXPECT_EQ(ResidualCodec::Parse(bytes, &offset).status().code(), absl::StatusCode::kDataLoss);
}

TEST(ResidualCodec, RejectsBadArguments) {
  const std::vector<float> x(16, 0.5f);
  EXPECT_EQ(ResidualCodec::Train(x.data(), 4, 4, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResidualCodec::Train(x.data(), 0, 4, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Constant values: every cutoff equal, nothing divides by zero.
  absl::StatusOr<ResidualCodec> codec = ResidualCodec::Train(x.data(), 4, 4, 2);
  ASSERT_TRUE(codec.ok());
  std::vector<uint8_t> code(codec->code_bytes());
  std::vector<float> decoded(4);
  codec->Encode(x.data(), code.data());
  codec->Decode(code.data(), decoded.data());
  for (float v : decoded) EXPECT_FLOAT_EQ(v, 0.5f);
}

}  // namespace
}  // namespace tessera::internal
