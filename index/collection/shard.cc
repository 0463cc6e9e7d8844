#include "index/collection/shard.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "index/common/file_io.h"
#include "index/common/thread_pool.h"
#include "index/kernels/query_similarity.h"
#include "index/stage1/candidate_stage1.h"
#include "index/stage1/centroid_stage1.h"
#include "index/storage/record_codec.h"
#include "tessera/status_macros.h"

namespace tessera::internal {
namespace {

constexpr char kSnapshotFile[] = "candidates.snapshot";
// Meta keys of the centroid index: "<generation> <trained vectors>", and each generation's
// codebook.
constexpr char kGenerationKey[] = "centroid_generation";
std::string CodebookKey(uint32_t generation) { return absl::StrCat("codebook/", generation); }
// Documents read per MultiGet when loading resident rerank vectors or encoding for a training.
constexpr size_t kReadBatch = 256;
// A search's reads of rerank vectors or codes are split over the pool in parts of at least this
// many: a read that misses the page cache waits on the disk, and the parts wait together.
constexpr size_t kMinReadsPerPart = 16;
int64_t ReadParts(size_t reads, int64_t threads) {
  return std::min<int64_t>(threads,
                           static_cast<int64_t>((reads + kMinReadsPerPart - 1) / kMinReadsPerPart));
}
// A training catches up without holding the write path until fewer documents than this were
// written since its last pass; the rest it encodes with writes held.
constexpr size_t kCatchUpDocuments = 512;
constexpr uint64_t kSampleSeed = 0x53414d504c453031;

FloatMatrixView View(const StoredMatrix& matrix) {
  return FloatMatrixView{reinterpret_cast<const float*>(matrix.bytes.data()), matrix.rows,
                         matrix.cols};
}

CandidateIndexOptions CandidateOptions(const CollectionSchema& schema) {
  CandidateIndexOptions options;
  options.dim = schema.dim;
  // With "auto" and "centroid" the candidate index only serves until the centroid index takes
  // over: an exact scan, never the HNSW graph that FAISS's "auto" would build past its limit (a
  // graph build of minutes on the write path, for an index about to be dropped).
  const std::string& factory = schema.candidates.factory;
  options.factory = factory == "auto" || factory == "centroid" ? "Flat" : factory;
  return options;
}

// Whether the schema lets a shard of `rerank_vectors` vectors move to the centroid index.
bool WantsCentroidIndex(const CandidateSpec& spec, int64_t rerank_vectors) {
  if (spec.factory == "centroid" || spec.rerank_from_codes) {
    return rerank_vectors >= spec.centroid_min_training_vectors;
  }
  if (spec.factory == "auto") return rerank_vectors >= spec.centroid_min_vectors;
  return false;
}

// INVALID_ARGUMENT unless `matrix` is well formed and every value, as stored, is finite (an fp32
// value beyond ±65504 is infinite in fp16).
absl::Status CheckStoredValues(const StoredMatrix& matrix, const std::string& what) {
  TESSERA_RETURN_IF_ERROR(ValidateMatrix(matrix, what));
  const int64_t count = matrix.rows * matrix.cols;
  for (int64_t i = 0; i < count; ++i) {
    bool finite = true;
    if (matrix.dtype == VectorDtype::kFloat16) {
      uint16_t bits;
      std::memcpy(&bits, matrix.bytes.data() + 2 * i, sizeof(bits));
      finite = (bits & 0x7c00u) != 0x7c00u;
    } else {
      float value;
      std::memcpy(&value, matrix.bytes.data() + 4 * i, sizeof(value));
      finite = std::isfinite(value);
    }
    if (!finite) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": value ", i % matrix.cols, " of vector ", i / matrix.cols,
                       " is not finite as stored (",
                       matrix.dtype == VectorDtype::kFloat16 ? "fp16, |x| ≤ 65504" : "fp32", ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

Shard::Shard(std::string dir, const CollectionSchema& schema, std::unique_ptr<ShardStore> store,
             int64_t resident_rerank_bytes, std::shared_ptr<ThreadPool> pool, LogSink log)
    : dir_(std::move(dir)),
      schema_(schema),
      store_(std::move(store)),
      pool_(std::move(pool)),
      log_(std::move(log)),
      resident_budget_(std::max<int64_t>(resident_rerank_bytes, 0)) {
  if (schema_.sparse.has_value()) {
    SparseIndexOptions options;
    options.scoring = *schema_.sparse;
    // The schema was validated: its scoring options are in range.
    absl::StatusOr<SparseIndex> index = SparseIndex::Create(options);
    MutexLock lock(&table_mu_);
    if (index.ok()) sparse_ = std::move(*index);
  }
}

Shard::~Shard() {
  stopping_.store(true, std::memory_order_release);
  if (trainer_.joinable()) trainer_.join();
}

absl::StatusOr<std::unique_ptr<Shard>> Shard::Open(const std::string& dir,
                                                   const CollectionSchema& schema,
                                                   const ShardStoreOptions& store_options,
                                                   int64_t resident_rerank_bytes,
                                                   std::shared_ptr<ThreadPool> pool) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  }
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<ShardStore> store,
                           ShardStore::Open(dir + "/db", store_options));
  std::unique_ptr<Shard> shard(new Shard(dir, schema, std::move(store), resident_rerank_bytes,
                                         std::move(pool), store_options.log));
  TESSERA_RETURN_IF_ERROR(shard->LoadDocuments());
  TESSERA_RETURN_IF_ERROR(shard->LoadResidentRerank());
  MutexLock lock(&shard->apply_mu_);
  TESSERA_RETURN_IF_ERROR(shard->LoadStage1());
  shard->MaybeStartTraining();
  return shard;
}

absl::Status Shard::PutMeta(const std::string& key, const std::string& value) {
  return store_->PutMeta(key, value);
}

absl::StatusOr<std::string> Shard::GetMeta(const std::string& key) const {
  return store_->GetMeta(key);
}

void Shard::AddLive(uint64_t iid, LiveDocument document) {
  original_tokens_ += document.num_tokens;
  rerank_vectors_ += document.num_rerank_vectors;
  if (document.rerank != nullptr) {
    const int64_t bytes = static_cast<int64_t>(document.rerank->bytes.size());
    if (resident_bytes_ + bytes <= resident_budget_) {
      resident_bytes_ += bytes;
    } else {
      document.rerank.reset();
    }
  }
  live_[iid] = std::move(document);
}

void Shard::RemoveLive(uint64_t iid) {
  const auto it = live_.find(iid);
  if (it == live_.end()) return;
  original_tokens_ -= it->second.num_tokens;
  rerank_vectors_ -= it->second.num_rerank_vectors;
  if (it->second.rerank != nullptr) {
    resident_bytes_ -= static_cast<int64_t>(it->second.rerank->bytes.size());
  }
  live_.erase(it);
}

absl::Status Shard::LoadDocuments() {
  MutexLock lock(&table_mu_);
  return store_->ForEachDocument([this](const DocumentRecord& record) {
    table_mu_.AssertHeld();
    AddLive(record.iid,
            LiveDocument{record.external_id, record.version, record.attributes, record.num_tokens,
                         static_cast<int64_t>(record.member_offsets.size()) - 1, nullptr});
    if (record.sparse.has_value() && sparse_.has_value()) {
      const absl::Status added = sparse_->Add(record.iid, record.sparse->view());
      if (!added.ok()) {
        return absl::DataLossError(absl::StrCat("shard '", dir_, "': sparse vector of iid ",
                                                record.iid, ": ", added.message()));
      }
    }
    return absl::OkStatus();
  });
}

absl::Status Shard::LoadResidentRerank() {
  if (resident_budget_ == 0) return absl::OkStatus();
  std::vector<uint64_t> iids = LiveIidsAbove(0);
  for (size_t start = 0; start < iids.size(); start += kReadBatch) {
    const absl::Span<const uint64_t> batch = absl::MakeConstSpan(iids).subspan(start, kReadBatch);
    TESSERA_ASSIGN_OR_RETURN(std::vector<std::optional<StoredMatrix>> matrices,
                             store_->MultiGetRerank(batch));
    MutexLock lock(&table_mu_);
    for (size_t i = 0; i < batch.size(); ++i) {
      // Nothing removes documents while the shard opens: a live one always has a rerank row.
      if (!matrices[i].has_value()) {
        return absl::NotFoundError(
            absl::StrCat("shard '", dir_, "': no rerank vectors for iid ", batch[i]));
      }
      if (matrices[i]->rows == 0) continue;  // reranked from its codes (rerank_from_codes)
      const int64_t bytes = static_cast<int64_t>(matrices[i]->bytes.size());
      if (resident_bytes_ + bytes > resident_budget_) return absl::OkStatus();
      resident_bytes_ += bytes;
      live_[batch[i]].rerank = std::make_shared<const StoredMatrix>(std::move(*matrices[i]));
    }
  }
  return absl::OkStatus();
}

std::vector<uint64_t> Shard::LiveIidsAbove(uint64_t after) const {
  std::vector<uint64_t> iids;
  {
    ReaderMutexLock lock(&table_mu_);
    for (const auto& [iid, document] : live_) {
      if (iid > after) iids.push_back(iid);
    }
  }
  std::sort(iids.begin(), iids.end());
  return iids;
}

absl::Status Shard::LoadStage1() {
  absl::StatusOr<std::string> generation = store_->GetMeta(kGenerationKey);
  if (absl::IsNotFound(generation.status())) return LoadOrRebuildCandidates();
  TESSERA_RETURN_IF_ERROR(generation.status());
  const std::vector<std::string> fields = absl::StrSplit(*generation, ' ');
  uint32_t number = 0;
  if (fields.size() != 2 || !absl::SimpleAtoi(fields[0], &number) || number == 0 ||
      !absl::SimpleAtoi(fields[1], &trained_vectors_)) {
    return absl::DataLossError(absl::StrCat("shard '", dir_, "': meta key ", kGenerationKey,
                                            " holds '", *generation, "', expected two numbers"));
  }
  return LoadCentroids(number);
}

absl::Status Shard::LoadCentroids(uint32_t generation) {
  TESSERA_ASSIGN_OR_RETURN(std::string bytes, store_->GetMeta(CodebookKey(generation)));
  absl::StatusOr<std::unique_ptr<CentroidCodebook>> codebook = CentroidCodebook::Parse(bytes);
  if (!codebook.ok()) {
    return absl::DataLossError(absl::StrCat("shard '", dir_, "': meta key ",
                                            CodebookKey(generation), ": ",
                                            codebook.status().message()));
  }
  if ((*codebook)->dim() != schema_.dim) {
    return absl::DataLossError(absl::StrCat("shard '", dir_, "': codebook of dim ",
                                            (*codebook)->dim(), ", the schema has ", schema_.dim));
  }
  auto index =
      std::make_shared<CentroidIndex>(std::move(*codebook), schema_.candidates.rerank_from_codes);
  const int64_t code_bytes = index->codebook().codec().code_bytes();
  const int64_t num_centroids = index->codebook().num_centroids();
  std::vector<uint64_t> orphans;
  {
    ReaderMutexLock lock(&table_mu_);
    TESSERA_RETURN_IF_ERROR(store_->ForEachCodes(
        generation, [&](uint64_t iid, const std::string& bytes) -> absl::Status {
          table_mu_.AssertReaderHeld();
          if (!live_.contains(iid)) {
            orphans.push_back(iid);
            return absl::OkStatus();
          }
          absl::StatusOr<DocumentCodes> codes =
              ParseDocumentCodes(bytes, code_bytes, num_centroids);
          if (!codes.ok()) {
            return absl::DataLossError(absl::StrCat("shard '", dir_, "': codes of iid ", iid, ": ",
                                                    codes.status().message()));
          }
          return index->Add(iid, *codes);
        }));
  }
  // Live documents without codes (written by no path we know of, but cheap to heal): encode them.
  std::vector<uint64_t> missing;
  for (uint64_t iid : LiveIidsAbove(0)) {
    if (!index->Contains(iid)) missing.push_back(iid);
  }
  std::vector<std::pair<uint64_t, std::string>> healed;
  TESSERA_RETURN_IF_ERROR(EncodeDocuments(missing, index.get(), &healed));
  if (!healed.empty() || !orphans.empty()) {
    TESSERA_RETURN_IF_ERROR(store_->PutCodes(generation, healed, orphans));
  }
  // A crash between a training's commit and its drop of the rerank rows left them.
  if (schema_.candidates.rerank_from_codes) TESSERA_RETURN_IF_ERROR(DropRerankRows());
  // A training that did not finish left a newer generation; an older one may not be dropped yet.
  TESSERA_RETURN_IF_ERROR(store_->DropCodeGenerationsExcept(generation));
  store_->SetCodeGenerations({generation});
  // Dead once the centroid index is in use: candidate vectors a crash left between a training's
  // commit and its cleanup, or that a shard kept from before that cleanup existed.
  TESSERA_RETURN_IF_ERROR(store_->DropAllCandidates());
  std::error_code ignored;
  std::filesystem::remove(dir_ + "/" + kSnapshotFile, ignored);
  MutexLock lock(&stage1_mu_);
  stage1_ = Stage1{std::make_shared<CentroidStage1>(index, generation), index->shared_codebook(),
                   generation, index};
  return absl::OkStatus();
}

absl::Status Shard::RebuildCandidates() {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<CandidateIndex> index,
                           CandidateIndex::Create(CandidateOptions(schema_)));
  uint64_t max_iid = 0;
  TESSERA_RETURN_IF_ERROR(
      store_->ForEachCandidates(0, [&](uint64_t iid, const StoredMatrix& vectors) {
        max_iid = std::max(max_iid, iid);
        return index->Add(iid, View(vectors));
      }));
  MutexLock lock(&stage1_mu_);
  stage1_ = Stage1{
      std::make_shared<CandidateStage1>(std::move(index), schema_.dim, schema_.candidates, max_iid),
      nullptr, 0, nullptr};
  return absl::OkStatus();
}

absl::Status Shard::LoadOrRebuildCandidates() {
  auto loaded = CandidateIndex::Load(dir_ + "/" + kSnapshotFile, CandidateOptions(schema_));
  if (!loaded.ok()) {
    // Only an acceleration: rebuilt from the store. A missing one is normal (a new shard, a
    // crash before the first snapshot); a corrupt one is worth a line in the log.
    if (!absl::IsNotFound(loaded.status())) {
      Log(log_, {LogSeverity::kWarning,
                 "rebuilding the candidate index",
                 {{"directory", dir_}, {"error", std::string(loaded.status().message())}}});
    }
    return RebuildCandidates();
  }
  std::unique_ptr<CandidateIndex> index = std::move(loaded->first);
  const uint64_t covered = loaded->second;
  // Reconcile with the store: drop documents deleted since, and check that every live document
  // the snapshot claims to cover is in it; anything else means a stale or foreign snapshot.
  std::vector<uint64_t> indexed = index->Documents();
  bool consistent = true;
  {
    ReaderMutexLock lock(&table_mu_);
    for (uint64_t iid : indexed) {
      if (iid > covered) consistent = false;
      if (!live_.contains(iid)) TESSERA_RETURN_IF_ERROR(index->Remove(iid));
    }
    for (const auto& [iid, document] : live_) {
      if (iid <= covered && !std::binary_search(indexed.begin(), indexed.end(), iid)) {
        consistent = false;
      }
    }
  }
  if (!consistent) return RebuildCandidates();
  uint64_t max_iid = covered;
  TESSERA_RETURN_IF_ERROR(
      store_->ForEachCandidates(covered + 1, [&](uint64_t iid, const StoredMatrix& v) {
        max_iid = std::max(max_iid, iid);
        return index->Add(iid, View(v));
      }));
  MutexLock lock(&stage1_mu_);
  stage1_ = Stage1{
      std::make_shared<CandidateStage1>(std::move(index), schema_.dim, schema_.candidates, max_iid),
      nullptr, 0, nullptr};
  return absl::OkStatus();
}

Shard::Stage1 Shard::CurrentStage1() const {
  ReaderMutexLock lock(&stage1_mu_);
  return stage1_;
}

int Shard::DefaultNumCandidates(int k) const {
  const Stage1 stage1 = CurrentStage1();
  ReaderMutexLock lock(&table_mu_);
  return stage1.index->DefaultNumDocuments(k, rerank_vectors_);
}

absl::StatusOr<WriteResult> Shard::Apply(std::vector<ShardWrite> upserts,
                                         const std::vector<std::string>& deletes) {
  TESSERA_RETURN_IF_ERROR(FailedStatus());
  // What indexing needs, kept before the store takes ownership of the writes.
  std::vector<LiveDocument> documents;
  std::vector<Stage1Payload> payloads;
  documents.reserve(upserts.size());
  WriteResult result;
  Stage1 stage1;
  {
    // Held until the write commits: the stage 1 that derives the payloads is the one that indexes
    // them (a training swaps its index in only with this held exclusively).
    ReaderMutexLock encoding(&encode_mu_);
    stage1 = CurrentStage1();
    std::vector<std::string> whats;
    whats.reserve(upserts.size());
    for (ShardWrite& upsert : upserts) {
      DocumentWrite& write = upsert.document;
      const DocumentRecord& record = write.record;
      // Everything indexing checks, checked before the durable write (what stage 1 would
      // otherwise refuse after it; Derive checks its payloads).
      whats.push_back(absl::StrCat("document '", record.external_id, "'"));
      const std::string& what = whats.back();
      if (write.rerank.rows < 1 || write.rerank.cols != schema_.dim) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": ", write.rerank.rows, " × ", write.rerank.cols,
                         " rerank vectors, expected ≥ 1 × ", schema_.dim));
      }
      TESSERA_RETURN_IF_ERROR(
          CheckStoredValues(write.rerank, absl::StrCat(what, ": rerank vectors")));
      if (record.sparse.has_value()) {
        if (!schema_.sparse.has_value()) {
          return absl::InvalidArgumentError(
              absl::StrCat(what, ": a sparse vector, but the collection has no sparse field"));
        }
        TESSERA_RETURN_IF_ERROR(
            ValidateSparseVector(record.sparse->view(), absl::StrCat(what, ": sparse")));
      }
      documents.push_back(LiveDocument{record.external_id, 0, record.attributes, record.num_tokens,
                                       static_cast<int64_t>(record.member_offsets.size()) - 1,
                                       nullptr, record.sparse});
      // A copy for memory; AddLive drops it when the budget is spent.
      if (resident_budget_ > 0) {
        documents.back().rerank = std::make_shared<const StoredMatrix>(write.rerank);
      }
    }
    std::vector<Stage1Source> sources(upserts.size());
    for (size_t i = 0; i < upserts.size(); ++i) {
      const ShardWrite& upsert = upserts[i];
      sources[i].what = whats[i];
      sources[i].stored = &upsert.document.rerank;
      if (!upsert.pooled.empty()) {
        sources[i].pooled = FloatMatrixView{upsert.pooled.data(), upsert.document.rerank.rows,
                                            upsert.document.rerank.cols};
      }
    }
    TESSERA_ASSIGN_OR_RETURN(payloads, stage1.index->Derive(sources, pool_.get()));
    std::vector<DocumentWrite> writes;
    writes.reserve(upserts.size());
    for (size_t i = 0; i < upserts.size(); ++i) {
      DocumentWrite& write = upserts[i].document;
      stage1.index->Persist(payloads[i], &write);
      if (schema_.candidates.rerank_from_codes && stage1.codebook != nullptr) {
        // No rows: FetchRerank decodes the codes instead.
        write.rerank = StoredMatrix{schema_.dtype, 0, schema_.dim, {}};
        documents[i].rerank.reset();
      }
      writes.push_back(std::move(write));
    }
    upserts.clear();
    TESSERA_ASSIGN_OR_RETURN(result, store_->Write(std::move(writes), deletes));
    uint64_t seen = max_commit_seen_.load(std::memory_order_relaxed);
    while (seen < result.commit_index &&
           !max_commit_seen_.compare_exchange_weak(seen, result.commit_index)) {
    }
  }

  // Index in the store's commit order: concurrent Apply calls committed in one group wait here
  // for their turn. A training cannot swap its index in between (it waits for this turn too), so
  // `stage1` is still the index in use.
  MutexLock lock(&apply_mu_);
  while (next_commit_ != result.commit_index) applied_.Wait(&apply_mu_);
  const absl::Status status = ApplyDerived(*stage1.index, std::move(documents), payloads, result);
  ++next_commit_;
  applied_.SignalAll();
  if (!status.ok()) {
    // The write is durable and the table matches the store, but the index misses part of it:
    // no search may run on it, and no write may build on it, until a reopen rebuilds it.
    const absl::Status failed = absl::InternalError(absl::StrCat(
        "shard '", dir_, "': a write is durable but indexing it failed (", status.message(),
        "); the shard refuses writes and searches until it is reopened, which rebuilds its "
        "index from the store"));
    Log(log_, {LogSeverity::kError, "shard failed", {{"error", std::string(failed.message())}}});
    MutexLock failed_lock(&failed_mu_);
    if (failed_.ok()) failed_ = failed;
    return failed_;
  }
  MaybeStartTraining();
  return result;
}

absl::Status Shard::FailedStatus() const {
  ReaderMutexLock lock(&failed_mu_);
  return failed_;
}

void Shard::FailNextIndexUpdateForTesting(absl::Status status) {
  MutexLock lock(&apply_mu_);
  index_fault_ = std::move(status);
}

absl::Status Shard::ApplyDerived(Stage1Index& index, std::vector<LiveDocument> documents,
                                 const std::vector<Stage1Payload>& payloads,
                                 const WriteResult& result) {
  // Every step is attempted and the table always follows the store; the first index error is
  // returned (the caller fails the shard).
  absl::Status status = std::move(index_fault_);
  index_fault_ = absl::OkStatus();
  for (size_t i = 0; i < documents.size(); ++i) {
    const uint64_t replaced = result.replaced_iids[i];
    const uint64_t iid = result.upserted_iids[i];
    if (replaced != 0) status.Update(index.Remove(replaced));
    status.Update(index.Add(iid, payloads[i]));
  }
  for (uint64_t deleted : result.deleted_iids) {
    if (deleted != 0) status.Update(index.Remove(deleted));
  }
  MutexLock lock(&table_mu_);
  for (size_t i = 0; i < documents.size(); ++i) {
    if (result.replaced_iids[i] != 0) {
      RemoveLive(result.replaced_iids[i]);
      if (sparse_.has_value()) sparse_->Remove(result.replaced_iids[i]);
    }
    documents[i].version = result.versions[i];
    if (documents[i].sparse.has_value() && sparse_.has_value()) {
      status.Update(sparse_->Add(result.upserted_iids[i], documents[i].sparse->view()));
    }
    documents[i].sparse.reset();
    AddLive(result.upserted_iids[i], std::move(documents[i]));
  }
  for (uint64_t deleted : result.deleted_iids) {
    if (deleted == 0) continue;
    RemoveLive(deleted);
    if (sparse_.has_value()) sparse_->Remove(deleted);
  }
  return status;
}

bool Shard::OutgrewTraining() const {
  if (stopping_.load(std::memory_order_acquire) || !FailedStatus().ok()) return false;
  int64_t vectors = 0;
  {
    ReaderMutexLock lock(&table_mu_);
    vectors = rerank_vectors_;
  }
  if (trained_vectors_ == 0) return WantsCentroidIndex(schema_.candidates, vectors);
  // A rerank_from_codes shard retrains by the same rules, on its decoded codes (Train).
  // Grown kRetrainGrowth times past the last training, or large enough to call for more centroids
  // than the last training asked for: a training that started late (while another ran) sized its
  // codebook from the count it saw, and the shard may end its growth before the next 4× (a
  // 20k-document shard kept 4,096 centroids where its 1.28M vectors call for 8,192). Compared with
  // what the training asked for, not with the codebook it got: k-means keeps at most one centroid
  // per sampled vector, so a shard below kMinCentroids vectors gets fewer centroids than
  // DefaultNumCentroids' floor, and comparing with that retrained it on the same vectors forever.
  // Both tests are false right after a training on the shard's current vectors.
  return vectors >= kRetrainGrowth * trained_vectors_ ||
         DefaultNumCentroids(vectors) > DefaultNumCentroids(trained_vectors_);
}

void Shard::MaybeStartTraining() {
  if (training_ || !OutgrewTraining()) return;
  training_ = true;
  // The previous training's thread has finished (training_ was false); reap it.
  if (trainer_.joinable()) trainer_.join();
  trainer_ = std::thread([this] { TrainingThread(); });
}

void Shard::TrainingThread() {
  for (;;) {
    // On failure stage 1 stays as it was; the next write that finds the shard outgrown tries again.
    const absl::Status status = TrainAndReport();
    MutexLock lock(&apply_mu_);
    // Writes that found the shard outgrown while this training ran did not start another (one
    // runs at a time), and once ingest has ended no write comes to notice: check here.
    if (status.ok() && trained_vectors_ > 0 && OutgrewTraining()) continue;
    training_ = false;
    applied_.SignalAll();
    return;
  }
}

absl::Status Shard::EncodeDocuments(absl::Span<const uint64_t> iids, CentroidIndex* index,
                                    std::vector<std::pair<uint64_t, std::string>>* codes) const {
  for (size_t start = 0; start < iids.size(); start += kReadBatch) {
    if (stopping_.load(std::memory_order_acquire)) {
      return absl::CancelledError("the shard is closing");
    }
    const absl::Span<const uint64_t> batch = iids.subspan(start, kReadBatch);
    TESSERA_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<const StoredMatrix>> matrices,
                             FetchRerank(batch));
    std::vector<const StoredMatrix*> stored(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) stored[i] = matrices[i].get();
    const std::vector<DocumentCodes> encoded = EncodeOnPool(*index, stored, pool_.get());
    for (size_t i = 0; i < batch.size(); ++i) {
      if (matrices[i] == nullptr) continue;  // removed since
      TESSERA_RETURN_IF_ERROR(index->Add(batch[i], encoded[i]));
      codes->emplace_back(batch[i], SerializeDocumentCodes(encoded[i]));
    }
  }
  return absl::OkStatus();
}

absl::Status Shard::TrainAndReport() {
  const auto start = std::chrono::steady_clock::now();
  TrainingRun run;
  absl::Status status = Train(&run);
  if (run.centroids == 0) return status;  // nothing to train on: no training started
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<std::pair<std::string, std::string>> fields = {
      {"vectors", std::to_string(run.vectors)},
      {"centroids", std::to_string(run.centroids)},
      {"generation", std::to_string(run.generation)},
      {"seconds", absl::StrFormat("%.3f", seconds)}};
  if (status.ok()) {
    trainings_completed_.fetch_add(1, std::memory_order_relaxed);
    Log(log_, {LogSeverity::kInfo, "training finished", std::move(fields)});
  } else if (stopping_.load(std::memory_order_acquire)) {
    Log(log_, {LogSeverity::kInfo, "training abandoned: the shard is closing", std::move(fields)});
  } else {
    trainings_failed_.fetch_add(1, std::memory_order_relaxed);
    fields.emplace_back("code", absl::StatusCodeToString(status.code()));
    fields.emplace_back("error", std::string(status.message()));
    Log(log_, {LogSeverity::kError, "training failed", std::move(fields)});
  }
  last_training_seconds_.store(seconds, std::memory_order_relaxed);
  last_training_end_.store(std::chrono::steady_clock::now().time_since_epoch().count(),
                           std::memory_order_relaxed);
  return status;
}

absl::Status Shard::Train(TrainingRun* run) {
  uint32_t generation = 0;
  {
    ReaderMutexLock lock(&stage1_mu_);
    generation = stage1_.generation + 1;
  }
  // 1. A sample: all vectors of documents taken in a seeded random order.
  std::vector<uint64_t> iids = LiveIidsAbove(0);
  int64_t total_vectors = 0;
  {
    ReaderMutexLock lock(&table_mu_);
    for (uint64_t iid : iids) {
      const auto it = live_.find(iid);
      if (it != live_.end()) total_vectors += it->second.num_rerank_vectors;
    }
  }
  if (iids.empty() || total_vectors == 0) return absl::OkStatus();
  const int64_t num_centroids = DefaultNumCentroids(total_vectors);
  *run = TrainingRun{total_vectors, num_centroids, generation};
  Log(log_, {LogSeverity::kInfo,
             "training started",
             {{"vectors", std::to_string(total_vectors)},
              {"centroids", std::to_string(num_centroids)},
              {"generation", std::to_string(generation)}}});
  const int64_t want = TrainingSampleVectors(num_centroids, total_vectors, schema_.dim);
  std::vector<uint64_t> order = iids;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(kSampleSeed));
  std::vector<float> sample;
  sample.reserve(want * schema_.dim);
  for (size_t start = 0;
       start < order.size() && static_cast<int64_t>(sample.size()) < want * schema_.dim;
       start += kReadBatch) {
    if (stopping_.load(std::memory_order_acquire)) return absl::CancelledError("closing");
    TESSERA_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<const StoredMatrix>> matrices,
                             FetchRerank(absl::MakeConstSpan(order).subspan(start, kReadBatch)));
    for (const auto& matrix : matrices) {
      if (matrix == nullptr) continue;
      const std::vector<float> vectors = MatrixToFloat(*matrix);
      sample.insert(sample.end(), vectors.begin(), vectors.end());
    }
  }
  CentroidTrainingOptions options;
  options.num_centroids = num_centroids;
  options.nbits = EffectiveResidualBits(schema_.candidates);
  const int64_t sample_rows = static_cast<int64_t>(sample.size()) / schema_.dim;
  TESSERA_ASSIGN_OR_RETURN(
      std::unique_ptr<CentroidCodebook> codebook,
      CentroidCodebook::Train(FloatMatrixView{sample.data(), sample_rows, schema_.dim}, options,
                              pool_.get()));
  std::vector<float>().swap(sample);
  TESSERA_RETURN_IF_ERROR(store_->PutMeta(CodebookKey(generation), codebook->Serialize()));
  auto index =
      std::make_shared<CentroidIndex>(std::move(codebook), schema_.candidates.rerank_from_codes);

  // 2. Encode every live document into the new index and generation, while writes go on against
  // the old index. Removals delete codes of both generations from now on.
  if (generation > 1) {
    store_->SetCodeGenerations({generation - 1, generation});
  } else {
    store_->SetCodeGenerations({generation});
  }
  uint64_t covered = 0;
  std::vector<uint64_t> pending = std::move(iids);
  do {
    std::vector<std::pair<uint64_t, std::string>> codes;
    TESSERA_RETURN_IF_ERROR(EncodeDocuments(pending, index.get(), &codes));
    TESSERA_RETURN_IF_ERROR(store_->PutCodes(generation, codes, {}));
    if (!pending.empty()) covered = std::max(covered, pending.back());
    pending = LiveIidsAbove(covered);
  } while (pending.size() >= kCatchUpDocuments);
  std::function<void()> hook;
  {
    MutexLock lock(&apply_mu_);
    hook = training_hook_;
  }
  if (hook) hook();

  // 3. Catch up with the write path held: no write is between encoding and commit, and every
  // committed write has been applied, so the table is exactly the store.
  MutexLock encoding(&encode_mu_);
  MutexLock lock(&apply_mu_);
  while (next_commit_ <= max_commit_seen_.load(std::memory_order_acquire)) {
    applied_.Wait(&apply_mu_);
  }
  if (stopping_.load(std::memory_order_acquire)) return absl::CancelledError("closing");
  std::vector<std::pair<uint64_t, std::string>> codes;
  TESSERA_RETURN_IF_ERROR(EncodeDocuments(LiveIidsAbove(covered), index.get(), &codes));
  std::vector<uint64_t> removed;
  {
    ReaderMutexLock table(&table_mu_);
    for (uint64_t iid : index->Documents()) {
      if (!live_.contains(iid)) removed.push_back(iid);
    }
  }
  for (uint64_t iid : removed) index->Remove(iid);
  TESSERA_RETURN_IF_ERROR(store_->PutCodes(generation, codes, removed));
  // The commit point: from here on the new generation is the shard's stage 1.
  TESSERA_RETURN_IF_ERROR(
      store_->PutMeta(kGenerationKey, absl::StrCat(generation, " ", total_vectors)));
  trained_vectors_ = total_vectors;
  {
    MutexLock swap(&stage1_mu_);
    stage1_ = Stage1{std::make_shared<CentroidStage1>(index, generation), index->shared_codebook(),
                     generation, index};
  }
  store_->SetCodeGenerations({generation});
  // Rerank from codes: the documents written before the codebook have codes now, and keep no
  // rows (a crash before this is healed at open).
  if (schema_.candidates.rerank_from_codes) TESSERA_RETURN_IF_ERROR(DropRerankRows());
  // What the old stage 1 left on disk: its codes, the candidate vectors, the candidate index
  // snapshot.
  TESSERA_RETURN_IF_ERROR(store_->DropCodeGenerationsExcept(generation));
  TESSERA_RETURN_IF_ERROR(store_->DropAllCandidates());
  if (generation > 1) {
    // The store has no meta delete; an empty value frees the old codebook's bytes.
    TESSERA_RETURN_IF_ERROR(store_->PutMeta(CodebookKey(generation - 1), ""));
  }
  std::error_code ignored;
  std::filesystem::remove(dir_ + "/" + kSnapshotFile, ignored);
  return absl::OkStatus();
}

absl::Status Shard::DropRerankRows() {
  TESSERA_ASSIGN_OR_RETURN(const std::vector<uint64_t> dropped, store_->DropAllRerankRows());
  MutexLock lock(&table_mu_);
  for (uint64_t iid : dropped) {
    const auto it = live_.find(iid);
    if (it == live_.end() || it->second.rerank == nullptr) continue;
    resident_bytes_ -= static_cast<int64_t>(it->second.rerank->bytes.size());
    it->second.rerank.reset();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Stage1Hit>> Shard::SearchCandidates(const Stage1Request& request) const {
  TESSERA_RETURN_IF_ERROR(FailedStatus());
  const Stage1 stage1 = CurrentStage1();
  if (request.filter == nullptr || request.filter->empty()) {
    return stage1.index->Search(request, nullptr, pool_.get());
  }
  ReaderMutexLock lock(&table_mu_);
  const std::function<bool(uint64_t)> accept = [this, &request](uint64_t iid) {
    table_mu_.AssertReaderHeld();
    const auto it = live_.find(iid);
    return it != live_.end() && FilterMatches(*request.filter, it->second.attributes);
  };
  return stage1.index->Search(request, &accept, pool_.get());
}

absl::StatusOr<std::vector<SparseLaneHit>> Shard::SearchSparse(const SparseVectorView& query,
                                                               int64_t k, const Filter& filter,
                                                               const SparseStatistics* statistics,
                                                               bool want_attributes) const {
  ReaderMutexLock lock(&table_mu_);
  if (!sparse_.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse_query: collection '", schema_.name, "' has no sparse field"));
  }
  SparseSearchRequest request;
  request.query = query;
  request.k = k;
  request.statistics = statistics;
  if (!filter.empty()) {
    request.filter = [this, &filter](uint64_t iid) {
      table_mu_.AssertReaderHeld();
      const auto it = live_.find(iid);
      return it != live_.end() && FilterMatches(filter, it->second.attributes);
    };
  }
  TESSERA_ASSIGN_OR_RETURN(SparseSearchResult found, sparse_->Search(request));
  std::vector<SparseLaneHit> hits;
  hits.reserve(found.hits.size());
  for (const SparseHit& hit : found.hits) {
    const auto it = live_.find(hit.iid);
    if (it == live_.end()) continue;  // the index holds live documents only
    SparseLaneHit out;
    out.iid = hit.iid;
    out.score = hit.score;
    out.external_id = it->second.external_id;
    out.version = it->second.version;
    if (want_attributes) out.attributes = it->second.attributes;
    hits.push_back(std::move(out));
  }
  return hits;
}

SparseStatistics Shard::SparseStatisticsOf(absl::Span<const uint32_t> terms) const {
  ReaderMutexLock lock(&table_mu_);
  if (!sparse_.has_value()) return SparseStatistics{};
  return sparse_->Statistics(terms);
}

void Shard::ForEachLive(const Filter& filter,
                        const std::function<void(uint64_t, const LiveDocument&)>& fn) const {
  ReaderMutexLock lock(&table_mu_);
  for (const auto& [iid, document] : live_) {
    if (filter.empty() || FilterMatches(filter, document.attributes)) fn(iid, document);
  }
}

absl::StatusOr<std::vector<std::shared_ptr<const StoredMatrix>>> Shard::FetchRerank(
    absl::Span<const uint64_t> iids) const {
  std::vector<std::shared_ptr<const StoredMatrix>> matrices(iids.size());
  std::vector<uint64_t> missing;
  std::vector<size_t> missing_at;
  {
    ReaderMutexLock lock(&table_mu_);
    for (size_t i = 0; i < iids.size(); ++i) {
      const auto it = live_.find(iids[i]);
      if (it != live_.end() && it->second.rerank != nullptr) {
        matrices[i] = it->second.rerank;
      } else {
        missing.push_back(iids[i]);
        missing_at.push_back(i);
      }
    }
  }
  if (missing.empty()) return matrices;
  const int64_t parts = ReadParts(missing.size(), pool_->num_threads());
  std::vector<absl::Status> statuses(parts);
  pool_->ParallelFor(parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t part = begin; part < end; ++part) {
      const size_t first = missing.size() * part / parts;
      const size_t last = missing.size() * (part + 1) / parts;
      absl::StatusOr<std::vector<std::optional<StoredMatrix>>> stored =
          store_->MultiGetRerank(absl::MakeConstSpan(missing).subspan(first, last - first));
      if (!stored.ok()) {
        statuses[part] = stored.status();
        continue;
      }
      for (size_t j = first; j < last; ++j) {
        // Absent: removed since; left null.
        if (!(*stored)[j - first].has_value()) continue;
        matrices[missing_at[j]] =
            std::make_shared<const StoredMatrix>(std::move(*(*stored)[j - first]));
      }
    }
  });
  for (const absl::Status& status : statuses) TESSERA_RETURN_IF_ERROR(status);
  TESSERA_RETURN_IF_ERROR(DecodeRerankFromCodes(iids, &matrices));
  return matrices;
}

absl::StatusOr<std::vector<std::shared_ptr<const StoredMatrixView>>> Shard::FetchStoredRerank(
    absl::Span<const uint64_t> iids) const {
  // Resident documents are viewed in their table entries (kept alive with the views), the others
  // in place in the store: one lookup per document, no copy, so no split over the pool.
  struct Resident {
    std::vector<StoredMatrixView> views;
    std::vector<std::shared_ptr<const StoredMatrix>> matrices;
  };
  std::vector<std::shared_ptr<const StoredMatrixView>> views(iids.size());
  if (schema_.candidates.rerank_from_codes && CurrentStage1().centroids != nullptr) {
    // Every document of the shard is in its centroid index, whose codes stage 2 reads (those
    // written before the codebook keep rows only until its training drops them): a view without
    // rows for each live one, and no read of the store.
    const auto codes_only = std::make_shared<const StoredMatrixView>(
        StoredMatrixView{schema_.dtype, 0, schema_.dim, absl::string_view()});
    ReaderMutexLock lock(&table_mu_);
    for (size_t i = 0; i < iids.size(); ++i) {
      if (live_.contains(iids[i])) views[i] = codes_only;
    }
    return views;
  }
  auto resident = std::make_shared<Resident>();
  resident->views.resize(iids.size());
  std::vector<uint64_t> missing;
  std::vector<size_t> missing_at;
  {
    ReaderMutexLock lock(&table_mu_);
    for (size_t i = 0; i < iids.size(); ++i) {
      const auto it = live_.find(iids[i]);
      if (it != live_.end() && it->second.rerank != nullptr) {
        resident->views[i] = ViewOf(*it->second.rerank);
        resident->matrices.push_back(it->second.rerank);
        views[i] = std::shared_ptr<const StoredMatrixView>(resident, &resident->views[i]);
      } else {
        missing.push_back(iids[i]);
        missing_at.push_back(i);
      }
    }
  }
  if (missing.empty()) return views;
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<const StoredMatrixView>> stored,
                           store_->ReadRerank(missing));
  // Absent: removed since; left null.
  for (size_t j = 0; j < missing.size(); ++j) views[missing_at[j]] = std::move(stored[j]);
  return views;
}

absl::StatusOr<Shard::CodedDocuments> Shard::FetchCodes(absl::Span<const uint64_t> iids) const {
  CodedDocuments documents;
  documents.requested = iids.size();
  if (iids.empty()) return documents;
  const Stage1 stage1 = CurrentStage1();
  if (stage1.codebook == nullptr || stage1.centroids == nullptr) {
    return absl::DataLossError(absl::StrCat("shard '", dir_, "': iid ", iids[0],
                                            " has no rerank vectors and the shard no codebook"));
  }
  documents.codebook = stage1.codebook;
  const int64_t code_bytes = documents.codebook->codec().code_bytes();
  // Resident codes (the centroid index keeps each document's for a rerank_from_codes shard): laid
  // out in parts of at least kMinReadsPerPart documents over the pool, as the reads of stored rows
  // are.
  const int64_t parts = ReadParts(iids.size(), pool_->num_threads());
  documents.parts.assign(parts, CompactDocuments(code_bytes));
  documents.positions.resize(parts);
  std::vector<absl::Status> statuses(parts);
  pool_->ParallelFor(parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t part = begin; part < end; ++part) {
      const size_t first = iids.size() * part / parts;
      const size_t last = iids.size() * (part + 1) / parts;
      statuses[part] = stage1.centroids->GatherCompact(
          iids.subspan(first, last - first), &documents.parts[part], &documents.positions[part]);
      for (size_t& position : documents.positions[part]) position += first;
    }
  });
  for (const absl::Status& status : statuses) TESSERA_RETURN_IF_ERROR(status);
  return documents;
}

absl::StatusOr<std::vector<std::optional<float>>> Shard::ScoreCodes(
    FloatMatrixView query, const CodedDocuments& documents) const {
  std::vector<std::optional<float>> scores(documents.requested);
  std::vector<std::vector<CompactDocument>> refs(documents.parts.size());
  for (size_t part = 0; part < documents.parts.size(); ++part) {
    refs[part] = documents.parts[part].refs();
  }
  if (std::all_of(refs.begin(), refs.end(), [](const auto& r) { return r.empty(); })) {
    return scores;
  }
  const CentroidCodebook& codebook = *documents.codebook;
  const int64_t C = codebook.num_centroids();
  const int64_t dim = codebook.dim();
  const int64_t nq = query.rows;
  if (nq < 1 || query.cols != dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("query of ", nq, " × ", query.cols, ", expected ≥ 1 × ", dim));
  }

  // The query × centroid table, token-major (row i: token i's score of every centroid), filled
  // only in the columns of the centroids the documents use: the kernel reads no other.
  std::vector<uint8_t> used(C, 0);
  for (const std::vector<CompactDocument>& part : refs) {
    for (const CompactDocument& document : part) {
      for (int64_t t = 0; t < document.num_tokens; ++t) used[document.centroid_ids[t]] = 1;
    }
  }
  std::vector<uint32_t> referenced;
  for (int64_t c = 0; c < C; ++c) {
    if (used[c]) referenced.push_back(static_cast<uint32_t>(c));
  }
  std::unique_ptr<float[]> table(new float[nq * C]);
  const QuerySimilarity similarity(query);
  const int64_t stride = similarity.stride();
  constexpr int64_t kCentroidChunk = 1024;
  const int64_t num_referenced = static_cast<int64_t>(referenced.size());
  const int64_t chunks = (num_referenced + kCentroidChunk - 1) / kCentroidChunk;
  pool_->ParallelFor(chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> centroids(kCentroidChunk * dim);
    std::vector<float> block(kCentroidChunk * stride);
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      const int64_t first = chunk * kCentroidChunk;
      const int64_t n = std::min(kCentroidChunk, num_referenced - first);
      for (int64_t j = 0; j < n; ++j) {
        std::memcpy(&centroids[j * dim], codebook.centroids() + referenced[first + j] * dim,
                    dim * sizeof(float));
      }
      similarity.Compute(centroids.data(), n, block.data());
      for (int64_t i = 0; i < nq; ++i) {
        float* row = &table[i * C];
        for (int64_t j = 0; j < n; ++j) row[referenced[first + j]] = block[j * stride + i];
      }
    }
  });

  const CompactQuery compact(codebook.codec(), query.data, nq, table.get(), C);
  std::vector<std::vector<float>> part_scores(refs.size());
  std::vector<absl::Status> statuses(refs.size());
  pool_->ParallelFor(static_cast<int64_t>(refs.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t part = begin; part < end; ++part) {
      part_scores[part].resize(refs[part].size());
      statuses[part] = ScoreCompactDocuments(compact, refs[part], part_scores[part].data());
    }
  });
  for (const absl::Status& status : statuses) TESSERA_RETURN_IF_ERROR(status);
  for (size_t part = 0; part < refs.size(); ++part) {
    for (size_t d = 0; d < refs[part].size(); ++d) {
      scores[documents.positions[part][d]] = part_scores[part][d];
    }
  }
  return scores;
}

absl::Status Shard::DecodeRerankFromCodes(
    absl::Span<const uint64_t> iids,
    std::vector<std::shared_ptr<const StoredMatrix>>* matrices) const {
  std::vector<uint64_t> coded;
  std::vector<size_t> coded_at;
  for (size_t i = 0; i < iids.size(); ++i) {
    if ((*matrices)[i] != nullptr && (*matrices)[i]->rows == 0) {
      coded.push_back(iids[i]);
      coded_at.push_back(i);
    }
  }
  if (coded.empty()) return absl::OkStatus();
  // Only rerank_from_codes writes documents without rows, and only once the centroid index is in
  // use. Its codebook changes with each retraining: the codes come from the centroid index of the
  // same Stage1 (which keeps every document's), so that they always match the codebook, even when
  // a training swaps its index in meanwhile and drops the older generation's stored codes.
  const Stage1 stage1 = CurrentStage1();
  if (stage1.codebook == nullptr || stage1.centroids == nullptr) {
    return absl::DataLossError(absl::StrCat("shard '", dir_, "': iid ", coded[0],
                                            " has no rerank vectors and the shard no codebook"));
  }
  const CentroidCodebook& codebook = *stage1.codebook;
  const int64_t code_bytes = codebook.codec().code_bytes();
  TESSERA_ASSIGN_OR_RETURN(const std::vector<std::optional<DocumentCodes>> found,
                           stage1.centroids->CodesOf(coded));
  for (size_t j = 0; j < coded.size(); ++j) {
    std::shared_ptr<const StoredMatrix>& matrix = (*matrices)[coded_at[j]];
    if (!found[j].has_value()) {  // removed since (a removal deletes its codes)
      matrix = nullptr;
      continue;
    }
    const DocumentCodes& codes = *found[j];
    std::vector<float> values(codes.size() * schema_.dim);
    for (int64_t v = 0; v < codes.size(); ++v) {
      codebook.Decode(codes.centroids[v],
                      reinterpret_cast<const uint8_t*>(codes.codes.data()) + v * code_bytes,
                      &values[v * schema_.dim]);
    }
    matrix = std::make_shared<const StoredMatrix>(
        MatrixFromFloat(values, codes.size(), schema_.dim, schema_.dtype));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Shard::LookupId(const std::string& external_id) const {
  return store_->LookupId(external_id);
}

absl::StatusOr<DocumentRecord> Shard::GetRecord(uint64_t iid) const {
  return store_->GetRecord(iid);
}

bool Shard::Describe(uint64_t iid, std::string* external_id, uint64_t* version) const {
  return Describe(iid, external_id, version, nullptr);
}

bool Shard::Describe(uint64_t iid, std::string* external_id, uint64_t* version,
                     Attributes* attributes) const {
  ReaderMutexLock lock(&table_mu_);
  const auto it = live_.find(iid);
  if (it == live_.end()) return false;
  *external_id = it->second.external_id;
  *version = it->second.version;
  if (attributes != nullptr) *attributes = it->second.attributes;
  return true;
}

int64_t Shard::num_documents() const {
  ReaderMutexLock lock(&table_mu_);
  return static_cast<int64_t>(live_.size());
}

ShardStats Shard::Stats() const {
  ShardStats stats;
  {
    ReaderMutexLock lock(&table_mu_);
    stats.documents = static_cast<int64_t>(live_.size());
    stats.original_tokens = original_tokens_;
    stats.rerank_vectors = rerank_vectors_;
    stats.resident_bytes = resident_bytes_;
  }
  Stage1Stats stage1 = CurrentStage1().index->Stats();
  stats.candidate_vectors = stage1.vectors;
  stats.candidate_bytes = stage1.memory_bytes;
  stats.candidate_index = std::move(stage1.name);
  // The database and the candidate index snapshot, preallocated space included.
  stats.disk_bytes = AllocatedBytes(dir_);
  stats.training = training_.load(std::memory_order_relaxed);
  stats.trainings_completed = trainings_completed_.load(std::memory_order_relaxed);
  stats.trainings_failed = trainings_failed_.load(std::memory_order_relaxed);
  stats.last_training_seconds = last_training_seconds_.load(std::memory_order_relaxed);
  stats.last_training_end = last_training_end_.load(std::memory_order_relaxed);
  return stats;
}

absl::Status Shard::Snapshot() const {
  TESSERA_RETURN_IF_ERROR(store_->Flush());
  MutexLock lock(&apply_mu_);
  // A failed shard's index is not saved: it misses documents.
  TESSERA_RETURN_IF_ERROR(FailedStatus());
  return CurrentStage1().index->Save(dir_ + "/" + kSnapshotFile);
}

absl::Status Shard::Checkpoint(const std::string& dir, uint64_t* sequence) const {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  }
  // The candidate index's snapshot (written atomically) as it is now, before the database: it
  // covers at most what the copy holds, and Open reconciles it with the copy or rebuilds it. Only
  // an acceleration: without it the copy's Open rebuilds the index.
  const std::string snapshot = dir_ + "/" + kSnapshotFile;
  if (std::filesystem::exists(snapshot, error)) {
    std::filesystem::create_hard_link(snapshot, dir + "/" + kSnapshotFile, error);
    if (error) {
      error.clear();
      std::filesystem::copy_file(snapshot, dir + "/" + kSnapshotFile, error);
    }
  }
  return store_->Checkpoint(dir + "/db", sequence);
}

void Shard::WaitForTrainingForTesting() const {
  MutexLock lock(&apply_mu_);
  while (training_) applied_.Wait(&apply_mu_);
}

uint32_t Shard::CentroidGenerationForTesting() const { return CurrentStage1().generation; }

std::shared_ptr<const CentroidCodebook> Shard::CodebookForTesting() const {
  return CurrentStage1().codebook;
}

void Shard::SetTrainingHookForTesting(std::function<void()> hook) {
  MutexLock lock(&apply_mu_);
  training_hook_ = std::move(hook);
}

}  // namespace tessera::internal
