#include "index/collection/shard.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "tessera/status_macros.h"

namespace tessera::internal {
namespace {

constexpr char kSnapshotFile[] = "candidates.snapshot";
// Documents read per MultiGet when loading resident rerank vectors.
constexpr size_t kResidentLoadBatch = 256;

FloatMatrixView View(const StoredMatrix& matrix) {
  return FloatMatrixView{reinterpret_cast<const float*>(matrix.bytes.data()), matrix.rows,
                         matrix.cols};
}

CandidateIndexOptions CandidateOptions(const CollectionSchema& schema) {
  CandidateIndexOptions options;
  options.dim = schema.dim;
  options.factory = schema.candidates.factory;
  return options;
}

}  // namespace

Shard::Shard(std::string dir, std::unique_ptr<ShardStore> store, int64_t resident_rerank_bytes)
    : dir_(std::move(dir)),
      store_(std::move(store)),
      resident_budget_(std::max<int64_t>(resident_rerank_bytes, 0)) {}

absl::StatusOr<std::unique_ptr<Shard>> Shard::Open(const std::string& dir,
                                                   const CollectionSchema& schema,
                                                   const ShardStoreOptions& store_options,
                                                   int64_t resident_rerank_bytes) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  }
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<ShardStore> store,
                           ShardStore::Open(dir + "/db", store_options));
  std::unique_ptr<Shard> shard(new Shard(dir, std::move(store), resident_rerank_bytes));
  TESSERA_RETURN_IF_ERROR(shard->LoadDocuments());
  TESSERA_RETURN_IF_ERROR(shard->LoadResidentRerank());
  MutexLock lock(&shard->apply_mu_);
  TESSERA_RETURN_IF_ERROR(shard->LoadOrRebuildCandidates(CandidateOptions(schema)));
  return shard;
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
    return absl::OkStatus();
  });
}

absl::Status Shard::LoadResidentRerank() {
  if (resident_budget_ == 0) return absl::OkStatus();
  std::vector<uint64_t> iids;
  {
    ReaderMutexLock lock(&table_mu_);
    iids.reserve(live_.size());
    for (const auto& [iid, document] : live_) iids.push_back(iid);
  }
  std::sort(iids.begin(), iids.end());
  for (size_t start = 0; start < iids.size(); start += kResidentLoadBatch) {
    const absl::Span<const uint64_t> batch =
        absl::MakeConstSpan(iids).subspan(start, kResidentLoadBatch);
    TESSERA_ASSIGN_OR_RETURN(std::vector<StoredMatrix> matrices, store_->MultiGetRerank(batch));
    MutexLock lock(&table_mu_);
    for (size_t i = 0; i < batch.size(); ++i) {
      const int64_t bytes = static_cast<int64_t>(matrices[i].bytes.size());
      if (resident_bytes_ + bytes > resident_budget_) return absl::OkStatus();
      resident_bytes_ += bytes;
      live_[batch[i]].rerank = std::make_shared<const StoredMatrix>(std::move(matrices[i]));
    }
  }
  return absl::OkStatus();
}

absl::Status Shard::RebuildCandidates(const CandidateIndexOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(candidates_, CandidateIndex::Create(options));
  max_indexed_iid_ = 0;
  return store_->ForEachCandidates(0, [this](uint64_t iid, const StoredMatrix& vectors) {
    apply_mu_.AssertHeld();
    max_indexed_iid_ = std::max(max_indexed_iid_, iid);
    return candidates_->Add(iid, View(vectors));
  });
}

absl::Status Shard::LoadOrRebuildCandidates(const CandidateIndexOptions& options) {
  auto loaded = CandidateIndex::Load(dir_ + "/" + kSnapshotFile, options);
  if (!loaded.ok()) return RebuildCandidates(options);
  candidates_ = std::move(loaded->first);
  const uint64_t covered = loaded->second;
  // Reconcile with the store: drop documents deleted since, and check that every live document
  // the snapshot claims to cover is in it; anything else means a stale or foreign snapshot.
  std::vector<uint64_t> indexed = candidates_->Documents();
  bool consistent = true;
  {
    ReaderMutexLock lock(&table_mu_);
    for (uint64_t iid : indexed) {
      if (iid > covered) consistent = false;
      if (!live_.contains(iid)) TESSERA_RETURN_IF_ERROR(candidates_->Remove(iid));
    }
    for (const auto& [iid, document] : live_) {
      if (iid <= covered && !std::binary_search(indexed.begin(), indexed.end(), iid)) {
        consistent = false;
      }
    }
  }
  if (!consistent) return RebuildCandidates(options);
  max_indexed_iid_ = covered;
  return store_->ForEachCandidates(covered + 1, [this](uint64_t iid, const StoredMatrix& vectors) {
    apply_mu_.AssertHeld();
    max_indexed_iid_ = std::max(max_indexed_iid_, iid);
    return candidates_->Add(iid, View(vectors));
  });
}

absl::StatusOr<WriteResult> Shard::Apply(std::vector<DocumentWrite> upserts,
                                         const std::vector<std::string>& deletes) {
  // What indexing needs, kept before the store takes ownership of the writes.
  std::vector<LiveDocument> documents;
  std::vector<StoredMatrix> candidates;
  documents.reserve(upserts.size());
  candidates.reserve(upserts.size());
  for (const DocumentWrite& write : upserts) {
    const DocumentRecord& record = write.record;
    documents.push_back(LiveDocument{record.external_id, 0, record.attributes, record.num_tokens,
                                     static_cast<int64_t>(record.member_offsets.size()) - 1,
                                     nullptr});
    // A copy for memory; AddLive drops it when the budget is spent.
    if (resident_budget_ > 0) {
      documents.back().rerank = std::make_shared<const StoredMatrix>(write.rerank);
    }
    candidates.push_back(write.candidates);
  }
  TESSERA_ASSIGN_OR_RETURN(WriteResult result, store_->Write(std::move(upserts), deletes));

  // Index in the store's commit order: concurrent Apply calls committed in one group wait here
  // for their turn.
  MutexLock lock(&apply_mu_);
  while (next_commit_ != result.commit_index) applied_.Wait(&apply_mu_);
  const absl::Status status = ApplyDerived(std::move(documents), candidates, result);
  ++next_commit_;
  applied_.SignalAll();
  TESSERA_RETURN_IF_ERROR(status);
  return result;
}

absl::Status Shard::ApplyDerived(std::vector<LiveDocument> documents,
                                 const std::vector<StoredMatrix>& candidates,
                                 const WriteResult& result) {
  for (size_t i = 0; i < documents.size(); ++i) {
    const uint64_t replaced = result.replaced_iids[i];
    if (replaced != 0) TESSERA_RETURN_IF_ERROR(candidates_->Remove(replaced));
    TESSERA_RETURN_IF_ERROR(candidates_->Add(result.upserted_iids[i], View(candidates[i])));
    max_indexed_iid_ = std::max(max_indexed_iid_, result.upserted_iids[i]);
  }
  for (uint64_t deleted : result.deleted_iids) {
    if (deleted != 0) TESSERA_RETURN_IF_ERROR(candidates_->Remove(deleted));
  }
  MutexLock lock(&table_mu_);
  for (size_t i = 0; i < documents.size(); ++i) {
    if (result.replaced_iids[i] != 0) RemoveLive(result.replaced_iids[i]);
    documents[i].version = result.versions[i];
    AddLive(result.upserted_iids[i], std::move(documents[i]));
  }
  for (uint64_t deleted : result.deleted_iids) {
    if (deleted != 0) RemoveLive(deleted);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<CandidateHit>>> Shard::SearchCandidates(
    FloatMatrixView query, int k, const Filter& filter, ThreadPool* pool) const {
  if (filter.empty()) return candidates_->Search(query, k, nullptr, pool);
  ReaderMutexLock lock(&table_mu_);
  const std::function<bool(uint64_t)> accept = [this, &filter](uint64_t iid) {
    table_mu_.AssertReaderHeld();
    const auto it = live_.find(iid);
    return it != live_.end() && FilterMatches(filter, it->second.attributes);
  };
  return candidates_->Search(query, k, &accept, pool);
}

void Shard::ForEachLive(const Filter& filter,
                        const std::function<void(uint64_t, const LiveDocument&)>& fn) const {
  ReaderMutexLock lock(&table_mu_);
  for (const auto& [iid, document] : live_) {
    if (filter.empty() || FilterMatches(filter, document.attributes)) fn(iid, document);
  }
}

std::shared_ptr<const StoredMatrix> Shard::ResidentRerank(uint64_t iid) const {
  ReaderMutexLock lock(&table_mu_);
  const auto it = live_.find(iid);
  return it == live_.end() ? nullptr : it->second.rerank;
}

bool Shard::Describe(uint64_t iid, std::string* external_id, uint64_t* version) const {
  ReaderMutexLock lock(&table_mu_);
  const auto it = live_.find(iid);
  if (it == live_.end()) return false;
  *external_id = it->second.external_id;
  *version = it->second.version;
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
  const CandidateIndexStats candidates = candidates_->Stats();
  stats.candidate_vectors = candidates.vectors;
  stats.candidate_index = candidates.description;
  stats.disk_bytes = store_->Stats().disk_bytes;
  return stats;
}

absl::Status Shard::Snapshot() const {
  TESSERA_RETURN_IF_ERROR(store_->Flush());
  MutexLock lock(&apply_mu_);
  return candidates_->Save(dir_ + "/" + kSnapshotFile, max_indexed_iid_);
}

}  // namespace tessera::internal
