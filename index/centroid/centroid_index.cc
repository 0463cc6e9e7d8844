#include "index/centroid/centroid_index.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "index/common/thread_pool.h"
#include "index/rerank/cpu_maxsim_scorer.h"

namespace tessera::internal {
namespace {

constexpr int kLut = ResidualCodec::kLookupTableWidth;
// Centroids scored per task when the query × centroid scores are split over the pool.
constexpr int64_t kCentroidChunk = 2048;

// Per-thread scratch indexed by document ordinal, reset in O(1) per use by an epoch stamp: an
// entry is valid for the current use only when its stamp equals the epoch. Reused across searches
// (and indexes) on the same thread, so a search allocates nothing proportional to the shard.
struct OrdinalScratch {
  std::vector<uint32_t> stamp;
  std::vector<float> value;
  uint32_t epoch = 0;

  void Begin(size_t ordinals) {
    if (stamp.size() < ordinals) {
      stamp.resize(ordinals, 0);
      value.resize(ordinals, 0.0f);
    }
    if (++epoch == 0) {
      std::fill(stamp.begin(), stamp.end(), 0);
      epoch = 1;
    }
  }
};

OrdinalScratch& TokenScratch() {
  thread_local OrdinalScratch scratch;
  return scratch;
}
OrdinalScratch& MergeScratch() {
  thread_local OrdinalScratch scratch;
  return scratch;
}

// Σ_j lut[j·256 + code[j]] with four independent sums (the adds would otherwise form one chain of
// code_bytes dependent additions).
inline float ScoreCode(const float* lut, const uint8_t* code, int64_t code_bytes) {
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
  int64_t j = 0;
  for (; j + 4 <= code_bytes; j += 4) {
    s0 += lut[(j + 0) * kLut + code[j + 0]];
    s1 += lut[(j + 1) * kLut + code[j + 1]];
    s2 += lut[(j + 2) * kLut + code[j + 2]];
    s3 += lut[(j + 3) * kLut + code[j + 3]];
  }
  for (; j < code_bytes; ++j) s0 += lut[j * kLut + code[j]];
  return (s0 + s1) + (s2 + s3);
}

// Appends with 1/8 headroom instead of std::vector's doubling: lists are most of a shard's
// memory (on average 6% slack instead of 25–50%), and a list that grew by one entry should not
// double.
template <typename T>
void AppendWithHeadroom(std::vector<T>& v, const T* data, size_t n) {
  if (v.size() + n > v.capacity()) v.reserve(v.size() + n + (v.size() + n) / 8 + 8);
  v.insert(v.end(), data, data + n);
}

}  // namespace

std::string SerializeDocumentCodes(const DocumentCodes& codes) {
  std::string out;
  const uint32_t n = static_cast<uint32_t>(codes.centroids.size());
  out.reserve(4 + n * 4 + codes.codes.size());
  out.append(reinterpret_cast<const char*>(&n), 4);
  out.append(reinterpret_cast<const char*>(codes.centroids.data()), n * 4);
  out.append(codes.codes);
  return out;
}

absl::StatusOr<DocumentCodes> ParseDocumentCodes(absl::string_view bytes, int64_t code_bytes,
                                                 int64_t num_centroids) {
  uint32_t n = 0;
  if (bytes.size() < 4) return absl::DataLossError("document codes: shorter than their header");
  std::memcpy(&n, bytes.data(), 4);
  const uint64_t want = 4 + static_cast<uint64_t>(n) * (4 + static_cast<uint64_t>(code_bytes));
  if (bytes.size() != want) {
    return absl::DataLossError(absl::StrCat("document codes: ", bytes.size(), " bytes for ", n,
                                            " vectors, expected ", want));
  }
  DocumentCodes codes;
  codes.centroids.resize(n);
  std::memcpy(codes.centroids.data(), bytes.data() + 4, n * size_t{4});
  for (uint32_t id : codes.centroids) {
    if (id >= num_centroids) {
      return absl::DataLossError(
          absl::StrCat("document codes: centroid ", id, ", expected < ", num_centroids));
    }
  }
  codes.codes.assign(bytes.data() + 4 + n * size_t{4}, n * static_cast<size_t>(code_bytes));
  return codes;
}

CentroidIndex::CentroidIndex(std::shared_ptr<const CentroidCodebook> codebook)
    : codebook_(std::move(codebook)),
      code_bytes_(codebook_->codec().code_bytes()),
      lists_(codebook_->num_centroids()) {}

DocumentCodes CentroidIndex::Encode(FloatMatrixView vectors) const {
  DocumentCodes codes;
  codes.centroids.resize(vectors.rows);
  codes.codes.resize(vectors.rows * code_bytes_);
  codebook_->Encode(vectors, codes.centroids.data(),
                    reinterpret_cast<uint8_t*>(codes.codes.data()));
  return codes;
}

absl::Status CentroidIndex::Add(uint64_t doc, const DocumentCodes& codes) {
  const int64_t n = codes.size();
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("document ", doc, ": no vectors"));
  if (static_cast<int64_t>(codes.codes.size()) != n * code_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("document ", doc, ": ", codes.codes.size(),
                                                   " code bytes for ", n, " vectors, expected ",
                                                   n * code_bytes_));
  }
  for (uint32_t id : codes.centroids) {
    if (id >= codebook_->num_centroids()) {
      return absl::InvalidArgumentError(absl::StrCat("document ", doc, ": centroid ", id,
                                                     ", expected < ", codebook_->num_centroids()));
    }
  }
  MutexLock lock(&mu_);
  if (ordinal_doc_.size() >= std::numeric_limits<uint32_t>::max()) {
    return absl::ResourceExhaustedError("centroid index: 2^32 document ordinals in use");
  }
  const auto existing = doc_ordinal_.find(doc);
  if (existing != doc_ordinal_.end()) {
    ordinal_dead_[existing->second] = 1;
    live_vectors_ -= ordinal_vectors_[existing->second];
    dead_vectors_ += ordinal_vectors_[existing->second];
    doc_ordinal_.erase(existing);
  }
  const uint32_t ordinal = static_cast<uint32_t>(ordinal_doc_.size());
  ordinal_doc_.push_back(doc);
  ordinal_vectors_.push_back(static_cast<uint32_t>(n));
  ordinal_dead_.push_back(0);
  doc_ordinal_[doc] = ordinal;
  const auto* code = reinterpret_cast<const uint8_t*>(codes.codes.data());
  for (int64_t v = 0; v < n; ++v) {
    List& list = lists_[codes.centroids[v]];
    AppendWithHeadroom(list.ordinals, &ordinal, 1);
    AppendWithHeadroom(list.codes, code + v * code_bytes_, code_bytes_);
  }
  live_vectors_ += n;
  if (dead_vectors_ > kCompactionFraction * (live_vectors_ + dead_vectors_)) CompactLocked();
  return absl::OkStatus();
}

void CentroidIndex::Remove(uint64_t doc) {
  MutexLock lock(&mu_);
  const auto it = doc_ordinal_.find(doc);
  if (it == doc_ordinal_.end()) return;
  ordinal_dead_[it->second] = 1;
  live_vectors_ -= ordinal_vectors_[it->second];
  dead_vectors_ += ordinal_vectors_[it->second];
  doc_ordinal_.erase(it);
  if (dead_vectors_ > kCompactionFraction * (live_vectors_ + dead_vectors_)) CompactLocked();
}

void CentroidIndex::CompactLocked() {
  // New ordinals: the live ones in their old order.
  std::vector<uint32_t> renumber(ordinal_doc_.size(), std::numeric_limits<uint32_t>::max());
  std::vector<uint64_t> docs;
  std::vector<uint32_t> vectors;
  docs.reserve(doc_ordinal_.size());
  vectors.reserve(doc_ordinal_.size());
  for (size_t o = 0; o < ordinal_doc_.size(); ++o) {
    if (ordinal_dead_[o]) continue;
    renumber[o] = static_cast<uint32_t>(docs.size());
    docs.push_back(ordinal_doc_[o]);
    vectors.push_back(ordinal_vectors_[o]);
  }
  for (List& list : lists_) {
    size_t kept = 0;
    for (size_t e = 0; e < list.ordinals.size(); ++e) {
      const uint32_t ordinal = renumber[list.ordinals[e]];
      if (ordinal == std::numeric_limits<uint32_t>::max()) continue;
      list.ordinals[kept] = ordinal;
      std::memmove(&list.codes[kept * code_bytes_], &list.codes[e * code_bytes_], code_bytes_);
      ++kept;
    }
    list.ordinals.resize(kept);
    list.codes.resize(kept * code_bytes_);
    list.ordinals.shrink_to_fit();
    list.codes.shrink_to_fit();
  }
  for (auto& [doc, ordinal] : doc_ordinal_) ordinal = renumber[ordinal];
  ordinal_doc_ = std::move(docs);
  ordinal_vectors_ = std::move(vectors);
  ordinal_dead_.assign(ordinal_doc_.size(), 0);
  dead_vectors_ = 0;
}

bool CentroidIndex::Contains(uint64_t doc) const {
  ReaderMutexLock lock(&mu_);
  return doc_ordinal_.contains(doc);
}

void CentroidIndex::ScanToken(const float* query, const float* centroid_scores, int64_t stride,
                              int64_t token, int nprobe, TokenHits* out) const {
  const int64_t C = codebook_->num_centroids();
  // The nprobe best centroids of this token (ties: lower id).
  std::vector<std::pair<float, uint32_t>> ranked(C);
  for (int64_t c = 0; c < C; ++c) {
    ranked[c] = {centroid_scores[c * stride + token], static_cast<uint32_t>(c)};
  }
  auto better = [](const std::pair<float, uint32_t>& a, const std::pair<float, uint32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  std::nth_element(ranked.begin(), ranked.begin() + (nprobe - 1), ranked.end(), better);
  std::sort(ranked.begin(), ranked.begin() + nprobe, better);
  out->missing = ranked[nprobe - 1].first;

  std::vector<float> lut(code_bytes_ * kLut);
  codebook_->codec().BuildLookupTable(query, lut.data());
  OrdinalScratch& scratch = TokenScratch();
  scratch.Begin(ordinal_doc_.size());
  const uint32_t epoch = scratch.epoch;
  uint32_t* stamp = scratch.stamp.data();
  float* best = scratch.value.data();
  const uint8_t* dead = ordinal_dead_.data();
  std::vector<uint32_t> touched;
  for (int p = 0; p < nprobe; ++p) {
    const float base = ranked[p].first;
    const List& list = lists_[ranked[p].second];
    const uint32_t* ordinals = list.ordinals.data();
    const uint8_t* codes = list.codes.data();
    const size_t n = list.ordinals.size();
    for (size_t e = 0; e < n; ++e) {
      const uint32_t ordinal = ordinals[e];
      if (dead[ordinal]) continue;
      const float score = base + ScoreCode(lut.data(), codes + e * code_bytes_, code_bytes_);
      if (stamp[ordinal] != epoch) {
        stamp[ordinal] = epoch;
        best[ordinal] = score;
        touched.push_back(ordinal);
      } else if (score > best[ordinal]) {
        best[ordinal] = score;
      }
    }
  }
  out->hits.resize(touched.size());
  for (size_t t = 0; t < touched.size(); ++t) out->hits[t] = {touched[t], best[touched[t]]};
}

absl::StatusOr<std::vector<CentroidHit>> CentroidIndex::Search(
    FloatMatrixView queries, const CentroidSearchOptions& options,
    const std::function<bool(uint64_t)>* accept, ThreadPool* pool) const {
  if (queries.rows < 1 || queries.cols != codebook_->dim()) {
    return absl::InvalidArgumentError(absl::StrCat("centroid search: query of ", queries.rows,
                                                   " × ", queries.cols, ", expected ≥ 1 × ",
                                                   codebook_->dim()));
  }
  const int64_t C = codebook_->num_centroids();
  const int nprobe = static_cast<int>(std::clamp<int64_t>(options.nprobe, 1, C));
  const int64_t nq = queries.rows;
  const int64_t dim = queries.cols;

  // Query × centroid scores, centroids split over the pool.
  const QuerySimilarity similarity(queries);
  const int64_t stride = similarity.stride();
  std::vector<float> centroid_scores(C * stride);
  const int64_t chunks = (C + kCentroidChunk - 1) / kCentroidChunk;
  auto score_chunks = [&](int64_t begin, int64_t end) {
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      const int64_t first = chunk * kCentroidChunk;
      similarity.Compute(codebook_->centroids() + first * dim, std::min(kCentroidChunk, C - first),
                         &centroid_scores[first * stride]);
    }
  };
  if (pool != nullptr) {
    pool->ParallelFor(chunks, 1, score_chunks);
  } else {
    score_chunks(0, chunks);
  }

  ReaderMutexLock lock(&mu_);
  std::vector<TokenHits> tokens(nq);
  auto scan = [&](int64_t begin, int64_t end) {
    mu_.AssertReaderHeld();
    for (int64_t i = begin; i < end; ++i) {
      ScanToken(queries.data + i * dim, centroid_scores.data(), stride, i, nprobe, &tokens[i]);
    }
  };
  if (pool != nullptr) {
    pool->ParallelFor(nq, 1, scan);
  } else {
    scan(0, nq);
  }

  // Merge: acc[document] = Σ over the tokens that found it of (best − missing), so that the
  // approximate MaxSim is Σ missing + acc.
  OrdinalScratch& merge = MergeScratch();
  merge.Begin(ordinal_doc_.size());
  const uint32_t epoch = merge.epoch;
  std::vector<uint32_t> touched;
  float missing_sum = 0.0f;
  for (const TokenHits& token : tokens) {
    missing_sum += token.missing;
    for (const auto& [ordinal, score] : token.hits) {
      if (merge.stamp[ordinal] != epoch) {
        merge.stamp[ordinal] = epoch;
        merge.value[ordinal] = 0.0f;
        touched.push_back(ordinal);
      }
      merge.value[ordinal] += score - token.missing;
    }
  }
  std::vector<CentroidHit> hits;
  hits.reserve(touched.size());
  for (uint32_t ordinal : touched) {
    const uint64_t doc = ordinal_doc_[ordinal];
    if (accept != nullptr && !(*accept)(doc)) continue;
    hits.push_back(CentroidHit{doc, missing_sum + merge.value[ordinal]});
  }
  const size_t keep = std::min<size_t>(hits.size(), std::max<int64_t>(options.num_documents, 0));
  auto better = [](const CentroidHit& a, const CentroidHit& b) {
    return a.score != b.score ? a.score > b.score : a.doc < b.doc;
  };
  std::partial_sort(hits.begin(), hits.begin() + keep, hits.end(), better);
  hits.resize(keep);
  return hits;
}

std::vector<uint64_t> CentroidIndex::Documents() const {
  ReaderMutexLock lock(&mu_);
  std::vector<uint64_t> docs;
  docs.reserve(doc_ordinal_.size());
  for (const auto& [doc, ordinal] : doc_ordinal_) docs.push_back(doc);
  std::sort(docs.begin(), docs.end());
  return docs;
}

int64_t CentroidIndex::MemoryBytesLocked() const {
  int64_t bytes = codebook_->MemoryBytes();
  for (const List& list : lists_) {
    bytes += static_cast<int64_t>(list.ordinals.capacity() * sizeof(uint32_t) +
                                  list.codes.capacity() + sizeof(List));
  }
  bytes += static_cast<int64_t>(ordinal_doc_.capacity() * sizeof(uint64_t) +
                                ordinal_vectors_.capacity() * sizeof(uint32_t) +
                                ordinal_dead_.capacity());
  // flat_hash_map: one control byte and one slot per bucket.
  bytes +=
      static_cast<int64_t>(doc_ordinal_.capacity() * (1 + sizeof(std::pair<uint64_t, uint32_t>)));
  return bytes;
}

CentroidIndexStats CentroidIndex::Stats() const {
  ReaderMutexLock lock(&mu_);
  CentroidIndexStats stats;
  stats.documents = static_cast<int64_t>(doc_ordinal_.size());
  stats.vectors = live_vectors_;
  stats.dead_vectors = dead_vectors_;
  stats.memory_bytes = MemoryBytesLocked();
  return stats;
}

}  // namespace tessera::internal
