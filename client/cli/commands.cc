// The commands of the `tessera` command line and their output.
#include "client/cli/commands.h"

#include <cstdlib>
#include <limits>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/ingest.h"
#include "client/cli/terminal.h"
#include "tessera/base/version.h"
#include "tessera/npy.h"
#include "tessera/status_macros.h"

namespace tessera::client {
namespace {

constexpr FlagSpec kFlags[] = {
    // Global.
    {"addr", true},
    {"api-key", true},
    {"timeout", true},
    {"tls", false},
    {"tls-ca", true},
    {"tls-cert", true},
    {"tls-key", true},
    {"tls-server-name", true},
    {"help", false},
    {"version", false},
    // Commands.
    {"json", false},
    {"dim", true},
    {"pool-factor", true},
    {"pooling", true},
    {"dtype", true},
    {"shards", true},
    {"replicas", true},
    {"allow-partial", false},
    {"attribute", true},
    {"factory", true},
    {"candidates", true},
    {"candidate-pool-factor", true},
    {"residual-bits", true},
    {"centroid-min-vectors", true},
    {"protected-tokens", true},
    {"min-vectors", true},
    {"max-merge-height", true},
    {"rerank-from-codes", false},
    {"renormalize", false},
    {"keep-special-tokens", false},
    {"meta", true},
    {"streams", true},
    {"batch", true},
    {"batch-bytes", true},
    {"journal", true},
    {"no-resume", false},
    {"max-rate", true},
    {"max-document-bytes", true},
    {"no-progress", false},
    {"query", true},
    {"k", true},
    {"num-candidates", true},
    {"per-token-candidates", true},
    {"nprobe", true},
    {"exhaustive", false},
    {"explain", false},
    {"filter", true},
    {"any-of", true},
    {"none-of", true},
    {"with-attributes", false},
    {"attributes", true},
    {"group-by", true},
    {"group-size", true},
    {"groups", true},
    {"after", true},
    {"limit", true},
    {"vectors", false},
    {"file", true},
    {"sparse", false},
    {"sparse-k1", true},
    {"sparse-b", true},
    {"sparse-no-idf", false},
    {"sparse-query", true},
    {"fusion", true},
    {"dense-weight", true},
    {"sparse-weight", true},
    {"rrf-k", true},
    {"fusion-candidates", true},
    {"rerank", false},
};

constexpr const char* kGlobalFlags[] = {"addr",     "api-key", "timeout",         "tls", "tls-ca",
                                        "tls-cert", "tls-key", "tls-server-name", "help"};

struct CommandSpec {
  const char* name;  // "collections create", "search", …
  int positionals;   // after the command words; -1 = one or more
  std::vector<const char*> flags;
};

const std::vector<CommandSpec>& Commands() {
  static const auto* commands = new std::vector<CommandSpec>{
      {"collections create",
       1,
       {"dim",
        "pool-factor",
        "pooling",
        "dtype",
        "shards",
        "replicas",
        "attribute",
        "factory",
        "candidates",
        "candidate-pool-factor",
        "residual-bits",
        "centroid-min-vectors",
        "protected-tokens",
        "min-vectors",
        "max-merge-height",
        "rerank-from-codes",
        "renormalize",
        "keep-special-tokens",
        "sparse",
        "sparse-k1",
        "sparse-b",
        "sparse-no-idf",
        "json"}},
      {"collections list", 0, {"json"}},
      {"collections get", 1, {"json"}},
      {"collections drop", 1, {}},
      {"ingest",
       2,
       {"meta", "streams", "batch", "batch-bytes", "journal", "no-resume", "max-rate",
        "max-document-bytes", "no-progress", "json"}},
      {"search", 1, {"query",          "k",
                     "num-candidates", "per-token-candidates",
                     "nprobe",         "exhaustive",
                     "explain",        "filter",
                     "any-of",         "none-of",
                     "allow-partial",  "with-attributes",
                     "attributes",     "group-by",
                     "group-size",     "groups",
                     "sparse-query",   "fusion",
                     "dense-weight",   "sparse-weight",
                     "rrf-k",          "fusion-candidates",
                     "rerank",         "json"}},
      {"get", 2, {"vectors", "json"}},
      {"delete", -1, {"filter", "any-of", "none-of", "json"}},
      {"count", 1, {"filter", "any-of", "none-of", "json"}},
      {"scroll",
       1,
       {"filter", "any-of", "none-of", "after", "limit", "with-attributes", "attributes", "json"}},
      {"stats", 1, {"json"}},
      {"flush", 1, {}},
      {"snapshot create", 1, {"json"}},
      {"snapshot list", 1, {"json"}},
      {"snapshot delete", 1, {}},
      {"snapshot download", 2, {}},
      // ID NEW_NAME, or --file ARCHIVE NEW_NAME.
      {"snapshot restore", -1, {"file", "json"}},
  };
  return *commands;
}

absl::Status Usage(absl::string_view message) { return absl::InvalidArgumentError(message); }

std::string AttributeTypeToString(v1::AttributeType type) {
  switch (type) {
    case v1::ATTRIBUTE_TYPE_INT64:
      return "int64";
    case v1::ATTRIBUTE_TYPE_DOUBLE:
      return "double";
    case v1::ATTRIBUTE_TYPE_STRING:
      return "string";
    default:
      return "unspecified";
  }
}

std::string DtypeToString(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return "fp32";
    case v1::DTYPE_FLOAT16:
      return "fp16";
    default:
      return "unspecified";
  }
}

std::string SpatialModeToString(v1::SpatialPooling::Mode mode) {
  switch (mode) {
    case v1::SpatialPooling::MODE_ROWS:
      return "rows";
    case v1::SpatialPooling::MODE_COLUMNS:
      return "cols";
    case v1::SpatialPooling::MODE_TILES:
      return "tile";
    case v1::SpatialPooling::MODE_ROW_WINDOWS:
      return "window";
    case v1::SpatialPooling::MODE_GLOBAL:
      return "global";
    default:
      return "unspecified";
  }
}

// A name, id or string value from the server (or the command line) in quotes for human output,
// escaped for the terminal.
std::string Quote(absl::string_view value) { return absl::StrCat("'", TerminalSafe(value), "'"); }

std::string WithThousands(uint64_t value) {
  std::string digits = absl::StrCat(value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string AttributeValueToString(const AttributeValue& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return absl::StrCat(*i);
  if (const auto* d = std::get_if<double>(&value)) return DumpJson(Json(*d));
  return Quote(std::get<std::string>(value));
}

// Splits "a, 'b,c', d" at commas outside quotes.
std::vector<std::string> SplitValues(absl::string_view text) {
  std::vector<std::string> values;
  std::string current;
  char quote = 0;
  for (char c : text) {
    if (quote != 0) {
      current.push_back(c);
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
      current.push_back(c);
    } else if (c == ',') {
      values.push_back(current);
      current.clear();
    } else {
      current.push_back(c);
    }
  }
  values.push_back(current);
  return values;
}

absl::StatusOr<AttributeValue> ParseFilterValue(
    absl::string_view field, absl::string_view raw,
    const std::map<std::string, v1::AttributeType>& fields) {
  absl::string_view text = absl::StripAsciiWhitespace(raw);
  const bool quoted = text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
                      text.back() == text.front();
  if (quoted) text = text.substr(1, text.size() - 2);
  if (text.empty() && !quoted) {
    return absl::InvalidArgumentError(absl::StrCat("--filter on '", field, "' has an empty value"));
  }
  auto type = fields.find(std::string(field));
  const v1::AttributeType declared =
      type == fields.end() ? v1::ATTRIBUTE_TYPE_UNSPECIFIED : type->second;
  int64_t i = 0;
  double d = 0;
  switch (declared) {
    case v1::ATTRIBUTE_TYPE_INT64:
      if (!absl::SimpleAtoi(text, &i)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--filter: field '", field, "' is int64, and '", text, "' is not an integer"));
      }
      return AttributeValue(i);
    case v1::ATTRIBUTE_TYPE_DOUBLE:
      if (!absl::SimpleAtod(text, &d)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--filter: field '", field, "' is double, and '", text, "' is not a number"));
      }
      return AttributeValue(d);
    case v1::ATTRIBUTE_TYPE_STRING:
      return AttributeValue(std::string(text));
    default:
      if (quoted) return AttributeValue(std::string(text));
      if (absl::SimpleAtoi(text, &i)) return AttributeValue(i);
      if (absl::SimpleAtod(text, &d)) return AttributeValue(d);
      return AttributeValue(std::string(text));
  }
}

absl::StatusOr<TokenMatrix> LoadQuery(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(NpyArray array, ReadNpyFile(path));
  int64_t rows = 0;
  int64_t cols = 0;
  if (array.shape.size() == 2) {
    rows = array.shape[0];
    cols = array.shape[1];
  } else if (array.shape.size() == 1) {
    rows = 1;
    cols = array.shape[0];
  } else {
    return absl::InvalidArgumentError(absl::StrCat("query '", path, "' has ", array.shape.size(),
                                                   " dimensions; expected 2 (tokens x dim)"));
  }
  if (rows > std::numeric_limits<uint32_t>::max() || cols > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("query '", path, "' is too large"));
  }
  switch (array.dtype) {
    case NpyDtype::kFloat32:
    case NpyDtype::kFloat16:
      return TokenMatrix::FromPackedBytes(
          static_cast<uint32_t>(rows), static_cast<uint32_t>(cols),
          array.dtype == NpyDtype::kFloat16 ? v1::DTYPE_FLOAT16 : v1::DTYPE_FLOAT32,
          std::string(reinterpret_cast<const char*>(array.data.data()), array.data.size()));
    case NpyDtype::kFloat64: {
      TESSERA_ASSIGN_OR_RETURN(std::vector<float> values, array.ToFloat32());
      return TokenMatrix::FromFloat32(static_cast<uint32_t>(rows), static_cast<uint32_t>(cols),
                                      values);
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("query '", path, "' has dtype ",
                                                     NpyDtypeName(array.dtype),
                                                     "; expected float32, float16 or float64"));
  }
}

std::string DescribeLayout(const std::optional<PatchLayout>& layout) {
  if (!layout.has_value()) return "none";
  return absl::StrCat(layout->rows, "x", layout->cols, " patches, ", layout->prefix_tokens,
                      " prefix + ", layout->suffix_tokens, " suffix tokens");
}

// ---- The commands. Each returns OK or a Failure. ----

class Cli {
 public:
  Cli(const ParsedArgs& args, std::ostream& out, std::ostream& err)
      : args_(args), out_(out), err_(err), json_(args.Has("json")) {}

  absl::Status Connect() {
    ClientOptions options;
    if (auto addr = args_.Get("addr")) options.address = *addr;
    if (auto key = args_.Get("api-key")) {
      options.api_key = *key;
    } else if (const char* env = std::getenv("TESSERA_API_KEY"); env != nullptr) {
      options.api_key = env;
    }
    if (auto timeout = args_.Get("timeout")) {
      TESSERA_ASSIGN_OR_RETURN(options.timeout, ParseTimeoutFlag("timeout", *timeout));
    }
    // Connect lazily: a call to a server that is down then fails at once with UNAVAILABLE (and
    // the transport's reason) instead of waiting out a connect timeout.
    options.connect_timeout = absl::ZeroDuration();
    options.use_tls = args_.Has("tls");
    options.tls_root_cert_file = args_.Get("tls-ca").value_or("");
    options.tls_client_cert_file = args_.Get("tls-cert").value_or("");
    options.tls_client_key_file = args_.Get("tls-key").value_or("");
    options.tls_server_name = args_.Get("tls-server-name").value_or("");
    TESSERA_ASSIGN_OR_RETURN(client_, Client::Connect(options));
    return absl::OkStatus();
  }

  absl::Status CollectionsCreate(const v1::CollectionSchema& schema, uint32_t replicas) {
    TESSERA_ASSIGN_OR_RETURN(v1::CollectionSchema created,
                             client_->CreateCollection(schema, replicas));
    if (json_) {
      out_ << SchemaToJsonLine(created);
    } else {
      out_ << "created collection " << Quote(created.name()) << ": "
           << internal::DescribeSchema(created) << "\n";
    }
    return absl::OkStatus();
  }

  absl::Status CollectionsList() {
    TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> names, client_->ListCollections());
    if (json_) {
      Json list = Json::array();
      for (const std::string& name : names) list.push_back(name);
      Json json = Json::object();
      json["collections"] = std::move(list);
      out_ << DumpJson(json) << "\n";
    } else {
      for (const std::string& name : names) out_ << TerminalSafe(name) << "\n";
    }
    return absl::OkStatus();
  }

  absl::Status CollectionsGet(const std::string& name) {
    TESSERA_ASSIGN_OR_RETURN(CollectionInfo info, client_->GetCollection(name));
    if (json_) {
      Json json = Json::object();
      json["schema"] = internal::SchemaToJson(info.schema);
      json["stats"] = internal::StatsToJson(name, info.stats);
      out_ << DumpJson(json) << "\n";
    } else {
      out_ << "collection " << Quote(info.schema.name()) << ": "
           << internal::DescribeSchema(info.schema) << "\n";
      PrintStats(info.stats);
    }
    return absl::OkStatus();
  }

  absl::Status CollectionsDrop(const std::string& name) {
    TESSERA_RETURN_IF_ERROR(client_->DropCollection(name));
    out_ << "dropped collection " << Quote(name) << "\n";
    return absl::OkStatus();
  }

  absl::Status Ingest(const IngestConfig& config) {
    TESSERA_ASSIGN_OR_RETURN(IngestSummary summary, RunIngest(*client_, config, err_));
    if (json_) {
      out_ << DumpJson(summary.ToJson()) << "\n";
    } else {
      out_ << absl::StrFormat(
          "ingest %s: %d documents: %d stored, %d skipped (already acknowledged), %d failed, "
          "%d unacknowledged; %.2f s, %.1f docs/s\n",
          Quote(config.collection), summary.documents, summary.stored, summary.skipped,
          summary.failures.size(), summary.unacknowledged, summary.seconds,
          summary.seconds > 0 ? summary.stored / summary.seconds : 0.0);
    }
    constexpr size_t kShown = 20;
    for (size_t i = 0; i < summary.failures.size() && i < kShown; ++i) {
      const auto& [id, status] = summary.failures[i];
      err_ << "tessera: document " << Quote(id) << ": " << absl::StatusCodeToString(status.code())
           << ": " << TerminalSafe(status.message(), TerminalBackslash::kKeep) << "\n";
    }
    if (summary.failures.size() > kShown) {
      err_ << "tessera: … and " << summary.failures.size() - kShown << " more failed documents\n";
    }
    if (summary.ok()) return absl::OkStatus();
    if (!summary.error.ok()) {
      return absl::Status(
          summary.error.code(),
          absl::StrCat(summary.error.message(), " (", summary.unacknowledged,
                       " documents unacknowledged; rerun the same command to resume)"));
    }
    if (summary.unacknowledged > 0) {
      return absl::UnavailableError(absl::StrCat(summary.unacknowledged,
                                                 " documents unacknowledged; rerun the same "
                                                 "command to resume"));
    }
    const absl::Status& first = summary.failures.front().second;
    return absl::Status(first.code(), absl::StrCat(summary.failures.size(), " of ",
                                                   summary.documents, " documents failed"));
  }

  // The filter of --filter (each a condition, all of them must hold), --any-of (each an
  // alternative: conditions joined by " && "; at least one must match) and --none-of (each an
  // alternative that must not match). Values take the types the schema declares.
  absl::StatusOr<Filter> FilterFromFlags(const std::string& collection) {
    Filter filter;
    const std::vector<std::string> all = args_.GetAll("filter");
    const std::vector<std::string> any = args_.GetAll("any-of");
    const std::vector<std::string> none = args_.GetAll("none-of");
    if (all.empty() && any.empty() && none.empty()) return filter;
    TESSERA_ASSIGN_OR_RETURN(CollectionInfo info, client_->GetCollection(collection));
    const std::map<std::string, v1::AttributeType> fields(info.schema.attributes().begin(),
                                                          info.schema.attributes().end());
    for (const std::string& expression : all) {
      TESSERA_ASSIGN_OR_RETURN(FilterCondition condition,
                               internal::ParseFilterExpression(expression, fields));
      filter.all_of.push_back(std::move(condition));
    }
    for (const std::string& alternative : any) {
      TESSERA_ASSIGN_OR_RETURN(Filter parsed,
                               internal::ParseFilterConjunction(alternative, fields));
      filter.any_of.push_back(std::move(parsed));
    }
    for (const std::string& alternative : none) {
      TESSERA_ASSIGN_OR_RETURN(Filter parsed,
                               internal::ParseFilterConjunction(alternative, fields));
      filter.none_of.push_back(std::move(parsed));
    }
    return filter;
  }

  absl::Status Search(const std::string& collection, const std::string& query_path,
                      SearchOptions options) {
    TokenMatrix query;  // empty: a sparse-only search (--sparse-query without --query)
    if (!query_path.empty()) {
      TESSERA_ASSIGN_OR_RETURN(query, LoadQuery(query_path));
    }
    TESSERA_ASSIGN_OR_RETURN(options.filter, FilterFromFlags(collection));
    TESSERA_ASSIGN_OR_RETURN(SearchResult result, client_->Search(collection, query, options));
    if (json_) {
      out_ << DumpJson(internal::SearchResultToJson(result, options.explain)) << "\n";
      return absl::OkStatus();
    }
    out_ << internal::SearchResultToText(result);
    return absl::OkStatus();
  }

  absl::Status Get(const std::string& collection, const std::string& id) {
    TESSERA_ASSIGN_OR_RETURN(StoredDocument document, client_->Get(collection, id));
    const bool vectors = args_.Has("vectors");
    if (json_) {
      out_ << DumpJson(internal::StoredDocumentToJson(document, vectors)) << "\n";
      return absl::OkStatus();
    }
    out_ << internal::StoredDocumentToText(document, vectors);
    return absl::OkStatus();
  }

  absl::Status DeleteMatching(const std::string& collection) {
    TESSERA_ASSIGN_OR_RETURN(const Filter filter, FilterFromFlags(collection));
    TESSERA_ASSIGN_OR_RETURN(const uint64_t deleted, client_->DeleteMatching(collection, filter));
    if (json_) {
      Json json = Json::object();
      json["deleted"] = deleted;
      out_ << DumpJson(json) << "\n";
    } else {
      out_ << "deleted " << deleted << " documents\n";
    }
    return absl::OkStatus();
  }

  absl::Status Count(const std::string& collection) {
    TESSERA_ASSIGN_OR_RETURN(const Filter filter, FilterFromFlags(collection));
    TESSERA_ASSIGN_OR_RETURN(const uint64_t count, client_->Count(collection, filter));
    if (json_) {
      Json json = Json::object();
      json["count"] = count;
      out_ << DumpJson(json) << "\n";
    } else {
      out_ << count << "\n";
    }
    return absl::OkStatus();
  }

  absl::Status Scroll(const std::string& collection, ScrollOptions options) {
    TESSERA_ASSIGN_OR_RETURN(options.filter, FilterFromFlags(collection));
    TESSERA_ASSIGN_OR_RETURN(const ScrollPage page, client_->Scroll(collection, options));
    if (json_) {
      Json documents = Json::array();
      for (const ScrolledDocument& document : page.documents) {
        Json entry = Json::object();
        entry["id"] = document.id;
        entry["version"] = document.version;
        if (options.with_attributes) {
          entry["attributes"] = internal::AttributesToJson(document.attributes);
        }
        documents.push_back(std::move(entry));
      }
      Json json = Json::object();
      json["documents"] = std::move(documents);
      json["next_after"] = page.next_after;
      out_ << DumpJson(json) << "\n";
      return absl::OkStatus();
    }
    for (const ScrolledDocument& document : page.documents) {
      out_ << TerminalSafe(document.id) << "  " << document.version;
      for (const auto& [name, value] : document.attributes) {
        out_ << "  " << TerminalSafe(name) << "=" << AttributeValueToString(value);
      }
      out_ << "\n";
    }
    if (!page.next_after.empty()) {
      out_ << "more after " << TerminalSafe(page.next_after) << " (--after)\n";
    }
    return absl::OkStatus();
  }

  absl::Status Delete(const std::string& collection, const std::vector<std::string>& ids) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<bool> existed, client_->Delete(collection, ids));
    size_t count = 0;
    for (bool e : existed) count += e ? 1 : 0;
    if (json_) {
      Json json = Json::object();
      json["deleted"] = static_cast<uint64_t>(count);
      Json flags = Json::object();
      for (size_t i = 0; i < ids.size(); ++i) flags[ids[i]] = static_cast<bool>(existed[i]);
      json["existed"] = std::move(flags);
      out_ << DumpJson(json) << "\n";
    } else {
      out_ << "deleted " << count << " of " << ids.size() << " documents\n";
    }
    return absl::OkStatus();
  }

  absl::Status Stats(const std::string& collection) {
    TESSERA_ASSIGN_OR_RETURN(CollectionInfo info, client_->GetCollection(collection));
    if (json_) {
      Json json = internal::StatsToJson(collection, info.stats);
      if (!info.shards.empty()) json["shards"] = internal::ShardsToJson(info.shards);
      out_ << DumpJson(json) << "\n";
    } else {
      out_ << "collection " << Quote(collection) << "\n";
      PrintStats(info.stats);
      for (const v1::ShardStatus& shard : info.shards) {
        std::vector<std::string> replicas;
        for (const v1::ReplicaStatus& replica : shard.replicas()) {
          replicas.push_back(absl::StrCat(
              TerminalSafe(replica.node_id()), " (", TerminalSafe(replica.state()),
              replica.address().empty() ? "" : ", ", TerminalSafe(replica.address()), ")"));
        }
        out_ << "  shard " << shard.shard() << "  " << absl::StrJoin(replicas, ", ") << "\n";
      }
    }
    return absl::OkStatus();
  }

  absl::Status Flush(const std::string& collection) {
    TESSERA_RETURN_IF_ERROR(client_->Flush(collection));
    out_ << "flushed collection " << Quote(collection) << "\n";
    return absl::OkStatus();
  }

  absl::Status SnapshotCreate(const std::string& collection) {
    TESSERA_ASSIGN_OR_RETURN(const v1::SnapshotInfo info, client_->CreateSnapshot(collection));
    PrintSnapshot("created snapshot", info);
    return absl::OkStatus();
  }

  absl::Status SnapshotList(const std::string& collection) {
    TESSERA_ASSIGN_OR_RETURN(const std::vector<v1::SnapshotInfo> snapshots,
                             client_->ListSnapshots(collection));
    if (json_) {
      Json list = Json::array();
      for (const v1::SnapshotInfo& info : snapshots) list.push_back(SnapshotToJson(info));
      Json json = Json::object();
      json["snapshots"] = std::move(list);
      out_ << DumpJson(json) << "\n";
    } else {
      for (const v1::SnapshotInfo& info : snapshots) {
        out_ << TerminalSafe(info.id()) << "  " << WithThousands(info.bytes()) << " bytes, "
             << info.files() << " files, " << info.num_shards() << " shard(s)\n";
      }
    }
    return absl::OkStatus();
  }

  absl::Status SnapshotDelete(const std::string& id) {
    TESSERA_RETURN_IF_ERROR(client_->DeleteSnapshot(id));
    out_ << "deleted snapshot " << Quote(id) << "\n";
    return absl::OkStatus();
  }

  absl::Status SnapshotDownload(const std::string& id, const std::string& path) {
    TESSERA_RETURN_IF_ERROR(client_->DownloadSnapshotToFile(id, path));
    out_ << "downloaded snapshot " << Quote(id) << " to " << Quote(path) << "\n";
    return absl::OkStatus();
  }

  // From snapshot `id` on the server, or from the archive at `file` when it is not empty.
  absl::Status SnapshotRestore(const std::string& id, const std::string& file,
                               const std::string& new_name) {
    TESSERA_ASSIGN_OR_RETURN(const v1::SnapshotInfo info,
                             file.empty() ? client_->RestoreSnapshot(id, new_name)
                                          : client_->RestoreSnapshotFromFile(file, new_name));
    PrintSnapshot(absl::StrCat("restored into ", Quote(new_name), " snapshot"), info);
    return absl::OkStatus();
  }

 private:
  static Json SnapshotToJson(const v1::SnapshotInfo& info) {
    Json json = Json::object();
    json["id"] = info.id();
    json["collection"] = info.collection();
    json["created_unix_micros"] = static_cast<int64_t>(info.created_unix_micros());
    json["num_shards"] = info.num_shards();
    json["files"] = static_cast<uint64_t>(info.files());
    json["bytes"] = static_cast<uint64_t>(info.bytes());
    json["cut_seconds"] = info.cut_seconds();
    return json;
  }

  void PrintSnapshot(const std::string& what, const v1::SnapshotInfo& info) {
    if (json_) {
      out_ << DumpJson(SnapshotToJson(info)) << "\n";
    } else {
      out_ << what << " " << TerminalSafe(info.id()) << " (" << WithThousands(info.bytes())
           << " bytes, " << info.files() << " files)\n";
    }
  }

  std::string SchemaToJsonLine(const v1::CollectionSchema& schema) {
    return DumpJson(internal::SchemaToJson(schema)) + "\n";
  }

  void PrintStats(const v1::CollectionStats& stats) {
    out_ << absl::StrFormat("  documents           %s\n", WithThousands(stats.documents()));
    out_ << absl::StrFormat("  original tokens     %s\n", WithThousands(stats.original_tokens()));
    out_ << absl::StrFormat("  rerank vectors      %s (%.2f per document)\n",
                            WithThousands(stats.rerank_vectors()), stats.vectors_per_document());
    out_ << absl::StrFormat("  candidate vectors   %s\n", WithThousands(stats.candidate_vectors()));
    out_ << absl::StrFormat(
        "  disk bytes          %s (%.1f per original token, %.1f per rerank vector)\n",
        WithThousands(stats.disk_bytes()), stats.disk_bytes_per_original_token(),
        stats.disk_bytes_per_rerank_vector());
    out_ << "  candidate indexes   "
         << (stats.candidate_indexes().empty()
                 ? "none"
                 : TerminalSafe(absl::StrJoin(stats.candidate_indexes(), ", ")))
         << (stats.training_shards() > 0 ? absl::StrCat(" (", stats.training_shards(), " training)")
                                         : std::string())
         << "\n";
    out_ << absl::StrFormat("  candidate memory    %s bytes\n",
                            WithThousands(stats.candidate_bytes()));
    out_ << absl::StrFormat("  rerank segments     %s files, %s bytes (%s bytes unflushed)\n",
                            WithThousands(stats.rerank_segments()),
                            WithThousands(stats.rerank_segment_bytes()),
                            WithThousands(stats.rerank_unflushed_bytes()));
    out_ << absl::StrFormat("  code segments       %s files, %s bytes (%s bytes unflushed)\n",
                            WithThousands(stats.code_segments()),
                            WithThousands(stats.code_segment_bytes()),
                            WithThousands(stats.code_unflushed_bytes()));
  }

  const ParsedArgs& args_;
  std::ostream& out_;
  std::ostream& err_;
  const bool json_;
  std::unique_ptr<Client> client_;
};

absl::StatusOr<IngestConfig> IngestConfigFromArgs(const ParsedArgs& args) {
  IngestConfig config;
  config.collection = args.positionals[1];
  config.npz_path = args.positionals[2];
  config.meta_path = args.Get("meta").value_or("");
  config.journal_path = args.Get("journal").value_or("");
  if (auto v = args.Get("streams")) {
    TESSERA_ASSIGN_OR_RETURN(uint32_t streams, ParseUint32Flag("streams", *v, 1));
    config.streams = static_cast<int>(std::min<uint32_t>(streams, 256));
  }
  if (auto v = args.Get("batch")) {
    TESSERA_ASSIGN_OR_RETURN(uint32_t batch, ParseUint32Flag("batch", *v, 1));
    config.batch_documents = batch;
  }
  if (auto v = args.Get("batch-bytes")) {
    TESSERA_ASSIGN_OR_RETURN(uint32_t bytes, ParseUint32Flag("batch-bytes", *v, 1));
    config.batch_bytes = bytes;
  }
  if (auto v = args.Get("max-rate")) {
    TESSERA_ASSIGN_OR_RETURN(config.max_rate, ParseDoubleFlag("max-rate", *v));
  }
  if (auto v = args.Get("max-document-bytes")) {
    uint64_t bytes = 0;
    if (!absl::SimpleAtoi(*v, &bytes) || bytes == 0) {
      return Usage(absl::StrCat("--max-document-bytes expects a positive integer, got '",
                                TerminalSafe(*v), "'"));
    }
    config.max_document_bytes = bytes;
  }
  config.resume = !args.Has("no-resume");
  config.progress = !args.Has("no-progress");
  return config;
}

absl::StatusOr<SparseVector> ParseSparseVector(absl::string_view flag, absl::string_view text) {
  SparseVector vector;
  for (absl::string_view term : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::vector<absl::string_view> parts = absl::StrSplit(term, ':');
    uint32_t index = 0;
    float weight = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(absl::StripAsciiWhitespace(parts[0]), &index) ||
        !absl::SimpleAtof(absl::StripAsciiWhitespace(parts[1]), &weight)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, " expects TERM:WEIGHT,… (term ids and weights), got '", term, "'"));
    }
    vector.indices.push_back(index);
    vector.values.push_back(weight);
  }
  return vector;
}

absl::StatusOr<SearchOptions> SearchOptionsFromArgs(const ParsedArgs& args) {
  SearchOptions options;
  if (auto v = args.Get("k")) {
    TESSERA_ASSIGN_OR_RETURN(options.k, ParseUint32Flag("k", *v, 1));
  }
  if (auto v = args.Get("num-candidates")) {
    TESSERA_ASSIGN_OR_RETURN(options.num_candidates, ParseUint32Flag("num-candidates", *v, 1));
  }
  if (auto v = args.Get("per-token-candidates")) {
    TESSERA_ASSIGN_OR_RETURN(options.per_token_candidates,
                             ParseUint32Flag("per-token-candidates", *v, 1));
  }
  if (auto v = args.Get("nprobe")) {
    TESSERA_ASSIGN_OR_RETURN(options.nprobe, ParseUint32Flag("nprobe", *v, 1));
  }
  options.exhaustive = args.Has("exhaustive");
  options.explain = args.Has("explain");
  options.allow_partial_results = args.Has("allow-partial");
  options.with_attributes = args.Has("with-attributes") || args.Has("attributes");
  if (auto v = args.Get("attributes")) options.attribute_fields = absl::StrSplit(*v, ',');
  if (auto v = args.Get("group-by")) options.group_by = *v;
  if (auto v = args.Get("group-size")) {
    TESSERA_ASSIGN_OR_RETURN(options.group_size, ParseUint32Flag("group-size", *v, 1));
  }
  if (auto v = args.Get("groups")) {
    TESSERA_ASSIGN_OR_RETURN(options.groups, ParseUint32Flag("groups", *v, 1));
  }
  if ((args.Has("group-size") || args.Has("groups")) && options.group_by.empty()) {
    return absl::InvalidArgumentError("--group-size and --groups need --group-by FIELD");
  }
  if (auto v = args.Get("sparse-query")) {
    TESSERA_ASSIGN_OR_RETURN(options.sparse_query, ParseSparseVector("sparse-query", *v));
  }
  const bool fusion_flags = args.Has("fusion") || args.Has("dense-weight") ||
                            args.Has("sparse-weight") || args.Has("rrf-k") ||
                            args.Has("fusion-candidates") || args.Has("rerank");
  if (fusion_flags && !options.sparse_query.has_value()) {
    return absl::InvalidArgumentError(
        "--fusion, --dense-weight, --sparse-weight, --rrf-k, --fusion-candidates and --rerank "
        "need --sparse-query");
  }
  if (auto v = args.Get("fusion")) {
    if (*v == "rrf") {
      options.fusion = v1::FUSION_RRF;
    } else if (*v == "score") {
      options.fusion = v1::FUSION_SCORE;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--fusion expects rrf or score, got '", *v, "'"));
    }
  }
  if (auto v = args.Get("dense-weight")) {
    TESSERA_ASSIGN_OR_RETURN(options.dense_weight, ParseDoubleFlag("dense-weight", *v));
  }
  if (auto v = args.Get("sparse-weight")) {
    TESSERA_ASSIGN_OR_RETURN(options.sparse_weight, ParseDoubleFlag("sparse-weight", *v));
  }
  if (auto v = args.Get("rrf-k")) {
    TESSERA_ASSIGN_OR_RETURN(options.rrf_k, ParseDoubleFlag("rrf-k", *v));
  }
  if (auto v = args.Get("fusion-candidates")) {
    TESSERA_ASSIGN_OR_RETURN(options.fusion_candidates,
                             ParseUint32Flag("fusion-candidates", *v, 1));
  }
  options.rerank = args.Has("rerank");
  return options;
}

absl::StatusOr<ScrollOptions> ScrollOptionsFromArgs(const ParsedArgs& args) {
  ScrollOptions options;
  if (auto v = args.Get("after")) options.after = *v;
  if (auto v = args.Get("limit")) {
    TESSERA_ASSIGN_OR_RETURN(options.limit, ParseUint32Flag("limit", *v, 1));
  }
  options.with_attributes = args.Has("with-attributes") || args.Has("attributes");
  if (auto v = args.Get("attributes")) options.attribute_fields = absl::StrSplit(*v, ',');
  return options;
}

}  // namespace

std::string TesseraUsage() {
  return R"(usage: tessera [GLOBAL FLAGS] COMMAND [ARGS] [FLAGS]
       tessera --version | --help

Global flags:
  --addr HOST:PORT        server address (default 127.0.0.1:50051)
  --api-key KEY           API key (default: $TESSERA_API_KEY), sent as "authorization: Bearer KEY"
  --timeout DURATION      deadline of each call: 30s, 500ms, 2m or seconds; 0 = none (default 30s);
                          ingest streams have no deadline
  --tls, --tls-ca FILE, --tls-cert FILE --tls-key FILE, --tls-server-name NAME
                          TLS (with --tls-ca: that root certificate) and mutual TLS

Commands:
  collections create NAME --dim D [--pool-factor P] [--pooling MODE] [--dtype fp16|fp32]
          [--shards S] [--replicas R] [--attribute NAME:int64|double|string ...] [--factory F]
          [--candidates pooled|global] [--candidate-pool-factor P] [--residual-bits 2|4]
          [--centroid-min-vectors V] [--rerank-from-codes] [--protected-tokens N]
          [--min-vectors M] [--max-merge-height H]
          [--renormalize] [--keep-special-tokens]
          [--sparse [--sparse-k1 K1] [--sparse-b B] [--sparse-no-idf]] [--json]
      --sparse: a sparse field (documents' sparse vectors, searches' --sparse-query), scored by
      BM25 (k1 1.2, b 0.75; --sparse-no-idf: the dot product).
      MODE: ward (default) | reference | rows | cols | tile:AxB | window:W:S | global
  collections list [--json]
  collections get NAME [--json]                  schema and statistics
  collections drop NAME
  ingest NAME FILE.npz [--meta FILE.jsonl] [--streams N] [--batch B] [--batch-bytes BYTES]
          [--journal PATH] [--no-resume] [--max-rate DOCS_PER_S] [--max-document-bytes BYTES]
          [--no-progress] [--json]
      FILE.npz holds one 2-D float array (tokens x dim) per document, keyed by its id (a .npy
      file is one document named by its stem); each line of FILE.jsonl is
      {"id":…,"attributes":{…},"layout":{"rows":R,"cols":C,"prefix":K,"suffix":K},
      "sparse":{"indices":[…],"values":[…]}} (sparse: for a collection created with --sparse).
      Acknowledged documents are recorded in FILE.npz.tessera-ingest (or --journal PATH); a rerun
      skips those whose content is unchanged (--no-resume sends everything again). An array
      over --max-document-bytes (default 67108864, the server's default message limit) is
      refused from the archive's headers, before anything is inflated.
  search NAME --query Q.npy [--k K] [--num-candidates N] [--per-token-candidates N]
          [--nprobe P] [--exhaustive] [--explain] [--filter EXPR ...] [--allow-partial] [--json]
          [--any-of 'EXPR && EXPR…' ...] [--none-of 'EXPR && EXPR…' ...]
          [--with-attributes | --attributes F1,F2] [--group-by FIELD [--group-size N] [--groups G]]
      EXPR: FIELD==V, FIELD!=V, FIELD<V, FIELD<=V, FIELD>V, FIELD>=V, "FIELD in V1,V2,…",
      "FIELD exists", "FIELD missing" or "FIELD prefix V". A document matches every --filter,
      at least one --any-of alternative (when given) and no --none-of alternative.
      --group-by: the best G groups (default k) of hits sharing FIELD's value, N hits each
      (default 1).
      [--sparse-query TERM:WEIGHT,… [--fusion rrf|score] [--dense-weight W] [--sparse-weight W]
          [--rrf-k K] [--fusion-candidates L] [--rerank]]
      --sparse-query: the sparse lane (BM25 on a collection created with --sparse); alone (no
      --query) a sparse-only search, with --query the lanes' best L (default k) fused by
      reciprocal rank (rrf, default; k 60) or normalised scores; --rerank orders the fused
      candidates by exact MaxSim.
  get NAME ID [--vectors] [--json]
  delete NAME ID... [--json]
  delete NAME (--filter EXPR | --any-of … | --none-of …)... [--json]
                                                 every document matching, durably
  count NAME [--filter EXPR ...] [--any-of …] [--none-of …] [--json]
  scroll NAME [--filter EXPR ...] [--any-of …] [--none-of …] [--after ID] [--limit N]
          [--with-attributes | --attributes F1,F2] [--json]
                                                 ids in ascending order, a page at a time
  stats NAME [--json]
  flush NAME                                     snapshot the collection's candidate indexes
  snapshot create NAME [--json]                  a point-in-time copy kept on the server; prints
                                                 its id (NAME@TIME-HEX)
  snapshot list NAME [--json]
  snapshot download ID FILE                      the snapshot as one archive file
  snapshot restore ID NEW_NAME [--json]          into a new collection (from the server's copy)
  snapshot restore --file FILE NEW_NAME [--json] from a downloaded archive (any server's);
                                                 every file's checksum is verified first
  snapshot delete ID

Exit status: 0 success, 1 failure ("tessera: CODE: message" on stderr), 2 usage error.
)";
}

std::string CommandUsage(const std::vector<std::string>& words) {
  std::string usage = TesseraUsage();
  std::string name = words.empty() ? "" : words[0];
  if (name == "collections" && words.size() > 1) name = absl::StrCat(name, " ", words[1]);
  bool known = false;
  for (const CommandSpec& spec : Commands()) known = known || name == spec.name;
  if (!known) return usage;
  // The command's lines of the "Commands:" section: from each line that starts with it (delete
  // has two forms) through its continuation lines, which are indented deeper.
  std::string text = "usage: tessera [GLOBAL FLAGS] followed by\n";
  bool in_command = false;
  bool in_commands = false;
  for (absl::string_view line : absl::StrSplit(usage, '\n')) {
    if (line == "Commands:") {
      in_commands = true;
      continue;
    }
    if (!in_commands || line.empty()) {
      in_command = false;
      continue;
    }
    const bool starts_command = line.size() > 2 && line.substr(0, 2) == "  " && line[2] != ' ';
    if (starts_command) {
      in_command =
          absl::StartsWith(line.substr(2), absl::StrCat(name, " ")) || line.substr(2) == name;
    }
    if (in_command) absl::StrAppend(&text, line, "\n");
  }
  return absl::StrCat(text, "\n(run 'tessera --help' for the global flags and every command)\n");
}

int RunTesseraCli(const std::vector<std::string>& arguments, std::ostream& out, std::ostream& err) {
  auto usage_error = [&](absl::string_view message) {
    err << "tessera: " << TerminalSafe(message, TerminalBackslash::kKeep)
        << "\n(run 'tessera --help' for usage)\n";
    return kExitUsage;
  };
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(arguments, kFlags);
  if (!parsed.ok()) return usage_error(parsed.status().message());
  const ParsedArgs& args = *parsed;
  if (args.Has("help")) {
    out << CommandUsage(args.positionals);
    return kExitOk;
  }
  if (args.Has("version")) {
    out << "tessera " << VersionString() << "\n";
    return kExitOk;
  }
  if (args.positionals.empty()) return usage_error("no command given");

  // Find the command: one word, or "collections" and a second word.
  const CommandSpec* command = nullptr;
  size_t words = 1;
  std::string name = args.positionals[0];
  if (name == "collections") {
    if (args.positionals.size() < 2) return usage_error("collections needs create|list|get|drop");
    name = absl::StrCat(name, " ", args.positionals[1]);
    words = 2;
  }
  if (name == "snapshot") {
    if (args.positionals.size() < 2) {
      return usage_error("snapshot needs create|list|download|restore|delete");
    }
    name = absl::StrCat(name, " ", args.positionals[1]);
    words = 2;
  }
  for (const CommandSpec& spec : Commands()) {
    if (name == spec.name) command = &spec;
  }
  if (command == nullptr) return usage_error(absl::StrCat("unknown command '", name, "'"));
  const size_t given = args.positionals.size() - words;
  if (command->positionals >= 0 && given != static_cast<size_t>(command->positionals)) {
    return usage_error(
        absl::StrCat("'", name, "' takes ", command->positionals, " argument(s), got ", given));
  }
  if (name == "snapshot restore" && given != (args.Has("file") ? 1u : 2u)) {
    return usage_error("'snapshot restore' takes ID NEW_NAME, or --file ARCHIVE NEW_NAME");
  }
  const bool by_filter = args.Has("filter") || args.Has("any-of") || args.Has("none-of");
  if (name == "delete" && by_filter && given != 1) {
    return usage_error("'delete' takes a collection and ids, or a collection and filter flags");
  }
  if (command->positionals < 0 && given < 2 && !(name == "delete" && by_filter) &&
      name != "snapshot restore") {
    return usage_error(absl::StrCat("'", name, "' takes a collection and one or more ids"));
  }
  for (const auto& [flag, values] : args.flags) {
    bool allowed = false;
    for (const char* global : kGlobalFlags) allowed = allowed || flag == global;
    for (const char* own : command->flags) allowed = allowed || flag == own;
    if (!allowed) return usage_error(absl::StrCat("--", flag, " is not a flag of '", name, "'"));
  }
  if (auto timeout = args.Get("timeout")) {
    absl::StatusOr<absl::Duration> parsed_timeout = ParseTimeoutFlag("timeout", *timeout);
    if (!parsed_timeout.ok()) return usage_error(parsed_timeout.status().message());
  }
  const std::vector<std::string> operands(args.positionals.begin() + words, args.positionals.end());

  // Everything that can be checked without the server is a usage error.
  v1::CollectionSchema schema;
  uint32_t replicas = 1;
  IngestConfig ingest;
  SearchOptions search;
  if (name == "collections create") {
    absl::StatusOr<v1::CollectionSchema> built = internal::SchemaFromArgs(operands[0], args);
    if (!built.ok()) return usage_error(built.status().message());
    schema = *std::move(built);
    if (auto value = args.Get("replicas")) {
      absl::StatusOr<uint32_t> parsed = ParseUint32Flag("replicas", *value, 1);
      if (!parsed.ok()) return usage_error(parsed.status().message());
      replicas = *parsed;
    }
  } else if (name == "ingest") {
    absl::StatusOr<IngestConfig> config = IngestConfigFromArgs(args);
    if (!config.ok()) return usage_error(config.status().message());
    ingest = *std::move(config);
  } else if (name == "search") {
    if (!args.Has("query") && !args.Has("sparse-query")) {
      return usage_error("search needs --query Q.npy, --sparse-query TERM:WEIGHT,… or both");
    }
    absl::StatusOr<SearchOptions> options = SearchOptionsFromArgs(args);
    if (!options.ok()) return usage_error(options.status().message());
    search = *std::move(options);
  }
  ScrollOptions scroll;
  if (name == "scroll") {
    absl::StatusOr<ScrollOptions> options = ScrollOptionsFromArgs(args);
    if (!options.ok()) return usage_error(options.status().message());
    scroll = *std::move(options);
  }

  Cli cli(args, out, err);
  absl::Status status = cli.Connect();
  if (status.ok()) {
    if (name == "collections create") {
      status = cli.CollectionsCreate(schema, replicas);
    } else if (name == "collections list") {
      status = cli.CollectionsList();
    } else if (name == "collections get") {
      status = cli.CollectionsGet(operands[0]);
    } else if (name == "collections drop") {
      status = cli.CollectionsDrop(operands[0]);
    } else if (name == "ingest") {
      status = cli.Ingest(ingest);
    } else if (name == "search") {
      status = cli.Search(operands[0], args.Get("query").value_or(""), search);
    } else if (name == "delete" && by_filter) {
      status = cli.DeleteMatching(operands[0]);
    } else if (name == "count") {
      status = cli.Count(operands[0]);
    } else if (name == "scroll") {
      status = cli.Scroll(operands[0], scroll);
    } else if (name == "get") {
      status = cli.Get(operands[0], operands[1]);
    } else if (name == "delete") {
      status =
          cli.Delete(operands[0], std::vector<std::string>(operands.begin() + 1, operands.end()));
    } else if (name == "stats") {
      status = cli.Stats(operands[0]);
    } else if (name == "flush") {
      status = cli.Flush(operands[0]);
    } else if (name == "snapshot create") {
      status = cli.SnapshotCreate(operands[0]);
    } else if (name == "snapshot list") {
      status = cli.SnapshotList(operands[0]);
    } else if (name == "snapshot delete") {
      status = cli.SnapshotDelete(operands[0]);
    } else if (name == "snapshot download") {
      status = cli.SnapshotDownload(operands[0], operands[1]);
    } else if (name == "snapshot restore") {
      const std::string file = args.Get("file").value_or("");
      status = file.empty() ? cli.SnapshotRestore(operands[0], "", operands[1])
                            : cli.SnapshotRestore("", file, operands[0]);
    }
  }
  out.flush();
  if (status.ok()) return kExitOk;
  err << "tessera: " << absl::StatusCodeToString(status.code()) << ": "
      << TerminalSafe(status.message(), TerminalBackslash::kKeep) << "\n";
  return kExitError;
}

namespace internal {

absl::StatusOr<v1::CollectionSchema> SchemaFromArgs(const std::string& name,
                                                    const ParsedArgs& args) {
  v1::CollectionSchema schema;
  schema.set_name(name);
  auto dim = args.Get("dim");
  if (!dim.has_value()) return Usage("collections create needs --dim D");
  TESSERA_ASSIGN_OR_RETURN(uint32_t dim_value, ParseUint32Flag("dim", *dim, 1));
  schema.set_dim(dim_value);

  const std::string dtype = absl::AsciiStrToLower(args.Get("dtype").value_or("fp16"));
  if (dtype == "fp16" || dtype == "float16") {
    schema.set_dtype(v1::DTYPE_FLOAT16);
  } else if (dtype == "fp32" || dtype == "float32") {
    schema.set_dtype(v1::DTYPE_FLOAT32);
  } else {
    return Usage(absl::StrCat("--dtype expects fp16 or fp32, got '", dtype, "'"));
  }

  const std::string pooling = args.Get("pooling").value_or("ward");
  const bool hierarchical = pooling == "ward" || pooling == "reference";
  if (hierarchical) {
    v1::HierarchicalPooling* h = schema.mutable_hierarchical();
    h->set_method(pooling == "ward" ? v1::HierarchicalPooling::METHOD_WARD
                                    : v1::HierarchicalPooling::METHOD_REFERENCE);
    h->set_pool_factor(2);
    if (auto p = args.Get("pool-factor")) {
      TESSERA_ASSIGN_OR_RETURN(uint32_t factor, ParseUint32Flag("pool-factor", *p, 1));
      h->set_pool_factor(factor);
    }
    if (auto p = args.Get("protected-tokens")) {
      TESSERA_ASSIGN_OR_RETURN(uint32_t tokens, ParseUint32Flag("protected-tokens", *p));
      h->set_protected_tokens(tokens);
    }
    if (auto p = args.Get("min-vectors")) {
      TESSERA_ASSIGN_OR_RETURN(uint32_t floor, ParseUint32Flag("min-vectors", *p));
      h->set_min_vectors(floor);
    }
    if (auto p = args.Get("max-merge-height")) {
      double height = 0.0;
      if (!absl::SimpleAtod(*p, &height)) {
        return Usage(absl::StrCat("--max-merge-height expects a number, got '", *p, "'"));
      }
      h->set_max_merge_height(height);  // unset: the server's default for the method
    }
    h->set_renormalize(args.Has("renormalize"));
    if (args.Has("keep-special-tokens")) {
      return Usage(
          "--keep-special-tokens applies to spatial pooling (rows, cols, tile, window, "
          "global)");
    }
  } else {
    v1::SpatialPooling* s = schema.mutable_spatial();
    const std::vector<std::string> parts = absl::StrSplit(pooling, ':');
    auto number = [&](const std::string& text, absl::string_view what) -> absl::StatusOr<uint32_t> {
      uint32_t value = 0;
      if (!absl::SimpleAtoi(text, &value) || value == 0) {
        return Usage(
            absl::StrCat("--pooling ", pooling, ": ", what, " must be a positive integer"));
      }
      return value;
    };
    if (pooling == "rows") {
      s->set_mode(v1::SpatialPooling::MODE_ROWS);
    } else if (pooling == "cols" || pooling == "columns") {
      s->set_mode(v1::SpatialPooling::MODE_COLUMNS);
    } else if (pooling == "global") {
      s->set_mode(v1::SpatialPooling::MODE_GLOBAL);
    } else if (parts[0] == "tile" && parts.size() == 2) {
      const std::vector<std::string> sizes = absl::StrSplit(parts[1], 'x');
      if (sizes.size() != 2) return Usage("--pooling tile:AxB needs two sizes, as in tile:2x2");
      s->set_mode(v1::SpatialPooling::MODE_TILES);
      TESSERA_ASSIGN_OR_RETURN(uint32_t rows, number(sizes[0], "A"));
      TESSERA_ASSIGN_OR_RETURN(uint32_t cols, number(sizes[1], "B"));
      s->set_tile_rows(rows);
      s->set_tile_cols(cols);
    } else if (parts[0] == "window" && parts.size() == 3) {
      s->set_mode(v1::SpatialPooling::MODE_ROW_WINDOWS);
      TESSERA_ASSIGN_OR_RETURN(uint32_t rows, number(parts[1], "W"));
      TESSERA_ASSIGN_OR_RETURN(uint32_t stride, number(parts[2], "S"));
      s->set_window_rows(rows);
      s->set_window_stride(stride);
    } else {
      return Usage(
          absl::StrCat("--pooling expects ward, reference, rows, cols, tile:AxB, "
                       "window:W:S or global, got '",
                       pooling, "'"));
    }
    s->set_keep_special_tokens(args.Has("keep-special-tokens"));
    s->set_renormalize(args.Has("renormalize"));
    if (args.Has("pool-factor") || args.Has("protected-tokens") || args.Has("min-vectors") ||
        args.Has("max-merge-height")) {
      return Usage(
          "--pool-factor, --protected-tokens, --min-vectors and --max-merge-height apply to ward "
          "and reference pooling");
    }
  }

  if (args.Has("candidates") || args.Has("candidate-pool-factor") || args.Has("factory") ||
      args.Has("residual-bits") || args.Has("centroid-min-vectors") ||
      args.Has("rerank-from-codes")) {
    v1::CandidateVectors* candidates = schema.mutable_candidates();
    const std::string kind = args.Get("candidates").value_or("pooled");
    if (kind == "pooled") {
      candidates->set_kind(v1::CandidateVectors::KIND_POOLED);
    } else if (kind == "global" || kind == "global-mean") {
      candidates->set_kind(v1::CandidateVectors::KIND_GLOBAL_MEAN);
      if (args.Has("candidate-pool-factor")) {
        return Usage("--candidate-pool-factor applies to --candidates pooled");
      }
    } else {
      return Usage(absl::StrCat("--candidates expects pooled or global, got '", kind, "'"));
    }
    if (auto p = args.Get("candidate-pool-factor")) {
      TESSERA_ASSIGN_OR_RETURN(uint32_t factor, ParseUint32Flag("candidate-pool-factor", *p, 1));
      candidates->set_pool_factor(factor);
    }
    candidates->set_factory(args.Get("factory").value_or(""));
    if (auto bits = args.Get("residual-bits")) {
      TESSERA_ASSIGN_OR_RETURN(uint32_t value, ParseUint32Flag("residual-bits", *bits, 1));
      candidates->set_residual_bits(value);
    }
    if (auto threshold = args.Get("centroid-min-vectors")) {
      TESSERA_ASSIGN_OR_RETURN(uint32_t value,
                               ParseUint32Flag("centroid-min-vectors", *threshold, 1));
      candidates->set_centroid_min_vectors(value);
      candidates->set_centroid_min_training_vectors(value);
    }
    candidates->set_rerank_from_codes(args.Has("rerank-from-codes"));
  }

  if (auto shards = args.Get("shards")) {
    TESSERA_ASSIGN_OR_RETURN(uint32_t count, ParseUint32Flag("shards", *shards, 1));
    schema.set_num_shards(count);
  }
  if (args.Has("sparse")) {
    v1::SparseField* sparse = schema.mutable_sparse();
    sparse->set_modifier(args.Has("sparse-no-idf") ? v1::SparseField::MODIFIER_NONE
                                                   : v1::SparseField::MODIFIER_IDF);
    if (auto v = args.Get("sparse-k1")) {
      TESSERA_ASSIGN_OR_RETURN(double k1, ParseDoubleFlag("sparse-k1", *v));
      sparse->set_k1(k1);
    }
    if (auto v = args.Get("sparse-b")) {
      TESSERA_ASSIGN_OR_RETURN(double b, ParseDoubleFlag("sparse-b", *v));
      sparse->set_b(b);
    }
  } else if (args.Has("sparse-k1") || args.Has("sparse-b") || args.Has("sparse-no-idf")) {
    return Usage("--sparse-k1, --sparse-b and --sparse-no-idf need --sparse");
  }
  for (const std::string& attribute : args.GetAll("attribute")) {
    const size_t colon = attribute.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return Usage(
          absl::StrCat("--attribute expects NAME:int64|double|string, got '", attribute, "'"));
    }
    const std::string field = attribute.substr(0, colon);
    const std::string type = absl::AsciiStrToLower(attribute.substr(colon + 1));
    v1::AttributeType parsed;
    if (type == "int64" || type == "int") {
      parsed = v1::ATTRIBUTE_TYPE_INT64;
    } else if (type == "double" || type == "float") {
      parsed = v1::ATTRIBUTE_TYPE_DOUBLE;
    } else if (type == "string" || type == "str") {
      parsed = v1::ATTRIBUTE_TYPE_STRING;
    } else {
      return Usage(
          absl::StrCat("--attribute ", attribute, ": the type must be int64, double or string"));
    }
    if (schema.attributes().count(field) > 0) {
      return Usage(absl::StrCat("--attribute ", field, " is given twice"));
    }
    (*schema.mutable_attributes())[field] = parsed;
  }
  return schema;
}

absl::StatusOr<FilterCondition> ParseFilterExpression(
    absl::string_view expression, const std::map<std::string, v1::AttributeType>& fields) {
  FilterCondition condition;
  absl::string_view field;
  absl::string_view rest;
  // "FIELD exists", "FIELD missing", "FIELD prefix V".
  const absl::string_view trimmed = absl::StripAsciiWhitespace(expression);
  for (const auto& [suffix, op] :
       {std::pair{absl::string_view(" exists"), FilterCondition::Op::kExists},
        std::pair{absl::string_view(" missing"), FilterCondition::Op::kMissing}}) {
    if (absl::EndsWith(trimmed, suffix)) {
      condition.field = std::string(
          absl::StripAsciiWhitespace(trimmed.substr(0, trimmed.size() - suffix.size())));
      condition.op = op;
      if (condition.field.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--filter '", expression, "' names no field"));
      }
      return condition;
    }
  }
  const size_t prefix_at = expression.find(" prefix ");
  if (prefix_at != absl::string_view::npos &&
      expression.find_first_of("=!<>") == absl::string_view::npos) {
    field = absl::StripAsciiWhitespace(expression.substr(0, prefix_at));
    if (field.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--filter '", expression, "' names no field"));
    }
    condition.field = std::string(field);
    condition.op = FilterCondition::Op::kPrefix;
    // A prefix is a string whatever the field's type (the server refuses it on a number field).
    absl::string_view text = absl::StripAsciiWhitespace(expression.substr(prefix_at + 8));
    if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
        text.back() == text.front()) {
      text = text.substr(1, text.size() - 2);
    }
    condition.values.push_back(std::string(text));
    return condition;
  }
  const size_t op_at = expression.find_first_of("=!<>");
  const size_t in_at = expression.find(" in ");
  if (in_at != absl::string_view::npos && (op_at == absl::string_view::npos || in_at < op_at)) {
    field = expression.substr(0, in_at);
    rest = absl::StripAsciiWhitespace(expression.substr(in_at + 4));
    condition.op = FilterCondition::Op::kIn;
    if (rest.size() >= 2 && ((rest.front() == '[' && rest.back() == ']') ||
                             (rest.front() == '(' && rest.back() == ')'))) {
      rest = rest.substr(1, rest.size() - 2);
    }
  } else if (op_at != absl::string_view::npos) {
    field = expression.substr(0, op_at);
    const absl::string_view tail = expression.substr(op_at);
    struct {
      absl::string_view text;
      FilterCondition::Op op;
    } static constexpr kOps[] = {
        {"==", FilterCondition::Op::kEq}, {"!=", FilterCondition::Op::kNe},
        {"<=", FilterCondition::Op::kLe}, {">=", FilterCondition::Op::kGe},
        {"<", FilterCondition::Op::kLt},  {">", FilterCondition::Op::kGt},
        {"=", FilterCondition::Op::kEq},
    };
    bool matched = false;
    for (const auto& candidate : kOps) {
      if (absl::StartsWith(tail, candidate.text)) {
        condition.op = candidate.op;
        rest = tail.substr(candidate.text.size());
        matched = true;
        break;
      }
    }
    if (!matched) {
      return absl::InvalidArgumentError(
          absl::StrCat("--filter '", expression, "': unknown operator"));
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--filter '", expression,
                     "' has no operator; expected FIELD==V, !=, <, <=, >, >= or 'FIELD in V1,V2'"));
  }
  field = absl::StripAsciiWhitespace(field);
  if (field.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--filter '", expression, "' names no field"));
  }
  condition.field = std::string(field);
  if (condition.op == FilterCondition::Op::kIn) {
    for (const std::string& raw : SplitValues(rest)) {
      TESSERA_ASSIGN_OR_RETURN(AttributeValue value, ParseFilterValue(field, raw, fields));
      condition.values.push_back(std::move(value));
    }
  } else {
    TESSERA_ASSIGN_OR_RETURN(AttributeValue value, ParseFilterValue(field, rest, fields));
    condition.values.push_back(std::move(value));
  }
  return condition;
}

absl::StatusOr<Filter> ParseFilterConjunction(
    absl::string_view expressions, const std::map<std::string, v1::AttributeType>& fields) {
  Filter filter;
  for (absl::string_view expression : absl::StrSplit(expressions, "&&")) {
    TESSERA_ASSIGN_OR_RETURN(FilterCondition condition,
                             ParseFilterExpression(absl::StripAsciiWhitespace(expression), fields));
    filter.all_of.push_back(std::move(condition));
  }
  return filter;
}

std::string SearchResultToText(const SearchResult& result) {
  std::string text;
  // A grouped search: each group's value, then its hits' table.
  for (const SearchGroup& group : result.groups) {
    absl::StrAppend(&text, "group ", AttributeValueToString(group.value), "\n");
    SearchResult members;
    members.hits = group.hits;
    std::string table = SearchResultToText(members);
    table.erase(table.rfind('\n', table.size() - 2) + 1);  // its timings line
    text += table;
  }
  if (result.hits.empty() && result.groups.empty()) text += "no results\n";
  // Ids escaped for the terminal: a newline or an escape sequence in an id cannot forge a row.
  std::vector<std::string> ids;
  size_t id_width = 2;
  for (const SearchHit& hit : result.hits) {
    ids.push_back(TerminalSafe(hit.id));
    id_width = std::max(id_width, ids.back().size());
  }
  if (!result.hits.empty()) {
    text += absl::StrFormat("%4s  %-*s  %12s  %s\n", "rank", static_cast<int>(id_width), "id",
                            "score", "version");
  }
  for (size_t i = 0; i < result.hits.size(); ++i) {
    const SearchHit& hit = result.hits[i];
    text += absl::StrFormat("%4d  %-*s  %12.6f  %d", i + 1, static_cast<int>(id_width), ids[i],
                            hit.score, hit.version);
    for (const auto& [name, value] : hit.attributes) {
      absl::StrAppend(&text, "  ", TerminalSafe(name), "=", AttributeValueToString(value));
    }
    text += "\n";
    for (const TokenMatch& match : hit.explanation) {
      text += absl::StrFormat("        query token %d -> vector %d (tokens %s)  %.4f\n",
                              match.query_token, match.document_vector,
                              absl::StrJoin(match.covered_tokens, ","), match.similarity);
    }
  }
  text += absl::StrFormat(
      "%d documents scored%s; candidates %.3f ms, fetch %.3f ms, rerank %.3f ms, total %.3f ms\n",
      result.documents_scored, result.exhaustive ? " (exhaustive)" : "",
      result.timings.candidates_ms, result.timings.fetch_ms, result.timings.rerank_ms,
      result.timings.total_ms);
  if (!result.missing_shards.empty()) {
    absl::StrAppend(&text, "partial results: no replica answered for shard(s) ",
                    absl::StrJoin(result.missing_shards, ", "), "\n");
  }
  return text;
}

std::string StoredDocumentToText(const StoredDocument& document, bool with_vectors) {
  std::string text;
  absl::StrAppend(&text, "id          ", TerminalSafe(document.id), "\n");
  absl::StrAppend(&text, "version     ", document.version, "\n");
  absl::StrAppend(&text, "tokens      ", document.num_tokens, "\n");
  absl::StrAppend(&text, "vectors     ", document.num_vectors, " x ", document.dim, " (",
                  DtypeToString(document.stored_dtype), ")\n");
  absl::StrAppend(&text, "layout      ", DescribeLayout(document.layout), "\n");
  text += "attributes ";
  if (document.attributes.empty()) text += " none";
  for (const auto& [name, value] : document.attributes) {
    absl::StrAppend(&text, " ", TerminalSafe(name), "=", AttributeValueToString(value));
  }
  text += "\n";
  if (with_vectors) {
    for (uint32_t v = 0; v < document.num_vectors; ++v) {
      absl::StrAppend(&text, "[", v, "]");
      for (uint32_t c = 0; c < document.dim; ++c) {
        absl::StrAppend(
            &text, " ",
            DumpJson(JsonFloat(document.vectors[static_cast<size_t>(v) * document.dim + c])));
      }
      text += "\n";
    }
  }
  return text;
}

Json AttributesToJson(const Attributes& attributes) {
  Json json = Json::object();
  for (const auto& [name, value] : attributes) {
    if (const auto* i = std::get_if<int64_t>(&value)) {
      json[name] = *i;
    } else if (const auto* d = std::get_if<double>(&value)) {
      json[name] = *d;
    } else {
      json[name] = std::get<std::string>(value);
    }
  }
  return json;
}

namespace {

Json AttributeValueToJson(const AttributeValue& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return Json(*i);
  if (const auto* d = std::get_if<double>(&value)) return Json(*d);
  return Json(std::get<std::string>(value));
}

}  // namespace

Json SearchResultToJson(const SearchResult& result, bool explain) {
  Json results = Json::array();
  Json groups = Json::array();
  for (const SearchGroup& group : result.groups) {
    SearchResult members;
    members.hits = group.hits;
    Json entry = Json::object();
    entry["value"] = AttributeValueToJson(group.value);
    entry["results"] = SearchResultToJson(members, explain)["results"];
    groups.push_back(std::move(entry));
  }
  for (const SearchHit& hit : result.hits) {
    Json entry = Json::object();
    entry["id"] = hit.id;
    entry["score"] = JsonFloat(hit.score);
    entry["version"] = hit.version;
    if (hit.dense_score.has_value()) entry["dense_score"] = JsonFloat(*hit.dense_score);
    if (hit.sparse_score.has_value()) entry["sparse_score"] = JsonFloat(*hit.sparse_score);
    if (explain) {
      Json matches = Json::array();
      for (const TokenMatch& match : hit.explanation) {
        Json m = Json::object();
        m["query_token"] = match.query_token;
        m["document_vector"] = match.document_vector;
        m["similarity"] = JsonFloat(match.similarity);
        Json covered = Json::array();
        for (uint32_t token : match.covered_tokens) covered.push_back(token);
        m["covered_tokens"] = std::move(covered);
        matches.push_back(std::move(m));
      }
      entry["explanation"] = std::move(matches);
    }
    if (!hit.attributes.empty()) entry["attributes"] = AttributesToJson(hit.attributes);
    results.push_back(std::move(entry));
  }
  Json timings = Json::object();
  timings["candidates"] = result.timings.candidates_ms;
  timings["fetch"] = result.timings.fetch_ms;
  timings["rerank"] = result.timings.rerank_ms;
  timings["total"] = result.timings.total_ms;
  if (result.timings.fanout_ms > 0) timings["fanout"] = result.timings.fanout_ms;
  Json json = Json::object();
  json["results"] = std::move(results);
  if (!result.groups.empty()) json["groups"] = std::move(groups);
  json["timings_ms"] = std::move(timings);
  json["documents_scored"] = result.documents_scored;
  json["exhaustive"] = result.exhaustive;
  if (!result.missing_shards.empty()) {
    Json missing = Json::array();
    for (uint32_t shard : result.missing_shards) missing.push_back(shard);
    json["missing_shards"] = std::move(missing);
  }
  return json;
}

Json StoredDocumentToJson(const StoredDocument& document, bool with_vectors) {
  Json json = Json::object();
  json["id"] = document.id;
  json["version"] = document.version;
  json["num_tokens"] = document.num_tokens;
  json["num_vectors"] = document.num_vectors;
  json["dim"] = document.dim;
  json["dtype"] = DtypeToString(document.stored_dtype);
  json["attributes"] = AttributesToJson(document.attributes);
  if (document.layout.has_value()) {
    Json layout = Json::object();
    layout["rows"] = document.layout->rows;
    layout["cols"] = document.layout->cols;
    layout["prefix"] = document.layout->prefix_tokens;
    layout["suffix"] = document.layout->suffix_tokens;
    json["layout"] = std::move(layout);
  } else {
    json["layout"] = Json();
  }
  if (with_vectors) {
    Json vectors = Json::array();
    for (uint32_t v = 0; v < document.num_vectors; ++v) {
      Json row = Json::array();
      for (uint32_t c = 0; c < document.dim; ++c) {
        row.push_back(JsonFloat(document.vectors[static_cast<size_t>(v) * document.dim + c]));
      }
      vectors.push_back(std::move(row));
    }
    json["vectors"] = std::move(vectors);
    Json members = Json::array();
    for (size_t v = 0; v + 1 < document.member_offsets.size(); ++v) {
      Json covered = Json::array();
      for (uint32_t m = document.member_offsets[v];
           m < document.member_offsets[v + 1] && m < document.members.size(); ++m) {
        covered.push_back(document.members[m]);
      }
      members.push_back(std::move(covered));
    }
    json["members"] = std::move(members);
  }
  return json;
}

Json StatsToJson(const std::string& collection, const v1::CollectionStats& stats) {
  Json json = Json::object();
  json["collection"] = collection;
  json["documents"] = stats.documents();
  json["original_tokens"] = stats.original_tokens();
  json["rerank_vectors"] = stats.rerank_vectors();
  json["candidate_vectors"] = stats.candidate_vectors();
  json["disk_bytes"] = stats.disk_bytes();
  json["vectors_per_document"] = stats.vectors_per_document();
  json["disk_bytes_per_original_token"] = stats.disk_bytes_per_original_token();
  json["disk_bytes_per_rerank_vector"] = stats.disk_bytes_per_rerank_vector();
  Json indexes = Json::array();
  for (const std::string& index : stats.candidate_indexes()) indexes.push_back(index);
  json["candidate_indexes"] = std::move(indexes);
  json["resident_bytes"] = stats.resident_bytes();
  json["candidate_bytes"] = stats.candidate_bytes();
  json["training_shards"] = stats.training_shards();
  json["rerank_segments"] = stats.rerank_segments();
  json["rerank_segment_bytes"] = stats.rerank_segment_bytes();
  json["rerank_unflushed_bytes"] = stats.rerank_unflushed_bytes();
  json["code_segments"] = stats.code_segments();
  json["code_segment_bytes"] = stats.code_segment_bytes();
  json["code_unflushed_bytes"] = stats.code_unflushed_bytes();
  return json;
}

Json ShardsToJson(const std::vector<v1::ShardStatus>& shards) {
  Json list = Json::array();
  for (const v1::ShardStatus& shard : shards) {
    Json replicas = Json::array();
    for (const v1::ReplicaStatus& replica : shard.replicas()) {
      Json entry = Json::object();
      entry["node_id"] = replica.node_id();
      entry["address"] = replica.address();
      entry["state"] = replica.state();
      replicas.push_back(std::move(entry));
    }
    Json entry = Json::object();
    entry["shard"] = shard.shard();
    entry["replicas"] = std::move(replicas);
    list.push_back(std::move(entry));
  }
  return list;
}

Json SchemaToJson(const v1::CollectionSchema& schema) {
  Json json = Json::object();
  json["name"] = schema.name();
  json["dim"] = schema.dim();
  json["dtype"] = DtypeToString(schema.dtype());
  // Spatial pooling, hierarchical pooling, or both: spatial, then hierarchical over its vectors
  // (under "then").
  Json pooling = Json::object();
  auto hierarchical = [&schema](Json* out) {
    const v1::HierarchicalPooling& h = schema.hierarchical();
    (*out)["kind"] = "hierarchical";
    (*out)["method"] =
        h.method() == v1::HierarchicalPooling::METHOD_REFERENCE ? "reference" : "ward";
    (*out)["pool_factor"] = schema.has_hierarchical() ? h.pool_factor() : 2u;
    (*out)["protected_tokens"] = h.protected_tokens();
    (*out)["min_vectors"] = h.min_vectors();
    (*out)["max_merge_height"] = h.max_merge_height();
    (*out)["renormalize"] = h.renormalize();
  };
  if (schema.has_spatial()) {
    const v1::SpatialPooling& s = schema.spatial();
    pooling["kind"] = "spatial";
    pooling["mode"] = SpatialModeToString(s.mode());
    if (s.mode() == v1::SpatialPooling::MODE_TILES) {
      pooling["tile_rows"] = s.tile_rows();
      pooling["tile_cols"] = s.tile_cols();
    }
    if (s.mode() == v1::SpatialPooling::MODE_ROW_WINDOWS) {
      pooling["window_rows"] = s.window_rows();
      pooling["window_stride"] = s.window_stride();
    }
    pooling["keep_special_tokens"] = s.keep_special_tokens();
    pooling["renormalize"] = s.renormalize();
    if (schema.has_hierarchical()) {
      Json then = Json::object();
      hierarchical(&then);
      pooling["then"] = std::move(then);
    }
  } else {
    hierarchical(&pooling);
  }
  json["pooling"] = std::move(pooling);
  Json candidates = Json::object();
  candidates["kind"] =
      schema.candidates().kind() == v1::CandidateVectors::KIND_GLOBAL_MEAN ? "global" : "pooled";
  candidates["pool_factor"] = schema.candidates().pool_factor();
  candidates["factory"] = schema.candidates().factory();
  candidates["residual_bits"] = schema.candidates().residual_bits();
  candidates["centroid_min_vectors"] = schema.candidates().centroid_min_vectors();
  candidates["centroid_min_training_vectors"] = schema.candidates().centroid_min_training_vectors();
  candidates["rerank_from_codes"] = schema.candidates().rerank_from_codes();
  json["candidates"] = std::move(candidates);
  Json attributes = Json::object();
  std::map<std::string, v1::AttributeType> sorted(schema.attributes().begin(),
                                                  schema.attributes().end());
  for (const auto& [name, type] : sorted) attributes[name] = AttributeTypeToString(type);
  json["attributes"] = std::move(attributes);
  json["num_shards"] = schema.num_shards() == 0 ? 1u : schema.num_shards();
  return json;
}

std::string DescribeSchema(const v1::CollectionSchema& schema) {
  std::string text = absl::StrCat("dim ", schema.dim(), ", ", DtypeToString(schema.dtype()));
  if (schema.has_spatial()) {
    const v1::SpatialPooling& s = schema.spatial();
    absl::StrAppend(&text, ", spatial pooling ", SpatialModeToString(s.mode()));
    if (s.mode() == v1::SpatialPooling::MODE_TILES) {
      absl::StrAppend(&text, ":", s.tile_rows(), "x", s.tile_cols());
    }
    if (s.mode() == v1::SpatialPooling::MODE_ROW_WINDOWS) {
      absl::StrAppend(&text, ":", s.window_rows(), ":", s.window_stride());
    }
  }
  if (schema.has_hierarchical() || !schema.has_spatial()) {
    const v1::HierarchicalPooling& h = schema.hierarchical();
    absl::StrAppend(&text, schema.has_spatial() ? ", then " : ", ",
                    h.method() == v1::HierarchicalPooling::METHOD_REFERENCE ? "reference" : "ward",
                    " pooling p=", schema.has_hierarchical() ? h.pool_factor() : 2u);
    if (h.min_vectors() > 0) absl::StrAppend(&text, " (at least ", h.min_vectors(), " vectors)");
    if (h.max_merge_height() > 0) {
      absl::StrAppend(&text, " (merges up to height ", h.max_merge_height(), ")");
    }
  }
  const v1::CandidateVectors& c = schema.candidates();
  if (c.kind() == v1::CandidateVectors::KIND_GLOBAL_MEAN) {
    absl::StrAppend(&text, ", candidates global mean");
  } else {
    absl::StrAppend(&text, ", candidates pooled p=", c.pool_factor() == 0 ? 4u : c.pool_factor());
  }
  absl::StrAppend(&text, " (", c.factory().empty() ? "auto" : TerminalSafe(c.factory()), ")");
  const uint32_t shards = schema.num_shards() == 0 ? 1 : schema.num_shards();
  absl::StrAppend(&text, ", ", shards, shards == 1 ? " shard" : " shards");
  if (!schema.attributes().empty()) {
    std::map<std::string, v1::AttributeType> sorted(schema.attributes().begin(),
                                                    schema.attributes().end());
    std::vector<std::string> fields;
    for (const auto& [name, type] : sorted) {
      fields.push_back(absl::StrCat(TerminalSafe(name), ":", AttributeTypeToString(type)));
    }
    absl::StrAppend(&text, ", attributes ", absl::StrJoin(fields, " "));
  }
  if (schema.has_sparse()) {
    const v1::SparseField& sparse = schema.sparse();
    if (sparse.modifier() == v1::SparseField::MODIFIER_NONE) {
      absl::StrAppend(&text, ", sparse field (dot product)");
    } else {
      absl::StrAppend(&text, ", sparse field (BM25 k1 ", sparse.has_k1() ? sparse.k1() : 1.2, " b ",
                      sparse.has_b() ? sparse.b() : 0.75, ")");
    }
  }
  return text;
}

}  // namespace internal
}  // namespace tessera::client
