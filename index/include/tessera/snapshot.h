// Snapshots of collections: a point-in-time copy kept beside the engine's data (a RocksDB
// checkpoint of every shard, hard links where the filesystem allows, so it costs little disk until
// the collection's own files are compacted away), with a manifest that checksums every file; a
// single-stream archive of one, for download; and a restore, from such an archive or from a local
// snapshot, into a new collection.
//
// Layout: <dir>/<collection>/<snapshot id>/{manifest, data/…}, where data/ is what
// Engine::CheckpointCollection writes (the schema file and shard-NNN/…). A snapshot id is
// "<collection>@<UTC time>-<8 hex digits>" (e.g. "papers@20261206T030455Z-1f0c9a2b"): it names its
// collection, so an id alone finds the snapshot.
//
// Archive format (version 1), little-endian:
//   "TSNAPv1\n"                                  8 bytes
//   manifest length (u32), CRC-32 of the manifest (u32), the manifest text
//   the bytes of each file the manifest lists, in its order, back to back (sizes from the manifest)
//   "TSNAPEND"                                   8 bytes
// The manifest is text, one field per line, headed by "tessera-snapshot 1":
//   id <id> / collection <name> / created_unix_micros <n> / num_shards <n> /
//   sequence <shard> <RocksDB sequence of the shard at the cut> (one per shard) / cut_micros <n> /
//   file <size> <CRC-32, 8 hex digits> <relative path> (one per file)
// The CRC-32 is zlib's polynomial (index/common/crc32.h, the checksum of every stored record).
// The framing (magic, manifest length and CRC-32, entries back to back, end marker) is also a
// cluster snapshot's (server/cluster/router_snapshots.cc), whose manifest is a cluster manifest
// and whose entries are the shards' own archives: both read and write it through
// SnapshotArchiveReader and EncodeSnapshotArchiveHead below, its one implementation.
#ifndef TESSERA_SNAPSHOT_H_
#define TESSERA_SNAPSHOT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tessera/engine.h"

namespace tessera {

struct SnapshotFile {
  std::string path;  // relative to the snapshot's data directory, "/"-separated
  int64_t size = 0;
  uint32_t crc32 = 0;
};

struct SnapshotManifest {
  std::string id;
  std::string collection;
  int64_t created_unix_micros = 0;
  int num_shards = 0;
  // Per shard, the RocksDB sequence number its checkpoint holds (every write acknowledged before
  // the snapshot began is at or below it).
  std::vector<uint64_t> shard_sequences;
  std::vector<SnapshotFile> files;
  // How long the collection's writes waited for the cut (the shards' checkpoints).
  int64_t cut_micros = 0;

  int64_t total_bytes() const;
};

// The manifest's text form (see the file comment) and back; DATA_LOSS for text that is not one.
std::string EncodeSnapshotManifest(const SnapshotManifest& manifest);
absl::StatusOr<SnapshotManifest> DecodeSnapshotManifest(absl::string_view text);

// The archive's framing (version 1, see the file comment).
//
// Writing one: EncodeSnapshotArchiveHead(manifest text), then each entry's bytes in the
// manifest's order, then SnapshotArchiveEndMarker().
std::string EncodeSnapshotArchiveHead(absl::string_view manifest_text);
absl::string_view SnapshotArchiveEndMarker();  // "TSNAPEND"

// One entry of an archive after its manifest, as the reader's handler reads the manifest.
struct SnapshotArchiveEntry {
  std::string name;  // in messages: "file '<name>'"
  int64_t size = 0;  // bytes, >= 0
  // Checked against the entry's bytes when set (a cluster archive's entries, the shards' own
  // archives, carry their own checksums instead).
  std::optional<uint32_t> crc32;
};

// Reads an archive from its bytes, in any chunking, and hands what they hold to a Handler: the
// manifest's text once its length is within bounds and its CRC-32 matches, then each entry's
// bytes (the entries are the handler's reading of the manifest), each entry checked against its
// size and CRC-32, then the end marker, after which nothing may follow. Single-threaded (one
// stream); the handler outlives the reader.
class SnapshotArchiveReader {
 public:
  // Called in archive order; an error from any of them stops the reader (Add returns it).
  class Handler {
   public:
    virtual ~Handler() = default;
    // The manifest's text (its CRC-32 matched): the entries that follow, in order.
    virtual absl::StatusOr<std::vector<SnapshotArchiveEntry>> OnManifest(
        absl::string_view text) = 0;
    // Entry `index` begins (before its bytes; an empty entry too).
    virtual absl::Status OnEntryBegin(size_t index) = 0;
    // The next bytes of entry `index`, in order; never empty.
    virtual absl::Status OnEntryBytes(size_t index, absl::string_view bytes) = 0;
    // Entry `index` has all its bytes, and they match its CRC-32 when it has one.
    virtual absl::Status OnEntryEnd(size_t index) = 0;
  };

  static constexpr uint32_t kDefaultMaxManifestBytes = 64u << 20;

  explicit SnapshotArchiveReader(Handler* handler,
                                 uint32_t max_manifest_bytes = kDefaultMaxManifestBytes)
      : handler_(handler), max_manifest_bytes_(max_manifest_bytes) {}

  // The next bytes of the archive. DATA_LOSS when they do not start with the magic (not a
  // snapshot archive, or another version), for a manifest longer than max_manifest_bytes or
  // failing its CRC-32, for an entry failing its CRC-32 (naming it: "snapshot file '<name>':
  // CRC-32 …"), for a wrong end marker and for bytes after it; or the handler's error. The first
  // error is final: every later Add and Finish returns it.
  absl::Status Add(absl::string_view bytes);
  // The archive has ended: OK when its end marker has arrived; otherwise DATA_LOSS "snapshot
  // archive truncated …" saying where: in its manifest, in file '<name>' (n of m bytes), or
  // before its end marker.
  absl::Status Finish() const;

  // Whether the end marker has arrived.
  bool ended() const { return state_ == State::kEnded; }
  // The entry whose bytes are arriving (begun and not ended); nullopt before the first entry
  // begins and after the last one ends.
  std::optional<size_t> current_entry() const {
    if (state_ != State::kEntries) return std::nullopt;
    return entry_;
  }

 private:
  enum class State { kMagic, kManifestHeader, kManifest, kEntries, kEndMarker, kEnded };

  absl::Status Consume(absl::string_view bytes);
  // Appends to buffer_ from *bytes up to `want` bytes in all; whether it holds them.
  bool Fill(absl::string_view* bytes, size_t want);
  absl::Status TakeManifest();
  // Begins entries_[entry_] and, while they are empty, ends them and begins the next; after the
  // last, the end marker is due.
  absl::Status BeginEntries();
  absl::Status TakeEntryBytes(absl::string_view* bytes);
  // Checks entries_[entry_]'s CRC-32, ends it and moves to the next.
  absl::Status EndEntry();

  Handler* const handler_;
  const uint32_t max_manifest_bytes_;
  absl::Status status_;
  State state_ = State::kMagic;
  std::string buffer_;
  uint32_t manifest_bytes_ = 0;
  uint32_t manifest_crc_ = 0;
  std::vector<SnapshotArchiveEntry> entries_;
  size_t entry_ = 0;
  int64_t entry_read_ = 0;  // bytes of entries_[entry_] so far
  uint32_t entry_crc_ = 0;
};

// A snapshot's archive, read in order. Single-threaded (one stream).
class SnapshotArchive {
 public:
  virtual ~SnapshotArchive() = default;
  // The next piece of the archive, at most the chunk size (the first, the head and manifest, may
  // be larger); empty once the archive has ended. DATA_LOSS naming a file of the snapshot that is
  // missing or shorter than its manifest says.
  virtual absl::StatusOr<std::string> Next() = 0;
  virtual const SnapshotManifest& manifest() const = 0;
};

// Reads an archive incrementally and installs it as a new collection. Single-threaded (one stream).
class SnapshotRestore {
 public:
  virtual ~SnapshotRestore() = default;
  // The next bytes of the archive, in any chunking. DATA_LOSS naming the file whose bytes fail
  // their CRC-32 (or the manifest), INVALID_ARGUMENT for a bad new name, ALREADY_EXISTS for a
  // taken one (checked as soon as the manifest has arrived, and again at Finish).
  virtual absl::Status Add(absl::string_view bytes) = 0;
  // The archive has ended: DATA_LOSS naming the file (or the manifest) when it is truncated;
  // otherwise the collection is opened under its new name and its manifest returned. On any
  // failure nothing is left: the files went to a temporary directory, removed on destruction.
  virtual absl::StatusOr<SnapshotManifest> Finish() = 0;
};

// Thread-safe. Owns the snapshot directory; the engine must outlive it and its data directory
// must be on the same filesystem (for the hard links and the final rename).
class SnapshotStore {
 public:
  // `dir` is created if missing; temporaries left by a crash are removed.
  static absl::StatusOr<std::unique_ptr<SnapshotStore>> Open(Engine* engine,
                                                             const std::string& dir);
  virtual ~SnapshotStore() = default;

  // Snapshots collection `collection`: every shard at one cut (the collection's writes wait
  // while the shards are checkpointed: hard links, no copy of the data). NOT_FOUND naming an
  // unknown collection. The manifest's checksums are computed after the cut, writes flowing.
  virtual absl::StatusOr<SnapshotManifest> Create(const std::string& collection) = 0;
  // The snapshots of `collection`, oldest first; empty when it has none (its collection may have
  // been dropped since).
  virtual absl::StatusOr<std::vector<SnapshotManifest>> List(
      const std::string& collection) const = 0;
  // NOT_FOUND naming an unknown id (INVALID_ARGUMENT for one that cannot be an id).
  virtual absl::StatusOr<SnapshotManifest> Get(const std::string& id) const = 0;
  // Removes the snapshot's files (the collection's own files are untouched). NOT_FOUND as Get.
  virtual absl::Status Delete(const std::string& id) = 0;
  // The snapshot as an archive, in pieces of at most `chunk_bytes`. NOT_FOUND as Get.
  virtual absl::StatusOr<std::unique_ptr<SnapshotArchive>> OpenArchive(
      const std::string& id, size_t chunk_bytes = size_t{1} << 20) const = 0;
  // OpenArchive's pieces through `sink`; `sink`'s error stops it.
  absl::Status WriteArchive(const std::string& id,
                            const std::function<absl::Status(absl::string_view)>& sink,
                            size_t chunk_bytes = size_t{1} << 20) const;
  // A restore of an archive into collection `new_name` of the engine.
  virtual std::unique_ptr<SnapshotRestore> NewRestore(const std::string& new_name) = 0;
  // Restores local snapshot `id` into `new_name`: its files copied and verified as an archive's.
  virtual absl::StatusOr<SnapshotManifest> RestoreLocal(const std::string& id,
                                                        const std::string& new_name) = 0;
};

}  // namespace tessera

#endif  // TESSERA_SNAPSHOT_H_
