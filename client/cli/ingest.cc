// The ingest command: input preparation, the resume journal check, and the stream workers.
#include "client/cli/ingest.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cli/ingest_journal.h"
#include "client/cli/progress.h"
#include "client/cli/terminal.h"
#include "tessera/base/mutex.h"
#include "tessera/status_macros.h"

namespace tessera::client {
namespace {

absl::Status LineError(absl::string_view source, size_t line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ":", line, ": ", what));
}

absl::StatusOr<uint32_t> LayoutField(const Json& layout, absl::string_view name,
                                     absl::string_view alias, bool required) {
  const Json* value = FindMember(layout, name);
  if (value == nullptr && !alias.empty()) value = FindMember(layout, alias);
  if (value == nullptr || value->is_null()) {
    if (required) return absl::InvalidArgumentError(absl::StrCat("layout needs \"", name, "\""));
    return 0u;
  }
  // The parser gives non-negative integers as unsigned and negative ones as signed.
  if (!value->is_number_integer() || (!value->is_number_unsigned() && value->get<int64_t>() < 0) ||
      value->get<uint64_t>() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout \"", name, "\" must be a non-negative integer, got ", DumpJson(*value)));
  }
  return static_cast<uint32_t>(value->get<uint64_t>());
}

// {"indices": [term ids], "values": [weights]} (the JSON form of tessera.v1.SparseVector); the
// server checks the rest (unique indices, finite weights ≥ 0).
absl::StatusOr<SparseVector> ParseSparse(const Json& sparse) {
  const Json* indices = FindMember(sparse, "indices");
  const Json* values = FindMember(sparse, "values");
  if (indices == nullptr || values == nullptr || !indices->is_array() || !values->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"sparse\" must be {\"indices\": [term ids], \"values\": [weights]}, got ",
                     DumpJson(sparse)));
  }
  SparseVector vector;
  for (const Json& index : *indices) {
    // The parser gives non-negative integers as unsigned.
    if (!index.is_number_unsigned() ||
        index.get<uint64_t>() > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"sparse\" index ", DumpJson(index), " is not an integer in [0, 2^32)"));
    }
    vector.indices.push_back(static_cast<uint32_t>(index.get<uint64_t>()));
  }
  for (const Json& value : *values) {
    if (!value.is_number()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"sparse\" value ", DumpJson(value), " is not a number"));
    }
    vector.values.push_back(static_cast<float>(value.get<double>()));
  }
  return vector;
}

absl::StatusOr<PatchLayout> ParseLayout(const Json& layout) {
  if (!layout.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"layout\" must be an object {\"rows\",\"cols\",\"prefix\",\"suffix\"}, got ",
                     DumpJson(layout)));
  }
  PatchLayout result;
  TESSERA_ASSIGN_OR_RETURN(result.rows, LayoutField(layout, "rows", "", true));
  TESSERA_ASSIGN_OR_RETURN(result.cols, LayoutField(layout, "cols", "", true));
  TESSERA_ASSIGN_OR_RETURN(result.prefix_tokens,
                           LayoutField(layout, "prefix", "prefix_tokens", false));
  TESSERA_ASSIGN_OR_RETURN(result.suffix_tokens,
                           LayoutField(layout, "suffix", "suffix_tokens", false));
  return result;
}

absl::StatusOr<AttributeValue> ParseAttribute(
    const std::string& name, const Json& value,
    const std::map<std::string, v1::AttributeType>& types) {
  auto type = types.find(name);
  const bool wants_double = type != types.end() && type->second == v1::ATTRIBUTE_TYPE_DOUBLE;
  switch (value.type()) {
    case Json::value_t::number_integer:
      if (wants_double) return AttributeValue(value.get<double>());
      return AttributeValue(value.get<int64_t>());
    case Json::value_t::number_unsigned:
      // Beyond int64's range it can only be a double (as JSON readers take it).
      if (wants_double || value.get<uint64_t>() > std::numeric_limits<int64_t>::max()) {
        return AttributeValue(value.get<double>());
      }
      return AttributeValue(static_cast<int64_t>(value.get<uint64_t>()));
    case Json::value_t::number_float:
      return AttributeValue(value.get<double>());
    case Json::value_t::string:
      return AttributeValue(value.get<std::string>());
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("attribute '", name, "' is ", DumpJson(value),
                       "; attribute values are integers, numbers or strings"));
  }
}

v1::DType WireDtype(NpyDtype dtype) {
  return dtype == NpyDtype::kFloat16 ? v1::DTYPE_FLOAT16 : v1::DTYPE_FLOAT32;
}

// Fatal: retrying on a new stream cannot help, so the ingest stops and a rerun resumes it.
bool IsFatal(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kOutOfRange:
      return false;
    default:
      return true;
  }
}

// State shared by the stream workers.
class IngestRun {
 public:
  IngestRun(Client& client, const IngestConfig& config, const std::vector<IngestItem>& items,
            std::vector<std::vector<size_t>> batches, IngestJournal& journal,
            ProgressReporter& progress)
      : client_(client),
        config_(config),
        items_(items),
        batches_(std::move(batches)),
        journal_(journal),
        progress_(progress) {}

  void Run() {
    const int streams = std::max(1, std::min<int>(config_.streams, batches_.size()));
    std::vector<std::thread> workers;
    for (int i = 0; i < streams; ++i) workers.emplace_back([this] { Worker(); });
    for (std::thread& worker : workers) worker.join();
  }

  void Collect(IngestSummary* summary) {
    MutexLock lock(&mu_);
    summary->stored = stored_;
    summary->failures = std::move(failures_);
    summary->unacknowledged = unacknowledged_;
    summary->error = error_;
    // Batches never taken by a worker after a fatal error.
    const size_t taken = std::min(next_batch_.load(), batches_.size());
    for (size_t b = taken; b < batches_.size(); ++b) summary->unacknowledged += batches_[b].size();
  }

 private:
  static constexpr size_t kWindow = 2;  // batches in flight per stream
  static constexpr int kMaxStreamFailures = 3;

  void Fail(const absl::Status& status) {
    MutexLock lock(&mu_);
    if (error_.ok()) error_ = status;
    stop_.store(true);
  }

  // A stream error that a new stream may not repeat: reported, but the ingest goes on.
  void Note(const absl::Status& status) {
    MutexLock lock(&mu_);
    if (error_.ok()) error_ = status;
  }

  void ThrottleFor(size_t documents) {
    if (config_.max_rate <= 0) return;
    absl::Time at;
    {
      MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      at = std::max(now, next_send_);
      next_send_ = at + absl::Seconds(documents / config_.max_rate);
    }
    absl::SleepFor(at - absl::Now());
  }

  void RecordResults(const std::vector<size_t>& sent, const std::vector<DocumentResult>& results) {
    std::vector<std::pair<std::string, uint64_t>> acknowledged;
    std::vector<std::pair<std::string, absl::Status>> rejected;
    for (size_t i = 0; i < sent.size(); ++i) {
      const IngestItem& item = items_[sent[i]];
      const DocumentResult& result = results[i];
      if (result.id != item.id) {
        rejected.emplace_back(item.id, absl::InternalError(absl::StrCat("the server answered for '",
                                                                        result.id, "' instead")));
      } else if (result.status.ok()) {
        acknowledged.emplace_back(item.id, item.content_hash);
      } else {
        rejected.emplace_back(item.id, result.status);
      }
    }
    absl::Status journaled = journal_.Append(acknowledged);
    progress_.Add(sent.size());
    MutexLock lock(&mu_);
    stored_ += acknowledged.size();
    for (auto& failure : rejected) failures_.push_back(std::move(failure));
    if (!journaled.ok()) {
      if (error_.ok()) error_ = journaled;
      stop_.store(true);
    }
  }

  void RecordLocalFailure(const std::string& id, absl::Status status) {
    progress_.Add(1);
    MutexLock lock(&mu_);
    failures_.emplace_back(id, std::move(status));
  }

  void RecordUnacknowledged(const std::deque<std::vector<size_t>>& in_flight) {
    size_t count = 0;
    for (const auto& batch : in_flight) count += batch.size();
    MutexLock lock(&mu_);
    unacknowledged_ += count;
  }

  void Worker() {
    std::unique_ptr<UpsertStream> stream;
    std::deque<std::vector<size_t>> in_flight;  // item indices of batches written, not yet read
    int stream_failures = 0;

    // The stream broke with `status`: what was in flight is unacknowledged.
    auto stream_broke = [&](const absl::Status& status) {
      RecordUnacknowledged(in_flight);
      in_flight.clear();
      stream.reset();
      if (IsFatal(status) || ++stream_failures >= kMaxStreamFailures) {
        Fail(status);
      } else {
        Note(status);
      }
    };

    while (true) {
      if (!stop_.load() && in_flight.size() < kWindow) {
        const size_t b = next_batch_.fetch_add(1);
        if (b < batches_.size()) {
          std::vector<DocumentInput> documents;
          std::vector<size_t> sent;
          for (size_t index : batches_[b]) {
            absl::StatusOr<DocumentInput> document = ToDocumentInput(items_[index]);
            if (!document.ok()) {
              RecordLocalFailure(items_[index].id, document.status());
              continue;
            }
            documents.push_back(*std::move(document));
            sent.push_back(index);
          }
          if (documents.empty()) continue;
          if (stream == nullptr) {
            absl::StatusOr<std::unique_ptr<UpsertStream>> opened =
                client_.OpenUpsertStream(config_.collection);
            if (!opened.ok()) {
              in_flight.push_back(std::move(sent));
              stream_broke(opened.status());
              continue;
            }
            stream = *std::move(opened);
          }
          ThrottleFor(documents.size());
          absl::Status written = stream->Write(std::move(documents));
          in_flight.push_back(std::move(sent));
          if (written.ok()) continue;
          if (!absl::IsAborted(written)) {
            stream_broke(written);
            continue;
          }
          // The stream is closed: collect what it still acknowledges, then its status.
          while (true) {
            absl::StatusOr<std::vector<DocumentResult>> results = stream->Read();
            if (!results.ok()) {
              stream_broke(results.status().code() == absl::StatusCode::kOutOfRange
                               ? absl::UnavailableError("the server closed the upsert stream")
                               : results.status());
              break;
            }
            RecordResults(in_flight.front(), *results);
            in_flight.pop_front();
          }
          continue;
        }
      }
      if (in_flight.empty()) break;
      absl::StatusOr<std::vector<DocumentResult>> results = stream->Read();
      if (!results.ok()) {
        stream_broke(results.status().code() == absl::StatusCode::kOutOfRange
                         ? absl::UnavailableError("the server ended the upsert stream early")
                         : results.status());
        continue;
      }
      stream_failures = 0;
      RecordResults(in_flight.front(), *results);
      in_flight.pop_front();
    }
    if (stream != nullptr) {
      absl::Status finished = stream->Finish();
      if (!finished.ok()) Fail(finished);
    }
  }

  Client& client_;
  const IngestConfig& config_;
  const std::vector<IngestItem>& items_;
  const std::vector<std::vector<size_t>> batches_;
  IngestJournal& journal_;
  ProgressReporter& progress_;
  std::atomic<size_t> next_batch_{0};
  std::atomic<bool> stop_{false};

  Mutex mu_;
  uint64_t stored_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t unacknowledged_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<std::string, absl::Status>> failures_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  absl::Time next_send_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

absl::StatusOr<std::string> ReadTextFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", what, " '", path, "'"));
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// This machine's physical memory (no limit if it cannot be told): an archive that declares more
// could not be held, whatever it compresses to.
uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);     // NOLINT(runtime/int): sysconf's type
  const long page_size = sysconf(_SC_PAGE_SIZE);  // NOLINT(runtime/int)
  if (pages <= 0 || page_size <= 0) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

}  // namespace

absl::StatusOr<std::map<std::string, DocumentMeta>> ParseMetaJsonl(
    absl::string_view text, absl::string_view source,
    const std::map<std::string, v1::AttributeType>& attribute_types) {
  std::map<std::string, DocumentMeta> meta;
  size_t line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    absl::StatusOr<Json> parsed = ParseJson(line);
    if (!parsed.ok()) return LineError(source, line_number, parsed.status().message());
    if (!parsed->is_object()) {
      return LineError(source, line_number, "expected a JSON object");
    }
    const Json* id = FindMember(*parsed, "id");
    std::string key;
    if (id != nullptr && id->is_string()) {
      key = id->get<std::string>();
    } else if (id != nullptr && id->is_number_integer()) {
      key = id->dump();  // the integer's exact decimal digits, signed or not
    } else {
      return LineError(source, line_number, "\"id\" must be a string or an integer");
    }
    DocumentMeta entry;
    if (const Json* attributes = FindMember(*parsed, "attributes");
        attributes != nullptr && !attributes->is_null()) {
      if (!attributes->is_object()) {
        return LineError(source, line_number, "\"attributes\" must be an object");
      }
      for (const auto& [name, value] : attributes->items()) {
        absl::StatusOr<AttributeValue> attribute = ParseAttribute(name, value, attribute_types);
        if (!attribute.ok()) return LineError(source, line_number, attribute.status().message());
        entry.attributes.emplace(name, *std::move(attribute));
      }
    }
    if (const Json* layout = FindMember(*parsed, "layout");
        layout != nullptr && !layout->is_null()) {
      absl::StatusOr<PatchLayout> parsed_layout = ParseLayout(*layout);
      if (!parsed_layout.ok()) {
        return LineError(source, line_number, parsed_layout.status().message());
      }
      entry.layout = *parsed_layout;
    }
    if (const Json* sparse = FindMember(*parsed, "sparse");
        sparse != nullptr && !sparse->is_null()) {
      absl::StatusOr<SparseVector> parsed_sparse = ParseSparse(*sparse);
      if (!parsed_sparse.ok()) {
        return LineError(source, line_number, parsed_sparse.status().message());
      }
      entry.sparse = *std::move(parsed_sparse);
    }
    if (!meta.emplace(key, std::move(entry)).second) {
      return LineError(source, line_number, absl::StrCat("id '", key, "' appears twice"));
    }
  }
  return meta;
}

// `entries` by value: its arrays are moved into the items (clang-tidy 14 does not see the move
// through the structured binding).
IngestInput PrepareIngestInput(NpzEntries entries,  // NOLINT(performance-unnecessary-value-param)
                               std::map<std::string, DocumentMeta> meta) {
  IngestInput input;
  std::map<std::string, bool> names;
  for (const auto& [name, array] : entries) names[name] = true;
  size_t matched = 0;
  for (auto& [name, array] : entries) {
    const bool is_integer = array.dtype == NpyDtype::kInt32 || array.dtype == NpyDtype::kInt64;
    if (is_integer && absl::EndsWith(name, ".labels") &&
        names.count(name.substr(0, name.size() - 7)) > 0) {
      ++input.label_arrays;
      continue;
    }
    if (is_integer) {
      input.invalid.emplace_back(
          name, absl::InvalidArgumentError(
                    absl::StrCat("array '", name, "' has dtype ", NpyDtypeName(array.dtype),
                                 "; token matrices are float32, float16 or float64")));
      continue;
    }
    if (array.shape.size() != 2) {
      input.invalid.emplace_back(name, absl::InvalidArgumentError(absl::StrCat(
                                           "array '", name, "' has ", array.shape.size(),
                                           " dimensions; expected 2 (tokens x dim)")));
      continue;
    }
    if (array.shape[0] > std::numeric_limits<uint32_t>::max() ||
        array.shape[1] > std::numeric_limits<uint32_t>::max()) {
      input.invalid.emplace_back(
          name, absl::InvalidArgumentError(absl::StrCat("array '", name, "' is too large")));
      continue;
    }
    IngestItem item;
    item.id = name;
    if (auto it = meta.find(name); it != meta.end()) {
      item.layout = it->second.layout;
      item.attributes = std::move(it->second.attributes);
      item.sparse = std::move(it->second.sparse);
      ++matched;
    }
    item.content_hash = DocumentContentHash(
        NpyDtypeName(array.dtype), array.shape,
        absl::string_view(reinterpret_cast<const char*>(array.data.data()), array.data.size()),
        item.layout, item.attributes, item.sparse);
    item.tokens = std::move(array);
    input.items.push_back(std::move(item));
  }
  input.unmatched_meta = meta.size() - matched;
  return input;
}

absl::StatusOr<DocumentInput> ToDocumentInput(const IngestItem& item) {
  DocumentInput document;
  document.id = item.id;
  document.layout = item.layout;
  document.attributes = item.attributes;
  document.sparse = item.sparse;
  const uint32_t rows = static_cast<uint32_t>(item.tokens.shape[0]);
  const uint32_t cols = static_cast<uint32_t>(item.tokens.shape[1]);
  if (item.tokens.dtype == NpyDtype::kFloat32 || item.tokens.dtype == NpyDtype::kFloat16) {
    // NumPy's little-endian bytes are already the wire format.
    document.tokens = TokenMatrix::FromPackedBytes(
        rows, cols, WireDtype(item.tokens.dtype),
        std::string(reinterpret_cast<const char*>(item.tokens.data.data()),
                    item.tokens.data.size()));
  } else {
    TESSERA_ASSIGN_OR_RETURN(std::vector<float> values, item.tokens.ToFloat32());
    document.tokens = TokenMatrix::FromFloat32(rows, cols, values);
  }
  TESSERA_RETURN_IF_ERROR(document.tokens.Validate());
  return document;
}

Json IngestSummary::ToJson() const {
  Json json = Json::object();
  json["documents"] = documents;
  json["stored"] = stored;
  json["skipped"] = skipped;
  json["failed"] = static_cast<uint64_t>(failures.size());
  json["unacknowledged"] = unacknowledged;
  json["seconds"] = seconds;
  json["docs_per_second"] = seconds > 0 ? stored / seconds : 0.0;
  json["journal"] = journal_path;
  Json list = Json::array();
  for (const auto& [id, status] : failures) {
    Json failure = Json::object();
    failure["id"] = id;
    failure["code"] = std::string(absl::StatusCodeToString(status.code()));
    failure["message"] = std::string(status.message());
    list.push_back(std::move(failure));
  }
  json["failures"] = std::move(list);
  if (error.ok()) {
    json["error"] = Json();
  } else {
    Json error_json = Json::object();
    error_json["code"] = std::string(absl::StatusCodeToString(error.code()));
    error_json["message"] = std::string(error.message());
    json["error"] = std::move(error_json);
  }
  return json;
}

absl::StatusOr<IngestSummary> RunIngest(Client& client, const IngestConfig& config,
                                        std::ostream& err) {
  const absl::Time start = absl::Now();
  // The schema first: an unknown collection fails before reading gigabytes, and the attribute
  // types say which sidecar integers are doubles.
  TESSERA_ASSIGN_OR_RETURN(CollectionInfo info, client.GetCollection(config.collection));
  std::map<std::string, v1::AttributeType> attribute_types(info.schema.attributes().begin(),
                                                           info.schema.attributes().end());
  std::map<std::string, DocumentMeta> meta;
  if (!config.meta_path.empty()) {
    TESSERA_ASSIGN_OR_RETURN(std::string text, ReadTextFile(config.meta_path, "sidecar"));
    TESSERA_ASSIGN_OR_RETURN(meta, ParseMetaJsonl(text, config.meta_path, attribute_types));
  }
  NpzEntries entries;
  if (absl::EndsWith(config.npz_path, ".npy")) {
    // One document, named by the file's stem (as tessera-pool does).
    TESSERA_ASSIGN_OR_RETURN(NpyArray array, ReadNpyFile(config.npz_path));
    entries.emplace_back(std::filesystem::path(config.npz_path).stem().string(), std::move(array));
  } else {
    // The archive's declared sizes are checked before anything is inflated: no array over the
    // document limit, and no more in all than this machine's memory.
    NpzLimits limits;
    limits.max_array_bytes = config.max_document_bytes;
    limits.max_total_bytes = PhysicalMemoryBytes();
    limits.array_limit_hint =
        "set by --max-document-bytes; the server refuses messages over its --max_message_bytes";
    limits.total_limit_hint = "this machine's memory";
    TESSERA_ASSIGN_OR_RETURN(entries, ReadNpzFile(config.npz_path, limits));
  }
  IngestInput input = PrepareIngestInput(std::move(entries), std::move(meta));
  if (input.unmatched_meta > 0) {
    err << "tessera: warning: " << input.unmatched_meta << " sidecar entries name no array of "
        << config.npz_path << "\n";
  }

  IngestSummary summary;
  summary.documents = input.items.size() + input.invalid.size();
  summary.journal_path =
      config.journal_path.empty() ? config.npz_path + ".tessera-ingest" : config.journal_path;
  TESSERA_ASSIGN_OR_RETURN(
      std::unique_ptr<IngestJournal> journal,
      IngestJournal::Open(summary.journal_path, config.collection, !config.resume));

  // A journal that outlived its collection (dropped and created again) would skip documents the
  // server no longer has: check a few of the ones it would skip, and start over if one is gone.
  std::vector<size_t> to_send;
  std::vector<std::string> would_skip;
  for (size_t i = 0; i < input.items.size(); ++i) {
    if (journal->Contains(input.items[i].id, input.items[i].content_hash)) {
      would_skip.push_back(input.items[i].id);
    } else {
      to_send.push_back(i);
    }
  }
  if (!would_skip.empty()) {
    const size_t samples = std::min<size_t>(3, would_skip.size());
    for (size_t s = 0; s < samples; ++s) {
      const std::string& id =
          would_skip[samples == 1 ? 0 : s * (would_skip.size() - 1) / (samples - 1)];
      absl::StatusOr<StoredDocument> stored = client.Get(config.collection, id);
      if (stored.ok()) continue;
      if (!absl::IsNotFound(stored.status())) return stored.status();
      err << "tessera: warning: the journal " << TerminalSafe(summary.journal_path) << " lists '"
          << TerminalSafe(id) << "' as stored but collection '" << TerminalSafe(config.collection)
          << "' does not have it; ignoring the journal and sending every document\n";
      TESSERA_RETURN_IF_ERROR(journal->Reset());
      would_skip.clear();
      to_send.clear();
      for (size_t i = 0; i < input.items.size(); ++i) to_send.push_back(i);
      break;
    }
  }
  summary.skipped = would_skip.size();
  if (summary.skipped > 0) {
    err << "tessera: skipping " << summary.skipped << " of " << summary.documents
        << " documents already acknowledged (journal " << summary.journal_path << ")\n";
  }
  for (auto& [id, status] : input.invalid) summary.failures.emplace_back(id, status);

  // Batches by document count and token bytes, in archive order.
  std::vector<std::vector<size_t>> batches;
  size_t batch_bytes = 0;
  for (size_t index : to_send) {
    const size_t bytes = input.items[index].tokens.data.size();
    if (batches.empty() || batches.back().size() >= std::max<size_t>(config.batch_documents, 1) ||
        (!batches.back().empty() && batch_bytes + bytes > config.batch_bytes)) {
      batches.emplace_back();
      batch_bytes = 0;
    }
    batches.back().push_back(index);
    batch_bytes += bytes;
  }

  ProgressReporter progress(absl::StrCat("ingest ", TerminalSafe(config.collection)),
                            to_send.size(), config.progress && !to_send.empty());
  IngestRun run(client, config, input.items, std::move(batches), *journal, progress);
  run.Run();
  progress.Finish();
  IngestSummary outcome;
  run.Collect(&outcome);
  summary.stored = outcome.stored;
  // Streams finish in any order; report failures in the archive's.
  absl::flat_hash_map<std::string, size_t> position;
  for (size_t i = 0; i < input.items.size(); ++i) position[input.items[i].id] = i;
  std::stable_sort(
      outcome.failures.begin(), outcome.failures.end(),
      [&](const auto& a, const auto& b) { return position[a.first] < position[b.first]; });
  for (auto& failure : outcome.failures) summary.failures.push_back(std::move(failure));
  summary.unacknowledged = outcome.unacknowledged;
  summary.error = outcome.error;
  summary.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return summary;
}

}  // namespace tessera::client
