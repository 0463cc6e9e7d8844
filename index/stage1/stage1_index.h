// Stage 1 of a search (DESIGN §5): the one interface through which a shard nominates documents for
// the exact rerank, modelled on faiss's Index. An implementation derives each document's *payload*
// from the document's rerank vectors, stores it in the document's WriteBatch (Persist), indexes it
// (Add, Remove) and answers a query with documents and their approximate MaxSim (Search). Two
// implementations:
// - CandidateStage1 (candidate_stage1.h): the exact scan (or a FAISS kind) over each document's
//   candidate vectors, a coarser pooling of its rerank vectors, for small shards;
// - CentroidStage1 (centroid_stage1.h): PLAID/WARP-style centroid ids and residual codes of the
//   rerank vectors in inverted lists, for large ones.
// The shard that owns one holds it through this interface and never branches on which it has; it
// builds one from the store when it opens and swaps a newly trained one in (shard.h).
#ifndef TESSERA_INDEX_STAGE1_STAGE1_INDEX_H_
#define TESSERA_INDEX_STAGE1_STAGE1_INDEX_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "index/centroid/centroid_index.h"
#include "index/storage/shard_store.h"
#include "tessera/matrix.h"

namespace tessera::internal {

class ThreadPool;

// What stage 1 derives a document's payload from: its rerank vectors.
struct Stage1Source {
  // Names the document in error messages, e.g. "document 'a17'".
  absl::string_view what;
  // As stored: rows ≥ 1 × dim in the schema's dtype (fp16-rounded when it stores fp16).
  const StoredMatrix* stored = nullptr;
  // As pooling left them, before the storage rounding: the same rows × dim, fp32. data null: only
  // the stored values are known (a document read back from the store).
  FloatMatrixView pooled;
};

// A document's stage-1 payload, as the implementation that derived it indexes it and stores it in
// the document's WriteBatch. Only that implementation reads it: the candidate index its candidate
// vectors, the centroid index its codes; the other field stays empty.
struct Stage1Payload {
  StoredMatrix candidates;  // CandidateStage1: rows × dim fp32
  DocumentCodes codes;      // CentroidStage1: one centroid id and residual code per rerank vector
};

// One query of stage 1.
struct Stage1Query {
  FloatMatrixView query;    // nq × dim fp32
  int num_documents = 100;  // N: documents nominated
  int per_token = 100;      // k′: candidate vectors per query token (CandidateStage1)
  int nprobe = 0;           // centroids probed per query token; 0: DefaultNprobe (CentroidStage1)
  // Not null: a CentroidStage1 leaves here the query's score of every centroid
  // (CentroidSearchOptions::centroid_scores: not for a large grouped codebook), for a stage 2 that
  // scores codes; a CandidateStage1 leaves it as it was.
  CentroidScoreTable* centroid_scores = nullptr;
};

// A nominated document and its approximate MaxSim.
struct Stage1Hit {
  uint64_t iid = 0;
  float score = 0.0f;
};

struct Stage1Stats {
  std::string name;          // e.g. "IDMap2,Flat", "Centroid4096,Residual2bit"
  int64_t vectors = 0;       // indexed, of live documents
  int64_t memory_bytes = 0;  // resident bytes of the index
};

// Thread-safe: Derive, Persist, Search, Stats and Save run concurrently with each other and with
// Add and Remove (which the owner calls one at a time, in its store's commit order).
class Stage1Index {
 public:
  virtual ~Stage1Index() = default;
  Stage1Index(const Stage1Index&) = delete;
  Stage1Index& operator=(const Stage1Index&) = delete;

  int64_t dim() const { return dim_; }

  // The payload of each document (result[i] for documents[i]), derived on `pool` (not null; the
  // caller works too). Everything Add would refuse is refused here, so that an owner who derives
  // before its durable write cannot fail after it:
  // - INVALID_ARGUMENT naming the document (Stage1Source::what) for vectors of the wrong shape, or
  //   a payload Add would refuse (a value that is not finite, more candidate vectors than
  //   kMaxCandidateVectorsPerDocument);
  // - INTERNAL naming the document when the encoder gave codes Add would refuse (a bug).
  absl::StatusOr<std::vector<Stage1Payload>> Derive(absl::Span<const Stage1Source> documents,
                                                    ThreadPool* pool) const;
  // Puts a payload this index derived into the document's write, for the store to keep in the
  // document's WriteBatch (candidate vectors; codes under the index's code generation).
  virtual void Persist(const Stage1Payload& payload, DocumentWrite* write) const = 0;

  // Indexes a payload this index derived (a document replaced is Removed first, under its old
  // iid). Fails only where Derive could not see it coming: a FAISS error, an allocation.
  virtual absl::Status Add(uint64_t iid, const Stage1Payload& payload) = 0;
  // Removes a document; a no-op for an unknown one.
  virtual absl::Status Remove(uint64_t iid) = 0;

  // Up to query.num_documents indexed documents for which `accept` returns true (null: all), best
  // approximate MaxSim first (ties: lower iid). `accept` runs on the calling thread only; the work
  // is split over `pool` when not null (the caller works too, so calling from a pool task is
  // fine). INVALID_ARGUMENT for a query without rows or of another dim.
  absl::StatusOr<std::vector<Stage1Hit>> Search(const Stage1Query& query,
                                                const std::function<bool(uint64_t)>* accept,
                                                ThreadPool* pool) const;

  // N for k hits when a search leaves it at 0, in a shard of `vectors` rerank vectors.
  virtual int DefaultNumDocuments(int k, int64_t vectors) const = 0;
  virtual Stage1Stats Stats() const = 0;
  // Saves to `path` what the store's payloads do not make cheap to rebuild (the candidate index,
  // with the highest iid it holds), atomically; OK without writing anything for an index that is
  // rebuilt from the stored payloads at open (the centroid index).
  virtual absl::Status Save(const std::string& path) const = 0;

 protected:
  explicit Stage1Index(int64_t dim) : dim_(dim) {}

 private:
  // Derive and Search, after the shapes are checked.
  virtual absl::StatusOr<std::vector<Stage1Payload>> DeriveImpl(
      absl::Span<const Stage1Source> documents, ThreadPool* pool) const = 0;
  virtual absl::StatusOr<std::vector<Stage1Hit>> SearchImpl(
      const Stage1Query& query, const std::function<bool(uint64_t)>* accept,
      ThreadPool* pool) const = 0;

  const int64_t dim_;
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_STAGE1_STAGE1_INDEX_H_
