// The exact rerank's fetch, per document: RocksDB's per-document block path (MultiGet, block
// lookup, checksum, copy: how rerank rows were read before segments) against rerank segments read
// in place (ShardStore::ReadRerank: a table lookup and a view into the mapping), on the same
// documents, in one run. Both stores are written once, flushed, and read whole before timing, so
// that every read comes from the page cache (and RocksDB's block cache where it holds them): what
// is measured is CPU per document, not the disk.
//
// Workload: TESSERA_BENCH_FETCH_DOCS documents (default 20,000) of 64 fp16 rows × 128 columns
// (16 KiB each, a 1M-document shard's typical document at p = 2), fetched 256 at a time in a fixed
// random order, as a search's candidates are. One thread.
//
// Benchmark names (stable; counters ns_per_doc, docs_per_s):
//   BM_Fetch/rocksdb          ShardStore::MultiGetRerank on a store without segments
//   BM_Fetch/segments         ShardStore::ReadRerank on a store whose rows are all in segments
//   BM_FetchAndRead/{rocksdb,segments}   the same, then one load per 64 bytes of every fetched row
//                                        (what the scorer's reads add: page-table and cache misses)
// The data stays under $TMPDIR (or /tmp) while the binary runs and is removed at exit.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "index/storage/shard_store.h"
#include "tessera/float16.h"

namespace tessera::internal {
namespace {

constexpr int64_t kRows = 64;
constexpr int64_t kCols = 128;
constexpr size_t kBatch = 256;
constexpr size_t kOrders = 1 << 16;

struct Fixture {
  std::string root;
  std::unique_ptr<ShardStore> rocksdb;
  std::unique_ptr<ShardStore> segments;
  std::vector<uint64_t> order;  // iids to fetch, kBatch at a time

  ~Fixture() {
    rocksdb.reset();
    segments.reset();
    std::error_code ignored;
    std::filesystem::remove_all(root, ignored);
  }
};

int64_t NumDocs() {
  const char* env = getenv("TESSERA_BENCH_FETCH_DOCS");
  return env != nullptr ? std::max<int64_t>(1000, std::atoll(env)) : 20000;
}

std::unique_ptr<ShardStore> Build(const std::string& dir, bool segments, int64_t docs,
                                  std::vector<uint64_t>* iids) {
  ShardStoreOptions options;
  options.sync = false;  // a bulk load: durability is not what is measured
  options.rerank_segments = segments;
  options.rerank_flush_bytes = 0;
  auto store = ShardStore::Open(dir, options);
  if (!store.ok()) {
    std::cerr << store.status() << "\n";
    std::exit(1);
  }
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<Float16> values(kRows * kCols);
  for (int64_t start = 0; start < docs; start += 500) {
    std::vector<DocumentWrite> batch;
    for (int64_t i = start; i < std::min(docs, start + 500); ++i) {
      for (Float16& v : values) v = FloatToHalf(0.09f * normal(rng));
      DocumentWrite w;
      w.record.external_id = absl::StrCat("doc-", i);
      w.record.num_tokens = kRows * 2;
      for (int64_t r = 0; r <= kRows; ++r)
        w.record.member_offsets.push_back(static_cast<int32_t>(r));
      for (int64_t r = 0; r < kRows; ++r) w.record.members.push_back(static_cast<int32_t>(r));
      w.rerank.dtype = VectorDtype::kFloat16;
      w.rerank.rows = kRows;
      w.rerank.cols = kCols;
      w.rerank.bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * 2);
      batch.push_back(std::move(w));
    }
    auto written = (*store)->Write(std::move(batch), {});
    if (!written.ok()) {
      std::cerr << written.status() << "\n";
      std::exit(1);
    }
    if (iids != nullptr) {
      iids->insert(iids->end(), written->upserted_iids.begin(), written->upserted_iids.end());
    }
  }
  if (const absl::Status flushed = (*store)->Flush(); !flushed.ok()) {
    std::cerr << flushed << "\n";
    std::exit(1);
  }
  return *std::move(store);
}

Fixture& GetFixture() {
  static Fixture* fixture = [] {
    auto* f = new Fixture;
    const char* tmp = getenv("TMPDIR");
    f->root =
        absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/tessera-bench-rerank-fetch.", ::getpid());
    std::filesystem::create_directories(f->root);
    const int64_t docs = NumDocs();
    std::vector<uint64_t> iids;
    f->rocksdb = Build(f->root + "/rocksdb", false, docs, &iids);
    f->segments = Build(f->root + "/segments", true, docs, nullptr);
    std::mt19937_64 rng(11);
    f->order.resize(kOrders);
    for (uint64_t& iid : f->order) iid = iids[rng() % iids.size()];
    // Warm: every document read once through each path.
    for (size_t start = 0; start < iids.size(); start += kBatch) {
      const auto span = absl::MakeConstSpan(iids).subspan(start, kBatch);
      (void)f->rocksdb->MultiGetRerank(span);
      auto views = f->segments->ReadRerank(span);
      if (views.ok()) {
        for (const auto& v : *views) {
          if (v != nullptr) benchmark::DoNotOptimize(v->bytes[v->bytes.size() / 2]);
        }
      }
    }
    const ShardStoreStats stats = f->segments->Stats();
    std::cerr << docs << " documents of " << kRows << " × " << kCols
              << " fp16; segments store: " << stats.segments.rerank_segments << " segments, "
              << stats.segments.rerank_segment_bytes << " bytes, "
              << stats.segments.rerank_unflushed_bytes << " bytes left in RocksDB\n";
    return f;
  }();
  return *fixture;
}

uint64_t Touch(absl::string_view bytes) {
  uint64_t sum = 0;
  for (size_t i = 0; i < bytes.size(); i += 64) sum += static_cast<uint8_t>(bytes[i]);
  return sum;
}

void BM_Fetch(benchmark::State& state, bool segments, bool read) {
  Fixture& f = GetFixture();
  size_t at = 0;
  int64_t docs = 0;
  for (auto _ : state) {
    const auto iids = absl::MakeConstSpan(f.order).subspan(at, kBatch);
    at = (at + kBatch) % kOrders;
    if (segments) {
      auto views = f.segments->ReadRerank(iids);
      if (!views.ok()) {
        state.SkipWithError(std::string(views.status().message()).c_str());
        return;
      }
      if (read) {
        uint64_t sum = 0;
        for (const auto& v : *views) sum += Touch(v->bytes);
        benchmark::DoNotOptimize(sum);
      }
      benchmark::DoNotOptimize(views->data());
    } else {
      auto copies = f.rocksdb->MultiGetRerank(iids);
      if (!copies.ok()) {
        state.SkipWithError(std::string(copies.status().message()).c_str());
        return;
      }
      if (read) {
        uint64_t sum = 0;
        for (const auto& m : *copies) sum += Touch(m->bytes);
        benchmark::DoNotOptimize(sum);
      }
      benchmark::DoNotOptimize(copies->data());
    }
    docs += static_cast<int64_t>(iids.size());
  }
  state.counters["docs_per_s"] =
      benchmark::Counter(static_cast<double>(docs), benchmark::Counter::kIsRate);
  state.counters["ns_per_doc"] = benchmark::Counter(
      static_cast<double>(docs) * 1e-9, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

BENCHMARK_CAPTURE(BM_Fetch, rocksdb, false, false)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Fetch, segments, true, false)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Fetch, rocksdb_read, false, true)
    ->Name("BM_FetchAndRead/rocksdb")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Fetch, segments_read, true, true)
    ->Name("BM_FetchAndRead/segments")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tessera::internal

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  delete &tessera::internal::GetFixture();  // removes the data
  return 0;
}
