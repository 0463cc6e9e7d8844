// The two stage-1 implementations through the Stage1Index interface: payloads derived as the shard
// derives them, documents out of Search best first (ties: lower iid), and the candidate index's
// per-token hits turned into documents as a brute-force reference does.
#include "index/stage1/stage1_index.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/common/thread_pool.h"
#include "index/stage1/candidate_stage1.h"
#include "index/stage1/centroid_stage1.h"

namespace tessera::internal {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kDim = 8;

std::vector<float> UnitRows(std::mt19937& rng, int64_t rows) {
  std::normal_distribution<float> normal;
  std::vector<float> values(rows * kDim);
  for (float& x : values) x = normal(rng);
  for (int64_t r = 0; r < rows; ++r) {
    double norm = 0;
    for (int64_t k = 0; k < kDim; ++k) norm += double{values[r * kDim + k]} * values[r * kDim + k];
    for (int64_t k = 0; k < kDim; ++k) values[r * kDim + k] /= static_cast<float>(std::sqrt(norm));
  }
  return values;
}

std::unique_ptr<CandidateStage1> ExactScan(const CandidateSpec& spec = CandidateSpec{}) {
  CandidateIndexOptions options;
  options.dim = kDim;
  options.factory = "Flat";
  absl::StatusOr<std::unique_ptr<CandidateIndex>> index = CandidateIndex::Create(options);
  EXPECT_TRUE(index.ok()) << index.status();
  return std::make_unique<CandidateStage1>(std::move(*index), kDim, spec, 0);
}

float Dot(const float* a, const float* b) {
  float sum = 0;
  for (int64_t k = 0; k < kDim; ++k) sum += a[k] * b[k];
  return sum;
}

// The candidate index's documents against the rule it documents, computed by brute force: per
// query token the k′ most similar candidate vectors (ties: lower document, then slot); a
// document's score sums, over tokens, its best similarity among them, or the token's k′-th.
TEST(CandidateStage1, SearchSumsEachTokensBestOrItsLastSimilarity) {
  std::mt19937 rng(7);
  std::unique_ptr<CandidateStage1> stage1 = ExactScan();
  std::map<uint64_t, std::vector<float>> documents;
  for (uint64_t iid = 1; iid <= 40; ++iid) {
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 4);
    documents[iid] = UnitRows(rng, rows);
    Stage1Payload payload;
    payload.candidates = MatrixFromFloat(documents[iid], rows, kDim, VectorDtype::kFloat32);
    ASSERT_TRUE(stage1->Add(iid, payload).ok());
  }
  const int64_t nq = 5;
  const std::vector<float> query = UnitRows(rng, nq);
  for (int per_token : {3, 10, 200}) {
    // The reference.
    std::map<uint64_t, std::vector<float>> best;
    std::vector<float> floor(nq, 0.0f);
    for (int64_t i = 0; i < nq; ++i) {
      struct Hit {
        float similarity;
        uint64_t doc;
        int64_t slot;
      };
      std::vector<Hit> hits;
      for (const auto& [iid, vectors] : documents) {
        for (int64_t v = 0; v < static_cast<int64_t>(vectors.size()) / kDim; ++v) {
          hits.push_back(Hit{Dot(&query[i * kDim], &vectors[v * kDim]), iid, v});
        }
      }
      std::sort(hits.begin(), hits.end(), [](const Hit& a, const Hit& b) {
        if (a.similarity != b.similarity) return a.similarity > b.similarity;
        return a.doc != b.doc ? a.doc < b.doc : a.slot < b.slot;
      });
      hits.resize(std::min<size_t>(hits.size(), per_token));
      floor[i] = hits.back().similarity;
      for (const Hit& hit : hits) {
        std::vector<float>& per_token_best = best[hit.doc];
        if (per_token_best.empty()) {
          per_token_best.assign(nq, -std::numeric_limits<float>::infinity());
        }
        per_token_best[i] = std::max(per_token_best[i], hit.similarity);
      }
    }
    std::vector<Stage1Hit> want;
    for (const auto& [iid, per_token_best] : best) {
      float score = 0;
      for (int64_t i = 0; i < nq; ++i) {
        score += std::isinf(per_token_best[i]) ? floor[i] : per_token_best[i];
      }
      want.push_back(Stage1Hit{iid, score});
    }
    std::sort(want.begin(), want.end(), [](const Stage1Hit& a, const Stage1Hit& b) {
      return a.score != b.score ? a.score > b.score : a.iid < b.iid;
    });
    want.resize(std::min<size_t>(want.size(), 12));

    Stage1Query request;
    request.query = FloatMatrixView{query.data(), nq, kDim};
    request.num_documents = 12;
    request.per_token = per_token;
    const absl::StatusOr<std::vector<Stage1Hit>> got = stage1->Search(request, nullptr, nullptr);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want.size()) << "k′ " << per_token;
    for (size_t r = 0; r < want.size(); ++r) {
      EXPECT_EQ((*got)[r].iid, want[r].iid) << "k′ " << per_token << ", rank " << r;
      EXPECT_NEAR((*got)[r].score, want[r].score, 1e-4) << "k′ " << per_token << ", rank " << r;
    }
  }
}

// Documents with the same vectors tie; the lower iid ranks first. The filter runs in the scan.
TEST(Stage1Index, TiesRankTheLowerIidFirstAndTheFilterRunsInside) {
  std::mt19937 rng(3);
  const std::vector<float> vectors = UnitRows(rng, 2);
  std::unique_ptr<CandidateStage1> stage1 = ExactScan();
  Stage1Payload payload;
  payload.candidates = MatrixFromFloat(vectors, 2, kDim, VectorDtype::kFloat32);
  for (uint64_t iid : {9, 4, 6}) ASSERT_TRUE(stage1->Add(iid, payload).ok());
  Stage1Query request;
  request.query = FloatMatrixView{vectors.data(), 1, kDim};
  absl::StatusOr<std::vector<Stage1Hit>> hits = stage1->Search(request, nullptr, nullptr);
  ASSERT_TRUE(hits.ok()) << hits.status();
  ASSERT_EQ(hits->size(), 3u);
  EXPECT_EQ((*hits)[0].iid, 4u);
  EXPECT_EQ((*hits)[1].iid, 6u);
  EXPECT_EQ((*hits)[2].iid, 9u);
  const std::function<bool(uint64_t)> odd = [](uint64_t iid) { return iid % 2 == 1; };
  hits = stage1->Search(request, &odd, nullptr);
  ASSERT_TRUE(hits.ok()) << hits.status();
  ASSERT_EQ(hits->size(), 1u);
  EXPECT_EQ((*hits)[0].iid, 9u);
  ASSERT_TRUE(stage1->Remove(4).ok());
  hits = stage1->Search(request, nullptr, nullptr);
  ASSERT_TRUE(hits.ok()) << hits.status();
  ASSERT_EQ(hits->size(), 2u);
  EXPECT_EQ((*hits)[0].iid, 6u);
  EXPECT_EQ(stage1->Stats().vectors, 4);
  EXPECT_EQ(stage1->Stats().name, "IDMap2,Flat");
  EXPECT_EQ(stage1->DefaultNumDocuments(10, 1'000'000), 100);

  Stage1Query wrong_dim = request;
  wrong_dim.query.cols = kDim - 1;
  EXPECT_TRUE(absl::IsInvalidArgument(stage1->Search(wrong_dim, nullptr, nullptr).status()));
}

// The candidate payload is CandidateVectors of the vectors as pooled (fp32), not of the stored
// fp16 rounding; without pooled vectors, of the stored ones. A value that is not finite is refused
// naming the document.
TEST(CandidateStage1, DerivesFromThePooledVectors) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  CandidateSpec spec;
  spec.pool_factor = 2;
  std::unique_ptr<CandidateStage1> stage1 = ExactScan(spec);
  std::vector<float> pooled = UnitRows(rng, 6);
  pooled[3] = 0.123456789f;  // rounds in fp16
  const StoredMatrix stored = MatrixFromFloat(pooled, 6, kDim, VectorDtype::kFloat16);
  const std::vector<Stage1Source> sources = {
      Stage1Source{"document 'a'", &stored, FloatMatrixView{pooled.data(), 6, kDim}},
      Stage1Source{"document 'b'", &stored, FloatMatrixView{}}};
  absl::StatusOr<std::vector<Stage1Payload>> payloads = stage1->Derive(sources, &pool);
  ASSERT_TRUE(payloads.ok()) << payloads.status();
  int64_t rows = 0;
  absl::StatusOr<std::vector<float>> want =
      CandidateVectors(FloatMatrixView{pooled.data(), 6, kDim}, spec, &rows);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(rows, 3);
  EXPECT_EQ(MatrixToFloat((*payloads)[0].candidates), *want);
  const std::vector<float> rounded = MatrixToFloat(stored);
  want = CandidateVectors(FloatMatrixView{rounded.data(), 6, kDim}, spec, &rows);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(MatrixToFloat((*payloads)[1].candidates), *want);
  EXPECT_TRUE((*payloads)[0].codes.centroids.empty());
  DocumentWrite write;
  stage1->Persist((*payloads)[0], &write);
  EXPECT_EQ(MatrixToFloat(write.candidates), MatrixToFloat((*payloads)[0].candidates));
  EXPECT_TRUE(write.codes.empty());

  pooled[kDim + 1] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Stage1Source> bad = {
      Stage1Source{"document 'bad'", &stored, FloatMatrixView{pooled.data(), 6, kDim}}};
  const absl::Status refused = stage1->Derive(bad, &pool).status();
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("document 'bad'"));
  EXPECT_THAT(refused.message(), HasSubstr("not finite"));
}

// The centroid payload is the codes of the stored vectors (EncodeOnPool); Persist stores them
// under the index's generation; Search answers what the CentroidIndex does.
TEST(CentroidStage1, DerivesCodesPersistsThemUnderItsGenerationAndSearches) {
  std::mt19937 rng(5);
  ThreadPool pool(2);
  const std::vector<float> sample = UnitRows(rng, 512);
  CentroidTrainingOptions options;
  options.num_centroids = 16;
  options.nbits = 4;
  absl::StatusOr<std::unique_ptr<CentroidCodebook>> codebook =
      CentroidCodebook::Train(FloatMatrixView{sample.data(), 512, kDim}, options, &pool);
  ASSERT_TRUE(codebook.ok()) << codebook.status();
  auto index = std::make_shared<CentroidIndex>(std::move(*codebook));
  CentroidStage1 stage1(index, 3);

  std::vector<StoredMatrix> stored;
  std::vector<std::string> names;
  for (int d = 0; d < 20; ++d) {
    stored.push_back(
        MatrixFromFloat(UnitRows(rng, 1 + d % 5), 1 + d % 5, kDim, VectorDtype::kFloat16));
    names.push_back(absl::StrCat("document '", d, "'"));
  }
  std::vector<Stage1Source> sources;
  for (int d = 0; d < 20; ++d) sources.push_back(Stage1Source{names[d], &stored[d], {}});
  absl::StatusOr<std::vector<Stage1Payload>> payloads = stage1.Derive(sources, &pool);
  ASSERT_TRUE(payloads.ok()) << payloads.status();
  for (int d = 0; d < 20; ++d) {
    const std::vector<float> values = MatrixToFloat(stored[d]);
    const DocumentCodes want = index->Encode(FloatMatrixView{values.data(), stored[d].rows, kDim});
    EXPECT_EQ((*payloads)[d].codes.centroids, want.centroids) << d;
    EXPECT_EQ((*payloads)[d].codes.codes, want.codes) << d;
    EXPECT_EQ((*payloads)[d].candidates.rows, 0) << d;
    ASSERT_TRUE(stage1.Add(100 + d, (*payloads)[d]).ok());
  }
  DocumentWrite write;
  stage1.Persist((*payloads)[0], &write);
  EXPECT_EQ(write.codes, SerializeDocumentCodes((*payloads)[0].codes));
  EXPECT_EQ(write.code_generation, 3u);
  EXPECT_EQ(write.candidates.rows, 0);

  const std::vector<float> query = UnitRows(rng, 3);
  Stage1Query request;
  request.query = FloatMatrixView{query.data(), 3, kDim};
  request.num_documents = 7;
  request.nprobe = 4;
  const absl::StatusOr<std::vector<Stage1Hit>> got = stage1.Search(request, nullptr, &pool);
  ASSERT_TRUE(got.ok()) << got.status();
  CentroidSearchOptions search;
  search.nprobe = 4;
  search.num_documents = 7;
  const absl::StatusOr<std::vector<CentroidHit>> want =
      index->Search(request.query, search, nullptr, &pool);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(got->size(), want->size());
  for (size_t r = 0; r < want->size(); ++r) {
    EXPECT_EQ((*got)[r].iid, (*want)[r].doc) << r;
    EXPECT_EQ((*got)[r].score, (*want)[r].score) << r;
  }
  EXPECT_EQ(stage1.Stats().name, "Centroid16,Residual4bit");
  EXPECT_EQ(stage1.Stats().vectors, index->Stats().vectors);
  EXPECT_EQ(stage1.DefaultNumDocuments(10, 1'000'000), DefaultNumCandidates(10, 1'000'000));
}

}  // namespace
}  // namespace tessera::internal
