// The sparse lane's search at scale (not a Google Benchmark: it reports ratios measured in one
// run). Builds a SparseIndex over synthetic documents whose terms follow Zipf's law, then runs the
// same queries with Block-Max MaxScore and with the exhaustive scan of the query terms' postings:
// latency (mean, p50, p99) and postings scored by each, with and without a filter that keeps half
// the documents, for BM25 and for the plain dot product. The skipping answers are checked against
// the exhaustive ones (ids and order).
//
//   tessera-bench-sparse [--docs 100000] [--vocabulary 30000] [--doc_terms 100] [--query_terms 10]
//                        [--queries 500] [--k 10] [--seed 1] [--dot_weights splade|tf]
//
// A second mode runs a real corpus through the index, for a quality check against another BM25
// (bench/eval/sparse_bm25_check.py writes the inputs and reads the run):
//
//   tessera-bench-sparse --corpus DOCS.tsv --queries_tsv QUERIES.tsv --run OUT.tsv [--k 100]
//                        [--k1 1.2] [--b 0.75]
//
// where each line of DOCS.tsv is "iid<TAB>term:tf term:tf ..." (term ids ascending), QUERIES.tsv
// "query_id<TAB>term:weight ...", and OUT.tsv gets "query_id<TAB>iid<TAB>rank<TAB>score".
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "index/sparse/sparse_index.h"
#include "tessera/sparse.h"

namespace tessera::internal {
namespace {

struct Flags {
  int64_t docs = 100'000;
  int64_t vocabulary = 30'000;
  int64_t doc_terms = 100;
  int64_t query_terms = 10;
  int64_t queries = 500;
  int64_t k = 10;
  uint64_t seed = 1;
  double k1 = 1.2;
  double b = 0.75;
  std::string dot_weights = "splade";
  std::string corpus, queries_tsv, run;
};

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

class Zipf {
 public:
  Zipf(int64_t vocabulary, uint64_t seed) : rng_(seed) {
    double sum = 0;
    for (int64_t r = 0; r < vocabulary; ++r) {
      sum += 1.0 / static_cast<double>(r + 1);
      cdf_.push_back(sum);
    }
    for (double& c : cdf_) c /= sum;
  }
  uint32_t Term() {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    const size_t rank = std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin();
    return static_cast<uint32_t>(std::min(rank, cdf_.size() - 1));
  }
  // `draws` terms; repeats add up to integer term frequencies.
  SparseVector Vector(int64_t draws) {
    std::map<uint32_t, float> counts;
    for (int64_t i = 0; i < draws; ++i) counts[Term()] += 1.0f;
    SparseVector v;
    for (const auto& [term, count] : counts) {
      v.indices.push_back(term);
      v.values.push_back(count);
    }
    return v;
  }
  // `distinct` different terms of weight 1.
  SparseVector Query(int64_t distinct) {
    std::map<uint32_t, float> counts;
    while (static_cast<int64_t>(counts.size()) < distinct) counts[Term()] = 1.0f;
    SparseVector v;
    for (const auto& [term, count] : counts) {
      v.indices.push_back(term);
      v.values.push_back(count);
    }
    return v;
  }

 private:
  std::mt19937_64 rng_;
  std::vector<double> cdf_;
};

struct Summary {
  double mean_ms = 0, p50_ms = 0, p99_ms = 0;
  double postings_scored = 0, postings_total = 0;
};

Summary Summarize(std::vector<double> ms, double scored, double total) {
  std::sort(ms.begin(), ms.end());
  Summary s;
  for (double m : ms) s.mean_ms += m / static_cast<double>(ms.size());
  s.p50_ms = ms[ms.size() / 2];
  s.p99_ms = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  s.postings_scored = scored / static_cast<double>(ms.size());
  s.postings_total = total / static_cast<double>(ms.size());
  return s;
}

int RunSynthetic(const Flags& flags) {
  std::printf("cpu: %s\n", CpuModel().c_str());
  std::printf("docs %" PRId64 ", vocabulary %" PRId64 " (Zipf s=1), %" PRId64
              " term draws per document, %" PRId64 " distinct terms per query, k %" PRId64
              ", %" PRId64 " queries\n",
              flags.docs, flags.vocabulary, flags.doc_terms, flags.query_terms, flags.k,
              flags.queries);
  for (const bool idf : {true, false}) {
    Zipf zipf(flags.vocabulary, flags.seed);
    SparseIndexOptions options;
    options.scoring.idf = idf;
    auto created = SparseIndex::Create(options);
    if (!created.ok()) return 1;
    SparseIndex index = std::move(created).value();
    const auto build_start = std::chrono::steady_clock::now();
    int64_t postings = 0;
    std::mt19937 rng(static_cast<uint32_t>(flags.seed));
    for (int64_t d = 0; d < flags.docs; ++d) {
      SparseVector v = zipf.Vector(flags.doc_terms);
      if (!idf) {
        // Dot-product mode, float weights. "splade": frequent terms weigh less, as a learned
        // sparse encoder's stopwords do (tf · (0.1 + 0.9 · ln(1 + rank) / ln(1 + V)) · U(0.8, 1));
        // "tf": tf · U(0.2, 1), where the commonest terms dominate every score.
        for (size_t i = 0; i < v.values.size(); ++i) {
          const double noise = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
          v.values[i] = static_cast<float>(
              flags.dot_weights == "tf"
                  ? v.values[i] * (0.2 + 0.8 * noise)
                  : v.values[i] *
                        (0.1 + 0.9 * std::log1p(static_cast<double>(v.indices[i])) /
                                   std::log1p(static_cast<double>(flags.vocabulary))) *
                        (0.8 + 0.2 * noise));
        }
      }
      postings += static_cast<int64_t>(v.indices.size());
      if (!index.Add(static_cast<uint64_t>(d), v.view()).ok()) return 1;
    }
    const double build_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - build_start).count();
    std::printf("\n[%s] built %" PRId64 " postings in %.2f s\n",
                idf ? "bm25" : ("dot product, " + flags.dot_weights + " weights").c_str(), postings,
                build_s);
    std::vector<SparseVector> queries;
    for (int64_t q = 0; q < flags.queries; ++q) queries.push_back(zipf.Query(flags.query_terms));
    for (const bool filtered : {false, true}) {
      int64_t mismatches = 0;
      std::vector<double> ms[2];
      double scored[2] = {0, 0}, total[2] = {0, 0};
      for (const SparseVector& query : queries) {
        std::vector<SparseHit> answers[2];
        for (const bool exhaustive : {false, true}) {
          SparseSearchRequest request;
          request.query = query.view();
          request.k = flags.k;
          request.exhaustive = exhaustive;
          if (filtered) request.filter = [](uint64_t iid) { return iid % 2 == 0; };
          const auto start = std::chrono::steady_clock::now();
          auto result = index.Search(request);
          const double elapsed =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count();
          if (!result.ok()) return 1;
          ms[exhaustive].push_back(elapsed);
          scored[exhaustive] += static_cast<double>(result->postings_scored);
          total[exhaustive] += static_cast<double>(result->postings_total);
          answers[exhaustive] = result->hits;
        }
        bool same = answers[0].size() == answers[1].size();
        for (size_t i = 0; same && i < answers[0].size(); ++i) {
          same = answers[0][i].iid == answers[1][i].iid;
        }
        mismatches += !same;
      }
      const Summary skip = Summarize(ms[0], scored[0], total[0]);
      const Summary scan = Summarize(ms[1], scored[1], total[1]);
      std::printf(
          "  filter %-4s maxscore: mean %.3f ms p50 %.3f p99 %.3f, postings scored %.0f of "
          "%.0f (%.1f%%)\n",
          filtered ? "1/2" : "none", skip.mean_ms, skip.p50_ms, skip.p99_ms, skip.postings_scored,
          skip.postings_total, 100.0 * skip.postings_scored / skip.postings_total);
      std::printf("              full scan: mean %.3f ms p50 %.3f p99 %.3f, postings scored %.0f\n",
                  scan.mean_ms, scan.p50_ms, scan.p99_ms, scan.postings_scored);
      std::printf("              speedup (mean) %.2fx; answers differing from the scan: %" PRId64
                  "\n",
                  scan.mean_ms / skip.mean_ms, mismatches);
    }
  }
  return 0;
}

// "a:b c:d" → (a, b), (c, d); false on a malformed pair.
bool ParseTerms(const std::string& text, SparseVector* v) {
  v->indices.clear();
  v->values.clear();
  for (absl::string_view pair : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    const std::vector<absl::string_view> parts = absl::StrSplit(pair, ':');
    uint32_t term = 0;
    float weight = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &term) ||
        !absl::SimpleAtof(parts[1], &weight)) {
      return false;
    }
    v->indices.push_back(term);
    v->values.push_back(weight);
  }
  return true;
}

int RunCorpus(const Flags& flags) {
  SparseIndexOptions options;
  options.scoring.k1 = flags.k1;
  options.scoring.b = flags.b;
  auto created = SparseIndex::Create(options);
  if (!created.ok()) {
    std::cerr << created.status() << "\n";
    return 1;
  }
  SparseIndex index = std::move(created).value();
  std::ifstream corpus(flags.corpus);
  std::string line;
  SparseVector v;
  while (std::getline(corpus, line)) {
    const size_t tab = line.find('\t');
    uint64_t iid = 0;
    if (tab == std::string::npos || !absl::SimpleAtoi(line.substr(0, tab), &iid) ||
        !ParseTerms(line.substr(tab + 1), &v)) {
      std::cerr << "bad corpus line: " << line.substr(0, 80) << "\n";
      return 1;
    }
    const absl::Status added = index.Add(iid, v.view());
    if (!added.ok()) {
      std::cerr << added << "\n";
      return 1;
    }
  }
  std::ifstream queries(flags.queries_tsv);
  std::ofstream run(flags.run);
  while (std::getline(queries, line)) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos || !ParseTerms(line.substr(tab + 1), &v)) {
      std::cerr << "bad query line: " << line.substr(0, 80) << "\n";
      return 1;
    }
    SparseSearchRequest request;
    request.query = v.view();
    request.k = flags.k;
    auto result = index.Search(request);
    if (!result.ok()) {
      std::cerr << result.status() << "\n";
      return 1;
    }
    for (size_t r = 0; r < result->hits.size(); ++r) {
      char score[32];
      std::snprintf(score, sizeof(score), "%.9g", result->hits[r].score);
      run << line.substr(0, tab) << '\t' << result->hits[r].iid << '\t' << r + 1 << '\t' << score
          << '\n';
    }
  }
  return 0;
}

}  // namespace
}  // namespace tessera::internal

int main(int argc, char** argv) {
  tessera::internal::Flags flags;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string name = argv[i];
    const std::string value = argv[i + 1];
    int64_t number = 0;
    const bool numeric = absl::SimpleAtoi(value, &number);
    if (name == "--corpus") {
      flags.corpus = value;
    } else if (name == "--queries_tsv") {
      flags.queries_tsv = value;
    } else if (name == "--run") {
      flags.run = value;
    } else if (name == "--dot_weights") {
      flags.dot_weights = value;
    } else if (name == "--k1" || name == "--b") {
      if (!absl::SimpleAtod(value, name == "--k1" ? &flags.k1 : &flags.b)) {
        std::cerr << "bad flag " << name << " " << value << "\n";
        return 2;
      }
    } else if (!numeric) {
      std::cerr << "bad flag " << name << " " << value << "\n";
      return 2;
    } else if (name == "--docs") {
      flags.docs = number;
    } else if (name == "--vocabulary") {
      flags.vocabulary = number;
    } else if (name == "--doc_terms") {
      flags.doc_terms = number;
    } else if (name == "--query_terms") {
      flags.query_terms = number;
    } else if (name == "--queries") {
      flags.queries = number;
    } else if (name == "--k") {
      flags.k = number;
    } else if (name == "--seed") {
      flags.seed = static_cast<uint64_t>(number);
    } else {
      std::cerr << "unknown flag " << name << "\n";
      return 2;
    }
  }
  if (!flags.corpus.empty()) return tessera::internal::RunCorpus(flags);
  return tessera::internal::RunSynthetic(flags);
}
