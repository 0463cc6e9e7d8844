// Shard, part 3 of 3: the recovery of its derived state at Open. The store is the truth; from it
// come the live-document table (LoadDocuments), the resident rerank vectors up to the budget
// (LoadResidentRerank, in iid order), and stage 1 (LoadStage1): the centroid index of the stored
// generation, rebuilt from its codes (documents missing codes encoded, orphans and dead
// generations deleted, rows a crash left in a rerank_from_codes shard dropped), or else the
// candidate index, loaded from its snapshot and reconciled with the store, or rebuilt from it.
// These run before the shard is shared: nothing else writes the table meanwhile.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "index/collection/shard.h"
#include "index/collection/shard_internal.h"
#include "index/stage1/candidate_stage1.h"
#include "index/stage1/centroid_stage1.h"
#include "tessera/status_macros.h"

namespace tessera::internal {
namespace {

using shard_files::CodebookKey;
using shard_files::kGenerationKey;
using shard_files::kReadBatch;
using shard_files::kSnapshotFile;

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

}  // namespace

absl::Status Shard::LoadDocuments() {
  return store_->ForEachDocument([this](const DocumentRecord& record) {
    const absl::Status added = live_.AddStored(record);
    if (!added.ok()) {
      return absl::Status(added.code(), absl::StrCat("shard '", dir_, "': ", added.message()));
    }
    return absl::OkStatus();
  });
}

absl::Status Shard::LoadResidentRerank() {
  if (live_.resident_budget() == 0) return absl::OkStatus();
  std::vector<uint64_t> iids = live_.LiveIidsAbove(0);
  for (size_t start = 0; start < iids.size(); start += kReadBatch) {
    const absl::Span<const uint64_t> batch = absl::MakeConstSpan(iids).subspan(start, kReadBatch);
    TESSERA_ASSIGN_OR_RETURN(std::vector<std::optional<StoredMatrix>> matrices,
                             store_->MultiGetRerank(batch));
    // Nothing removes documents while the shard opens: a live one always has a rerank row
    // (NOT_FOUND otherwise).
    const absl::StatusOr<bool> fitted = live_.AddResident(batch, &matrices);
    if (!fitted.ok()) {
      return absl::Status(fitted.status().code(),
                          absl::StrCat("shard '", dir_, "': ", fitted.status().message()));
    }
    if (!*fitted) return absl::OkStatus();  // the budget is spent
  }
  return absl::OkStatus();
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
  auto index = std::make_shared<CentroidIndex>(std::move(*codebook));
  const int64_t code_bytes = index->codebook().codec().code_bytes();
  const int64_t num_centroids = index->codebook().num_centroids();
  std::vector<uint64_t> orphans;
  // The codes are streamed into the lists (which hold their 1-bit coarsening) and not kept: stage 2
  // reads them from the store, and ForEachCodes drops each segment's pages from the process once
  // streamed, so that the open's memory is the lists'. Nothing changes the table while the shard
  // opens.
  TESSERA_RETURN_IF_ERROR(
      store_->ForEachCodes(generation, [&](uint64_t iid, absl::string_view bytes) -> absl::Status {
        if (!live_.Contains(iid)) {
          orphans.push_back(iid);
          return absl::OkStatus();
        }
        absl::StatusOr<DocumentCodes> codes = ParseDocumentCodes(bytes, code_bytes, num_centroids);
        if (!codes.ok()) {
          return absl::DataLossError(absl::StrCat("shard '", dir_, "': codes of iid ", iid, ": ",
                                                  codes.status().message()));
        }
        return index->Add(iid, *codes);
      }));
  // Live documents without codes (written by no path we know of, but cheap to heal): encode them.
  std::vector<uint64_t> missing;
  for (uint64_t iid : live_.LiveIidsAbove(0)) {
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
  MutexLock lock(&state_mu_);
  stage1_ = Stage1::Centroids(std::move(index), generation);
  return absl::OkStatus();
}

Shard::Stage1 Shard::Stage1::Centroids(std::shared_ptr<CentroidIndex> index, uint32_t generation) {
  Stage1 stage1;
  stage1.index = std::make_shared<CentroidStage1>(index, generation);
  stage1.generation = generation;
  stage1.centroids = std::move(index);
  return stage1;
}

absl::Status Shard::RebuildCandidates() {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<CandidateIndex> index,
                           CandidateIndex::Create(CandidateOptions(schema_)));
  // iids start at 1.
  return InstallCandidates(std::move(index), 0);
}

absl::Status Shard::InstallCandidates(std::unique_ptr<CandidateIndex> index, uint64_t covered) {
  uint64_t max_iid = covered;
  TESSERA_RETURN_IF_ERROR(
      store_->ForEachCandidates(covered + 1, [&](uint64_t iid, const StoredMatrix& vectors) {
        max_iid = std::max(max_iid, iid);
        return index->Add(iid, View(vectors));
      }));
  MutexLock lock(&state_mu_);
  stage1_ = Stage1{
      std::make_shared<CandidateStage1>(std::move(index), schema_.dim, schema_.candidates, max_iid),
      0, nullptr};
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
  for (uint64_t iid : live_.NotLive(indexed)) TESSERA_RETURN_IF_ERROR(index->Remove(iid));
  for (uint64_t iid : indexed) {
    if (iid > covered) consistent = false;
  }
  live_.ForEachLive(Filter{}, [&](uint64_t iid, const LiveDocument&) {
    if (iid <= covered && !std::binary_search(indexed.begin(), indexed.end(), iid)) {
      consistent = false;
    }
  });
  if (!consistent) return RebuildCandidates();
  return InstallCandidates(std::move(index), covered);
}

}  // namespace tessera::internal
