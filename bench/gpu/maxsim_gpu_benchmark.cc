// GPU MaxSim benchmark (issue 7): the fused kernels against the hardware (HBM bandwidth), against
// the materialising baseline that PyTorch's einsum/bmm amounts to (a cuBLAS strided-batched GEMM
// writing the nq × tokens similarity tensor of every candidate to global memory, then a max/sum
// kernel), and against the CPU scorer on the same data, all measured in one run.
//
// Workload per size: N candidates × 128 tokens × 128 dims, fp16, in one contiguous device buffer;
// query 32 tokens (fp32, unit rows). Sizes N = 1k, 10k, 100k by default.
//
// Reported per size (kernel times: median of cudaEvent-timed launches after warm-up):
//   fused_tc_ms / fused_simt_ms  the tensor-core and SIMT fused kernels (LaunchMaxSim)
//   fused_tc_gbps                fp16 document bytes (N·128·128·2) / fused_tc time
//   fused_tc_of_peak             fused_tc_gbps / --peak-gbps (default 4800, the H200's HBM3e)
//   fused_tc_candidates_per_s
//   cublas_fp16_ms               one cublasGemmEx over all candidates' tokens, fp16 × fp16 → fp32
//                                similarity tensor (fp32 compute), + max/sum kernel
//   cublas_fp16_batched_ms       the same as cublasGemmStridedBatchedEx, one 32×128×128 GEMM per
//                                candidate (torch.bmm)
//   cublas_fp32_ms               the one-GEMM form in strict FP32 (no TF32) on an fp32 copy of the
//                                documents: "FP32 eager PyTorch"
//   speedup_vs_cublas_fp16/fp32  baseline time / fused_tc time (fp16: the faster of the two forms)
//   cpu_ms                       one Score() call of the CPU scorer, all threads (wall clock)
//   score_e2e_ms                 one Score() call of the CUDA scorer from host memory (gather
//                                through pinned buffers, PCIe, kernel, results back)
//   max_rel_diff_*               max over candidates of |score − CPU score| / |CPU score|
//
// Usage: tessera-bench-gpu [--json PATH] [--sizes 1000,10000,100000] [--peak-gbps 4800]
//                          [--cpu-threads 0] [--skip-cpu] [--device 0]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "bench/gpu/baseline_kernels.h"
#include "index/rerank/cuda/maxsim_kernel.cuh"
#include "tessera/cuda_maxsim.h"
#include "tessera/float16.h"
#include "tessera/maxsim.h"

namespace tessera {
namespace {

constexpr int64_t kQueryTokens = 32;
constexpr int64_t kDocTokens = 128;
constexpr int64_t kDim = 128;
constexpr uint64_t kSeed = 20240705;

#define CHECK_CUDA(expr)                                                      \
  do {                                                                        \
    const cudaError_t _err = (expr);                                          \
    if (_err != cudaSuccess) {                                                \
      std::fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorName(_err), cudaGetErrorString(_err));         \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

#define CHECK_CUBLAS(expr)                                                             \
  do {                                                                                 \
    const cublasStatus_t _st = (expr);                                                 \
    if (_st != CUBLAS_STATUS_SUCCESS) {                                                \
      std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #expr, \
                   static_cast<int>(_st));                                             \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

struct Flags {
  std::string json_path;
  std::vector<int64_t> sizes = {1000, 10000, 100000};
  double peak_gbps = 4800;
  int cpu_threads = 0;
  bool skip_cpu = false;
  int device = 0;
};

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    if (arg == "--json") {
      if (!value(&flags->json_path)) return false;
    } else if (arg == "--sizes") {
      if (!value(&v)) return false;
      flags->sizes.clear();
      for (absl::string_view part : absl::StrSplit(v, ',')) {
        int64_t n = 0;
        if (!absl::SimpleAtoi(part, &n) || n < 1) return false;
        flags->sizes.push_back(n);
      }
    } else if (arg == "--peak-gbps") {
      if (!value(&v) || !absl::SimpleAtod(v, &flags->peak_gbps) || flags->peak_gbps <= 0) {
        return false;
      }
    } else if (arg == "--cpu-threads") {
      if (!value(&v) || !absl::SimpleAtoi(v, &flags->cpu_threads) || flags->cpu_threads < 0) {
        return false;
      }
    } else if (arg == "--device") {
      if (!value(&v) || !absl::SimpleAtoi(v, &flags->device)) return false;
    } else if (arg == "--skip-cpu") {
      flags->skip_cpu = true;
    } else {
      return false;
    }
  }
  return true;
}

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    CHECK_CUDA(cudaMalloc(&data_, std::max<size_t>(count, 1) * sizeof(T)));
  }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return data_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};

// Median milliseconds of `iterations` event-timed runs of `run`, after `warmup` untimed ones.
double MedianMs(cudaStream_t stream, int warmup, int iterations, const std::function<void()>& run) {
  for (int i = 0; i < warmup; ++i) run();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int i = 0; i < iterations; ++i) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    run();
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::vector<float> CopyToHost(const float* device, size_t count) {
  std::vector<float> host(count);
  CHECK_CUDA(cudaMemcpy(host.data(), device, count * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}

double MaxRelDiff(const std::vector<float>& got, const std::vector<float>& reference) {
  if (got.size() != reference.size() || reference.empty()) return NAN;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double denom = std::max(std::fabs(double{reference[i]}), 1e-12);
    worst = std::max(worst, std::fabs(double{got[i]} - reference[i]) / denom);
  }
  return worst;
}

double WallMs(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

struct SizeResult {
  int64_t candidates = 0;
  double doc_bytes = 0;
  double fused_tc_ms = NAN, fused_simt_ms = NAN;
  double cublas_fp16_ms = NAN, cublas_fp16_batched_ms = NAN, cublas_fp32_ms = NAN;
  double cpu_ms = NAN, score_e2e_ms = NAN;
  int cpu_threads = 0;
  double BestFp16Ms() const { return std::min(cublas_fp16_ms, cublas_fp16_batched_ms); }
  double diff_tc = NAN, diff_simt = NAN, diff_cublas_fp16 = NAN, diff_cublas_fp32 = NAN,
         diff_e2e = NAN;
};

SizeResult RunSize(int64_t num_docs, const Flags& flags, const std::vector<float>& query,
                   cudaStream_t stream, cublasHandle_t cublas, MaxSimScorer* cuda_scorer,
                   MaxSimScorer* cpu_scorer) {
  SizeResult r;
  r.candidates = num_docs;
  const int64_t tokens = num_docs * kDocTokens;
  const int64_t elements = tokens * kDim;
  r.doc_bytes = static_cast<double>(elements) * 2;
  const int iterations = static_cast<int>(std::clamp<int64_t>(2000000 / num_docs, 10, 200));

  // Documents: uniform values scaled so that rows have about unit norm.
  DeviceArray<uint16_t> docs(elements);
  CHECK_CUDA(bench::FillRandomHalf(docs.get(), elements, kSeed + num_docs, std::sqrt(3.0f / kDim),
                                   stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<int64_t> begin(num_docs);
  for (int64_t d = 0; d < num_docs; ++d) begin[d] = d * kDocTokens;
  const std::vector<int32_t> lengths(num_docs, static_cast<int32_t>(kDocTokens));
  DeviceArray<int64_t> d_begin(num_docs);
  DeviceArray<int32_t> d_lengths(num_docs);
  CHECK_CUDA(cudaMemcpy(d_begin.get(), begin.data(), d_begin.bytes(), cudaMemcpyHostToDevice));
  CHECK_CUDA(
      cudaMemcpy(d_lengths.get(), lengths.data(), d_lengths.bytes(), cudaMemcpyHostToDevice));
  DeviceArray<float> scores(num_docs);

  internal::DeviceDocuments device_docs;
  device_docs.vectors = docs.get();
  device_docs.token_begin = d_begin.get();
  device_docs.num_tokens = d_lengths.get();
  device_docs.num_docs = num_docs;
  device_docs.dim = kDim;
  device_docs.fp16 = true;

  // Fused kernels.
  std::vector<float> tc_scores, simt_scores;
  for (internal::MaxSimKernelKind kind :
       {internal::MaxSimKernelKind::kTensorCore, internal::MaxSimKernelKind::kSimt}) {
    const internal::PreparedQuery prepared =
        internal::PrepareMaxSimQuery(kind, query.data(), kQueryTokens, kDim);
    DeviceArray<uint32_t> d_query(prepared.words.size());
    CHECK_CUDA(
        cudaMemcpy(d_query.get(), prepared.words.data(), prepared.bytes(), cudaMemcpyHostToDevice));
    internal::MaxSimLaunch launch;
    launch.docs = device_docs;
    launch.query = d_query.get();
    launch.scores = scores.get();
    const double ms = MedianMs(stream, 3, iterations, [&] {
      CHECK_CUDA(internal::LaunchMaxSim(prepared, launch, stream));
    });
    if (kind == internal::MaxSimKernelKind::kTensorCore) {
      r.fused_tc_ms = ms;
      tc_scores = CopyToHost(scores.get(), num_docs);
    } else {
      r.fused_simt_ms = ms;
      simt_scores = CopyToHost(scores.get(), num_docs);
    }
  }

  // Materialising baselines: sim[d][j][i] = ⟨q_i, d_j⟩ for every candidate in global memory (fp32,
  // column-major 32 × 128 per candidate), then max over j and sum over i.
  std::vector<float> cublas16_scores, cublas32_scores;
  {
    DeviceArray<float> sim(static_cast<size_t>(tokens * kQueryTokens));
    const float alpha = 1.0f, beta = 0.0f;
    std::vector<Float16> query16(query.size());
    FloatToHalf(query.data(), query.size(), query16.data());
    DeviceArray<uint16_t> d_query16(query16.size());
    CHECK_CUDA(
        cudaMemcpy(d_query16.get(), query16.data(), d_query16.bytes(), cudaMemcpyHostToDevice));
    // Per candidate, C (32 × 128, ldc 32) = Aᵀ · B with A = the query as a column-major 128 × 32
    // matrix and B = the candidate's row-major tokens, i.e. a column-major 128 (dim) × 128 (tokens)
    // matrix. Batched: one GEMM per candidate, A shared (stride 0), as torch.bmm does. Flat: all
    // candidates' tokens as one 128 × (N·128) matrix, one GEMM, as torch.einsum("qd,ntd->nqt")
    // lowers to; same tensor layout either way.
    auto gemm = [&](const void* a, const void* b, cudaDataType type, bool batched) {
      if (batched) {
        CHECK_CUBLAS(cublasGemmStridedBatchedEx(
            cublas, CUBLAS_OP_T, CUBLAS_OP_N, kQueryTokens, kDocTokens, kDim, &alpha, a, type, kDim,
            0, b, type, kDim, kDocTokens * kDim, &beta, sim.get(), CUDA_R_32F, kQueryTokens,
            kQueryTokens * kDocTokens, static_cast<int>(num_docs), CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT));
      } else {
        CHECK_CUBLAS(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, kQueryTokens,
                                  static_cast<int>(tokens), kDim, &alpha, a, type, kDim, b, type,
                                  kDim, &beta, sim.get(), CUDA_R_32F, kQueryTokens,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
      CHECK_CUDA(bench::MaxSumSimilarities(sim.get(), num_docs, kDocTokens, kQueryTokens,
                                           scores.get(), stream));
    };
    r.cublas_fp16_batched_ms = MedianMs(
        stream, 3, iterations, [&] { gemm(d_query16.get(), docs.get(), CUDA_R_16F, true); });
    r.cublas_fp16_ms = MedianMs(stream, 3, iterations,
                                [&] { gemm(d_query16.get(), docs.get(), CUDA_R_16F, false); });
    cublas16_scores = CopyToHost(scores.get(), num_docs);

    DeviceArray<float> docs32(elements);
    CHECK_CUDA(bench::HalfToFloatOnDevice(docs.get(), docs32.get(), elements, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    DeviceArray<float> d_query32(query.size());
    CHECK_CUDA(
        cudaMemcpy(d_query32.get(), query.data(), d_query32.bytes(), cudaMemcpyHostToDevice));
    r.cublas_fp32_ms = MedianMs(stream, 2, std::max(5, iterations / 4),
                                [&] { gemm(d_query32.get(), docs32.get(), CUDA_R_32F, false); });
    cublas32_scores = CopyToHost(scores.get(), num_docs);
  }

  // The same documents in host memory, for the CPU scorer and the CUDA scorer's Score().
  std::vector<Float16> host(static_cast<size_t>(elements));
  CHECK_CUDA(cudaMemcpy(host.data(), docs.get(), docs.bytes(), cudaMemcpyDeviceToHost));
  std::vector<DocumentRef> refs(num_docs);
  for (int64_t d = 0; d < num_docs; ++d) {
    refs[d].data = host.data() + d * kDocTokens * kDim;
    refs[d].num_tokens = kDocTokens;
  }
  DocumentBatch batch;
  batch.dtype = VectorDtype::kFloat16;
  batch.dim = kDim;
  batch.docs = refs;
  const FloatMatrixView view{query.data(), kQueryTokens, kDim};

  std::vector<float> cpu_scores;
  if (cpu_scorer != nullptr) {
    DocumentBatch warm = batch;
    warm.docs = absl::MakeConstSpan(refs).subspan(0, std::min<size_t>(refs.size(), 1000));
    (void)cpu_scorer->Score(view, warm);
    absl::StatusOr<MaxSimResult> got;
    r.cpu_ms = WallMs([&] { got = cpu_scorer->Score(view, batch); });
    if (!got.ok()) {
      std::fprintf(stderr, "CPU scorer: %s\n", got.status().ToString().c_str());
      std::exit(1);
    }
    cpu_scores = std::move(got->scores);
  }

  {
    absl::StatusOr<MaxSimResult> got = cuda_scorer->Score(view, batch);  // warm-up: allocations
    if (!got.ok()) {
      std::fprintf(stderr, "CUDA scorer: %s\n", got.status().ToString().c_str());
      std::exit(1);
    }
    r.score_e2e_ms = WallMs([&] { got = cuda_scorer->Score(view, batch); });
    if (!got.ok()) {
      std::fprintf(stderr, "CUDA scorer: %s\n", got.status().ToString().c_str());
      std::exit(1);
    }
    // Without the CPU reference, compare against the tensor-core kernel's own scores.
    const std::vector<float>& reference = cpu_scores.empty() ? tc_scores : cpu_scores;
    r.diff_e2e = MaxRelDiff(got->scores, reference);
    r.diff_tc = MaxRelDiff(tc_scores, reference);
    r.diff_simt = MaxRelDiff(simt_scores, reference);
    r.diff_cublas_fp16 = MaxRelDiff(cublas16_scores, reference);
    r.diff_cublas_fp32 = MaxRelDiff(cublas32_scores, reference);
  }
  return r;
}

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.6g", v);
  return buffer;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  using namespace tessera;  // NOLINT
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr,
                 "usage: %s [--json PATH] [--sizes 1000,10000,100000] [--peak-gbps 4800] "
                 "[--cpu-threads 0] [--skip-cpu] [--device 0]\n",
                 argv[0]);
    return 2;
  }
  CudaMaxSimOptions cuda_options;
  cuda_options.device = flags.device;
  absl::StatusOr<std::unique_ptr<MaxSimScorer>> cuda_scorer = NewCudaMaxSimScorer(cuda_options);
  if (!cuda_scorer.ok()) {
    std::fprintf(stderr, "tessera-bench-gpu: %s\n", cuda_scorer.status().ToString().c_str());
    return 1;
  }
  CHECK_CUDA(cudaSetDevice(flags.device));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, flags.device));

  std::unique_ptr<MaxSimScorer> cpu_scorer;
  if (!flags.skip_cpu) {
    CpuMaxSimOptions cpu_options;
    cpu_options.num_threads = flags.cpu_threads;
    absl::StatusOr<std::unique_ptr<MaxSimScorer>> cpu = NewCpuMaxSimScorer(cpu_options);
    if (!cpu.ok()) {
      std::fprintf(stderr, "CPU scorer: %s\n", cpu.status().ToString().c_str());
      return 1;
    }
    cpu_scorer = *std::move(cpu);
  }

  // Query: unit rows, fixed seed.
  std::vector<float> query(kQueryTokens * kDim);
  std::mt19937 rng(static_cast<uint32_t>(kSeed));
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < kQueryTokens; ++i) {
    double norm = 0;
    for (int64_t k = 0; k < kDim; ++k) {
      query[i * kDim + k] = normal(rng);
      norm += double{query[i * kDim + k]} * query[i * kDim + k];
    }
    for (int64_t k = 0; k < kDim; ++k) query[i * kDim + k] /= static_cast<float>(std::sqrt(norm));
  }

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t cublas;
  CHECK_CUBLAS(cublasCreate(&cublas));
  CHECK_CUBLAS(cublasSetStream(cublas, stream));
  CHECK_CUBLAS(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH));  // no TF32 for the FP32 baseline

  std::printf(
      "device: %s (sm_%d%d, %d SMs), scorer %s; query %lld tokens, candidates × %lld "
      "tokens × %lld dims fp16; HBM peak %.0f GB/s\n",
      prop.name, prop.major, prop.minor, prop.multiProcessorCount,
      std::string((*cuda_scorer)->name()).c_str(), static_cast<long long>(kQueryTokens),
      static_cast<long long>(kDocTokens), static_cast<long long>(kDim), flags.peak_gbps);
  std::vector<SizeResult> results;
  for (int64_t n : flags.sizes) {
    results.push_back(
        RunSize(n, flags, query, stream, cublas, cuda_scorer->get(), cpu_scorer.get()));
    results.back().cpu_threads = cpu_scorer == nullptr ? 0
                                 : flags.cpu_threads > 0
                                     ? flags.cpu_threads
                                     : static_cast<int>(std::thread::hardware_concurrency());
  }

  std::printf("\n%10s %9s %8s %6s %11s %9s %10s %10s %7s %7s %9s %9s %9s\n", "candidates",
              "fused_ms", "GB/s", "%peak", "cand/s", "simt_ms", "cublas16", "cublas32", "x_c16",
              "x_c32", "cpu_ms", "e2e_ms", "maxrel");
  for (const SizeResult& r : results) {
    const double gbps = r.doc_bytes / (r.fused_tc_ms * 1e-3) / 1e9;
    std::printf(
        "%10lld %9.4f %8.0f %5.1f%% %11.4g %9.4f %10.4f %10.4f %7.2f %7.2f %9.2f %9.2f "
        "%9.2g\n",
        static_cast<long long>(r.candidates), r.fused_tc_ms, gbps, 100 * gbps / flags.peak_gbps,
        r.candidates / (r.fused_tc_ms * 1e-3), r.fused_simt_ms, r.BestFp16Ms(), r.cublas_fp32_ms,
        r.BestFp16Ms() / r.fused_tc_ms, r.cublas_fp32_ms / r.fused_tc_ms, r.cpu_ms, r.score_e2e_ms,
        r.diff_tc);
  }
  std::printf(
      "(maxrel: tensor-core kernel vs %s; x_c16/x_c32: cuBLAS baseline time / fused "
      "time)\n",
      cpu_scorer != nullptr ? "CPU scorer" : "itself");

  if (!flags.json_path.empty()) {
    std::string json = "{\n";
    json += absl::StrCat("  \"device\": ", JsonString(prop.name), ",\n");
    json += absl::StrCat("  \"sm\": ", JsonString(absl::StrCat(prop.major, prop.minor)), ",\n");
    json += absl::StrCat("  \"scorer\": ", JsonString(std::string((*cuda_scorer)->name())), ",\n");
    json += absl::StrCat("  \"hbm_peak_gbps\": ", JsonNumber(flags.peak_gbps), ",\n");
    json += absl::StrCat("  \"query_tokens\": ", kQueryTokens, ", \"doc_tokens\": ", kDocTokens,
                         ", \"dim\": ", kDim, ", \"dtype\": \"fp16\",\n");
    json += "  \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const SizeResult& r = results[i];
      const double gbps = r.doc_bytes / (r.fused_tc_ms * 1e-3) / 1e9;
      json += absl::StrCat(
          "    {\"candidates\": ", r.candidates, ", \"doc_bytes\": ", JsonNumber(r.doc_bytes),
          ", \"fused_tc_ms\": ", JsonNumber(r.fused_tc_ms),
          ", \"fused_tc_gbps\": ", JsonNumber(gbps),
          ", \"fused_tc_of_peak\": ", JsonNumber(gbps / flags.peak_gbps),
          ", \"fused_tc_candidates_per_s\": ", JsonNumber(r.candidates / (r.fused_tc_ms * 1e-3)),
          ", \"fused_simt_ms\": ", JsonNumber(r.fused_simt_ms),
          ", \"fused_simt_gbps\": ", JsonNumber(r.doc_bytes / (r.fused_simt_ms * 1e-3) / 1e9),
          ", \"cublas_fp16_ms\": ", JsonNumber(r.cublas_fp16_ms),
          ", \"cublas_fp16_batched_ms\": ", JsonNumber(r.cublas_fp16_batched_ms),
          ", \"cublas_fp32_ms\": ", JsonNumber(r.cublas_fp32_ms),
          ", \"speedup_vs_cublas_fp16\": ", JsonNumber(r.BestFp16Ms() / r.fused_tc_ms),
          ", \"speedup_vs_cublas_fp32\": ", JsonNumber(r.cublas_fp32_ms / r.fused_tc_ms),
          ", \"cpu_ms\": ", JsonNumber(r.cpu_ms), ", \"cpu_threads\": ", r.cpu_threads,
          ", \"score_e2e_ms\": ", JsonNumber(r.score_e2e_ms),
          ", \"max_rel_diff_tc\": ", JsonNumber(r.diff_tc),
          ", \"max_rel_diff_simt\": ", JsonNumber(r.diff_simt),
          ", \"max_rel_diff_cublas_fp16\": ", JsonNumber(r.diff_cublas_fp16),
          ", \"max_rel_diff_cublas_fp32\": ", JsonNumber(r.diff_cublas_fp32),
          ", \"max_rel_diff_e2e\": ", JsonNumber(r.diff_e2e),
          ", \"reference\": ", cpu_scorer != nullptr ? "\"cpu\"" : "\"fused_tc\"", "}",
          i + 1 < results.size() ? "," : "", "\n");
    }
    json += "  ]\n}\n";
    FILE* f = std::fopen(flags.json_path.c_str(), "w");
    if (f == nullptr || std::fwrite(json.data(), 1, json.size(), f) != json.size()) {
      std::fprintf(stderr, "tessera-bench-gpu: cannot write %s\n", flags.json_path.c_str());
      return 1;
    }
    std::fclose(f);
    std::printf("wrote %s\n", flags.json_path.c_str());
  }
  CHECK_CUBLAS(cublasDestroy(cublas));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
