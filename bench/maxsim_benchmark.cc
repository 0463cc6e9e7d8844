// Micro-benchmarks of exact CPU MaxSim against the two references that make its numbers mean
// something: the measured fp32 FMA peak of one core, and the NumPy-style implementation (one
// OpenBLAS sgemm of Q·Dᵀ, then max and sum).
//
// Workload: a 32 × 128 query against 1,000 documents of 128 tokens × 128 dims.
// FLOPs per document = 2 · nq · n_doc · dim.
//
// Benchmark names (stable; scripts parse --benchmark_format=json), in the order they run:
//   BM_FmaPeak/avx512                      counter gflops
//   BM_FmaPeak/avx2                        counter gflops
//   BM_MaxSimSgemmBaseline/threads:{1,2}   counter gflops
//   BM_MaxSimCpu/{fp16,fp32}/{avx512,avx2,portable}/threads:{1,2}
//       counters gflops, docs_per_s, and, when the references above ran in the same process,
//       of_peak (gflops / (threads × the FMA peak of the same ISA: BM_FmaPeak/avx512 for the
//       avx512 kernels, BM_FmaPeak/avx2 for avx2 and portable, which the compiler vectorises with
//       AVX2 at most where the CPU has it)) and
//       vs_sgemm (gflops / BM_MaxSimSgemmBaseline gflops at the same thread count).
// Every benchmark measures wall time (UseRealTime), so Google Benchmark appends "/real_time" to
// each name above, e.g. "BM_MaxSimCpu/fp16/avx512/threads:1/real_time"; rates are per wall second.
// "threads" is the scorer's (or OpenBLAS's) thread count; Google Benchmark itself runs one thread.
// An ISA the CPU lacks is reported as an error for that benchmark (error_occurred in the JSON).

// GCC 12's _mm512_undefined_* (used by _mm512_reduce_add_ps) initialises a variable from itself,
// which -Wuninitialized reports at every use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "cblas.h"
#include "index/common/cpu_features.h"
#include "tessera/float16.h"
#include "tessera/maxsim.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace tessera {
namespace {

constexpr int64_t kQueryTokens = 32;
constexpr int64_t kDim = 128;
constexpr int64_t kDocs = 1000;
constexpr int64_t kDocTokens = 128;
constexpr double kFlopsPerCall = 2.0 * kQueryTokens * kDocTokens * kDim * kDocs;

// Results of the reference benchmarks, for the ratio counters (0 = not run in this process).
double g_fma_peak_avx512_gflops = 0;
double g_fma_peak_avx2_gflops = 0;
double g_sgemm_gflops[3] = {0, 0, 0};  // by thread count

struct Workload {
  std::vector<float> query;      // kQueryTokens × kDim
  std::vector<float> docs_fp32;  // kDocs × kDocTokens × kDim, documents back to back
  std::vector<Float16> docs_fp16;
  std::vector<DocumentRef> refs_fp32;
  std::vector<DocumentRef> refs_fp16;
};

// L2-normalised Gaussian vectors, as an encoder would produce; fp16 holds the rounded values.
const Workload& GetWorkload() {
  static const Workload* workload = [] {
    auto* w = new Workload;
    std::mt19937 rng(42);
    std::normal_distribution<float> normal;
    auto fill = [&](std::vector<float>& v, int64_t rows) {
      v.resize(rows * kDim);
      for (int64_t r = 0; r < rows; ++r) {
        float norm = 0;
        for (int64_t k = 0; k < kDim; ++k) {
          v[r * kDim + k] = normal(rng);
          norm += v[r * kDim + k] * v[r * kDim + k];
        }
        for (int64_t k = 0; k < kDim; ++k) v[r * kDim + k] /= std::sqrt(norm);
      }
    };
    fill(w->query, kQueryTokens);
    fill(w->docs_fp32, kDocs * kDocTokens);
    w->docs_fp16.resize(w->docs_fp32.size());
    FloatToHalf(w->docs_fp32.data(), w->docs_fp32.size(), w->docs_fp16.data());
    for (int64_t d = 0; d < kDocs; ++d) {
      const int64_t offset = d * kDocTokens * kDim;
      w->refs_fp32.push_back({w->docs_fp32.data() + offset, kDocTokens});
      w->refs_fp16.push_back({w->docs_fp16.data() + offset, kDocTokens});
    }
    return w;
  }();
  return *workload;
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ---- FMA peak: 24 independent accumulator chains cover the FMA latency × throughput product of
// current cores (≤ 2 FMA pipes × 4–5 cycles), so the loop is bound by FMA throughput only.

constexpr int kPeakChains = 24;
constexpr int64_t kPeakInnerIterations = 1 << 16;

__attribute__((target("avx512f,fma"))) float FmaLoopAvx512(int64_t iterations, float seed) {
  __m512 acc[kPeakChains];
  for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm512_set1_ps(seed * static_cast<float>(c));
  const __m512 a = _mm512_set1_ps(0.999999f);
  const __m512 b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 24
    for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kPeakChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return _mm512_reduce_add_ps(sum);
}

__attribute__((target("avx2,fma"))) float FmaLoopAvx2(int64_t iterations, float seed) {
  // 12 ymm chains (16 registers in all); two per FMA pipe × latency on AVX2-only cores.
  constexpr int kChains = 12;
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(seed * static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999999f);
  const __m256 b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}

void BM_FmaPeak(benchmark::State& state, bool avx512) {
  const internal::CpuFeatures& cpu = internal::Cpu();
  const bool supported = avx512 ? cpu.avx512f && cpu.fma : cpu.Avx2Fma();
  if (!supported) {
    state.SkipWithError(avx512 ? "CPU lacks AVX-512F/FMA" : "CPU lacks AVX2/FMA");
    return;
  }
  // FLOPs per inner iteration: chains × lanes × 2.
  const double flops =
      avx512 ? kPeakInnerIterations * kPeakChains * 16.0 * 2 : kPeakInnerIterations * 12 * 8.0 * 2;
  float seed = 1e-3f;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const float r = avx512 ? FmaLoopAvx512(kPeakInnerIterations, seed)
                           : FmaLoopAvx2(kPeakInnerIterations, seed);
    benchmark::DoNotOptimize(r);
    seed = r * 1e-9f + 1e-3f;  // the next call depends on this one
  }
  const double gflops = flops * static_cast<double>(state.iterations()) / Seconds(start) / 1e9;
  (avx512 ? g_fma_peak_avx512_gflops : g_fma_peak_avx2_gflops) = gflops;
  state.counters["gflops"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- NumPy-style baseline: S = Q · Dᵀ (32 × 128,000) with one sgemm, then per (query token,
// document) the max over that document's 128 columns, summed over query tokens.

void BM_MaxSimSgemmBaseline(benchmark::State& state, int threads) {
  const Workload& w = GetWorkload();
  openblas_set_num_threads(threads);
  const int64_t n = kDocs * kDocTokens;
  std::vector<float> sims(kQueryTokens * n);
  std::vector<float> scores(kDocs);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kQueryTokens, n, kDim, 1.0f,
                w.query.data(), kDim, w.docs_fp32.data(), kDim, 0.0f, sims.data(), n);
    std::fill(scores.begin(), scores.end(), 0.0f);
    for (int64_t i = 0; i < kQueryTokens; ++i) {
      const float* row = sims.data() + i * n;
      for (int64_t d = 0; d < kDocs; ++d) {
        scores[d] += *std::max_element(row + d * kDocTokens, row + (d + 1) * kDocTokens);
      }
    }
    benchmark::DoNotOptimize(scores.data());
    benchmark::ClobberMemory();
  }
  g_sgemm_gflops[threads] =
      kFlopsPerCall * static_cast<double>(state.iterations()) / Seconds(start) / 1e9;
  state.counters["gflops"] =
      benchmark::Counter(kFlopsPerCall / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- Tessera's CPU scorer.

void BM_MaxSimCpu(benchmark::State& state, VectorDtype dtype, CpuIsa isa, int threads) {
  const Workload& w = GetWorkload();
  CpuMaxSimOptions options;
  options.isa = isa;
  options.num_threads = threads;
  absl::StatusOr<std::unique_ptr<MaxSimScorer>> scorer = NewCpuMaxSimScorer(options);
  if (!scorer.ok()) {
    state.SkipWithError(std::string(scorer.status().message()).c_str());
    return;
  }
  DocumentBatch batch;
  batch.dtype = dtype;
  batch.dim = kDim;
  batch.docs = dtype == VectorDtype::kFloat16 ? w.refs_fp16 : w.refs_fp32;
  const FloatMatrixView query{w.query.data(), kQueryTokens, kDim};
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    absl::StatusOr<MaxSimResult> result = (*scorer)->Score(query, batch);
    if (!result.ok()) {
      state.SkipWithError(std::string(result.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(result->scores.data());
  }
  const double gflops =
      kFlopsPerCall * static_cast<double>(state.iterations()) / Seconds(start) / 1e9;
  state.counters["gflops"] =
      benchmark::Counter(kFlopsPerCall / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["docs_per_s"] =
      benchmark::Counter(kDocs, benchmark::Counter::kIsIterationInvariantRate);
  const double peak = isa == CpuIsa::kAvx512 ? g_fma_peak_avx512_gflops : g_fma_peak_avx2_gflops;
  if (peak > 0) state.counters["of_peak"] = gflops / (threads * peak);
  if (g_sgemm_gflops[threads] > 0) state.counters["vs_sgemm"] = gflops / g_sgemm_gflops[threads];
}

void RegisterAll() {
  benchmark::RegisterBenchmark("BM_FmaPeak/avx512", BM_FmaPeak, true)->UseRealTime();
  benchmark::RegisterBenchmark("BM_FmaPeak/avx2", BM_FmaPeak, false)->UseRealTime();
  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark(absl::StrCat("BM_MaxSimSgemmBaseline/threads:", threads).c_str(),
                                 BM_MaxSimSgemmBaseline, threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  const struct {
    const char* name;
    VectorDtype dtype;
  } dtypes[] = {{"fp16", VectorDtype::kFloat16}, {"fp32", VectorDtype::kFloat32}};
  const struct {
    const char* name;
    CpuIsa isa;
  } isas[] = {
      {"avx512", CpuIsa::kAvx512}, {"avx2", CpuIsa::kAvx2}, {"portable", CpuIsa::kPortable}};
  for (const auto& dtype : dtypes) {
    for (const auto& isa : isas) {
      for (int threads : {1, 2}) {
        benchmark::RegisterBenchmark(
            absl::StrCat("BM_MaxSimCpu/", dtype.name, "/", isa.name, "/threads:", threads).c_str(),
            BM_MaxSimCpu, dtype.dtype, isa.isa, threads)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  tessera::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
