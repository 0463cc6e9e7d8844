// Candidate generation for one shard: a FAISS index over the documents' candidate vectors. This is
// the only code that includes <faiss/...>.
//
// FAISS ids encode (document iid, slot): id = (iid << kCandidateSlotBits) | slot, so that hits map
// back to documents without a lookup table. Similarity is the inner product (vectors are expected
// to be L2-normalised).
//
// Thread-safe: a reader-writer lock lets searches (and Save) run concurrently with each other; Add
// and Remove take it exclusively (FAISS indexes are not safe to search while being modified).
// Rebuilds (auto switch to HNSW, training, compaction) build the new index under the shared lock
// and take the exclusive lock only to swap it in. Document ids must be below 2^47; non-finite
// vector values are INVALID_ARGUMENT.
#ifndef TESSERA_INDEX_CANDIDATE_CANDIDATE_INDEX_H_
#define TESSERA_INDEX_CANDIDATE_CANDIDATE_INDEX_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tessera/matrix.h"

namespace tessera::internal {

class ThreadPool;

inline constexpr int kCandidateSlotBits = 16;
inline constexpr int64_t kMaxCandidateVectorsPerDocument = int64_t{1} << kCandidateSlotBits;

struct CandidateIndexOptions {
  int64_t dim = 0;
  // A FAISS index_factory string (without the IDMap prefix, which is added), or "auto": exact
  // "Flat" while the index holds fewer than auto_exact_limit vectors, "HNSW32" beyond (the index is
  // rebuilt when it crosses the limit). Trainable factories ("IVF1024,PQ16", ...) are trained on
  // the first min_training_vectors vectors added (searched exactly until then).
  std::string factory = "auto";
  int64_t auto_exact_limit = 200'000;
  int64_t min_training_vectors = 50'000;
  // HNSW search breadth (efSearch) used when the index is HNSW.
  int hnsw_ef_search = 128;
};

struct CandidateHit {
  uint64_t doc = 0;
  float similarity = 0.0f;
};

struct CandidateIndexStats {
  int64_t vectors = 0;
  int64_t documents = 0;
  std::string description;  // the factory string in use, e.g. "IDMap2,Flat"
  bool trained = true;
  int64_t memory_bytes = 0;  // estimated resident bytes of the FAISS index (tombstones included)
};

// Process-wide settings of FAISS and OpenBLAS for serving; the engine applies them at open
// (EngineOptions::blas_threads). FAISS's flat searches take one sgemm even for queries of a few
// rows (distance_compute_blas_threshold 1), and OpenBLAS splits each sgemm over `blas_threads`
// threads (0: leave OpenBLAS's count as it is: OPENBLAS_NUM_THREADS or every core). One is best
// for serving: the sgemms are small (a query's tokens × 1,024 vectors) and searches already run
// in parallel, so OpenBLAS's threads would only spin in sched_yield waiting for each other. Call
// it before searches start: it changes globals that searches read. FAISS's OpenMP is not set
// here: searches and writes run on their calling thread (ScopedSingleOmpThread), and only bulk
// rebuilds (the auto switch to HNSW, training, compaction) use OpenMP's default team.
void ConfigureFaissForServing(int blas_threads);
// OpenBLAS's thread count now (openblas_get_num_threads).
int BlasThreads();

// The interface; CandidateIndexImpl (candidate_index.cc) is its one implementation (leveldb's DB /
// DBImpl).
class CandidateIndex {
 public:
  // INVALID_ARGUMENT for dim < 1 or a factory string FAISS rejects (with FAISS's message).
  static absl::StatusOr<std::unique_ptr<CandidateIndex>> Create(
      const CandidateIndexOptions& options);
  // Loads a snapshot written by Save. NOT_FOUND when missing; DATA_LOSS when corrupt or truncated
  // (checksum, FAISS read error, dim mismatch with `options`).
  static absl::StatusOr<std::pair<std::unique_ptr<CandidateIndex>, uint64_t>> Load(
      const std::string& path, const CandidateIndexOptions& options);

  CandidateIndex() = default;
  CandidateIndex(const CandidateIndex&) = delete;
  CandidateIndex& operator=(const CandidateIndex&) = delete;
  virtual ~CandidateIndex() = default;

  // Adds a document's candidate vectors (rows × dim fp32), replacing any it had.
  // INVALID_ARGUMENT for a wrong dim, zero rows or more than kMaxCandidateVectorsPerDocument.
  virtual absl::Status Add(uint64_t doc, FloatMatrixView vectors) = 0;
  // Removes a document; a no-op for an unknown one.
  virtual absl::Status Remove(uint64_t doc) = 0;

  // For each query row (nq × dim), up to k hits with the highest inner product, best first (ties:
  // lower document, then slot), among the vectors of documents for which `accept` returns true
  // (null: all); the filter runs inside the search, so a filter that matches many documents still
  // yields k hits per row. `accept` is called only on the calling thread. Exact scans (Flat, and
  // the exact fallbacks of the other kinds) are split over `pool` when it is not null; the caller
  // works alongside it (ThreadPool::ParallelFor), so calling from inside a pool task is fine.
  virtual absl::StatusOr<std::vector<std::vector<CandidateHit>>> Search(
      FloatMatrixView queries, int k, const std::function<bool(uint64_t doc)>* accept,
      ThreadPool* pool) const = 0;

  // The documents indexed, ascending.
  virtual std::vector<uint64_t> Documents() const = 0;
  virtual CandidateIndexStats Stats() const = 0;

  // Writes a snapshot to `path` (atomically: a temporary file, fsync, rename) with `covered` (an
  // opaque number the owner uses: the store sequence and iid the snapshot reflects) and a checksum.
  virtual absl::Status Save(const std::string& path, uint64_t covered) const = 0;
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_CANDIDATE_CANDIDATE_INDEX_H_
