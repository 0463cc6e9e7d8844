// Tests for the CUDA MaxSim scorer against the CPU scorer (the reference backend): random shapes
// (document lengths 1…2,048 within one batch, dims 64/96/128/320, 1…64 query tokens, fp16 and
// fp32 storage), tile boundaries, long queries, exact ties, chunking under a memory budget and
// concurrent callers. Without a visible device every case skips, except the one that checks what
// the factory reports.
#include "tessera/cuda_maxsim.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/float16.h"
#include "tessera/maxsim.h"

#ifndef TESSERA_CUDA_BUILD
#define TESSERA_CUDA_BUILD 0
#endif

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

#define SKIP_WITHOUT_CUDA_DEVICE()                                                           \
  do {                                                                                       \
    if (!CudaDeviceAvailable()) {                                                            \
      GTEST_SKIP() << (TESSERA_CUDA_BUILD ? "no CUDA device visible"                         \
                                          : "built without CUDA (TESSERA_ENABLE_CUDA=OFF)"); \
    }                                                                                        \
  } while (0)

// Scores within kFp16RelativeTolerance (fp16 storage) or kFp32RelativeTolerance of the CPU
// scorer, relative to max(|score|, 1% of the Cauchy–Schwarz bound Σ_i ‖q_i‖·max_j ‖d_j‖) so that
// scores that happen to be near zero are not held to a relative bound.
constexpr double kFp16RelativeTolerance = 1e-3;
constexpr double kFp32RelativeTolerance = 1e-4;
// Two document tokens count as tied for a query token when their similarities differ by at most
// this fraction of Σ_k |q_k·d_k| (fp32 rounding of either backend is far below it).
constexpr double kNearTieTolerance = 1e-4;

struct OwnedDocs {
  VectorDtype dtype = VectorDtype::kFloat16;
  int64_t dim = 0;
  std::vector<std::vector<float>> values;    // per document, num_tokens × dim (decoded fp16)
  std::vector<std::vector<Float16>> halves;  // fp16 storage
  std::vector<DocumentRef> refs;

  void Add(std::vector<float> tokens) {
    if (dtype == VectorDtype::kFloat16) {
      std::vector<Float16> h(tokens.size());
      for (size_t i = 0; i < tokens.size(); ++i) {
        h[i] = FloatToHalf(tokens[i]);
        tokens[i] = HalfToFloat(h[i]);
      }
      halves.push_back(std::move(h));
    }
    values.push_back(std::move(tokens));
  }

  int64_t num_tokens(size_t d) const { return static_cast<int64_t>(values[d].size()) / dim; }

  // Call after the last Add.
  DocumentBatch Batch() {
    refs.clear();
    for (size_t d = 0; d < values.size(); ++d) {
      DocumentRef ref;
      ref.num_tokens = num_tokens(d);
      ref.data = dtype == VectorDtype::kFloat16 ? static_cast<const void*>(halves[d].data())
                                                : static_cast<const void*>(values[d].data());
      refs.push_back(ref);
    }
    DocumentBatch batch;
    batch.dtype = dtype;
    batch.dim = dim;
    batch.docs = refs;
    return batch;
  }
};

std::vector<float> RandomValues(std::mt19937& rng, int64_t count, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

// Rows of unit length, like the embeddings the server stores.
std::vector<float> RandomUnitRows(std::mt19937& rng, int64_t rows, int64_t dim) {
  std::vector<float> v = RandomValues(rng, rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    double norm = 0;
    for (int64_t k = 0; k < dim; ++k) norm += double{v[r * dim + k]} * v[r * dim + k];
    const float inv = static_cast<float>(1.0 / std::sqrt(std::max(norm, 1e-30)));
    for (int64_t k = 0; k < dim; ++k) v[r * dim + k] *= inv;
  }
  return v;
}

std::unique_ptr<MaxSimScorer> CpuScorer() {
  absl::StatusOr<std::unique_ptr<MaxSimScorer>> scorer = NewCpuMaxSimScorer();
  EXPECT_TRUE(scorer.ok()) << scorer.status();
  return scorer.ok() ? *std::move(scorer) : nullptr;
}

std::unique_ptr<MaxSimScorer> GpuScorer(CudaMaxSimKernel kernel = CudaMaxSimKernel::kAuto,
                                        size_t budget = 0, size_t staging = 0) {
  CudaMaxSimOptions options;
  options.kernel = kernel;
  options.memory_budget_bytes = budget;
  options.pinned_staging_bytes = staging;
  absl::StatusOr<std::unique_ptr<MaxSimScorer>> scorer = NewCudaMaxSimScorer(options);
  EXPECT_TRUE(scorer.ok()) << scorer.status();
  return scorer.ok() ? *std::move(scorer) : nullptr;
}

double Dot(const float* a, const float* b, int64_t dim, double* abs_sum) {
  double dot = 0, sum = 0;
  for (int64_t k = 0; k < dim; ++k) {
    const double p = double{a[k]} * b[k];
    dot += p;
    sum += std::fabs(p);
  }
  *abs_sum = sum;
  return dot;
}

double Norm(const float* a, int64_t dim) {
  double s = 0;
  for (int64_t k = 0; k < dim; ++k) s += double{a[k]} * a[k];
  return std::sqrt(s);
}

// Indices of the k best documents: score descending, index ascending on equal scores.
std::vector<int64_t> TopK(const std::vector<float>& scores, size_t k) {
  std::vector<int64_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  order.resize(std::min(k, order.size()));
  return order;
}

// Compares the GPU result with the CPU result for the same inputs; returns the number of failures
// (each also reported through gtest).
int ExpectMatchesCpu(const MaxSimResult& gpu, const MaxSimResult& cpu,
                     const std::vector<float>& query, int64_t nq, const OwnedDocs& docs,
                     const std::string& what) {
  const size_t num_docs = docs.values.size();
  const int64_t dim = docs.dim;
  EXPECT_EQ(gpu.scores.size(), num_docs) << what;
  EXPECT_EQ(gpu.best_tokens.size(), cpu.best_tokens.size()) << what;
  if (gpu.scores.size() != num_docs || gpu.best_tokens.size() != cpu.best_tokens.size()) return 1;
  const double relative =
      docs.dtype == VectorDtype::kFloat16 ? kFp16RelativeTolerance : kFp32RelativeTolerance;
  double query_norms = 0;
  for (int64_t i = 0; i < nq; ++i) query_norms += Norm(&query[i * dim], dim);

  int failures = 0;
  std::vector<double> tolerance(num_docs);
  for (size_t d = 0; d < num_docs; ++d) {
    double max_norm = 0;
    for (int64_t j = 0; j < docs.num_tokens(d); ++j) {
      max_norm = std::max(max_norm, Norm(&docs.values[d][j * dim], dim));
    }
    const double bound = query_norms * max_norm;
    tolerance[d] = relative * std::max<double>(std::fabs(cpu.scores[d]), 0.01 * bound);
    if (!(std::fabs(double{gpu.scores[d]} - cpu.scores[d]) <= tolerance[d])) {
      ADD_FAILURE() << what << " doc " << d << " (" << docs.num_tokens(d) << " tokens): GPU score "
                    << gpu.scores[d] << ", CPU " << cpu.scores[d] << ", tolerance " << tolerance[d];
      ++failures;
    }
    if (gpu.best_tokens.empty()) continue;
    for (int64_t i = 0; i < nq; ++i) {
      const int32_t g = gpu.best_tokens[d * nq + i];
      const int32_t c = cpu.best_tokens[d * nq + i];
      if (g == c) continue;
      if (g < 0 || g >= docs.num_tokens(d)) {
        ADD_FAILURE() << what << " doc " << d << " query token " << i << ": GPU best token " << g
                      << " out of [0, " << docs.num_tokens(d) << ")";
        ++failures;
        continue;
      }
      double abs_g = 0, abs_c = 0;
      const double sim_g = Dot(&query[i * dim], &docs.values[d][g * dim], dim, &abs_g);
      const double sim_c = Dot(&query[i * dim], &docs.values[d][c * dim], dim, &abs_c);
      const double tie = kNearTieTolerance * std::max(abs_g, abs_c);
      if (!(std::fabs(sim_g - sim_c) <= tie)) {
        ADD_FAILURE() << what << " doc " << d << " query token " << i << ": GPU best token " << g
                      << " (similarity " << sim_g << "), CPU " << c << " (similarity " << sim_c
                      << "), not a near-tie (tolerance " << tie << ")";
        ++failures;
      }
    }
    if (failures > 10) return failures;
  }

  // Top-k order: where the two rankings differ, the documents swapped must be tied on the CPU
  // scores within tolerance.
  const size_t k = std::min<size_t>(10, num_docs);
  const std::vector<int64_t> gpu_top = TopK(gpu.scores, k);
  const std::vector<int64_t> cpu_top = TopK(cpu.scores, k);
  for (size_t r = 0; r < k; ++r) {
    const int64_t a = gpu_top[r], b = cpu_top[r];
    if (a == b) continue;
    const double tie = std::max(tolerance[a], tolerance[b]) * 2;
    if (!(std::fabs(double{cpu.scores[a]} - cpu.scores[b]) <= tie)) {
      ADD_FAILURE() << what << " rank " << r << ": GPU has document " << a << " (CPU score "
                    << cpu.scores[a] << "), CPU has document " << b << " (" << cpu.scores[b] << ")";
      ++failures;
    }
  }
  return failures;
}

const char* DtypeName(VectorDtype dtype) {
  return dtype == VectorDtype::kFloat16 ? "fp16" : "fp32";
}

const char* KernelName(CudaMaxSimKernel kernel) {
  return kernel == CudaMaxSimKernel::kAuto ? "auto" : "simt";
}

TEST(NewCudaMaxSimScorer, ReportsWhyItIsUnavailable) {
  absl::StatusOr<std::unique_ptr<MaxSimScorer>> scorer = NewCudaMaxSimScorer();
#if !TESSERA_CUDA_BUILD
  EXPECT_FALSE(CudaDeviceAvailable());
  ASSERT_FALSE(scorer.ok());
  EXPECT_EQ(scorer.status().code(), absl::StatusCode::kUnimplemented) << scorer.status();
  EXPECT_THAT(std::string(scorer.status().message()), HasSubstr("built without CUDA"));
#else
  if (!CudaDeviceAvailable()) {
    ASSERT_FALSE(scorer.ok());
    EXPECT_EQ(scorer.status().code(), absl::StatusCode::kFailedPrecondition) << scorer.status();
    EXPECT_THAT(std::string(scorer.status().message()), HasSubstr("no CUDA device visible"));
    return;
  }
  ASSERT_TRUE(scorer.ok()) << scorer.status();
  EXPECT_THAT(std::string((*scorer)->name()), StartsWith("cuda-sm"));
#endif
}

TEST(NewCudaMaxSimScorer, RejectsDeviceThatDoesNotExist) {
  SKIP_WITHOUT_CUDA_DEVICE();
  CudaMaxSimOptions options;
  options.device = 1000;
  absl::StatusOr<std::unique_ptr<MaxSimScorer>> scorer = NewCudaMaxSimScorer(options);
  ASSERT_FALSE(scorer.ok());
  EXPECT_EQ(scorer.status().code(), absl::StatusCode::kInvalidArgument) << scorer.status();
  EXPECT_THAT(std::string(scorer.status().message()), HasSubstr("device 1000"));
}

TEST(CudaMaxSimScorer, MatchesCpuScorerOverRandomShapes) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::unique_ptr<MaxSimScorer> cpu = CpuScorer();
  ASSERT_NE(cpu, nullptr);
  std::unique_ptr<MaxSimScorer> gpus[] = {GpuScorer(CudaMaxSimKernel::kAuto),
                                          GpuScorer(CudaMaxSimKernel::kSimt)};
  ASSERT_NE(gpus[0], nullptr);
  ASSERT_NE(gpus[1], nullptr);

  std::mt19937 rng(20240705);
  std::uniform_int_distribution<int64_t> nq_dist(1, 64);
  std::uniform_int_distribution<int64_t> long_dist(1, 2048);
  std::uniform_int_distribution<int64_t> short_dist(1, 64);
  std::uniform_int_distribution<int> kind_dist(0, 9);
  const int64_t special_lengths[] = {1, 2, 31, 32, 33, 127, 128, 129, 2047, 2048};
  std::uniform_int_distribution<size_t> special_dist(0, std::size(special_lengths) - 1);
  for (VectorDtype dtype : {VectorDtype::kFloat16, VectorDtype::kFloat32}) {
    for (int64_t dim : {64, 96, 128, 320}) {
      for (int trial = 0; trial < 2; ++trial) {
        const int64_t nq = trial == 0 ? nq_dist(rng) : 64;
        const std::vector<float> query = RandomUnitRows(rng, nq, dim);
        OwnedDocs docs;
        docs.dtype = dtype;
        docs.dim = dim;
        // Lengths vary within the batch: the extremes, then a mix of long, short and tile-edge.
        std::vector<int64_t> lengths = {2048, 1};
        for (int d = 0; d < 14; ++d) {
          const int kind = kind_dist(rng);
          lengths.push_back(kind < 4   ? long_dist(rng)
                            : kind < 8 ? short_dist(rng)
                                       : special_lengths[special_dist(rng)]);
        }
        for (int64_t n : lengths) docs.Add(RandomUnitRows(rng, n, dim));
        const DocumentBatch batch = docs.Batch();
        const FloatMatrixView view{query.data(), nq, dim};
        MaxSimOptions options;
        options.want_best_tokens = true;
        absl::StatusOr<MaxSimResult> expected = cpu->Score(view, batch, options);
        ASSERT_TRUE(expected.ok()) << expected.status();

        for (int g = 0; g < 2; ++g) {
          const std::string what = absl::StrCat(std::string(gpus[g]->name()), " ", DtypeName(dtype),
                                                " dim=", dim, " nq=", nq, " trial=", trial);
          absl::StatusOr<MaxSimResult> got = gpus[g]->Score(view, batch, options);
          ASSERT_TRUE(got.ok()) << what << ": " << got.status();
          ASSERT_EQ(ExpectMatchesCpu(*got, *expected, query, nq, docs, what), 0);
          // Tracking best tokens does not change the scores.
          absl::StatusOr<MaxSimResult> scores_only = gpus[g]->Score(view, batch);
          ASSERT_TRUE(scores_only.ok()) << what << ": " << scores_only.status();
          EXPECT_TRUE(scores_only->best_tokens.empty()) << what;
          EXPECT_EQ(scores_only->scores, got->scores) << what;
        }
      }
    }
  }
}

TEST(CudaMaxSimScorer, EveryLengthAroundTileBoundaries) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::unique_ptr<MaxSimScorer> cpu = CpuScorer();
  ASSERT_NE(cpu, nullptr);
  std::unique_ptr<MaxSimScorer> gpus[] = {GpuScorer(CudaMaxSimKernel::kAuto),
                                          GpuScorer(CudaMaxSimKernel::kSimt)};
  ASSERT_NE(gpus[0], nullptr);
  ASSERT_NE(gpus[1], nullptr);
  std::mt19937 rng(7);
  struct Shape {
    VectorDtype dtype;
    int64_t dim;  // 64: tensor cores; 40: SIMT with vector loads; 13: SIMT scalar loads
  };
  for (const Shape& shape : {Shape{VectorDtype::kFloat16, 64}, Shape{VectorDtype::kFloat16, 40},
                             Shape{VectorDtype::kFloat32, 13}}) {
    OwnedDocs docs;
    docs.dtype = shape.dtype;
    docs.dim = shape.dim;
    for (int64_t n = 1; n <= 70; ++n) docs.Add(RandomValues(rng, n * shape.dim));
    const DocumentBatch batch = docs.Batch();
    for (int64_t nq : {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 65}) {
      const std::vector<float> query = RandomValues(rng, nq * shape.dim);
      const FloatMatrixView view{query.data(), nq, shape.dim};
      MaxSimOptions options;
      options.want_best_tokens = true;
      absl::StatusOr<MaxSimResult> expected = cpu->Score(view, batch, options);
      ASSERT_TRUE(expected.ok()) << expected.status();
      for (const std::unique_ptr<MaxSimScorer>& gpu : gpus) {
        const std::string what = absl::StrCat(std::string(gpu->name()), " ", DtypeName(shape.dtype),
                                              " dim=", shape.dim, " nq=", nq);
        absl::StatusOr<MaxSimResult> got = gpu->Score(view, batch, options);
        ASSERT_TRUE(got.ok()) << what << ": " << got.status();
        ASSERT_EQ(ExpectMatchesCpu(*got, *expected, query, nq, docs, what), 0);
      }
    }
  }
}

TEST(CudaMaxSimScorer, LongQueriesAndLargeDimsTakeSeveralLaunches) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::unique_ptr<MaxSimScorer> cpu = CpuScorer();
  ASSERT_NE(cpu, nullptr);
  std::mt19937 rng(13);
  struct Shape {
    VectorDtype dtype;
    int64_t dim;
    int64_t nq;
  };
  // Query tiles per launch: tensor cores 1 (dim 320) and 3 (dim 128); SIMT 2 (dim 320), 1 with
  // 12-token tiles (dim 1000) and 1 with 2-token tiles (dim 5000).
  for (const Shape& shape :
       {Shape{VectorDtype::kFloat16, 320, 200}, Shape{VectorDtype::kFloat16, 128, 200},
        Shape{VectorDtype::kFloat32, 1000, 40}, Shape{VectorDtype::kFloat16, 5000, 5}}) {
    const std::vector<float> query = RandomUnitRows(rng, shape.nq, shape.dim);
    OwnedDocs docs;
    docs.dtype = shape.dtype;
    docs.dim = shape.dim;
    for (int64_t n : {1, 50, 300, 33}) docs.Add(RandomUnitRows(rng, n, shape.dim));
    const DocumentBatch batch = docs.Batch();
    const FloatMatrixView view{query.data(), shape.nq, shape.dim};
    MaxSimOptions options;
    options.want_best_tokens = true;
    absl::StatusOr<MaxSimResult> expected = cpu->Score(view, batch, options);
    ASSERT_TRUE(expected.ok()) << expected.status();
    for (CudaMaxSimKernel kernel : {CudaMaxSimKernel::kAuto, CudaMaxSimKernel::kSimt}) {
      std::unique_ptr<MaxSimScorer> gpu = GpuScorer(kernel);
      ASSERT_NE(gpu, nullptr);
      const std::string what = absl::StrCat(std::string(gpu->name()), " ", DtypeName(shape.dtype),
                                            " dim=", shape.dim, " nq=", shape.nq);
      absl::StatusOr<MaxSimResult> got = gpu->Score(view, batch, options);
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      ASSERT_EQ(ExpectMatchesCpu(*got, *expected, query, shape.nq, docs, what), 0);
    }
  }
}

TEST(CudaMaxSimScorer, QueryMagnitudeDoesNotMatter) {
  // The tensor-core kernel rescales the query by a power of two before splitting it into fp16
  // halves; tiny and huge queries must come out as exact as unit ones.
  SKIP_WITHOUT_CUDA_DEVICE();
  std::unique_ptr<MaxSimScorer> cpu = CpuScorer();
  std::unique_ptr<MaxSimScorer> gpu = GpuScorer();
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  std::mt19937 rng(17);
  const int64_t dim = 128, nq = 32;
  OwnedDocs docs;
  docs.dim = dim;
  for (int64_t n : {5, 128, 700}) docs.Add(RandomUnitRows(rng, n, dim));
  const DocumentBatch batch = docs.Batch();
  const std::vector<float> unit = RandomUnitRows(rng, nq, dim);
  for (float magnitude : {1e-30f, 1e-6f, 1.0f, 3e4f, 1e20f}) {
    std::vector<float> query = unit;
    for (float& x : query) x *= magnitude;
    const FloatMatrixView view{query.data(), nq, dim};
    MaxSimOptions options;
    options.want_best_tokens = true;
    absl::StatusOr<MaxSimResult> expected = cpu->Score(view, batch, options);
    absl::StatusOr<MaxSimResult> got = gpu->Score(view, batch, options);
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(ExpectMatchesCpu(*got, *expected, query, nq, docs,
                               absl::StrCat(std::string(gpu->name()), " magnitude=", magnitude)),
              0);
  }
}

TEST(CudaMaxSimScorer, ExactTiesGoToLowestIndex) {
  // Positive queries; a planted all-ones token beats every small random token, and its copies
  // (in other lanes, n8 tiles and 32-token steps) tie exactly with it.
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(11);
  const int64_t dim = 64, nq = 37, n = 90;
  const std::vector<float> query = RandomValues(rng, nq * dim, 0.1f, 1.0f);
  const std::vector<int64_t> planted = {7, 12, 19, 20, 31, 45, 89};
  for (VectorDtype dtype : {VectorDtype::kFloat16, VectorDtype::kFloat32}) {
    OwnedDocs docs;
    docs.dtype = dtype;
    docs.dim = dim;
    std::vector<float> tokens = RandomValues(rng, n * dim, -0.01f, 0.01f);
    for (int64_t p : planted) std::fill(&tokens[p * dim], &tokens[(p + 1) * dim], 1.0f);
    docs.Add(tokens);
    // Every token the same: token 0 wins everywhere.
    const std::vector<float> same = RandomValues(rng, dim);
    std::vector<float> repeated;
    for (int j = 0; j < 50; ++j) repeated.insert(repeated.end(), same.begin(), same.end());
    docs.Add(repeated);
    const DocumentBatch batch = docs.Batch();
    for (CudaMaxSimKernel kernel : {CudaMaxSimKernel::kAuto, CudaMaxSimKernel::kSimt}) {
      std::unique_ptr<MaxSimScorer> gpu = GpuScorer(kernel);
      ASSERT_NE(gpu, nullptr);
      MaxSimOptions options;
      options.want_best_tokens = true;
      absl::StatusOr<MaxSimResult> got = gpu->Score({query.data(), nq, dim}, batch, options);
      ASSERT_TRUE(got.ok()) << got.status();
      for (int64_t i = 0; i < nq; ++i) {
        EXPECT_EQ(got->best_tokens[i], planted[0])
            << gpu->name() << " " << DtypeName(dtype) << " query token " << i;
        EXPECT_EQ(got->best_tokens[nq + i], 0)
            << gpu->name() << " " << DtypeName(dtype) << " query token " << i;
      }
    }
  }
}

TEST(CudaMaxSimScorer, ChunksUnderASmallBudgetMatchOneChunk) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(19);
  const int64_t dim = 64, nq = 20;
  const std::vector<float> query = RandomUnitRows(rng, nq, dim);
  OwnedDocs docs;
  docs.dim = dim;
  std::uniform_int_distribution<int64_t> len_dist(1, 300);
  for (int d = 0; d < 60; ++d) docs.Add(RandomUnitRows(rng, len_dist(rng), dim));
  const DocumentBatch batch = docs.Batch();
  MaxSimOptions options;
  options.want_best_tokens = true;
  for (CudaMaxSimKernel kernel : {CudaMaxSimKernel::kAuto, CudaMaxSimKernel::kSimt}) {
    std::unique_ptr<MaxSimScorer> roomy = GpuScorer(kernel);
    // ~1.1 MB of fp16 vectors through a 256 KiB budget (several chunks) and 4 KiB staging
    // buffers (documents split across them).
    std::unique_ptr<MaxSimScorer> tight = GpuScorer(kernel, 256 << 10, 4 << 10);
    ASSERT_NE(roomy, nullptr);
    ASSERT_NE(tight, nullptr);
    absl::StatusOr<MaxSimResult> a = roomy->Score({query.data(), nq, dim}, batch, options);
    absl::StatusOr<MaxSimResult> b = tight->Score({query.data(), nq, dim}, batch, options);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->scores, b->scores) << KernelName(kernel);
    EXPECT_EQ(a->best_tokens, b->best_tokens) << KernelName(kernel);
  }
}

TEST(CudaMaxSimScorer, BatchThatCannotFitIsResourceExhausted) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(23);
  const int64_t dim = 128, nq = 8;
  const std::vector<float> query = RandomUnitRows(rng, nq, dim);
  OwnedDocs docs;
  docs.dim = dim;
  docs.Add(RandomUnitRows(rng, 10, dim));
  docs.Add(RandomUnitRows(rng, 2048, dim));  // 512 KiB of fp16
  const DocumentBatch batch = docs.Batch();

  std::unique_ptr<MaxSimScorer> small = GpuScorer(CudaMaxSimKernel::kAuto, 64 << 10);
  ASSERT_NE(small, nullptr);
  absl::StatusOr<MaxSimResult> got = small->Score({query.data(), nq, dim}, batch);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted) << got.status();
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("document 1 (2048 tokens"));

  std::unique_ptr<MaxSimScorer> tiny = GpuScorer(CudaMaxSimKernel::kAuto, 1024);
  ASSERT_NE(tiny, nullptr);
  got = tiny->Score({query.data(), nq, dim}, batch);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted) << got.status();
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("the query and results"));

  // The scorer is still usable afterwards.
  docs.values.pop_back();
  docs.halves.pop_back();
  absl::StatusOr<MaxSimResult> ok = small->Score({query.data(), nq, dim}, docs.Batch());
  EXPECT_TRUE(ok.ok()) << ok.status();
}

TEST(CudaMaxSimScorer, ConcurrentCallersGetIdenticalResults) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(5);
  const int64_t dim = 96, nq = 20;
  const std::vector<float> query = RandomUnitRows(rng, nq, dim);
  OwnedDocs docs;
  docs.dim = dim;
  std::uniform_int_distribution<int64_t> len_dist(1, 400);
  for (int d = 0; d < 150; ++d) docs.Add(RandomUnitRows(rng, len_dist(rng), dim));
  const DocumentBatch batch = docs.Batch();
  MaxSimOptions options;
  options.want_best_tokens = true;
  std::unique_ptr<MaxSimScorer> gpu = GpuScorer();
  ASSERT_NE(gpu, nullptr);
  absl::StatusOr<MaxSimResult> expected = gpu->Score({query.data(), nq, dim}, batch, options);
  ASSERT_TRUE(expected.ok()) << expected.status();

  constexpr int kCallers = 4;
  constexpr int kRounds = 8;
  std::vector<int> mismatches(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int r = 0; r < kRounds; ++r) {
        absl::StatusOr<MaxSimResult> got = gpu->Score({query.data(), nq, dim}, batch, options);
        if (!got.ok() || got->scores != expected->scores ||
            got->best_tokens != expected->best_tokens) {
          ++mismatches[c];
        }
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(mismatches[c], 0) << "caller " << c;
}

TEST(CudaMaxSimScorer, EmptyBatchAndInvalidInput) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::unique_ptr<MaxSimScorer> gpu = GpuScorer();
  ASSERT_NE(gpu, nullptr);
  const std::vector<float> query(8, 0.5f);
  DocumentBatch empty;
  empty.dim = 4;
  MaxSimOptions options;
  options.want_best_tokens = true;
  absl::StatusOr<MaxSimResult> got = gpu->Score({query.data(), 2, 4}, empty, options);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->scores.empty());
  EXPECT_TRUE(got->best_tokens.empty());

  // Validation is shared with every backend (MaxSimScorer::Score).
  const std::vector<float> doc(8, 1.0f);
  const DocumentRef refs[] = {{doc.data(), 2}};
  DocumentBatch batch;
  batch.dtype = VectorDtype::kFloat32;
  batch.dim = 5;
  batch.docs = refs;
  got = gpu->Score({query.data(), 2, 4}, batch);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
