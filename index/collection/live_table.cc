#include "index/collection/live_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "index/common/prefetched_lookup.h"
#include "tessera/status_macros.h"

namespace tessera::internal {
namespace {

std::optional<SparseIndex> MakeSparseIndex(const std::optional<SparseScoring>& scoring) {
  if (!scoring.has_value()) return std::nullopt;
  SparseIndexOptions options;
  options.scoring = *scoring;
  // The schema was validated: its scoring options are in range.
  absl::StatusOr<SparseIndex> index = SparseIndex::Create(options);
  if (!index.ok()) return std::nullopt;
  return std::move(*index);
}

}  // namespace

LiveTable::LiveTable(int64_t resident_budget, const std::optional<SparseScoring>& sparse)
    : resident_budget_(std::max<int64_t>(resident_budget, 0)),
      sparse_(MakeSparseIndex(sparse)),
      has_sparse_(sparse_.has_value()) {}

void LiveTable::AddLive(uint64_t iid, LiveDocument document) {
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

void LiveTable::RemoveLive(uint64_t iid) {
  const auto it = live_.find(iid);
  if (it == live_.end()) return;
  original_tokens_ -= it->second.num_tokens;
  rerank_vectors_ -= it->second.num_rerank_vectors;
  if (it->second.rerank != nullptr) {
    resident_bytes_ -= static_cast<int64_t>(it->second.rerank->bytes.size());
  }
  live_.erase(it);
}

bool LiveTable::LiveAndMatches(uint64_t iid, const Filter& filter) const {
  const auto it = live_.find(iid);
  return it != live_.end() && FilterMatches(filter, it->second.attributes);
}

absl::Status LiveTable::AddStored(const DocumentRecord& record) {
  MutexLock lock(&mu_);
  AddLive(
      record.iid,
      LiveDocument{record.external_id, record.version, record.attributes, record.num_tokens,
                   static_cast<int64_t>(record.member_offsets.size()) - 1, nullptr, std::nullopt});
  if (record.sparse.has_value() && sparse_.has_value()) {
    const absl::Status added = sparse_->Add(record.iid, record.sparse->view());
    if (!added.ok()) {
      return absl::DataLossError(
          absl::StrCat("sparse vector of iid ", record.iid, ": ", added.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> LiveTable::AddResident(absl::Span<const uint64_t> iids,
                                            std::vector<std::optional<StoredMatrix>>* matrices) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < iids.size(); ++i) {
    std::optional<StoredMatrix>& matrix = (*matrices)[i];
    if (!matrix.has_value()) {
      return absl::NotFoundError(absl::StrCat("no rerank vectors for iid ", iids[i]));
    }
    if (matrix->rows == 0) continue;  // reranked from its codes (rerank_from_codes)
    const auto live = live_.find(iids[i]);
    if (live == live_.end()) continue;  // not live: no entry is made for it
    const int64_t bytes = static_cast<int64_t>(matrix->bytes.size());
    if (resident_bytes_ + bytes > resident_budget_) return false;
    resident_bytes_ += bytes;
    live->second.rerank = std::make_shared<const StoredMatrix>(std::move(*matrix));
  }
  return true;
}

absl::Status LiveTable::Apply(std::vector<LiveDocument> documents, const WriteResult& result) {
  absl::Status status;
  MutexLock lock(&mu_);
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

void LiveTable::DropResident(absl::Span<const uint64_t> iids) {
  MutexLock lock(&mu_);
  for (uint64_t iid : iids) {
    const auto it = live_.find(iid);
    if (it == live_.end() || it->second.rerank == nullptr) continue;
    resident_bytes_ -= static_cast<int64_t>(it->second.rerank->bytes.size());
    it->second.rerank.reset();
  }
}

std::vector<std::optional<LiveEntry>> LiveTable::Lookup(absl::Span<const uint64_t> iids,
                                                        bool want_attributes) const {
  std::vector<std::optional<LiveEntry>> entries(iids.size());
  ReaderMutexLock lock(&mu_);
  for (size_t i = 0; i < iids.size(); ++i) {
    PrefetchAhead(live_, iids, i);
    const auto it = live_.find(iids[i]);
    if (it == live_.end()) continue;
    LiveEntry& entry = entries[i].emplace();
    entry.external_id = it->second.external_id;
    entry.version = it->second.version;
    if (want_attributes) entry.attributes = it->second.attributes;
    entry.rerank = it->second.rerank;
  }
  return entries;
}

std::vector<std::shared_ptr<const StoredMatrix>> LiveTable::Resident(
    absl::Span<const uint64_t> iids) const {
  std::vector<std::shared_ptr<const StoredMatrix>> matrices(iids.size());
  ReaderMutexLock lock(&mu_);
  for (size_t i = 0; i < iids.size(); ++i) {
    const auto it = live_.find(iids[i]);
    if (it != live_.end()) matrices[i] = it->second.rerank;
  }
  return matrices;
}

bool LiveTable::Contains(uint64_t iid) const {
  ReaderMutexLock lock(&mu_);
  return live_.contains(iid);
}

std::vector<uint64_t> LiveTable::NotLive(absl::Span<const uint64_t> iids) const {
  std::vector<uint64_t> gone;
  ReaderMutexLock lock(&mu_);
  for (uint64_t iid : iids) {
    if (!live_.contains(iid)) gone.push_back(iid);
  }
  return gone;
}

std::vector<uint64_t> LiveTable::LiveIidsAbove(uint64_t after) const {
  std::vector<uint64_t> iids;
  {
    ReaderMutexLock lock(&mu_);
    for (const auto& [iid, document] : live_) {
      if (iid > after) iids.push_back(iid);
    }
  }
  std::sort(iids.begin(), iids.end());
  return iids;
}

int64_t LiveTable::RerankVectorsOf(absl::Span<const uint64_t> iids) const {
  int64_t vectors = 0;
  ReaderMutexLock lock(&mu_);
  for (uint64_t iid : iids) {
    const auto it = live_.find(iid);
    if (it != live_.end()) vectors += it->second.num_rerank_vectors;
  }
  return vectors;
}

void LiveTable::ForEachLive(const Filter& filter,
                            const std::function<void(uint64_t, const LiveDocument&)>& fn) const {
  ReaderMutexLock lock(&mu_);
  for (const auto& [iid, document] : live_) {
    if (filter.empty() || FilterMatches(filter, document.attributes)) fn(iid, document);
  }
}

absl::StatusOr<std::vector<SparseLaneHit>> LiveTable::SearchSparse(
    const SparseVectorView& query, int64_t k, const Filter& filter,
    const SparseStatistics* statistics, bool want_attributes) const {
  ReaderMutexLock lock(&mu_);
  if (!sparse_.has_value()) {
    return absl::FailedPreconditionError("the live table has no sparse index");
  }
  SparseSearchRequest request;
  request.query = query;
  request.k = k;
  request.statistics = statistics;
  if (!filter.empty()) {
    request.filter = [this, &filter](uint64_t iid) {
      mu_.AssertReaderHeld();
      return LiveAndMatches(iid, filter);
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

SparseStatistics LiveTable::SparseStatisticsOf(absl::Span<const uint32_t> terms) const {
  ReaderMutexLock lock(&mu_);
  if (!sparse_.has_value()) return SparseStatistics{};
  return sparse_->Statistics(terms);
}

int64_t LiveTable::size() const {
  ReaderMutexLock lock(&mu_);
  return static_cast<int64_t>(live_.size());
}

int64_t LiveTable::rerank_vectors() const {
  ReaderMutexLock lock(&mu_);
  return rerank_vectors_;
}

LiveTotals LiveTable::Totals() const {
  ReaderMutexLock lock(&mu_);
  return LiveTotals{static_cast<int64_t>(live_.size()), original_tokens_, rerank_vectors_,
                    resident_bytes_};
}

}  // namespace tessera::internal
