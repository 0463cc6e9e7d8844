// The engine: collection directories <data_dir>/collections/<name>@<creation time>, each with a
// `schema` file (written last at creation, so a directory without one is an interrupted create and
// is removed) and its shards. Dropped collections are moved to <data_dir>/trash and deleted when no
// search holds them any more. A collection that cannot be opened because a file of it is corrupt
// (DATA_LOSS) is kept aside as unavailable, so that one bad collection does not take the others
// down with it. <data_dir>/LOCK is locked (index/common/dir_lock.h) before anything else in the
// directory is touched, and held until the engine and its collections are closed: a second
// engine on the same data dir, in this process or another, fails to open and changes nothing.
#include "tessera/engine.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "index/candidate/candidate_index.h"
#include "index/centroid/centroid_codebook.h"
#include "index/collection/collection_impl.h"
#include "index/collection/schema_codec.h"
#include "index/common/dir_lock.h"
#include "index/common/file_io.h"
#include "index/common/thread_pool.h"
#include "index/rerank/cpu_maxsim_scorer.h"
#include "tessera/base/mutex.h"
#include "tessera/status_macros.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using internal::CollectionImpl;

// A collection's schema file, dir/schema: written atomically and durably, read back decoded.
absl::Status WriteSchemaFile(const fs::path& dir, const CollectionSchema& schema) {
  const std::string encoded = internal::EncodeSchema(schema);
  return internal::WriteFileAtomically((dir / "schema").string(), {encoded});
}

absl::StatusOr<CollectionSchema> ReadSchemaFile(const fs::path& dir) {
  TESSERA_ASSIGN_OR_RETURN(const std::string text,
                           internal::ReadWholeFile((dir / "schema").string()));
  return internal::DecodeSchema(text);
}

class EngineImpl : public Engine {
 public:
  EngineImpl(std::unique_ptr<internal::DirLock> lock, fs::path data_dir,
             internal::CollectionContext context)
      : lock_(std::move(lock)), data_dir_(std::move(data_dir)), context_(std::move(context)) {}

  ~EngineImpl() override {
    // Snapshot candidate indexes so the next open loads instead of replaying.
    MutexLock lock(&mu_);
    for (auto& [name, collection] : collections_) collection->Snapshot().IgnoreError();
  }

  absl::Status OpenExisting() {
    std::error_code error;
    fs::create_directories(data_dir_ / "collections", error);
    fs::remove_all(data_dir_ / "trash", error);  // drops that had not finished deleting
    fs::create_directories(data_dir_ / "trash", error);
    fs::remove_all(data_dir_ / "staging", error);  // copies that had not finished arriving
    fs::create_directories(data_dir_ / "staging", error);
    if (error) {
      return absl::InternalError(
          absl::StrCat("cannot create data directory ", data_dir_.string(), ": ", error.message()));
    }
    MutexLock lock(&mu_);
    for (const fs::directory_entry& entry : fs::directory_iterator(data_dir_ / "collections")) {
      if (!entry.is_directory()) continue;
      const fs::path schema_path = entry.path() / "schema";
      if (!fs::exists(schema_path)) {
        fs::remove_all(entry.path(), error);  // an interrupted create
        continue;
      }
      // The name as the directory spells it, for a collection whose schema cannot be read.
      const std::string dir_name = entry.path().filename().string();
      const std::string name = dir_name.substr(0, dir_name.rfind('@'));
      absl::StatusOr<CollectionSchema> schema = ReadSchemaFile(entry.path());
      if (!schema.ok()) {
        MarkUnavailable(name, entry.path(),
                        absl::DataLossError(absl::StrCat("schema file '", schema_path.string(),
                                                         "': ", schema.status().message())));
        continue;
      }
      absl::StatusOr<std::shared_ptr<CollectionImpl>> collection =
          CollectionImpl::Open(entry.path().string(), *schema, context_);
      if (absl::IsDataLoss(collection.status())) {
        MarkUnavailable(schema->name, entry.path(), collection.status());
        continue;
      }
      // Anything else (another process holds the database, a full disk, an I/O error) concerns
      // the whole data directory: the engine does not open.
      TESSERA_RETURN_IF_ERROR(collection.status());
      collections_[schema->name] = std::move(*collection);
    }
    for (const auto& [name, collection] : collections_) unavailable_.erase(name);
    return absl::OkStatus();
  }

  void MarkUnavailable(const std::string& name, const fs::path& dir, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Status status = absl::DataLossError(
        absl::StrCat("collection '", name, "' is unavailable: ", why.message(),
                     " (the other collections are served; drop this one or restore its files)"));
    Log(context_.log, {LogSeverity::kError,
                       "collection unavailable",
                       {{"collection", name},
                        {"directory", dir.string()},
                        {"error", std::string(why.message())}}});
    unavailable_[name] = Unavailable{dir, status};
  }

  absl::StatusOr<std::shared_ptr<Collection>> CreateCollection(
      const CollectionSchema& schema) override {
    TESSERA_RETURN_IF_ERROR(ValidateSchema(schema));
    MutexLock lock(&mu_);
    if (collections_.contains(schema.name)) {
      return absl::AlreadyExistsError(
          absl::StrCat("collection '", schema.name, "' already exists"));
    }
    if (const auto broken = unavailable_.find(schema.name); broken != unavailable_.end()) {
      return absl::AlreadyExistsError(
          absl::StrCat("collection '", schema.name,
                       "' already exists (unavailable: ", broken->second.status.message(), ")"));
    }
    const fs::path dir = NewCollectionDirectory(schema.name);
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<CollectionImpl> collection,
                             CollectionImpl::Open(dir.string(), schema, context_));
    const absl::Status written = WriteSchemaFile(dir, schema);
    if (!written.ok()) {
      // Without its schema the directory is an interrupted create: close it and remove it now.
      collection.reset();
      std::error_code ignored;
      fs::remove_all(dir, ignored);
      return written;
    }
    collections_[schema.name] = collection;
    return std::shared_ptr<Collection>(collection);
  }

  absl::Status CheckpointCollection(const std::string& name, const std::string& dir) override {
    return CheckpointCollectionAtCut(name, dir).status();
  }

  absl::StatusOr<std::vector<uint64_t>> CheckpointCollectionAtCut(const std::string& name,
                                                                  const std::string& dir) override {
    std::shared_ptr<CollectionImpl> collection;
    {
      MutexLock lock(&mu_);
      const auto it = collections_.find(name);
      if (it == collections_.end()) {
        return absl::NotFoundError(
            absl::StrCat("collection ", QuotedForMessage(name), " not found"));
      }
      collection = it->second;
    }
    std::error_code error;
    if (!fs::create_directory(dir, error) || error) {
      return absl::InternalError(
          absl::StrCat("cannot create ", dir, ": ", error ? error.message() : "it exists"));
    }
    std::vector<uint64_t> sequences;
    TESSERA_RETURN_IF_ERROR(collection->Checkpoint(dir, &sequences));
    TESSERA_RETURN_IF_ERROR(WriteSchemaFile(dir, collection->schema()));
    return sequences;
  }

  absl::Status AdoptCollection(const std::string& name, const std::string& dir) override {
    TESSERA_ASSIGN_OR_RETURN(CollectionSchema schema, ReadSchemaFile(dir));
    schema.name = name;
    TESSERA_RETURN_IF_ERROR(ValidateSchema(schema));
    // Under the lock throughout, as a create: the name cannot be taken meanwhile.
    MutexLock lock(&mu_);
    if (collections_.contains(name) || unavailable_.contains(name)) {
      return absl::AlreadyExistsError(
          absl::StrCat("collection ", QuotedForMessage(name), " already exists"));
    }
    TESSERA_RETURN_IF_ERROR(WriteSchemaFile(dir, schema));
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<CollectionImpl> opened, MoveInAndOpen(dir, schema));
    collections_[name] = std::move(opened);
    return absl::OkStatus();
  }

  absl::Status RestoreCollection(const std::string& name, const std::string& dir) override {
    TESSERA_ASSIGN_OR_RETURN(const CollectionSchema schema, ReadSchemaFile(dir));
    if (schema.name != name) {
      return absl::InvalidArgumentError(absl::StrCat("the copy in ", dir, " is of collection '",
                                                     schema.name, "', not '", name, "'"));
    }
    // The old collection goes first: two directories of one name must never be on disk together
    // (a crash would reopen either).
    {
      MutexLock lock(&mu_);
      const auto it = collections_.find(name);
      if (it != collections_.end()) TESSERA_RETURN_IF_ERROR(RetireLocked(it));
      const auto broken = unavailable_.find(name);
      if (broken != unavailable_.end()) {
        std::error_code error;
        fs::remove_all(broken->second.dir, error);
        unavailable_.erase(broken);
      }
    }
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<CollectionImpl> opened, MoveInAndOpen(dir, schema));
    MutexLock lock(&mu_);
    collections_[name] = std::move(opened);
    return absl::OkStatus();
  }

  std::string StagingDirectory() const override { return (data_dir_ / "staging").string(); }

  absl::Status DropCollection(const std::string& name) override {
    MutexLock lock(&mu_);
    const auto it = collections_.find(name);
    if (it == collections_.end()) {
      const auto broken = unavailable_.find(name);
      if (broken == unavailable_.end()) {
        return absl::NotFoundError(
            absl::StrCat("collection ", QuotedForMessage(name), " not found"));
      }
      // Nothing holds an unavailable collection open: its files go at once.
      std::error_code error;
      fs::remove_all(broken->second.dir, error);
      if (error) {
        return absl::InternalError(
            absl::StrCat("cannot remove ", broken->second.dir.string(), ": ", error.message()));
      }
      unavailable_.erase(broken);
      return absl::OkStatus();
    }
    return RetireLocked(it);
  }

  // Takes a collection out of the engine: moves its directory to the trash first, so that a
  // crash before the files are deleted leaves nothing that reopens as it; the files go when the
  // last reference does.
  absl::Status RetireLocked(
      absl::flat_hash_map<std::string, std::shared_ptr<CollectionImpl>>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string& name = it->first;
    const fs::path from = it->second->directory();
    const fs::path to =
        data_dir_ / "trash" /
        absl::StrCat(name, ".", std::chrono::steady_clock::now().time_since_epoch().count());
    std::error_code error;
    fs::rename(from, to, error);
    if (error) {
      return absl::InternalError(
          absl::StrCat("cannot move ", from.string(), " aside: ", error.message()));
    }
    it->second->MarkDropped(to.string());
    collections_.erase(it);
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<Collection>> GetCollection(
      const std::string& name) const override {
    MutexLock lock(&mu_);
    const auto it = collections_.find(name);
    if (it == collections_.end()) {
      const auto broken = unavailable_.find(name);
      if (broken != unavailable_.end()) return broken->second.status;
      return absl::NotFoundError(absl::StrCat("collection ", QuotedForMessage(name), " not found"));
    }
    return std::shared_ptr<Collection>(it->second);
  }

  std::vector<std::string> ListCollections() const override {
    MutexLock lock(&mu_);
    std::vector<std::string> names;
    for (const auto& [name, collection] : collections_) names.push_back(name);
    for (const auto& [name, broken] : unavailable_) names.push_back(name);
    std::sort(names.begin(), names.end());
    return names;
  }

  std::vector<std::pair<std::string, absl::Status>> UnavailableCollections() const override {
    MutexLock lock(&mu_);
    std::vector<std::pair<std::string, absl::Status>> out;
    for (const auto& [name, broken] : unavailable_) out.emplace_back(name, broken.status);
    std::sort(out.begin(), out.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    return out;
  }

 private:
  // Renames the collection directory `dir` to a fresh directory of schema.name and opens it
  // there; on failure to open, the moved directory is removed.
  absl::StatusOr<std::shared_ptr<CollectionImpl>> MoveInAndOpen(const std::string& dir,
                                                                const CollectionSchema& schema) {
    const fs::path target = NewCollectionDirectory(schema.name);
    std::error_code error;
    fs::rename(dir, target, error);
    if (error) {
      return absl::InternalError(
          absl::StrCat("cannot move ", dir, " to ", target.string(), ": ", error.message()));
    }
    absl::StatusOr<std::shared_ptr<CollectionImpl>> opened =
        CollectionImpl::Open(target.string(), schema, context_);
    if (!opened.ok()) fs::remove_all(target, error);
    return opened;
  }

  // A fresh directory per incarnation: a dropped collection of the same name may still be open
  // (RocksDB locks by path) until its last search finishes.
  fs::path NewCollectionDirectory(const std::string& name) const {
    return data_dir_ / "collections" /
           absl::StrCat(name, "@",
                        absl::Hex(std::chrono::system_clock::now().time_since_epoch().count()));
  }

  // A collection on disk that could not be opened, and the DATA_LOSS error it answers with.
  struct Unavailable {
    fs::path dir;
    absl::Status status;
  };

  // First, so that it is released last: after every collection of this engine has closed.
  const std::unique_ptr<internal::DirLock> lock_;
  const fs::path data_dir_;
  const internal::CollectionContext context_;
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<CollectionImpl>> collections_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Unavailable> unavailable_ ABSL_GUARDED_BY(mu_);
};

bool IsValidName(const std::string& name) {
  if (name.empty() || name.size() > 128 || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

// The number after `prefix` in a FAISS factory string ("IVF4096,PQ16" → 4096), or 0.
int64_t FactoryNumber(const std::string& factory, const std::string& prefix) {
  const size_t at = factory.find(prefix);
  if (at == std::string::npos) return 0;
  int64_t number = 0;
  for (size_t i = at + prefix.size();
       i < factory.size() && std::isdigit(static_cast<unsigned char>(factory[i])); ++i) {
    number = std::min<int64_t>(number * 10 + (factory[i] - '0'), int64_t{1} << 40);
  }
  return number;
}

// A trainable index is trained once it holds min_training_vectors vectors, after that write is
// durable; FAISS's k-means refuses fewer points than centroids, which would fail that write and
// every later open. Refused at creation instead.
absl::Status CheckTrainable(const internal::CandidateIndexOptions& options) {
  const int64_t centroids = FactoryNumber(options.factory, "IVF");
  if (centroids > options.min_training_vectors) {
    return absl::InvalidArgumentError(absl::StrCat(
        "candidate index factory '", options.factory, "': ", centroids,
        " centroids need at least as many training vectors, and the index is trained on its first ",
        options.min_training_vectors, " (expected at most ", options.min_training_vectors,
        " centroids)"));
  }
  return absl::OkStatus();
}

}  // namespace

int ShardOf(absl::string_view id, int num_shards) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : id) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return static_cast<int>(hash % static_cast<uint64_t>(num_shards));
}

absl::Status ValidateSchema(const CollectionSchema& schema) {
  if (!IsValidName(schema.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("collection name ", QuotedForMessage(schema.name),
                     ", expected 1-128 characters of [A-Za-z0-9_.-]"));
  }
  if (schema.dim < 1 || schema.dim > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("dim ", schema.dim, ", expected 1 … 4096"));
  }
  if (schema.num_shards < 1 || schema.num_shards > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_shards ", schema.num_shards, ", expected 1 … ", kMaxShards));
  }
  if (schema.sparse.has_value()) {
    const absl::Status scoring = ValidateSparseScoring(*schema.sparse);
    if (!scoring.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("sparse field: ", scoring.message()));
    }
  }
  if (schema.pooling.hierarchical.has_value()) {
    const TokenPoolingOptions& h = *schema.pooling.hierarchical;
    if (h.pool_factor < 1 || h.pool_factor > 64) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool_factor ", h.pool_factor, ", expected 1 … 64"));
    }
    if (h.protected_tokens < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("protected_tokens ", h.protected_tokens, ", expected ≥ 0"));
    }
    if (h.min_vectors < 0 || h.min_vectors > kMaxHierarchicalPoolingTokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "min_vectors ", h.min_vectors, ", expected 0 … ", kMaxHierarchicalPoolingTokens));
    }
    if (!(h.max_merge_height >= 0.0 && std::isfinite(h.max_merge_height))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "max_merge_height ", h.max_merge_height, ", expected a finite value ≥ 0 (0: no limit)"));
    }
  }
  if (schema.candidates.rerank_from_codes && schema.candidates.factory != "auto" &&
      schema.candidates.factory != "centroid") {
    return absl::InvalidArgumentError(
        absl::StrCat("rerank_from_codes needs the centroid index (factory 'auto' or 'centroid'), "
                     "got factory ",
                     QuotedForMessage(schema.candidates.factory)));
  }
  if (schema.candidates.kind == CandidateSpec::Kind::kPooled &&
      (schema.candidates.pool_factor < 1 || schema.candidates.pool_factor > 64)) {
    return absl::InvalidArgumentError(
        absl::StrCat("candidate pool_factor ", schema.candidates.pool_factor, ", expected 1 … 64"));
  }
  // FAISS's own messages quote the string whole: bounded first.
  constexpr size_t kMaxFactoryBytes = 256;
  if (schema.candidates.factory.empty() ||
      schema.candidates.factory.find_first_of(" \n\t") != std::string::npos ||
      schema.candidates.factory.size() > kMaxFactoryBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("candidate index factory ", QuotedForMessage(schema.candidates.factory),
                     ", expected auto, centroid or a FAISS factory string (at most ",
                     kMaxFactoryBytes, " bytes, no whitespace)"));
  }
  if (schema.candidates.factory != "centroid") {
    // Let FAISS judge the factory string now rather than at the first write.
    internal::CandidateIndexOptions options;
    options.dim = schema.dim;
    options.factory = schema.candidates.factory;
    TESSERA_RETURN_IF_ERROR(internal::CandidateIndex::Create(options).status());
    TESSERA_RETURN_IF_ERROR(CheckTrainable(options));
  }
  if (schema.candidates.residual_bits != 0 && schema.candidates.residual_bits != 2 &&
      schema.candidates.residual_bits != 4) {
    return absl::InvalidArgumentError(absl::StrCat("candidate residual_bits ",
                                                   schema.candidates.residual_bits,
                                                   ", expected 2 or 4 (0: the mode's default)"));
  }
  // A training needs at least one vector per centroid of the smallest codebook
  // (internal::kMinCentroids): below that k-means cannot fill the codebook, every sampled vector
  // becomes its own centroid, and with rerank_from_codes that codebook codes the shard for good.
  // The further multiple k-means wants comes from the retraining at kRetrainGrowth (4×: 4 vectors
  // per centroid at the next training) and the default threshold (16,384: 16 per centroid).
  for (const auto& [field, value] :
       {std::pair<const char*, int64_t>{"centroid_min_vectors",
                                        schema.candidates.centroid_min_vectors},
        {"centroid_min_training_vectors", EffectiveMinTrainingVectors(schema.candidates)}}) {
    if (value < internal::kMinCentroids) {
      return absl::InvalidArgumentError(absl::StrCat(
          "candidate ", field, " ", value, ", expected ≥ ", internal::kMinCentroids,
          " (a centroid training needs at least one vector per centroid of the smallest "
          "codebook)"));
    }
  }
  for (const auto& [field, type] : schema.attributes) {
    if (!IsValidName(field)) {
      return absl::InvalidArgumentError(
          absl::StrCat("attribute field ", QuotedForMessage(field),
                       ", expected 1-128 characters of [A-Za-z0-9_.-]"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(const std::string& data_dir,
                                                     const EngineOptions& options) {
  if (options.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("engine threads ", options.threads,
                                                   ", expected ≥ 0 (0 = all hardware threads)"));
  }
  if (options.blas_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("engine blas_threads ", options.blas_threads,
                                                   ", expected ≥ 0 (0 = OpenBLAS's own setting)"));
  }
  internal::ConfigureFaissForServing(options.blas_threads);
  internal::CollectionContext context;
  context.pool = std::make_shared<internal::ThreadPool>(options.threads);
  context.limits = options.limits;
  context.store_options.sync = options.sync_writes;
  context.store_options.memory = internal::NewSharedStoreMemory(
      static_cast<size_t>(std::max<int64_t>(options.memtable_bytes, 0)),
      static_cast<size_t>(std::max<int64_t>(options.block_cache_bytes, 0)));
  context.log = options.log;
  context.resident_rerank_bytes = options.resident_rerank_bytes;
  // The CPU scorer has a pool of its own, of `threads` too (see EngineOptions::threads for why
  // not context.pool).
  auto cpu = std::make_shared<internal::CpuMaxSimScorer>(
      DetectCpuIsa(), std::make_shared<internal::ThreadPool>(options.threads));
  context.scorer = options.scorer == nullptr
                       ? std::shared_ptr<const MaxSimScorer>(std::move(cpu))
                       : std::shared_ptr<const MaxSimScorer>(NewFallbackMaxSimScorer(
                             options.scorer, std::move(cpu), options.on_scorer_fallback));
  // Before the trash and staging directories are emptied: they may be another engine's.
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<internal::DirLock> lock,
                           internal::DirLock::Acquire(data_dir));
  auto engine =
      std::make_unique<EngineImpl>(std::move(lock), fs::path(data_dir), std::move(context));
  TESSERA_RETURN_IF_ERROR(engine->OpenExisting());
  return engine;
}

}  // namespace tessera
