// CandidateIndex: one FAISS index (an IndexIDMap2 around the factory's index, inner-product metric)
// plus what FAISS does not give us in 1.7.3: tombstones for indexes without removal, the "auto"
// Flat → HNSW32 switch, deferred training, filters that cannot shrink a result below k, and
// checksummed, atomically written snapshots.
//
// Locking: `mu_` is a reader-writer lock over the index state; searches, Documents(), Stats() and
// the serialisation half of Save() hold it shared. Writers (Add, Remove) are serialised by
// `write_mu_` and take `mu_` exclusively only to change the state; a rebuild (the auto switch,
// training, compaction) reads the current index under the shared lock, so searches go on while the
// new index is built, and takes the exclusive lock only to swap it in.
//
// Filters: IndexIDMap2::search in FAISS 1.7.3 rejects SearchParameters ("search params not
// supported for this index"), so the IDSelector is handed to the inner index, which numbers its
// vectors by storage position; the selector maps a position to its id through id_map, excludes
// tombstoned positions and asks accept(id >> kCandidateSlotBits).

#include "index/candidate/candidate_index.h"

#include <cblas.h>  // OpenBLAS: openblas_set_num_threads
#include <faiss/Index.h>
#include <faiss/IndexFlat.h>
#include <faiss/IndexFlatCodes.h>
#include <faiss/IndexHNSW.h>
#include <faiss/IndexIDMap.h>
#include <faiss/IndexIVF.h>
#include <faiss/clone_index.h>
#include <faiss/impl/FaissException.h>
#include <faiss/impl/IDSelector.h>
#include <faiss/impl/io.h>
#include <faiss/index_factory.h>
#include <faiss/index_io.h>
#include <faiss/utils/distances.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <numeric>
#include <random>
#include <utility>

#include "absl/base/config.h"
#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "index/common/crc32.h"
#include "index/common/file_io.h"
#include "index/common/omp_threads.h"
#include "index/common/thread_pool.h"
#include "index/kernels/query_similarity.h"
#include "tessera/base/mutex.h"
#include "tessera/status_macros.h"

namespace tessera::internal {
namespace {

using FaissId = faiss::Index::idx_t;

// ids are int64: (doc << 16) | slot must stay non-negative.
constexpr uint64_t kMaxDocument = (uint64_t{1} << (63 - kCandidateSlotBits)) - 1;

constexpr int kHnswM = 32;
constexpr int kHnswEfConstruction = 40;
// Tombstoned vectors above this fraction of the index trigger a rebuild without them.
constexpr double kCompactionFraction = 0.2;
constexpr int64_t kMaxTrainingVectors = 100'000;
constexpr uint64_t kTrainingSampleSeed = 0x5445535345524131;  // fixed: same input, same index
// Exact scans score candidate vectors in blocks of about this size (a block and its similarities
// stay in L2/L3 while its hits are selected), and never in blocks of fewer than kMinScanBlockRows.
constexpr size_t kScanBlockBytes = size_t{2} << 20;
constexpr size_t kMinScanBlockRows = 64;

// Snapshot layout (little-endian): a 40-byte header, then the payload it describes.
//   0 "TSRC" | 4 u32 format version | 8 i64 dim | 16 u64 covered | 24 u64 payload length |
//   32 u32 CRC-32 of the payload | 36 u32 CRC-32 of bytes 0..35
// Payload: u32 flags (bit 0: trained) | u32 n + factory | u32 n + description |
//   u64 documents + (u64 doc, u64 vector count) each, ascending | u64 n + FAISS write_index bytes.
// Tombstones are not stored: they are derived from the ids on load (see DeriveTombstones).
constexpr char kMagic[4] = {'T', 'S', 'R', 'C'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderSize = 40;
constexpr uint32_t kFlagTrained = 1;

FaissId MakeId(uint64_t doc, int64_t slot) {
  return static_cast<FaissId>((doc << kCandidateSlotBits) | static_cast<uint64_t>(slot));
}
uint64_t DocOf(FaissId id) { return static_cast<uint64_t>(id) >> kCandidateSlotBits; }
int64_t SlotOf(FaissId id) { return id & (kMaxCandidateVectorsPerDocument - 1); }

// Runs FAISS code; no exception escapes.
template <typename Fn>
absl::Status FaissCall(absl::string_view what, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const faiss::FaissException& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  } catch (const std::bad_alloc& e) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
}

// Searches, Add and Remove stay on their calling thread (ScopedSingleOmpThread); only bulk rebuilds
// (the auto switch, training, compaction) use OpenMP. It also means `accept` is only ever called on
// the thread that called Search. Measured on a 2-core machine (32 queries × k=100, 1M × 128 Flat):
// 117 ms with one thread, 879 ms with two (FAISS's per-block OpenMP regions fight OpenBLAS's own
// threads). TSan builds run rebuilds on one thread as well.

// How the inner index is searched. Every kind removes documents by tombstones (dead_), compacted
// past kCompactionFraction: IDMap2's remove_ids renumbers IVF ids, and for the rest it shifts the
// storage and rebuilds the whole id → position map, O(index) per document (156k vectors of dim
// 384: 72 ms per removal, under the exclusive lock).
enum class Kind {
  kFlat,       // IndexFlat: exact, raw floats, scanned by ExactSearch.
  kFlatCodes,  // other IndexFlatCodes (PQ, SQ): exhaustive; filtered searches run exactly.
  kHnsw,       // IndexHNSW: IDSelector in the search; exact fallback.
  kIvf,        // IndexIVF: as HNSW.
  kOther,      // filtered searches run exactly over reconstructed vectors.
};

Kind KindOf(const faiss::Index* inner) {
  if (dynamic_cast<const faiss::IndexFlat*>(inner) != nullptr) return Kind::kFlat;
  if (dynamic_cast<const faiss::IndexFlatCodes*>(inner) != nullptr) return Kind::kFlatCodes;
  if (dynamic_cast<const faiss::IndexHNSW*>(inner) != nullptr) return Kind::kHnsw;
  if (dynamic_cast<const faiss::IndexIVF*>(inner) != nullptr) return Kind::kIvf;
  return Kind::kOther;
}

// The raw float storage of `inner` when it has one (Flat, HNSW over Flat), for fast gathers.
const float* RawVectors(const faiss::Index* inner) {
  if (const auto* flat = dynamic_cast<const faiss::IndexFlat*>(inner)) return flat->get_xb();
  if (const auto* hnsw = dynamic_cast<const faiss::IndexHNSW*>(inner)) {
    if (const auto* flat = dynamic_cast<const faiss::IndexFlat*>(hnsw->storage)) {
      return flat->get_xb();
    }
  }
  return nullptr;
}

// Search-time settings FAISS keeps in the index (efSearch, nprobe) and IVF's direct map, which
// reconstruct() (the exact fallback, rebuilds) needs.
void ConfigureInner(faiss::Index* inner, const CandidateIndexOptions& options) {
  if (auto* hnsw = dynamic_cast<faiss::IndexHNSW*>(inner)) {
    hnsw->hnsw.efSearch = options.hnsw_ef_search;
  }
  if (auto* ivf = dynamic_cast<faiss::IndexIVF*>(inner)) {
    // Factory strings cannot set nprobe and FAISS's default (1) gives poor recall.
    ivf->nprobe = std::min(ivf->nlist, std::clamp<size_t>(ivf->nlist / 16, 8, 256));
    if (ivf->is_trained && ivf->direct_map.type == faiss::DirectMap::NoMap) {
      ivf->make_direct_map(true);
    }
  }
}

absl::StatusOr<std::unique_ptr<faiss::Index>> NewFactoryIndex(
    const CandidateIndexOptions& options) {
  std::unique_ptr<faiss::Index> inner;
  try {
    inner.reset(faiss::index_factory(static_cast<int>(options.dim), options.factory.c_str(),
                                     faiss::METRIC_INNER_PRODUCT));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("FAISS rejects factory '", options.factory, "': ", e.what()));
  }
  if (inner == nullptr || inner->d != options.dim ||
      inner->metric_type != faiss::METRIC_INNER_PRODUCT) {
    return absl::InvalidArgumentError(absl::StrCat("factory '", options.factory,
                                                   "' does not give an inner-product index of dim ",
                                                   options.dim));
  }
  return inner;
}

std::unique_ptr<faiss::Index> NewHnswFlat(const CandidateIndexOptions& options) {
  auto hnsw = std::make_unique<faiss::IndexHNSWFlat>(static_cast<int>(options.dim), kHnswM,
                                                     faiss::METRIC_INNER_PRODUCT);
  hnsw->hnsw.efConstruction = kHnswEfConstruction;
  hnsw->hnsw.efSearch = options.hnsw_ef_search;
  return hnsw;
}

absl::Status ValidateOptions(const CandidateIndexOptions& options) {
  if (options.dim < 1 || options.dim > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("candidate index dim ", options.dim, ", expected 1..", 1 << 20));
  }
  if (options.factory.empty()) {
    return absl::InvalidArgumentError("candidate index factory string is empty");
  }
  if (options.factory.find("IDMap") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("factory '", options.factory, "' must not contain IDMap: it is added"));
  }
  if (options.auto_exact_limit < 0 || options.min_training_vectors < 1 ||
      options.hnsw_ef_search < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "candidate index options: auto_exact_limit ", options.auto_exact_limit,
        " (expected >= 0), min_training_vectors ", options.min_training_vectors,
        " (expected >= 1), hnsw_ef_search ", options.hnsw_ef_search, " (expected >= 1)"));
  }
  return absl::OkStatus();
}

// A hit during a search: `id` is the FAISS id. Better-first order: similarity, then ascending id.
struct ScoredId {
  float similarity;
  FaissId id;
};
bool Better(const ScoredId& a, const ScoredId& b) {
  return a.similarity > b.similarity || (a.similarity == b.similarity && a.id < b.id);
}

// Keeps the best `k` of `hits`, sorted.
void KeepBest(std::vector<ScoredId>& hits, size_t k) {
  if (hits.size() > k) {
    std::nth_element(hits.begin(), hits.begin() + k, hits.end(), Better);
    hits.resize(k);
  }
  std::sort(hits.begin(), hits.end(), Better);
}

// The best k hits of one query row seen so far in an exact scan: a buffer of up to 2k hits and a
// threshold below which a similarity cannot be among the best k. A scan over n vectors costs one
// comparison per vector and one nth_element per k hits kept, instead of a heap update per hit.
class RowTopK {
 public:
  explicit RowTopK(size_t k) : k_(k) { hits_.reserve(2 * k); }

  // -inf until k hits are kept, then the k-th best similarity. A similarity equal to it may still
  // win on id (Better), so callers push similarities >= threshold().
  float threshold() const { return threshold_; }

  void Push(float similarity, FaissId id) {
    hits_.push_back({similarity, id});
    if (hits_.size() >= 2 * k_) Compact();
  }

  // Adds every hit `other` kept.
  void Merge(const RowTopK& other) {
    for (const ScoredId& hit : other.hits_) {
      if (hit.similarity >= threshold_) Push(hit.similarity, hit.id);
    }
  }

  // The best k, best first.
  std::vector<ScoredId> Take() {
    KeepBest(hits_, k_);
    return std::move(hits_);
  }

 private:
  void Compact() {
    std::nth_element(hits_.begin(), hits_.begin() + (k_ - 1), hits_.end(), Better);
    hits_.resize(k_);
    threshold_ = hits_[k_ - 1].similarity;
  }

  const size_t k_;
  float threshold_ = -std::numeric_limits<float>::infinity();
  std::vector<ScoredId> hits_;
};

// Membership by storage position of the inner index (see the file comment).
class DocumentSelector final : public faiss::IDSelector {
 public:
  DocumentSelector(const std::vector<FaissId>& id_map, const std::vector<uint8_t>& dead,
                   bool has_dead, const std::function<bool(uint64_t)>* accept)
      : id_map_(id_map), dead_(dead), has_dead_(has_dead), accept_(accept) {}

  bool is_member(idx_t position) const override {
    if (has_dead_ && dead_[position] != 0) return false;
    return accept_ == nullptr || (*accept_)(DocOf(id_map_[position]));
  }

 private:
  const std::vector<FaissId>& id_map_;
  const std::vector<uint8_t>& dead_;
  const bool has_dead_;
  const std::function<bool(uint64_t)>* const accept_;
};

// Bounds-checked reads from a snapshot payload.
class PayloadReader {
 public:
  PayloadReader(const uint8_t* data, size_t size) : data_(data), left_(size) {}
  bool Read(void* out, size_t n) {
    if (n > left_) return false;
    std::memcpy(out, data_, n);
    data_ += n;
    left_ -= n;
    return true;
  }
  bool ReadString(std::string* out) {
    uint32_t n;
    if (!Read(&n, sizeof(n)) || n > left_) return false;
    out->assign(reinterpret_cast<const char*>(data_), n);
    data_ += n;
    left_ -= n;
    return true;
  }
  const uint8_t* data() const { return data_; }
  size_t left() const { return left_; }
  void Skip(size_t n) {
    data_ += n;
    left_ -= n;
  }

 private:
  const uint8_t* data_;
  size_t left_;
};

template <typename T>
void Append(std::string& out, const T& value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}
void AppendString(std::string& out, const std::string& value) {
  Append(out, static_cast<uint32_t>(value.size()));
  out.append(value);
}

absl::string_view AsBytes(const void* data, size_t size) {
  return absl::string_view(static_cast<const char*>(data), size);
}

}  // namespace

// The one implementation of CandidateIndex.
class CandidateIndexImpl final : public CandidateIndex {
 public:
  // `index` holds the vectors of `docs`; `dead` marks its tombstoned positions.
  CandidateIndexImpl(const CandidateIndexOptions& options,
                     std::unique_ptr<faiss::IndexIDMap2> index, std::string description,
                     bool trained, std::map<uint64_t, int64_t> docs, std::vector<uint8_t> dead)
      : options_(options), auto_(options.factory == "auto") {
    MutexLock lock(&mu_);
    index_ = std::move(index);
    kind_ = KindOf(index_->index);
    description_ = std::move(description);
    trained_ = trained;
    docs_ = std::move(docs);
    for (const auto& [doc, count] : docs_) live_vectors_ += count;
    dead_ = std::move(dead);
    dead_count_ = std::count(dead_.begin(), dead_.end(), uint8_t{1});
  }

  absl::Status Add(uint64_t doc, FloatMatrixView vectors) override
      ABSL_LOCKS_EXCLUDED(write_mu_, mu_);
  absl::Status Remove(uint64_t doc) override ABSL_LOCKS_EXCLUDED(write_mu_, mu_);
  absl::StatusOr<std::vector<std::vector<CandidateHit>>> Search(
      FloatMatrixView queries, int k, const std::function<bool(uint64_t)>* accept,
      ThreadPool* pool) const override ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<uint64_t> Documents() const override ABSL_LOCKS_EXCLUDED(mu_);
  CandidateIndexStats Stats() const override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Save(const std::string& path, uint64_t covered) const override
      ABSL_LOCKS_EXCLUDED(save_mu_, mu_);

 private:
  absl::Status AddLocked(uint64_t doc, FloatMatrixView vectors) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RemoveLocked(uint64_t doc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Switches to HNSW, trains, or compacts when the state asks for it.
  absl::Status MaybeRebuild() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // The live vectors (index order) and their ids.
  absl::Status CollectLive(std::vector<float>* vectors, std::vector<FaissId>* ids) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Live storage positions of accepted documents, ascending.
  std::vector<FaissId> AcceptedPositions(const std::function<bool(uint64_t)>* accept) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Exact top-k of query rows `rows` over the vectors at `positions` into (*hits)[row].
  // Splits the scan over `pool` when it is not null.
  absl::Status ExactSearch(FloatMatrixView queries, const std::vector<int64_t>& rows,
                           const std::vector<FaissId>& positions, int k, ThreadPool* pool,
                           std::vector<std::vector<ScoredId>>* hits) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status SearchLocked(FloatMatrixView queries, int k,
                            const std::function<bool(uint64_t)>* accept, ThreadPool* pool,
                            std::vector<std::vector<ScoredId>>* hits) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const CandidateIndexOptions options_;
  const bool auto_;

  // Lock order: save_mu_ or write_mu_, then mu_.
  mutable Mutex save_mu_;  // one Save at a time (they share path.tmp)
  Mutex write_mu_;         // one writer at a time; the state changes only under it
  mutable Mutex mu_;
  std::unique_ptr<faiss::IndexIDMap2> index_ ABSL_GUARDED_BY(mu_);
  Kind kind_ ABSL_GUARDED_BY(mu_) = Kind::kFlat;
  std::string description_ ABSL_GUARDED_BY(mu_);
  // False while a trainable factory's vectors are buffered in an exact Flat index.
  bool trained_ ABSL_GUARDED_BY(mu_) = true;
  std::map<uint64_t, int64_t> docs_ ABSL_GUARDED_BY(mu_);  // doc → vector count (live docs)
  int64_t live_vectors_ ABSL_GUARDED_BY(mu_) = 0;
  // Per storage position of index_: 1 = tombstoned (a removed or replaced document's vector in an
  // index without real removal). Positions, not doc ids, so that a re-added document (same ids)
  // is live while its old vectors stay dead. Size index_->ntotal.
  std::vector<uint8_t> dead_ ABSL_GUARDED_BY(mu_);
  int64_t dead_count_ ABSL_GUARDED_BY(mu_) = 0;
};

absl::Status CandidateIndexImpl::Add(uint64_t doc, FloatMatrixView vectors) {
  if (vectors.cols != options_.dim) {
    return absl::InvalidArgumentError(absl::StrCat("document ", doc, ": candidate vectors of dim ",
                                                   vectors.cols, ", the index expects ",
                                                   options_.dim));
  }
  if (vectors.rows < 1 || vectors.rows > kMaxCandidateVectorsPerDocument ||
      vectors.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("document ", doc, ": ", vectors.rows,
                                                   " candidate vectors, expected 1..",
                                                   kMaxCandidateVectorsPerDocument));
  }
  if (doc > kMaxDocument) {
    return absl::InvalidArgumentError(
        absl::StrCat("document id ", doc, " exceeds the largest candidate id ", kMaxDocument));
  }
  const int64_t values = vectors.rows * vectors.cols;
  for (int64_t i = 0; i < values; ++i) {
    if (!std::isfinite(vectors.data[i])) {
      return absl::InvalidArgumentError(absl::StrCat("document ", doc, ": candidate vector ",
                                                     i / vectors.cols, " has a non-finite value"));
    }
  }
  MutexLock write_lock(&write_mu_);
  {
    ScopedSingleOmpThread single_thread;
    MutexLock lock(&mu_);
    TESSERA_RETURN_IF_ERROR(RemoveLocked(doc));
    TESSERA_RETURN_IF_ERROR(AddLocked(doc, vectors));
  }
  return MaybeRebuild();
}

absl::Status CandidateIndexImpl::Remove(uint64_t doc) {
  MutexLock write_lock(&write_mu_);
  {
    ScopedSingleOmpThread single_thread;
    MutexLock lock(&mu_);
    TESSERA_RETURN_IF_ERROR(RemoveLocked(doc));
  }
  return MaybeRebuild();
}

absl::Status CandidateIndexImpl::AddLocked(uint64_t doc, FloatMatrixView vectors) {
  std::vector<FaissId> ids(vectors.rows);
  for (int64_t slot = 0; slot < vectors.rows; ++slot) ids[slot] = MakeId(doc, slot);
  faiss::IndexIDMap2* index = index_.get();  // lambdas escape the lock analysis
  absl::Status status = FaissCall(absl::StrCat("adding document ", doc), [&] {
    index->add_with_ids(vectors.rows, vectors.data, ids.data());
  });
  dead_.resize(index_->ntotal, 0);
  TESSERA_RETURN_IF_ERROR(status);
  docs_[doc] = vectors.rows;
  live_vectors_ += vectors.rows;
  return absl::OkStatus();
}

absl::Status CandidateIndexImpl::RemoveLocked(uint64_t doc) {
  auto it = docs_.find(doc);
  if (it == docs_.end()) return absl::OkStatus();
  const int64_t count = it->second;
  for (int64_t slot = 0; slot < count; ++slot) {
    auto pos = index_->rev_map.find(MakeId(doc, slot));
    if (pos == index_->rev_map.end() || dead_[pos->second] != 0) {
      return absl::InternalError(
          absl::StrCat("removing document ", doc, ": slot ", slot, " is not in the index"));
    }
    dead_[pos->second] = 1;
    ++dead_count_;
  }
  live_vectors_ -= count;
  docs_.erase(it);
  return absl::OkStatus();
}

absl::Status CandidateIndexImpl::CollectLive(std::vector<float>* vectors,
                                             std::vector<FaissId>* ids) const {
  const int64_t ntotal = index_->ntotal;
  const size_t d = static_cast<size_t>(options_.dim);
  vectors->resize(static_cast<size_t>(ntotal) * d);
  ids->clear();
  ids->reserve(static_cast<size_t>(live_vectors_));
  const faiss::Index* inner = index_->index;
  if (ntotal > 0) {
    TESSERA_RETURN_IF_ERROR(FaissCall("reconstructing the indexed vectors",
                                      [&] { inner->reconstruct_n(0, ntotal, vectors->data()); }));
  }
  size_t kept = 0;
  for (int64_t pos = 0; pos < ntotal; ++pos) {
    if (dead_[pos] != 0) continue;
    if (static_cast<size_t>(pos) != kept) {
      std::memmove(vectors->data() + kept * d, vectors->data() + pos * d, d * sizeof(float));
    }
    ids->push_back(index_->id_map[pos]);
    ++kept;
  }
  vectors->resize(kept * d);
  return absl::OkStatus();
}

absl::Status CandidateIndexImpl::MaybeRebuild() {
#ifdef ABSL_HAVE_THREAD_SANITIZER
  ScopedSingleOmpThread single_thread;
#endif
  std::unique_ptr<faiss::IndexIDMap2> rebuilt;
  std::string description;
  {
    ReaderMutexLock lock(&mu_);
    enum class Action { kToHnsw, kTrain, kCompact };
    Action action;
    if (auto_ && kind_ != Kind::kHnsw && live_vectors_ >= options_.auto_exact_limit &&
        live_vectors_ > 0) {
      action = Action::kToHnsw;
      description = absl::StrCat("IDMap2,HNSW", kHnswM);
    } else if (!trained_ && live_vectors_ >= options_.min_training_vectors) {
      action = Action::kTrain;
      description = description_;
    } else if (dead_count_ > 0 && dead_count_ > kCompactionFraction * index_->ntotal) {
      action = Action::kCompact;
      description = description_;
    } else {
      return absl::OkStatus();
    }

    std::vector<float> vectors;
    std::vector<FaissId> ids;
    TESSERA_RETURN_IF_ERROR(CollectLive(&vectors, &ids));
    const int64_t n = static_cast<int64_t>(ids.size());
    std::unique_ptr<faiss::Index> inner;
    if (action == Action::kToHnsw ||
        (action == Action::kCompact && kind_ == Kind::kHnsw && auto_)) {
      inner = NewHnswFlat(options_);
    } else if (auto_) {
      inner = std::make_unique<faiss::IndexFlatIP>(static_cast<int>(options_.dim));
    } else {
      TESSERA_ASSIGN_OR_RETURN(inner, NewFactoryIndex(options_));
    }
    const faiss::Index* current = index_->index;
    if (action == Action::kCompact && !inner->is_trained) {
      // Keep the trained quantizers rather than retraining on fewer (possibly too few) vectors.
      TESSERA_RETURN_IF_ERROR(FaissCall("cloning the trained index", [&] {
        inner.reset(faiss::clone_index(current));
        inner->reset();
      }));
    }
    if (!inner->is_trained) {
      // Train on all vectors, or on a fixed-seed random sample of kMaxTrainingVectors.
      const size_t d = static_cast<size_t>(options_.dim);
      std::vector<float> sample;
      const float* train = vectors.data();
      int64_t n_train = n;
      if (n > kMaxTrainingVectors) {
        std::vector<int64_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::mt19937_64 rng(kTrainingSampleSeed);
        for (int64_t i = 0; i < kMaxTrainingVectors; ++i) {
          std::uniform_int_distribution<int64_t> pick(i, n - 1);
          std::swap(order[i], order[pick(rng)]);
        }
        sample.resize(kMaxTrainingVectors * d);
        for (int64_t i = 0; i < kMaxTrainingVectors; ++i) {
          std::memcpy(sample.data() + i * d, vectors.data() + order[i] * d, d * sizeof(float));
        }
        train = sample.data();
        n_train = kMaxTrainingVectors;
      }
      absl::Status status =
          FaissCall(absl::StrCat("training ", options_.factory, " on ", n_train, " vectors"),
                    [&] { inner->train(n_train, train); });
      if (!status.ok()) return absl::FailedPreconditionError(status.message());
    }
    TESSERA_RETURN_IF_ERROR(FaissCall("rebuilding the candidate index", [&] {
      ConfigureInner(inner.get(), options_);
      rebuilt = std::make_unique<faiss::IndexIDMap2>(inner.get());
      rebuilt->own_fields = true;
      static_cast<void>(inner.release());  // rebuilt owns it
      if (n > 0) rebuilt->add_with_ids(n, vectors.data(), ids.data());
    }));
  }
  MutexLock lock(&mu_);
  index_ = std::move(rebuilt);
  kind_ = KindOf(index_->index);
  description_ = std::move(description);
  trained_ = true;
  dead_.assign(index_->ntotal, 0);
  dead_count_ = 0;
  return absl::OkStatus();
}

std::vector<FaissId> CandidateIndexImpl::AcceptedPositions(
    const std::function<bool(uint64_t)>* accept) const {
  std::vector<FaissId> positions;
  const int64_t ntotal = index_->ntotal;
  // A document's vectors are stored together, so ask `accept` once per run of one document.
  uint64_t last_doc = ~uint64_t{0};
  bool last_accepted = false;
  for (int64_t pos = 0; pos < ntotal; ++pos) {
    if (dead_[pos] != 0) continue;
    const uint64_t doc = DocOf(index_->id_map[pos]);
    if (doc != last_doc) {
      last_doc = doc;
      last_accepted = accept == nullptr || (*accept)(doc);
    }
    if (last_accepted) positions.push_back(pos);
  }
  return positions;
}

absl::Status CandidateIndexImpl::ExactSearch(FloatMatrixView queries,
                                             const std::vector<int64_t>& rows,
                                             const std::vector<FaissId>& positions, int k,
                                             ThreadPool* pool,
                                             std::vector<std::vector<ScoredId>>* hits) const {
  const size_t d = static_cast<size_t>(options_.dim);
  const size_t nq = rows.size();
  if (positions.empty()) {
    for (int64_t row : rows) (*hits)[row].clear();
    return absl::OkStatus();
  }
  std::vector<float> query_block(nq * d);
  for (size_t i = 0; i < nq; ++i) {
    std::memcpy(query_block.data() + i * d, queries.data + rows[i] * d, d * sizeof(float));
  }
  const faiss::Index* inner = index_->index;
  const float* raw = RawVectors(inner);
  const FaissId* id_map = index_->id_map.data();
  const size_t block_rows = std::max(kMinScanBlockRows, kScanBlockBytes / (d * sizeof(float)));
  const int64_t num_blocks = static_cast<int64_t>((positions.size() + block_rows - 1) / block_rows);
  // One part per thread, each a run of blocks with its own RowTopKs, merged at the end.
  const int64_t num_parts =
      pool == nullptr ? 1 : std::min<int64_t>(pool->num_threads(), num_blocks);
  std::vector<std::vector<RowTopK>> part_best(num_parts, std::vector<RowTopK>(nq, RowTopK(k)));
  std::vector<absl::Status> part_status(num_parts);

  // Scores one part's blocks against the query rows by the MaxSim micro-kernels (faster than
  // OpenBLAS's sgemm on these shapes), which leave a vector's similarities to all rows adjacent,
  // so most vectors are passed over after comparing them with the rows' thresholds. A block is
  // read in place when its positions span at most a quarter more storage than they number (the
  // holes — tombstones, filtered-out documents — are scored and skipped), and gathered otherwise.
  const QuerySimilarity similarity(
      FloatMatrixView{query_block.data(), static_cast<int64_t>(nq), static_cast<int64_t>(d)});
  const size_t stride = static_cast<size_t>(similarity.stride());
  auto scan_part = [&](int64_t part) {
    std::vector<RowTopK>& best = part_best[part];
    std::vector<float> gathered;
    // Sized for the largest block this scan has: a small index must not pay for a 2 MiB block
    // (zero-filling it cost more than the scan).
    const size_t largest_block = std::min(block_rows, positions.size());
    std::vector<float> similarities((largest_block + largest_block / 4) * stride);
    std::vector<float> thresholds(nq);
    const int64_t first = part * num_blocks / num_parts;
    const int64_t last = (part + 1) * num_blocks / num_parts;
    part_status[part] = FaissCall("exact candidate search", [&] {
      for (int64_t b = first; b < last; ++b) {
        const size_t start = static_cast<size_t>(b) * block_rows;
        const size_t n = std::min(block_rows, positions.size() - start);
        const FaissId* block_positions = positions.data() + start;
        const FaissId first_position = block_positions[0];
        const size_t span = static_cast<size_t>(block_positions[n - 1] - first_position) + 1;
        const bool in_place = raw != nullptr && span <= n + n / 4;
        const float* vectors;
        if (in_place) {
          vectors = raw + first_position * d;
        } else {
          gathered.resize(n * d);
          for (size_t i = 0; i < n; ++i) {
            if (raw != nullptr) {
              std::memcpy(gathered.data() + i * d, raw + block_positions[i] * d, d * sizeof(float));
            } else {
              inner->reconstruct(block_positions[i], gathered.data() + i * d);
            }
          }
          vectors = gathered.data();
        }
        similarity.Compute(vectors, static_cast<int64_t>(in_place ? span : n), similarities.data());
        for (size_t q = 0; q < nq; ++q) thresholds[q] = best[q].threshold();
        for (size_t i = 0; i < n; ++i) {
          const size_t scored =
              in_place ? static_cast<size_t>(block_positions[i] - first_position) : i;
          const float* row = similarities.data() + scored * stride;
          bool any = false;
          for (size_t q = 0; q < nq; ++q) any |= row[q] >= thresholds[q];
          if (!any) continue;
          const FaissId id = id_map[block_positions[i]];
          for (size_t q = 0; q < nq; ++q) {
            if (row[q] < thresholds[q]) continue;
            best[q].Push(row[q], id);
            thresholds[q] = best[q].threshold();
          }
        }
      }
    });
  };
  if (num_parts == 1) {
    scan_part(0);
  } else {
    pool->ParallelFor(num_parts, 1, [&](int64_t begin, int64_t end) {
      for (int64_t part = begin; part < end; ++part) scan_part(part);
    });
  }
  for (const absl::Status& status : part_status) TESSERA_RETURN_IF_ERROR(status);
  for (size_t q = 0; q < nq; ++q) {
    RowTopK& merged = part_best[0][q];
    for (int64_t part = 1; part < num_parts; ++part) merged.Merge(part_best[part][q]);
    (*hits)[rows[q]] = merged.Take();
  }
  return absl::OkStatus();
}

absl::Status CandidateIndexImpl::SearchLocked(FloatMatrixView queries, int k,
                                              const std::function<bool(uint64_t)>* accept,
                                              ThreadPool* pool,
                                              std::vector<std::vector<ScoredId>>* hits) const {
  const int64_t nq = queries.rows;
  const bool has_dead = dead_count_ > 0;
  const bool filtered = accept != nullptr || has_dead;
  if (kind_ == Kind::kFlat || (filtered && kind_ != Kind::kHnsw && kind_ != Kind::kIvf)) {
    // Flat: our scan (one sgemm per block, threshold selection, split over the pool) instead of
    // FAISS's single-threaded knn with a heap update per similarity. Other exhaustive kinds when
    // filtered: FAISS 1.7.3 runs a filtered flat search as one full pass per query, and IndexPQ
    // rejects selectors.
    const std::vector<FaissId> positions = AcceptedPositions(accept);
    std::vector<int64_t> rows(nq);
    std::iota(rows.begin(), rows.end(), 0);
    return ExactSearch(queries, rows, positions, k, pool, hits);
  }

  const int64_t kk = std::min<int64_t>(k, index_->ntotal);
  std::vector<float> distances(nq * kk);
  std::vector<FaissId> labels(nq * kk);
  DocumentSelector selector(index_->id_map, dead_, has_dead, accept);
  faiss::SearchParametersHNSW hnsw_params;
  faiss::SearchParametersIVF ivf_params;
  const faiss::SearchParameters* params = nullptr;
  if (kind_ == Kind::kHnsw) {
    hnsw_params.efSearch = options_.hnsw_ef_search;
    hnsw_params.sel = filtered ? &selector : nullptr;
    params = &hnsw_params;
  } else if (kind_ == Kind::kIvf) {
    const auto* ivf = static_cast<const faiss::IndexIVF*>(index_->index);
    ivf_params.nprobe = ivf->nprobe;
    ivf_params.max_codes = ivf->max_codes;
    ivf_params.sel = filtered ? &selector : nullptr;
    params = &ivf_params;
  }
  const faiss::Index* inner = index_->index;
  TESSERA_RETURN_IF_ERROR(FaissCall("candidate search", [&] {
    inner->search(nq, queries.data, kk, distances.data(), labels.data(), params);
  }));
  std::vector<int64_t> short_rows;
  for (int64_t q = 0; q < nq; ++q) {
    auto& row = (*hits)[q];
    for (int64_t j = 0; j < kk; ++j) {
      const FaissId label = labels[q * kk + j];
      if (label >= 0) row.push_back({distances[q * kk + j], index_->id_map[label]});
    }
    std::sort(row.begin(), row.end(), Better);
    if (static_cast<int64_t>(row.size()) < kk) short_rows.push_back(q);
  }
  if (short_rows.empty()) return absl::OkStatus();

  // An approximate index may find fewer than k accepted vectors (a selective filter, tombstones):
  // search those rows exactly when more accepted vectors exist.
  const std::vector<FaissId> positions = AcceptedPositions(accept);
  const size_t reachable = std::min<size_t>(static_cast<size_t>(k), positions.size());
  std::vector<int64_t> rows;
  for (int64_t q : short_rows) {
    if ((*hits)[q].size() < reachable) rows.push_back(q);
  }
  if (rows.empty()) return absl::OkStatus();
  return ExactSearch(queries, rows, positions, k, pool, hits);
}

absl::StatusOr<std::vector<std::vector<CandidateHit>>> CandidateIndexImpl::Search(
    FloatMatrixView queries, int k, const std::function<bool(uint64_t)>* accept,
    ThreadPool* pool) const {
  if (k < 1) return absl::InvalidArgumentError(absl::StrCat("k ", k, ", expected >= 1"));
  if (queries.rows < 0 || (queries.rows > 0 && queries.data == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("query matrix with ", queries.rows, " rows"));
  }
  if (queries.rows > 0 && queries.cols != options_.dim) {
    return absl::InvalidArgumentError(absl::StrCat("queries of dim ", queries.cols,
                                                   ", the candidate index expects ", options_.dim));
  }
  if (accept != nullptr && !*accept) accept = nullptr;  // an empty std::function: no filter
  std::vector<std::vector<ScoredId>> hits(queries.rows);
  {
    ScopedSingleOmpThread single_thread;
    ReaderMutexLock lock(&mu_);
    if (queries.rows > 0 && live_vectors_ > 0) {
      TESSERA_RETURN_IF_ERROR(SearchLocked(queries, k, accept, pool, &hits));
    }
  }
  std::vector<std::vector<CandidateHit>> result(queries.rows);
  for (int64_t q = 0; q < queries.rows; ++q) {
    result[q].reserve(hits[q].size());
    for (const ScoredId& hit : hits[q]) result[q].push_back({DocOf(hit.id), hit.similarity});
  }
  return result;
}

std::vector<uint64_t> CandidateIndexImpl::Documents() const {
  ReaderMutexLock lock(&mu_);
  std::vector<uint64_t> docs;
  docs.reserve(docs_.size());
  for (const auto& [doc, count] : docs_) docs.push_back(doc);
  return docs;
}

CandidateIndexStats CandidateIndexImpl::Stats() const {
  ReaderMutexLock lock(&mu_);
  CandidateIndexStats stats;
  stats.vectors = live_vectors_;
  stats.documents = static_cast<int64_t>(docs_.size());
  stats.description = description_;
  stats.trained = trained_;
  // Per stored vector: its code (raw floats for Flat), HNSW's level-0 links, an IVF list's id
  // (and its direct map's entry), and IDMap2's id in both directions; plus an IVF's coarse
  // centroids.
  const faiss::Index* inner = index_->index;
  int64_t per_vector = index_->d * static_cast<int64_t>(sizeof(float));
  int64_t fixed = 0;
  if (const auto* codes = dynamic_cast<const faiss::IndexFlatCodes*>(inner)) {
    per_vector = static_cast<int64_t>(codes->code_size);
  } else if (const auto* hnsw = dynamic_cast<const faiss::IndexHNSW*>(inner)) {
    per_vector += hnsw->hnsw.nb_neighbors(0) * static_cast<int64_t>(sizeof(int32_t));
  } else if (const auto* ivf = dynamic_cast<const faiss::IndexIVF*>(inner)) {
    per_vector = static_cast<int64_t>(ivf->code_size + sizeof(FaissId));
    if (ivf->direct_map.type != faiss::DirectMap::NoMap) per_vector += sizeof(FaissId);
    fixed = static_cast<int64_t>(ivf->nlist) * ivf->d * static_cast<int64_t>(sizeof(float));
  }
  stats.memory_bytes =
      fixed + index_->ntotal * (per_vector + 3 * static_cast<int64_t>(sizeof(FaissId)));
  return stats;
}

absl::Status CandidateIndexImpl::Save(const std::string& path, uint64_t covered) const {
  MutexLock save_lock(&save_mu_);
  std::string meta;
  faiss::VectorIOWriter writer;
  {
    ReaderMutexLock lock(&mu_);
    Append(meta, trained_ ? kFlagTrained : uint32_t{0});
    AppendString(meta, options_.factory);
    AppendString(meta, description_);
    Append(meta, static_cast<uint64_t>(docs_.size()));
    for (const auto& [doc, count] : docs_) {
      Append(meta, doc);
      Append(meta, static_cast<uint64_t>(count));
    }
    const faiss::Index* index = index_.get();
    TESSERA_RETURN_IF_ERROR(
        FaissCall("serialising the candidate index", [&] { faiss::write_index(index, &writer); }));
  }
  Append(meta, static_cast<uint64_t>(writer.data.size()));
  const uint64_t payload_size = meta.size() + writer.data.size();
  uint32_t crc = Crc32(AsBytes(meta.data(), meta.size()));
  crc = Crc32(AsBytes(writer.data.data(), writer.data.size()), crc);

  std::string header;
  header.append(kMagic, sizeof(kMagic));
  Append(header, kFormatVersion);
  Append(header, options_.dim);
  Append(header, covered);
  Append(header, payload_size);
  Append(header, crc);
  Append(header, Crc32(AsBytes(header.data(), header.size())));
  return WriteFileAtomically(path, {header, meta, AsBytes(writer.data.data(), writer.data.size())});
}

absl::StatusOr<std::unique_ptr<CandidateIndex>> CandidateIndex::Create(
    const CandidateIndexOptions& options) {
  TESSERA_RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<faiss::Index> inner;
  std::string description;
  bool trained = true;
  if (options.factory == "auto") {
    description = "IDMap2,Flat";
  } else {
    TESSERA_ASSIGN_OR_RETURN(inner, NewFactoryIndex(options));
    description = absl::StrCat("IDMap2,", options.factory);
    // A trainable index is built once min_training_vectors vectors have arrived; until then they
    // are buffered (and searched) in an exact Flat index.
    trained = inner->is_trained;
    if (!trained) inner.reset();
  }
  std::unique_ptr<faiss::IndexIDMap2> index;
  TESSERA_RETURN_IF_ERROR(FaissCall("creating the candidate index", [&] {
    if (inner == nullptr) {
      inner = std::make_unique<faiss::IndexFlatIP>(static_cast<int>(options.dim));
    }
    ConfigureInner(inner.get(), options);
    index = std::make_unique<faiss::IndexIDMap2>(inner.get());
    index->own_fields = true;
    static_cast<void>(inner.release());  // index owns it
  }));
  return std::make_unique<CandidateIndexImpl>(options, std::move(index), std::move(description),
                                              trained, std::map<uint64_t, int64_t>{},
                                              std::vector<uint8_t>{});
}

absl::StatusOr<std::pair<std::unique_ptr<CandidateIndex>, uint64_t>> CandidateIndex::Load(
    const std::string& path, const CandidateIndexOptions& options) {
  TESSERA_RETURN_IF_ERROR(ValidateOptions(options));
  TESSERA_ASSIGN_OR_RETURN(const std::string bytes, ReadWholeFile(path));
  auto corrupt = [&path](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("candidate snapshot '", path, "': ", why));
  };
  if (bytes.size() < kHeaderSize) {
    return corrupt(
        absl::StrCat("truncated: ", bytes.size(), " bytes, the header alone is ", kHeaderSize));
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) return corrupt("bad magic");
  uint32_t version, payload_crc, header_crc;
  int64_t dim;
  uint64_t covered, payload_size;
  std::memcpy(&version, bytes.data() + 4, 4);
  std::memcpy(&dim, bytes.data() + 8, 8);
  std::memcpy(&covered, bytes.data() + 16, 8);
  std::memcpy(&payload_size, bytes.data() + 24, 8);
  std::memcpy(&payload_crc, bytes.data() + 32, 4);
  std::memcpy(&header_crc, bytes.data() + 36, 4);
  if (Crc32(AsBytes(bytes.data(), 36)) != header_crc) return corrupt("header checksum mismatch");
  if (version != kFormatVersion) {
    return corrupt(absl::StrCat("format version ", version, ", expected ", kFormatVersion));
  }
  if (dim != options.dim) {
    return corrupt(absl::StrCat("dim ", dim, ", the options ask for ", options.dim));
  }
  if (payload_size != bytes.size() - kHeaderSize) {
    return corrupt(absl::StrCat("payload of ", bytes.size() - kHeaderSize,
                                " bytes, the header says ", payload_size, " (truncated?)"));
  }
  if (Crc32(AsBytes(bytes.data() + kHeaderSize, payload_size)) != payload_crc) {
    return corrupt("payload checksum mismatch");
  }

  PayloadReader reader(reinterpret_cast<const uint8_t*>(bytes.data()) + kHeaderSize, payload_size);
  uint32_t flags;
  std::string factory, description;
  uint64_t num_docs;
  if (!reader.Read(&flags, sizeof(flags)) || !reader.ReadString(&factory) ||
      !reader.ReadString(&description) || !reader.Read(&num_docs, sizeof(num_docs)) ||
      num_docs > reader.left() / 16) {
    return corrupt("malformed metadata");
  }
  if (factory != options.factory) {
    return corrupt(absl::StrCat("built with factory '", factory, "', the options ask for '",
                                options.factory, "'"));
  }
  std::map<uint64_t, int64_t> docs;
  for (uint64_t i = 0; i < num_docs; ++i) {
    uint64_t doc = 0, count = 0;
    if (!reader.Read(&doc, sizeof(doc)) || !reader.Read(&count, sizeof(count)) ||
        doc > kMaxDocument || count < 1 ||
        count > static_cast<uint64_t>(kMaxCandidateVectorsPerDocument) ||
        (!docs.empty() && doc <= docs.rbegin()->first)) {
      return corrupt("malformed document table");
    }
    docs.emplace_hint(docs.end(), doc, static_cast<int64_t>(count));
  }
  uint64_t faiss_size;
  if (!reader.Read(&faiss_size, sizeof(faiss_size)) || faiss_size != reader.left()) {
    return corrupt("malformed FAISS section length");
  }

  std::unique_ptr<faiss::IndexIDMap2> index;
  {
    faiss::VectorIOReader faiss_reader;
    faiss_reader.data.assign(reader.data(), reader.data() + faiss_size);
    std::unique_ptr<faiss::Index> read;
    absl::Status status =
        FaissCall("reading the FAISS index", [&] { read.reset(faiss::read_index(&faiss_reader)); });
    if (!status.ok()) return corrupt(status.message());
    auto* idmap = dynamic_cast<faiss::IndexIDMap2*>(read.get());
    if (idmap == nullptr || idmap->index == nullptr || idmap->d != options.dim ||
        idmap->metric_type != faiss::METRIC_INNER_PRODUCT || idmap->index->d != options.dim ||
        idmap->index->ntotal != idmap->ntotal ||
        static_cast<int64_t>(idmap->id_map.size()) != idmap->ntotal) {
      return corrupt("the FAISS section is not an inner-product IDMap2 index of this dim");
    }
    static_cast<void>(read.release());  // the same object as idmap, owned by index from here
    index.reset(idmap);
  }
  const bool trained = (flags & kFlagTrained) != 0;
  if (!index->index->is_trained || (!trained && KindOf(index->index) != Kind::kFlat)) {
    return corrupt("inconsistent training state");
  }

  // Tombstones: a position is live iff its document is live, its slot is below the document's
  // count and it is the newest position holding its id (rev_map); every live id is present once.
  std::vector<uint8_t> dead(index->ntotal, 1);
  int64_t live = 0, expected = 0;
  absl::Status status = FaissCall("checking the snapshot's ids", [&] {
    index->construct_rev_map();
    for (int64_t pos = 0; pos < index->ntotal; ++pos) {
      const FaissId id = index->id_map[pos];
      auto doc = docs.find(DocOf(id));
      if (id < 0 || doc == docs.end() || SlotOf(id) >= doc->second) continue;
      if (index->rev_map.at(id) != pos) continue;
      dead[pos] = 0;
      ++live;
    }
  });
  if (!status.ok()) return corrupt(status.message());
  for (const auto& [doc, count] : docs) expected += count;
  if (live != expected) {
    return corrupt(
        absl::StrCat(live, " live vectors in the FAISS index, the document table has ", expected));
  }
  status =
      FaissCall("configuring the loaded index", [&] { ConfigureInner(index->index, options); });
  if (!status.ok()) return status;
  std::unique_ptr<CandidateIndex> loaded = std::make_unique<CandidateIndexImpl>(
      options, std::move(index), std::move(description), trained, std::move(docs), std::move(dead));
  return std::make_pair(std::move(loaded), covered);
}

void ConfigureFaissForServing(int blas_threads) {
  // FAISS's flat searches (IVF's coarse quantizer; Flat indexes are scanned by ExactSearch) take
  // one sgemm per block of database vectors when at least distance_compute_blas_threshold (20)
  // query rows come at once, and otherwise compute one inner product at a time — in Debian's
  // generic build a scalar loop. Queries here are token matrices of a few to a few dozen rows
  // (medline, 24k × 384 Flat through FAISS: 45% of the search in fvec_inner_product_ref).
  faiss::distance_compute_blas_threshold = 1;
  if (blas_threads > 0) openblas_set_num_threads(blas_threads);
}

int BlasThreads() { return openblas_get_num_threads(); }

}  // namespace tessera::internal
