// End-to-end index benchmark through the public engine API (not a Google Benchmark: it measures a
// whole workload; scripts/bench-scale and scripts/bench-index run it). Builds one collection
// (ingest, the shard's background training, a flush), then runs the queries one at a time with
// default options (latency, QPS) and exhaustively (recall@10 of the default against exact MaxSim
// over every document, and the exhaustive latency), and reports build, memory and storage figures
// as JSON. --nprobe / --num_candidates measure more search settings on the same collection (every
// combination; the first is the one the top-level keys report).
//
//   tessera-bench-index [--docs N] [--tokens T] [--dim D] [--queries Q] [--pool_factor P]
//                       [--max_merge_height H] [--candidates pooled|global]
//                       [--rerank exact|codes] [--residual_bits 2|4]
//                       [--candidate_pool_factor C] [--factory F] [--resample_from DIR]
//                       [--data_dir DIR] [--json FILE] [--threads N]
//                       [--resident_rerank_bytes B]
//                       [--nprobe P1,P2,...] [--num_candidates N1,N2,...]
//                       [--exhaustive_queries R] [--exhaustive_timed T] [--reuse 0|1]
//                       [--export_dir DIR] [--reference FILE]
//                       [--centroid_sizing list_length|square_root]
//
// --centroid_sizing list_length sizes the centroid codebook and the default nprobe by a fixed
// average list length (internal::CentroidSizing::kListLength) instead of the default √vectors
// rule, so that one binary measures both; the JSON reports it (centroid_sizing) beside the
// shard's trainings (trainings_completed, last_training_s: the last one's seconds, its encoding
// of every document included).
// --rerank codes makes stage 2 score the vectors decoded from the centroid codes
// (CandidateSpec::rerank_from_codes) instead of stored fp16 rerank vectors; --residual_bits sets
// the codes' bits per dimension (default: the mode's, 4 with --rerank codes).
// --max_merge_height defaults to 0, the plain n / p cut, so that a shard holds exactly
// docs · tokens / p pooled vectors whatever the corpus (collections default to an adaptive limit
// that keeps more vectors where tokens are far apart; scripts/eval measures it on real text).
// --reuse 1 reopens the collection a previous run left in --data_dir (same --docs and corpus
// flags) instead of building it, so that search changes can be measured at scale without a
// rebuild; the build keys then report the reopen (build_s is the time to open and load). build_s
// and ingest_s leave out the time the benchmark spends making the corpus (generate_s). Every run
// leaves its exact reference in DATA_DIR/exact_top10.txt, which a --reuse run reads instead of
// repeating the pass when it covers the checked queries, and a synthetic run its queries in
// DATA_DIR/queries.f32, which spares a --reuse run making the corpus again to draw them.
// --reference FILE reads the exact reference from FILE, the exact_top10.txt of an earlier run on
// the same documents and queries (another candidate index stores the same rerank vectors, so the
// reference is the same), instead of computing it.
// --export_dir DIR writes what a peer engine needs to index the vectors this shard stores and to be
// scored against the same reference (bench/scale/peers_at_scale.py reads it), after the
// measurements so that they are not affected. Raw files in native byte order (little-endian on
// every platform Tessera builds for), each readable with np.fromfile or np.memmap:
//   doc_vectors.f16    every document's stored rerank vectors as stored (binary16; Get with
//                      stored_bytes), documents concatenated: total × dim, row-major
//   doc_offsets.u64    uint64, documents + 1: document i is rows [offsets[i], offsets[i + 1])
//   doc_ids.txt        document i's id on line i (documents in key order)
//   queries.f32        the timed queries' tokens (float32), concatenated: rows × dim
//   query_offsets.u64  uint64, queries + 1, as doc_offsets (token counts: the differences)
//   exact_top10.txt    the exact reference of the checked queries, as DATA_DIR/exact_top10.txt
// Synthetic corpus (default): documents mix four of 1,024 topic directions (token noise of norm
// 0.6 around them); one in five is a near duplicate of the previous one (noise of norm 0.2).
// Queries are 32 tokens drawn from a random document with noise of norm 0.4. With
// --resample_from, documents and queries come from real token embeddings (ResampledCorpus).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "index/centroid/centroid_codebook.h"
#include "tessera/engine.h"
#include "tessera/maxsim.h"
#include "tessera/npy.h"
#include "tessera/status_macros.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  int64_t docs = 100000;
  int64_t tokens = 128;
  int64_t dim = 128;
  int queries = 200;
  int exhaustive_queries = -1;  // recall over the first R queries; -1: all of them
  int exhaustive_timed = 10;    // exhaustive searches timed (exhaustive_ms)
  int pool_factor = 2;
  double max_merge_height = 0.0;  // the plain n / p cut
  int threads = 0;
  int64_t resident_rerank_bytes = -1;  // -1: the engine's default
  std::vector<int> nprobes = {0};      // search settings measured, each against exhaustive
  std::vector<int> num_candidates = {0};
  std::string candidates = "pooled";  // pooled | global
  int candidate_pool_factor = 4;
  std::string factory = "auto";
  std::string rerank = "exact";  // exact | codes (CandidateSpec::rerank_from_codes)
  int residual_bits = 0;         // 0: the mode's default (4 with codes, 2 otherwise)
  std::string resample_from;     // resample_source.py output
  std::string data_dir = "/tmp/tessera-bench-index";
  std::string json;
  std::string export_dir;  // empty: no export
  std::string reference;   // empty: computed (or, with reuse, read from data_dir)
  bool reuse = false;
  std::string centroid_sizing = "square_root";  // square_root (the default) | list_length
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
    } else if (flag == "--exhaustive_queries") {
      ok = absl::SimpleAtoi(value, &flags->exhaustive_queries);
    } else if (flag == "--exhaustive_timed") {
      ok = absl::SimpleAtoi(value, &flags->exhaustive_timed) && flags->exhaustive_timed >= 0;
    } else if (flag == "--pool_factor") {
      ok = absl::SimpleAtoi(value, &flags->pool_factor);
    } else if (flag == "--max_merge_height") {
      ok = absl::SimpleAtod(value, &flags->max_merge_height);
    } else if (flag == "--nprobe" || flag == "--num_candidates") {
      std::vector<int>& list = flag == "--nprobe" ? flags->nprobes : flags->num_candidates;
      list.clear();
      for (absl::string_view item : absl::StrSplit(value, ',')) {
        int parsed = 0;
        ok = ok && absl::SimpleAtoi(item, &parsed) && parsed >= 0;
        list.push_back(parsed);
      }
    } else if (flag == "--threads") {
      ok = absl::SimpleAtoi(value, &flags->threads);
    } else if (flag == "--resident_rerank_bytes") {
      ok = absl::SimpleAtoi(value, &flags->resident_rerank_bytes) &&
           flags->resident_rerank_bytes >= 0;
    } else if (flag == "--candidates") {
      flags->candidates = value;
      ok = value == "pooled" || value == "global";
    } else if (flag == "--candidate_pool_factor") {
      ok = absl::SimpleAtoi(value, &flags->candidate_pool_factor);
    } else if (flag == "--factory") {
      flags->factory = value;
    } else if (flag == "--rerank") {
      flags->rerank = value;
      ok = value == "exact" || value == "codes";
    } else if (flag == "--residual_bits") {
      ok = absl::SimpleAtoi(value, &flags->residual_bits) &&
           (flags->residual_bits == 2 || flags->residual_bits == 4);
    } else if (flag == "--resample_from") {
      flags->resample_from = value;
    } else if (flag == "--data_dir") {
      flags->data_dir = value;
    } else if (flag == "--json") {
      flags->json = value;
    } else if (flag == "--export_dir") {
      flags->export_dir = value;
    } else if (flag == "--reference") {
      flags->reference = value;
    } else if (flag == "--centroid_sizing") {
      flags->centroid_sizing = value;
      ok = value == "list_length" || value == "square_root";
    } else if (flag == "--reuse") {
      ok = value == "0" || value == "1";
      flags->reuse = value == "1";
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

// Each row of v (rows × dim) scaled to unit L2 norm.
void NormalizeRows(std::vector<float>& v, int64_t dim) {
  for (size_t r = 0; r < v.size() / dim; ++r) {
    double s = 0;
    for (int64_t k = 0; k < dim; ++k) s += v[r * dim + k] * v[r * dim + k];
    for (int64_t k = 0; k < dim; ++k) v[r * dim + k] /= std::sqrt(s);
  }
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
  void Normalize(std::vector<float>& v) { NormalizeRows(v, dim_); }

  int64_t dim_;
  float scale_;  // noise levels are norms relative to unit vectors: per-coordinate σ = level/√dim
  std::mt19937 rng_;
  std::normal_distribution<float> normal_;
  std::vector<float> topics_;
};

// Documents made of spans of real token embeddings (scripts/bench-scale --corpus resampled):
// each document concatenates spans of up to kSpan consecutive tokens of random source documents,
// adds noise of norm kNoise per token and renormalises; queries are the source's real queries.
class ResampledCorpus {
 public:
  static constexpr int64_t kSpan = 32;
  static constexpr float kNoise = 0.1f;

  static absl::StatusOr<ResampledCorpus> Load(const std::string& dir, int64_t dim) {
    ResampledCorpus corpus(dim);
    TESSERA_RETURN_IF_ERROR(LoadSide(dir, "doc", dim, &corpus.doc_tokens_, &corpus.doc_offsets_));
    TESSERA_RETURN_IF_ERROR(
        LoadSide(dir, "query", dim, &corpus.query_tokens_, &corpus.query_offsets_));
    return corpus;
  }

  std::vector<float> Document(int64_t tokens) {
    std::uniform_int_distribution<int64_t> source(0, doc_offsets_.size() - 2);
    std::vector<float> out;
    out.reserve(tokens * dim_);
    while (static_cast<int64_t>(out.size()) < tokens * dim_) {
      const int64_t d = source(rng_);
      const int64_t length = doc_offsets_[d + 1] - doc_offsets_[d];
      const int64_t span =
          std::min({kSpan, length, tokens - static_cast<int64_t>(out.size()) / dim_});
      const int64_t first =
          doc_offsets_[d] + std::uniform_int_distribution<int64_t>(0, length - span)(rng_);
      out.insert(out.end(), doc_tokens_.begin() + first * dim_,
                 doc_tokens_.begin() + (first + span) * dim_);
    }
    const float sigma = kNoise / std::sqrt(static_cast<float>(dim_));
    for (float& v : out) v += sigma * normal_(rng_);
    NormalizeRows(out, dim_);
    return out;
  }

  int64_t num_queries() const { return static_cast<int64_t>(query_offsets_.size()) - 1; }
  std::vector<float> Query(int64_t q) const {
    return std::vector<float>(query_tokens_.begin() + query_offsets_[q] * dim_,
                              query_tokens_.begin() + query_offsets_[q + 1] * dim_);
  }

 private:
  explicit ResampledCorpus(int64_t dim) : dim_(dim), rng_(42) {}

  static absl::Status LoadSide(const std::string& dir, const std::string& side, int64_t dim,
                               std::vector<float>* tokens, std::vector<int64_t>* offsets) {
    TESSERA_ASSIGN_OR_RETURN(NpyArray token_array,
                             ReadNpyFile(absl::StrCat(dir, "/", side, "_tokens.npy")));
    TESSERA_ASSIGN_OR_RETURN(NpyArray offset_array,
                             ReadNpyFile(absl::StrCat(dir, "/", side, "_offsets.npy")));
    if (token_array.shape.size() != 2 || token_array.shape[1] != dim) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, "/", side, "_tokens.npy: expected rows × ", dim));
    }
    TESSERA_ASSIGN_OR_RETURN(*tokens, token_array.ToFloat32());
    TESSERA_ASSIGN_OR_RETURN(*offsets, offset_array.ToInt64());
    if (offsets->size() < 2 || offsets->front() != 0 || offsets->back() != token_array.shape[0] ||
        !std::is_sorted(offsets->begin(), offsets->end())) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, "/", side, "_offsets.npy does not partition the tokens"));
    }
    return absl::OkStatus();
  }

  int64_t dim_;
  std::mt19937 rng_;
  std::normal_distribution<float> normal_;
  std::vector<float> doc_tokens_, query_tokens_;
  std::vector<int64_t> doc_offsets_, query_offsets_;
};

int64_t DirectoryBytes(const std::string& path) {
  int64_t total = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(path)) {
    if (entry.is_regular_file()) total += static_cast<int64_t>(entry.file_size());
  }
  return total;
}

// The CPU's model name from /proc/cpuinfo ("unknown" where there is none), for the JSON: machines
// of one kind differ (Zen 4 with AVX-512, Zen 3 AVX2-only), so a figure names its CPU.
std::string CpuModel() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (absl::StartsWith(line, "model name")) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
    }
  }
  return "unknown";
}

// A field of /proc/self/status in bytes ("RssAnon", "RssFile"; its kB value × 1024), 0 where
// there is none. peak_rss_bytes counts the pages of mapped segment files a search touched (page
// cache the kernel may take back); the anonymous part at the end of the run is the process's own.
int64_t ProcStatusBytes(absl::string_view field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (!absl::StartsWith(line, field) || line.size() <= field.size() ||
        line[field.size()] != ':') {
      continue;
    }
    int64_t kilobytes = 0;
    std::string value(absl::StripAsciiWhitespace(line.substr(field.size() + 1)));
    if (absl::EndsWith(value, " kB")) value.resize(value.size() - 3);
    return absl::SimpleAtoi(value, &kilobytes) ? kilobytes * 1024 : 0;
  }
  return 0;
}

// The kernel family the CPU scorer runs here (DetectCpuIsa), as bench-kernels names it.
const char* CpuIsaName() {
  switch (DetectCpuIsa()) {
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx2:
      return "avx2";
    default:
      return "portable";
  }
}

double Mean(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return values.empty() ? 0.0 : sum / static_cast<double>(values.size());
}

double Percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const size_t index = std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  return values[index];
}

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// doc-0 … doc-(docs−1) in key order: reading them in this order is sequential for what is not
// resident.
std::vector<std::string> DocumentIdsInKeyOrder(int64_t docs) {
  std::vector<std::string> ids;
  ids.reserve(docs);
  for (int64_t d = 0; d < docs; ++d) ids.push_back(absl::StrCat("doc-", d));
  std::sort(ids.begin(), ids.end());
  return ids;
}

// The ids of the exact top 10 (score desc, id asc) of queries[0 .. checked) over documents
// doc-0 … doc-(docs−1), read through Get in key order and scored with the CPU MaxSim kernel.
absl::StatusOr<std::vector<std::set<std::string>>> ExactTopTen(
    const Collection& collection, int64_t docs, const std::vector<std::vector<float>>& queries,
    size_t checked, int64_t dim) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<MaxSimScorer> scorer, NewCpuMaxSimScorer());
  const std::vector<std::string> ids = DocumentIdsInKeyOrder(docs);
  using Entry = std::pair<float, std::string>;  // best first: score desc, id asc
  auto better = [](const Entry& a, const Entry& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  std::vector<std::vector<Entry>> best(checked);  // heaps whose front is the worst kept
  constexpr size_t kChunk = 2048;
  for (size_t begin = 0; begin < ids.size(); begin += kChunk) {
    const size_t end = std::min(ids.size(), begin + kChunk);
    std::vector<StoredDocument> chunk;
    std::vector<DocumentRef> refs;
    for (size_t i = begin; i < end; ++i) {
      TESSERA_ASSIGN_OR_RETURN(StoredDocument document, collection.Get(ids[i]));
      chunk.push_back(std::move(document));
    }
    for (const StoredDocument& document : chunk) {
      refs.push_back({document.vectors.data(), document.num_vectors()});
    }
    const DocumentBatch batch{VectorDtype::kFloat32, dim, refs};
    for (size_t q = 0; q < checked; ++q) {
      const FloatMatrixView query{queries[q].data(), static_cast<int64_t>(queries[q].size()) / dim,
                                  dim};
      TESSERA_ASSIGN_OR_RETURN(MaxSimResult scored, scorer->Score(query, batch));
      for (size_t i = 0; i < chunk.size(); ++i) {
        Entry entry{scored.scores[i], chunk[i].id};
        if (best[q].size() == 10 && !better(entry, best[q].front())) continue;
        best[q].push_back(std::move(entry));
        std::push_heap(best[q].begin(), best[q].end(), better);
        if (best[q].size() > 10) {
          std::pop_heap(best[q].begin(), best[q].end(), better);
          best[q].pop_back();
        }
      }
    }
  }
  std::vector<std::set<std::string>> truth(checked);
  for (size_t q = 0; q < checked; ++q) {
    for (const Entry& entry : best[q]) truth[q].insert(entry.second);
  }
  return truth;
}

// The exact reference's file form: line q holds query q's top-10 ids, space-separated.
void SaveReference(const std::string& path, const std::vector<std::set<std::string>>& truth) {
  std::ofstream out(path);
  for (const std::set<std::string>& ids : truth) out << absl::StrJoin(ids, " ") << "\n";
}

// The first `checked` lines of a saved reference, or nothing when the file has fewer.
std::optional<std::vector<std::set<std::string>>> LoadReference(const std::string& path,
                                                                size_t checked) {
  std::ifstream in(path);
  std::vector<std::set<std::string>> truth;
  std::string line;
  while (truth.size() < checked && std::getline(in, line)) {
    std::vector<std::string> ids = absl::StrSplit(line, ' ', absl::SkipEmpty());
    truth.emplace_back(ids.begin(), ids.end());
  }
  if (truth.size() < checked) return std::nullopt;
  return truth;
}

// Synthetic queries, so that a --reuse run need not make the corpus again to draw them (they come
// from the generator's state after the whole corpus): u32 count, then per query u32 rows and
// rows × dim floats, native byte order (the file never leaves the machine).
void SaveQueries(const std::string& path, const std::vector<std::vector<float>>& queries,
                 int64_t dim) {
  std::ofstream out(path, std::ios::binary);
  const auto count = static_cast<uint32_t>(queries.size());
  out.write(reinterpret_cast<const char*>(&count), sizeof(count));
  for (const std::vector<float>& query : queries) {
    const auto rows = static_cast<uint32_t>(query.size() / dim);
    out.write(reinterpret_cast<const char*>(&rows), sizeof(rows));
    out.write(reinterpret_cast<const char*>(query.data()),
              static_cast<std::streamsize>(query.size() * sizeof(float)));
  }
}

// The first `wanted` saved queries (each query is drawn after the previous ones, so a prefix is
// what a run with fewer queries draws), or nullopt when the file is missing or holds fewer.
std::optional<std::vector<std::vector<float>>> LoadQueries(const std::string& path, size_t wanted,
                                                           int64_t dim) {
  std::ifstream in(path, std::ios::binary);
  uint32_t count = 0;
  if (!in.read(reinterpret_cast<char*>(&count), sizeof(count)) || count < wanted) {
    return std::nullopt;
  }
  std::vector<std::vector<float>> queries(wanted);
  for (std::vector<float>& query : queries) {
    uint32_t rows = 0;
    if (!in.read(reinterpret_cast<char*>(&rows), sizeof(rows))) return std::nullopt;
    query.resize(static_cast<size_t>(rows) * dim);
    if (!in.read(reinterpret_cast<char*>(query.data()),
                 static_cast<std::streamsize>(query.size() * sizeof(float)))) {
      return std::nullopt;
    }
  }
  return queries;
}

// The --export_dir files (formats at the top of this file) of documents doc-0 … doc-(docs−1), the
// queries (each rows × dim) and the exact reference.
absl::Status ExportForPeers(const Collection& collection, int64_t docs,
                            const std::vector<std::vector<float>>& queries,
                            const std::vector<std::set<std::string>>& truth, int64_t dim,
                            const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return absl::InternalError(absl::StrCat("creating ", dir, ": ", error.message()));
  auto write = [](std::ofstream& out, const void* data, size_t bytes) {
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  };
  std::ofstream vectors(dir + "/doc_vectors.f16", std::ios::binary);
  std::ofstream ids(dir + "/doc_ids.txt");
  std::vector<uint64_t> doc_offsets = {0};
  GetOptions as_stored;
  as_stored.stored_bytes = true;
  for (const std::string& id : DocumentIdsInKeyOrder(docs)) {
    TESSERA_ASSIGN_OR_RETURN(StoredDocument document, collection.Get(id, as_stored));
    if (document.dtype != VectorDtype::kFloat16) {
      return absl::InvalidArgumentError(
          absl::StrCat("document '", id, "' is not stored as fp16; the export expects fp16"));
    }
    write(vectors, document.vector_bytes.data(), document.vector_bytes.size());
    doc_offsets.push_back(doc_offsets.back() + document.num_vectors());
    ids << id << "\n";
  }
  std::ofstream query_tokens(dir + "/queries.f32", std::ios::binary);
  std::vector<uint64_t> query_offsets = {0};
  for (const std::vector<float>& query : queries) {
    write(query_tokens, query.data(), query.size() * sizeof(float));
    query_offsets.push_back(query_offsets.back() + query.size() / dim);
  }
  std::ofstream doc_offset_file(dir + "/doc_offsets.u64", std::ios::binary);
  write(doc_offset_file, doc_offsets.data(), doc_offsets.size() * sizeof(uint64_t));
  std::ofstream query_offset_file(dir + "/query_offsets.u64", std::ios::binary);
  write(query_offset_file, query_offsets.data(), query_offsets.size() * sizeof(uint64_t));
  SaveReference(dir + "/exact_top10.txt", truth);
  for (std::ofstream* out : {&vectors, &ids, &query_tokens, &doc_offset_file, &query_offset_file}) {
    if (!out->flush()) return absl::InternalError(absl::StrCat("writing the export in ", dir));
  }
  return absl::OkStatus();
}

int Fail(const absl::Status& status) {
  std::cerr << status << "\n";
  return 1;
}

int Run(const Flags& flags) {
  std::optional<ResampledCorpus> resampled;
  if (!flags.resample_from.empty()) {
    auto loaded = ResampledCorpus::Load(flags.resample_from, flags.dim);
    if (!loaded.ok()) return Fail(loaded.status());
    resampled = std::move(*loaded);
  }
  if (!flags.reuse) std::filesystem::remove_all(flags.data_dir);
  const Clock::time_point build_start = Clock::now();
  EngineOptions options;
  options.threads = flags.threads;
  if (flags.resident_rerank_bytes >= 0) options.resident_rerank_bytes = flags.resident_rerank_bytes;
  auto engine = Engine::Open(flags.data_dir, options);
  if (!engine.ok()) return Fail(engine.status());
  CollectionSchema schema;
  schema.name = "bench";
  schema.dim = flags.dim;
  schema.pooling.hierarchical->pool_factor = flags.pool_factor;
  schema.pooling.hierarchical->max_merge_height = flags.max_merge_height;
  schema.candidates.kind = flags.candidates == "global" ? CandidateSpec::Kind::kGlobalMean
                                                        : CandidateSpec::Kind::kPooled;
  schema.candidates.pool_factor = flags.candidate_pool_factor;
  schema.candidates.factory = flags.factory;
  schema.candidates.rerank_from_codes = flags.rerank == "codes";
  if (flags.residual_bits != 0) schema.candidates.residual_bits = flags.residual_bits;
  auto collection =
      flags.reuse ? (*engine)->GetCollection(schema.name) : (*engine)->CreateCollection(schema);
  if (!collection.ok()) return Fail(collection.status());

  // Build: ingest, the background training the shard started, and a flush.
  Generator generator(flags.dim, 42);
  std::vector<std::vector<float>> sample;  // synthetic queries are drawn from these documents
  const int64_t sample_every = std::max<int64_t>(1, flags.docs / 1000);
  std::vector<float> previous;
  constexpr int64_t kBatch = 256;
  // Reused collections need nothing generated when their queries are at hand: the data set's for a
  // resampled one, those a previous run saved for a synthetic one.
  const std::string saved_queries = flags.data_dir + "/queries.f32";
  std::optional<std::vector<std::vector<float>>> reused_queries;
  if (flags.reuse && !resampled) {
    reused_queries = LoadQueries(saved_queries, static_cast<size_t>(flags.queries), flags.dim);
  }
  const int64_t generated = flags.reuse && (resampled || reused_queries) ? 0 : flags.docs;
  // The corpus is made on the calling thread between upserts; its time is not the shard's and is
  // left out of build_s and ingest_s (reported as generate_s).
  double generate_seconds = 0.0;
  for (int64_t begin = 0; begin < generated; begin += kBatch) {
    const Clock::time_point generate_start = Clock::now();
    std::vector<Document> batch;
    for (int64_t d = begin; d < std::min(flags.docs, begin + kBatch); ++d) {
      Document document;
      document.id = absl::StrCat("doc-", d);
      if (resampled) {
        document.tokens = resampled->Document(flags.tokens);
      } else {
        document.tokens =
            (d % 5 == 4) ? generator.NearDuplicate(previous) : generator.Document(flags.tokens);
        previous = document.tokens;
        if (d % sample_every == 0) sample.push_back(document.tokens);
      }
      document.num_tokens = flags.tokens;
      document.dim = flags.dim;
      batch.push_back(std::move(document));
    }
    generate_seconds += Since(generate_start);
    if (flags.reuse) continue;  // the synthetic query sample is all that is wanted
    for (const UpsertOutcome& outcome : (*collection)->Upsert(std::move(batch))) {
      if (!outcome.status.ok()) return Fail(outcome.status);
    }
    if ((begin / kBatch) % 40 == 0) {
      std::cerr << "ingested " << std::min(flags.docs, begin + kBatch) << " in "
                << static_cast<int>(Since(build_start) - generate_seconds) << " s\r" << std::flush;
    }
  }
  const double ingest_seconds = Since(build_start) - generate_seconds;
  while ((*collection)->Stats().training_shards > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (absl::Status status = (*collection)->Snapshot(); !status.ok()) return Fail(status);
  const double build_seconds = Since(build_start) - generate_seconds;
  std::cerr << "\nbuilt in " << build_seconds << " s\n";
  const CollectionStats stats = (*collection)->Stats();

  std::vector<std::vector<float>> queries;
  if (reused_queries) {
    queries = std::move(*reused_queries);
    std::cerr << "queries read from " << saved_queries << "\n";
  } else {
    std::mt19937 pick(7);
    for (int q = 0; q < flags.queries; ++q) {
      queries.push_back(resampled ? resampled->Query(q % resampled->num_queries())
                                  : generator.Query(sample[pick() % sample.size()], 32));
    }
    if (!resampled) SaveQueries(saved_queries, queries, flags.dim);
  }
  auto view = [&](const std::vector<float>& query) {
    return FloatMatrixView{query.data(), static_cast<int64_t>(query.size()) / flags.dim, flags.dim};
  };

  // The exact top 10 of every query (or of the first --exhaustive_queries): exact MaxSim of every
  // checked query against every stored document, read once (Get) and scored in chunks, so that the
  // reference costs one pass over the shard rather than one per query.
  const size_t checked = flags.exhaustive_queries < 0
                             ? queries.size()
                             : std::min<size_t>(queries.size(), flags.exhaustive_queries);
  std::vector<std::set<std::string>> truth;
  {
    const Clock::time_point start = Clock::now();
    const std::string saved = flags.data_dir + "/exact_top10.txt";
    const std::string& source = flags.reference.empty() ? saved : flags.reference;
    std::optional<std::vector<std::set<std::string>>> loaded;
    if (flags.reuse || !flags.reference.empty()) loaded = LoadReference(source, checked);
    if (!loaded && !flags.reference.empty()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--reference ", flags.reference, ": expected the top 10 of ", checked,
          " queries, one line each (an exact_top10.txt of a run with the same corpus flags)")));
    }
    if (loaded) {
      truth = std::move(*loaded);
      if (source != saved) SaveReference(saved, truth);  // for a later --reuse run
      std::cerr << "exact reference read from " << source << "\n";
    } else {
      auto exact = ExactTopTen(**collection, flags.docs, queries, checked, flags.dim);
      if (!exact.ok()) return Fail(exact.status());
      truth = std::move(*exact);
      SaveReference(saved, truth);
      std::cerr << "exact reference in " << Since(start) << " s\n";
    }
  }
  // The server's own exhaustive search, timed on the first --exhaustive_timed queries; its top 10
  // must be the reference's (an independent check of both).
  const size_t timed = std::min<size_t>(checked, flags.exhaustive_timed);
  double exhaustive_seconds = 0;
  int disagreements = 0;
  for (size_t q = 0; q < timed; ++q) {
    SearchOptions exhaustive;
    exhaustive.exhaustive = true;
    const Clock::time_point start = Clock::now();
    auto exact = (*collection)->Search(view(queries[q]), exhaustive);
    exhaustive_seconds += Since(start);
    if (!exact.ok()) return Fail(exact.status());
    for (const SearchHit& hit : exact->hits) disagreements += truth[q].count(hit.id) == 0;
  }
  if (disagreements > 0) {
    std::cerr << "warning: the exhaustive search and the reference disagree on " << disagreements
              << " of " << 10 * timed << " top-10 entries\n";
  }
  const double num_queries = static_cast<double>(queries.size());

  // Per search setting (the first is what the top-level keys report; 0 = the default): latency
  // and QPS one query at a time (the server's per-request path), and recall@10 against the exact
  // top 10.
  std::string top_level, settings;
  for (int nprobe : flags.nprobes) {
    for (int num_candidates : flags.num_candidates) {
      SearchOptions options;
      options.nprobe = nprobe;
      options.num_candidates = num_candidates;
      std::vector<double> latencies, candidates_ms, fetch_ms, rerank_ms;
      double recall = 0;
      int64_t scored = 0;
      const Clock::time_point search_start = Clock::now();
      for (size_t q = 0; q < queries.size(); ++q) {
        const Clock::time_point start = Clock::now();
        auto result = (*collection)->Search(view(queries[q]), options);
        if (!result.ok()) return Fail(result.status());
        latencies.push_back(1000 * Since(start));
        candidates_ms.push_back(result->timings.candidates_ms);
        fetch_ms.push_back(result->timings.fetch_ms);
        rerank_ms.push_back(result->timings.rerank_ms);
        scored += result->documents_scored;
        if (q >= checked) continue;
        for (const SearchHit& hit : result->hits) recall += truth[q].count(hit.id) / 10.0;
      }
      const double search_seconds = Since(search_start);
      const std::string figures =
          absl::StrCat("\"nprobe\": ", nprobe, ", \"num_candidates\": ", num_candidates,
                       ", \"qps\": ", num_queries / search_seconds,
                       ", \"p50_ms\": ", Percentile(latencies, 0.50),
                       ", \"p95_ms\": ", Percentile(latencies, 0.95),
                       ", \"p99_ms\": ", Percentile(latencies, 0.99),
                       ", \"stage_ms_mean\": {\"candidates\": ", Mean(candidates_ms),
                       ", \"fetch\": ", Mean(fetch_ms), ", \"rerank\": ", Mean(rerank_ms),
                       "}, \"stage_p50_ms\": {\"candidates\": ", Percentile(candidates_ms, 0.50),
                       ", \"fetch\": ", Percentile(fetch_ms, 0.50),
                       ", \"rerank\": ", Percentile(rerank_ms, 0.50),
                       "}, \"documents_scored_per_query\": ", scored / num_queries,
                       // null (valid JSON, unlike nan) when no query was checked.
                       ", \"recall_at_10\": ",
                       checked > 0 ? absl::StrCat(recall / checked) : std::string("null"));
      if (top_level.empty()) top_level = figures;
      absl::StrAppend(&settings, settings.empty() ? "" : ",\n    ", "{", figures, "}");
      std::cerr << "{" << figures << "}\n";
    }
  }

  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double n = static_cast<double>(flags.docs);
  const int64_t disk = DirectoryBytes(flags.data_dir);
  const double pooled = static_cast<double>(stats.rerank_vectors);
  std::string json = absl::StrCat(
      "{\n  \"cpu_model\": \"", absl::CEscape(CpuModel()), "\",\n  \"cpu_isa\": \"", CpuIsaName(),
      "\",\n  \"corpus\": \"", resampled ? "resampled" : "synthetic",
      "\",\n  \"docs\": ", flags.docs, ",\n  \"tokens_per_document\": ", flags.tokens,
      ",\n  \"dim\": ", flags.dim, ",\n  \"pool_factor\": ", flags.pool_factor,
      ",\n  \"max_merge_height\": ", flags.max_merge_height, ",\n  \"rerank\": \"", flags.rerank,
      "\",\n  \"residual_bits\": ", EffectiveResidualBits(schema.candidates),
      ",\n  \"pooled_vectors\": ", stats.rerank_vectors,
      ",\n  \"vectors_per_document\": ", stats.vectors_per_document, ",\n  \"candidate_index\": \"",
      stats.candidate_indexes.empty() ? "" : stats.candidate_indexes[0],
      "\",\n  \"centroid_sizing\": \"", flags.centroid_sizing,
      "\",\n  \"trainings_completed\": ", stats.trainings_completed,
      ",\n  \"last_training_s\": ", stats.last_training_seconds,
      ",\n  \"build_s\": ", build_seconds, ",\n  \"ingest_s\": ", ingest_seconds,
      ",\n  \"generate_s\": ", generate_seconds, ",\n  \"ingest_docs_per_s\": ", n / ingest_seconds,
      ",\n  \"ram_candidate_bytes_per_vector\": ", stats.candidate_bytes / pooled,
      ",\n  \"disk_bytes_per_original_token\": ", disk / (n * flags.tokens),
      ",\n  \"peak_rss_bytes\": ", usage.ru_maxrss * int64_t{1024},
      ",\n  \"peak_rss_bytes_per_document\": ", usage.ru_maxrss * 1024.0 / n,
      ",\n  \"rss_anon_bytes_at_end\": ", ProcStatusBytes("RssAnon"),
      ",\n  \"rss_file_bytes_at_end\": ", ProcStatusBytes("RssFile"),
      ",\n  \"queries\": ", queries.size(), ",\n  \"exhaustive_queries\": ", checked,
      ",\n  \"exhaustive_ms\": ", timed == 0 ? 0.0 : 1000 * exhaustive_seconds / timed,
      ",\n  \"exhaustive_timed_queries\": ", timed,
      ",\n  \"exhaustive_disagreements\": ", disagreements, ",\n  ", top_level,
      ",\n  \"settings\": [\n    ", settings, "\n  ]\n}\n");
  std::cout << json;
  if (!flags.json.empty()) std::ofstream(flags.json) << json;
  if (!flags.export_dir.empty()) {
    const absl::Status status =
        ExportForPeers(**collection, flags.docs, queries, truth, flags.dim, flags.export_dir);
    if (!status.ok()) return Fail(status);
    std::cerr << "exported to " << flags.export_dir << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::Flags flags;
  if (!tessera::ParseFlags(argc, argv, &flags)) {
    std::cerr << "usage: tessera-bench-index [--docs N] [--tokens T] [--dim D] [--queries Q] "
                 "[--pool_factor P] [--max_merge_height H] [--candidates pooled|global] "
                 "[--candidate_pool_factor C] [--factory F] [--resample_from DIR] [--threads N] "
                 "[--rerank exact|codes] [--residual_bits 2|4] [--resident_rerank_bytes B] "
                 "[--nprobe P1,P2,...] [--num_candidates N1,N2,...] [--exhaustive_queries R] "
                 "[--exhaustive_timed T] "
                 "[--data_dir DIR] [--reuse 0|1] [--export_dir DIR] [--reference FILE] "
                 "[--centroid_sizing list_length|square_root] [--json FILE]\n";
    return 2;
  }
  tessera::internal::SetCentroidSizingForTesting(
      flags.centroid_sizing == "square_root" ? tessera::internal::CentroidSizing::kSquareRoot
                                             : tessera::internal::CentroidSizing::kListLength);
  return tessera::Run(flags);
}
