// The resume journal of `tessera ingest`: a text file next to the input (FILE.npz.tessera-ingest
// by default) listing the documents the server acknowledged, each with a 64-bit hash of its
// content, so that a rerun of the same command skips what is already stored and resends what
// changed. The server stores pooled vectors, so the client cannot compare content with it; the
// journal records what this client sent and saw acknowledged instead.
//
// Format (one entry per line, appended and fsynced after every acknowledged batch):
//   # tessera-ingest journal v1 collection=<escaped collection name>
//   <escaped id> <16 lowercase hex digits of the content hash>
// Ids are escaped by percent-encoding '%', spaces, control bytes and DEL, so that every line has
// exactly two space-free fields. A later entry for the same id replaces an earlier one. A torn last
// line (the process was killed while appending) is dropped when the journal is opened.
#ifndef TESSERA_CLIENT_CLI_INGEST_JOURNAL_H_
#define TESSERA_CLIENT_CLI_INGEST_JOURNAL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/cpp/client.h"
#include "tessera/base/mutex.h"
#include "tessera/document.h"

namespace tessera::client {

// MurmurHash64A of `bytes` (Austin Appleby's public-domain function; words read little-endian).
// Stable across runs and machines, unlike absl::Hash.
uint64_t Hash64(absl::string_view bytes, uint64_t seed = 0);

// The content hash of one document as the ingest reads it: the array's dtype name ("float32",
// "float16", …), its shape and raw little-endian bytes, its layout and its attributes (names,
// types and values) and its sparse vector. Any change to any of them changes the hash (up to
// 64-bit collisions); a document without a sparse vector hashes as it did before they existed.
uint64_t DocumentContentHash(absl::string_view dtype_name, absl::Span<const int64_t> shape,
                             absl::string_view raw_bytes, const std::optional<PatchLayout>& layout,
                             const Attributes& attributes,
                             const std::optional<SparseVector>& sparse = std::nullopt);

// Percent-encoding of ids for the journal (see the file comment) and its inverse; the inverse is
// INVALID_ARGUMENT for a bad escape.
std::string EscapeJournalId(absl::string_view id);
absl::StatusOr<std::string> UnescapeJournalId(absl::string_view escaped);

// One open journal. Thread-safe: batches acknowledged on several streams append concurrently.
class IngestJournal {
 public:
  // Opens (creating it if missing) the journal at `path` for an ingest into `collection` and reads
  // its entries. With `reset`, starts it over empty. FAILED_PRECONDITION when it records another
  // collection (the message says how to proceed); INVALID_ARGUMENT for a malformed line; I/O errors
  // as INTERNAL / PERMISSION_DENIED / NOT_FOUND (missing directory).
  static absl::StatusOr<std::unique_ptr<IngestJournal>> Open(const std::string& path,
                                                             const std::string& collection,
                                                             bool reset);
  ~IngestJournal();

  const std::string& path() const { return path_; }
  // Whether the journal records `id` as acknowledged with content hash `hash`.
  bool Contains(const std::string& id, uint64_t hash) const ABSL_LOCKS_EXCLUDED(mu_);
  // Number of distinct ids recorded.
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  // Up to `count` recorded ids, spread over the file's order (first, last, and between).
  std::vector<std::string> SampleIds(size_t count) const ABSL_LOCKS_EXCLUDED(mu_);

  // Appends (id, hash) entries and fsyncs the file before returning.
  absl::Status Append(absl::Span<const std::pair<std::string, uint64_t>> entries)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets every entry: truncates the file to its header.
  absl::Status Reset() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  IngestJournal(std::string path, std::string collection, int fd);
  absl::Status ResetLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const std::string collection_;
  mutable Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);  // ids in first-appearance order
};

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_CLI_INGEST_JOURNAL_H_
