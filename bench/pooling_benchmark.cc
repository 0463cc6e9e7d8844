// Hierarchical token pooling throughput, one thread, per method and document length.
//
// Benchmarks (names are parsed by scripts/bench-kernels):
//   BM_PoolTokens/ward/n:256        synthetic topic-clustered documents, dim 128
//   BM_PoolTokens/reference/n:256
//   BM_PoolTokensFromFile/ward      documents read from --docs=FILE.npz (one 2-D float32 array per
//   BM_PoolTokensFromFile/reference document), pool factor from --pool_factor=P (default 2)
// Counter docs_per_s: documents pooled per second.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "tessera/npz.h"
#include "tessera/pooling.h"

namespace tessera {
namespace {

struct Doc {
  std::vector<float> tokens;
  int64_t rows = 0;
  int64_t cols = 0;
};

std::vector<Doc>& FileDocs() {
  static std::vector<Doc> docs;
  return docs;
}
int& FilePoolFactor() {
  static int pool_factor = 2;
  return pool_factor;
}

// A document like a ColBERT one: tokens drawn around a few topic directions with noise, unit norm.
Doc SyntheticDoc(int n, int dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  const int topics = std::max(2, n / 16);
  std::vector<float> centers(topics * dim);
  for (float& v : centers) v = normal(rng);
  Doc doc{std::vector<float>(n * dim), n, dim};
  std::uniform_int_distribution<int> pick(0, topics - 1);
  for (int i = 0; i < n; ++i) {
    const int t = pick(rng);
    double norm = 0;
    for (int k = 0; k < dim; ++k) {
      const float v = centers[t * dim + k] + 0.6f * normal(rng);
      doc.tokens[i * dim + k] = v;
      norm += v * v;
    }
    for (int k = 0; k < dim; ++k) doc.tokens[i * dim + k] /= std::sqrt(norm);
  }
  return doc;
}

void RunPooling(benchmark::State& state, const std::vector<Doc>& docs, PoolingMethod method,
                int pool_factor) {
  TokenPoolingOptions options;
  options.method = method;
  options.pool_factor = pool_factor;
  size_t next = 0;
  for (auto _ : state) {
    const Doc& doc = docs[next++ % docs.size()];
    auto pooled = PoolTokens(FloatMatrixView{doc.tokens.data(), doc.rows, doc.cols}, options);
    if (!pooled.ok()) {
      state.SkipWithError(std::string(pooled.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(pooled->vectors.data());
  }
  state.counters["docs_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_PoolTokens(benchmark::State& state, PoolingMethod method) {
  const int n = static_cast<int>(state.range(0));
  std::vector<Doc> docs;
  for (uint32_t s = 0; s < 8; ++s) docs.push_back(SyntheticDoc(n, 128, 100 + s));
  RunPooling(state, docs, method, 2);
}
BENCHMARK_CAPTURE(BM_PoolTokens, ward, PoolingMethod::kWard)
    ->ArgName("n")
    ->Arg(32)
    ->Arg(256)
    ->Arg(1024);
BENCHMARK_CAPTURE(BM_PoolTokens, reference, PoolingMethod::kReference)
    ->ArgName("n")
    ->Arg(32)
    ->Arg(256)
    ->Arg(1024);

void BM_PoolTokensFromFile(benchmark::State& state, PoolingMethod method) {
  if (FileDocs().empty()) {
    state.SkipWithError("no --docs=FILE.npz given");
    return;
  }
  RunPooling(state, FileDocs(), method, FilePoolFactor());
}
BENCHMARK_CAPTURE(BM_PoolTokensFromFile, ward, PoolingMethod::kWard);
BENCHMARK_CAPTURE(BM_PoolTokensFromFile, reference, PoolingMethod::kReference);

bool LoadDocs(const std::string& path) {
  auto arrays = ReadNpzFile(path);
  if (!arrays.ok()) {
    std::cerr << arrays.status() << "\n";
    return false;
  }
  for (const auto& [name, array] : *arrays) {
    auto values = array.ToFloat32();
    if (!values.ok() || array.shape.size() != 2) {
      std::cerr << "--docs: array '" << name << "' is not a 2-D float matrix\n";
      return false;
    }
    FileDocs().push_back(Doc{std::move(*values), array.shape[0], array.shape[1]});
  }
  return true;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--docs=", 0) == 0) {
      if (!tessera::LoadDocs(arg.substr(7))) return 2;
    } else if (arg.rfind("--pool_factor=", 0) == 0) {
      tessera::FilePoolFactor() = std::stoi(arg.substr(14));
    } else {
      std::cerr << "unknown argument " << arg << "\n";
      return 2;
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
