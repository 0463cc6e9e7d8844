// The engine: collection directories <data_dir>/collections/<name>@<creation time>, each with a
// `schema` file (written last at creation, so a directory without one is an interrupted create and
// is removed) and its shards. Dropped collections are moved to <data_dir>/trash and deleted when no
// search holds them any more.
#include "tessera/engine.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "index/collection/collection_impl.h"
#include "index/collection/schema_codec.h"
#include "index/common/mutex.h"
#include "tessera/status_macros.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using internal::CollectionImpl;

absl::Status WriteFileDurably(const fs::path& path, const std::string& contents) {
  const fs::path temporary = path.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << contents;
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", temporary.string()));
  }
  // fsync the file, then make the rename durable by syncing the directory.
  for (const fs::path& p : {temporary, path.parent_path()}) {
    FILE* f = std::fopen(p.c_str(), "r");
    if (f == nullptr) return absl::InternalError(absl::StrCat("cannot open ", p.string()));
    const int rc = ::fsync(fileno(f));
    std::fclose(f);
    if (rc != 0) return absl::InternalError(absl::StrCat("cannot fsync ", p.string()));
    if (p == temporary) {
      std::error_code error;
      fs::rename(temporary, path, error);
      if (error) return absl::InternalError(absl::StrCat("cannot rename to ", path.string()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

class EngineImpl : public Engine {
 public:
  EngineImpl(fs::path data_dir, internal::CollectionContext context)
      : data_dir_(std::move(data_dir)), context_(std::move(context)) {}

  ~EngineImpl() override {
    // Snapshot candidate indexes so the next open loads instead of replaying.
    internal::MutexLock lock(&mu_);
    for (auto& [name, collection] : collections_) collection->Snapshot().IgnoreError();
  }

  absl::Status OpenExisting() {
    std::error_code error;
    fs::create_directories(data_dir_ / "collections", error);
    fs::remove_all(data_dir_ / "trash", error);  // drops that had not finished deleting
    fs::create_directories(data_dir_ / "trash", error);
    if (error) {
      return absl::InternalError(
          absl::StrCat("cannot create data directory ", data_dir_.string(), ": ", error.message()));
    }
    internal::MutexLock lock(&mu_);
    for (const fs::directory_entry& entry : fs::directory_iterator(data_dir_ / "collections")) {
      if (!entry.is_directory()) continue;
      const fs::path schema_path = entry.path() / "schema";
      if (!fs::exists(schema_path)) {
        fs::remove_all(entry.path(), error);  // an interrupted create
        continue;
      }
      TESSERA_ASSIGN_OR_RETURN(const std::string text, ReadFile(schema_path));
      TESSERA_ASSIGN_OR_RETURN(CollectionSchema schema, internal::DecodeSchema(text));
      TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<CollectionImpl> collection,
                               CollectionImpl::Open(entry.path().string(), schema, context_));
      collections_[schema.name] = std::move(collection);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<Collection>> CreateCollection(
      const CollectionSchema& schema) override {
    TESSERA_RETURN_IF_ERROR(ValidateSchema(schema));
    internal::MutexLock lock(&mu_);
    if (collections_.contains(schema.name)) {
      return absl::AlreadyExistsError(
          absl::StrCat("collection '", schema.name, "' already exists"));
    }
    // A fresh directory per incarnation: a dropped collection of the same name may still be open
    // (RocksDB locks by path) until its last search finishes.
    const fs::path dir =
        data_dir_ / "collections" /
        absl::StrCat(schema.name, "@",
                     absl::Hex(std::chrono::system_clock::now().time_since_epoch().count()));
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<CollectionImpl> collection,
                             CollectionImpl::Open(dir.string(), schema, context_));
    TESSERA_RETURN_IF_ERROR(WriteFileDurably(dir / "schema", internal::EncodeSchema(schema)));
    collections_[schema.name] = collection;
    return std::shared_ptr<Collection>(collection);
  }

  absl::Status DropCollection(const std::string& name) override {
    internal::MutexLock lock(&mu_);
    const auto it = collections_.find(name);
    if (it == collections_.end()) {
      return absl::NotFoundError(absl::StrCat("collection '", name, "' not found"));
    }
    // Move the directory aside first, so that a crash before the files are deleted leaves nothing
    // that reopens as the old collection.
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
    internal::MutexLock lock(&mu_);
    const auto it = collections_.find(name);
    if (it == collections_.end()) {
      return absl::NotFoundError(absl::StrCat("collection '", name, "' not found"));
    }
    return std::shared_ptr<Collection>(it->second);
  }

  std::vector<std::string> ListCollections() const override {
    internal::MutexLock lock(&mu_);
    std::vector<std::string> names;
    for (const auto& [name, collection] : collections_) names.push_back(name);
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  const fs::path data_dir_;
  const internal::CollectionContext context_;
  mutable internal::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<CollectionImpl>> collections_
      ABSL_GUARDED_BY(mu_);
};

bool IsValidName(const std::string& name) {
  if (name.empty() || name.size() > 128 || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

}  // namespace

absl::Status ValidateSchema(const CollectionSchema& schema) {
  if (!IsValidName(schema.name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "collection name '", schema.name, "', expected 1-128 characters of [A-Za-z0-9_.-]"));
  }
  if (schema.dim < 1 || schema.dim > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("dim ", schema.dim, ", expected 1 … 4096"));
  }
  if (schema.num_shards < 1 || schema.num_shards > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_shards ", schema.num_shards, ", expected 1 … 256"));
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
  }
  if (schema.candidates.rerank_from_codes && schema.candidates.factory != "auto" &&
      schema.candidates.factory != "centroid") {
    return absl::InvalidArgumentError(
        absl::StrCat("rerank_from_codes needs the centroid index (factory 'auto' or 'centroid'), "
                     "got factory '",
                     schema.candidates.factory, "'"));
  }
  if (schema.candidates.kind == CandidateSpec::Kind::kPooled &&
      (schema.candidates.pool_factor < 1 || schema.candidates.pool_factor > 64)) {
    return absl::InvalidArgumentError(
        absl::StrCat("candidate pool_factor ", schema.candidates.pool_factor, ", expected 1 … 64"));
  }
  if (schema.candidates.factory.empty() ||
      schema.candidates.factory.find_first_of(" \n\t") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("candidate index factory '", schema.candidates.factory,
                     "', expected auto, centroid or a FAISS factory string"));
  }
  if (schema.candidates.factory != "centroid") {
    // Let FAISS judge the factory string now rather than at the first write.
    internal::CandidateIndexOptions options;
    options.dim = schema.dim;
    options.factory = schema.candidates.factory;
    TESSERA_RETURN_IF_ERROR(internal::CandidateIndex::Create(options).status());
  }
  if (schema.candidates.residual_bits != 2 && schema.candidates.residual_bits != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "candidate residual_bits ", schema.candidates.residual_bits, ", expected 2 or 4"));
  }
  if (schema.candidates.centroid_min_vectors < 1 ||
      schema.candidates.centroid_min_training_vectors < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("candidate centroid_min_vectors ", schema.candidates.centroid_min_vectors,
                     " and centroid_min_training_vectors ",
                     schema.candidates.centroid_min_training_vectors, ", expected ≥ 1"));
  }
  for (const auto& [field, type] : schema.attributes) {
    if (!IsValidName(field)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attribute field '", field, "', expected 1-128 characters of [A-Za-z0-9_.-]"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(const std::string& data_dir,
                                                     const EngineOptions& options) {
  internal::CollectionContext context;
  context.pool = std::make_shared<internal::ThreadPool>(options.threads);
  context.limits = options.limits;
  context.store_options.sync = options.sync_writes;
  context.resident_rerank_bytes = options.resident_rerank_bytes;
  context.scorer = options.scorer;
  if (context.scorer == nullptr) {
    CpuMaxSimOptions cpu;
    cpu.num_threads = options.threads;
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<MaxSimScorer> scorer, NewCpuMaxSimScorer(cpu));
    context.scorer = std::move(scorer);
  }
  auto engine = std::make_unique<EngineImpl>(fs::path(data_dir), std::move(context));
  TESSERA_RETURN_IF_ERROR(engine->OpenExisting());
  return engine;
}

}  // namespace tessera
