// Stage 1 over candidate vectors (DESIGN §5): each document's rerank vectors pooled once more
// (CandidateSpec: Ward pooling by pool_factor, or one global mean), L2-normalised, in a
// CandidateIndex (an exact scan, or the FAISS kind the schema names). A search takes each query
// token's k′ most similar candidate vectors and turns them into documents: a document's
// approximate MaxSim sums, over query tokens, its best candidate similarity, or — when none of its
// vectors made the token's top k′ — that token's k′-th similarity (an upper bound on what it
// missed).
#ifndef TESSERA_INDEX_STAGE1_CANDIDATE_STAGE1_H_
#define TESSERA_INDEX_STAGE1_CANDIDATE_STAGE1_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "index/candidate/candidate_index.h"
#include "index/stage1/stage1_index.h"
#include "tessera/base/mutex.h"
#include "tessera/collection.h"

namespace tessera::internal {

// The candidate vectors of a document (rows × dim fp32, as pooled) under `spec`, L2-normalised;
// *rows gets their count. The pooling's error (INVALID_ARGUMENT) for vectors it refuses.
absl::StatusOr<std::vector<float>> CandidateVectors(FloatMatrixView vectors,
                                                    const CandidateSpec& spec, int64_t* rows);

// Thread-safe (see Stage1Index).
class CandidateStage1 final : public Stage1Index {
 public:
  // `index` holds the documents up to iid `max_iid` (what a snapshot of it covers); its options'
  // dim is the vectors'. `spec` says how candidate vectors are pooled.
  CandidateStage1(std::unique_ptr<CandidateIndex> index, int64_t dim, const CandidateSpec& spec,
                  uint64_t max_iid);

  // Sets write->candidates.
  void Persist(const Stage1Payload& payload, DocumentWrite* write) const override;
  absl::Status Add(uint64_t iid, const Stage1Payload& payload) override;
  absl::Status Remove(uint64_t iid) override;
  // max(10·k, 100), whatever the size.
  int DefaultNumDocuments(int k, int64_t vectors) const override;
  Stage1Stats Stats() const override;
  // CandidateIndex::Save with the highest iid added.
  absl::Status Save(const std::string& path) const override;

 private:
  // Candidate vectors from Stage1Source::pooled (or the stored values), one document per task.
  absl::StatusOr<std::vector<Stage1Payload>> DeriveImpl(absl::Span<const Stage1Source> documents,
                                                        ThreadPool* pool) const override;
  absl::StatusOr<std::vector<Stage1Hit>> SearchImpl(const Stage1Query& request,
                                                    const std::function<bool(uint64_t)>* accept,
                                                    ThreadPool* pool) const override;

  const std::unique_ptr<CandidateIndex> index_;
  const CandidateSpec spec_;
  // Held across an Add and a Save, so that a snapshot's iid matches what it holds.
  mutable Mutex mu_;
  uint64_t max_iid_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_STAGE1_CANDIDATE_STAGE1_H_
