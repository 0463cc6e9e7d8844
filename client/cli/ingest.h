// `tessera ingest`: uploads the documents of an .npz (one 2-D float array per document, the key
// is its id — the layout tessera-pool reads) with the attributes and patch layouts of an optional
// JSONL sidecar, over N parallel Upsert streams, with a progress display and a resume journal
// (ingest_journal.h): documents the journal records as acknowledged with the same content hash
// are skipped, so rerunning a killed or failed ingest sends only what is missing or changed.
#ifndef TESSERA_CLIENT_CLI_INGEST_H_
#define TESSERA_CLIENT_CLI_INGEST_H_

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cli/json.h"
#include "client/cpp/client.h"
#include "tessera/document.h"
#include "tessera/npz.h"

namespace tessera::client {

struct IngestConfig {
  std::string collection;
  std::string npz_path;      // .npz (one array per document), or .npy (one document: its stem)
  std::string meta_path;     // JSONL sidecar; empty for none
  std::string journal_path;  // empty: npz_path + ".tessera-ingest"
  int streams = 2;
  size_t batch_documents = 32;
  size_t batch_bytes = 4 << 20;  // token bytes per message; a larger document goes alone
  bool resume = true;            // false: start the journal over and send everything
  double max_rate = 0;           // documents per second over all streams; 0 = unlimited
  bool progress = true;
  // The largest array read from the input (rows × dim × the file's itemsize): a document travels
  // in one Upsert message, and the server's default --max_message_bytes is 64 MiB. Checked, as is
  // the archive's declared total against this machine's memory, before anything is inflated.
  uint64_t max_document_bytes = uint64_t{64} << 20;
};

// One line of the sidecar:
//   {"id": "doc-1", "attributes": {"year": 2021, "lang": "en"},
//    "layout": {"rows": 32, "cols": 32, "prefix": 1, "suffix": 0}}
// "id" is a string or an integer; "attributes" and "layout" are optional (null = absent); other
// keys are ignored. "prefix_tokens"/"suffix_tokens" are accepted for "prefix"/"suffix".
struct DocumentMeta {
  std::optional<PatchLayout> layout;
  Attributes attributes;
  std::optional<SparseVector> sparse;  // "sparse": {"indices": [...], "values": [...]}
};

// Parses a whole sidecar. JSON integers become int64 attributes, except for fields that
// `attribute_types` (the collection's schema) declares double; other numbers become doubles,
// strings strings. INVALID_ARGUMENT "SOURCE:LINE: …" for a malformed line, a boolean, null, array
// or object attribute value, a bad layout, or an id given twice.
absl::StatusOr<std::map<std::string, DocumentMeta>> ParseMetaJsonl(
    absl::string_view text, absl::string_view source,
    const std::map<std::string, v1::AttributeType>& attribute_types);

// One document read for ingest.
struct IngestItem {
  std::string id;
  NpyArray tokens;  // 2-D: tokens × dim, float32, float16 or float64
  std::optional<PatchLayout> layout;
  Attributes attributes;
  std::optional<SparseVector> sparse;
  uint64_t content_hash = 0;  // DocumentContentHash of all of the above
};

struct IngestInput {
  std::vector<IngestItem> items;  // in archive order
  // Arrays that cannot be documents (not 2-D, integer dtype, too large), with why.
  std::vector<std::pair<std::string, absl::Status>> invalid;
  size_t label_arrays = 0;    // "KEY.labels" integer arrays of tessera-pool output, ignored
  size_t unmatched_meta = 0;  // sidecar lines whose id has no array
};

// Pairs the archive's arrays with their sidecar entries and hashes them.
IngestInput PrepareIngestInput(NpzEntries entries, std::map<std::string, DocumentMeta> meta);

// The upsert form of an item: fp32 and fp16 bytes travel as they are, float64 is rounded to fp32.
absl::StatusOr<DocumentInput> ToDocumentInput(const IngestItem& item);

struct IngestSummary {
  uint64_t documents = 0;  // in the input
  uint64_t stored = 0;     // acknowledged by the server in this run
  uint64_t skipped = 0;    // acknowledged in an earlier run, per the journal
  // Rejected by the server (or invalid locally): id and why.
  std::vector<std::pair<std::string, absl::Status>> failures;
  // Sent on a stream that broke before acknowledging them, or never sent; a rerun sends them.
  uint64_t unacknowledged = 0;
  // Why the ingest stopped early, if it did.
  absl::Status error;
  double seconds = 0;
  std::string journal_path;

  bool ok() const { return failures.empty() && unacknowledged == 0 && error.ok(); }
  // {"documents":…,"stored":…,"skipped":…,"failed":…,"unacknowledged":…,"seconds":…,
  //  "docs_per_second":…,"journal":…,"failures":[{"id":…,"code":…,"message":…}],"error":…}
  Json ToJson() const;
};

// Runs an ingest against `client`. Progress and warnings go to `err`. A non-OK status means the
// ingest could not start (unreadable input, unknown collection, a journal for another collection);
// once started, problems are reported in the summary.
absl::StatusOr<IngestSummary> RunIngest(Client& client, const IngestConfig& config,
                                        std::ostream& err);

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_CLI_INGEST_H_
