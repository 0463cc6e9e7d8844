// Prometheus metrics (text exposition format 0.0.4, as `promtool check metrics` accepts it),
// served over HTTP by server/http/http_server.h. Counters and histograms are lock-free to
// update. Each family is rendered once, with its # HELP and # TYPE, all its samples together;
// integers are printed exactly.
#ifndef TESSERA_SERVER_METRICS_H_
#define TESSERA_SERVER_METRICS_H_

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tessera/base/mutex.h"
#include "tessera/collection.h"
#include "tessera/engine.h"

namespace tessera::server {

// A latency histogram in milliseconds with fixed buckets.
class Histogram {
 public:
  static constexpr std::array<double, 14> kBucketsMs = {0.25, 0.5, 1,   2.5, 5,    10,   25,
                                                        50,   100, 250, 500, 1000, 2500, 10000};
  void Observe(double ms);
  // Appends the _bucket/_sum/_count lines of `name` with `labels` ("method=\"Search\"" or ""); the
  // family's # HELP and # TYPE lines are the caller's.
  void Render(const std::string& name, const std::string& labels, std::string* out) const;

 private:
  std::array<std::atomic<uint64_t>, kBucketsMs.size()> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_us_{0};
};

// The server's metrics. Thread-safe.
class Metrics {
 public:
  // One finished RPC: its method, status code name and latency.
  void RecordRpc(const std::string& method, const std::string& code, double ms);
  // One search's stage timings.
  void RecordSearchStages(double candidates_ms, double fetch_ms, double rerank_ms);
  void RecordDocuments(int64_t accepted, int64_t rejected, int64_t original_tokens,
                       int64_t stored_vectors);
  // A GPU MaxSim call that failed and was redone on the CPU.
  void RecordRerankFallback() { rerank_fallbacks_.fetch_add(1, std::memory_order_relaxed); }
  // A process-wide gauge without labels (`name` matches [a-z_:][a-z0-9_:]*), refreshed by the
  // caller before rendering.
  void SetGauge(const std::string& name, const std::string& help, double value);
  // The per-collection families (documents, vectors, disk bytes, training), from the statistics of
  // every collection the engine serves now: replaced as a whole, so that a dropped collection's
  // samples go with it. Unavailable collections have none.
  void SetCollections(const Engine& engine);
  std::string Render() const;

 private:
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<std::atomic<uint64_t>>> rpc_counts_
      ABSL_GUARDED_BY(mu_);  // "method\tcode"
  absl::flat_hash_map<std::string, std::unique_ptr<Histogram>> rpc_latency_ ABSL_GUARDED_BY(mu_);
  struct Gauge {
    std::string help;
    double value = 0;
  };
  absl::flat_hash_map<std::string, Gauge> gauges_ ABSL_GUARDED_BY(mu_);  // by name
  // Collection name → its statistics, as of the last SetCollections.
  std::vector<std::pair<std::string, CollectionStats>> collections_ ABSL_GUARDED_BY(mu_);
  Histogram stage_candidates_, stage_fetch_, stage_rerank_;
  std::atomic<uint64_t> documents_accepted_{0}, documents_rejected_{0};
  std::atomic<uint64_t> original_tokens_{0}, stored_vectors_{0};
  std::atomic<uint64_t> rerank_fallbacks_{0};
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_METRICS_H_
