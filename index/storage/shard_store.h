// One shard's durable storage: an embedded RocksDB database with the column families of DESIGN §4.
//
//   meta        string key → opaque bytes (the collection schema, counters)
//   docs        iid (8-byte big-endian) → DocumentRecord (external id, version, attributes, layout,
//               pooled-vector coverage)
//   ids         external id → iid
//   rerank      iid → StoredMatrix (the pooled rerank vectors, fp16 or fp32), or, once they moved
//               to a rerank segment file, a pointer to them there (see below)
//   candidates  iid → StoredMatrix (the candidate vectors, fp32; absent for documents written
//               while stage 1 was a centroid index, and deleted when it becomes one)
//   codes       (generation, iid) → a document's centroid codes, opaque here: one generation per
//               trained codebook, so a retrain writes the next generation beside the current one;
//               or, once they moved to a codes segment file, a pointer to them there (see below)
//
// Every value carries a format version and a checksum (see shard_store.cc for the byte layout).
// Internal ids (iids) are assigned by the store, increase monotonically and are never reused: an
// upsert of an existing external id writes a new iid and removes the old one in the same
// WriteBatch.
//
// Rerank segments. A document's rerank rows are first written in its WriteBatch (the acknowledged,
// durable write, as every other column). A background flush then moves committed rows into an
// append-once segment file in the same directory (rerank_segment.h), fsyncs it and its directory,
// and only then commits, in one synced WriteBatch, each document's rerank value replaced by a
// pointer (segment, offset, shape, CRC-32 of the rows) and the segment's size under a meta key: the
// rows are then stored once, in the segment, which searches read in place (ReadRerank). A crash
// before that commit leaves the rows in RocksDB and an uncommitted segment that Open deletes.
// Removed documents' rows are dead bytes of their segment; a segment whose dead bytes pass
// rerank_rewrite_dead_fraction is rewritten with its live rows (new pointers committed the same
// way) and its file unlinked (a reader still holding its mapping keeps reading it). Open verifies
// every committed segment whole (CRC-32, read with pread: the mapping's pages come in only as
// reads touch them), and fails with DATA_LOSS naming a segment that is missing, truncated or
// corrupt: its rows exist nowhere else.
//
// Codes segments. Documents' centroid codes move the same way, by the same flush, rewrite and
// options (rerank_segments, rerank_flush_bytes, …, which apply to both kinds): written in the
// document's WriteBatch (or by PutCodes), moved by the flush into `codes-<n>.seg` files (one
// generation per file) with pointers committed in one synced WriteBatch, read in place by
// ReadCodes, rewritten without removed documents' codes past the dead fraction, verified at Open.
// DropCodeGenerationsExcept deletes, in one synced WriteBatch, the other generations' keys and
// their segments' meta keys, then unlinks those files. Once flushed, codes are stored once.
//
// Thread-safe. Writers queue up and a leader commits the queued requests as one WriteBatch with
// one WAL sync (group commit, as leveldb's DBImpl::Write does); Write() returns only after its
// request is durable. Readers never block writers.
#ifndef TESSERA_INDEX_STORAGE_SHARD_STORE_H_
#define TESSERA_INDEX_STORAGE_SHARD_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tessera/collection.h"
#include "tessera/document.h"
#include "tessera/log.h"
#include "tessera/matrix.h"
#include "tessera/pooling.h"

namespace tessera::internal {

// A packed row-major matrix as stored: rows × cols values of `dtype`, little-endian.
struct StoredMatrix {
  VectorDtype dtype = VectorDtype::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
  std::string bytes;  // rows * cols * (2 or 4) bytes
};

// A stored matrix read in place: `bytes` (rows·cols·itemsize of them) lies in memory that whoever
// handed the view out keeps alive with it (a segment's mapping, a value read from RocksDB), for as
// long as the shared pointer to the view lives.
struct StoredMatrixView {
  VectorDtype dtype = VectorDtype::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
  absl::string_view bytes;
};
inline StoredMatrixView ViewOf(const StoredMatrix& matrix) {
  return StoredMatrixView{matrix.dtype, matrix.rows, matrix.cols, matrix.bytes};
}

// fp32 from fp16/fp32 values (rows × cols), and back (fp16 rounds to nearest).
std::vector<float> MatrixToFloat(const StoredMatrixView& matrix);
inline std::vector<float> MatrixToFloat(const StoredMatrix& matrix) {
  return MatrixToFloat(ViewOf(matrix));
}
StoredMatrix MatrixFromFloat(const std::vector<float>& values, int64_t rows, int64_t cols,
                             VectorDtype dtype);

struct DocumentRecord {
  uint64_t iid = 0;
  std::string external_id;
  // 1 for the first write of an external id, +1 on every upsert of it.
  uint64_t version = 0;
  // Tokens the client sent, before pooling.
  int64_t num_tokens = 0;
  std::optional<PatchGridLayout> layout;
  Attributes attributes;
  // Rerank vector v covers original tokens members[member_offsets[v] .. member_offsets[v + 1]).
  std::vector<int32_t> member_offsets;
  std::vector<int32_t> members;
  // The document's sparse vector (validated by the writer: indices strictly increasing).
  std::optional<SparseVector> sparse;
};

// One document to upsert. `record.iid` and `record.version` are assigned by Write().
struct DocumentWrite {
  DocumentRecord record;
  StoredMatrix rerank;
  StoredMatrix candidates;  // fp32; no rows: none stored
  // The document's centroid codes under code_generation (opaque); empty: none stored.
  std::string codes;
  uint32_t code_generation = 0;
};

struct WriteResult {
  // Per upsert, in request order: the new iid, its version, and the iid it replaced (0 if none).
  std::vector<uint64_t> upserted_iids;
  std::vector<uint64_t> versions;
  std::vector<uint64_t> replaced_iids;
  // Per delete, in request order: the iid removed (0 when the external id did not exist).
  std::vector<uint64_t> deleted_iids;
  // The RocksDB sequence number after this write.
  uint64_t sequence = 0;
  // 1, 2, 3, … in commit order over the store's lifetime since Open (requests committed in one
  // group are numbered in their order within the batch), so that derived state (the candidate
  // index) can apply acknowledged writes in exactly the order RocksDB did.
  uint64_t commit_index = 0;
};

// RocksDB memory shared by every store of an engine, so that its footprint does not grow with the
// number of shards: one write buffer manager (the memtables of all stores together stay within
// `memtable_bytes`; past it, the store being written flushes its oldest memtable) and one LRU
// cache of SST blocks (data, index and filter blocks) of `block_cache_bytes`. Opaque; thread-safe.
class SharedStoreMemory;
std::shared_ptr<SharedStoreMemory> NewSharedStoreMemory(size_t memtable_bytes,
                                                        size_t block_cache_bytes);

// A store opened without shared memory gets its own of these sizes.
inline constexpr size_t kDefaultMemtableBytes = size_t{256} << 20;
inline constexpr size_t kDefaultBlockCacheBytes = size_t{256} << 20;

// The write-ahead log is preallocated (fallocate) in steps of this many bytes as it grows.
// RocksDB's own step is 1.1 × the largest memtable (141 MiB here, allocated by every open shard
// before its first write: an empty 16-shard collection took 2.3 GB of disk); a small step costs one
// fallocate per MiB written, which synced writes did not measurably feel (ext4, 32 KiB batches).
inline constexpr size_t kWalPreallocationBytes = size_t{1} << 20;

struct ShardStoreOptions {
  bool create_if_missing = true;
  // fsync the WAL before Write() returns (the default; off only for bulk loads that can be redone).
  bool sync = true;
  // Null: the store gets its own (kDefaultMemtableBytes, kDefaultBlockCacheBytes).
  std::shared_ptr<SharedStoreMemory> memory;
  // Where the store's log lines go (LogToStderr when empty). RocksDB's own info log is a file in
  // the database directory (see Open).
  LogSink log;
  // Whether rerank rows and codes move into segment files at all (false: they stay in RocksDB,
  // read as before segments existed, and FlushSegments does nothing; segments already written are
  // still read). The benchmark of the read paths compares the two. The options below apply to
  // both kinds, each counted on its own.
  bool rerank_segments = true;
  // A background thread moves committed rerank rows from RocksDB into segment files once this many
  // bytes of them wait in RocksDB (and rewrites segments, see below); 0: no thread, only
  // FlushSegments() and Flush() move them.
  int64_t rerank_flush_bytes = int64_t{64} << 20;
  // A segment is rewritten without its removed documents' rows once those are at least this
  // fraction of its rows' bytes (a segment with no live rows is deleted).
  double rerank_rewrite_dead_fraction = 0.5;
  // Rows per segment file, in bytes, at most (a larger document is a segment of its own).
  int64_t rerank_segment_bytes = int64_t{64} << 20;
};

struct ShardStoreStats {
  int64_t documents = 0;
  // What the database directory occupies on disk: the allocated blocks of every file in it (SST
  // files, write-ahead logs with their preallocated space, MANIFEST, OPTIONS, the info log).
  int64_t disk_bytes = 0;
  // Segment files (rerank rows, and codes of every generation), the bytes they occupy, and the
  // bytes of each kind still in RocksDB: SegmentStats().
  SegmentFigures segments;
};

// The interface; ShardStoreImpl (shard_store.cc) is its one implementation (leveldb's DB / DBImpl).
class ShardStore {
 public:
  // Opens (or creates) the database in `dir`. NOT_FOUND when it does not exist and
  // create_if_missing is false; DATA_LOSS (naming the file) for a corrupt database,
  // RESOURCE_EXHAUSTED / UNAVAILABLE for a full disk / an I/O error, INTERNAL otherwise. RocksDB's
  // info log goes to dir/LOG (rolled to LOG.old past 8 MiB).
  static absl::StatusOr<std::unique_ptr<ShardStore>> Open(const std::string& dir,
                                                          const ShardStoreOptions& options);

  ShardStore() = default;
  ShardStore(const ShardStore&) = delete;
  ShardStore& operator=(const ShardStore&) = delete;
  virtual ~ShardStore() = default;

  // Opaque metadata (meta CF), written durably.
  virtual absl::Status PutMeta(const std::string& key, const std::string& value) = 0;
  // NOT_FOUND when absent.
  virtual absl::StatusOr<std::string> GetMeta(const std::string& key) const = 0;

  // Upserts and deletes (by external id) in one atomic, durable WriteBatch. Within one call, and
  // across calls committed in one group, requests apply in order: a later upsert of the same id
  // replaces an earlier one. INVALID_ARGUMENT for a malformed matrix (size ≠ rows·cols·itemsize).
  // A failed write wrote nothing that a reader sees (after a failed sync its batch may still be
  // replayed at the next open: not acknowledged, not lost either). Disk errors (every writing
  // call, Flush included):
  // - RESOURCE_EXHAUSTED "disk full: shard '<dir>': …" (RocksDB's message names the file). The
  //   database then refuses writes; the first write after space was freed resumes it
  //   (DB::Resume, which flushes the memtables) without reopening, while reads go on throughout.
  // - UNAVAILABLE naming the file ("IO error: While fdatasync: <dir>/000004.log: …") for any
  //   other write or sync error. RocksDB stops the database for good then: writes fail until the
  //   store is reopened (the message says so).
  virtual absl::StatusOr<WriteResult> Write(std::vector<DocumentWrite> upserts,
                                            const std::vector<std::string>& deletes) = 0;

  // The live iid of an external id; NOT_FOUND when there is none.
  virtual absl::StatusOr<uint64_t> LookupId(const std::string& external_id) const = 0;
  // NOT_FOUND for an unknown iid; DATA_LOSS when a stored value fails its checksum.
  virtual absl::StatusOr<DocumentRecord> GetRecord(uint64_t iid) const = 0;
  // A copy of the rerank vectors, checked: a segment's rows against the CRC-32 in the pointer
  // (DATA_LOSS naming the segment file on a mismatch).
  virtual absl::StatusOr<StoredMatrix> GetRerank(uint64_t iid) const = 0;
  // Batched GetRerank (one RocksDB MultiGet): one entry per iid, in order, std::nullopt for an
  // iid that has no rerank vectors (unknown, or removed meanwhile). Any other failure of any iid
  // fails the call as a whole: DATA_LOSS for a value that fails its checksum, the mapped RocksDB
  // status for a read error.
  virtual absl::StatusOr<std::vector<std::optional<StoredMatrix>>> MultiGetRerank(
      absl::Span<const uint64_t> iids) const = 0;
  // The search's read: one view per iid, in order, null for an iid without rerank vectors. Rows in
  // a segment are views into its mapping (no copy, no checksum pass: segments are verified whole
  // at open and when written), taken from an in-memory table of locations; only rows still in
  // RocksDB are read from it (one MultiGet, decoded and checked as MultiGetRerank does). The views
  // keep what they point into alive. Fails as a whole as MultiGetRerank does.
  virtual absl::StatusOr<std::vector<std::shared_ptr<const StoredMatrixView>>> ReadRerank(
      absl::Span<const uint64_t> iids) const = 0;
  // Moves every committed document's rerank rows and codes still in RocksDB into segment files and
  // rewrites the segments that passed the dead fraction, now (see the file comment). Errors as
  // Write's, or ErrnoStatus naming a segment file that cannot be written.
  virtual absl::Status FlushSegments() = 0;
  // A copy of the codes of each iid under `generation`, in order (one MultiGet; codes in a segment
  // are checked against the pointer's CRC-32, DATA_LOSS naming the segment file on a mismatch);
  // std::nullopt for an iid without codes under it. Fails as a whole as MultiGetRerank does.
  virtual absl::StatusOr<std::vector<std::optional<std::string>>> MultiGetCodes(
      uint32_t generation, absl::Span<const uint64_t> iids) const = 0;
  // The search's read of codes, as ReadRerank reads rows: one view per iid, in order, null for an
  // iid without codes under `generation` (unknown, removed, or its generation dropped). Codes in a
  // segment are views into its mapping; the views keep what they point into alive (a segment
  // dropped or rewritten meanwhile stays readable through them). Fails as a whole as
  // MultiGetRerank does.
  virtual absl::StatusOr<std::vector<std::shared_ptr<const absl::string_view>>> ReadCodes(
      uint32_t generation, absl::Span<const uint64_t> iids) const = 0;

  // Calls fn for every live document in iid order, from a consistent snapshot. Stops at and
  // returns the first non-OK status fn returns.
  virtual absl::Status ForEachDocument(
      const std::function<absl::Status(const DocumentRecord&)>& fn) const = 0;
  // Calls fn(iid, candidates) for every live document with iid ≥ min_iid, in iid order.
  virtual absl::Status ForEachCandidates(
      uint64_t min_iid,
      const std::function<absl::Status(uint64_t, const StoredMatrix&)>& fn) const = 0;

  // Removing a document (delete or replacement) deletes its codes under these generations (the
  // current one, and the next while a retrain writes it). Initially none.
  virtual void SetCodeGenerations(std::vector<uint32_t> generations) = 0;
  // Writes codes of documents under `generation` and deletes those of `removed`, in one durable
  // WriteBatch (outside the writer queue: no document or counter changes).
  virtual absl::Status PutCodes(uint32_t generation,
                                const std::vector<std::pair<uint64_t, std::string>>& codes,
                                absl::Span<const uint64_t> removed) = 0;
  // Deletes the codes of every generation but `keep`, durably, and frees their space now: their
  // codes segments are deleted and their RocksDB keys compacted away. A view ReadCodes handed out
  // stays valid.
  virtual absl::Status DropCodeGenerationsExcept(uint32_t keep) = 0;
  // Deletes every document's candidate vectors, durably, and compacts their column family so that
  // the disk space is freed now (a shard whose stage 1 became the centroid index never reads them
  // again). Candidate vectors written afterwards are kept.
  virtual absl::Status DropAllCandidates() = 0;
  // Replaces every document's rerank rows by a matrix without rows (same dtype and cols), durably
  // and in one WriteBatch, and frees their space now: segments left without live rows are deleted
  // and the replaced RocksDB values compacted away. For a shard whose stage 2 scores its documents
  // from their centroid codes (rerank_from_codes), once every document has codes. Returns the iids
  // whose rows it dropped (none when every document is stored without rows). DATA_LOSS for a value
  // that fails its checksum; write errors as Write's.
  virtual absl::StatusOr<std::vector<uint64_t>> DropAllRerankRows() = 0;
  // Calls fn(iid, codes) once for every document with codes under `generation`: first those in
  // segments, segment by segment (ascending iids within one), each segment's pages dropped from
  // the process's resident memory once it is streamed (so that a scan of every document's codes
  // keeps none of them resident), then those still in RocksDB in iid order. `codes` is valid
  // during the call only. No flush or rewrite runs meanwhile (fn must not call FlushSegments,
  // Flush, Checkpoint, DropCodeGenerationsExcept, DropAllRerankRows or ForEachCodes); documents
  // written or removed meanwhile may or may not be seen (documents removed before may still have
  // codes: see SetCodeGenerations).
  virtual absl::Status ForEachCodes(
      uint32_t generation,
      const std::function<absl::Status(uint64_t, absl::string_view)>& fn) const = 0;

  virtual uint64_t LatestSequence() const = 0;
  // Walks the database directory for disk_bytes (one stat per file).
  virtual ShardStoreStats Stats() const = 0;
  // Only the segment figures of Stats(), without its walk of the directory: for a caller that
  // counts the disk bytes of a directory holding the database itself (Shard::Stats).
  virtual SegmentFigures SegmentStats() const = 0;
  // FlushSegments, then flushes memtables to SST files (not needed for durability: the WAL already
  // has every write).
  virtual absl::Status Flush() = 0;
  // A consistent copy of the database in `dir` (which must not exist; its parent must), openable
  // by Open: RocksDB's checkpoint and the segment files (rerank and codes) it points to, hard links
  // where the filesystem allows. A write racing with it may or may not be in the copy. `sequence`,
  // when not null, gets the RocksDB sequence number the copy holds.
  virtual absl::Status Checkpoint(const std::string& dir, uint64_t* sequence) = 0;

  // WAL-synced RocksDB writes so far (one per committed group when options.sync), so tests can
  // see group commit at work.
  virtual int64_t SyncedWritesForTesting() const = 0;
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_STORAGE_SHARD_STORE_H_
