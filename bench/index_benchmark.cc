// End-to-end index benchmark through the public engine API (not a Google Benchmark: it measures a
// whole workload). Ingests synthetic ColBERT-like documents, then measures search latency and QPS
// at k = 10 with default parameters, recall@10 against exhaustive search, and storage figures.
//
//   tessera-bench-index [--docs N] [--tokens T] [--dim D] [--queries Q] [--recall_queries R]
//                       [--pool_factor P] [--candidates pooled|global] [--candidate_pool_factor C]
//                       [--factory F] [--data_dir DIR] [--json FILE] [--threads N]
//
// Documents mix four of 1,024 topic directions (token noise of norm 0.6 around them); one in five
// is a near duplicate of the previous one (noise of norm 0.2). Queries are 32 tokens drawn from a
// random document with noise of norm 0.4.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tessera/engine.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  int64_t docs = 100000;
  int64_t tokens = 128;
  int64_t dim = 128;
  int queries = 500;
  int recall_queries = 50;
  int pool_factor = 2;
  int threads = 0;
  std::string candidates = "pooled";  // pooled | global
  int candidate_pool_factor = 4;
  std::string factory = "auto";
  std::string data_dir = "/tmp/tessera-bench-index";
  std::string json;
};

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    bool ok = true;
    if (flag == "--docs") {
      ok = absl::SimpleAtoi(value, &flags->docs);
    } else if (flag == "--tokens") {
      ok = absl::SimpleAtoi(value, &flags->tokens);
    } else if (flag == "--dim") {
      ok = absl::SimpleAtoi(value, &flags->dim);
    } else if (flag == "--queries") {
      ok = absl::SimpleAtoi(value, &flags->queries);
    } else if (flag == "--recall_queries") {
      ok = absl::SimpleAtoi(value, &flags->recall_queries);
    } else if (flag == "--pool_factor") {
      ok = absl::SimpleAtoi(value, &flags->pool_factor);
    } else if (flag == "--threads") {
      ok = absl::SimpleAtoi(value, &flags->threads);
    } else if (flag == "--candidates") {
      flags->candidates = value;
      ok = value == "pooled" || value == "global";
    } else if (flag == "--candidate_pool_factor") {
      ok = absl::SimpleAtoi(value, &flags->candidate_pool_factor);
    } else if (flag == "--factory") {
      flags->factory = value;
    } else if (flag == "--data_dir") {
      flags->data_dir = value;
    } else if (flag == "--json") {
      flags->json = value;
    } else {
      ok = false;
    }
    if (!ok) {
      std::cerr << "bad flag " << flag << " " << value << "\n";
      return false;
    }
  }
  return argc % 2 == 1;
}

class Generator {
 public:
  Generator(int64_t dim, uint32_t seed)
      : dim_(dim),
        scale_(1.0f / std::sqrt(static_cast<float>(dim))),
        rng_(seed),
        topics_(1024 * dim) {
    for (float& v : topics_) v = normal_(rng_);
    Normalize(topics_);
  }

  std::vector<float> Document(int64_t tokens) {
    std::uniform_int_distribution<int> topic(0, 1023);
    const int chosen[4] = {topic(rng_), topic(rng_), topic(rng_), topic(rng_)};
    std::vector<float> out(tokens * dim_);
    for (int64_t i = 0; i < tokens; ++i) {
      const float* center = &topics_[chosen[i % 4] * dim_];
      for (int64_t k = 0; k < dim_; ++k)
        out[i * dim_ + k] = center[k] + 0.6f * scale_ * normal_(rng_);
    }
    Normalize(out);
    return out;
  }

  std::vector<float> NearDuplicate(std::vector<float> source) {
    for (float& v : source) v += 0.2f * scale_ * normal_(rng_);
    Normalize(source);
    return source;
  }

  std::vector<float> Query(const std::vector<float>& document, int64_t tokens) {
    const int64_t rows = static_cast<int64_t>(document.size()) / dim_;
    std::uniform_int_distribution<int64_t> pick(0, rows - 1);
    std::vector<float> out(tokens * dim_);
    for (int64_t i = 0; i < tokens; ++i) {
      const int64_t row = pick(rng_);
      for (int64_t k = 0; k < dim_; ++k) {
        out[i * dim_ + k] = document[row * dim_ + k] + 0.4f * scale_ * normal_(rng_);
      }
    }
    Normalize(out);
    return out;
  }

 private:
  void Normalize(std::vector<float>& v) {
    for (size_t r = 0; r < v.size() / dim_; ++r) {
      double s = 0;
      for (int64_t k = 0; k < dim_; ++k) s += v[r * dim_ + k] * v[r * dim_ + k];
      for (int64_t k = 0; k < dim_; ++k) v[r * dim_ + k] /= std::sqrt(s);
    }
  }

  int64_t dim_;
  float scale_;  // noise levels are norms relative to unit vectors: per-coordinate σ = level/√dim
  std::mt19937 rng_;
  std::normal_distribution<float> normal_;
  std::vector<float> topics_;
};

int64_t DirectoryBytes(const std::string& path) {
  int64_t total = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(path)) {
    if (entry.is_regular_file()) total += static_cast<int64_t>(entry.file_size());
  }
  return total;
}

double Percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const size_t index = std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  return values[index];
}

int Run(const Flags& flags) {
  std::filesystem::remove_all(flags.data_dir);
  EngineOptions options;
  options.threads = flags.threads;
  auto engine = Engine::Open(flags.data_dir, options);
  if (!engine.ok()) {
    std::cerr << engine.status() << "\n";
    return 1;
  }
  CollectionSchema schema;
  schema.name = "bench";
  schema.dim = flags.dim;
  schema.pooling.hierarchical->pool_factor = flags.pool_factor;
  schema.candidates.kind = flags.candidates == "global" ? CandidateSpec::Kind::kGlobalMean
                                                        : CandidateSpec::Kind::kPooled;
  schema.candidates.pool_factor = flags.candidate_pool_factor;
  schema.candidates.factory = flags.factory;
  auto collection = (*engine)->CreateCollection(schema);
  if (!collection.ok()) {
    std::cerr << collection.status() << "\n";
    return 1;
  }
  Generator generator(flags.dim, 42);
  // Keep a sample of documents to draw queries from.
  std::vector<std::vector<float>> sample;
  std::vector<float> previous;
  const Clock::time_point ingest_start = Clock::now();
  constexpr int64_t kBatch = 256;
  for (int64_t begin = 0; begin < flags.docs; begin += kBatch) {
    std::vector<Document> batch;
    for (int64_t d = begin; d < std::min(flags.docs, begin + kBatch); ++d) {
      Document document;
      document.id = absl::StrCat("doc-", d);
      document.tokens =
          (d % 5 == 4) ? generator.NearDuplicate(previous) : generator.Document(flags.tokens);
      previous = document.tokens;
      document.num_tokens = flags.tokens;
      document.dim = flags.dim;
      if (d % 97 == 0) sample.push_back(document.tokens);
      batch.push_back(std::move(document));
    }
    for (const UpsertOutcome& outcome : (*collection)->Upsert(std::move(batch))) {
      if (!outcome.status.ok()) {
        std::cerr << outcome.status << "\n";
        return 1;
      }
    }
    if ((begin / kBatch) % 40 == 0) {
      std::cerr << "ingested " << std::min(flags.docs, begin + kBatch) << "\r" << std::flush;
    }
  }
  const double ingest_seconds = std::chrono::duration<double>(Clock::now() - ingest_start).count();
  if (!(*collection)->Snapshot().ok()) return 1;
  const CollectionStats stats = (*collection)->Stats();

  // Latency and QPS, one query at a time (the server's per-request path).
  std::vector<std::vector<float>> queries;
  std::mt19937 pick(7);
  for (int q = 0; q < flags.queries; ++q) {
    queries.push_back(generator.Query(sample[pick() % sample.size()], 32));
  }
  std::vector<double> latencies;
  double candidates_ms = 0, fetch_ms = 0, rerank_ms = 0;
  int64_t scored = 0;
  const Clock::time_point search_start = Clock::now();
  for (const auto& query : queries) {
    const Clock::time_point start = Clock::now();
    auto result = (*collection)->Search(FloatMatrixView{query.data(), 32, flags.dim}, {});
    if (!result.ok()) {
      std::cerr << result.status() << "\n";
      return 1;
    }
    latencies.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    candidates_ms += result->timings.candidates_ms;
    fetch_ms += result->timings.fetch_ms;
    rerank_ms += result->timings.rerank_ms;
    scored += result->documents_scored;
  }
  const double search_seconds = std::chrono::duration<double>(Clock::now() - search_start).count();

  // Recall@10 against exhaustive search.
  double recall = 0;
  const int recall_queries = std::min<int>(flags.recall_queries, queries.size());
  for (int q = 0; q < recall_queries; ++q) {
    const FloatMatrixView view{queries[q].data(), 32, flags.dim};
    SearchOptions exhaustive;
    exhaustive.exhaustive = true;
    auto exact = (*collection)->Search(view, exhaustive);
    auto fast = (*collection)->Search(view, {});
    if (!exact.ok() || !fast.ok()) return 1;
    std::set<std::string> truth;
    for (const SearchHit& hit : exact->hits) truth.insert(hit.id);
    for (const SearchHit& hit : fast->hits) recall += truth.count(hit.id) / 10.0;
  }
  recall /= std::max(1, recall_queries);

  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double n = static_cast<double>(flags.docs);
  const int64_t disk = DirectoryBytes(flags.data_dir);
  std::string json = absl::StrCat(
      "{\n  \"documents\": ", flags.docs, ",\n  \"tokens_per_document\": ", flags.tokens,
      ",\n  \"dim\": ", flags.dim, ",\n  \"pool_factor\": ", flags.pool_factor,
      ",\n  \"ingest_docs_per_s\": ", n / ingest_seconds,
      ",\n  \"vectors_per_document\": ", stats.vectors_per_document, ",\n  \"candidates\": \"",
      flags.candidates, "\",\n  \"candidate_vectors\": ", stats.candidate_vectors,
      ",\n  \"candidate_index\": \"",
      stats.candidate_indexes.empty() ? "" : stats.candidate_indexes[0],
      "\",\n  \"search_qps\": ", flags.queries / search_seconds,
      ",\n  \"latency_ms_p50\": ", Percentile(latencies, 0.50),
      ",\n  \"latency_ms_p95\": ", Percentile(latencies, 0.95),
      ",\n  \"latency_ms_p99\": ", Percentile(latencies, 0.99),
      ",\n  \"stage_ms_mean\": {\"candidates\": ", candidates_ms / flags.queries,
      ", \"fetch\": ", fetch_ms / flags.queries, ", \"rerank\": ", rerank_ms / flags.queries,
      "},\n  \"documents_scored_per_query\": ", static_cast<double>(scored) / flags.queries,
      ",\n  \"recall_at_10\": ", recall, ",\n  \"recall_queries\": ", recall_queries,
      ",\n  \"disk_bytes_per_document\": ", disk / n,
      ",\n  \"disk_bytes_per_original_token\": ", disk / (n * flags.tokens),
      ",\n  \"peak_rss_bytes_per_document\": ", usage.ru_maxrss * 1024.0 / n, "\n}\n");
  std::cout << json;
  if (!flags.json.empty()) std::ofstream(flags.json) << json;
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::Flags flags;
  if (!tessera::ParseFlags(argc, argv, &flags)) {
    std::cerr << "usage: tessera-bench-index [--docs N] [--tokens T] [--dim D] [--queries Q] "
                 "[--recall_queries R] [--pool_factor P] [--candidates pooled|global] "
                 "[--candidate_pool_factor C] [--factory F] [--threads N] [--data_dir DIR] "
                 "[--json FILE]\n";
    return 2;
  }
  return tessera::Run(flags);
}
