// Shard, part 1 of 3: opening and closing, the write path (Apply, ApplyDerived) and the reads
// (stage 1, the sparse lane, rerank vectors and codes, the table's descriptions, statistics,
// snapshots). The training's lifecycle is in shard_training.cc, the recovery at Open in
// shard_recovery.cc.
#include "index/collection/shard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "index/collection/shard_internal.h"
#include "index/common/file_io.h"
#include "index/common/thread_pool.h"
#include "index/kernels/query_similarity.h"
#include "index/storage/record_codec.h"
#include "tessera/status_macros.h"

namespace tessera::internal {
namespace {

using shard_files::kSnapshotFile;

// A search's reads of rerank vectors or codes are split over the pool in parts of at least this
// many: a read that misses the page cache waits on the disk, and the parts wait together.
constexpr size_t kMinReadsPerPart = 16;
int64_t ReadParts(size_t reads, int64_t threads) {
  return std::min<int64_t>(threads,
                           static_cast<int64_t>((reads + kMinReadsPerPart - 1) / kMinReadsPerPart));
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
      live_(resident_rerank_bytes, schema_.sparse) {}

Shard::~Shard() {
  stopping_.store(true, std::memory_order_release);
  {
    MutexLock lock(&apply_mu_);
    applied_.SignalAll();  // a write waiting in WaitForTrainingLag
  }
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

Shard::Stage1 Shard::CurrentStage1() const {
  ReaderMutexLock lock(&state_mu_);
  return stage1_;
}

int Shard::DefaultNumCandidates(int k) const {
  const Stage1 stage1 = CurrentStage1();
  return stage1.index->DefaultNumDocuments(k, live_.rerank_vectors());
}

void Shard::WaitForTrainingLag() {
  MutexLock lock(&apply_mu_);
  const absl::Time deadline = absl::Now() + kMaxTrainingStall;
  while (training_encoded_through_ != kNoTrainingLag &&
         last_applied_iid_ > training_encoded_through_ &&
         last_applied_iid_ - training_encoded_through_ > training_allowed_lag_ &&
         !stopping_.load(std::memory_order_acquire)) {
    if (applied_.WaitWithTimeout(&apply_mu_, deadline - absl::Now())) return;
  }
}

absl::StatusOr<WriteResult> Shard::Apply(std::vector<ShardWrite> upserts,
                                         const std::vector<std::string>& deletes) {
  // Before the write path is taken (a training's last catch-up takes it exclusively), and before
  // the failure check, which a long wait could otherwise outdate.
  if (!upserts.empty()) WaitForTrainingLag();
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
      if (live_.resident_budget() > 0) {
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
      if (schema_.candidates.rerank_from_codes && stage1.centroids != nullptr) {
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
    MutexLock failed_lock(&state_mu_);
    if (failed_.ok()) failed_ = failed;
    return failed_;
  }
  MaybeStartTraining();
  return result;
}

absl::Status Shard::FailedStatus() const {
  ReaderMutexLock lock(&state_mu_);
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
    last_applied_iid_ = std::max(last_applied_iid_, iid);
  }
  for (uint64_t deleted : result.deleted_iids) {
    if (deleted != 0) status.Update(index.Remove(deleted));
  }
  status.Update(live_.Apply(std::move(documents), result));
  return status;
}

absl::StatusOr<std::vector<Stage1Hit>> Shard::SearchCandidates(const Stage1Request& request) const {
  TESSERA_RETURN_IF_ERROR(FailedStatus());
  const Stage1 stage1 = CurrentStage1();
  if (request.filter == nullptr || request.filter->empty()) {
    return stage1.index->Search(request, nullptr, pool_.get());
  }
  // The table's reader lock is held for the whole search: one filter decision per document.
  return live_.Filtered(*request.filter, [&](const std::function<bool(uint64_t)>& accept) {
    return stage1.index->Search(request, &accept, pool_.get());
  });
}

absl::StatusOr<std::vector<SparseLaneHit>> Shard::SearchSparse(const SparseVectorView& query,
                                                               int64_t k, const Filter& filter,
                                                               const SparseStatistics* statistics,
                                                               bool want_attributes) const {
  if (!live_.has_sparse()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse_query: collection '", schema_.name, "' has no sparse field"));
  }
  return live_.SearchSparse(query, k, filter, statistics, want_attributes);
}

SparseStatistics Shard::SparseStatisticsOf(absl::Span<const uint32_t> terms) const {
  return live_.SparseStatisticsOf(terms);
}

void Shard::ForEachLive(const Filter& filter,
                        const std::function<void(uint64_t, const LiveDocument&)>& fn) const {
  live_.ForEachLive(filter, fn);
}

absl::StatusOr<std::vector<std::shared_ptr<const StoredMatrix>>> Shard::FetchRerank(
    absl::Span<const uint64_t> iids) const {
  std::vector<std::shared_ptr<const StoredMatrix>> matrices = live_.Resident(iids);
  std::vector<uint64_t> missing;
  std::vector<size_t> missing_at;
  for (size_t i = 0; i < iids.size(); ++i) {
    if (matrices[i] == nullptr) {
      missing.push_back(iids[i]);
      missing_at.push_back(i);
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

absl::StatusOr<std::vector<RankingDocument>> Shard::FetchForRanking(absl::Span<const uint64_t> iids,
                                                                    bool want_attributes) const {
  // One pass of the table describes every document and gives the resident rows: resident
  // documents are viewed in their table entries (kept alive with the views), the others in place
  // in the store: one lookup per document, no copy, so no split over the pool.
  const bool codes_only =
      schema_.candidates.rerank_from_codes && CurrentStage1().centroids != nullptr;
  std::vector<std::optional<LiveEntry>> entries = live_.Lookup(iids, want_attributes);
  std::vector<RankingDocument> documents(iids.size());
  struct Resident {
    std::vector<StoredMatrixView> views;
    std::vector<std::shared_ptr<const StoredMatrix>> matrices;
  };
  auto resident = std::make_shared<Resident>();
  if (!codes_only) resident->views.resize(iids.size());
  // Every live document of a rerank_from_codes shard with its codebook is scored from its stored
  // codes (FetchCodes; those written before the codebook keep rows only until its training drops
  // them): a view without rows for each, and no read of the store here.
  const auto no_rows = codes_only ? std::make_shared<const StoredMatrixView>(StoredMatrixView{
                                        schema_.dtype, 0, schema_.dim, absl::string_view()})
                                  : nullptr;
  std::vector<uint64_t> missing;
  std::vector<size_t> missing_at;
  for (size_t i = 0; i < iids.size(); ++i) {
    if (!entries[i].has_value()) continue;  // no longer live: not read
    LiveEntry& entry = *entries[i];
    RankingDocument& document = documents[i];
    document.external_id = std::move(entry.external_id);
    document.version = entry.version;
    document.attributes = std::move(entry.attributes);
    if (codes_only) {
      document.rerank = no_rows;
    } else if (entry.rerank != nullptr) {
      resident->views[i] = ViewOf(*entry.rerank);
      resident->matrices.push_back(std::move(entry.rerank));
      document.rerank = std::shared_ptr<const StoredMatrixView>(resident, &resident->views[i]);
    } else {
      missing.push_back(iids[i]);
      missing_at.push_back(i);
    }
  }
  if (missing.empty()) return documents;
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<const StoredMatrixView>> stored,
                           store_->ReadRerank(missing));
  // Absent: removed since the table's pass; left null.
  for (size_t j = 0; j < missing.size(); ++j) {
    documents[missing_at[j]].rerank = std::move(stored[j]);
  }
  return documents;
}

absl::StatusOr<std::vector<std::shared_ptr<const StoredMatrix>>> Shard::DecodeCodes(
    absl::Span<const uint64_t> iids) const {
  // Each a matrix without rows, which DecodeRerankFromCodes replaces by its decoded vectors.
  const auto no_rows =
      std::make_shared<const StoredMatrix>(StoredMatrix{schema_.dtype, 0, schema_.dim, {}});
  std::vector<std::shared_ptr<const StoredMatrix>> matrices(iids.size(), no_rows);
  TESSERA_RETURN_IF_ERROR(DecodeRerankFromCodes(iids, &matrices));
  return matrices;
}

absl::StatusOr<Shard::StoredCodes> Shard::ReadStoredCodes(absl::Span<const uint64_t> iids) const {
  StoredCodes read;
  read.stage1 = CurrentStage1();
  std::function<void()> hook;
  {
    MutexLock lock(&state_mu_);
    hook = std::exchange(code_read_hook_, nullptr);
  }
  if (hook) hook();
  // The retrain race: a training swaps its Stage1 in (generation g+1) before it drops generation
  // g's codes, so a live document missing under the generation read means that a newer Stage1 is
  // in use by now: read again with it. Missing under the generation still in use: removed.
  for (int attempt = 0;; ++attempt) {
    if (read.stage1.centroids == nullptr) {
      return absl::DataLossError(absl::StrCat("shard '", dir_, "': iid ", iids[0],
                                              " has no rerank vectors and the shard no codebook"));
    }
    TESSERA_ASSIGN_OR_RETURN(read.codes, store_->ReadCodes(read.stage1.generation, iids));
    if (std::all_of(read.codes.begin(), read.codes.end(),
                    [](const auto& codes) { return codes != nullptr; })) {
      return read;
    }
    Stage1 current = CurrentStage1();
    if (current.generation == read.stage1.generation) return read;
    if (attempt >= kCodeReadRetries) {
      return absl::AbortedError(
          absl::StrCat("shard '", dir_, "': the centroid codes were retrained ", attempt + 1,
                       " times while being read (generation ", read.stage1.generation, " then ",
                       current.generation, "); retry"));
    }
    read.stage1 = std::move(current);
  }
}

absl::StatusOr<DocumentCodesView> Shard::ViewStoredCodes(const CentroidCodebook& codebook,
                                                         uint64_t iid, uint32_t generation,
                                                         absl::string_view bytes) const {
  absl::StatusOr<DocumentCodesView> view =
      ViewDocumentCodes(bytes, codebook.codec().code_bytes(), codebook.num_centroids());
  if (!view.ok()) {
    return absl::DataLossError(absl::StrCat("shard '", dir_, "': codes of iid ", iid,
                                            " (generation ", generation,
                                            "): ", view.status().message()));
  }
  return view;
}

absl::StatusOr<Shard::CodedDocuments> Shard::FetchCodes(absl::Span<const uint64_t> iids) const {
  CodedDocuments documents;
  documents.requested = iids.size();
  if (iids.empty()) return documents;
  TESSERA_ASSIGN_OR_RETURN(StoredCodes read, ReadStoredCodes(iids));
  documents.codebook = read.stage1.centroids->shared_codebook();
  documents.documents.reserve(iids.size());
  documents.positions.reserve(iids.size());
  for (size_t i = 0; i < iids.size(); ++i) {
    if (read.codes[i] == nullptr) continue;  // removed since
    TESSERA_ASSIGN_OR_RETURN(
        const DocumentCodesView view,
        ViewStoredCodes(*documents.codebook, iids[i], read.stage1.generation, *read.codes[i]));
    documents.documents.push_back(view);
    documents.positions.push_back(i);
  }
  // The views point into the codes segments' mappings, which these keep alive.
  documents.held = std::move(read.codes);
  return documents;
}

absl::StatusOr<std::vector<std::optional<float>>> Shard::ScoreCodes(
    FloatMatrixView query, const CodedDocuments& documents,
    const CentroidScoreTable* stage1_scores) const {
  std::vector<std::optional<float>> scores(documents.requested);
  const absl::Span<const DocumentCodesView> found = documents.documents;
  if (found.empty()) return scores;
  const CentroidCodebook& codebook = *documents.codebook;
  const int64_t C = codebook.num_centroids();
  const int64_t dim = codebook.dim();
  const int64_t nq = query.rows;
  if (nq < 1 || query.cols != dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("query of ", nq, " × ", query.cols, ", expected ≥ 1 × ", dim));
  }

  std::unique_ptr<float[]> own_scores;
  std::optional<CompactQuery> compact;
  if (stage1_scores != nullptr && stage1_scores->scores != nullptr &&
      stage1_scores->codebook == documents.codebook && stage1_scores->nq == nq) {
    compact.emplace(codebook.codec(), query.data, nq, stage1_scores->scores.get(),
                    /*row_stride=*/C);
  } else {
    const QuerySimilarity similarity(query);
    const int64_t stride = similarity.stride();
    // The kernels gather with int32 offsets c · stride (code_maxsim_kernels.h).
    if ((C - 1) * stride > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "query of ", nq, " tokens: scoring codes of ", C, " centroids needs a table of ", C,
          " × ", stride, " scores, more than the ", std::numeric_limits<int32_t>::max(),
          " offsets the compact kernels address; expected ≤ ",
          std::numeric_limits<int32_t>::max() / std::max<int64_t>(C - 1, 1), " padded tokens"));
    }
    own_scores = ScoreUsedCentroids(codebook, similarity, found, pool_.get());
    compact.emplace(codebook.codec(), query.data, nq, own_scores.get(), /*row_stride=*/1,
                    /*centroid_stride=*/stride);
  }
  // Parts of at least kMinReadsPerPart documents over the pool, each laid out and scored batch by
  // batch on its thread (ScoreStoredCodes).
  const int64_t parts = ReadParts(found.size(), pool_->num_threads());
  std::vector<float> found_scores(found.size());
  std::vector<absl::Status> statuses(parts);
  pool_->ParallelFor(parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t part = begin; part < end; ++part) {
      const size_t first = found.size() * part / parts;
      const size_t last = found.size() * (part + 1) / parts;
      statuses[part] =
          ScoreStoredCodes(*compact, found.subspan(first, last - first), &found_scores[first]);
    }
  });
  for (const absl::Status& status : statuses) TESSERA_RETURN_IF_ERROR(status);
  for (size_t d = 0; d < found.size(); ++d) scores[documents.positions[d]] = found_scores[d];
  return scores;
}

CentroidScoreTable Shard::ScoreCentroids(FloatMatrixView query) const {
  const Stage1 stage1 = CurrentStage1();
  if (stage1.centroids == nullptr) return {};
  std::shared_ptr<const CentroidCodebook> codebook = stage1.centroids->shared_codebook();
  if (query.rows < 1 || query.cols != codebook->dim() ||
      query.rows * codebook->num_centroids() > kMaxKeptCentroidScores) {
    return {};
  }
  return ScoreEveryCentroid(std::move(codebook), query, pool_.get());
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
  // use. Its codebook changes with each retraining: the codes are read under the generation of a
  // Stage1 and decoded with that Stage1's codebook (ReadStoredCodes: read again with the newer one
  // when a training swapped its index in and dropped the older generation's codes meanwhile).
  TESSERA_ASSIGN_OR_RETURN(const StoredCodes read, ReadStoredCodes(coded));
  const CentroidCodebook& codebook = read.stage1.centroids->codebook();
  for (size_t j = 0; j < coded.size(); ++j) {
    std::shared_ptr<const StoredMatrix>& matrix = (*matrices)[coded_at[j]];
    if (read.codes[j] == nullptr) {  // removed since (a removal deletes its codes)
      matrix = nullptr;
      continue;
    }
    TESSERA_ASSIGN_OR_RETURN(
        const DocumentCodesView codes,
        ViewStoredCodes(codebook, coded[j], read.stage1.generation, *read.codes[j]));
    const int64_t code_bytes = codebook.codec().code_bytes();
    std::vector<float> values(codes.size * schema_.dim);
    for (int64_t v = 0; v < codes.size; ++v) {
      codebook.Decode(codes.centroid(v), codes.codes + v * code_bytes, &values[v * schema_.dim]);
    }
    matrix = std::make_shared<const StoredMatrix>(
        MatrixFromFloat(values, codes.size, schema_.dim, schema_.dtype));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Shard::LookupId(const std::string& external_id) const {
  return store_->LookupId(external_id);
}

absl::StatusOr<DocumentRecord> Shard::GetRecord(uint64_t iid) const {
  return store_->GetRecord(iid);
}

std::vector<std::optional<LiveEntry>> Shard::Describe(absl::Span<const uint64_t> iids,
                                                      bool want_attributes) const {
  return live_.Lookup(iids, want_attributes);
}

int64_t Shard::num_documents() const { return live_.size(); }

ShardStats Shard::Stats() const {
  ShardStats stats;
  const LiveTotals totals = live_.Totals();
  stats.documents = totals.documents;
  stats.original_tokens = totals.original_tokens;
  stats.rerank_vectors = totals.rerank_vectors;
  stats.resident_bytes = totals.resident_bytes;
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
  // Not store_->Stats(): that walks db/ again for a disk_bytes the walk of dir_ above includes.
  stats.segments = store_->SegmentStats();
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

uint32_t Shard::CentroidGenerationForTesting() const { return CurrentStage1().generation; }

void Shard::SetCodeReadHookForTesting(std::function<void()> hook) {
  MutexLock lock(&state_mu_);
  code_read_hook_ = std::move(hook);
}

std::shared_ptr<const CentroidCodebook> Shard::CodebookForTesting() const {
  const Stage1 stage1 = CurrentStage1();
  return stage1.centroids != nullptr ? stage1.centroids->shared_codebook() : nullptr;
}

}  // namespace tessera::internal
