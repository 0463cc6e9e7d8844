// Whole-file reads and atomic, durable whole-file writes: the one home of both for the index's own
// files (schemas, candidate-index snapshots); and the disk space a directory occupies.
#ifndef TESSERA_INDEX_COMMON_FILE_IO_H_
#define TESSERA_INDEX_COMMON_FILE_IO_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tessera::internal {

// Replaces `path` with the concatenation of `parts`, atomically and durably: the bytes go to
// `path`.tmp, which is fsynced and renamed over `path`, then the directory is fsynced. On an error
// the temporary is removed and `path` is as it was (unless only the directory's fsync failed).
// Errors name the file (ErrnoStatus: a full disk is RESOURCE_EXHAUSTED, EIO UNAVAILABLE).
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::Span<const absl::string_view> parts);

// The file's bytes. ErrnoStatus on failure, naming the file (NOT_FOUND when it does not exist).
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// Reads the first `size` bytes of `path` with pread, `chunk_bytes` at a time into one buffer, and
// calls fn with each chunk in order: a pass over a large file that holds one chunk in memory and
// maps nothing. chunk_bytes ≥ 1 (0 reads as 1). ErrnoStatus naming the file on failure; DATA_LOSS
// naming it when it holds fewer than `size` bytes.
absl::Status ReadFileInChunks(const std::string& path, uint64_t size, size_t chunk_bytes,
                              const std::function<void(absl::string_view)>& fn);

// A whole file mapped read-only (MAP_SHARED: its pages are the page cache's, read in place, never
// copied), unmapped when the last reference goes. The file may be unlinked meanwhile: the mapping
// stays valid. Immutable, so thread-safe; the file must not be written while mapped.
class MappedFile {
 public:
  // Maps `path` (its pages come in as they are first read). ErrnoStatus on failure, naming the
  // file. An empty file maps to no bytes.
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  absl::string_view bytes() const { return absl::string_view(data_, size_); }
  const std::string& path() const { return path_; }
  // Drops the mapped pages from the process's resident set (madvise MADV_DONTNEED): the page
  // cache keeps them, and bytes() stays valid (the next read faults a page in again).
  void DropResidentPages() const;

 private:
  MappedFile(std::string path, const char* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  const std::string path_;
  const char* const data_;
  const size_t size_;
};

// Starts reading the pages of a file mapping that hold the `ranges` (each a part of a mapping's
// bytes) into the page cache, without waiting (madvise MADV_WILLNEED, one call per run of ranges
// at most a page apart): a caller about to read many scattered ranges issues them all first, so
// that their disk reads overlap instead of faulting in one at a time. Pages already cached cost a
// lookup each: ~0.6 µs a run on this project's machines (0.24 ms for the 400 runs of a 1M-document
// compact search). Advice only: a failure changes nothing but the speed. Returns the bytes advised.
size_t PrefetchMapped(std::vector<absl::string_view> ranges);

// PrefetchMapped for one reader of scattered ranges (a shard store's codes), skipped while the
// reads' pages stay cached. Each read first asks mincore about the first page of up to
// kResidencySamples of its ranges, spread over them (~1 µs each: mincore is no cheaper than the
// advice, so not every range is asked), and skips the advice only when that sample and the
// samples of the kCachedReadsToSkip − 1 reads before it were all cached. A miss faulted in alone
// costs ~1 ms from disk against the advice's ~0.6 µs a run, so skipping pays only when well under
// one page a read is missing, and a long streak of samples is what shows that: at 3M documents,
// whose codes fill the page cache, skipping on one clean sample raised the mean fetch of the first
// queries after a reopen from 3.5–3.8 to 4.5–5.4 ms, and on 8 in a row to 4.5 against 3.9.
// Thread-safe.
class MappedReadAhead {
 public:
  static constexpr size_t kResidencySamples = 32;
  static constexpr int kCachedReadsToSkip = 64;

  // Advises the ranges (PrefetchMapped) unless skipped; returns the bytes advised (0: skipped).
  size_t Read(std::vector<absl::string_view> ranges);

 private:
  std::atomic<int> cached_in_a_row_{0};
};

// The bytes the regular files under `path` (a file, or a directory walked recursively, symbolic
// links not followed) occupy on disk: their allocated blocks (st_blocks × 512), so space a file
// has preallocated beyond its size counts and holes do not. A file hard-linked twice under
// `path` counts twice. Files that vanish or cannot be read while it walks are skipped, and a walk
// that fails part way (a directory removed meanwhile) returns what it counted; 0 for a path that
// does not exist.
int64_t AllocatedBytes(const std::string& path);

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COMMON_FILE_IO_H_
