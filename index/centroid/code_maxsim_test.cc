#include "index/centroid/code_maxsim.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/centroid/code_scan.h"
#include "index/centroid/residual_codec.h"
#include "index/kernels/cpu_kernels.h"

namespace tessera::internal {
namespace {

constexpr int64_t kCentroids = 97;

// A codebook (random centroids + a codec trained on random residuals), documents of random
// centroid ids and codes, and their decoded vectors.
struct Corpus {
  int64_t dim = 0;
  std::vector<float> centroids;  // kCentroids × dim
  std::vector<ResidualCodec> codec;
  std::vector<std::vector<uint32_t>> ids;
  std::vector<std::vector<uint8_t>> codes;  // n_tokens × code_bytes, row-major
  std::vector<std::vector<float>> decoded;  // n_tokens × dim: centroid + decoded residual
};

Corpus MakeCorpus(int64_t dim, int nbits, const std::vector<int64_t>& lengths, uint32_t seed) {
  Corpus corpus;
  corpus.dim = dim;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  corpus.centroids.resize(kCentroids * dim);
  for (float& v : corpus.centroids) v = normal(rng);
  // Residuals whose spread differs by dimension, as in real embeddings.
  std::vector<float> spread(dim);
  for (int64_t d = 0; d < dim; ++d) spread[d] = 0.05f + 0.5f * static_cast<float>(d % 7) / 7.0f;
  auto residual = [&](float* out) {
    for (int64_t d = 0; d < dim; ++d) out[d] = spread[d] * normal(rng);
  };
  std::vector<float> training(512 * dim);
  for (int64_t i = 0; i < 512; ++i) residual(&training[i * dim]);
  absl::StatusOr<ResidualCodec> codec = ResidualCodec::Train(training.data(), 512, dim, nbits);
  EXPECT_TRUE(codec.ok()) << codec.status();
  corpus.codec.push_back(*std::move(codec));
  const ResidualCodec& c = corpus.codec[0];
  std::uniform_int_distribution<uint32_t> pick(0, kCentroids - 1);
  std::vector<float> r(dim);
  for (const int64_t n : lengths) {
    std::vector<uint32_t> ids(n);
    std::vector<uint8_t> codes(n * c.code_bytes());
    std::vector<float> decoded(n * dim);
    for (int64_t t = 0; t < n; ++t) {
      ids[t] = pick(rng);
      residual(r.data());
      c.Encode(r.data(), &codes[t * c.code_bytes()]);
      c.Decode(&codes[t * c.code_bytes()], &decoded[t * dim]);
      for (int64_t d = 0; d < dim; ++d) decoded[t * dim + d] += corpus.centroids[ids[t] * dim + d];
    }
    corpus.ids.push_back(std::move(ids));
    corpus.codes.push_back(std::move(codes));
    corpus.decoded.push_back(std::move(decoded));
  }
  return corpus;
}

std::vector<float> RandomQuery(int64_t nq, int64_t dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> q(nq * dim);
  for (float& v : q) v = normal(rng) / std::sqrt(static_cast<float>(dim));
  return q;
}

// Stage 1's table: nq × C fp32 (computed in double here, then rounded).
std::vector<float> CentroidScores(const Corpus& corpus, const std::vector<float>& q, int64_t nq) {
  std::vector<float> out(nq * kCentroids);
  for (int64_t i = 0; i < nq; ++i) {
    for (int64_t c = 0; c < kCentroids; ++c) {
      double s = 0;
      for (int64_t d = 0; d < corpus.dim; ++d) {
        s += static_cast<double>(q[i * corpus.dim + d]) * corpus.centroids[c * corpus.dim + d];
      }
      out[i * kCentroids + c] = static_cast<float>(s);
    }
  }
  return out;
}

// Double-precision MaxSim of the decoded vectors.
double ReferenceMaxSim(const std::vector<float>& q, int64_t nq, const std::vector<float>& doc,
                       int64_t dim) {
  const int64_t n = static_cast<int64_t>(doc.size()) / dim;
  double total = 0;
  for (int64_t i = 0; i < nq; ++i) {
    double best = -INFINITY;
    for (int64_t t = 0; t < n; ++t) {
      double s = 0;
      for (int64_t d = 0; d < dim; ++d) {
        s += static_cast<double>(q[i * dim + d]) * doc[t * dim + d];
      }
      best = std::max(best, s);
    }
    total += best;
  }
  return total;
}

// fp32 rounding on top of the quantisation bound: of the fp32 lookup tables, centroid scores and
// sums, a few ulps of the magnitudes involved (Σ_i Σ_d |q_id| · (|c_d| + |r_d|) bounds every term).
double Fp32Slack(const std::vector<float>& q, int64_t nq, const Corpus& corpus) {
  double magnitude = 0;
  const ResidualCodec& codec = corpus.codec[0];
  for (int64_t d = 0; d < corpus.dim; ++d) {
    double c_max = 0;
    for (int64_t c = 0; c < kCentroids; ++c) {
      c_max = std::max(c_max, std::fabs(static_cast<double>(corpus.centroids[c * corpus.dim + d])));
    }
    double w_max = 0;
    for (int b = 0; b < (1 << codec.nbits()); ++b) {
      w_max = std::max(w_max, std::fabs(static_cast<double>(codec.weights(d)[b])));
    }
    for (int64_t i = 0; i < nq; ++i)
      magnitude += std::fabs(q[i * corpus.dim + d]) * (c_max + w_max);
  }
  return 1e-5 * magnitude + 1e-6;
}

std::vector<CpuIsa> SupportedIsas() {
  std::vector<CpuIsa> isas = {CpuIsa::kPortable};
  for (const CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (CpuSupportsIsa(isa)) isas.push_back(isa);
  }
  return isas;
}

// A document's ids and row-major codes as the store's view of them.
DocumentCodesView View(const uint32_t* ids, const uint8_t* codes, int64_t n) {
  return DocumentCodesView{n, reinterpret_cast<const char*>(ids), codes};
}

struct Shape {
  int64_t dim;
  int nbits;
};

class CompactMaxSimTest : public ::testing::TestWithParam<Shape> {};

// Every kernel the CPU has is within the documented bound of the double-precision MaxSim of the
// decoded vectors, for documents on and around the 32-token block size and every query-row
// remainder of the kernels' row groups (4 and 8), and all of them give bit-identical scores, from
// a token-major table and from the same table centroid-major.
TEST_P(CompactMaxSimTest, MatchesDecodedReferenceWithinBound) {
  const Shape shape = GetParam();
  const std::vector<int64_t> lengths = {1, 2, 31, 32, 33, 63, 64, 65, 100, 4096};
  const Corpus corpus =
      MakeCorpus(shape.dim, shape.nbits, lengths, 7 + shape.dim * 3 + shape.nbits);
  const ResidualCodec& codec = corpus.codec[0];
  CompactDocuments docs(codec.code_bytes());
  for (size_t d = 0; d < lengths.size(); ++d) {
    docs.Add(View(corpus.ids[d].data(), corpus.codes[d].data(), lengths[d]));
  }
  const std::vector<CompactDocument> refs = docs.refs();
  ASSERT_EQ(refs.size(), lengths.size());
  for (const int64_t nq : {1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 32, 64}) {
    const std::vector<float> q = RandomQuery(nq, shape.dim, static_cast<uint32_t>(nq));
    const std::vector<float> centroid_scores = CentroidScores(corpus, q, nq);
    const CompactQuery query(codec, q.data(), nq, centroid_scores.data(), kCentroids);
    // The same scores centroid-major (as Shard::ScoreCodes lays them out), rows padded to a
    // stride whose extra lanes hold NaN: a kernel that read them would give NaN scores.
    const int64_t stride = (nq + 15) / 16 * 16 + 16;
    std::vector<float> by_centroid(kCentroids * stride, NAN);
    for (int64_t i = 0; i < nq; ++i) {
      for (int64_t c = 0; c < kCentroids; ++c) {
        by_centroid[c * stride + i] = centroid_scores[i * kCentroids + c];
      }
    }
    const CompactQuery centroid_major(codec, q.data(), nq, by_centroid.data(), /*row_stride=*/1,
                                      /*centroid_stride=*/stride);
    const double tolerance = query.ErrorBound() + Fp32Slack(q, nq, corpus);
    std::vector<float> expected(refs.size());
    for (const CpuIsa isa : SupportedIsas()) {
      std::vector<float> scores(refs.size(), NAN);
      ASSERT_TRUE(ScoreCompactDocuments(query, refs, scores.data(), isa).ok());
      // Scored where they are stored, laid out batch by batch: the same scores, bit for bit
      // (the 4,096-token document and the ones around it span several batches).
      std::vector<DocumentCodesView> stored;
      for (size_t d = 0; d < lengths.size(); ++d) {
        stored.push_back(View(corpus.ids[d].data(), corpus.codes[d].data(), lengths[d]));
      }
      std::vector<float> stored_scores(refs.size(), NAN);
      ASSERT_TRUE(ScoreStoredCodes(query, stored, stored_scores.data(), isa).ok());
      EXPECT_EQ(stored_scores, scores) << "isa " << CpuIsaName(isa) << ", nq " << nq;
      std::vector<float> centroid_major_scores(refs.size(), NAN);
      ASSERT_TRUE(
          ScoreCompactDocuments(centroid_major, refs, centroid_major_scores.data(), isa).ok());
      for (size_t d = 0; d < refs.size(); ++d) {
        EXPECT_EQ(centroid_major_scores[d], scores[d])
            << "isa " << CpuIsaName(isa) << ", nq " << nq << ", " << lengths[d]
            << " tokens: the centroid-major table scores differently";
      }
      for (size_t d = 0; d < refs.size(); ++d) {
        const std::string where =
            absl::StrCat("isa ", CpuIsaName(isa), ", dim ", shape.dim, ", nbits ", shape.nbits,
                         ", nq ", nq, ", ", lengths[d], " tokens");
        const double reference = ReferenceMaxSim(q, nq, corpus.decoded[d], shape.dim);
        EXPECT_NEAR(scores[d], reference, tolerance) << where;
        if (isa == CpuIsa::kPortable) {
          expected[d] = scores[d];
        } else {
          EXPECT_EQ(scores[d], expected[d]) << where << ": differs from the portable kernel";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CompactMaxSimTest,
                         ::testing::Values(Shape{1, 2}, Shape{1, 4}, Shape{3, 2}, Shape{3, 4},
                                           Shape{7, 2}, Shape{7, 4}, Shape{96, 2}, Shape{96, 4},
                                           Shape{127, 2}, Shape{127, 4}, Shape{128, 2},
                                           Shape{128, 4}, Shape{130, 2}, Shape{130, 4}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return absl::StrCat("dim", info.param.dim, "_nbits", info.param.nbits);
                         });

// The bound is a real one: at dim 128 it is a small fraction of the score, and the kernel's error
// uses a good part of it only in the worst case (here: well under the bound, but not zero).
TEST(CompactMaxSim, BoundIsSmallAgainstTheScore) {
  for (const int nbits : {2, 4}) {
    const Corpus corpus = MakeCorpus(128, nbits, {64}, 11);
    const std::vector<float> q = RandomQuery(32, 128, 5);
    const std::vector<float> centroid_scores = CentroidScores(corpus, q, 32);
    const CompactQuery query(corpus.codec[0], q.data(), 32, centroid_scores.data(), kCentroids);
    const double reference = ReferenceMaxSim(q, 32, corpus.decoded[0], 128);
    EXPECT_GT(query.ErrorBound(), 0.0) << "nbits " << nbits;
    EXPECT_LT(query.ErrorBound(), 0.05 * std::fabs(reference))
        << "nbits " << nbits << ": bound " << query.ErrorBound() << ", score " << reference;
  }
}

class CompactMaxSimIsaTest : public ::testing::TestWithParam<CpuIsa> {};

// Over 200 random documents, each kernel's top 10 is the reference's, except where two documents'
// reference scores are within twice the bound (a near-tie the quantisation may flip).
TEST_P(CompactMaxSimIsaTest, TopTenMatchesReferenceExceptNearTies) {
  const CpuIsa isa = GetParam();
  if (!CpuSupportsIsa(isa)) GTEST_SKIP() << "this CPU lacks " << CpuIsaName(isa);
  for (const int nbits : {2, 4}) {
    std::mt19937 rng(3);
    std::uniform_int_distribution<int64_t> length(1, 100);
    std::vector<int64_t> lengths(200);
    for (int64_t& n : lengths) n = length(rng);
    const Corpus corpus = MakeCorpus(128, nbits, lengths, 13 + nbits);
    CompactDocuments docs(corpus.codec[0].code_bytes());
    for (size_t d = 0; d < lengths.size(); ++d) {
      docs.Add(View(corpus.ids[d].data(), corpus.codes[d].data(), lengths[d]));
    }
    const std::vector<float> q = RandomQuery(32, 128, 17);
    const std::vector<float> centroid_scores = CentroidScores(corpus, q, 32);
    const CompactQuery query(corpus.codec[0], q.data(), 32, centroid_scores.data(), kCentroids);
    const double tie = 2 * (query.ErrorBound() + Fp32Slack(q, 32, corpus));
    std::vector<double> reference(lengths.size());
    for (size_t d = 0; d < lengths.size(); ++d) {
      reference[d] = ReferenceMaxSim(q, 32, corpus.decoded[d], 128);
    }
    auto top10 = [](const auto& scores) {
      std::vector<int> order(scores.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return scores[a] > scores[b]; });
      order.resize(10);
      return order;
    };
    const std::vector<int> want = top10(reference);
    {
      std::vector<float> scores(lengths.size());
      ASSERT_TRUE(ScoreCompactDocuments(query, docs.refs(), scores.data(), isa).ok());
      const std::vector<int> got = top10(scores);
      int differences = 0;
      for (int k = 0; k < 10; ++k) {
        if (got[k] == want[k]) continue;
        ++differences;
        EXPECT_LE(std::fabs(reference[got[k]] - reference[want[k]]), tie)
            << "isa " << CpuIsaName(isa) << ", nbits " << nbits << ": rank " << k << " is document "
            << got[k] << " (reference " << reference[got[k]] << "), expected document " << want[k]
            << " (reference " << reference[want[k]] << "), near-tie margin " << tie;
      }
      // Near-ties are the exception: most of the ranking is the reference's.
      EXPECT_LE(differences, 4) << "isa " << CpuIsaName(isa) << ", nbits " << nbits;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, CompactMaxSimIsaTest,
                         ::testing::Values(CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512),
                         [](const ::testing::TestParamInfo<CpuIsa>& info) {
                           return std::string(CpuIsaName(info.param));
                         });

// CompactDocuments lays codes out as stage 1's lists (PutBlockedCode), padding slots zero (also in
// a buffer reused after Clear), for token counts and code sizes on and around its 16 × 16
// transpose tiles.
TEST(CompactDocuments, LayoutIsTheListLayout) {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> byte(0, 255);
  for (const int64_t code_bytes : {1, 15, 16, 17, 32, 33, 64, 65}) {
    CompactDocuments docs(code_bytes);
    const std::vector<int64_t> lengths = {1, 15, 16, 17, 31, 32, 33, 48, 100};
    std::vector<std::vector<uint8_t>> codes;
    const std::vector<uint32_t> ids(100, 0);
    for (const int64_t n : lengths) {
      codes.emplace_back(n * code_bytes);
      for (uint8_t& b : codes.back()) b = static_cast<uint8_t>(byte(rng));
    }
    // Laid out once in reverse, cleared, then in order: the reused buffer's padding slots held
    // other documents' bytes, and must be zero again.
    for (size_t d = lengths.size(); d-- > 0;)
      docs.Add(View(ids.data(), codes[d].data(), lengths[d]));
    docs.Clear();
    for (size_t d = 0; d < lengths.size(); ++d) {
      docs.Add(View(ids.data(), codes[d].data(), lengths[d]));
    }
    const std::vector<CompactDocument> refs = docs.refs();
    ASSERT_EQ(refs.size(), lengths.size());
    for (size_t d = 0; d < lengths.size(); ++d) {
      const int64_t blocks = (lengths[d] + 31) / 32;
      std::vector<uint8_t> want(blocks * 32 * code_bytes, 0);
      for (int64_t t = 0; t < lengths[d]; ++t) {
        PutBlockedCode(&codes[d][t * code_bytes], code_bytes, t, want.data());
      }
      const std::vector<uint8_t> got(refs[d].blocks, refs[d].blocks + want.size());
      EXPECT_EQ(got, want) << "code_bytes " << code_bytes << ", " << lengths[d] << " tokens";
    }
  }
}

TEST(CompactMaxSim, RejectsEmptyDocumentsAndMissingIsas) {
  const Corpus corpus = MakeCorpus(8, 4, {3}, 1);
  const std::vector<float> q = RandomQuery(2, 8, 1);
  const std::vector<float> centroid_scores = CentroidScores(corpus, q, 2);
  const CompactQuery query(corpus.codec[0], q.data(), 2, centroid_scores.data(), kCentroids);
  CompactDocuments docs(corpus.codec[0].code_bytes());
  docs.Add(View(corpus.ids[0].data(), corpus.codes[0].data(), 3));
  std::vector<CompactDocument> refs = docs.refs();
  refs.push_back(CompactDocument{refs[0].centroid_ids, refs[0].blocks, 0});
  float scores[2];
  const absl::Status empty = ScoreCompactDocuments(query, refs, scores);
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument) << empty;
  EXPECT_THAT(empty.message(), ::testing::HasSubstr("compact document 1: 0 tokens"));
  const std::vector<DocumentCodesView> stored = {
      View(corpus.ids[0].data(), corpus.codes[0].data(), 3),
      View(corpus.ids[0].data(), nullptr, 3)};
  const absl::Status null_codes = ScoreStoredCodes(query, stored, scores);
  EXPECT_EQ(null_codes.code(), absl::StatusCode::kInvalidArgument) << null_codes;
  EXPECT_THAT(null_codes.message(),
              ::testing::HasSubstr("stored codes of document 1: 3 tokens (ids set, codes null)"));
  for (const CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (CpuSupportsIsa(isa)) continue;
    const absl::Status missing = ScoreCompactDocuments(query, {refs[0]}, scores, isa);
    EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition) << missing;
  }
}

}  // namespace
}  // namespace tessera::internal
