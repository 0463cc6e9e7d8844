// ShardStore on RocksDB: column families, group commit, consistent reads. The byte layout of keys
// and values is in record_codec.h.
#include "index/storage/shard_store.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "index/common/crc32.h"
#include "index/common/file_io.h"
#include "index/storage/record_codec.h"
#include "index/storage/rerank_segment.h"
#include "rocksdb/cache.h"
#include "rocksdb/convenience.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/listener.h"
#include "rocksdb/options.h"
#include "rocksdb/snapshot.h"
#include "rocksdb/table.h"
#include "rocksdb/utilities/checkpoint.h"
#include "rocksdb/write_batch.h"
#include "rocksdb/write_buffer_manager.h"
#include "tessera/base/mutex.h"
#include "tessera/status_macros.h"

namespace tessera::internal {
namespace {

constexpr char kMetaCf[] = "meta";
constexpr char kDocsCf[] = "docs";
constexpr char kIdsCf[] = "ids";
constexpr char kRerankCf[] = "rerank";
constexpr char kCandidatesCf[] = "candidates";
constexpr char kCodesCf[] = "codes";

// Meta keys: the caller's under "u/", the store's own under "s/" (see record_codec.h).
constexpr char kUserMetaPrefix[] = "u/";
constexpr char kFormatVersionKey[] = "s/format_version";
constexpr char kNextIidKey[] = "s/next_iid";
constexpr char kLiveDocumentsKey[] = "s/live_documents";
constexpr uint64_t kStoreFormatVersion = 1;
// A committed rerank segment: "s/rerank_segment/" + its number as 4 bytes big-endian → its size.
constexpr char kSegmentKeyPrefix[] = "s/rerank_segment/";
std::string SegmentKey(uint32_t number) {
  std::string key = kSegmentKeyPrefix;
  for (int shift = 24; shift >= 0; shift -= 8) key.push_back(static_cast<char>(number >> shift));
  return key;
}

// Group commit bounds: a leader stops adding queued requests once the group would exceed either
// (its own request always goes in, however large).
constexpr size_t kMaxGroupDocuments = 1000;
constexpr size_t kMaxGroupBytes = size_t{64} << 20;

// RocksDB's status as an absl::Status: the one place the codes are mapped. RocksDB's message is
// kept whole; for I/O errors and corruption it names the file ("While appending to file:
// <dir>/000004.log: No space left on device", "block checksum mismatch: … in <dir>/000012.sst").
//   IOError NoSpace       RESOURCE_EXHAUSTED "disk full: shard '<dir>': …"
//   IOError PathNotFound  NOT_FOUND
//   other IOError         UNAVAILABLE
//   Corruption            DATA_LOSS
//   Busy, TryAgain, ShutdownInProgress  UNAVAILABLE; TimedOut, Expired  DEADLINE_EXCEEDED;
//   NotFound, NotSupported, InvalidArgument, Aborted, CompactionTooLarge  their namesakes.
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view dir, absl::string_view context) {
  if (s.ok()) return absl::OkStatus();
  const std::string message = absl::StrCat("shard '", dir, "': ", context, ": ", s.ToString());
  switch (s.code()) {
    case rocksdb::Status::kNotFound:
      return absl::NotFoundError(message);
    case rocksdb::Status::kCorruption:
      return absl::DataLossError(message);
    case rocksdb::Status::kNotSupported:
      return absl::UnimplementedError(message);
    case rocksdb::Status::kInvalidArgument:
      return absl::InvalidArgumentError(message);
    case rocksdb::Status::kIOError:
      if (s.IsNoSpace()) return absl::ResourceExhaustedError(absl::StrCat("disk full: ", message));
      if (s.IsPathNotFound()) return absl::NotFoundError(message);
      return absl::UnavailableError(message);
    case rocksdb::Status::kTimedOut:
    case rocksdb::Status::kExpired:
      return absl::DeadlineExceededError(message);
    case rocksdb::Status::kAborted:
      return absl::AbortedError(message);
    case rocksdb::Status::kBusy:
    case rocksdb::Status::kTryAgain:
    case rocksdb::Status::kShutdownInProgress:
      return absl::UnavailableError(message);
    case rocksdb::Status::kCompactionTooLarge:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

// The database's info log (<dir>/LOG), written with plain write(2) and errors ignored. RocksDB's
// own file logger goes through WritableFileWriter, which in an assertion-enabled build (Debian's
// librocksdb 7.8) aborts the process on the first log line after a failed write: a full disk would
// take the server down instead of failing the write. Rolls LOG to LOG.old once it exceeds
// kMaxInfoLogBytes (one old file kept).
class InfoLog : public rocksdb::Logger {
 public:
  static constexpr off_t kMaxInfoLogBytes = off_t{8} << 20;

  explicit InfoLog(std::string path)
      : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL), path_(std::move(path)) {
    std::rename(path_.c_str(), (path_ + ".old").c_str());
    MutexLock lock(&mu_);
    Reopen();
  }
  ~InfoLog() override {
    MutexLock lock(&mu_);
    if (fd_ >= 0) ::close(fd_);
  }

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    char line[4096];
    const auto now = std::chrono::system_clock::now();
    const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
    const int64_t micros =
        std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
        1000000;
    std::tm local{};
    ::localtime_r(&seconds, &local);
    size_t n = std::strftime(line, sizeof(line), "%Y/%m/%d-%H:%M:%S", &local);
    n += std::snprintf(line + n, sizeof(line) - n, ".%06lld ", static_cast<long long>(micros));
    const int body = std::vsnprintf(line + n, sizeof(line) - n - 1, format, ap);
    if (body < 0) return;
    n = std::min(n + static_cast<size_t>(body), sizeof(line) - 2);
    if (line[n - 1] != '\n') line[n++] = '\n';
    MutexLock lock(&mu_);
    if (fd_ < 0) return;
    if (::write(fd_, line, n) < 0) return;  // a lost log line is not worth failing anything
    size_ += static_cast<off_t>(n);
    if (size_ > kMaxInfoLogBytes) {
      std::rename(path_.c_str(), (path_ + ".old").c_str());
      Reopen();
    }
  }
  size_t GetLogFileSize() const override {
    MutexLock lock(&mu_);
    return static_cast<size_t>(size_);
  }

 private:
  void Reopen() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    size_ = 0;
  }

  const std::string path_;
  mutable Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  off_t size_ ABSL_GUARDED_BY(mu_) = 0;
};

// Keeps RocksDB from recovering by itself from a full disk. Its own recovery (SstFileManager)
// waits for free space of the largest write buffer (128 MiB here) and, while it waits, refuses
// DB::Resume(); the store resumes instead on the next write once statvfs shows room
// (ShardStoreImpl::ResumeIfStopped), so writes come back as soon as a little space is freed.
class NoSpaceRecoveryListener : public rocksdb::EventListener {
 public:
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason, rocksdb::Status error,
                            bool* auto_recovery) override {
    if (error.IsNoSpace() && error.severity() >= rocksdb::Status::Severity::kHardError) {
      *auto_recovery = false;
    }
  }
};

// Free space the store wants on the disk, beyond a write's own bytes, before it resumes a
// database stopped by a full disk (resuming flushes the memtables first).
constexpr uint64_t kResumeHeadroomBytes = uint64_t{256} << 10;

// Adds the shard directory to a codec error.
absl::Status InShard(const absl::Status& status, absl::string_view dir) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("shard '", dir, "': ", status.message()));
}

std::string Quote(absl::string_view external_id) {
  return absl::StrCat("'", absl::CHexEscape(external_id.substr(0, 256)), "'");
}

rocksdb::CompressionType LightCompression() {
  for (rocksdb::CompressionType type : rocksdb::GetSupportedCompressions()) {
    if (type == rocksdb::kLZ4Compression) return type;
  }
  for (rocksdb::CompressionType type : rocksdb::GetSupportedCompressions()) {
    if (type == rocksdb::kSnappyCompression) return type;
  }
  return rocksdb::kNoCompression;
}

// Per-CF tuning. Vectors are essentially incompressible, so rerank/candidates/codes skip
// compression. They are read by point lookups of a few hundred documents per query, so their
// blocks are small: a value larger than a block is a block of its own, and a lookup reads that
// value only (with 64 KiB blocks, a 16 KiB document read 64 KiB from disk — most of a 1M-document
// shard's query time once its rerank vectors outgrew the page cache). Docs and ids are small
// records looked up by key, so they get bloom filters (ids: most lookups at ingest are misses).
rocksdb::ColumnFamilyOptions CfOptions(const std::shared_ptr<rocksdb::Cache>& cache,
                                       size_t write_buffer_bytes, size_t block_bytes, bool bloom,
                                       bool compress) {
  rocksdb::ColumnFamilyOptions cf;
  cf.write_buffer_size = write_buffer_bytes;
  cf.max_write_buffer_number = 3;
  cf.level_compaction_dynamic_level_bytes = true;
  cf.compression = compress ? LightCompression() : rocksdb::kNoCompression;
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = cache;
  table.block_size = block_bytes;
  table.cache_index_and_filter_blocks = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  table.format_version = 5;
  if (bloom) table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  return cf;
}

// A request prepared by its writer before it queues: validated, with the vectors encoded so that
// the leader only assigns ids and copies bytes.
struct PreparedUpsert {
  DocumentRecord record;
  std::string rerank_value;
  std::string candidates_value;  // empty: no candidates row
  std::string codes_value;       // empty: no codes row
  uint32_t code_generation = 0;
  int64_t rerank_bytes = 0;  // the rows' bytes
};

// What ReadRerank hands out, shared by the views of one call: the views, and what they point
// into (segments, values decoded from RocksDB).
struct RerankReadBatch {
  std::vector<StoredMatrixView> views;
  std::vector<std::shared_ptr<const RerankSegment>> segments;
  std::deque<StoredMatrix> decoded;
};

// Returned, internally, when a pointer names a segment that a rewrite has just replaced: the read
// is retried from RocksDB, which by then holds the new pointer.
constexpr absl::StatusCode kSegmentGone = absl::StatusCode::kAborted;
constexpr int kSegmentRetries = 8;

}  // namespace

class SharedStoreMemory {
 public:
  SharedStoreMemory(size_t memtable_bytes, size_t block_cache_bytes)
      : block_cache(rocksdb::NewLRUCache(std::max<size_t>(block_cache_bytes, 1 << 20))),
        write_buffers(std::make_shared<rocksdb::WriteBufferManager>(
            std::max<size_t>(memtable_bytes, 1 << 20))) {}

  const std::shared_ptr<rocksdb::Cache> block_cache;
  const std::shared_ptr<rocksdb::WriteBufferManager> write_buffers;
};

std::shared_ptr<SharedStoreMemory> NewSharedStoreMemory(size_t memtable_bytes,
                                                        size_t block_cache_bytes) {
  return std::make_shared<SharedStoreMemory>(memtable_bytes, block_cache_bytes);
}

// The one implementation of ShardStore.
class ShardStoreImpl final : public ShardStore {
 public:
  ShardStoreImpl(std::string dir, const ShardStoreOptions& options)
      : dir_(std::move(dir)), options_(options) {}
  ~ShardStoreImpl() override;

  // ShardStore::Open's work, once, before any other call.
  absl::Status Open();

  absl::Status PutMeta(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> GetMeta(const std::string& key) const override;
  absl::StatusOr<WriteResult> Write(std::vector<DocumentWrite> upserts,
                                    const std::vector<std::string>& deletes) override;
  absl::StatusOr<uint64_t> LookupId(const std::string& external_id) const override;
  absl::StatusOr<DocumentRecord> GetRecord(uint64_t iid) const override;
  absl::StatusOr<StoredMatrix> GetRerank(uint64_t iid) const override;
  absl::StatusOr<std::vector<std::optional<StoredMatrix>>> MultiGetRerank(
      absl::Span<const uint64_t> iids) const override;
  absl::StatusOr<std::vector<std::shared_ptr<const StoredMatrixView>>> ReadRerank(
      absl::Span<const uint64_t> iids) const override;
  absl::Status FlushRerank() override ABSL_LOCKS_EXCLUDED(flush_mu_) {
    MutexLock flush(&flush_mu_);
    return MaintainRerank(/*force=*/true);
  }
  absl::StatusOr<std::vector<std::optional<std::string>>> MultiGetCodes(
      uint32_t generation, absl::Span<const uint64_t> iids) const override;
  absl::Status ForEachDocument(
      const std::function<absl::Status(const DocumentRecord&)>& fn) const override;
  absl::Status ForEachCandidates(
      uint64_t min_iid,
      const std::function<absl::Status(uint64_t, const StoredMatrix&)>& fn) const override;
  void SetCodeGenerations(std::vector<uint32_t> generations) override ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    code_generations_ = std::move(generations);
  }
  absl::Status PutCodes(uint32_t generation,
                        const std::vector<std::pair<uint64_t, std::string>>& codes,
                        absl::Span<const uint64_t> removed) override;
  absl::Status DropCodeGenerationsExcept(uint32_t keep) override;
  absl::Status DropAllCandidates() override;
  absl::StatusOr<std::vector<uint64_t>> DropAllRerankRows() override
      ABSL_LOCKS_EXCLUDED(commit_mu_);
  absl::Status ForEachCodes(
      uint32_t generation,
      const std::function<absl::Status(uint64_t, std::string)>& fn) const override;
  uint64_t LatestSequence() const override { return db_->GetLatestSequenceNumber(); }
  ShardStoreStats Stats() const override;
  absl::Status Flush() override;
  absl::Status Checkpoint(const std::string& dir, uint64_t* sequence) override;
  int64_t SyncedWritesForTesting() const override {
    return synced_writes_.load(std::memory_order_relaxed);
  }

 private:
  // One queued Write() or PutMeta() call. Lives on its caller's stack until `done`.
  struct Writer {
    std::vector<PreparedUpsert> upserts;
    const std::vector<std::string>* deletes = nullptr;
    std::vector<std::pair<std::string, std::string>> meta;  // encoded key, value
    bool counts_commit = true;                              // PutMeta requests do not
    size_t documents = 0;
    size_t bytes = 0;
    // Signalled, under mu_, when this request becomes the front of the queue or is done.
    CondVar cv;
    // Set under mu_ by the leader of the group that committed this request (the outer mu_ cannot
    // be named in an annotation here); status and result are visible once done is.
    bool done = false;
    absl::Status status;
    WriteResult result;
  };

  // The live document of an external id as the group sees it: iid 0 when there is none. The
  // version is read only when an upsert needs it (a delete does not, so that a document whose
  // record is corrupt can still be deleted).
  struct IdState {
    uint64_t iid = 0;
    uint64_t version = 0;
    bool version_known = false;
  };

  // Queues `w` and returns once it is committed (or failed), as leader or follower.
  void Commit(Writer* w) ABSL_LOCKS_EXCLUDED(mu_);
  // Leader only: resolves, batches and writes `group` and fills in every writer's outcome.
  void CommitGroup(const std::vector<Writer*>& group);
  // The live iid of `external_id` in the database (not the group); 0 when there is none.
  absl::Status ReadIid(const std::string& external_id, uint64_t* iid) const;
  // The version in the docs record of `iid`, which ids maps `external_id` to.
  absl::Status ReadVersion(const std::string& external_id, uint64_t iid, uint64_t* version) const;
  absl::StatusOr<uint64_t> ReadCounter(const char* key) const;
  absl::Status Rocks(const rocksdb::Status& s, absl::string_view context) const {
    return FromRocks(s, dir_, context);
  }
  // Deletes the keys of `cf` in each [begin, end) range that holds any, durably, then compacts
  // those ranges so that their disk space is freed now. Ranges without keys cost one seek: every
  // open of a shard on the centroid index drops what a crash may have left, which is usually
  // nothing, and then writes and compacts nothing.
  absl::Status DropRanges(rocksdb::ColumnFamilyHandle* cf,
                          const std::vector<std::pair<std::string, std::string>>& ranges,
                          absl::string_view what);
  // Adds the shard directory to a codec error.
  template <typename T>
  absl::StatusOr<T> Codec(absl::StatusOr<T> decoded) const {
    if (!decoded.ok()) return InShard(decoded.status(), dir_);
    return decoded;
  }
  // One MultiGet of keys[i] (the key of iids[i]) in `cf`, each value decoded by
  // decode(value, iids[i]); std::nullopt where a key is absent. Fails as a whole on any other
  // error (the first, in iids order).
  template <typename T, typename Decode>
  absl::StatusOr<std::vector<std::optional<T>>> MultiGetDecoded(
      rocksdb::ColumnFamilyHandle* cf, absl::Span<const uint64_t> iids,
      const std::vector<std::string>& keys, absl::string_view what, const Decode& decode) const {
    const size_t n = iids.size();
    std::vector<rocksdb::Slice> slices(keys.begin(), keys.end());
    std::vector<rocksdb::PinnableSlice> values(n);
    std::vector<rocksdb::Status> statuses(n);
    db_->MultiGet(rocksdb::ReadOptions(), cf, n, slices.data(), values.data(), statuses.data());
    std::vector<std::optional<T>> out(n);
    for (size_t i = 0; i < n; ++i) {
      if (statuses[i].IsNotFound()) continue;
      TESSERA_RETURN_IF_ERROR(Rocks(statuses[i], absl::StrCat("reading ", what, " iid ", iids[i])));
      TESSERA_ASSIGN_OR_RETURN(
          out[i], Codec(decode(absl::string_view(values[i].data(), values[i].size()), iids[i])));
      values[i].Reset();
    }
    return out;
  }
  void DeleteRows(rocksdb::WriteBatch* batch, uint64_t iid,
                  const std::vector<uint32_t>& code_generations);
  // Every write to the database: resumes a database a full disk stopped (ResumeIfStopped), then
  // writes `batch` (synced per options_.sync, or always when `sync`). Sets *attempted when it
  // reached RocksDB.
  absl::Status WriteToDb(rocksdb::WriteBatch* batch, absl::string_view context,
                         bool* attempted = nullptr, bool sync = false);

  // Rerank segments (see shard_store.h). Where a document's rows lie in a mapped segment.
  struct RowsLocation {
    const char* data = nullptr;
    uint32_t segment = 0;
    uint32_t rows = 0;
    uint32_t cols = 0;
    VectorDtype dtype = VectorDtype::kFloat16;
    int64_t bytes() const { return int64_t{rows} * cols * static_cast<int64_t>(DtypeSize(dtype)); }
  };
  struct SegmentState {
    std::shared_ptr<const RerankSegment> file;
    int64_t row_bytes = 0;   // of every document written to it
    int64_t live_bytes = 0;  // of those still pointing to it
  };
  std::string SegmentPath(uint32_t number) const {
    return absl::StrCat(dir_, "/", RerankSegmentFileName(number));
  }
  // At Open: deletes uncommitted segment files, maps and verifies the committed ones, and loads
  // the locations (pointers) and the rows still in RocksDB from the rerank CF.
  absl::Status OpenRerankSegments();
  // A rerank CF value as a matrix: decoded, or copied from its segment and checked against the
  // pointer's CRC. kSegmentGone when the pointer names a segment no longer there.
  absl::StatusOr<StoredMatrix> DecodeRerank(absl::string_view value, uint64_t iid) const;
  // Flushes rows when forced or past options_.rerank_flush_bytes, then rewrites segments.
  absl::Status MaintainRerank(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(flush_mu_);
  absl::Status FlushRowsToSegments() ABSL_EXCLUSIVE_LOCKS_REQUIRED(flush_mu_);
  absl::Status RewriteSegments() ABSL_EXCLUSIVE_LOCKS_REQUIRED(flush_mu_);
  // Writes a segment of `entries` (rows[i]: entry i's bytes), then commits, in one synced batch,
  // pointers to it for the entries not removed meanwhile, its meta key, and the removal of the
  // segments in `replaced`, whose files it then unlinks.
  absl::Status WriteSegmentAndCommit(std::vector<RerankSegmentEntry> entries,
                                     const std::vector<absl::string_view>& rows,
                                     const std::vector<uint32_t>& replaced)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(flush_mu_);
  // Starts (or stops) recording the iids that commits remove, for a flush or rewrite in progress.
  void TrackRemovals(bool on) ABSL_LOCKS_EXCLUDED(commit_mu_);
  // The leader's bookkeeping after a committed batch; true when maintenance is due.
  bool ApplyRerankChanges(const std::vector<std::pair<uint64_t, int64_t>>& added,
                          const std::vector<uint64_t>& removed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(commit_mu_);
  bool SegmentWantsRewrite(const SegmentState& segment) const {
    const int64_t dead = segment.row_bytes - segment.live_bytes;
    return dead > 0 &&
           static_cast<double>(dead) >= options_.rerank_rewrite_dead_fraction * segment.row_bytes;
  }
  void SignalMaintenance() ABSL_LOCKS_EXCLUDED(maintain_mu_);
  void MaintainLoop() ABSL_LOCKS_EXCLUDED(maintain_mu_);
  // The status of a failed write or flush; remembers a full disk, and says for other I/O errors
  // that RocksDB refuses writes from then on.
  absl::Status WriteFailed(const rocksdb::Status& s, absl::string_view context);
  // When a write failed on a full disk, RocksDB refuses every write (a hard background error)
  // until DB::Resume(). Calls it once statvfs shows `bytes` + kResumeHeadroomBytes free, and
  // otherwise fails fast with RESOURCE_EXHAUSTED naming the directory.
  absl::Status ResumeIfStopped(uint64_t bytes) ABSL_LOCKS_EXCLUDED(resume_mu_);

  const std::string dir_;
  const ShardStoreOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  // Every handle opened (ours and any other CF found on disk), released before db_ closes.
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  rocksdb::ColumnFamilyHandle* meta_ = nullptr;
  rocksdb::ColumnFamilyHandle* docs_ = nullptr;
  rocksdb::ColumnFamilyHandle* ids_ = nullptr;
  rocksdb::ColumnFamilyHandle* rerank_ = nullptr;
  rocksdb::ColumnFamilyHandle* candidates_ = nullptr;
  rocksdb::ColumnFamilyHandle* codes_ = nullptr;

  Mutex mu_;
  // Queued writers; the front one is the leader, all others wait on their cv.
  std::deque<Writer*> writers_ ABSL_GUARDED_BY(mu_);
  // See SetCodeGenerations. The leader copies it when it forms its group.
  std::vector<uint32_t> code_generations_ ABSL_GUARDED_BY(mu_);

  // Owned by the current leader (the writer at the front of writers_, which it leaves only after
  // publishing these under mu_), so they are read and written without holding mu_.
  uint64_t next_iid_ = 1;
  uint64_t next_commit_index_ = 1;
  std::vector<uint32_t> group_code_generations_;
  int64_t live_documents_ = 0;

  // Copies for lock-free readers.
  std::atomic<int64_t> live_documents_snapshot_{0};
  std::atomic<int64_t> synced_writes_{0};

  // Set when a write or flush failed on a full disk (the database refuses writes until resumed);
  // cleared by ResumeIfStopped under resume_mu_.
  std::atomic<bool> stopped_by_full_disk_{false};
  Mutex resume_mu_;

  // One flush or rewrite of rerank segments at a time; Checkpoint holds it too, so that the
  // segments and the pointers it copies agree.
  Mutex flush_mu_ ABSL_ACQUIRED_BEFORE(commit_mu_);
  uint32_t next_segment_ ABSL_GUARDED_BY(flush_mu_) = 1;
  // Held across every write that changes rerank pointers or removes documents (the leader's
  // batch, a segment commit) and the bookkeeping after it, so that a flush or rewrite never
  // commits a pointer for a document removed meanwhile.
  Mutex commit_mu_ ABSL_ACQUIRED_BEFORE(rerank_mu_);
  bool tracking_removals_ ABSL_GUARDED_BY(commit_mu_) = false;
  absl::flat_hash_set<uint64_t> removed_while_tracking_ ABSL_GUARDED_BY(commit_mu_);
  // What readers look up: the segments, the location of every document whose rows are in one,
  // and the rows still in RocksDB (iid → bytes).
  mutable Mutex rerank_mu_;
  std::map<uint32_t, SegmentState> segments_ ABSL_GUARDED_BY(rerank_mu_);
  absl::flat_hash_map<uint64_t, RowsLocation> locations_ ABSL_GUARDED_BY(rerank_mu_);
  absl::flat_hash_map<uint64_t, int64_t> unflushed_ ABSL_GUARDED_BY(rerank_mu_);
  int64_t unflushed_bytes_ ABSL_GUARDED_BY(rerank_mu_) = 0;
  // The background maintenance thread (options_.rerank_flush_bytes > 0).
  Mutex maintain_mu_;
  CondVar maintain_cv_;
  bool maintain_wanted_ ABSL_GUARDED_BY(maintain_mu_) = false;
  bool maintain_stopping_ ABSL_GUARDED_BY(maintain_mu_) = false;
  std::atomic<bool> stopping_{false};
  std::thread maintainer_;
};

ShardStoreImpl::~ShardStoreImpl() {
  stopping_.store(true, std::memory_order_release);
  {
    MutexLock lock(&maintain_mu_);
    maintain_stopping_ = true;
    maintain_cv_.SignalAll();
  }
  if (maintainer_.joinable()) maintainer_.join();
  if (db_ == nullptr) return;
  for (rocksdb::ColumnFamilyHandle* handle : handles_) db_->DestroyColumnFamilyHandle(handle);
  handles_.clear();
  db_->Close().PermitUncheckedError();
  db_.reset();
}

absl::Status ShardStoreImpl::Open() {
  namespace fs = std::filesystem;
  std::error_code error;
  const bool exists = fs::exists(fs::path(dir_) / "CURRENT", error);
  if (!exists && !options_.create_if_missing) {
    return absl::NotFoundError(
        absl::StrCat("shard '", dir_, "': no database there (create_if_missing is false)"));
  }
  if (!exists) {
    fs::create_directories(dir_, error);
    if (error) {
      return absl::UnavailableError(
          absl::StrCat("shard '", dir_, "': cannot create the directory: ", error.message()));
    }
  }

  rocksdb::DBOptions db_options;
  db_options.create_if_missing = options_.create_if_missing;
  db_options.create_missing_column_families = true;
  db_options.paranoid_checks = true;
  db_options.max_background_jobs = 2;
  db_options.bytes_per_sync = 1 << 20;
  // Bounds the WAL: meta is written by every batch but rarely fills its memtable, which would
  // otherwise pin old WAL files.
  db_options.max_total_wal_size = size_t{256} << 20;
  const std::shared_ptr<SharedStoreMemory> memory =
      options_.memory != nullptr
          ? options_.memory
          : NewSharedStoreMemory(kDefaultMemtableBytes, kDefaultBlockCacheBytes);
  db_options.write_buffer_manager = memory->write_buffers;
  // With a write buffer manager, RocksDB (7.8: DBImpl::GetWalPreallocateBlockSize) reads
  // db_write_buffer_size only as a bound on the WAL's preallocation step, min(1.1 × the largest
  // write_buffer_size, max_total_wal_size, db_write_buffer_size, the manager's budget); memtables
  // are flushed by the manager's budget. shard_store_test and engine_test check the disk use.
  db_options.db_write_buffer_size = kWalPreallocationBytes;
  // The MANIFEST grows by a few hundred bytes per flush or compaction; RocksDB preallocates 4 MiB.
  db_options.manifest_preallocation_size = size_t{64} << 10;
  db_options.max_open_files = 512;
  db_options.keep_log_file_num = 4;  // LOG.old.* files of the RocksDB logger used before InfoLog
  db_options.info_log = std::make_shared<InfoLog>(dir_ + "/LOG");
  db_options.listeners.push_back(std::make_shared<NoSpaceRecoveryListener>());

  const std::shared_ptr<rocksdb::Cache>& cache = memory->block_cache;
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors = {
      {rocksdb::kDefaultColumnFamilyName, CfOptions(cache, 4 << 20, 4 << 10, false, true)},
      {kMetaCf, CfOptions(cache, 4 << 20, 4 << 10, false, true)},
      {kDocsCf, CfOptions(cache, 32 << 20, 16 << 10, true, true)},
      {kIdsCf, CfOptions(cache, 16 << 20, 4 << 10, true, true)},
      {kRerankCf, CfOptions(cache, 128 << 20, 4 << 10, false, false)},
      {kCandidatesCf, CfOptions(cache, 64 << 20, 4 << 10, false, false)},
      {kCodesCf, CfOptions(cache, 64 << 20, 4 << 10, false, false)},
  };
  if (exists) {
    // RocksDB refuses to open a database without all of its column families.
    std::vector<std::string> names;
    TESSERA_RETURN_IF_ERROR(Rocks(rocksdb::DB::ListColumnFamilies(db_options, dir_, &names),
                                  "listing column families"));
    for (const std::string& name : names) {
      const bool known = std::any_of(descriptors.begin(), descriptors.end(),
                                     [&](const auto& d) { return d.name == name; });
      if (!known) descriptors.emplace_back(name, rocksdb::ColumnFamilyOptions());
    }
  }

  rocksdb::DB* db = nullptr;
  TESSERA_RETURN_IF_ERROR(
      Rocks(rocksdb::DB::Open(db_options, dir_, descriptors, &handles_, &db), "opening"));
  db_.reset(db);
  meta_ = handles_[1];
  docs_ = handles_[2];
  ids_ = handles_[3];
  rerank_ = handles_[4];
  candidates_ = handles_[5];
  codes_ = handles_[6];

  // Format version: written once, checked on every open.
  const std::string format_key = kFormatVersionKey;
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), meta_, format_key, &value);
  if (s.IsNotFound()) {
    rocksdb::WriteOptions write_options;
    write_options.sync = true;
    rocksdb::WriteBatch batch;
    batch.Put(meta_, format_key, EncodeCounterValue(kStoreFormatVersion));
    TESSERA_RETURN_IF_ERROR(Rocks(db_->Write(write_options, &batch), "writing the format version"));
  } else {
    TESSERA_RETURN_IF_ERROR(Rocks(s, "reading the format version"));
    TESSERA_ASSIGN_OR_RETURN(uint64_t format, Codec(DecodeCounterValue(value, format_key)));
    if (format != kStoreFormatVersion) {
      return absl::FailedPreconditionError(absl::StrCat("shard '", dir_, "': storage format ",
                                                        format, ", this build reads ",
                                                        kStoreFormatVersion));
    }
  }

  // The iid counter: the persisted one, but never below the largest stored iid + 1.
  TESSERA_ASSIGN_OR_RETURN(uint64_t next_iid, ReadCounter(kNextIidKey));
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), docs_));
    it->SeekToLast();
    uint64_t last = 0;
    if (it->Valid() && DecodeIidKey(absl::string_view(it->key().data(), it->key().size()), &last)) {
      next_iid = std::max(next_iid, last + 1);
    }
    TESSERA_RETURN_IF_ERROR(Rocks(it->status(), "scanning docs"));
  }
  next_iid_ = std::max<uint64_t>(next_iid, 1);

  const std::string live_key = kLiveDocumentsKey;
  s = db_->Get(rocksdb::ReadOptions(), meta_, live_key, &value);
  if (s.ok()) {
    TESSERA_ASSIGN_OR_RETURN(uint64_t live, Codec(DecodeCounterValue(value, live_key)));
    live_documents_ = static_cast<int64_t>(live);
  } else if (s.IsNotFound()) {
    // Not written yet: count (a new database has nothing to count).
    rocksdb::ReadOptions scan;
    scan.fill_cache = false;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(scan, docs_));
    int64_t count = 0;
    for (it->SeekToFirst(); it->Valid(); it->Next()) ++count;
    TESSERA_RETURN_IF_ERROR(Rocks(it->status(), "counting docs"));
    live_documents_ = count;
  } else {
    TESSERA_RETURN_IF_ERROR(Rocks(s, "reading the document counter"));
  }
  live_documents_snapshot_.store(live_documents_, std::memory_order_relaxed);
  TESSERA_RETURN_IF_ERROR(OpenRerankSegments());
  if (options_.rerank_segments && options_.rerank_flush_bytes > 0) {
    maintainer_ = std::thread([this] { MaintainLoop(); });
    bool due = false;
    {
      ReaderMutexLock lock(&rerank_mu_);
      due = unflushed_bytes_ >= options_.rerank_flush_bytes;
      for (const auto& [number, segment] : segments_) due = due || SegmentWantsRewrite(segment);
    }
    if (due) SignalMaintenance();
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ShardStoreImpl::ReadCounter(const char* key) const {
  std::string value;
  const rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), meta_, key, &value);
  if (s.IsNotFound()) return 0;
  TESSERA_RETURN_IF_ERROR(Rocks(s, absl::StrCat("reading meta key ", key)));
  return Codec(DecodeCounterValue(value, key));
}

absl::Status ShardStoreImpl::PutMeta(const std::string& key, const std::string& value) {
  Writer w;
  w.counts_commit = false;
  w.meta.emplace_back(kUserMetaPrefix + key, EncodeMetaValue(value));
  w.bytes = key.size() + value.size();
  Commit(&w);
  return w.status;
}

absl::StatusOr<std::string> ShardStoreImpl::GetMeta(const std::string& key) const {
  std::string value;
  const rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), meta_, kUserMetaPrefix + key, &value);
  if (s.IsNotFound()) {
    return absl::NotFoundError(absl::StrCat("shard '", dir_, "': no meta key ", Quote(key)));
  }
  TESSERA_RETURN_IF_ERROR(Rocks(s, absl::StrCat("reading meta key ", Quote(key))));
  return Codec(DecodeMetaValue(value, key));
}

absl::StatusOr<WriteResult> ShardStoreImpl::Write(std::vector<DocumentWrite> upserts,
                                                  const std::vector<std::string>& deletes) {
  Writer w;
  w.deletes = &deletes;
  w.documents = upserts.size() + deletes.size();
  w.upserts.reserve(upserts.size());
  // Validate and encode in the caller's thread, so that the leader's critical section is short.
  for (DocumentWrite& write : upserts) {
    const std::string& id = write.record.external_id;
    if (id.empty()) return absl::InvalidArgumentError("a document has an empty id");
    const std::string what = absl::StrCat("document ", Quote(id));
    if (id.size() > std::numeric_limits<uint32_t>::max() ||
        write.record.members.size() > std::numeric_limits<uint32_t>::max() ||
        write.record.member_offsets.size() > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": too large to encode"));
    }
    TESSERA_RETURN_IF_ERROR(ValidateMatrix(write.rerank, absl::StrCat(what, ": rerank vectors")));
    TESSERA_RETURN_IF_ERROR(
        ValidateMatrix(write.candidates, absl::StrCat(what, ": candidate vectors")));
    PreparedUpsert prepared;
    EncodeStoredMatrix(write.rerank, &prepared.rerank_value);
    if (write.candidates.rows > 0) EncodeStoredMatrix(write.candidates, &prepared.candidates_value);
    if (!write.codes.empty()) prepared.codes_value = EncodeCodesValue(write.codes);
    prepared.code_generation = write.code_generation;
    prepared.rerank_bytes =
        write.rerank.rows > 0 ? static_cast<int64_t>(write.rerank.bytes.size()) : 0;
    std::string().swap(write.rerank.bytes);
    std::string().swap(write.candidates.bytes);
    std::string().swap(write.codes);
    prepared.record = std::move(write.record);
    w.bytes += prepared.rerank_value.size() + prepared.candidates_value.size() +
               prepared.codes_value.size() + id.size();
    w.upserts.push_back(std::move(prepared));
  }
  for (const std::string& id : deletes) w.bytes += id.size();
  Commit(&w);
  if (!w.status.ok()) return w.status;
  return std::move(w.result);
}

void ShardStoreImpl::Commit(Writer* w) {
  std::vector<Writer*> group;
  {
    MutexLock lock(&mu_);
    writers_.push_back(w);
    while (!w->done && w != writers_.front()) w->cv.Wait(&mu_);
    if (w->done) return;
    // Leader: take queued requests from the front while the group stays within bounds.
    group_code_generations_ = code_generations_;
    size_t documents = 0;
    size_t bytes = 0;
    for (Writer* next : writers_) {
      if (!group.empty() && (documents + next->documents > kMaxGroupDocuments ||
                             bytes + next->bytes > kMaxGroupBytes)) {
        break;
      }
      documents += next->documents;
      bytes += next->bytes;
      group.push_back(next);
    }
  }
  // Writers arriving now queue behind the group; their turn comes when this leader is done.
  CommitGroup(group);

  MutexLock lock(&mu_);
  for (Writer* member : group) {
    // The group is the front of the queue, in order. Signalled under mu_: a member returns (and
    // its Writer, cv included, goes away) only after reacquiring it.
    writers_.pop_front();
    if (member != w) {
      member->done = true;
      member->cv.Signal();
    }
  }
  if (!writers_.empty()) writers_.front()->cv.Signal();
}

absl::Status ShardStoreImpl::ReadIid(const std::string& external_id, uint64_t* iid) const {
  std::string value;
  const rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), ids_, external_id, &value);
  if (s.IsNotFound()) {
    *iid = 0;
    return absl::OkStatus();
  }
  TESSERA_RETURN_IF_ERROR(Rocks(s, absl::StrCat("looking up ", Quote(external_id))));
  TESSERA_ASSIGN_OR_RETURN(*iid, Codec(DecodeIdValue(value, external_id)));
  return absl::OkStatus();
}

absl::Status ShardStoreImpl::ReadVersion(const std::string& external_id, uint64_t iid,
                                         uint64_t* version) const {
  rocksdb::PinnableSlice value;
  const rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), docs_, EncodeIidKey(iid), &value);
  if (s.IsNotFound()) {
    return absl::DataLossError(absl::StrCat("shard '", dir_, "': ids CF maps ", Quote(external_id),
                                            " to iid ", iid, ", which has no docs row"));
  }
  TESSERA_RETURN_IF_ERROR(Rocks(s, absl::StrCat("reading docs iid ", iid)));
  TESSERA_ASSIGN_OR_RETURN(
      DocumentRecord old,
      Codec(DecodeDocumentRecord(absl::string_view(value.data(), value.size()), iid)));
  *version = old.version;
  return absl::OkStatus();
}

void ShardStoreImpl::DeleteRows(rocksdb::WriteBatch* batch, uint64_t iid,
                                const std::vector<uint32_t>& code_generations) {
  const std::string key = EncodeIidKey(iid);
  batch->Delete(docs_, key);
  batch->Delete(rerank_, key);
  batch->Delete(candidates_, key);
  for (uint32_t generation : code_generations) {
    batch->Delete(codes_, EncodeCodesKey(generation, iid));
  }
}

void ShardStoreImpl::CommitGroup(const std::vector<Writer*>& group) {
  rocksdb::WriteBatch batch;
  // The state of every external id the group has touched so far, after its operations so far.
  absl::flat_hash_map<std::string, IdState> states;
  uint64_t next_iid = next_iid_;
  int64_t live = live_documents_;
  std::vector<Writer*> batched;
  batched.reserve(group.size());
  // For the rerank segments' bookkeeping: rows written (iid, bytes) and documents removed.
  std::vector<std::pair<uint64_t, int64_t>> added_rows;
  std::vector<uint64_t> removed_iids;

  for (Writer* w : group) {
    // Pass 1 (may fail, for this request only): read the ids the group has not seen yet.
    absl::flat_hash_map<std::string, IdState> fresh;
    auto read = [&](const std::string& id, bool need_version) -> absl::Status {
      auto it = fresh.find(id);
      if (it == fresh.end()) {
        const auto known = states.find(id);
        if (known != states.end()) {
          if (!need_version || known->second.iid == 0 || known->second.version_known) {
            return absl::OkStatus();
          }
          it = fresh.emplace(id, known->second).first;
        } else {
          IdState state;
          TESSERA_RETURN_IF_ERROR(ReadIid(id, &state.iid));
          it = fresh.emplace(id, state).first;
        }
      }
      IdState& state = it->second;
      if (need_version && state.iid != 0 && !state.version_known) {
        TESSERA_RETURN_IF_ERROR(ReadVersion(id, state.iid, &state.version));
        state.version_known = true;
      }
      return absl::OkStatus();
    };
    absl::Status status;
    for (const PreparedUpsert& u : w->upserts) {
      if (status.ok()) status = read(u.record.external_id, /*need_version=*/true);
    }
    if (w->deletes != nullptr) {
      for (const std::string& id : *w->deletes) {
        if (status.ok()) status = read(id, /*need_version=*/false);
      }
    }
    if (!status.ok()) {
      w->status = status;
      continue;
    }
    for (auto& [id, state] : fresh) states.insert_or_assign(id, state);

    // Pass 2 (cannot fail): apply in request order.
    WriteResult& result = w->result;
    result.upserted_iids.reserve(w->upserts.size());
    result.versions.reserve(w->upserts.size());
    result.replaced_iids.reserve(w->upserts.size());
    for (PreparedUpsert& u : w->upserts) {
      IdState& state = states[u.record.external_id];
      const uint64_t iid = next_iid++;
      const uint64_t version = state.iid != 0 ? state.version + 1 : 1;
      if (state.iid != 0) {
        DeleteRows(&batch, state.iid, group_code_generations_);
        removed_iids.push_back(state.iid);
      } else {
        ++live;
      }
      u.record.iid = iid;
      u.record.version = version;
      const std::string key = EncodeIidKey(iid);
      batch.Put(docs_, key, EncodeDocumentRecord(u.record));
      batch.Put(rerank_, key, u.rerank_value);
      if (u.rerank_bytes > 0) added_rows.emplace_back(iid, u.rerank_bytes);
      if (!u.candidates_value.empty()) batch.Put(candidates_, key, u.candidates_value);
      if (!u.codes_value.empty()) {
        batch.Put(codes_, EncodeCodesKey(u.code_generation, iid), u.codes_value);
      }
      batch.Put(ids_, u.record.external_id, EncodeIdValue(iid));
      std::string().swap(u.rerank_value);
      std::string().swap(u.candidates_value);
      std::string().swap(u.codes_value);
      result.upserted_iids.push_back(iid);
      result.versions.push_back(version);
      result.replaced_iids.push_back(state.iid);
      state = IdState{iid, version, true};
    }
    if (w->deletes != nullptr) {
      result.deleted_iids.reserve(w->deletes->size());
      for (const std::string& id : *w->deletes) {
        IdState& state = states[id];
        result.deleted_iids.push_back(state.iid);
        if (state.iid == 0) continue;
        DeleteRows(&batch, state.iid, group_code_generations_);
        removed_iids.push_back(state.iid);
        batch.Delete(ids_, id);
        --live;
        state = IdState{};
      }
    }
    for (const auto& [key, value] : w->meta) batch.Put(meta_, key, value);
    batched.push_back(w);
  }
  if (batched.empty()) return;

  // The counters go in the same batch, so they are exactly as durable as the documents.
  batch.Put(meta_, kNextIidKey, EncodeCounterValue(next_iid));
  batch.Put(meta_, kLiveDocumentsKey, EncodeCounterValue(static_cast<uint64_t>(live)));
  // Iids handed out are never handed out again, even when the write fails.
  next_iid_ = next_iid;

  bool attempted = false;
  absl::Status error;
  bool maintain = false;
  {
    MutexLock commit(&commit_mu_);
    error = WriteToDb(&batch, "writing a batch", &attempted);
    if (error.ok()) maintain = ApplyRerankChanges(added_rows, removed_iids);
  }
  if (maintain) SignalMaintenance();
  if (attempted && options_.sync) synced_writes_.fetch_add(1, std::memory_order_relaxed);
  if (!error.ok()) {
    for (Writer* w : batched) {
      w->status = error;
      w->result = WriteResult();
    }
    return;
  }
  live_documents_ = live;
  live_documents_snapshot_.store(live, std::memory_order_relaxed);
  // Every write goes through this queue, so the latest sequence is this batch's last one.
  const uint64_t sequence = db_->GetLatestSequenceNumber();
  for (Writer* w : batched) {
    w->result.sequence = sequence;
    if (w->counts_commit) w->result.commit_index = next_commit_index_++;
  }
}

absl::StatusOr<uint64_t> ShardStoreImpl::LookupId(const std::string& external_id) const {
  std::string value;
  const rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), ids_, external_id, &value);
  if (s.IsNotFound()) {
    return absl::NotFoundError(
        absl::StrCat("shard '", dir_, "': no document ", Quote(external_id)));
  }
  TESSERA_RETURN_IF_ERROR(Rocks(s, absl::StrCat("looking up ", Quote(external_id))));
  return Codec(DecodeIdValue(value, external_id));
}

absl::StatusOr<DocumentRecord> ShardStoreImpl::GetRecord(uint64_t iid) const {
  rocksdb::PinnableSlice value;
  const rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), docs_, EncodeIidKey(iid), &value);
  if (s.IsNotFound()) {
    return absl::NotFoundError(absl::StrCat("shard '", dir_, "': no document with iid ", iid));
  }
  TESSERA_RETURN_IF_ERROR(Rocks(s, absl::StrCat("reading docs iid ", iid)));
  return Codec(DecodeDocumentRecord(absl::string_view(value.data(), value.size()), iid));
}

absl::StatusOr<StoredMatrix> ShardStoreImpl::GetRerank(uint64_t iid) const {
  rocksdb::PinnableSlice value;
  const rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), rerank_, EncodeIidKey(iid), &value);
  if (s.IsNotFound()) {
    return absl::NotFoundError(absl::StrCat("shard '", dir_, "': no rerank vectors for iid ", iid));
  }
  TESSERA_RETURN_IF_ERROR(Rocks(s, absl::StrCat("reading rerank iid ", iid)));
  absl::StatusOr<StoredMatrix> matrix =
      Codec(DecodeRerank(absl::string_view(value.data(), value.size()), iid));
  // A rewrite replaced the segment between the read and the copy: read the new pointer.
  for (int retry = 0; retry < kSegmentRetries && matrix.status().code() == kSegmentGone; ++retry) {
    value.Reset();
    const rocksdb::Status again =
        db_->Get(rocksdb::ReadOptions(), rerank_, EncodeIidKey(iid), &value);
    if (again.IsNotFound()) {
      return absl::NotFoundError(
          absl::StrCat("shard '", dir_, "': no rerank vectors for iid ", iid));
    }
    TESSERA_RETURN_IF_ERROR(Rocks(again, absl::StrCat("reading rerank iid ", iid)));
    matrix = Codec(DecodeRerank(absl::string_view(value.data(), value.size()), iid));
  }
  return matrix;
}

absl::StatusOr<std::vector<std::optional<StoredMatrix>>> ShardStoreImpl::MultiGetRerank(
    absl::Span<const uint64_t> iids) const {
  std::vector<std::string> keys;
  keys.reserve(iids.size());
  for (uint64_t iid : iids) keys.push_back(EncodeIidKey(iid));
  absl::StatusOr<std::vector<std::optional<StoredMatrix>>> out;
  for (int attempt = 0; attempt <= kSegmentRetries; ++attempt) {
    out = MultiGetDecoded<StoredMatrix>(
        rerank_, iids, keys, "rerank vectors",
        [this](absl::string_view value, uint64_t iid) { return DecodeRerank(value, iid); });
    if (out.status().code() != kSegmentGone) break;
  }
  return out;
}

absl::StatusOr<StoredMatrix> ShardStoreImpl::DecodeRerank(absl::string_view value,
                                                          uint64_t iid) const {
  if (!IsRerankPointer(value)) return DecodeStoredMatrix(value, kRerankCf, iid);
  TESSERA_ASSIGN_OR_RETURN(const RerankPointer pointer, DecodeRerankPointer(value, iid));
  std::shared_ptr<const RerankSegment> segment;
  {
    ReaderMutexLock lock(&rerank_mu_);
    const auto it = segments_.find(pointer.segment);
    if (it != segments_.end()) segment = it->second.file;
  }
  if (segment == nullptr) {
    return absl::Status(kSegmentGone, absl::StrCat("rerank iid ", iid, ": segment ",
                                                   pointer.segment, " was replaced meanwhile"));
  }
  StoredMatrix matrix{pointer.dtype, pointer.rows, pointer.cols, {}};
  const absl::string_view rows =
      segment->Rows(pointer.offset,
                    static_cast<uint64_t>(pointer.rows * pointer.cols) * DtypeSize(pointer.dtype));
  if (rows.empty()) {
    return absl::DataLossError(absl::StrCat("rerank segment '", segment->path(), "': rows of iid ",
                                            iid, " at offset ", pointer.offset,
                                            " lie outside the file"));
  }
  matrix.bytes.assign(rows.data(), rows.size());
  if (Crc32(matrix.bytes) != pointer.crc) {
    return absl::DataLossError(absl::StrCat("rerank segment '", segment->path(), "': rows of iid ",
                                            iid, " at offset ", pointer.offset,
                                            " fail their checksum"));
  }
  return matrix;
}

absl::StatusOr<std::vector<std::shared_ptr<const StoredMatrixView>>> ShardStoreImpl::ReadRerank(
    absl::Span<const uint64_t> iids) const {
  const size_t n = iids.size();
  auto batch = std::make_shared<RerankReadBatch>();
  batch->views.resize(n);
  std::vector<bool> found(n, false);
  std::vector<size_t> missing;
  {
    ReaderMutexLock lock(&rerank_mu_);
    uint32_t last = 0;  // segment numbers start at 1
    for (size_t i = 0; i < n; ++i) {
      const auto it = locations_.find(iids[i]);
      if (it == locations_.end()) {
        missing.push_back(i);
        continue;
      }
      const RowsLocation& location = it->second;
      if (location.segment != last) {
        batch->segments.push_back(segments_.at(location.segment).file);
        last = location.segment;
      }
      batch->views[i] = StoredMatrixView{location.dtype, location.rows, location.cols,
                                         absl::string_view(location.data, location.bytes())};
      found[i] = true;
    }
  }
  // Rows still in RocksDB (or flushed since the lookup above).
  for (int attempt = 0; !missing.empty(); ++attempt) {
    std::vector<std::string> keys;
    keys.reserve(missing.size());
    for (size_t i : missing) keys.push_back(EncodeIidKey(iids[i]));
    std::vector<rocksdb::Slice> slices(keys.begin(), keys.end());
    std::vector<rocksdb::PinnableSlice> values(missing.size());
    std::vector<rocksdb::Status> statuses(missing.size());
    db_->MultiGet(rocksdb::ReadOptions(), rerank_, missing.size(), slices.data(), values.data(),
                  statuses.data());
    std::vector<size_t> again;
    for (size_t j = 0; j < missing.size(); ++j) {
      const size_t i = missing[j];
      if (statuses[j].IsNotFound()) continue;
      TESSERA_RETURN_IF_ERROR(
          Rocks(statuses[j], absl::StrCat("reading rerank vectors iid ", iids[i])));
      const absl::string_view value(values[j].data(), values[j].size());
      if (!IsRerankPointer(value)) {
        TESSERA_ASSIGN_OR_RETURN(StoredMatrix matrix,
                                 Codec(DecodeStoredMatrix(value, kRerankCf, iids[i])));
        batch->decoded.push_back(std::move(matrix));
        batch->views[i] = ViewOf(batch->decoded.back());
        found[i] = true;
        continue;
      }
      TESSERA_ASSIGN_OR_RETURN(const RerankPointer pointer,
                               Codec(DecodeRerankPointer(value, iids[i])));
      ReaderMutexLock lock(&rerank_mu_);
      const auto it = segments_.find(pointer.segment);
      if (it == segments_.end()) {
        if (attempt >= kSegmentRetries) {
          return absl::InternalError(absl::StrCat("shard '", dir_, "': rerank iid ", iids[i],
                                                  " points to segment ", pointer.segment,
                                                  ", which keeps being replaced"));
        }
        again.push_back(i);
        continue;
      }
      const absl::string_view rows =
          it->second.file->Rows(pointer.offset, static_cast<uint64_t>(pointer.rows * pointer.cols) *
                                                    DtypeSize(pointer.dtype));
      if (rows.empty()) {
        return absl::DataLossError(absl::StrCat("rerank segment '", it->second.file->path(),
                                                "': rows of iid ", iids[i], " at offset ",
                                                pointer.offset, " lie outside the file"));
      }
      batch->segments.push_back(it->second.file);
      batch->views[i] = StoredMatrixView{pointer.dtype, pointer.rows, pointer.cols, rows};
      found[i] = true;
    }
    missing = std::move(again);
  }
  std::vector<std::shared_ptr<const StoredMatrixView>> out(n);
  for (size_t i = 0; i < n; ++i) {
    // Aliasing: each view shares the batch's ownership (no allocation per document).
    if (found[i]) out[i] = std::shared_ptr<const StoredMatrixView>(batch, &batch->views[i]);
  }
  return out;
}

absl::Status ShardStoreImpl::OpenRerankSegments() {
  namespace fs = std::filesystem;
  // The committed segments (number → size), from meta.
  std::map<uint32_t, int64_t> committed;
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), meta_));
    const absl::string_view prefix = kSegmentKeyPrefix;
    for (it->Seek(rocksdb::Slice(prefix.data(), prefix.size())); it->Valid(); it->Next()) {
      const absl::string_view key(it->key().data(), it->key().size());
      if (!absl::StartsWith(key, prefix)) break;
      if (key.size() != prefix.size() + 4) {
        return absl::DataLossError(
            absl::StrCat("shard '", dir_, "': meta key of ", key.size(), " bytes under ", prefix));
      }
      uint32_t number = 0;
      for (size_t b = prefix.size(); b < key.size(); ++b) {
        number = (number << 8) | static_cast<uint8_t>(key[b]);
      }
      TESSERA_ASSIGN_OR_RETURN(
          const uint64_t size,
          Codec(
              DecodeCounterValue(absl::string_view(it->value().data(), it->value().size()), key)));
      committed[number] = static_cast<int64_t>(size);
    }
    TESSERA_RETURN_IF_ERROR(Rocks(it->status(), "listing rerank segments"));
  }
  // Files of segments that were never committed (a crash before the commit, or after a rewrite's
  // commit before the old file's unlink) and temporaries are deleted.
  uint32_t max_number = 0;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_, error)) {
    const std::string name = entry.path().filename().string();
    uint32_t number = 0;
    const bool temporary = absl::StartsWith(name, "rerank-") && absl::EndsWith(name, ".seg.tmp");
    const bool segment = ParseRerankSegmentFileName(name, &number);
    if (segment) max_number = std::max(max_number, number);
    if (temporary || (segment && committed.count(number) == 0)) {
      Log(options_.log, {LogSeverity::kInfo,
                         "deleting an uncommitted rerank segment file",
                         {{"file", entry.path().string()}}});
      fs::remove(entry.path(), error);
    }
  }
  MutexLock lock(&rerank_mu_);
  for (const auto& [number, size] : committed) {
    max_number = std::max(max_number, number);
    const std::string path = SegmentPath(number);
    absl::StatusOr<std::shared_ptr<const RerankSegment>> segment =
        RerankSegment::Open(path, number, size);
    if (absl::IsNotFound(segment.status())) {
      return absl::DataLossError(absl::StrCat("shard '", dir_, "': rerank segment '", path,
                                              "' is committed but missing; its rows exist nowhere ",
                                              "else"));
    }
    if (!segment.ok()) return InShard(segment.status(), dir_);
    SegmentState state;
    state.file = *std::move(segment);
    for (const RerankSegmentEntry& e : state.file->entries()) state.row_bytes += e.bytes();
    segments_[number] = std::move(state);
  }
  // Locations of the rows in segments, and the rows still in RocksDB.
  rocksdb::ReadOptions scan;
  scan.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(scan, rerank_));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    uint64_t iid = 0;
    if (!DecodeIidKey(absl::string_view(it->key().data(), it->key().size()), &iid)) {
      return absl::DataLossError(
          absl::StrCat("shard '", dir_, "': rerank CF has a key of ", it->key().size(), " bytes"));
    }
    const absl::string_view value(it->value().data(), it->value().size());
    // A value that fails its checksum does not fail the open: reading it does (DATA_LOSS), as
    // before segments existed, and the flush leaves it where it is.
    if (!IsRerankPointer(value)) {
      const absl::StatusOr<StoredMatrix> matrix = DecodeStoredMatrix(value, kRerankCf, iid);
      if (matrix.ok() && matrix->rows > 0) {
        unflushed_[iid] = static_cast<int64_t>(matrix->bytes.size());
        unflushed_bytes_ += static_cast<int64_t>(matrix->bytes.size());
      }
      continue;
    }
    const absl::StatusOr<RerankPointer> decoded = DecodeRerankPointer(value, iid);
    if (!decoded.ok()) continue;
    const RerankPointer& pointer = *decoded;
    const auto segment = segments_.find(pointer.segment);
    if (segment == segments_.end()) {
      return absl::DataLossError(absl::StrCat("shard '", dir_, "': rerank iid ", iid,
                                              " points to segment '", SegmentPath(pointer.segment),
                                              "', which is not committed"));
    }
    RowsLocation location;
    location.segment = pointer.segment;
    location.rows = static_cast<uint32_t>(pointer.rows);
    location.cols = static_cast<uint32_t>(pointer.cols);
    location.dtype = pointer.dtype;
    const absl::string_view rows = segment->second.file->Rows(pointer.offset, location.bytes());
    if (rows.empty()) {
      return absl::DataLossError(absl::StrCat("rerank segment '", segment->second.file->path(),
                                              "': rows of iid ", iid, " at offset ", pointer.offset,
                                              " lie outside the file"));
    }
    location.data = rows.data();
    segment->second.live_bytes += location.bytes();
    locations_[iid] = location;
  }
  TESSERA_RETURN_IF_ERROR(Rocks(it->status(), "scanning rerank"));
  next_segment_ = max_number + 1;
  return absl::OkStatus();
}

void ShardStoreImpl::TrackRemovals(bool on) {
  MutexLock commit(&commit_mu_);
  tracking_removals_ = on;
  removed_while_tracking_.clear();
}

bool ShardStoreImpl::ApplyRerankChanges(const std::vector<std::pair<uint64_t, int64_t>>& added,
                                        const std::vector<uint64_t>& removed) {
  if (tracking_removals_) removed_while_tracking_.insert(removed.begin(), removed.end());
  MutexLock lock(&rerank_mu_);
  for (const auto& [iid, bytes] : added) {
    unflushed_[iid] = bytes;
    unflushed_bytes_ += bytes;
  }
  bool due = options_.rerank_flush_bytes > 0 && unflushed_bytes_ >= options_.rerank_flush_bytes &&
             !added.empty();
  for (uint64_t iid : removed) {
    if (const auto it = unflushed_.find(iid); it != unflushed_.end()) {
      unflushed_bytes_ -= it->second;
      unflushed_.erase(it);
      continue;
    }
    const auto it = locations_.find(iid);
    if (it == locations_.end()) continue;
    SegmentState& segment = segments_.at(it->second.segment);
    segment.live_bytes -= it->second.bytes();
    due = due || (options_.rerank_flush_bytes > 0 && SegmentWantsRewrite(segment));
    locations_.erase(it);
  }
  return due;
}

void ShardStoreImpl::SignalMaintenance() {
  MutexLock lock(&maintain_mu_);
  maintain_wanted_ = true;
  maintain_cv_.Signal();
}

void ShardStoreImpl::MaintainLoop() {
  for (;;) {
    {
      MutexLock lock(&maintain_mu_);
      while (!maintain_wanted_ && !maintain_stopping_) maintain_cv_.Wait(&maintain_mu_);
      if (maintain_stopping_) return;
      maintain_wanted_ = false;
    }
    absl::Status status;
    {
      MutexLock flush(&flush_mu_);
      status = MaintainRerank(/*force=*/false);
    }
    if (!status.ok() && !stopping_.load(std::memory_order_acquire)) {
      Log(options_.log, {LogSeverity::kError,
                         "moving rerank rows into segments failed; retrying on later writes",
                         {{"directory", dir_},
                          {"code", absl::StatusCodeToString(status.code())},
                          {"error", std::string(status.message())}}});
      // Not at once: the next write that finds maintenance due wakes the thread again.
      MutexLock lock(&maintain_mu_);
      maintain_cv_.WaitWithTimeout(&maintain_mu_, absl::Seconds(1));
    }
  }
}

absl::Status ShardStoreImpl::MaintainRerank(bool force) {
  if (!options_.rerank_segments) return absl::OkStatus();
  bool flush = false;
  {
    ReaderMutexLock lock(&rerank_mu_);
    flush = !unflushed_.empty() && (force || (options_.rerank_flush_bytes > 0 &&
                                              unflushed_bytes_ >= options_.rerank_flush_bytes));
  }
  if (flush) TESSERA_RETURN_IF_ERROR(FlushRowsToSegments());
  return RewriteSegments();
}

absl::Status ShardStoreImpl::FlushRowsToSegments() {
  // Removals committed from here on are recorded, and the snapshot holds every commit before.
  const rocksdb::Snapshot* snapshot = nullptr;
  std::vector<uint64_t> iids;
  {
    MutexLock commit(&commit_mu_);
    tracking_removals_ = true;
    removed_while_tracking_.clear();
    snapshot = db_->GetSnapshot();
    ReaderMutexLock lock(&rerank_mu_);
    iids.reserve(unflushed_.size());
    for (const auto& [iid, bytes] : unflushed_) iids.push_back(iid);
  }
  std::sort(iids.begin(), iids.end());
  rocksdb::ReadOptions read_options;
  read_options.snapshot = snapshot;
  read_options.fill_cache = false;
  absl::Status status;
  std::vector<RerankSegmentEntry> entries;
  std::deque<StoredMatrix> held;
  std::vector<absl::string_view> rows;
  int64_t bytes = 0;
  auto commit = [&]() -> absl::Status {
    if (entries.empty()) return absl::OkStatus();
    absl::Status s = WriteSegmentAndCommit(std::move(entries), rows, {});
    entries.clear();
    rows.clear();
    held.clear();
    bytes = 0;
    return s;
  };
  constexpr size_t kBatch = 256;
  for (size_t start = 0; start < iids.size() && status.ok(); start += kBatch) {
    if (stopping_.load(std::memory_order_acquire)) {
      status = absl::CancelledError("the store is closing");
      break;
    }
    const size_t count = std::min(kBatch, iids.size() - start);
    std::vector<std::string> keys;
    for (size_t i = 0; i < count; ++i) keys.push_back(EncodeIidKey(iids[start + i]));
    std::vector<rocksdb::Slice> slices(keys.begin(), keys.end());
    std::vector<rocksdb::PinnableSlice> values(count);
    std::vector<rocksdb::Status> statuses(count);
    db_->MultiGet(read_options, rerank_, count, slices.data(), values.data(), statuses.data());
    for (size_t i = 0; i < count && status.ok(); ++i) {
      const uint64_t iid = iids[start + i];
      if (statuses[i].IsNotFound()) continue;  // removed since
      status = Rocks(statuses[i], absl::StrCat("reading rerank vectors iid ", iid));
      if (!status.ok()) break;
      const absl::string_view value(values[i].data(), values[i].size());
      if (IsRerankPointer(value)) continue;
      absl::StatusOr<StoredMatrix> matrix = Codec(DecodeStoredMatrix(value, kRerankCf, iid));
      // A corrupt value stays in RocksDB, where reading it is DATA_LOSS naming it.
      if (!matrix.ok() || matrix->rows == 0) continue;
      if (!entries.empty() &&
          bytes + static_cast<int64_t>(matrix->bytes.size()) > options_.rerank_segment_bytes) {
        status = commit();
        if (!status.ok()) break;
      }
      RerankSegmentEntry entry;
      entry.iid = iid;
      entry.dtype = matrix->dtype;
      entry.rows = matrix->rows;
      entry.cols = matrix->cols;
      bytes += static_cast<int64_t>(matrix->bytes.size());
      held.push_back(*std::move(matrix));
      rows.push_back(held.back().bytes);
      entries.push_back(entry);
    }
  }
  if (status.ok()) status = commit();
  db_->ReleaseSnapshot(snapshot);
  TrackRemovals(false);
  TESSERA_RETURN_IF_ERROR(status);
  if (iids.empty()) return absl::OkStatus();
  // The values the pointers replaced are garbage now; compacting their range drops them from the
  // SST files (a flush of the memtable drops those that never left it), so that the rows are
  // stored once, in the segments.
  const std::string begin = EncodeIidKey(iids.front());
  const std::string end = EncodeIidKey(iids.back() + 1);
  const rocksdb::Slice begin_key(begin), end_key(end);
  rocksdb::CompactRangeOptions compact;
  compact.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
  return Rocks(db_->CompactRange(compact, rerank_, &begin_key, &end_key),
               "compacting rerank rows moved to segments");
}

absl::Status ShardStoreImpl::RewriteSegments() {
  std::vector<uint32_t> due;
  {
    ReaderMutexLock lock(&rerank_mu_);
    for (const auto& [number, segment] : segments_) {
      if (segment.live_bytes == 0 || SegmentWantsRewrite(segment)) due.push_back(number);
    }
  }
  for (const uint32_t number : due) {
    if (stopping_.load(std::memory_order_acquire)) return absl::CancelledError("closing");
    TrackRemovals(true);
    std::shared_ptr<const RerankSegment> old;
    std::vector<RerankSegmentEntry> entries;
    std::vector<absl::string_view> rows;
    {
      ReaderMutexLock lock(&rerank_mu_);
      old = segments_.at(number).file;
      for (const RerankSegmentEntry& entry : old->entries()) {
        const auto it = locations_.find(entry.iid);
        if (it == locations_.end() || it->second.segment != number) continue;
        const absl::string_view bytes = old->Rows(entry.offset, entry.bytes());
        entries.push_back(entry);
        rows.push_back(bytes);
      }
    }
    // The rows are copied from the mapping: check them, so that a page that went bad since the
    // segment was verified is not carried into a new file under a fresh checksum.
    for (size_t i = 0; i < entries.size(); ++i) {
      if (Crc32(rows[i]) != entries[i].crc) {
        TrackRemovals(false);
        return absl::DataLossError(absl::StrCat("rerank segment '", old->path(), "': rows of iid ",
                                                entries[i].iid, " fail their checksum"));
      }
    }
    const absl::Status status = WriteSegmentAndCommit(std::move(entries), rows, {number});
    TrackRemovals(false);
    TESSERA_RETURN_IF_ERROR(status);
  }
  return absl::OkStatus();
}

absl::Status ShardStoreImpl::WriteSegmentAndCommit(std::vector<RerankSegmentEntry> entries,
                                                   const std::vector<absl::string_view>& rows,
                                                   const std::vector<uint32_t>& replaced) {
  std::error_code ignored;
  uint32_t number = 0;
  std::string path;
  std::shared_ptr<const RerankSegment> segment;
  int64_t size = 0;
  if (!entries.empty()) {
    number = next_segment_++;
    path = SegmentPath(number);
    TESSERA_ASSIGN_OR_RETURN(size, WriteRerankSegment(path, number, absl::MakeSpan(entries), rows));
    // Read back whole: what the pointers will name is exactly what was meant to be written.
    absl::StatusOr<std::shared_ptr<const RerankSegment>> opened =
        RerankSegment::Open(path, number, size);
    if (!opened.ok()) {
      std::filesystem::remove(path, ignored);
      return InShard(opened.status(), dir_);
    }
    segment = *std::move(opened);
  }
  std::vector<size_t> kept;
  {
    MutexLock commit(&commit_mu_);
    rocksdb::WriteBatch batch;
    int64_t row_bytes = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      const RerankSegmentEntry& e = entries[i];
      row_bytes += e.bytes();
      if (removed_while_tracking_.contains(e.iid)) continue;
      batch.Put(
          rerank_, EncodeIidKey(e.iid),
          EncodeRerankPointer(RerankPointer{number, e.offset, e.dtype, e.rows, e.cols, e.crc}));
      kept.push_back(i);
    }
    if (!kept.empty()) batch.Put(meta_, SegmentKey(number), EncodeCounterValue(size));
    for (uint32_t old : replaced) batch.Delete(meta_, SegmentKey(old));
    absl::Status status;
    if (batch.Count() > 0) {
      status = WriteToDb(&batch, "committing a rerank segment", nullptr, /*sync=*/true);
    }
    if (!status.ok()) {
      if (!path.empty()) std::filesystem::remove(path, ignored);
      return status;
    }
    MutexLock lock(&rerank_mu_);
    if (!kept.empty()) {
      SegmentState& state = segments_[number];
      state.file = segment;
      state.row_bytes = row_bytes;
      for (size_t i : kept) {
        const RerankSegmentEntry& e = entries[i];
        RowsLocation location;
        location.segment = number;
        location.rows = static_cast<uint32_t>(e.rows);
        location.cols = static_cast<uint32_t>(e.cols);
        location.dtype = e.dtype;
        location.data = segment->Rows(e.offset, e.bytes()).data();
        state.live_bytes += e.bytes();
        locations_[e.iid] = location;
        if (const auto it = unflushed_.find(e.iid); it != unflushed_.end()) {
          unflushed_bytes_ -= it->second;
          unflushed_.erase(it);
        }
      }
    }
    for (uint32_t old : replaced) segments_.erase(old);
  }
  // Readers that still hold a replaced segment keep its mapping (and so its blocks) until done.
  if (kept.empty() && !path.empty()) std::filesystem::remove(path, ignored);
  for (uint32_t old : replaced) std::filesystem::remove(SegmentPath(old), ignored);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::optional<std::string>>> ShardStoreImpl::MultiGetCodes(
    uint32_t generation, absl::Span<const uint64_t> iids) const {
  std::vector<std::string> keys;
  keys.reserve(iids.size());
  for (uint64_t iid : iids) keys.push_back(EncodeCodesKey(generation, iid));
  return MultiGetDecoded<std::string>(codes_, iids, keys, "centroid codes",
                                      [generation](absl::string_view value, uint64_t iid) {
                                        return DecodeCodesValue(value, generation, iid);
                                      });
}

absl::Status ShardStoreImpl::ForEachDocument(
    const std::function<absl::Status(const DocumentRecord&)>& fn) const {
  rocksdb::ManagedSnapshot snapshot(db_.get());
  rocksdb::ReadOptions read_options;
  read_options.snapshot = snapshot.snapshot();
  read_options.fill_cache = false;  // a full scan must not evict the working set
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options, docs_));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    uint64_t iid = 0;
    if (!DecodeIidKey(absl::string_view(it->key().data(), it->key().size()), &iid)) {
      return absl::DataLossError(
          absl::StrCat("shard '", dir_, "': docs CF has a key of ", it->key().size(), " bytes"));
    }
    TESSERA_ASSIGN_OR_RETURN(DocumentRecord record,
                             Codec(DecodeDocumentRecord(
                                 absl::string_view(it->value().data(), it->value().size()), iid)));
    TESSERA_RETURN_IF_ERROR(fn(record));
  }
  return Rocks(it->status(), "scanning docs");
}

absl::Status ShardStoreImpl::ForEachCandidates(
    uint64_t min_iid, const std::function<absl::Status(uint64_t, const StoredMatrix&)>& fn) const {
  rocksdb::ManagedSnapshot snapshot(db_.get());
  rocksdb::ReadOptions read_options;
  read_options.snapshot = snapshot.snapshot();
  read_options.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options, candidates_));
  for (it->Seek(EncodeIidKey(min_iid)); it->Valid(); it->Next()) {
    uint64_t iid = 0;
    if (!DecodeIidKey(absl::string_view(it->key().data(), it->key().size()), &iid)) {
      return absl::DataLossError(absl::StrCat("shard '", dir_, "': candidates CF has a key of ",
                                              it->key().size(), " bytes"));
    }
    TESSERA_ASSIGN_OR_RETURN(
        StoredMatrix matrix,
        Codec(DecodeStoredMatrix(absl::string_view(it->value().data(), it->value().size()),
                                 kCandidatesCf, iid)));
    TESSERA_RETURN_IF_ERROR(fn(iid, matrix));
  }
  return Rocks(it->status(), "scanning candidates");
}

absl::Status ShardStoreImpl::PutCodes(uint32_t generation,
                                      const std::vector<std::pair<uint64_t, std::string>>& codes,
                                      absl::Span<const uint64_t> removed) {
  rocksdb::WriteBatch batch;
  for (const auto& [iid, bytes] : codes) {
    batch.Put(codes_, EncodeCodesKey(generation, iid), EncodeCodesValue(bytes));
  }
  for (uint64_t iid : removed) batch.Delete(codes_, EncodeCodesKey(generation, iid));
  return WriteToDb(&batch, "writing centroid codes");
}

absl::Status ShardStoreImpl::DropRanges(
    rocksdb::ColumnFamilyHandle* cf, const std::vector<std::pair<std::string, std::string>>& ranges,
    absl::string_view what) {
  std::vector<std::pair<std::string, std::string>> occupied;
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf));
    for (const auto& [begin, end] : ranges) {
      it->Seek(begin);
      TESSERA_RETURN_IF_ERROR(Rocks(it->status(), absl::StrCat("scanning ", what)));
      if (it->Valid() && it->key().compare(end) < 0) occupied.emplace_back(begin, end);
    }
  }
  if (occupied.empty()) return absl::OkStatus();
  rocksdb::WriteBatch batch;
  for (const auto& [begin, end] : occupied) batch.DeleteRange(cf, begin, end);
  TESSERA_RETURN_IF_ERROR(WriteToDb(&batch, absl::StrCat("dropping ", what)));
  for (const auto& [begin, end] : occupied) {
    const rocksdb::Slice begin_key(begin), end_key(end);
    TESSERA_RETURN_IF_ERROR(
        Rocks(db_->CompactRange(rocksdb::CompactRangeOptions(), cf, &begin_key, &end_key),
              absl::StrCat("compacting dropped ", what)));
  }
  return absl::OkStatus();
}

absl::Status ShardStoreImpl::DropCodeGenerationsExcept(uint32_t keep) {
  // One past every key: 13 bytes of 0xff sort after any 12-byte key. A generation's keys are a
  // range of their own, so compacting them mostly deletes whole files.
  const std::string end(13, '\xff');
  std::vector<std::pair<std::string, std::string>> dropped;
  if (keep > 0) dropped.emplace_back(EncodeCodesKey(0, 0), EncodeCodesKey(keep, 0));
  if (keep < UINT32_MAX) dropped.emplace_back(EncodeCodesKey(keep + 1, 0), end);
  return DropRanges(codes_, dropped, "old centroid codes");
}

absl::Status ShardStoreImpl::DropAllCandidates() {
  // One past every key: 9 bytes of 0xff sort after any 8-byte iid key.
  return DropRanges(candidates_, {{"", std::string(9, '\xff')}}, "candidate vectors");
}

absl::StatusOr<std::vector<uint64_t>> ShardStoreImpl::DropAllRerankRows() {
  std::vector<uint64_t> dropped;
  {
    // Under commit_mu_ from the scan to the bookkeeping: no write commits in between, so every
    // value replaced is the document's latest and no removed document gets a value back; a flush
    // or rewrite in progress sees the dropped iids as removed (ApplyRerankChanges).
    MutexLock commit(&commit_mu_);
    rocksdb::ReadOptions read_options;
    read_options.fill_cache = false;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options, rerank_));
    rocksdb::WriteBatch batch;
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      uint64_t iid = 0;
      if (!DecodeIidKey(absl::string_view(it->key().data(), it->key().size()), &iid)) {
        return absl::DataLossError(absl::StrCat("shard '", dir_, "': rerank CF has a key of ",
                                                it->key().size(), " bytes"));
      }
      const absl::string_view value(it->value().data(), it->value().size());
      StoredMatrix empty;
      if (IsRerankPointer(value)) {
        TESSERA_ASSIGN_OR_RETURN(const RerankPointer pointer,
                                 Codec(DecodeRerankPointer(value, iid)));
        empty.dtype = pointer.dtype;
        empty.cols = pointer.cols;
      } else {
        TESSERA_ASSIGN_OR_RETURN(const StoredMatrix matrix,
                                 Codec(DecodeStoredMatrix(value, kRerankCf, iid)));
        if (matrix.rows == 0) continue;
        empty.dtype = matrix.dtype;
        empty.cols = matrix.cols;
      }
      batch.Put(rerank_, it->key(), EncodeStoredMatrix(empty));
      dropped.push_back(iid);
    }
    TESSERA_RETURN_IF_ERROR(Rocks(it->status(), "scanning rerank"));
    if (dropped.empty()) return dropped;
    TESSERA_RETURN_IF_ERROR(WriteToDb(&batch, "dropping rerank rows", nullptr, /*sync=*/true));
    ApplyRerankChanges({}, dropped);
  }
  // Segments left without live rows are deleted, and the replaced values compacted away.
  TESSERA_RETURN_IF_ERROR(FlushRerank());
  rocksdb::CompactRangeOptions compact;
  compact.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
  TESSERA_RETURN_IF_ERROR(Rocks(db_->CompactRange(compact, rerank_, nullptr, nullptr),
                                "compacting dropped rerank rows"));
  return dropped;
}

absl::Status ShardStoreImpl::ForEachCodes(
    uint32_t generation, const std::function<absl::Status(uint64_t, std::string)>& fn) const {
  rocksdb::ManagedSnapshot snapshot(db_.get());
  rocksdb::ReadOptions read_options;
  read_options.snapshot = snapshot.snapshot();
  read_options.fill_cache = false;
  const std::string upper = EncodeCodesKey(generation + 1, 0);
  rocksdb::Slice upper_slice(upper);
  if (generation != UINT32_MAX) read_options.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options, codes_));
  for (it->Seek(EncodeCodesKey(generation, 0)); it->Valid(); it->Next()) {
    uint32_t key_generation = 0;
    uint64_t iid = 0;
    if (!DecodeCodesKey(absl::string_view(it->key().data(), it->key().size()), &key_generation,
                        &iid)) {
      return absl::DataLossError(
          absl::StrCat("shard '", dir_, "': codes CF has a key of ", it->key().size(), " bytes"));
    }
    if (key_generation != generation) break;
    TESSERA_ASSIGN_OR_RETURN(
        std::string codes,
        Codec(DecodeCodesValue(absl::string_view(it->value().data(), it->value().size()),
                               generation, iid)));
    TESSERA_RETURN_IF_ERROR(fn(iid, std::move(codes)));
  }
  return Rocks(it->status(), "scanning centroid codes");
}

ShardStoreStats ShardStoreImpl::Stats() const {
  ShardStoreStats stats;
  stats.documents = live_documents_snapshot_.load(std::memory_order_relaxed);
  stats.disk_bytes = AllocatedBytes(dir_);
  ReaderMutexLock lock(&rerank_mu_);
  stats.rerank_segments = static_cast<int64_t>(segments_.size());
  for (const auto& [number, segment] : segments_)
    stats.rerank_segment_bytes += segment.file->size();
  stats.rerank_unflushed_bytes = unflushed_bytes_;
  return stats;
}

absl::Status ShardStoreImpl::Flush() {
  TESSERA_RETURN_IF_ERROR(FlushRerank());
  TESSERA_RETURN_IF_ERROR(ResumeIfStopped(0));
  rocksdb::FlushOptions flush_options;
  flush_options.wait = true;
  const rocksdb::Status s =
      db_->Flush(flush_options, {meta_, docs_, ids_, rerank_, candidates_, codes_});
  return s.ok() ? absl::OkStatus() : WriteFailed(s, "flushing");
}

absl::Status ShardStoreImpl::Checkpoint(const std::string& dir, uint64_t* sequence) {
  // No segment is committed or replaced meanwhile: the copied pointers name the linked segments.
  MutexLock flush(&flush_mu_);
  rocksdb::Checkpoint* raw = nullptr;
  rocksdb::Status s = rocksdb::Checkpoint::Create(db_.get(), &raw);
  std::unique_ptr<rocksdb::Checkpoint> checkpoint(raw);
  if (s.ok()) s = checkpoint->CreateCheckpoint(dir, /*log_size_for_flush=*/0, sequence);
  if (!s.ok()) {
    return absl::InternalError(
        absl::StrCat("checkpoint of ", dir_, " into ", dir, ": ", s.ToString()));
  }
  std::vector<uint32_t> numbers;
  {
    ReaderMutexLock lock(&rerank_mu_);
    for (const auto& [number, segment] : segments_) numbers.push_back(number);
  }
  for (uint32_t number : numbers) {
    const std::string target = absl::StrCat(dir, "/", RerankSegmentFileName(number));
    std::error_code error;
    std::filesystem::create_hard_link(SegmentPath(number), target, error);
    if (error) {
      error.clear();
      std::filesystem::copy_file(SegmentPath(number), target, error);
    }
    if (error) {
      return absl::InternalError(absl::StrCat("checkpoint of ", dir_, " into ", dir, ": copying ",
                                              SegmentPath(number), ": ", error.message()));
    }
  }
  if (!numbers.empty()) {
    const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd >= 0) {
      ::fsync(dir_fd);
      ::close(dir_fd);
    }
  }
  return absl::OkStatus();
}

absl::Status ShardStoreImpl::WriteToDb(rocksdb::WriteBatch* batch, absl::string_view context,
                                       bool* attempted, bool sync) {
  TESSERA_RETURN_IF_ERROR(ResumeIfStopped(batch->GetDataSize()));
  if (attempted != nullptr) *attempted = true;
  rocksdb::WriteOptions write_options;
  write_options.sync = options_.sync || sync;
  const rocksdb::Status s = db_->Write(write_options, batch);
  return s.ok() ? absl::OkStatus() : WriteFailed(s, context);
}

absl::Status ShardStoreImpl::WriteFailed(const rocksdb::Status& s, absl::string_view context) {
  if (s.IsNoSpace()) {
    stopped_by_full_disk_.store(true, std::memory_order_release);
    return Rocks(s, context);
  }
  absl::Status status = Rocks(s, context);
  if (!s.IsIOError()) return status;
  // A failed WAL or MANIFEST write or sync stops the database for good (the OS may have dropped
  // the unsynced pages): only reopening it, which replays what reached the disk, writes again.
  return absl::Status(
      status.code(),
      absl::StrCat(status.message(), " (the shard refuses writes until it is reopened)"));
}

absl::Status ShardStoreImpl::ResumeIfStopped(uint64_t bytes) {
  if (!stopped_by_full_disk_.load(std::memory_order_acquire)) return absl::OkStatus();
  MutexLock lock(&resume_mu_);
  if (!stopped_by_full_disk_.load(std::memory_order_acquire)) return absl::OkStatus();
  struct statvfs disk;
  if (::statvfs(dir_.c_str(), &disk) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(disk.f_bavail) * disk.f_frsize;
    if (free_bytes < bytes + kResumeHeadroomBytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("disk full: shard '", dir_, "': ", free_bytes,
                       " bytes free; writes resume once space is freed"));
    }
  }
  // Flushes the memtables (a failed WAL write leaves the WAL unusable) and clears the error.
  const rocksdb::Status s = db_->Resume();
  if (!s.ok()) return WriteFailed(s, "resuming writes after the disk was full");
  stopped_by_full_disk_.store(false, std::memory_order_release);
  Log(options_.log,
      {LogSeverity::kInfo, "disk space is available again, writes resumed", {{"directory", dir_}}});
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShardStore>> ShardStore::Open(const std::string& dir,
                                                             const ShardStoreOptions& options) {
  auto store = std::make_unique<ShardStoreImpl>(dir, options);
  TESSERA_RETURN_IF_ERROR(store->Open());
  return store;
}

}  // namespace tessera::internal
