#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tessera/base/version.h"

namespace tessera::server {
namespace {

// A sample value: integers exactly (a count or a byte count below 2^53 is exact in a double; the
// default formatting of absl::StrCat kept 6 digits: 8.39654e+07), others in the shortest form that
// reads back as the same double.
std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::trunc(value) && std::fabs(value) < 9.0e18) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  char buffer[64];
  const std::to_chars_result result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

// A label value, escaped as the text format requires.
std::string LabelValue(absl::string_view value) {
  std::string out;
  for (const char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void AppendHeader(std::string* out, absl::string_view name, absl::string_view type,
                  absl::string_view help) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

}  // namespace

void Histogram::Observe(double ms) {
  for (size_t b = 0; b < kBucketsMs.size(); ++b) {
    if (ms <= kBucketsMs[b]) buckets_[b].fetch_add(1, std::memory_order_relaxed);
  }
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_us_.fetch_add(static_cast<uint64_t>(ms * 1000.0), std::memory_order_relaxed);
}

void Histogram::Render(const std::string& name, const std::string& labels, std::string* out) const {
  const std::string sep = labels.empty() ? "" : ",";
  for (size_t b = 0; b < kBucketsMs.size(); ++b) {
    absl::StrAppend(out, name, "_bucket{", labels, sep, "le=\"",
                    FormatValue(kBucketsMs[b] / 1000.0), "\"} ",
                    buckets_[b].load(std::memory_order_relaxed), "\n");
  }
  const uint64_t count = count_.load(std::memory_order_relaxed);
  absl::StrAppend(out, name, "_bucket{", labels, sep, "le=\"+Inf\"} ", count, "\n");
  absl::StrAppend(out, name, "_sum", labels.empty() ? "" : absl::StrCat("{", labels, "}"), " ",
                  FormatValue(static_cast<double>(sum_us_.load(std::memory_order_relaxed)) / 1e6),
                  "\n");
  absl::StrAppend(out, name, "_count", labels.empty() ? "" : absl::StrCat("{", labels, "}"), " ",
                  count, "\n");
}

void Metrics::RecordRpc(const std::string& method, const std::string& code, double ms) {
  MutexLock lock(&mu_);
  auto& counter = rpc_counts_[absl::StrCat(method, "\t", code)];
  if (counter == nullptr) counter = std::make_unique<std::atomic<uint64_t>>(0);
  counter->fetch_add(1, std::memory_order_relaxed);
  auto& histogram = rpc_latency_[method];
  if (histogram == nullptr) histogram = std::make_unique<Histogram>();
  histogram->Observe(ms);
}

void Metrics::RecordSearchStages(double candidates_ms, double fetch_ms, double rerank_ms) {
  stage_candidates_.Observe(candidates_ms);
  stage_fetch_.Observe(fetch_ms);
  stage_rerank_.Observe(rerank_ms);
}

void Metrics::RecordDocuments(int64_t accepted, int64_t rejected, int64_t original_tokens,
                              int64_t stored_vectors) {
  documents_accepted_.fetch_add(accepted, std::memory_order_relaxed);
  documents_rejected_.fetch_add(rejected, std::memory_order_relaxed);
  original_tokens_.fetch_add(original_tokens, std::memory_order_relaxed);
  stored_vectors_.fetch_add(stored_vectors, std::memory_order_relaxed);
}

void Metrics::SetGauge(const std::string& name, const std::string& help, double value) {
  MutexLock lock(&mu_);
  gauges_[name] = Gauge{help, value};
}

void Metrics::SetCollections(const Engine& engine) {
  std::vector<std::pair<std::string, CollectionStats>> collections;
  for (const std::string& name : engine.ListCollections()) {
    absl::StatusOr<std::shared_ptr<Collection>> collection = engine.GetCollection(name);
    if (!collection.ok()) continue;  // dropped meanwhile, or unavailable
    collections.emplace_back(name, (*collection)->Stats());
  }
  MutexLock lock(&mu_);
  collections_ = std::move(collections);
}

std::string Metrics::Render() const {
  std::string out;
  MutexLock lock(&mu_);
  AppendHeader(&out, "tessera_build_info", "gauge", "The version this server was built from.");
  absl::StrAppend(&out, "tessera_build_info{version=\"", LabelValue(Version()), "\",revision=\"",
                  LabelValue(GitRevision()), "\"} 1\n");
  // Sorted, so that the output is stable from one scrape to the next.
  std::vector<std::pair<std::string, uint64_t>> rpc_counts;
  for (const auto& [key, counter] : rpc_counts_) {
    rpc_counts.emplace_back(key, counter->load(std::memory_order_relaxed));
  }
  std::sort(rpc_counts.begin(), rpc_counts.end());
  AppendHeader(&out, "tessera_rpc_total", "counter", "Finished RPCs by method and status code.");
  for (const auto& [key, count] : rpc_counts) {
    const std::vector<std::string> parts = absl::StrSplit(key, '\t');
    absl::StrAppend(&out, "tessera_rpc_total{method=\"", LabelValue(parts[0]), "\",code=\"",
                    LabelValue(parts[1]), "\"} ", count, "\n");
  }
  std::vector<std::string> methods;
  for (const auto& [method, histogram] : rpc_latency_) methods.push_back(method);
  std::sort(methods.begin(), methods.end());
  AppendHeader(&out, "tessera_rpc_duration_seconds", "histogram", "RPC latency.");
  for (const std::string& method : methods) {
    rpc_latency_.at(method)->Render("tessera_rpc_duration_seconds",
                                    absl::StrCat("method=\"", LabelValue(method), "\""), &out);
  }
  AppendHeader(&out, "tessera_search_stage_duration_seconds", "histogram",
               "Search latency per stage.");
  stage_candidates_.Render("tessera_search_stage_duration_seconds", "stage=\"candidates\"", &out);
  stage_fetch_.Render("tessera_search_stage_duration_seconds", "stage=\"fetch\"", &out);
  stage_rerank_.Render("tessera_search_stage_duration_seconds", "stage=\"rerank\"", &out);
  AppendHeader(&out, "tessera_documents_total", "counter",
               "Documents sent to Upsert since start, by outcome (stored, or rejected with an "
               "error in their result).");
  absl::StrAppend(&out, "tessera_documents_total{outcome=\"stored\"} ",
                  documents_accepted_.load(std::memory_order_relaxed), "\n",
                  "tessera_documents_total{outcome=\"rejected\"} ",
                  documents_rejected_.load(std::memory_order_relaxed), "\n");
  const uint64_t tokens = original_tokens_.load(std::memory_order_relaxed);
  const uint64_t vectors = stored_vectors_.load(std::memory_order_relaxed);
  AppendHeader(&out, "tessera_pooling_ratio", "gauge",
               "Original tokens per stored vector since start.");
  absl::StrAppend(&out, "tessera_pooling_ratio ",
                  FormatValue(vectors == 0 ? 0.0 : static_cast<double>(tokens) / vectors), "\n");
  AppendHeader(&out, "tessera_rerank_fallback_total", "counter",
               "GPU MaxSim calls redone on the CPU.");
  absl::StrAppend(&out, "tessera_rerank_fallback_total ",
                  rerank_fallbacks_.load(std::memory_order_relaxed), "\n");
  std::vector<std::string> gauges;
  for (const auto& [name, gauge] : gauges_) gauges.push_back(name);
  std::sort(gauges.begin(), gauges.end());
  for (const std::string& name : gauges) {
    const Gauge& gauge = gauges_.at(name);
    AppendHeader(&out, name, "gauge", gauge.help);
    absl::StrAppend(&out, name, " ", FormatValue(gauge.value), "\n");
  }

  // Per collection: one family at a time, every collection's sample in it.
  if (collections_.empty()) return out;
  using Value = std::function<double(const CollectionStats&)>;
  const auto family = [&](absl::string_view name, absl::string_view type, absl::string_view help,
                          const Value& value) {
    AppendHeader(&out, name, type, help);
    for (const auto& [collection, stats] : collections_) {
      absl::StrAppend(&out, name, "{collection=\"", LabelValue(collection), "\"} ",
                      FormatValue(value(stats)), "\n");
    }
  };
  // A family with a second label: per collection, one sample per value of `label`.
  const auto labelled_family = [&](absl::string_view name, absl::string_view type,
                                   absl::string_view help, absl::string_view label,
                                   const std::vector<std::pair<absl::string_view, Value>>& values) {
    AppendHeader(&out, name, type, help);
    for (const auto& [collection, stats] : collections_) {
      for (const auto& [label_value, value] : values) {
        absl::StrAppend(&out, name, "{collection=\"", LabelValue(collection), "\",", label, "=\"",
                        LabelValue(label_value), "\"} ", FormatValue(value(stats)), "\n");
      }
    }
  };
  family("tessera_documents", "gauge", "Live documents per collection.",
         [](const CollectionStats& s) { return static_cast<double>(s.documents); });
  family("tessera_rerank_vectors", "gauge", "Stored (pooled) rerank vectors per collection.",
         [](const CollectionStats& s) { return static_cast<double>(s.rerank_vectors); });
  family("tessera_candidate_vectors", "gauge", "Vectors in the collection's stage-1 indexes.",
         [](const CollectionStats& s) { return static_cast<double>(s.candidate_vectors); });
  family("tessera_disk_bytes", "gauge",
         "Bytes the collection's files occupy on disk (allocated blocks, preallocated space "
         "included).",
         [](const CollectionStats& s) { return static_cast<double>(s.disk_bytes); });
  family("tessera_disk_bytes_per_original_token", "gauge",
         "Disk bytes per original token the collection holds.",
         [](const CollectionStats& s) { return s.disk_bytes_per_original_token; });
  // The shards' append-once segment files (part of the disk bytes), kind "rerank" for the fp16
  // rerank rows and "codes" for the centroid codes (rerank_from_codes): a family per pair of
  // SegmentFigures fields.
  const auto segment_family = [&](absl::string_view name, absl::string_view help,
                                  int64_t SegmentFigures::*rerank, int64_t SegmentFigures::*codes) {
    const auto figure = [](int64_t SegmentFigures::*field) -> Value {
      return [field](const CollectionStats& s) { return static_cast<double>(s.segments.*field); };
    };
    labelled_family(name, "gauge", help, "kind",
                    {{"rerank", figure(rerank)}, {"codes", figure(codes)}});
  };
  segment_family("tessera_segment_files", "Segment files of the collection's shards, by kind.",
                 &SegmentFigures::rerank_segments, &SegmentFigures::code_segments);
  segment_family("tessera_segment_bytes", "Bytes the collection's segment files occupy, by kind.",
                 &SegmentFigures::rerank_segment_bytes, &SegmentFigures::code_segment_bytes);
  segment_family(
      "tessera_unflushed_bytes",
      "Bytes of values still in RocksDB, waiting for the next flush into a segment file, by kind.",
      &SegmentFigures::rerank_unflushed_bytes, &SegmentFigures::code_unflushed_bytes);
  family("tessera_training_shards", "gauge",
         "Shards of the collection training a centroid index now.",
         [](const CollectionStats& s) { return static_cast<double>(s.training_shards); });
  labelled_family(
      "tessera_trainings_total", "counter",
      "Centroid trainings of the collection's shards since it opened, by outcome.", "outcome",
      {{"completed",
        [](const CollectionStats& s) { return static_cast<double>(s.trainings_completed); }},
       {"failed",
        [](const CollectionStats& s) { return static_cast<double>(s.trainings_failed); }}});
  family("tessera_last_training_seconds", "gauge",
         "How long the collection's most recent training ran (0: none since it opened).",
         [](const CollectionStats& s) { return s.last_training_seconds; });
  return out;
}

}  // namespace tessera::server
