// The engine: all collections under one data directory, as one server process serves them.
#ifndef TESSERA_ENGINE_H_
#define TESSERA_ENGINE_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tessera/collection.h"
#include "tessera/log.h"
#include "tessera/maxsim.h"

namespace tessera {

struct EngineOptions {
  // The engine's thread budget, as two pools of this many threads each (the calling thread
  // counted; 0 = all hardware threads) that split the work of a call while calls run concurrently
  // on their callers' threads: one for pooling at ingest, stage 1 and reading rerank vectors, one
  // for the CPU scorer's exact MaxSim. A search's stages run one after the other, so one search
  // keeps at most `threads` threads busy; concurrent searches, up to twice that. Two pools rather
  // than one because one measured slower: tessera-bench-index, 20k documents, serial searches on 2
  // shared vCPUs, p50 ~8 ms with one pool against ~3.5 ms with two (ABAB runs, 2026-12-06). Not
  // counted: RocksDB's background threads, a training's thread, and OpenMP's team in a stage-1
  // rebuild (training, the switch to HNSW), which is OpenMP's default (OMP_NUM_THREADS).
  int threads = 0;
  // Threads OpenBLAS splits one matrix product over (FAISS's stage-1 scans and trainings), set
  // process-wide at Open (OpenBLAS has one setting per process: the last engine opened wins).
  // Default 1: a search's products are small (its query tokens × 1,024 vectors) and searches
  // already run in parallel, so more BLAS threads only spin waiting for each other. 0 leaves
  // OpenBLAS's own setting (OPENBLAS_NUM_THREADS, else every core). INVALID_ARGUMENT if negative.
  int blas_threads = 1;
  // fsync the WAL before acknowledging a write (default). Off: faster, a crash can lose the last
  // acknowledged writes.
  bool sync_writes = true;
  // Per shard, up to this many bytes of rerank vectors are kept in memory (in their stored fp16 /
  // fp32 form, loaded at open and updated by every write), so that reranking reads no storage;
  // documents beyond the budget are read per search in place from the shard's mapped rerank
  // segment files (from RocksDB for rows not yet moved there). 0 = none resident, the default:
  // the segments are mapped (and their check at open leaves them in the page cache), so a
  // resident copy duplicates rows already in memory. Measured on the 1M-document shard
  // (docs/results.md, "Exact rerank fetch"): P50 9.7–10.4 ms with 0 against 9.8–11.2 with 4 GiB,
  // the open 35–40 s against 40–61 s, and the copy's 4 GiB pushed segment pages out of a 24 GB
  // machine's cache. A budget still pays where rows stay in RocksDB (a store opened with rerank
  // segments off).
  int64_t resident_rerank_bytes = 0;
  CollectionLimits limits;
  // An exact scorer tried before the engine's CPU scorer (NewCudaMaxSimScorer); null = the CPU
  // scorer only. The CPU scorer is the engine's own, on its pool of `threads`. A call `scorer`
  // fails with anything but INVALID_ARGUMENT (a device error, device memory exhausted) is scored
  // on the CPU scorer instead, after on_scorer_fallback(the failure) when that is set (from any
  // thread: it must be thread-safe).
  std::shared_ptr<const MaxSimScorer> scorer;
  std::function<void(const absl::Status&)> on_scorer_fallback;
  // RocksDB memory shared by every shard of every collection, so that it does not grow with the
  // number of shards: the memtables together stay within memtable_bytes (past it, the shard being
  // written flushes its oldest memtable), and SST blocks are cached in one LRU cache of
  // block_cache_bytes.
  int64_t memtable_bytes = int64_t{512} << 20;
  int64_t block_cache_bytes = int64_t{512} << 20;
  // Where the library's log lines go: failed writes, trainings, collections found corrupt,
  // candidate indexes rebuilt. Empty: LogToStderr.
  LogSink log;
};

// Thread-safe.
//
// A collection whose files are corrupt (a RocksDB SST, a record failing its checksum, an unreadable
// schema file) does not stop the engine from opening: it is *unavailable*. It stays listed by
// ListCollections and UnavailableCollections, GetCollection (hence every call on it) returns
// DATA_LOSS naming the collection and the file, CreateCollection of its name ALREADY_EXISTS, and
// DropCollection removes its files. A corrupt candidate index snapshot is not a reason: it is
// only an acceleration, rebuilt from the shard's database with a line in the log.
class Engine {
 public:
  // Opens every collection under `data_dir` (created if missing). Fails as a whole only for what
  // concerns the data directory (cannot create it, a database held by another process, a full
  // disk, an I/O error); corrupt collections are opened as unavailable (see above). The engine
  // holds an exclusive lock on `data_dir` (the file <data_dir>/LOCK) until it is destroyed:
  // while another engine, in this process or another, holds it, Open changes nothing there and
  // fails with FAILED_PRECONDITION "data dir '<data_dir>' is in use by pid N …".
  static absl::StatusOr<std::unique_ptr<Engine>> Open(const std::string& data_dir,
                                                      const EngineOptions& options = {});
  virtual ~Engine() = default;

  // ALREADY_EXISTS for a taken name, INVALID_ARGUMENT for a bad schema.
  virtual absl::StatusOr<std::shared_ptr<Collection>> CreateCollection(
      const CollectionSchema& schema) = 0;
  // NOT_FOUND for an unknown name. Searches already running on the collection finish; its files
  // are removed when the last reference goes away.
  virtual absl::Status DropCollection(const std::string& name) = 0;
  // NOT_FOUND for an unknown name; DATA_LOSS for an unavailable collection.
  virtual absl::StatusOr<std::shared_ptr<Collection>> GetCollection(
      const std::string& name) const = 0;
  // Names, sorted, unavailable collections included.
  virtual std::vector<std::string> ListCollections() const = 0;
  // Copies a collection for RestoreCollection (on this or another engine): `dir` (must not
  // exist; its parent must) gets the schema and a RocksDB checkpoint of every shard, hard links
  // where the filesystem allows. Writes racing with it may or may not be in the copy: a caller
  // that needs a cut stops writing first. NOT_FOUND for an unknown name.
  virtual absl::Status CheckpointCollection(const std::string& name, const std::string& dir) = 0;
  // CheckpointCollection's copy, taken at one cut of the collection (its write calls wait while
  // its shards are checkpointed; each call is in the copy whole or not at all), and per shard
  // the RocksDB sequence number the copy holds. NOT_FOUND for an unknown name.
  virtual absl::StatusOr<std::vector<uint64_t>> CheckpointCollectionAtCut(
      const std::string& name, const std::string& dir) = 0;
  // Opens the copy CheckpointCollection wrote into `dir` (on the data directory's filesystem)
  // as a new collection `name`, whatever name the copy was taken under: ALREADY_EXISTS, with
  // nothing changed, when `name` is taken (unavailable collections included); INVALID_ARGUMENT
  // for a bad name; the open's error (the directory removed) when the copy cannot be opened.
  virtual absl::Status AdoptCollection(const std::string& name, const std::string& dir) = 0;
  // Replaces collection `name` (or creates it) with the copy CheckpointCollection wrote into
  // `dir`, which must be on the data directory's filesystem (`StagingDirectory()` is). The old
  // collection is dropped first (calls already running on it finish on it), then the directory
  // is moved into the engine and opened: meanwhile the name is NOT_FOUND, and it stays so when
  // the copy cannot be opened (the caller copies again). INVALID_ARGUMENT, with nothing
  // changed, when the copy's schema names another collection.
  virtual absl::Status RestoreCollection(const std::string& name, const std::string& dir) = 0;
  // A directory on the data directory's filesystem for copies on their way in (emptied at open).
  virtual std::string StagingDirectory() const = 0;
  // The unavailable collections and the DATA_LOSS error each answers with, sorted by name.
  virtual std::vector<std::pair<std::string, absl::Status>> UnavailableCollections() const {
    return {};
  }
};

}  // namespace tessera

#endif  // TESSERA_ENGINE_H_
