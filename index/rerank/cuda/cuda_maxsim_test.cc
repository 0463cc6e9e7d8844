// Tests for the CUDA MaxSim scorer: the scorer conformance suite for both kernels (tensor cores
// where they apply, and SIMT throughout), and what only the GPU backend has: the factory's device
// checks, chunking under a memory budget and batches that cannot fit. Without a visible device
// every case skips, except the one that checks what the factory reports.
#include "tessera/cuda_maxsim.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/rerank/scorer_conformance.h"
#include "tessera/maxsim.h"

#ifndef TESSERA_CUDA_BUILD
#define TESSERA_CUDA_BUILD 0
#endif

namespace tessera {
namespace {

using maxsim_testing::MaxSimScorerConformance;
using maxsim_testing::MaxSimScorerValidation;
using maxsim_testing::OwnedDocs;
using maxsim_testing::RandomUnitRows;
using maxsim_testing::ScorerFactory;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Why the GPU tests cannot run here, or "" when a device is visible.
std::string WhyNoCudaDevice() {
  if (CudaDeviceAvailable()) return "";
  return TESSERA_CUDA_BUILD ? "no CUDA device visible"
                            : "built without CUDA (TESSERA_ENABLE_CUDA=OFF)";
}

#define SKIP_WITHOUT_CUDA_DEVICE()                                 \
  do {                                                             \
    if (const std::string why = WhyNoCudaDevice(); !why.empty()) { \
      GTEST_SKIP() << why;                                         \
    }                                                              \
  } while (0)

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

const char* KernelName(CudaMaxSimKernel kernel) {
  return kernel == CudaMaxSimKernel::kAuto ? "auto" : "simt";
}

std::vector<ScorerFactory> CudaFactories() {
  std::vector<ScorerFactory> factories;
  for (CudaMaxSimKernel kernel : {CudaMaxSimKernel::kAuto, CudaMaxSimKernel::kSimt}) {
    ScorerFactory factory;
    factory.name = std::string("cuda_") + KernelName(kernel);
    factory.unavailable = WhyNoCudaDevice;
    factory.make = [kernel](int) {
      CudaMaxSimOptions options;
      options.kernel = kernel;
      return NewCudaMaxSimScorer(options);
    };
    factories.push_back(std::move(factory));
  }
  return factories;
}

INSTANTIATE_TEST_SUITE_P(Cuda, MaxSimScorerConformance, ::testing::ValuesIn(CudaFactories()));
INSTANTIATE_TEST_SUITE_P(Cuda, MaxSimScorerValidation, ::testing::ValuesIn(CudaFactories()));

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

TEST(CudaMaxSimScorer, ChunksUnderASmallBudgetMatchOneChunk) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(19);
  const int64_t dim = 64, nq = 20;
  const std::vector<float> query = RandomUnitRows(rng, nq, dim);
  OwnedDocs docs(VectorDtype::kFloat16, dim);
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
  OwnedDocs docs(VectorDtype::kFloat16, dim);
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

}  // namespace
}  // namespace tessera
