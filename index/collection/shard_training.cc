// Shard, part 2 of 3: the lifecycle of the centroid training (see shard.h). A write that finds
// the shard outgrown (OutgrewTraining) starts one background thread (MaybeStartTraining), which
// trains a codebook on a seeded sample of the live documents' vectors, encodes every live document
// into a new centroid index and code generation while writes go on (waiting once they run too
// far ahead of the encoding: kMaxTrainingLagDocuments, WaitForTrainingLag), then holds the write
// path (encode_mu_, then apply_mu_ once every committed write is applied) to catch up, commit the
// generation and swap the index in; and again while the shard has outgrown what it trained on.
// The trainings' outcomes are logged and counted for ShardStats. A closing shard abandons its
// training (CANCELLED between batches); a failed one leaves stage 1 as it was.
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "index/collection/shard.h"
#include "index/collection/shard_internal.h"
#include "index/common/thread_pool.h"
#include "index/stage1/centroid_stage1.h"
#include "tessera/status_macros.h"

namespace tessera::internal {
namespace {

using shard_files::CodebookKey;
using shard_files::kGenerationKey;
using shard_files::kReadBatch;
using shard_files::kSnapshotFile;

// A training catches up without holding the write path until fewer documents than this were
// written since its last pass; the rest it encodes with writes held.
constexpr size_t kCatchUpDocuments = 512;
// Documents encoded into the new generation per PutCodes: the codes of one batch (~70 MB at 64
// vectors of dim 128, 4 bits) are all that waits in memory. Encoding every live document first
// and storing them in one batch held them all, twice (the codes and the WriteBatch): at ~1M
// documents (67M vectors, 4.6 GB of codes) a 3M-document build's RSS rose by 5 GB within 90 s of
// that training's end of encoding, to a 23.4 GB peak.
constexpr size_t kEncodeBatchDocuments = 16384;
constexpr uint64_t kSampleSeed = 0x53414d504c453031;

// Gives the heap's free pages back to the system. A training's swap frees the index it replaced,
// list allocations that glibc's malloc otherwise keeps for reuse (mid-heap, where free() never
// returns them): a 250k-document compact build ended with 2.15 GB of anonymous memory against
// 2.24 GB without (AMD EPYC Zen 4; the rest is live: lists, tables, RocksDB's memtables and cache).
void ReleaseFreedHeap() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

// Whether the schema lets a shard of `rerank_vectors` vectors move to the centroid index.
bool WantsCentroidIndex(const CandidateSpec& spec, int64_t rerank_vectors) {
  if (spec.factory == "centroid" || spec.rerank_from_codes) {
    return rerank_vectors >= EffectiveMinTrainingVectors(spec);
  }
  if (spec.factory == "auto") return rerank_vectors >= spec.centroid_min_vectors;
  return false;
}

}  // namespace

bool Shard::OutgrewTraining() const {
  if (stopping_.load(std::memory_order_acquire) || !FailedStatus().ok()) return false;
  const int64_t vectors = live_.rerank_vectors();
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
    // The retired stage 1 is freed by now, unless a search still holds it.
    ReleaseFreedHeap();
    MutexLock lock(&apply_mu_);
    // Whatever became of the training, writes no longer wait for it.
    training_encoded_through_ = kNoTrainingLag;
    training_allowed_lag_ = kMaxTrainingLagDocuments;
    applied_.SignalAll();
    // Writes that found the shard outgrown while this training ran did not start another (one
    // runs at a time), and once ingest has ended no write comes to notice: check here.
    if (status.ok() && trained_vectors_ > 0 && OutgrewTraining()) continue;
    training_ = false;
    return;
  }
}

void Shard::SetTrainingLag(uint64_t iid, uint64_t allowed_lag) {
  MutexLock lock(&apply_mu_);
  training_encoded_through_ = iid;
  training_allowed_lag_ = allowed_lag;
  applied_.SignalAll();
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
    ReaderMutexLock lock(&state_mu_);
    generation = stage1_.generation + 1;
  }
  // 1. A sample: all vectors of documents taken in a seeded random order.
  std::vector<uint64_t> iids = live_.LiveIidsAbove(0);
  const int64_t total_vectors = live_.RerankVectorsOf(iids);
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
  auto index = std::make_shared<CentroidIndex>(std::move(codebook));

  // 2. Encode every live document into the new index and generation, while writes go on against
  // the old index, a bounded number of documents ahead of the encoding (kMaxTrainingLagDocuments;
  // iids ascend with the writes, so the first pass covers every document written before it).
  // Removals delete codes of both generations from now on.
  if (generation > 1) {
    store_->SetCodeGenerations({generation - 1, generation});
  } else {
    store_->SetCodeGenerations({generation});
  }
  uint64_t covered = iids.back();
  SetTrainingLag(covered, std::max<uint64_t>(kMaxTrainingLagDocuments, iids.size() / 4));
  std::vector<uint64_t> pending = std::move(iids);
  for (int round = 0; round <= kFreeCatchUpRounds; ++round) {
    if (round == 1) SetTrainingLag(covered, kMaxTrainingLagDocuments);
    for (size_t start = 0; start < pending.size(); start += kEncodeBatchDocuments) {
      const absl::Span<const uint64_t> batch =
          absl::MakeConstSpan(pending).subspan(start, kEncodeBatchDocuments);
      std::vector<std::pair<uint64_t, std::string>> codes;
      TESSERA_RETURN_IF_ERROR(EncodeDocuments(batch, index.get(), &codes));
      TESSERA_RETURN_IF_ERROR(store_->PutCodes(generation, codes, {}));
      if (batch.back() > covered) {
        covered = batch.back();
        SetTrainingLag(covered, kMaxTrainingLagDocuments);
      }
    }
    pending = live_.LiveIidsAbove(covered);
    if (pending.size() < kCatchUpDocuments) break;
  }
  std::function<void()> hook;
  {
    MutexLock lock(&apply_mu_);
    hook = training_hook_;
  }
  if (hook) hook();

  // 3. Catch up with the write path held: no write is between encoding and commit, and every
  // committed write has been applied, so the table is exactly the store.
  // The stage 1 the swap replaces, freed once the locks below are released (declared before
  // them): freeing a large index is millions of frees, which writes and searches need not wait
  // for.
  Stage1 retired;
  MutexLock encoding(&encode_mu_);
  MutexLock lock(&apply_mu_);
  while (next_commit_ <= max_commit_seen_.load(std::memory_order_acquire)) {
    applied_.Wait(&apply_mu_);
  }
  if (stopping_.load(std::memory_order_acquire)) return absl::CancelledError("closing");
  std::vector<std::pair<uint64_t, std::string>> codes;
  TESSERA_RETURN_IF_ERROR(EncodeDocuments(live_.LiveIidsAbove(covered), index.get(), &codes));
  const std::vector<uint64_t> removed = live_.NotLive(index->Documents());
  for (uint64_t iid : removed) index->Remove(iid);
  TESSERA_RETURN_IF_ERROR(store_->PutCodes(generation, codes, removed));
  // The commit point: from here on the new generation is the shard's stage 1.
  TESSERA_RETURN_IF_ERROR(
      store_->PutMeta(kGenerationKey, absl::StrCat(generation, " ", total_vectors)));
  trained_vectors_ = total_vectors;
  {
    MutexLock swap(&state_mu_);
    retired = std::exchange(stage1_, Stage1::Centroids(index, generation));
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
  live_.DropResident(dropped);
  return absl::OkStatus();
}

void Shard::WaitForTrainingForTesting() const {
  MutexLock lock(&apply_mu_);
  while (training_) applied_.Wait(&apply_mu_);
}

void Shard::SetTrainingHookForTesting(std::function<void()> hook) {
  MutexLock lock(&apply_mu_);
  training_hook_ = std::move(hook);
}

}  // namespace tessera::internal
