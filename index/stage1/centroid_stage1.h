// Stage 1 over centroid codes (DESIGN §5): every rerank vector of a document encoded as its
// nearest centroid and a residual code (CentroidCodebook), held in a CentroidIndex's inverted
// lists and searched WARP-style (centroid_index.h). The codes of one codebook are one
// *generation*, under which the store keeps them (shard.h tells how generations commit).
#ifndef TESSERA_INDEX_STAGE1_CENTROID_STAGE1_H_
#define TESSERA_INDEX_STAGE1_CENTROID_STAGE1_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "index/centroid/centroid_index.h"
#include "index/stage1/stage1_index.h"

namespace tessera::internal {

// The codes of each stored matrix (codes[i] for matrices[i]; empty for null), encoded on `pool`
// (not null) in a few chunks per thread: the nearest-centroid search is most of a write's indexing
// and of a training's time, and is cheaper per vector the more rows one call assigns. The vectors
// are encoded as stored (fp16-rounded when stored as fp16), so that a document encodes the same on
// the write path as in a training.
std::vector<DocumentCodes> EncodeOnPool(const CentroidIndex& index,
                                        absl::Span<const StoredMatrix* const> matrices,
                                        ThreadPool* pool);

// Thread-safe (see Stage1Index).
class CentroidStage1 final : public Stage1Index {
 public:
  // `index` (not null) holds the codes of generation `generation` (≥ 1).
  CentroidStage1(std::shared_ptr<CentroidIndex> index, uint32_t generation);

  // Sets write->codes and write->code_generation.
  void Persist(const Stage1Payload& payload, DocumentWrite* write) const override;
  absl::Status Add(uint64_t iid, const Stage1Payload& payload) override;
  absl::Status Remove(uint64_t iid) override;
  // DefaultNumCandidates(k, vectors) (centroid_index.h).
  int DefaultNumDocuments(int k, int64_t vectors) const override;
  // Named "Centroid<C>,Residual<nbits>bit".
  Stage1Stats Stats() const override;
  // Writes nothing: the codes are in the store.
  absl::Status Save(const std::string& path) const override;

 private:
  // The codes of Stage1Source::stored (EncodeOnPool).
  absl::StatusOr<std::vector<Stage1Payload>> DeriveImpl(absl::Span<const Stage1Source> documents,
                                                        ThreadPool* pool) const override;
  absl::StatusOr<std::vector<Stage1Hit>> SearchImpl(const Stage1Query& query,
                                                    const std::function<bool(uint64_t)>* accept,
                                                    ThreadPool* pool) const override;

  const std::shared_ptr<CentroidIndex> index_;
  const uint32_t generation_;
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_STAGE1_CENTROID_STAGE1_H_
