#include "index/collection/collection_impl.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "index/collection/schema_codec.h"
#include "index/common/file_io.h"
#include "tessera/float16.h"
#include "tessera/merge.h"
#include "tessera/status_macros.h"

namespace tessera::internal {
namespace {

using Clock = std::chrono::steady_clock;

double MillisecondsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Well-formed UTF-8 (no overlongs, no surrogates, ≤ U+10FFFF).
bool IsValidUtf8(const std::string& text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    int extra = 0;
    uint32_t code = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      extra = 1, code = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2, code = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3, code = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= n) return false;
    for (int k = 1; k <= extra; ++k) {
      if ((s[i + k] & 0xc0) != 0x80) return false;
      code = (code << 6) | (s[i + k] & 0x3f);
    }
    static constexpr uint32_t kMinimum[] = {0, 0x80, 0x800, 0x10000};
    if (code < kMinimum[extra] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

// The one check of vector values, for documents' tokens and queries alike: each of the `n` values
// (rows of `cols`) finite and within ±kMaxVectorValue, so that no MaxSim score can overflow.
// INVALID_ARGUMENT naming the value, its token and dimension, after the prefix `what`.
absl::Status CheckVectorValues(const float* values, int64_t n, int64_t cols,
                               absl::string_view what) {
  for (int64_t i = 0; i < n; ++i) {
    const float value = values[i];
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(absl::StrCat(what, "value ", value, " at token ", i / cols,
                                                     ", dimension ", i % cols, " is not finite"));
    }
    if (std::fabs(value) > kMaxVectorValue) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "value ", value, " at token ", i / cols, ", dimension ", i % cols,
                       " exceeds the largest magnitude accepted, ", kMaxVectorValue,
                       " (larger values can overflow MaxSim scores)"));
    }
  }
  return absl::OkStatus();
}

// Orders attribute values of one field (one type): int64 exactly, doubles, strings bytewise.
struct AttributeLess {
  bool operator()(const AttributeValue& a, const AttributeValue& b) const { return a < b; }
};

bool BetterHit(float a_score, const std::string& a_id, float b_score, const std::string& b_id) {
  return a_score != b_score ? a_score > b_score : a_id < b_id;
}

// `vector` with its terms in increasing index order (duplicates kept, for the validation to
// name). Vectors of mismatched lengths come back as they are, for the same reason.
SparseVector SortedSparse(const SparseVector& vector) {
  if (vector.indices.size() != vector.values.size() ||
      std::is_sorted(vector.indices.begin(), vector.indices.end())) {
    return vector;
  }
  std::vector<size_t> order(vector.indices.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return vector.indices[a] < vector.indices[b]; });
  SparseVector sorted;
  sorted.indices.reserve(order.size());
  sorted.values.reserve(order.size());
  for (size_t i : order) {
    sorted.indices.push_back(vector.indices[i]);
    sorted.values.push_back(vector.values[i]);
  }
  return sorted;
}

}  // namespace

struct CollectionImpl::Scored {
  float score = 0.0f;
  int shard = 0;
  uint64_t iid = 0;
  std::string id;
  uint64_t version = 0;
  std::vector<int32_t> best_tokens;  // when explaining
  std::vector<float> vectors;        // when explaining: the rerank vectors, fp32
  Attributes attributes;             // with_attributes or group_by: read with id and version
};

CollectionImpl::CollectionImpl(std::string dir, CollectionSchema schema, CollectionContext context)
    : dir_(std::move(dir)), schema_(std::move(schema)), context_(std::move(context)) {}

namespace {

// Documents scored per batch by the exhaustive ranks (RankExactly, RankGroups): bounded memory.
constexpr size_t kRankBatchDocuments = 4096;

std::string ShardDirectory(const std::string& dir, int shard) {
  char name[32];
  std::snprintf(name, sizeof(name), "/shard-%03d", shard);
  return dir + name;
}

// The collection's sink with the fields collection and shard put first on every line.
LogSink ShardLog(LogSink log, const std::string& collection, int shard) {
  return [log = std::move(log), collection, shard = std::to_string(shard)](const LogRecord& in) {
    LogRecord record;
    record.severity = in.severity;
    record.message = in.message;
    record.fields.reserve(in.fields.size() + 2);
    record.fields.emplace_back("collection", collection);
    record.fields.emplace_back("shard", shard);
    record.fields.insert(record.fields.end(), in.fields.begin(), in.fields.end());
    Log(log, record);
  };
}

}  // namespace

absl::StatusOr<std::shared_ptr<CollectionImpl>> CollectionImpl::Open(const std::string& dir,
                                                                     const CollectionSchema& schema,
                                                                     CollectionContext context) {
  std::shared_ptr<CollectionImpl> collection(new CollectionImpl(dir, schema, std::move(context)));
  const std::string encoded = EncodeSchema(schema);
  for (int s = 0; s < schema.num_shards; ++s) {
    ShardStoreOptions store_options = collection->context_.store_options;
    store_options.log = ShardLog(collection->context_.log, schema.name, s);
    TESSERA_ASSIGN_OR_RETURN(
        std::unique_ptr<Shard> shard,
        Shard::Open(ShardDirectory(dir, s), schema, store_options,
                    collection->context_.resident_rerank_bytes, collection->context_.pool));
    auto stored = shard->GetMeta("schema");
    // Compared decoded, so that a schema written before a field existed matches its defaults.
    absl::StatusOr<CollectionSchema> stored_schema =
        stored.ok() ? DecodeSchema(*stored) : absl::StatusOr<CollectionSchema>(stored.status());
    // A collection restored from a snapshot under a new name keeps its shards' stored schema,
    // which names the source: the name is the only field allowed to differ (rewritten below).
    const bool renamed = stored_schema.ok() && stored_schema->name != schema.name;
    if (renamed) stored_schema->name = schema.name;
    if (stored.ok() && (!stored_schema.ok() || EncodeSchema(*stored_schema) != encoded)) {
      return absl::DataLossError(absl::StrCat("collection '", schema.name, "' shard ", s,
                                              ": its stored schema differs from ", dir, "/schema"));
    }
    if (!stored.ok() || renamed) TESSERA_RETURN_IF_ERROR(shard->PutMeta("schema", encoded));
    collection->shards_.push_back(std::move(shard));
  }
  return collection;
}

CollectionImpl::~CollectionImpl() {
  if (!dropped_.load(std::memory_order_acquire)) return;
  shards_.clear();  // close the databases before removing their files
  std::error_code ignored;
  std::filesystem::remove_all(dropped_dir_, ignored);
}

void CollectionImpl::SetTrainingHookForTesting(const std::function<void()>& hook) {
  for (const auto& shard : shards_) shard->SetTrainingHookForTesting(hook);
}

void CollectionImpl::WaitForTrainingForTesting() const {
  for (const auto& shard : shards_) shard->WaitForTrainingForTesting();
}

void CollectionImpl::SetCodeReadHookForTesting(int s, std::function<void()> hook) {
  shards_[s]->SetCodeReadHookForTesting(std::move(hook));
}

std::shared_ptr<const CentroidCodebook> CollectionImpl::CodebookForTesting(int s) const {
  return shards_[s]->CodebookForTesting();
}

void CollectionImpl::MarkDropped(std::string moved_dir) {
  dropped_dir_ = std::move(moved_dir);
  dropped_.store(true, std::memory_order_release);
}

absl::Status CollectionImpl::ValidateId(const std::string& id) const {
  if (id.empty()) return absl::InvalidArgumentError("document id is empty");
  if (static_cast<int64_t>(id.size()) > context_.limits.max_id_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "document id of ", id.size(), " bytes, expected at most ", context_.limits.max_id_bytes));
  }
  if (!IsValidUtf8(id)) return absl::InvalidArgumentError("document id is not valid UTF-8");
  return absl::OkStatus();
}

absl::Status CollectionImpl::ValidateDocument(const Document& document) const {
  const CollectionLimits& limits = context_.limits;
  TESSERA_RETURN_IF_ERROR(ValidateId(document.id));
  const std::string what = absl::StrCat("document ", QuotedForMessage(document.id), ": ");
  if (document.dim != schema_.dim) {
    return absl::InvalidArgumentError(absl::StrCat(what, "dim ", document.dim, ", collection '",
                                                   schema_.name, "' expects ", schema_.dim));
  }
  if (document.num_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "num_tokens ", document.num_tokens, ", expected at least 1"));
  }
  if (document.num_tokens > limits.max_tokens_per_document) {
    return absl::InvalidArgumentError(absl::StrCat(what, "num_tokens ", document.num_tokens,
                                                   " exceeds the limit of ",
                                                   limits.max_tokens_per_document));
  }
  if (static_cast<int64_t>(document.tokens.size()) != document.num_tokens * document.dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, document.tokens.size(),
        " token values, expected num_tokens × dim = ", document.num_tokens * document.dim));
  }
  TESSERA_RETURN_IF_ERROR(CheckVectorValues(document.tokens.data(),
                                            static_cast<int64_t>(document.tokens.size()),
                                            document.dim, absl::StrCat(what, "tokens: ")));
  if (schema_.pooling.spatial.has_value() && !document.layout.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(what, "no patch grid layout, but collection '",
                                                   schema_.name, "' pools spatially"));
  }
  if (document.sparse.has_value()) {
    if (!schema_.sparse.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, "sparse vector of ", document.sparse->indices.size(), " terms, but collection '",
          schema_.name, "' declares no sparse field (create it with one to store them)"));
    }
    TESSERA_RETURN_IF_ERROR(
        ValidateSparseVector(SortedSparse(*document.sparse).view(), absl::StrCat(what, "sparse")));
  }
  for (const auto& [field, value] : document.attributes) {
    const auto declared = schema_.attributes.find(field);
    if (declared == schema_.attributes.end()) {
      return absl::InvalidArgumentError(absl::StrCat(what, "attribute ", QuotedForMessage(field),
                                                     " is not a field of collection '",
                                                     schema_.name, "'"));
    }
    const AttributeType type = TypeOf(value);
    const bool compatible =
        type == declared->second ||
        (type == AttributeType::kInt64 && declared->second == AttributeType::kDouble);
    if (!compatible) {
      return absl::InvalidArgumentError(absl::StrCat(what, "attribute '", field, "' is ",
                                                     AttributeTypeName(type), ", expected ",
                                                     AttributeTypeName(declared->second)));
    }
    // NaN would match no filter correctly and ±inf no JSON carries: data are finite numbers.
    if (type == AttributeType::kDouble && !std::isfinite(std::get<double>(value))) {
      return absl::InvalidArgumentError(absl::StrCat(what, "attribute '", field, "' is ",
                                                     std::get<double>(value),
                                                     ", expected a finite number"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardWrite> CollectionImpl::PrepareWrite(const Document& document) const {
  const FloatMatrixView tokens{document.tokens.data(), document.num_tokens, document.dim};
  absl::StatusOr<PooledMatrix> pooled = PoolDocument(tokens, document.layout, schema_.pooling);
  if (!pooled.ok()) {
    return absl::Status(
        pooled.status().code(),
        absl::StrCat("document ", QuotedForMessage(document.id), ": ", pooled.status().message()));
  }
  if (pooled->num_vectors() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("document ", QuotedForMessage(document.id), ": pooling left no vectors"));
  }
  ShardWrite shard_write;
  DocumentWrite& write = shard_write.document;
  write.record.external_id = document.id;
  write.record.num_tokens = document.num_tokens;
  write.record.layout = document.layout;
  write.record.attributes = document.attributes;
  for (auto& [field, value] : write.record.attributes) {
    if (schema_.attributes.at(field) == AttributeType::kDouble &&
        std::holds_alternative<int64_t>(value)) {
      value = static_cast<double>(std::get<int64_t>(value));
    }
  }
  if (document.sparse.has_value()) write.record.sparse = SortedSparse(*document.sparse);
  write.record.member_offsets = std::move(pooled->member_offsets);
  write.record.members = std::move(pooled->members);
  write.rerank =
      MatrixFromFloat(pooled->vectors, pooled->num_vectors(), pooled->dim, schema_.dtype);
  // The shard's stage 1 derives its payload from the vectors as pooled.
  shard_write.pooled = std::move(pooled->vectors);
  return shard_write;
}

std::vector<UpsertOutcome> CollectionImpl::Upsert(std::vector<Document> documents) {
  const int64_t n = static_cast<int64_t>(documents.size());
  std::vector<UpsertOutcome> outcomes(n);
  std::vector<std::optional<ShardWrite>> writes(n);
  // Validate and pool on the shared pool (pooling is the expensive part of ingest).
  context_.pool->ParallelFor(n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      absl::Status status = ValidateDocument(documents[i]);
      if (status.ok()) {
        absl::StatusOr<ShardWrite> write = PrepareWrite(documents[i]);
        if (write.ok()) {
          outcomes[i].num_vectors = write->document.rerank.rows;
          writes[i] = std::move(*write);
        } else {
          status = write.status();
        }
      }
      outcomes[i].status = status;
    }
  });
  // One durable write per shard.
  ReaderMutexLock cut(&cut_mu_);
  std::vector<std::vector<int64_t>> by_shard(shards_.size());
  for (int64_t i = 0; i < n; ++i) {
    if (writes[i].has_value()) by_shard[ShardOf(documents[i].id, schema_.num_shards)].push_back(i);
  }
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (by_shard[s].empty()) continue;
    std::vector<ShardWrite> shard_writes;
    shard_writes.reserve(by_shard[s].size());
    for (int64_t i : by_shard[s]) shard_writes.push_back(std::move(*writes[i]));
    absl::StatusOr<WriteResult> result = shards_[s]->Apply(std::move(shard_writes), {});
    if (!result.ok()) LogWriteFailure(s, "upsert", by_shard[s].size(), result.status());
    for (size_t j = 0; j < by_shard[s].size(); ++j) {
      UpsertOutcome& outcome = outcomes[by_shard[s][j]];
      if (result.ok()) {
        outcome.version = result->versions[j];
      } else {
        outcome.status = result.status();
        outcome.num_vectors = 0;
      }
    }
  }
  return outcomes;
}

void CollectionImpl::LogWriteFailure(size_t shard, const char* operation, size_t documents,
                                     const absl::Status& status) const {
  // A batch the shard refused as a whole for what a document holds is the client's error.
  const LogSeverity severity =
      absl::IsInvalidArgument(status) ? LogSeverity::kWarning : LogSeverity::kError;
  Log(context_.log, {severity,
                     "write failed",
                     {{"collection", schema_.name},
                      {"shard", std::to_string(shard)},
                      {"operation", operation},
                      {"documents", std::to_string(documents)},
                      {"code", absl::StatusCodeToString(status.code())},
                      {"error", std::string(status.message())}}});
}

absl::StatusOr<std::vector<bool>> CollectionImpl::Delete(const std::vector<std::string>& ids) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const absl::Status valid = ValidateId(ids[i]);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("ids[", i, "]: ", valid.message()));
    }
  }
  std::vector<bool> existed(ids.size(), false);
  ReaderMutexLock cut(&cut_mu_);
  std::vector<std::vector<size_t>> by_shard(shards_.size());
  for (size_t i = 0; i < ids.size(); ++i)
    by_shard[ShardOf(ids[i], schema_.num_shards)].push_back(i);
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (by_shard[s].empty()) continue;
    std::vector<std::string> shard_ids;
    for (size_t i : by_shard[s]) shard_ids.push_back(ids[i]);
    absl::StatusOr<WriteResult> result = shards_[s]->Apply({}, shard_ids);
    if (!result.ok()) {
      LogWriteFailure(s, "delete", shard_ids.size(), result.status());
      return result.status();
    }
    for (size_t j = 0; j < by_shard[s].size(); ++j) {
      existed[by_shard[s][j]] = result->deleted_iids[j] != 0;
    }
  }
  return existed;
}

absl::StatusOr<int64_t> CollectionImpl::DeleteMatching(const Filter& filter) {
  if (filter.empty()) {
    return absl::InvalidArgumentError(
        "filter: empty, expected at least one condition (deleting every document is dropping "
        "the collection)");
  }
  TESSERA_RETURN_IF_ERROR(ValidateFilter(filter, schema_.attributes));
  ReaderMutexLock cut(&cut_mu_);
  int64_t deleted = 0;
  for (size_t s = 0; s < shards_.size(); ++s) {
    std::vector<std::string> ids;
    shards_[s]->ForEachLive(filter, [&ids](uint64_t, const LiveDocument& document) {
      ids.push_back(document.external_id);
    });
    if (ids.empty()) continue;
    absl::StatusOr<WriteResult> result = shards_[s]->Apply({}, ids);
    if (!result.ok()) {
      LogWriteFailure(s, "delete by filter", ids.size(), result.status());
      return result.status();
    }
    for (uint64_t iid : result->deleted_iids) deleted += iid != 0 ? 1 : 0;
  }
  return deleted;
}

absl::StatusOr<int64_t> CollectionImpl::Count(const Filter& filter) const {
  TESSERA_RETURN_IF_ERROR(ValidateFilter(filter, schema_.attributes));
  int64_t count = 0;
  for (const auto& shard : shards_) {
    if (filter.empty()) {
      count += shard->num_documents();
      continue;
    }
    shard->ForEachLive(filter, [&count](uint64_t, const LiveDocument&) { ++count; });
  }
  return count;
}

absl::StatusOr<ScrollPage> CollectionImpl::Scroll(const ScrollOptions& options) const {
  TESSERA_RETURN_IF_ERROR(ValidateFilter(options.filter, schema_.attributes));
  TESSERA_RETURN_IF_ERROR(ValidateAttributeFields(options.attribute_fields));
  if (options.limit < 1 || options.limit > context_.limits.max_scroll_limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit ", options.limit, ", expected 1 … ", context_.limits.max_scroll_limit));
  }
  // The first limit + 1 ids after the cursor over all shards (one more tells whether the page
  // reached the end); a heap of the smallest keeps memory at the page's size.
  const auto keep = static_cast<size_t>(options.limit) + 1;
  auto by_id = [](const ScrolledDocument& a, const ScrolledDocument& b) { return a.id < b.id; };
  std::vector<ScrolledDocument> page;
  for (const auto& shard : shards_) {
    shard->ForEachLive(options.filter, [&](uint64_t, const LiveDocument& document) {
      if (document.external_id <= options.after && !options.after.empty()) return;
      if (page.size() == keep && !(document.external_id < page.front().id)) return;
      ScrolledDocument entry;
      entry.id = document.external_id;
      entry.version = document.version;
      if (options.with_attributes) {
        entry.attributes = SelectAttributes(document.attributes, options.attribute_fields);
      }
      page.push_back(std::move(entry));
      std::push_heap(page.begin(), page.end(), by_id);
      if (page.size() > keep) {
        std::pop_heap(page.begin(), page.end(), by_id);
        page.pop_back();
      }
    });
  }
  std::sort_heap(page.begin(), page.end(), by_id);
  ScrollPage result;
  if (page.size() == keep) {
    page.pop_back();
    result.next_after = page.back().id;
  }
  result.documents = std::move(page);
  return result;
}

absl::StatusOr<StoredDocument> CollectionImpl::Get(const std::string& id,
                                                   const GetOptions& options) const {
  TESSERA_RETURN_IF_ERROR(ValidateId(id));
  const Shard& shard = *shards_[ShardOf(id, schema_.num_shards)];
  absl::StatusOr<uint64_t> iid = shard.LookupId(id);
  if (absl::IsNotFound(iid.status())) {
    return absl::NotFoundError(absl::StrCat("document ", QuotedForMessage(id),
                                            " not found in collection '", schema_.name, "'"));
  }
  TESSERA_RETURN_IF_ERROR(iid.status());
  TESSERA_ASSIGN_OR_RETURN(DocumentRecord record, shard.GetRecord(*iid));
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<const StoredMatrix>> fetched,
                           shard.FetchRerank({*iid}));
  if (fetched[0] == nullptr) {
    return absl::NotFoundError(absl::StrCat("document ", QuotedForMessage(id),
                                            " not found in collection '", schema_.name, "'"));
  }
  const StoredMatrix& rerank = *fetched[0];
  StoredDocument document;
  document.id = std::move(record.external_id);
  document.version = record.version;
  document.num_tokens = record.num_tokens;
  document.layout = record.layout;
  document.attributes = std::move(record.attributes);
  document.dtype = rerank.dtype;
  document.dim = rerank.cols;
  if (options.stored_bytes) {
    document.vector_bytes = rerank.bytes;
  } else {
    document.vectors = MatrixToFloat(rerank);
  }
  document.member_offsets = std::move(record.member_offsets);
  document.members = std::move(record.members);
  document.sparse = std::move(record.sparse);
  return document;
}

absl::Status CollectionImpl::ValidateQuery(FloatMatrixView query,
                                           const SearchOptions& options) const {
  const CollectionLimits& limits = context_.limits;
  if (query.rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("query: ", query.rows, " tokens, expected at least 1"));
  }
  if (query.data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("query: ", query.rows, " tokens without data, expected rows × dim floats"));
  }
  if (query.rows > limits.max_query_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "query: ", query.rows, " tokens exceeds the limit of ", limits.max_query_tokens));
  }
  if (query.cols != schema_.dim) {
    return absl::InvalidArgumentError(absl::StrCat("query: dim ", query.cols, ", collection '",
                                                   schema_.name, "' expects ", schema_.dim));
  }
  TESSERA_RETURN_IF_ERROR(
      CheckVectorValues(query.data, query.rows * query.cols, query.cols, "query: "));
  // The one check of k and num_candidates against the limits, for the server as for embedded
  // callers.
  if (options.k < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("k ", options.k, ", expected 1 … ", limits.max_k));
  }
  if (options.k > limits.max_k) {
    return absl::InvalidArgumentError(
        absl::StrCat("k ", options.k, " exceeds the limit of ", limits.max_k));
  }
  if (options.num_candidates > limits.max_num_candidates) {
    return absl::InvalidArgumentError(absl::StrCat("num_candidates ", options.num_candidates,
                                                   " exceeds the limit of ",
                                                   limits.max_num_candidates));
  }
  if (options.num_candidates != 0 && options.num_candidates < options.k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_candidates ", options.num_candidates, " is below k ", options.k, ", expected ",
        options.k, " … ", limits.max_num_candidates, " or 0 (the default)"));
  }
  if (options.per_token_candidates < 0 || options.per_token_candidates > 100000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "per_token_candidates ", options.per_token_candidates, ", expected 0 … 100000"));
  }
  if (options.nprobe < 0 || options.nprobe > kMaxNprobe) {
    return absl::InvalidArgumentError(
        absl::StrCat("nprobe ", options.nprobe, ", expected 0 … ", kMaxNprobe));
  }
  if (options.whole_shards != 0 &&
      (options.whole_shards < schema_.num_shards || options.whole_shards > kMaxShards)) {
    return absl::InvalidArgumentError(absl::StrCat("whole_shards ", options.whole_shards,
                                                   ", expected 0 or ", schema_.num_shards, " … ",
                                                   kMaxShards));
  }
  TESSERA_RETURN_IF_ERROR(ValidateFilter(options.filter, schema_.attributes));
  TESSERA_RETURN_IF_ERROR(ValidateAttributeFields(options.attribute_fields));
  if (!options.group_by.empty()) {
    if (schema_.attributes.count(options.group_by) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("group_by: unknown field ", QuotedForMessage(options.group_by),
                       ", expected one of the collection's attribute fields"));
    }
    if (options.group_size < 1 || options.group_size > limits.max_group_size) {
      return absl::InvalidArgumentError(absl::StrCat("group_size ", options.group_size,
                                                     ", expected 1 … ", limits.max_group_size));
    }
    if (options.groups < 0 || options.groups > limits.max_k) {
      return absl::InvalidArgumentError(
          absl::StrCat("groups ", options.groups, ", expected 1 … ", limits.max_k, " or 0 (k)"));
    }
    if (options.explain) {
      return absl::InvalidArgumentError(
          "explain with group_by: explain is for a plain search, expected one of the two");
    }
  }
  return absl::OkStatus();
}

absl::Status CollectionImpl::ValidateAttributeFields(const std::vector<std::string>& fields) const {
  for (size_t i = 0; i < fields.size(); ++i) {
    if (schema_.attributes.count(fields[i]) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("attribute_fields[", i, "]: unknown field ", QuotedForMessage(fields[i]),
                       ", expected one of the collection's attribute fields"));
    }
  }
  return absl::OkStatus();
}

int64_t CollectionImpl::HitsWanted(const SearchOptions& options) {
  if (options.group_by.empty()) return options.k;
  return (options.groups > 0 ? options.groups : options.k) * options.group_size;
}

CollectionImpl::SearchPlan CollectionImpl::Plan(const SearchOptions& options) const {
  // ValidateQuery has bounded k, N, k′ and nprobe by the (int) limits; a grouped search's hits
  // by max_k × max_group_size.
  const int k =
      static_cast<int>(std::min<int64_t>(HitsWanted(options), context_.limits.max_num_candidates));
  const int64_t whole_shards =
      options.whole_shards > 0 ? options.whole_shards : static_cast<int64_t>(shards_.size());
  SearchPlan plan;
  plan.nprobe = static_cast<int>(options.nprobe);  // 0: each shard's index picks (DefaultNprobe)
  for (const auto& shard : shards_) {
    ShardPlan shard_plan;
    if (options.num_candidates > 0) {
      shard_plan.num_candidates = static_cast<int>(options.num_candidates);
    } else {
      shard_plan.num_candidates =
          std::min(context_.limits.max_num_candidates, shard->DefaultNumCandidates(k));
    }
    shard_plan.share =
        static_cast<int>((shard_plan.num_candidates + whole_shards - 1) / whole_shards);
    // Left to its defaults, a small shard is scored exhaustively (a caller who sets N, k′ or
    // nprobe is tuning the cascade: it runs).
    shard_plan.every_document =
        options.num_candidates == 0 && options.per_token_candidates == 0 && options.nprobe == 0 &&
        shard->num_documents() <= kExhaustiveDefaultShareMultiple * int64_t{shard_plan.share};
    shard_plan.per_token = options.per_token_candidates > 0
                               ? static_cast<int>(options.per_token_candidates)
                               : std::max(shard_plan.num_candidates, 64);
    plan.shards.push_back(shard_plan);
  }
  return plan;
}

absl::StatusOr<std::optional<std::vector<uint64_t>>> CollectionImpl::NominateCandidates(
    FloatMatrixView query, size_t s, const SearchPlan& plan, const SearchOptions& options,
    CentroidScoreTable* centroid_scores) const {
  const ShardPlan& shard_plan = plan.shards[s];
  Stage1Request request;
  request.query = query;
  request.num_documents = shard_plan.num_candidates;
  request.per_token = shard_plan.per_token;
  request.nprobe = plan.nprobe;
  request.filter = &options.filter;
  if (schema_.candidates.rerank_from_codes) request.centroid_scores = centroid_scores;
  TESSERA_ASSIGN_OR_RETURN(std::vector<Stage1Hit> nominees, shards_[s]->SearchCandidates(request));
  // Too few nominees (a selective filter): the caller scores every matching document of the
  // shard, so that k matching documents always yield k results.
  if (static_cast<int64_t>(nominees.size()) <
      std::min<int64_t>(HitsWanted(options), shards_[s]->num_documents())) {
    return std::nullopt;
  }
  const auto keep = static_cast<size_t>(shard_plan.share);
  if (nominees.size() > keep) {
    // The keep best scores, then the documents tied at the cut by external id: iids differ
    // between replicas, ids do not. Ties are rare, so ids are looked up only for them.
    std::nth_element(nominees.begin(), nominees.begin() + (keep - 1), nominees.end(),
                     [](const Stage1Hit& a, const Stage1Hit& b) { return a.score > b.score; });
    const float cut = nominees[keep - 1].score;
    const auto tied_begin = std::partition(nominees.begin(), nominees.end(),
                                           [cut](const Stage1Hit& n) { return n.score > cut; });
    const auto tied_end = std::partition(tied_begin, nominees.end(),
                                         [cut](const Stage1Hit& n) { return n.score == cut; });
    const auto wanted = static_cast<size_t>(nominees.begin() + keep - tied_begin);
    if (static_cast<size_t>(tied_end - tied_begin) > wanted) {
      struct Tied {
        bool gone = false;  // deleted since stage 1: last, the rerank would skip it anyway
        std::string id;
        Stage1Hit nominee;
      };
      std::vector<uint64_t> tied_iids;
      for (auto it = tied_begin; it != tied_end; ++it) tied_iids.push_back(it->iid);
      std::vector<std::optional<LiveEntry>> described =
          shards_[s]->Describe(tied_iids, /*want_attributes=*/false);
      std::vector<Tied> tied;
      for (auto it = tied_begin; it != tied_end; ++it) {
        std::optional<LiveEntry>& found = described[it - tied_begin];
        tied.push_back(
            Tied{!found.has_value(), found.has_value() ? std::move(found->external_id) : "", *it});
      }
      std::sort(tied.begin(), tied.end(), [](const Tied& a, const Tied& b) {
        return a.gone != b.gone ? b.gone : a.id < b.id;
      });
      for (size_t i = 0; i < wanted; ++i) tied_begin[static_cast<ptrdiff_t>(i)] = tied[i].nominee;
    }
    nominees.resize(keep);
  }
  std::vector<uint64_t> iids;
  iids.reserve(nominees.size());
  for (const Stage1Hit& nominee : nominees) iids.push_back(nominee.iid);
  return iids;
}

absl::Status CollectionImpl::ScoreDocuments(FloatMatrixView query, bool want_best_tokens,
                                            bool want_attributes,
                                            const std::vector<std::pair<int, uint64_t>>& documents,
                                            const std::vector<CentroidScoreTable>* centroid_scores,
                                            std::vector<Scored>* scored,
                                            SearchTimings* timings) const {
  // Fetch the rerank vectors per shard (resident ones from memory) with each document's id,
  // version and attributes (one pass of the shard's table: a hit is described as it was scored),
  // and the codes of documents stored as codes only (rerank_from_codes); documents replaced or
  // deleted since stage 1 come back null (or without codes) and are skipped.
  Clock::time_point start = Clock::now();
  std::vector<std::vector<uint64_t>> by_shard(shards_.size());
  for (const auto& [shard, iid] : documents) by_shard[shard].push_back(iid);
  std::vector<RankingDocument> fetched_documents;
  std::vector<std::pair<int, uint64_t>> fetched;
  fetched_documents.reserve(documents.size());
  fetched.reserve(documents.size());
  std::vector<std::vector<uint64_t>> coded_iids(shards_.size());
  std::vector<std::vector<RankingDocument>> coded_documents(shards_.size());
  std::vector<Shard::CodedDocuments> coded(shards_.size());
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (by_shard[s].empty()) continue;
    TESSERA_ASSIGN_OR_RETURN(std::vector<RankingDocument> batch,
                             shards_[s]->FetchForRanking(by_shard[s], want_attributes));
    for (size_t j = 0; j < batch.size(); ++j) {
      if (batch[j].rerank == nullptr) continue;
      if (batch[j].rerank->rows == 0) {
        coded_iids[s].push_back(by_shard[s][j]);
        coded_documents[s].push_back(std::move(batch[j]));
        continue;
      }
      fetched_documents.push_back(std::move(batch[j]));
      fetched.emplace_back(static_cast<int>(s), by_shard[s][j]);
    }
    if (!coded_iids[s].empty()) {
      TESSERA_ASSIGN_OR_RETURN(coded[s], shards_[s]->FetchCodes(coded_iids[s]));
    }
  }
  timings->fetch_ms += MillisecondsSince(start);

  start = Clock::now();
  auto add = [&](int shard, uint64_t iid, float score, RankingDocument& document, Scored* entry) {
    entry->score = score;
    entry->shard = shard;
    entry->iid = iid;
    entry->id = std::move(document.external_id);
    entry->version = document.version;
    entry->attributes = std::move(document.attributes);
    scored->push_back(std::move(*entry));
  };
  if (!fetched_documents.empty()) {
    std::vector<DocumentRef> refs(fetched_documents.size());
    for (size_t d = 0; d < fetched_documents.size(); ++d) {
      const StoredMatrixView& rerank = *fetched_documents[d].rerank;
      refs[d] = DocumentRef{rerank.bytes.data(), rerank.rows};
    }
    DocumentBatch batch{schema_.dtype, schema_.dim, refs};
    MaxSimOptions options;
    options.want_best_tokens = want_best_tokens;
    TESSERA_ASSIGN_OR_RETURN(MaxSimResult result, context_.scorer->Score(query, batch, options));
    for (size_t d = 0; d < fetched_documents.size(); ++d) {
      Scored entry;
      if (want_best_tokens) {
        entry.best_tokens.assign(result.best_tokens.begin() + d * query.rows,
                                 result.best_tokens.begin() + (d + 1) * query.rows);
        entry.vectors = MatrixToFloat(*fetched_documents[d].rerank);
      }
      add(fetched[d].first, fetched[d].second, result.scores[d], fetched_documents[d], &entry);
    }
  }
  // Documents stored as codes only: scored from the codes, merged into the same ranking.
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (coded_iids[s].empty()) continue;
    TESSERA_ASSIGN_OR_RETURN(
        const std::vector<std::optional<float>> scores,
        shards_[s]->ScoreCodes(query, coded[s],
                               centroid_scores != nullptr ? &(*centroid_scores)[s] : nullptr));
    for (size_t j = 0; j < scores.size(); ++j) {
      if (!scores[j].has_value()) continue;
      Scored entry;
      add(static_cast<int>(s), coded_iids[s][j], *scores[j], coded_documents[s][j], &entry);
    }
  }
  timings->rerank_ms += MillisecondsSince(start);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CollectionImpl::Scored>> CollectionImpl::RankExactly(
    FloatMatrixView query, const std::vector<std::pair<int, uint64_t>>& selected,
    const std::vector<CentroidScoreTable>& centroid_scores, const SearchOptions& options,
    SearchResult* result) const {
  // Exact MaxSim in chunks (bounded memory for exhaustive scans), keeping the best k.
  auto better = [](const Scored& a, const Scored& b) {
    return a.score != b.score ? a.score > b.score : a.id < b.id;
  };
  std::vector<Scored> top;
  for (size_t begin = 0; begin < selected.size(); begin += kRankBatchDocuments) {
    if (Clock::now() > options.deadline) {
      return absl::DeadlineExceededError("search deadline passed during exact scoring");
    }
    const std::vector<std::pair<int, uint64_t>> chunk(
        selected.begin() + begin,
        selected.begin() + std::min(selected.size(), begin + kRankBatchDocuments));
    TESSERA_RETURN_IF_ERROR(ScoreDocuments(query, options.explain, options.with_attributes, chunk,
                                           &centroid_scores, &top, &result->timings));
    result->documents_scored += static_cast<int64_t>(chunk.size());
    if (top.size() > static_cast<size_t>(options.k)) {
      std::partial_sort(top.begin(), top.begin() + options.k, top.end(), better);
      top.resize(options.k);
    }
  }
  std::sort(top.begin(), top.end(), better);
  if (top.size() > static_cast<size_t>(options.k)) top.resize(options.k);
  return top;
}

absl::StatusOr<std::vector<CollectionImpl::ScoredGroup>> CollectionImpl::RankGroups(
    FloatMatrixView query, const std::vector<std::pair<int, uint64_t>>& selected,
    const std::vector<CentroidScoreTable>& centroid_scores, const SearchOptions& options,
    SearchResult* result) const {
  auto better = [](const Scored& a, const Scored& b) {
    return BetterHit(a.score, a.id, b.score, b.id);
  };
  const auto group_size = static_cast<size_t>(options.group_size);
  // Every group's best group_size so far, by value (bounded memory: each chunk's hits are folded
  // in before the next is scored).
  std::map<AttributeValue, std::vector<Scored>, AttributeLess> by_value;
  std::vector<Scored> scored;
  for (size_t begin = 0; begin < selected.size(); begin += kRankBatchDocuments) {
    if (Clock::now() > options.deadline) {
      return absl::DeadlineExceededError("search deadline passed during exact scoring");
    }
    const std::vector<std::pair<int, uint64_t>> chunk(
        selected.begin() + begin,
        selected.begin() + std::min(selected.size(), begin + kRankBatchDocuments));
    scored.clear();
    TESSERA_RETURN_IF_ERROR(ScoreDocuments(query, /*want_best_tokens=*/false,
                                           /*want_attributes=*/true, chunk, &centroid_scores,
                                           &scored, &result->timings));
    result->documents_scored += static_cast<int64_t>(chunk.size());
    for (Scored& entry : scored) {
      const auto value = entry.attributes.find(options.group_by);
      if (value == entry.attributes.end()) continue;  // in no group
      std::vector<Scored>& members = by_value[value->second];
      members.push_back(std::move(entry));
      if (members.size() > 2 * group_size) {
        std::partial_sort(members.begin(), members.begin() + group_size, members.end(), better);
        members.resize(group_size);
      }
    }
  }
  std::vector<ScoredGroup> groups;
  groups.reserve(by_value.size());
  for (auto& [value, members] : by_value) {
    std::sort(members.begin(), members.end(), better);
    if (members.size() > group_size) members.resize(group_size);
    groups.push_back(ScoredGroup{value, std::move(members)});
  }
  // The best groups by their best hit; a part of a collection returns them all (MergeGroups).
  std::sort(groups.begin(), groups.end(), [&](const ScoredGroup& a, const ScoredGroup& b) {
    return better(a.hits[0], b.hits[0]);
  });
  const int64_t wanted = options.groups > 0 ? options.groups : options.k;
  if (options.whole_shards == 0 && static_cast<int64_t>(groups.size()) > wanted) {
    groups.resize(static_cast<size_t>(wanted));
  }
  return groups;
}

absl::StatusOr<std::vector<TokenMatch>> CollectionImpl::Explain(FloatMatrixView query,
                                                                const Scored& entry) const {
  // The record's member lists (which original tokens each rerank vector covers) are read from the
  // store: the table does not keep them.
  TESSERA_ASSIGN_OR_RETURN(DocumentRecord record, shards_[entry.shard]->GetRecord(entry.iid));
  // A hit scored from its codes (the others carry the vectors they were scored with): its vectors
  // decoded from its stored codes (read in place, Shard::DecodeCodes), and the best of them per
  // query token.
  std::vector<float> decoded;
  if (entry.best_tokens.empty()) {
    const uint64_t iid = entry.iid;
    TESSERA_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<const StoredMatrix>> matrices,
                             shards_[entry.shard]->DecodeCodes(absl::MakeConstSpan(&iid, 1)));
    if (matrices[0] == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("document '", entry.id, "' was removed while the search explained it"));
    }
    decoded = MatrixToFloat(*matrices[0]);
  }
  const std::vector<float>& vectors = entry.best_tokens.empty() ? decoded : entry.vectors;
  const int64_t num_vectors = static_cast<int64_t>(vectors.size()) / query.cols;
  auto dot = [&](int64_t i, int64_t v) {
    double similarity = 0.0;
    for (int64_t k = 0; k < query.cols; ++k) {
      similarity +=
          static_cast<double>(query.data[i * query.cols + k]) * vectors[v * query.cols + k];
    }
    return similarity;
  };
  std::vector<TokenMatch> explanation;
  for (int64_t i = 0; i < query.rows; ++i) {
    TokenMatch match;
    match.query_token = static_cast<int32_t>(i);
    double similarity = 0.0;
    if (entry.best_tokens.empty()) {
      similarity = -std::numeric_limits<double>::infinity();
      for (int64_t v = 0; v < num_vectors; ++v) {
        const double candidate = dot(i, v);
        if (candidate > similarity) {
          similarity = candidate;
          match.document_vector = static_cast<int32_t>(v);
        }
      }
    } else {
      match.document_vector = entry.best_tokens[i];
      similarity = dot(i, match.document_vector);
    }
    match.similarity = static_cast<float>(similarity);
    const int32_t v = match.document_vector;
    if (v + 1 < static_cast<int32_t>(record.member_offsets.size())) {
      match.covered_tokens.assign(record.members.begin() + record.member_offsets[v],
                                  record.members.begin() + record.member_offsets[v + 1]);
    }
    explanation.push_back(std::move(match));
  }
  return explanation;
}

absl::StatusOr<SearchResult> CollectionImpl::Search(FloatMatrixView query,
                                                    const SearchOptions& options) const {
  if (options.hybrid.sparse_query.has_value()) return SearchHybrid(query, options);
  TESSERA_RETURN_IF_ERROR(ValidateQuery(query, options));
  return SearchDense(query, options);
}

absl::StatusOr<SearchResult> CollectionImpl::SearchDense(FloatMatrixView query,
                                                         const SearchOptions& options) const {
  const Clock::time_point search_start = Clock::now();
  const SearchPlan plan = Plan(options);
  int64_t total_documents = 0;
  for (const auto& shard : shards_) total_documents += shard->num_documents();

  SearchResult result;
  for (const ShardPlan& shard_plan : plan.shards) {
    result.num_candidates = std::max<int64_t>(result.num_candidates, shard_plan.num_candidates);
  }
  result.documents = total_documents;
  std::vector<CentroidScoreTable> centroid_scores(shards_.size());
  TESSERA_ASSIGN_OR_RETURN(const std::vector<Candidate> selected,
                           SelectForRanking(query, plan, options, &result, &centroid_scores));
  auto to_hit = [&options](Scored& entry) {
    SearchHit hit;
    hit.id = std::move(entry.id);
    hit.score = entry.score;
    hit.version = entry.version;
    if (options.with_attributes) {
      hit.attributes = SelectAttributes(std::move(entry.attributes), options.attribute_fields);
    }
    return hit;
  };
  if (!options.group_by.empty()) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<ScoredGroup> groups,
                             RankGroups(query, selected, centroid_scores, options, &result));
    for (ScoredGroup& group : groups) {
      SearchGroup out;
      out.value = std::move(group.value);
      for (Scored& entry : group.hits) out.hits.push_back(to_hit(entry));
      result.groups.push_back(std::move(out));
    }
    result.timings.total_ms = MillisecondsSince(search_start);
    return result;
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<Scored> top,
                           RankExactly(query, selected, centroid_scores, options, &result));
  for (Scored& entry : top) {
    std::vector<TokenMatch> explanation;
    if (options.explain) {
      TESSERA_ASSIGN_OR_RETURN(explanation, Explain(query, entry));
    }
    SearchHit hit = to_hit(entry);
    hit.explanation = std::move(explanation);
    result.hits.push_back(std::move(hit));
  }
  result.timings.total_ms = MillisecondsSince(search_start);
  return result;
}

absl::StatusOr<std::vector<CollectionImpl::Candidate>> CollectionImpl::SelectForRanking(
    FloatMatrixView query, const SearchPlan& plan, const SearchOptions& options,
    SearchResult* result, std::vector<CentroidScoreTable>* centroid_scores) const {
  const Clock::time_point start = Clock::now();
  std::vector<Candidate> selected;
  std::vector<size_t> every_document;  // the shards whose (matching) documents are all scored
  for (size_t s = 0; s < shards_.size(); ++s) {
    const int64_t documents = shards_[s]->num_documents();
    if (options.exhaustive || plan.shards[s].every_document || plan.shards[s].share >= documents) {
      every_document.push_back(s);
      continue;
    }
    TESSERA_ASSIGN_OR_RETURN(const std::optional<std::vector<uint64_t>> nominees,
                             NominateCandidates(query, s, plan, options, &(*centroid_scores)[s]));
    if (!nominees.has_value()) {
      every_document.push_back(s);
      continue;
    }
    for (uint64_t iid : *nominees) selected.emplace_back(static_cast<int>(s), iid);
  }
  if (every_document.size() < shards_.size()) {
    result->timings.candidates_ms = MillisecondsSince(start);
  }
  if (Clock::now() > options.deadline) {
    return absl::DeadlineExceededError("search deadline passed after candidate generation");
  }
  result->exhaustive = every_document.size() == shards_.size();
  for (size_t s : every_document) {
    const size_t first = selected.size();
    shards_[s]->ForEachLive(options.filter, [&](uint64_t iid, const LiveDocument&) {
      selected.emplace_back(static_cast<int>(s), iid);
    });
    // Scored from codes in more than one batch: the query's centroid scores once for all of them
    // (each batch would otherwise score the centroids its documents use: at 1M documents and
    // 32,768 centroids, nearly all of them, 244 times).
    if (schema_.candidates.rerank_from_codes && selected.size() - first > kRankBatchDocuments) {
      (*centroid_scores)[s] = shards_[s]->ScoreCentroids(query);
    }
  }
  return selected;
}

absl::StatusOr<SearchResult> CollectionImpl::SearchHybrid(FloatMatrixView query,
                                                          const SearchOptions& options) const {
  const Clock::time_point search_start = Clock::now();
  const HybridOptions& hybrid = options.hybrid;
  if (!schema_.sparse.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse_query: collection '", schema_.name, "' declares no sparse field"));
  }
  const bool has_dense = query.rows > 0;
  // The options' checks (k, N, filter, groups, …) are the dense search's; without a query matrix
  // they run against one zero token.
  const std::vector<float> zero(schema_.dim, 0.0f);
  TESSERA_RETURN_IF_ERROR(
      ValidateQuery(has_dense ? query : FloatMatrixView{zero.data(), 1, schema_.dim}, options));
  const SparseVector sparse_query = SortedSparse(*hybrid.sparse_query);
  TESSERA_RETURN_IF_ERROR(ValidateSparseVector(sparse_query.view(), "sparse_query"));
  if (options.explain) {
    return absl::InvalidArgumentError(
        "explain with sparse_query: explain is for a search by query matrix only");
  }
  if (hybrid.rerank && !has_dense) {
    return absl::InvalidArgumentError(
        "rerank: a sparse-only search (empty query) has nothing to rerank with, expected a "
        "query matrix");
  }
  for (const auto& [name, weight] :
       {std::pair<const char*, double>{"dense_weight", hybrid.dense_weight},
        {"sparse_weight", hybrid.sparse_weight},
        {"rrf_k", hybrid.rrf_k}}) {
    if (!std::isfinite(weight) || weight < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " ", weight, ", expected a finite value >= 0"));
    }
  }
  if (hybrid.candidates < 0 || hybrid.candidates > context_.limits.max_num_candidates) {
    return absl::InvalidArgumentError(absl::StrCat("fusion candidates ", hybrid.candidates,
                                                   ", expected 0 … ",
                                                   context_.limits.max_num_candidates));
  }
  const int64_t depth = HybridLaneDepth(options, context_.limits.max_num_candidates);
  const bool want_attributes = options.with_attributes || !options.group_by.empty();

  SearchResult lanes;
  lanes.lanes = true;
  if (has_dense) {
    SearchOptions dense = options;
    dense.k = depth;
    dense.group_by.clear();
    dense.with_attributes = want_attributes;
    dense.attribute_fields.clear();
    dense.hybrid = HybridOptions{};
    TESSERA_ASSIGN_OR_RETURN(SearchResult dense_result, SearchDense(query, dense));
    lanes.timings = dense_result.timings;
    lanes.documents_scored = dense_result.documents_scored;
    lanes.exhaustive = dense_result.exhaustive;
    lanes.num_candidates = dense_result.num_candidates;
    lanes.dense_lane = std::move(dense_result.hits);
    for (SearchHit& hit : lanes.dense_lane) hit.dense_score = hit.score;
  }
  for (const auto& shard : shards_) lanes.documents += shard->num_documents();
  TESSERA_ASSIGN_OR_RETURN(lanes.sparse_lane,
                           SparseLane(query, sparse_query.view(), depth, options, &lanes));
  if (options.whole_shards > 0) {
    lanes.timings.total_ms = MillisecondsSince(search_start);
    return lanes;
  }
  TESSERA_ASSIGN_OR_RETURN(SearchResult result, FuseLanes(std::move(lanes), has_dense, options));
  result.timings.total_ms = MillisecondsSince(search_start);
  return result;
}

absl::StatusOr<std::vector<SearchHit>> CollectionImpl::SparseLane(
    FloatMatrixView query, const SparseVectorView& sparse_query, int64_t depth,
    const SearchOptions& options, SearchResult* result) const {
  const Clock::time_point start = Clock::now();
  // The collection's statistics: given (a part of a collection), or summed over the shards.
  SparseStatistics statistics;
  if (options.hybrid.statistics.has_value()) {
    statistics = *options.hybrid.statistics;
  } else {
    statistics = SparseStatisticsOf(sparse_query.indices);
  }
  const bool want_attributes = options.with_attributes || !options.group_by.empty();
  struct Entry {
    SearchHit hit;
    Candidate at;
  };
  std::vector<Entry> entries;
  for (size_t s = 0; s < shards_.size(); ++s) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<SparseLaneHit> hits,
                             shards_[s]->SearchSparse(sparse_query, depth, options.filter,
                                                      &statistics, want_attributes));
    for (SparseLaneHit& found : hits) {
      Entry entry;
      entry.hit.id = std::move(found.external_id);
      entry.hit.score = found.score;
      entry.hit.version = found.version;
      entry.hit.attributes = std::move(found.attributes);
      entry.hit.sparse_score = found.score;
      entry.at = Candidate(static_cast<int>(s), found.iid);
      entries.push_back(std::move(entry));
    }
  }
  const auto keep = static_cast<size_t>(std::min<int64_t>(depth, entries.size()));
  std::partial_sort(entries.begin(), entries.begin() + static_cast<std::ptrdiff_t>(keep),
                    entries.end(), [](const Entry& a, const Entry& b) {
                      return BetterHit(a.hit.score, a.hit.id, b.hit.score, b.hit.id);
                    });
  entries.resize(keep);
  result->timings.candidates_ms += MillisecondsSince(start);
  if (options.hybrid.rerank && query.rows > 0 && !entries.empty()) {
    // Their MaxSim, for the rerank of the fused candidates (a part cannot know which of them
    // the dense lanes of all parts hold already).
    std::vector<Candidate> candidates;
    for (const Entry& entry : entries) candidates.push_back(entry.at);
    std::vector<Scored> scored;
    TESSERA_RETURN_IF_ERROR(ScoreDocuments(query, /*want_best_tokens=*/false,
                                           /*want_attributes=*/false, candidates,
                                           /*centroid_scores=*/nullptr, &scored, &result->timings));
    result->documents_scored += static_cast<int64_t>(candidates.size());
    std::map<Candidate, float> maxsim;
    for (const Scored& entry : scored) maxsim[Candidate(entry.shard, entry.iid)] = entry.score;
    for (Entry& entry : entries) {
      const auto it = maxsim.find(entry.at);
      if (it != maxsim.end()) entry.hit.dense_score = it->second;
    }
  }
  std::vector<SearchHit> hits;
  hits.reserve(entries.size());
  for (Entry& entry : entries) hits.push_back(std::move(entry.hit));
  return hits;
}

SparseStatistics CollectionImpl::SparseStatisticsOf(absl::Span<const uint32_t> terms) const {
  SparseStatistics statistics;
  for (const auto& shard : shards_) statistics.Merge(shard->SparseStatisticsOf(terms));
  return statistics;
}

CollectionStats CollectionImpl::Stats() const {
  CollectionStats stats;
  stats.disk_bytes = AllocatedBytes(dir_ + "/schema");
  int64_t last_training_end = 0;
  for (const auto& shard : shards_) {
    const ShardStats s = shard->Stats();
    CollectionStats part;
    part.documents = s.documents;
    part.original_tokens = s.original_tokens;
    part.rerank_vectors = s.rerank_vectors;
    part.candidate_vectors = s.candidate_vectors;
    part.disk_bytes = s.disk_bytes;
    part.resident_bytes = s.resident_bytes;
    part.candidate_bytes = s.candidate_bytes;
    part.training_shards = s.training ? 1 : 0;
    part.trainings_completed = s.trainings_completed;
    part.trainings_failed = s.trainings_failed;
    part.segments = s.segments;
    part.candidate_indexes.push_back(s.candidate_index);
    AddStats(part, &stats);
    if (s.last_training_end > last_training_end) {
      last_training_end = s.last_training_end;
      stats.last_training_seconds = s.last_training_seconds;
    }
  }
  SetStatsRatios(&stats);
  return stats;
}

absl::Status CollectionImpl::Checkpoint(const std::string& dir,
                                        std::vector<uint64_t>* sequences) const {
  MutexLock cut(&cut_mu_);
  if (sequences != nullptr) sequences->assign(shards_.size(), 0);
  for (size_t s = 0; s < shards_.size(); ++s) {
    TESSERA_RETURN_IF_ERROR(
        shards_[s]->Checkpoint(ShardDirectory(dir, static_cast<int>(s)),
                               sequences != nullptr ? &(*sequences)[s] : nullptr));
  }
  return absl::OkStatus();
}

absl::Status CollectionImpl::Snapshot() {
  for (const auto& shard : shards_) TESSERA_RETURN_IF_ERROR(shard->Snapshot());
  return absl::OkStatus();
}

}  // namespace tessera::internal
