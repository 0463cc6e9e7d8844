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
#include "index/common/prefetched_lookup.h"
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
// A committed segment: "s/rerank_segment/" or "s/codes_segment/" + its number as 4 bytes
// big-endian → its size.
const char* SegmentKeyPrefix(SegmentKind kind) {
  return kind == SegmentKind::kCodes ? "s/codes_segment/" : "s/rerank_segment/";
}
std::string SegmentMetaKey(SegmentKind kind, uint32_t number) {
  std::string key = SegmentKeyPrefix(kind);
  for (int shift = 24; shift >= 0; shift -= 8) key.push_back(static_cast<char>(number >> shift));
  return key;
}
constexpr SegmentKind kSegmentKinds[] = {SegmentKind::kRerank, SegmentKind::kCodes};
int KindIndex(SegmentKind kind) { return kind == SegmentKind::kCodes ? 1 : 0; }

// A document's key among the values that move into segments: (0, iid) for its rerank rows,
// (generation, iid) for its codes of a generation. Ordered by generation, then iid.
struct DocKey {
  uint32_t generation = 0;
  uint64_t iid = 0;
  friend bool operator==(const DocKey& a, const DocKey& b) {
    return a.generation == b.generation && a.iid == b.iid;
  }
  friend bool operator<(const DocKey& a, const DocKey& b) {
    return a.generation != b.generation ? a.generation < b.generation : a.iid < b.iid;
  }
  template <typename H>
  friend H AbslHashValue(H h, const DocKey& key) {
    return H::combine(std::move(h), key.generation, key.iid);
  }
};

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
  int64_t codes_bytes = 0;   // the codes' bytes
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
  absl::Status FlushSegments() override ABSL_LOCKS_EXCLUDED(flush_mu_) {
    MutexLock flush(&flush_mu_);
    return MaintainSegments(/*force=*/true);
  }
  absl::StatusOr<std::vector<std::optional<std::string>>> MultiGetCodes(
      uint32_t generation, absl::Span<const uint64_t> iids) const override;
  absl::StatusOr<std::vector<std::shared_ptr<const absl::string_view>>> ReadCodes(
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
  absl::Status DropCodeGenerationsExcept(uint32_t keep) override ABSL_LOCKS_EXCLUDED(flush_mu_);
  absl::Status DropAllCandidates() override;
  absl::StatusOr<std::vector<uint64_t>> DropAllRerankRows() override
      ABSL_LOCKS_EXCLUDED(commit_mu_);
  absl::Status ForEachCodes(uint32_t generation,
                            const std::function<absl::Status(uint64_t, absl::string_view)>& fn)
      const override ABSL_LOCKS_EXCLUDED(flush_mu_);
  uint64_t LatestSequence() const override { return db_->GetLatestSequenceNumber(); }
  ShardStoreStats Stats() const override;
  SegmentFigures SegmentStats() const override;
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
  // DropRanges' parts: the ranges that hold any key (one seek each), and their compaction.
  absl::Status OccupiedRanges(rocksdb::ColumnFamilyHandle* cf,
                              const std::vector<std::pair<std::string, std::string>>& ranges,
                              absl::string_view what,
                              std::vector<std::pair<std::string, std::string>>* occupied) const;
  absl::Status CompactRanges(rocksdb::ColumnFamilyHandle* cf,
                             const std::vector<std::pair<std::string, std::string>>& ranges,
                             absl::string_view what);
  // Adds the shard directory to a codec error.
  template <typename T>
  absl::StatusOr<T> Codec(absl::StatusOr<T> decoded) const {
    if (!decoded.ok()) return InShard(decoded.status(), dir_);
    return decoded;
  }
  void DeleteRows(rocksdb::WriteBatch* batch, uint64_t iid,
                  const std::vector<uint32_t>& code_generations);
  // Every write to the database: resumes a database a full disk stopped (ResumeIfStopped), then
  // writes `batch` (synced per options_.sync, or always when `sync`). Sets *attempted when it
  // reached RocksDB.
  absl::Status WriteToDb(rocksdb::WriteBatch* batch, absl::string_view context,
                         bool* attempted = nullptr, bool sync = false);

  // Segments (see shard_store.h), of rerank rows and of codes. Where a document's value lies in a
  // mapped segment (or, in an InPlaceRead, in a value decoded from RocksDB).
  struct RowsLocation {
    const char* data = nullptr;
    uint32_t segment = 0;
    uint32_t rows = 0;  // codes: bytes
    uint32_t cols = 0;  // codes: 1
    VectorDtype dtype = VectorDtype::kFloat16;
    bool opaque = false;  // codes
    int64_t bytes() const {
      return opaque ? int64_t{rows} : int64_t{rows} * cols * static_cast<int64_t>(DtypeSize(dtype));
    }
  };
  static RowsLocation LocationOf(const RerankSegmentEntry& e, uint32_t segment, const char* data) {
    RowsLocation location;
    location.data = data;
    location.segment = segment;
    location.rows = static_cast<uint32_t>(e.rows);
    location.cols = static_cast<uint32_t>(e.cols);
    location.dtype = e.dtype;
    location.opaque = e.opaque;
    return location;
  }
  struct SegmentState {
    std::shared_ptr<const RerankSegment> file;
    int64_t row_bytes = 0;   // of every document written to it
    int64_t live_bytes = 0;  // of those still pointing to it
  };
  // A value as RocksDB holds it before it moves (decoded and checked), or a copy of it from its
  // segment: its shape (the entry's iid, dtype, rows, cols, opaque) and bytes.
  struct InlineValue {
    RerankSegmentEntry entry;
    std::string bytes;
  };
  // A pointer to a value in a segment: the segment's number, and the entry's offset, shape, CRC.
  struct Pointer {
    uint32_t segment = 0;
    RerankSegmentEntry entry;
  };
  // What ReadInPlace hands out, shared by the views of one call: where each key's value lies, and
  // what that points into (segments, values decoded from RocksDB), with the views ReadRerank and
  // ReadCodes make of them.
  struct InPlaceRead {
    std::vector<std::optional<RowsLocation>> found;
    std::vector<std::shared_ptr<const RerankSegment>> segments;
    std::deque<std::string> decoded;
    std::vector<StoredMatrixView> matrices;
    std::vector<absl::string_view> codes;
  };
  // The found values that lie in segments (mapped), for their read-ahead.
  static std::vector<absl::string_view> InSegments(const InPlaceRead& read) {
    std::vector<absl::string_view> ranges;
    ranges.reserve(read.found.size());
    for (const std::optional<RowsLocation>& location : read.found) {
      if (location.has_value() && location->segment != 0) {
        ranges.emplace_back(location->data, location->bytes());
      }
    }
    return ranges;
  }
  rocksdb::ColumnFamilyHandle* Cf(SegmentKind kind) const {
    return kind == SegmentKind::kCodes ? codes_ : rerank_;
  }
  static std::string EncodeKey(SegmentKind kind, const DocKey& key) {
    return kind == SegmentKind::kCodes ? EncodeCodesKey(key.generation, key.iid)
                                       : EncodeIidKey(key.iid);
  }
  static bool DecodeKey(SegmentKind kind, absl::string_view encoded, DocKey* key) {
    if (kind == SegmentKind::kCodes) return DecodeCodesKey(encoded, &key->generation, &key->iid);
    key->generation = 0;
    return DecodeIidKey(encoded, &key->iid);
  }
  // "rerank iid 12", "codes of generation 3 iid 12": for messages.
  static std::string What(SegmentKind kind, const DocKey& key) {
    return kind == SegmentKind::kCodes
               ? absl::StrCat("codes of generation ", key.generation, " iid ", key.iid)
               : absl::StrCat("rerank iid ", key.iid);
  }
  std::string SegmentPath(SegmentKind kind, uint32_t number) const {
    return absl::StrCat(dir_, "/", SegmentFileName(kind, number));
  }
  // At Open: deletes uncommitted segment files, maps and verifies the committed ones, and loads
  // the locations (pointers) and the values still in RocksDB from the rerank and codes CFs.
  absl::Status OpenSegments();
  static bool IsPointer(SegmentKind kind, absl::string_view value);
  static std::string EncodePointer(SegmentKind kind, uint32_t segment, const RerankSegmentEntry& e);
  // DATA_LOSS naming the key for a malformed pointer.
  absl::StatusOr<Pointer> DecodePointer(SegmentKind kind, absl::string_view value,
                                        const DocKey& key) const;
  // A value that is not a pointer, decoded and checked (DATA_LOSS naming the key).
  absl::StatusOr<InlineValue> DecodeInline(SegmentKind kind, absl::string_view value,
                                           const DocKey& key) const;
  // A value decoded, or copied from its segment and checked against the pointer's CRC.
  // kSegmentGone when the pointer names a segment no longer there.
  absl::StatusOr<InlineValue> CopyValue(SegmentKind kind, absl::string_view value,
                                        const DocKey& key) const;
  // One RocksDB MultiGet of keys[i] for each i of `which`, in `kind`'s column family: (*values)[j]
  // and (*statuses)[j] for keys[which[j]].
  void MultiGetKeys(SegmentKind kind, absl::Span<const DocKey> keys,
                    const std::vector<size_t>& which, std::vector<rocksdb::PinnableSlice>* values,
                    std::vector<rocksdb::Status>* statuses) const;
  // One MultiGet of the keys' values, copied (CopyValue, retried past replaced segments);
  // std::nullopt for an absent key. Fails as a whole on any other error.
  absl::StatusOr<std::vector<std::optional<InlineValue>>> MultiGetCopies(
      SegmentKind kind, absl::Span<const DocKey> keys) const;
  // The search's read (ReadRerank, ReadCodes): where each key's value lies, in place.
  absl::Status ReadInPlace(SegmentKind kind, absl::Span<const DocKey> keys,
                           InPlaceRead* read) const;
  // Flushes each kind's values when forced or past options_.rerank_flush_bytes, then rewrites
  // segments.
  absl::Status MaintainSegments(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(flush_mu_);
  absl::Status FlushToSegments(SegmentKind kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(flush_mu_);
  absl::Status RewriteSegments() ABSL_EXCLUSIVE_LOCKS_REQUIRED(flush_mu_);
  // Writes a segment of `kind` (codes: of `generation`) of `entries` (rows[i]: entry i's bytes),
  // then commits, in one synced batch, pointers to it for the entries not removed meanwhile, its
  // meta key, and the removal of the segments in `replaced` (of the same kind), whose files it
  // then unlinks.
  absl::Status WriteSegmentAndCommit(SegmentKind kind, uint32_t generation,
                                     std::vector<RerankSegmentEntry> entries,
                                     const std::vector<absl::string_view>& rows,
                                     const std::vector<uint32_t>& replaced)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(flush_mu_);
  // Starts (or stops) recording the keys that commits remove, for a flush or rewrite in progress.
  void TrackRemovals(bool on) ABSL_LOCKS_EXCLUDED(commit_mu_);
  // The bookkeeping after a committed batch that wrote values of `kind` (key, bytes) and removed
  // others (added ones first: a group may write and remove one document); true when maintenance
  // is due.
  bool ApplySegmentChanges(SegmentKind kind, const std::vector<std::pair<DocKey, int64_t>>& added,
                           const std::vector<DocKey>& removed)
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

  // One flush or rewrite of segments at a time; Checkpoint holds it too, so that the segments and
  // the pointers it copies agree, and so do DropCodeGenerationsExcept and ForEachCodes.
  mutable Mutex flush_mu_ ABSL_ACQUIRED_BEFORE(commit_mu_);
  uint32_t next_segment_ ABSL_GUARDED_BY(flush_mu_) = 1;
  // Held across every write that changes rerank or codes pointers or removes documents (the
  // leader's batch, a segment commit) and the bookkeeping after it, so that a flush or rewrite
  // never commits a pointer for a document removed meanwhile.
  Mutex commit_mu_ ABSL_ACQUIRED_BEFORE(rerank_mu_);
  bool tracking_removals_ ABSL_GUARDED_BY(commit_mu_) = false;
  // Per kind (KindIndex).
  absl::flat_hash_set<DocKey> removed_while_tracking_[2] ABSL_GUARDED_BY(commit_mu_);
  // What readers look up: the segments of both kinds (segment numbers are one sequence), and per
  // kind (KindIndex) the location of every key whose value is in one, and the values still in
  // RocksDB (key → bytes).
  mutable Mutex rerank_mu_;
  std::map<uint32_t, SegmentState> segments_ ABSL_GUARDED_BY(rerank_mu_);
  absl::flat_hash_map<DocKey, RowsLocation> locations_[2] ABSL_GUARDED_BY(rerank_mu_);
  absl::flat_hash_map<DocKey, int64_t> unflushed_[2] ABSL_GUARDED_BY(rerank_mu_);
  int64_t unflushed_bytes_[2] ABSL_GUARDED_BY(rerank_mu_) = {0, 0};
  // ReadRerank's and ReadCodes' read-ahead of the candidates' pages in the segments, each skipped
  // while its pages stay cached.
  mutable MappedReadAhead rerank_read_ahead_;
  mutable MappedReadAhead codes_read_ahead_;
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
  TESSERA_RETURN_IF_ERROR(OpenSegments());
  if (options_.rerank_segments && options_.rerank_flush_bytes > 0) {
    maintainer_ = std::thread([this] { MaintainLoop(); });
    bool due = false;
    {
      ReaderMutexLock lock(&rerank_mu_);
      due = unflushed_bytes_[0] >= options_.rerank_flush_bytes ||
            unflushed_bytes_[1] >= options_.rerank_flush_bytes;
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
    prepared.codes_bytes = static_cast<int64_t>(write.codes.size());
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
  std::vector<std::pair<DocKey, int64_t>> added_rows;
  std::vector<DocKey> removed_rows;
  // And for the codes segments: codes written ((generation, iid), bytes) and removed.
  std::vector<std::pair<DocKey, int64_t>> added_codes;
  std::vector<DocKey> removed_codes;
  const auto remove = [&](uint64_t iid) {
    DeleteRows(&batch, iid, group_code_generations_);
    removed_rows.push_back(DocKey{0, iid});
    for (uint32_t generation : group_code_generations_) {
      removed_codes.push_back(DocKey{generation, iid});
    }
  };

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
        remove(state.iid);
      } else {
        ++live;
      }
      u.record.iid = iid;
      u.record.version = version;
      const std::string key = EncodeIidKey(iid);
      batch.Put(docs_, key, EncodeDocumentRecord(u.record));
      batch.Put(rerank_, key, u.rerank_value);
      if (u.rerank_bytes > 0) added_rows.emplace_back(DocKey{0, iid}, u.rerank_bytes);
      if (!u.candidates_value.empty()) batch.Put(candidates_, key, u.candidates_value);
      if (!u.codes_value.empty()) {
        batch.Put(codes_, EncodeCodesKey(u.code_generation, iid), u.codes_value);
        added_codes.emplace_back(DocKey{u.code_generation, iid}, u.codes_bytes);
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
        remove(state.iid);
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
    if (error.ok()) {
      maintain = ApplySegmentChanges(SegmentKind::kRerank, added_rows, removed_rows);
      maintain = ApplySegmentChanges(SegmentKind::kCodes, added_codes, removed_codes) || maintain;
    }
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
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::optional<StoredMatrix>> matrices,
                           MultiGetRerank(absl::MakeConstSpan(&iid, 1)));
  if (!matrices[0].has_value()) {
    return absl::NotFoundError(absl::StrCat("shard '", dir_, "': no rerank vectors for iid ", iid));
  }
  return *std::move(matrices[0]);
}

absl::StatusOr<std::vector<std::optional<StoredMatrix>>> ShardStoreImpl::MultiGetRerank(
    absl::Span<const uint64_t> iids) const {
  std::vector<DocKey> keys;
  keys.reserve(iids.size());
  for (uint64_t iid : iids) keys.push_back(DocKey{0, iid});
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::optional<InlineValue>> values,
                           MultiGetCopies(SegmentKind::kRerank, keys));
  std::vector<std::optional<StoredMatrix>> out(iids.size());
  for (size_t i = 0; i < iids.size(); ++i) {
    if (!values[i].has_value()) continue;
    InlineValue& value = *values[i];
    out[i] =
        StoredMatrix{value.entry.dtype, value.entry.rows, value.entry.cols, std::move(value.bytes)};
  }
  return out;
}

absl::StatusOr<std::vector<std::optional<std::string>>> ShardStoreImpl::MultiGetCodes(
    uint32_t generation, absl::Span<const uint64_t> iids) const {
  std::vector<DocKey> keys;
  keys.reserve(iids.size());
  for (uint64_t iid : iids) keys.push_back(DocKey{generation, iid});
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::optional<InlineValue>> values,
                           MultiGetCopies(SegmentKind::kCodes, keys));
  std::vector<std::optional<std::string>> out(iids.size());
  for (size_t i = 0; i < iids.size(); ++i) {
    if (values[i].has_value()) out[i] = std::move(values[i]->bytes);
  }
  return out;
}

void ShardStoreImpl::MultiGetKeys(SegmentKind kind, absl::Span<const DocKey> keys,
                                  const std::vector<size_t>& which,
                                  std::vector<rocksdb::PinnableSlice>* values,
                                  std::vector<rocksdb::Status>* statuses) const {
  std::vector<std::string> encoded;
  encoded.reserve(which.size());
  for (size_t i : which) encoded.push_back(EncodeKey(kind, keys[i]));
  std::vector<rocksdb::Slice> slices(encoded.begin(), encoded.end());
  *values = std::vector<rocksdb::PinnableSlice>(which.size());
  *statuses = std::vector<rocksdb::Status>(which.size());
  db_->MultiGet(rocksdb::ReadOptions(), Cf(kind), which.size(), slices.data(), values->data(),
                statuses->data());
}

absl::StatusOr<std::vector<std::optional<ShardStoreImpl::InlineValue>>>
ShardStoreImpl::MultiGetCopies(SegmentKind kind, absl::Span<const DocKey> keys) const {
  const size_t n = keys.size();
  std::vector<std::optional<InlineValue>> out(n);
  std::vector<size_t> pending(n);
  for (size_t i = 0; i < n; ++i) pending[i] = i;
  // A rewrite may replace a segment between the read of a pointer and the copy: such keys are
  // read again, and then hold the new pointer.
  for (int attempt = 0; !pending.empty(); ++attempt) {
    std::vector<rocksdb::PinnableSlice> values;
    std::vector<rocksdb::Status> statuses;
    MultiGetKeys(kind, keys, pending, &values, &statuses);
    std::vector<size_t> again;
    for (size_t j = 0; j < pending.size(); ++j) {
      const size_t i = pending[j];
      if (statuses[j].IsNotFound()) continue;
      TESSERA_RETURN_IF_ERROR(Rocks(statuses[j], absl::StrCat("reading ", What(kind, keys[i]))));
      absl::StatusOr<InlineValue> value =
          CopyValue(kind, absl::string_view(values[j].data(), values[j].size()), keys[i]);
      if (value.status().code() == kSegmentGone && attempt < kSegmentRetries) {
        again.push_back(i);
        continue;
      }
      if (!value.ok()) return value.status();
      out[i] = *std::move(value);
    }
    pending = std::move(again);
  }
  return out;
}

absl::StatusOr<ShardStoreImpl::InlineValue> ShardStoreImpl::DecodeInline(SegmentKind kind,
                                                                         absl::string_view value,
                                                                         const DocKey& key) const {
  InlineValue out;
  out.entry.iid = key.iid;
  if (kind == SegmentKind::kRerank) {
    TESSERA_ASSIGN_OR_RETURN(StoredMatrix matrix,
                             Codec(DecodeStoredMatrix(value, kRerankCf, key.iid)));
    out.entry.dtype = matrix.dtype;
    out.entry.rows = matrix.rows;
    out.entry.cols = matrix.cols;
    out.bytes = std::move(matrix.bytes);
    return out;
  }
  TESSERA_ASSIGN_OR_RETURN(out.bytes, Codec(DecodeCodesValue(value, key.generation, key.iid)));
  out.entry.opaque = true;
  out.entry.rows = static_cast<int64_t>(out.bytes.size());
  out.entry.cols = 1;
  return out;
}

bool ShardStoreImpl::IsPointer(SegmentKind kind, absl::string_view value) {
  return kind == SegmentKind::kRerank ? IsRerankPointer(value) : IsCodesPointer(value);
}

absl::StatusOr<ShardStoreImpl::Pointer> ShardStoreImpl::DecodePointer(SegmentKind kind,
                                                                      absl::string_view value,
                                                                      const DocKey& key) const {
  Pointer out;
  out.entry.iid = key.iid;
  if (kind == SegmentKind::kRerank) {
    TESSERA_ASSIGN_OR_RETURN(const RerankPointer pointer,
                             Codec(DecodeRerankPointer(value, key.iid)));
    out.segment = pointer.segment;
    out.entry.offset = pointer.offset;
    out.entry.dtype = pointer.dtype;
    out.entry.rows = pointer.rows;
    out.entry.cols = pointer.cols;
    out.entry.crc = pointer.crc;
    return out;
  }
  TESSERA_ASSIGN_OR_RETURN(const CodesPointer pointer,
                           Codec(DecodeCodesPointer(value, key.generation, key.iid)));
  out.segment = pointer.segment;
  out.entry.offset = pointer.offset;
  out.entry.opaque = true;
  out.entry.rows = pointer.bytes;
  out.entry.cols = 1;
  out.entry.crc = pointer.crc;
  return out;
}

std::string ShardStoreImpl::EncodePointer(SegmentKind kind, uint32_t segment,
                                          const RerankSegmentEntry& e) {
  if (kind == SegmentKind::kRerank) {
    return EncodeRerankPointer(RerankPointer{segment, e.offset, e.dtype, e.rows, e.cols, e.crc});
  }
  return EncodeCodesPointer(CodesPointer{segment, e.offset, e.rows, e.crc});
}

absl::StatusOr<ShardStoreImpl::InlineValue> ShardStoreImpl::CopyValue(SegmentKind kind,
                                                                      absl::string_view value,
                                                                      const DocKey& key) const {
  if (!IsPointer(kind, value)) return DecodeInline(kind, value, key);
  TESSERA_ASSIGN_OR_RETURN(const Pointer pointer, DecodePointer(kind, value, key));
  std::shared_ptr<const RerankSegment> segment;
  {
    ReaderMutexLock lock(&rerank_mu_);
    const auto it = segments_.find(pointer.segment);
    if (it != segments_.end()) segment = it->second.file;
  }
  if (segment == nullptr) {
    return absl::Status(kSegmentGone, absl::StrCat(What(kind, key), ": segment ", pointer.segment,
                                                   " was replaced meanwhile"));
  }
  InlineValue out;
  out.entry = pointer.entry;
  const absl::string_view bytes =
      segment->Rows(pointer.entry.offset, static_cast<uint64_t>(pointer.entry.bytes()));
  if (bytes.empty()) {
    return absl::DataLossError(absl::StrCat(SegmentKindName(kind), " segment '", segment->path(),
                                            "': ", What(kind, key), " at offset ",
                                            pointer.entry.offset, " lies outside the file"));
  }
  out.bytes.assign(bytes.data(), bytes.size());
  if (Crc32(out.bytes) != pointer.entry.crc) {
    return absl::DataLossError(absl::StrCat(SegmentKindName(kind), " segment '", segment->path(),
                                            "': ", What(kind, key), " at offset ",
                                            pointer.entry.offset, " fails its checksum"));
  }
  return out;
}

absl::Status ShardStoreImpl::ReadInPlace(SegmentKind kind, absl::Span<const DocKey> keys,
                                         InPlaceRead* read) const {
  const size_t n = keys.size();
  const int k = KindIndex(kind);
  read->found.assign(n, std::nullopt);
  std::vector<size_t> missing;
  {
    ReaderMutexLock lock(&rerank_mu_);
    uint32_t last = 0;  // segment numbers start at 1
    for (size_t i = 0; i < n; ++i) {
      PrefetchAhead(locations_[k], keys, i);
      const auto it = locations_[k].find(keys[i]);
      if (it == locations_[k].end()) {
        missing.push_back(i);
        continue;
      }
      const RowsLocation& location = it->second;
      if (location.segment != last) {
        read->segments.push_back(segments_.at(location.segment).file);
        last = location.segment;
      }
      read->found[i] = location;
    }
  }
  // Values still in RocksDB (or flushed since the lookup above).
  for (int attempt = 0; !missing.empty(); ++attempt) {
    std::vector<rocksdb::PinnableSlice> values;
    std::vector<rocksdb::Status> statuses;
    MultiGetKeys(kind, keys, missing, &values, &statuses);
    std::vector<size_t> again;
    for (size_t j = 0; j < missing.size(); ++j) {
      const size_t i = missing[j];
      if (statuses[j].IsNotFound()) continue;
      TESSERA_RETURN_IF_ERROR(Rocks(statuses[j], absl::StrCat("reading ", What(kind, keys[i]))));
      const absl::string_view value(values[j].data(), values[j].size());
      if (!IsPointer(kind, value)) {
        TESSERA_ASSIGN_OR_RETURN(InlineValue decoded, DecodeInline(kind, value, keys[i]));
        read->decoded.push_back(std::move(decoded.bytes));
        read->found[i] = LocationOf(decoded.entry, 0, read->decoded.back().data());
        continue;
      }
      TESSERA_ASSIGN_OR_RETURN(const Pointer pointer, DecodePointer(kind, value, keys[i]));
      ReaderMutexLock lock(&rerank_mu_);
      const auto it = segments_.find(pointer.segment);
      if (it == segments_.end()) {
        if (attempt >= kSegmentRetries) {
          return absl::InternalError(absl::StrCat("shard '", dir_, "': ", What(kind, keys[i]),
                                                  " points to segment ", pointer.segment,
                                                  ", which keeps being replaced"));
        }
        again.push_back(i);
        continue;
      }
      const absl::string_view bytes =
          it->second.file->Rows(pointer.entry.offset, static_cast<uint64_t>(pointer.entry.bytes()));
      if (bytes.empty()) {
        return absl::DataLossError(absl::StrCat(SegmentKindName(kind), " segment '",
                                                it->second.file->path(), "': ", What(kind, keys[i]),
                                                " at offset ", pointer.entry.offset,
                                                " lies outside the file"));
      }
      read->segments.push_back(it->second.file);
      read->found[i] = LocationOf(pointer.entry, pointer.segment, bytes.data());
    }
    missing = std::move(again);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::shared_ptr<const StoredMatrixView>>> ShardStoreImpl::ReadRerank(
    absl::Span<const uint64_t> iids) const {
  const size_t n = iids.size();
  std::vector<DocKey> keys;
  keys.reserve(n);
  for (uint64_t iid : iids) keys.push_back(DocKey{0, iid});
  auto read = std::make_shared<InPlaceRead>();
  TESSERA_RETURN_IF_ERROR(ReadInPlace(SegmentKind::kRerank, keys, read.get()));
  // The caller scores every document's rows next: a shard whose rows are not all in the page cache
  // (1M documents of 16 KiB) would otherwise fault each in while it scores.
  rerank_read_ahead_.Read(InSegments(*read));
  read->matrices.resize(n);
  std::vector<std::shared_ptr<const StoredMatrixView>> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (!read->found[i].has_value()) continue;
    const RowsLocation& location = *read->found[i];
    read->matrices[i] = StoredMatrixView{location.dtype, location.rows, location.cols,
                                         absl::string_view(location.data, location.bytes())};
    // Aliasing: each view shares the read's ownership (no allocation per document).
    out[i] = std::shared_ptr<const StoredMatrixView>(read, &read->matrices[i]);
  }
  return out;
}

absl::StatusOr<std::vector<std::shared_ptr<const absl::string_view>>> ShardStoreImpl::ReadCodes(
    uint32_t generation, absl::Span<const uint64_t> iids) const {
  const size_t n = iids.size();
  std::vector<DocKey> keys;
  keys.reserve(n);
  for (uint64_t iid : iids) keys.push_back(DocKey{generation, iid});
  auto read = std::make_shared<InPlaceRead>();
  TESSERA_RETURN_IF_ERROR(ReadInPlace(SegmentKind::kCodes, keys, read.get()));
  // The caller reads every document's codes next: their pages are read ahead together. A shard
  // whose codes do not fit in the page cache (3M documents: 13 GB of codes beside 13 GB of index
  // on 24 GB) would otherwise fault them in one at a time; one whose codes stay cached skips it.
  codes_read_ahead_.Read(InSegments(*read));
  read->codes.resize(n);
  std::vector<std::shared_ptr<const absl::string_view>> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (!read->found[i].has_value()) continue;
    read->codes[i] = absl::string_view(read->found[i]->data, read->found[i]->bytes());
    out[i] = std::shared_ptr<const absl::string_view>(read, &read->codes[i]);
  }
  return out;
}

absl::Status ShardStoreImpl::OpenSegments() {
  namespace fs = std::filesystem;
  // The committed segments (number → kind, size), from meta.
  std::map<uint32_t, std::pair<SegmentKind, int64_t>> committed;
  for (const SegmentKind kind : kSegmentKinds) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), meta_));
    const absl::string_view prefix = SegmentKeyPrefix(kind);
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
      committed[number] = {kind, static_cast<int64_t>(size)};
    }
    TESSERA_RETURN_IF_ERROR(
        Rocks(it->status(), absl::StrCat("listing ", SegmentKindName(kind), " segments")));
  }
  // Files of segments that were never committed (a crash before the commit, or after a rewrite's
  // or a dropped generation's commit before the old file's unlink) and temporaries are deleted.
  uint32_t max_number = 0;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_, error)) {
    const std::string name = entry.path().filename().string();
    for (const SegmentKind kind : kSegmentKinds) {
      uint32_t number = 0;
      const bool temporary = absl::StartsWith(name, absl::StrCat(SegmentKindName(kind), "-")) &&
                             absl::EndsWith(name, ".seg.tmp");
      const bool segment = ParseSegmentFileName(name, kind, &number);
      if (segment) max_number = std::max(max_number, number);
      const auto it = committed.find(number);
      if (temporary || (segment && (it == committed.end() || it->second.first != kind))) {
        Log(options_.log,
            {LogSeverity::kInfo,
             absl::StrCat("deleting an uncommitted ", SegmentKindName(kind), " segment file"),
             {{"file", entry.path().string()}}});
        fs::remove(entry.path(), error);
      }
    }
  }
  MutexLock lock(&rerank_mu_);
  for (const auto& [number, committed_segment] : committed) {
    const auto [kind, size] = committed_segment;
    max_number = std::max(max_number, number);
    const std::string path = SegmentPath(kind, number);
    absl::StatusOr<std::shared_ptr<const RerankSegment>> segment =
        RerankSegment::Open(path, kind, number, size);
    if (absl::IsNotFound(segment.status())) {
      return absl::DataLossError(
          absl::StrCat("shard '", dir_, "': ", SegmentKindName(kind), " segment '", path,
                       "' is committed but missing; its ",
                       kind == SegmentKind::kCodes ? "codes" : "rows", " exist nowhere else"));
    }
    if (!segment.ok()) return InShard(segment.status(), dir_);
    SegmentState state;
    state.file = *std::move(segment);
    for (const RerankSegmentEntry& e : state.file->entries()) state.row_bytes += e.bytes();
    segments_[number] = std::move(state);
  }
  // Locations of the values in segments, and the values still in RocksDB.
  for (const SegmentKind kind : kSegmentKinds) {
    const int k = KindIndex(kind);
    rocksdb::ReadOptions scan;
    scan.fill_cache = false;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(scan, Cf(kind)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      DocKey key;
      if (!DecodeKey(kind, absl::string_view(it->key().data(), it->key().size()), &key)) {
        return absl::DataLossError(absl::StrCat("shard '", dir_, "': ", SegmentKindName(kind),
                                                " CF has a key of ", it->key().size(), " bytes"));
      }
      const absl::string_view value(it->value().data(), it->value().size());
      // A value that fails its checksum does not fail the open: reading it does (DATA_LOSS), as
      // before segments existed, and the flush leaves it where it is.
      if (!IsPointer(kind, value)) {
        const absl::StatusOr<InlineValue> decoded = DecodeInline(kind, value, key);
        if (decoded.ok() && !decoded->bytes.empty()) {
          unflushed_[k][key] = static_cast<int64_t>(decoded->bytes.size());
          unflushed_bytes_[k] += static_cast<int64_t>(decoded->bytes.size());
        }
        continue;
      }
      const absl::StatusOr<Pointer> decoded = DecodePointer(kind, value, key);
      if (!decoded.ok()) continue;
      const Pointer& pointer = *decoded;
      const auto segment = segments_.find(pointer.segment);
      if (segment == segments_.end() || segment->second.file->kind() != kind ||
          segment->second.file->generation() != key.generation) {
        return absl::DataLossError(absl::StrCat(
            "shard '", dir_, "': ", What(kind, key), " points to segment '",
            SegmentPath(kind, pointer.segment), "', which is not a committed ",
            SegmentKindName(kind), " segment",
            kind == SegmentKind::kCodes ? absl::StrCat(" of generation ", key.generation)
                                        : std::string()));
      }
      const absl::string_view bytes = segment->second.file->Rows(
          pointer.entry.offset, static_cast<uint64_t>(pointer.entry.bytes()));
      if (bytes.empty()) {
        return absl::DataLossError(absl::StrCat(
            SegmentKindName(kind), " segment '", segment->second.file->path(),
            "': ", What(kind, key), " at offset ", pointer.entry.offset, " lies outside the file"));
      }
      const RowsLocation location = LocationOf(pointer.entry, pointer.segment, bytes.data());
      segment->second.live_bytes += location.bytes();
      locations_[k][key] = location;
    }
    TESSERA_RETURN_IF_ERROR(Rocks(it->status(), absl::StrCat("scanning ", SegmentKindName(kind))));
  }
  next_segment_ = max_number + 1;
  return absl::OkStatus();
}

void ShardStoreImpl::TrackRemovals(bool on) {
  MutexLock commit(&commit_mu_);
  tracking_removals_ = on;
  for (auto& removed : removed_while_tracking_) removed.clear();
}

bool ShardStoreImpl::ApplySegmentChanges(SegmentKind kind,
                                         const std::vector<std::pair<DocKey, int64_t>>& added,
                                         const std::vector<DocKey>& removed) {
  const int k = KindIndex(kind);
  if (tracking_removals_) removed_while_tracking_[k].insert(removed.begin(), removed.end());
  MutexLock lock(&rerank_mu_);
  // Added first: a group that writes and removes one document (an id upserted twice in one call,
  // or upserted and deleted by two requests committed together) leaves it neither unflushed nor
  // located.
  for (const auto& [key, bytes] : added) {
    const auto [it, inserted] = unflushed_[k].try_emplace(key, bytes);
    if (!inserted) {
      unflushed_bytes_[k] -= it->second;
      it->second = bytes;
    }
    unflushed_bytes_[k] += bytes;
  }
  bool due = false;
  for (const DocKey& key : removed) {
    if (const auto it = unflushed_[k].find(key); it != unflushed_[k].end()) {
      unflushed_bytes_[k] -= it->second;
      unflushed_[k].erase(it);
      continue;
    }
    const auto it = locations_[k].find(key);
    if (it == locations_[k].end()) continue;
    SegmentState& segment = segments_.at(it->second.segment);
    segment.live_bytes -= it->second.bytes();
    due = due || (options_.rerank_flush_bytes > 0 && SegmentWantsRewrite(segment));
    locations_[k].erase(it);
  }
  due = due || (options_.rerank_flush_bytes > 0 &&
                unflushed_bytes_[k] >= options_.rerank_flush_bytes && !added.empty());
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
      status = MaintainSegments(/*force=*/false);
    }
    if (!status.ok() && !stopping_.load(std::memory_order_acquire)) {
      Log(options_.log, {LogSeverity::kError,
                         "moving rerank rows or codes into segments failed; retrying on later "
                         "writes",
                         {{"directory", dir_},
                          {"code", absl::StatusCodeToString(status.code())},
                          {"error", std::string(status.message())}}});
      // Not at once: the next write that finds maintenance due wakes the thread again.
      MutexLock lock(&maintain_mu_);
      maintain_cv_.WaitWithTimeout(&maintain_mu_, absl::Seconds(1));
    }
  }
}

absl::Status ShardStoreImpl::MaintainSegments(bool force) {
  if (!options_.rerank_segments) return absl::OkStatus();
  for (const SegmentKind kind : kSegmentKinds) {
    const int k = KindIndex(kind);
    bool flush = false;
    {
      ReaderMutexLock lock(&rerank_mu_);
      flush =
          !unflushed_[k].empty() && (force || (options_.rerank_flush_bytes > 0 &&
                                               unflushed_bytes_[k] >= options_.rerank_flush_bytes));
    }
    if (flush) TESSERA_RETURN_IF_ERROR(FlushToSegments(kind));
  }
  return RewriteSegments();
}

absl::Status ShardStoreImpl::FlushToSegments(SegmentKind kind) {
  const int k = KindIndex(kind);
  // Removals committed from here on are recorded, and the snapshot holds every commit before.
  const rocksdb::Snapshot* snapshot = nullptr;
  std::vector<DocKey> keys;
  {
    MutexLock commit(&commit_mu_);
    tracking_removals_ = true;
    for (auto& removed : removed_while_tracking_) removed.clear();
    snapshot = db_->GetSnapshot();
    ReaderMutexLock lock(&rerank_mu_);
    keys.reserve(unflushed_[k].size());
    for (const auto& [key, bytes] : unflushed_[k]) keys.push_back(key);
  }
  // By generation, then iid: a codes segment holds one generation.
  std::sort(keys.begin(), keys.end());
  rocksdb::ReadOptions read_options;
  read_options.snapshot = snapshot;
  read_options.fill_cache = false;
  absl::Status status;
  std::vector<RerankSegmentEntry> entries;
  std::deque<std::string> held;
  std::vector<absl::string_view> rows;
  int64_t bytes = 0;
  uint32_t generation = keys.empty() ? 0 : keys.front().generation;
  auto commit = [&]() -> absl::Status {
    if (entries.empty()) return absl::OkStatus();
    absl::Status s = WriteSegmentAndCommit(kind, generation, std::move(entries), rows, {});
    entries.clear();
    rows.clear();
    held.clear();
    bytes = 0;
    return s;
  };
  constexpr size_t kBatch = 256;
  for (size_t start = 0; start < keys.size() && status.ok(); start += kBatch) {
    if (stopping_.load(std::memory_order_acquire)) {
      status = absl::CancelledError("the store is closing");
      break;
    }
    const size_t count = std::min(kBatch, keys.size() - start);
    std::vector<std::string> encoded;
    for (size_t i = 0; i < count; ++i) encoded.push_back(EncodeKey(kind, keys[start + i]));
    std::vector<rocksdb::Slice> slices(encoded.begin(), encoded.end());
    std::vector<rocksdb::PinnableSlice> values(count);
    std::vector<rocksdb::Status> statuses(count);
    db_->MultiGet(read_options, Cf(kind), count, slices.data(), values.data(), statuses.data());
    for (size_t i = 0; i < count && status.ok(); ++i) {
      const DocKey& key = keys[start + i];
      if (statuses[i].IsNotFound()) continue;  // removed since
      status = Rocks(statuses[i], absl::StrCat("reading ", What(kind, key)));
      if (!status.ok()) break;
      const absl::string_view value(values[i].data(), values[i].size());
      if (IsPointer(kind, value)) continue;
      absl::StatusOr<InlineValue> decoded = DecodeInline(kind, value, key);
      // A corrupt value stays in RocksDB, where reading it is DATA_LOSS naming it.
      if (!decoded.ok() || decoded->bytes.empty()) continue;
      if (!entries.empty() &&
          (key.generation != generation ||
           bytes + static_cast<int64_t>(decoded->bytes.size()) > options_.rerank_segment_bytes)) {
        status = commit();
        if (!status.ok()) break;
      }
      generation = key.generation;
      bytes += static_cast<int64_t>(decoded->bytes.size());
      held.push_back(std::move(decoded->bytes));
      rows.push_back(held.back());
      entries.push_back(decoded->entry);
    }
  }
  if (status.ok()) status = commit();
  db_->ReleaseSnapshot(snapshot);
  TrackRemovals(false);
  TESSERA_RETURN_IF_ERROR(status);
  if (keys.empty()) return absl::OkStatus();
  // The values the pointers replaced are garbage now; compacting their range drops them from the
  // SST files (a flush of the memtable drops those that never left it), so that the rows are
  // stored once, in the segments.
  const std::string begin = EncodeKey(kind, keys.front());
  const std::string end = EncodeKey(kind, DocKey{keys.back().generation, keys.back().iid + 1});
  const rocksdb::Slice begin_key(begin), end_key(end);
  rocksdb::CompactRangeOptions compact;
  compact.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
  return Rocks(db_->CompactRange(compact, Cf(kind), &begin_key, &end_key),
               absl::StrCat("compacting ", SegmentKindName(kind), " values moved to segments"));
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
      // Every due segment is still there: the list was made under flush_mu_, which every change
      // of segments_ other than a commit's (which adds and never removes) holds too.
      old = segments_.at(number).file;
      const int k = KindIndex(old->kind());
      for (const RerankSegmentEntry& entry : old->entries()) {
        const auto it = locations_[k].find(DocKey{old->generation(), entry.iid});
        if (it == locations_[k].end() || it->second.segment != number) continue;
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
        return absl::DataLossError(absl::StrCat(
            SegmentKindName(old->kind()), " segment '", old->path(), "': ",
            What(old->kind(), DocKey{old->generation(), entries[i].iid}), " fails its checksum"));
      }
    }
    const absl::Status status =
        WriteSegmentAndCommit(old->kind(), old->generation(), std::move(entries), rows, {number});
    TrackRemovals(false);
    TESSERA_RETURN_IF_ERROR(status);
  }
  return absl::OkStatus();
}

absl::Status ShardStoreImpl::WriteSegmentAndCommit(SegmentKind kind, uint32_t generation,
                                                   std::vector<RerankSegmentEntry> entries,
                                                   const std::vector<absl::string_view>& rows,
                                                   const std::vector<uint32_t>& replaced) {
  const int k = KindIndex(kind);
  std::error_code ignored;
  uint32_t number = 0;
  std::string path;
  std::shared_ptr<const RerankSegment> segment;
  int64_t size = 0;
  if (!entries.empty()) {
    number = next_segment_++;
    path = SegmentPath(kind, number);
    TESSERA_ASSIGN_OR_RETURN(
        size, WriteRerankSegment(path, kind, generation, number, absl::MakeSpan(entries), rows));
    // Read back whole: what the pointers will name is exactly what was meant to be written.
    absl::StatusOr<std::shared_ptr<const RerankSegment>> opened =
        RerankSegment::Open(path, kind, number, size);
    if (!opened.ok()) {
      std::filesystem::remove(path, ignored);
      return InShard(opened.status(), dir_);
    }
    segment = *std::move(opened);
    // Published before any pointer to it is committed, so that a reader that finds a pointer
    // always finds its segment (before the commit, no reader finds a pointer to it).
    MutexLock lock(&rerank_mu_);
    segments_[number].file = segment;
  }
  std::vector<size_t> kept;
  {
    MutexLock commit(&commit_mu_);
    rocksdb::WriteBatch batch;
    int64_t row_bytes = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      const RerankSegmentEntry& e = entries[i];
      row_bytes += e.bytes();
      const DocKey key{generation, e.iid};
      if (removed_while_tracking_[k].contains(key)) continue;
      batch.Put(Cf(kind), EncodeKey(kind, key), EncodePointer(kind, number, e));
      kept.push_back(i);
    }
    if (!kept.empty()) batch.Put(meta_, SegmentMetaKey(kind, number), EncodeCounterValue(size));
    for (uint32_t old : replaced) batch.Delete(meta_, SegmentMetaKey(kind, old));
    absl::Status status;
    if (batch.Count() > 0) {
      status = WriteToDb(&batch, absl::StrCat("committing a ", SegmentKindName(kind), " segment"),
                         nullptr, /*sync=*/true);
    }
    if (!status.ok()) {
      if (!path.empty()) {
        MutexLock lock(&rerank_mu_);
        segments_.erase(number);
      }
      // After a failed sync the batch may still be on disk and replayed at the next open, which
      // needs the segment then (and deletes it if no pointer to it was committed); only a write
      // refused for want of space certainly committed nothing, and its file is taking space.
      if (!path.empty() && absl::IsResourceExhausted(status)) {
        std::filesystem::remove(path, ignored);
      }
      return status;
    }
    MutexLock lock(&rerank_mu_);
    if (!kept.empty()) {
      SegmentState& state = segments_.at(number);
      state.row_bytes = row_bytes;
      for (size_t i : kept) {
        const RerankSegmentEntry& e = entries[i];
        const DocKey key{generation, e.iid};
        const RowsLocation location =
            LocationOf(e, number, segment->Rows(e.offset, e.bytes()).data());
        state.live_bytes += location.bytes();
        locations_[k][key] = location;
        if (const auto it = unflushed_[k].find(key); it != unflushed_[k].end()) {
          unflushed_bytes_[k] -= it->second;
          unflushed_[k].erase(it);
        }
      }
    }
    if (kept.empty() && !path.empty()) segments_.erase(number);
    for (uint32_t old : replaced) segments_.erase(old);
  }
  // Readers that still hold a replaced segment keep its mapping (and so its blocks) until done.
  if (kept.empty() && !path.empty()) std::filesystem::remove(path, ignored);
  for (uint32_t old : replaced) std::filesystem::remove(SegmentPath(kind, old), ignored);
  return absl::OkStatus();
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
  // A put replaces any value of its key (which a flush in progress must not then point past), so
  // it counts as a removal first.
  std::vector<DocKey> replaced;
  std::vector<std::pair<DocKey, int64_t>> added;
  for (const auto& [iid, bytes] : codes) {
    batch.Put(codes_, EncodeCodesKey(generation, iid), EncodeCodesValue(bytes));
    replaced.push_back(DocKey{generation, iid});
    if (!bytes.empty()) added.emplace_back(DocKey{generation, iid}, bytes.size());
  }
  for (uint64_t iid : removed) {
    batch.Delete(codes_, EncodeCodesKey(generation, iid));
    replaced.push_back(DocKey{generation, iid});
  }
  bool maintain = false;
  {
    MutexLock commit(&commit_mu_);
    TESSERA_RETURN_IF_ERROR(WriteToDb(&batch, "writing centroid codes"));
    maintain = ApplySegmentChanges(SegmentKind::kCodes, {}, replaced);
    maintain = ApplySegmentChanges(SegmentKind::kCodes, added, {}) || maintain;
  }
  if (maintain) SignalMaintenance();
  return absl::OkStatus();
}
absl::Status ShardStoreImpl::OccupiedRanges(
    rocksdb::ColumnFamilyHandle* cf, const std::vector<std::pair<std::string, std::string>>& ranges,
    absl::string_view what, std::vector<std::pair<std::string, std::string>>* occupied) const {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf));
  for (const auto& [begin, end] : ranges) {
    it->Seek(begin);
    TESSERA_RETURN_IF_ERROR(Rocks(it->status(), absl::StrCat("scanning ", what)));
    if (it->Valid() && it->key().compare(end) < 0) occupied->emplace_back(begin, end);
  }
  return absl::OkStatus();
}

absl::Status ShardStoreImpl::CompactRanges(
    rocksdb::ColumnFamilyHandle* cf, const std::vector<std::pair<std::string, std::string>>& ranges,
    absl::string_view what) {
  for (const auto& [begin, end] : ranges) {
    const rocksdb::Slice begin_key(begin), end_key(end);
    TESSERA_RETURN_IF_ERROR(
        Rocks(db_->CompactRange(rocksdb::CompactRangeOptions(), cf, &begin_key, &end_key),
              absl::StrCat("compacting dropped ", what)));
  }
  return absl::OkStatus();
}

absl::Status ShardStoreImpl::DropRanges(
    rocksdb::ColumnFamilyHandle* cf, const std::vector<std::pair<std::string, std::string>>& ranges,
    absl::string_view what) {
  std::vector<std::pair<std::string, std::string>> occupied;
  TESSERA_RETURN_IF_ERROR(OccupiedRanges(cf, ranges, what, &occupied));
  if (occupied.empty()) return absl::OkStatus();
  rocksdb::WriteBatch batch;
  for (const auto& [begin, end] : occupied) batch.DeleteRange(cf, begin, end);
  TESSERA_RETURN_IF_ERROR(WriteToDb(&batch, absl::StrCat("dropping ", what)));
  return CompactRanges(cf, occupied, what);
}

absl::Status ShardStoreImpl::DropCodeGenerationsExcept(uint32_t keep) {
  // One past every key: 13 bytes of 0xff sort after any 12-byte key. A generation's keys are a
  // range of their own, so compacting them mostly deletes whole files.
  const std::string end(13, '\xff');
  std::vector<std::pair<std::string, std::string>> dropped;
  if (keep > 0) dropped.emplace_back(EncodeCodesKey(0, 0), EncodeCodesKey(keep, 0));
  if (keep < UINT32_MAX) dropped.emplace_back(EncodeCodesKey(keep + 1, 0), end);
  // No flush or rewrite commits pointers of a dropped generation meanwhile.
  MutexLock flush(&flush_mu_);
  std::vector<uint32_t> segments;
  {
    ReaderMutexLock lock(&rerank_mu_);
    for (const auto& [number, segment] : segments_) {
      if (segment.file->kind() == SegmentKind::kCodes && segment.file->generation() != keep) {
        segments.push_back(number);
      }
    }
  }
  std::vector<std::pair<std::string, std::string>> occupied;
  TESSERA_RETURN_IF_ERROR(OccupiedRanges(codes_, dropped, "old centroid codes", &occupied));
  if (occupied.empty() && segments.empty()) return absl::OkStatus();
  {
    // The keys and the segments' meta keys go in one synced batch: a crash leaves both or neither
    // (an unlinked file's meta key never outlives it; a file whose key is gone is deleted at open).
    MutexLock commit(&commit_mu_);
    rocksdb::WriteBatch batch;
    for (const auto& [begin, end_key] : occupied) batch.DeleteRange(codes_, begin, end_key);
    for (uint32_t number : segments) {
      batch.Delete(meta_, SegmentMetaKey(SegmentKind::kCodes, number));
    }
    TESSERA_RETURN_IF_ERROR(
        WriteToDb(&batch, "dropping old centroid codes", nullptr, /*sync=*/true));
    const int k = KindIndex(SegmentKind::kCodes);
    MutexLock lock(&rerank_mu_);
    absl::erase_if(locations_[k],
                   [keep](const auto& entry) { return entry.first.generation != keep; });
    absl::erase_if(unflushed_[k],
                   [keep](const auto& entry) { return entry.first.generation != keep; });
    unflushed_bytes_[k] = 0;
    for (const auto& [key, bytes] : unflushed_[k]) unflushed_bytes_[k] += bytes;
    for (uint32_t number : segments) segments_.erase(number);
  }
  // Readers that still hold a dropped segment keep its mapping until done.
  std::error_code ignored;
  for (uint32_t number : segments) {
    std::filesystem::remove(SegmentPath(SegmentKind::kCodes, number), ignored);
  }
  return CompactRanges(codes_, occupied, "old centroid codes");
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
    // or rewrite in progress sees the dropped iids as removed (ApplySegmentChanges).
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
    std::vector<DocKey> keys;
    keys.reserve(dropped.size());
    for (uint64_t iid : dropped) keys.push_back(DocKey{0, iid});
    ApplySegmentChanges(SegmentKind::kRerank, {}, keys);
  }
  // Segments left without live rows are deleted, and the replaced values compacted away.
  TESSERA_RETURN_IF_ERROR(FlushSegments());
  rocksdb::CompactRangeOptions compact;
  compact.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
  TESSERA_RETURN_IF_ERROR(Rocks(db_->CompactRange(compact, rerank_, nullptr, nullptr),
                                "compacting dropped rerank rows"));
  return dropped;
}

absl::Status ShardStoreImpl::ForEachCodes(
    uint32_t generation, const std::function<absl::Status(uint64_t, absl::string_view)>& fn) const {
  const int k = KindIndex(SegmentKind::kCodes);
  // No flush or rewrite moves codes between RocksDB and the segments meanwhile, so that each is
  // seen once: in its segment, or as a value in RocksDB.
  MutexLock flush(&flush_mu_);
  std::vector<std::shared_ptr<const RerankSegment>> segments;
  {
    ReaderMutexLock lock(&rerank_mu_);
    for (const auto& [number, segment] : segments_) {
      if (segment.file->kind() == SegmentKind::kCodes && segment.file->generation() == generation) {
        segments.push_back(segment.file);
      }
    }
  }
  for (const std::shared_ptr<const RerankSegment>& segment : segments) {
    std::vector<std::pair<uint64_t, absl::string_view>> live;
    {
      ReaderMutexLock lock(&rerank_mu_);
      for (const RerankSegmentEntry& entry : segment->entries()) {
        const auto it = locations_[k].find(DocKey{generation, entry.iid});
        if (it == locations_[k].end() || it->second.segment != segment->number()) continue;
        live.emplace_back(entry.iid, absl::string_view(it->second.data, it->second.bytes()));
      }
    }
    absl::Status status;
    for (const auto& [iid, codes] : live) {
      status = fn(iid, codes);
      if (!status.ok()) break;
    }
    // Streamed once: its pages need not stay in this process's resident memory.
    segment->DropResidentPages();
    TESSERA_RETURN_IF_ERROR(status);
  }
  rocksdb::ManagedSnapshot snapshot(db_.get());
  rocksdb::ReadOptions read_options;
  read_options.snapshot = snapshot.snapshot();
  read_options.fill_cache = false;
  const std::string upper = EncodeCodesKey(generation + 1, 0);
  rocksdb::Slice upper_slice(upper);
  if (generation != UINT32_MAX) read_options.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options, codes_));
  for (it->Seek(EncodeCodesKey(generation, 0)); it->Valid(); it->Next()) {
    DocKey key;
    if (!DecodeCodesKey(absl::string_view(it->key().data(), it->key().size()), &key.generation,
                        &key.iid)) {
      return absl::DataLossError(
          absl::StrCat("shard '", dir_, "': codes CF has a key of ", it->key().size(), " bytes"));
    }
    if (key.generation != generation) break;
    const absl::string_view value(it->value().data(), it->value().size());
    if (IsCodesPointer(value)) continue;  // seen in its segment above
    TESSERA_ASSIGN_OR_RETURN(InlineValue codes, DecodeInline(SegmentKind::kCodes, value, key));
    TESSERA_RETURN_IF_ERROR(fn(key.iid, codes.bytes));
  }
  return Rocks(it->status(), "scanning centroid codes");
}

ShardStoreStats ShardStoreImpl::Stats() const {
  ShardStoreStats stats;
  stats.documents = live_documents_snapshot_.load(std::memory_order_relaxed);
  stats.disk_bytes = AllocatedBytes(dir_);
  stats.segments = SegmentStats();
  return stats;
}

SegmentFigures ShardStoreImpl::SegmentStats() const {
  SegmentFigures figures;
  ReaderMutexLock lock(&rerank_mu_);
  for (const auto& [number, segment] : segments_) {
    if (segment.file->kind() == SegmentKind::kCodes) {
      ++figures.code_segments;
      figures.code_segment_bytes += segment.file->size();
    } else {
      ++figures.rerank_segments;
      figures.rerank_segment_bytes += segment.file->size();
    }
  }
  figures.rerank_unflushed_bytes = unflushed_bytes_[KindIndex(SegmentKind::kRerank)];
  figures.code_unflushed_bytes = unflushed_bytes_[KindIndex(SegmentKind::kCodes)];
  return figures;
}
absl::Status ShardStoreImpl::Flush() {
  TESSERA_RETURN_IF_ERROR(FlushSegments());
  TESSERA_RETURN_IF_ERROR(ResumeIfStopped(0));
  rocksdb::FlushOptions flush_options;
  flush_options.wait = true;
  rocksdb::Status s = db_->Flush(flush_options, {meta_, docs_, ids_, rerank_, candidates_, codes_});
  // The flush leaves the write-ahead logs it emptied on disk until RocksDB's next purge of obsolete
  // files: after an ingest that trained a centroid index, logs as large as the rows it wrote (a
  // collection at twice its size right after its flush). Re-enabling file deletions runs that
  // purge now; force = false keeps any hold a checkpoint has on them.
  if (s.ok()) s = db_->DisableFileDeletions();
  if (s.ok()) s = db_->EnableFileDeletions(/*force=*/false);
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
  // Both kinds: rerank segments and codes segments.
  std::vector<std::string> names;
  {
    ReaderMutexLock lock(&rerank_mu_);
    for (const auto& [number, segment] : segments_) {
      names.push_back(SegmentFileName(segment.file->kind(), number));
    }
  }
  for (const std::string& name : names) {
    const std::string source = absl::StrCat(dir_, "/", name);
    const std::string target = absl::StrCat(dir, "/", name);
    std::error_code error;
    std::filesystem::create_hard_link(source, target, error);
    if (error) {
      error.clear();
      std::filesystem::copy_file(source, target, error);
    }
    if (error) {
      return absl::InternalError(absl::StrCat("checkpoint of ", dir_, " into ", dir, ": copying ",
                                              source, ": ", error.message()));
    }
  }
  if (!names.empty()) {
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
