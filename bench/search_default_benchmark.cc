// Where an exhaustive search of a small shard stops being cheaper than the cascade: exact MaxSim
// of every document against the default cascade (stage 1, then the exact rerank of N = 100, the
// default N for k = 10 up to 262,144 vectors), through the public engine API on one-shard
// collections of growing size. The crossover sets kExhaustiveDefaultMaxVectors
// (index/collection/shard.h), below which a search that leaves N at 0 scores every document.
//
// Workload: the synthetic corpus of tessera-bench-index (documents mix four of 1,024 topic
// directions, one in five a near duplicate of the one before), dim 128, default schema (Ward
// pooling p = 2, "auto" stage 1: the candidate scan below 16,384 vectors, the centroid index
// from there on); queries of 32 tokens drawn from stored documents. Two document shapes: 128
// tokens (64 vectors: passages) and 1,024 tokens (512 vectors: ColPali pages).
//
// Benchmark names (stable):
//   BM_Search/{exhaustive,cascade}/tokens:T/docs:D/process_time/real_time
//       time: wall; cpu: the whole process's CPU time (the search's pool threads included);
//       counters vectors (the shard's rerank vectors) and scored (documents scored per search).
// Compare each pair at the median of repetitions run interleaved, on a quiet machine:
//   tessera-bench-search-default --benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "tessera/engine.h"

namespace tessera {
namespace {

constexpr int64_t kDim = 128;
constexpr int64_t kQueryTokens = 32;
constexpr int kQueries = 64;

void Normalize(std::vector<float>& rows) {
  for (size_t r = 0; r < rows.size(); r += kDim) {
    float norm = 0;
    for (int64_t k = 0; k < kDim; ++k) norm += rows[r + k] * rows[r + k];
    norm = std::sqrt(norm);
    for (int64_t k = 0; k < kDim; ++k) rows[r + k] /= norm;
  }
}

// One collection of `docs` documents of `tokens` tokens, built once per shape and size.
struct Built {
  std::string dir;
  std::unique_ptr<Engine> engine;
  std::shared_ptr<Collection> collection;
  std::vector<std::vector<float>> queries;
  int64_t vectors = 0;
};

Built& Build(int64_t tokens, int64_t docs) {
  static auto* const kBuiltByShape =
      new std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Built>>;
  std::unique_ptr<Built>& slot = (*kBuiltByShape)[{tokens, docs}];
  if (slot != nullptr) return *slot;
  slot = std::make_unique<Built>();
  Built& b = *slot;
  b.dir = absl::StrCat(std::filesystem::temp_directory_path().string(),
                       "/tessera-bench-search-default-", tokens, "-", docs);
  std::filesystem::remove_all(b.dir);
  auto engine = Engine::Open(b.dir);
  if (!engine.ok()) std::abort();
  b.engine = std::move(*engine);
  CollectionSchema schema;
  schema.name = "bench";
  schema.dim = kDim;
  auto collection = b.engine->CreateCollection(schema);
  if (!collection.ok()) std::abort();
  b.collection = *collection;

  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  std::vector<float> topics(1024 * kDim);
  for (float& v : topics) v = normal(rng);
  Normalize(topics);
  std::uniform_int_distribution<int> topic(0, 1023);
  std::vector<float> previous;
  std::vector<std::vector<float>> sample;
  for (int64_t begin = 0; begin < docs; begin += 64) {
    std::vector<Document> batch;
    for (int64_t d = begin; d < std::min(docs, begin + 64); ++d) {
      Document document;
      document.id = absl::StrCat("doc-", d);
      document.num_tokens = tokens;
      document.dim = kDim;
      if (d % 5 == 4) {
        document.tokens = previous;
        for (float& v : document.tokens) v += 0.2f * scale * normal(rng);
      } else {
        const int chosen[4] = {topic(rng), topic(rng), topic(rng), topic(rng)};
        document.tokens.resize(tokens * kDim);
        for (int64_t i = 0; i < tokens; ++i) {
          for (int64_t k = 0; k < kDim; ++k) {
            document.tokens[i * kDim + k] =
                topics[chosen[i % 4] * kDim + k] + 0.6f * scale * normal(rng);
          }
        }
      }
      Normalize(document.tokens);
      previous = document.tokens;
      if (sample.size() < kQueries) sample.push_back(document.tokens);
      batch.push_back(std::move(document));
    }
    for (const UpsertOutcome& outcome : b.collection->Upsert(std::move(batch))) {
      if (!outcome.status.ok()) std::abort();
    }
  }
  while (b.collection->Stats().training_shards > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  b.vectors = b.collection->Stats().rerank_vectors;
  for (int q = 0; q < kQueries; ++q) {
    const std::vector<float>& source = sample[q % sample.size()];
    const int64_t rows = static_cast<int64_t>(source.size()) / kDim;
    std::uniform_int_distribution<int64_t> pick(0, rows - 1);
    std::vector<float> query(kQueryTokens * kDim);
    for (int64_t i = 0; i < kQueryTokens; ++i) {
      const int64_t row = pick(rng);
      for (int64_t k = 0; k < kDim; ++k) {
        query[i * kDim + k] = source[row * kDim + k] + 0.4f * scale * normal(rng);
      }
    }
    Normalize(query);
    b.queries.push_back(std::move(query));
  }
  return b;
}

void BM_Search(benchmark::State& state, bool exhaustive) {
  Built& b = Build(state.range(0), state.range(1));
  SearchOptions options;
  options.k = 10;
  options.exhaustive = exhaustive;
  if (!exhaustive) options.num_candidates = 100;  // the cascade's default N, set explicitly
  int64_t scored = 0, searches = 0;
  for (auto _ : state) {
    const std::vector<float>& query = b.queries[searches % kQueries];
    auto result = b.collection->Search(FloatMatrixView{query.data(), kQueryTokens, kDim}, options);
    if (!result.ok()) {
      state.SkipWithError(std::string(result.status().message()).c_str());
      return;
    }
    scored += result->documents_scored;
    ++searches;
  }
  state.counters["vectors"] = static_cast<double>(b.vectors);
  state.counters["scored"] = searches > 0 ? static_cast<double>(scored) / searches : 0.0;
}

void Sizes(benchmark::internal::Benchmark* bm) {
  bm->ArgNames({"tokens", "docs"});
  for (int64_t docs : {100, 150, 200, 250, 300, 400, 800, 3200}) bm->Args({128, docs});
  for (int64_t docs : {100, 150, 200, 300, 400}) bm->Args({1024, docs});
  // Wall time, and the CPU time of the whole process (the search's pool threads included): on a
  // shared machine the CPU time is the steadier measure of the work a search costs.
  bm->MeasureProcessCPUTime()->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(BM_Search, exhaustive, true)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Search, cascade, false)->Apply(Sizes);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
