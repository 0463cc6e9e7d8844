// Encoding into the centroid index: CentroidCodebook::Encode (each row's nearest centroid through
// the codebook's groups, then its residual code), the work of every ingest into a centroid shard
// and of every retraining, which re-encodes each live document (at 3M documents the 65,536-centroid
// training encodes 67M vectors).
//
// Workload: 16,384 rows of dim 128 per iteration against a two-level codebook of 16,384 or 65,536
// centroids (what a shard trains at 4M and 64M vectors), 4-bit residuals, trained on clustered
// unit vectors (8 sample rows a centroid). One thread: Encode runs on the calling thread.
//
// Benchmark names: BM_CentroidEncode/centroids:{16384,65536}; counter rows_per_s (per CPU second
// of the benchmark thread: Google Benchmark's CPU time).
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "index/centroid/centroid_codebook.h"
#include "index/common/thread_pool.h"

namespace tessera::internal {
namespace {

constexpr int64_t kDim = 128;
constexpr int64_t kRows = 16384;

// n unit rows around `topics` random directions (noise 0.3 a dimension before normalising).
std::vector<float> ClusteredRows(int64_t n, int64_t topics, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> centers(topics * kDim);
  for (float& x : centers) x = normal(rng);
  std::uniform_int_distribution<int64_t> pick(0, topics - 1);
  std::vector<float> rows(n * kDim);
  for (int64_t i = 0; i < n; ++i) {
    const float* center = &centers[pick(rng) * kDim];
    double norm = 0.0;
    for (int64_t k = 0; k < kDim; ++k) {
      rows[i * kDim + k] = center[k] + 0.3f * std::sqrt(static_cast<float>(kDim)) * normal(rng);
      norm += static_cast<double>(rows[i * kDim + k]) * rows[i * kDim + k];
    }
    const float scale = static_cast<float>(1.0 / std::sqrt(norm));
    for (int64_t k = 0; k < kDim; ++k) rows[i * kDim + k] *= scale;
  }
  return rows;
}

void BM_CentroidEncode(benchmark::State& state, int64_t centroids) {
  const int64_t topics = centroids / 4;
  const std::vector<float> sample = ClusteredRows(centroids * 8, topics, 1);
  CentroidTrainingOptions options;
  options.num_centroids = centroids;
  options.nbits = 4;
  ThreadPool pool(2);
  auto codebook =
      CentroidCodebook::Train(FloatMatrixView{sample.data(), centroids * 8, kDim}, options, &pool);
  if (!codebook.ok()) {
    state.SkipWithError(codebook.status().ToString().c_str());
    return;
  }
  const std::vector<float> rows = ClusteredRows(kRows, topics, 2);
  std::vector<uint32_t> ids(kRows);
  std::vector<uint8_t> codes(kRows * (*codebook)->codec().code_bytes());
  for (auto _ : state) {
    (*codebook)->Encode(FloatMatrixView{rows.data(), kRows, kDim}, ids.data(), codes.data());
    benchmark::DoNotOptimize(codes.data());
  }
  state.counters["rows_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()) * kRows,
                                                    benchmark::Counter::kIsRate);
}

const bool kRegistered = [] {
  for (const int64_t centroids : {16384, 65536}) {
    benchmark::RegisterBenchmark(absl::StrCat("BM_CentroidEncode/centroids:", centroids).c_str(),
                                 BM_CentroidEncode, centroids)
        ->Unit(benchmark::kMillisecond);
  }
  return true;
}();

}  // namespace
}  // namespace tessera::internal

BENCHMARK_MAIN();
