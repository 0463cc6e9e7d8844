#include "index/centroid/centroid_index.h"

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "index/common/thread_pool.h"
#include "index/kernels/query_similarity.h"
#include "tessera/status_macros.h"

namespace tessera::internal {
namespace {

// Centroids scored per task when the query × centroid scores are split over the pool, at most
// (fewer when that leaves a thread idle: a codebook of 2,048 centroids, the real sets' size, was
// scored by one thread of two, ~0.5 ms of a compact search's stage 1 at dim 384).
constexpr int64_t kCentroidChunk = 2048;

// Ordinals per accumulation tile: the shard's share per thread, at least 256 and at most 524,288
// (two floats each: 4 MiB, within a last-level cache). Every tile splits each probed list into one
// more run, and a run costs a search for its bounds and a cold start of the hardware prefetcher:
// on the 1M-document shard (2 threads), stage 1 took 8.1–8.7 ms with tiles of 500,000 ordinals,
// 8.6–9.0 with 250,000 and 9.1–9.5 with 125,000 (1 MiB of scratch, a core's L2), and tiles of
// 4,096–32,768 measured slower still: the scratch's extra cache misses cost less than the runs.
// On an Intel Xeon (AVX-512, 2 MiB of L2 a core) tiles of 131,072, 262,144 and 524,288 ordinals
// measured alike, stage 1 at 1M documents 12.7–14.7 ms each across six alternated runs.
constexpr int64_t kMaxTileOrdinals = 524288;
constexpr int64_t kMinTileOrdinals = 256;

// Per-thread scratch for one tile, indexed by ordinal − the tile's first: per document, the
// current token's margin so far in margin units (its best vector's score less the token's missing
// estimate; 0 when it found none above the estimate) and the sum of the margins of the tokens
// before it (MarginLevelCap: a byte and 16 bits, where floats took 2 MiB of margins a thread at
// 1M documents, past a core's L2, and 16 bytes a document streamed by each fold). Dense
// arrays instead of slots touched on demand: the per-entry update is then a branch-free max, and
// the per-token fold either a vectorised pass over the tile or a second pass over the token's
// entries (below) — a data-dependent branch per entry (first visit of a document by this token or
// not) cost more than the fold. So did a branch-free form without the fold, a slot per ordinal of
// the last token that found the document, that token's best so far and the sum before it (12
// bytes, the pending best added when another token finds the document): at 1M documents a token's
// 40 probed lists hold ~78,000 entries at the average length (~1,950) against 1M ordinals, yet
// stage 1 took 15.9–17.9 ms against the fold's 13.2–15.0 (Intel Xeon, AVX-512, alternated), and
// more with tiles of 65,536 or 131,072 ordinals: the per-entry access to three times the bytes
// costs more than a streamed pass. Reused across searches on the same thread.
struct TileScratch {
  std::vector<uint8_t> margin;
  std::vector<uint16_t> sum;

  void Begin(size_t ordinals) {
    if (margin.size() < ordinals) {
      margin.resize(ordinals);
      sum.resize(ordinals);
    }
  }
};

// After a token of a tile, over every ordinal: adds each document's margin to its sum and clears
// the margin for the next token. A document the token found nothing of (or nothing above its
// estimate) adds exactly 0, so the sums equal those of adding only the tokens that found it, in
// the same order — which is what the sparse fold does. Cloned for AVX2 and AVX-512, where it runs
// 32 or 64 bytes of margins at a time instead of SSE's 16. (With float margins and sums, 16 bytes
// an ordinal, the 512-bit clone took stage 1 at 1M documents from 11.67 to 11.05 ms at P50 on an
// Intel Xeon, Ice Lake; medians of six alternated runs.)
__attribute__((target_clones("avx512f", "avx2", "default"))) void FoldToken(size_t n,
                                                                            uint8_t* margin,
                                                                            uint16_t* sum) {
  for (size_t o = 0; o < n; ++o) {
    sum[o] = static_cast<uint16_t>(sum[o] + margin[o]);
    margin[o] = 0;
  }
}

// std::lower_bound over a list's ascending ordinals, starting from where the ordinals' spread
// puts `value` (a list's documents are spread evenly over the ordinals, so the guess is close),
// then doubling steps towards it and a binary search of the last step. A tile's bounds in a list
// are searched while the list's ordinals are mostly not in cache: searching from the previous
// boundary (by bisection or by doubling steps) took ~8 cache misses per boundary, two thirds of
// the boundary work's time on the 1M-document shard.
const uint32_t* InterpolatedLowerBound(const uint32_t* begin, const uint32_t* end, uint32_t value) {
  if (begin == end || *begin >= value) return begin;
  if (end[-1] < value) return end;
  // *begin < value ≤ end[-1]: the answer is in (begin, end − 1], and n ≥ 2.
  const size_t n = static_cast<size_t>(end - begin);
  const double share = static_cast<double>(value - *begin) / (end[-1] - *begin + 1.0);
  const uint32_t* guess = begin + std::clamp<size_t>(static_cast<size_t>(share * n), 1, n - 1);
  size_t step = 1;
  if (*guess < value) {  // forwards; low[0] < value throughout
    const uint32_t* low = guess;
    while (step < static_cast<size_t>(end - low) && low[step] < value) {
      low += step;
      step *= 2;
    }
    return std::lower_bound(low + 1, low + std::min(step, static_cast<size_t>(end - low)), value);
  }
  const uint32_t* high = guess;  // backwards; *high ≥ value throughout
  while (step <= static_cast<size_t>(high - begin) &&
         high[-static_cast<ptrdiff_t>(step)] >= value) {
    high -= step;
    step *= 2;
  }
  return std::lower_bound(high - std::min(step, static_cast<size_t>(high - begin)), high, value);
}

TileScratch& ThreadTileScratch() {
  thread_local TileScratch scratch;
  return scratch;
}

// A list's 16-bit table sums as the scan gives them, before MarginLevels. Reused across lists.
std::vector<uint16_t>& ThreadScanSums() {
  thread_local std::vector<uint16_t> sums;
  return sums;
}

// Each entry's margin in whole units from its tables' sum: `offset` + `ratio` · sum is the margin
// in units plus ½ (the probe's offset less the estimate, and the table step, over the unit), so
// truncation rounds to the nearest; a positive margin counts at least one, and none more than
// `cap`. Cloned for AVX2 and AVX-512, which convert 8 or 16 entries at a time: converting once
// here, where the sums are in L1, leaves the tiles' scatter (ScoreTile) a byte maximum an entry.
__attribute__((target_clones("avx512f", "avx2", "default"))) void MarginLevels(
    const uint16_t* sums, int64_t n, float offset, float ratio, float cap, uint8_t* levels) {
  for (int64_t e = 0; e < n; ++e) {
    const float units = offset + ratio * static_cast<float>(sums[e]);
    // Clamped in float first: a negative or NaN value becomes 0, and no conversion overflows.
    const float clamped = std::min(units > 0.0f ? units : 0.0f, cap);
    levels[e] =
        static_cast<uint8_t>(std::max(static_cast<int>(clamped), static_cast<int>(units > 0.5f)));
  }
}

// Appends with 1/16 headroom instead of std::vector's doubling: lists are most of a shard's
// memory (on average 3% slack instead of 25–50%; 1/8 left a 1M-document shard at 40.03 bytes per
// vector), and a list that grew by one entry should not double. Each entry is copied ~16 times
// over a list's growth, a few seconds of a 1M-document build.
template <typename T>
void AppendWithHeadroom(std::vector<T>& v, const T* data, size_t n) {
  if (v.size() + n > v.capacity()) v.reserve(v.size() + n + (v.size() + n) / 16 + 8);
  v.insert(v.end(), data, data + n);
}

}  // namespace

int ProbedGroups(int nprobe) { return std::max(8, nprobe / 2); }

int MarginLevelCap(int64_t query_tokens) {
  return static_cast<int>(std::min<int64_t>(255, 65535 / std::max<int64_t>(query_tokens, 1)));
}

int DefaultNprobe(int64_t num_centroids) {
  const auto fifth_root =
      static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(num_centroids)) / 5.0));
  const int by_root = static_cast<int>(std::max<int64_t>(16, (fifth_root + 7) / 8 * 8));
  return GetCentroidSizing() == CentroidSizing::kListLength ? std::min(by_root, kMaxDefaultNprobe)
                                                            : by_root;
}

int DefaultNumCandidates(int64_t k, int64_t vectors) {
  const auto v = static_cast<double>(std::max<int64_t>(vectors, 0));
  const double per_hit = std::clamp(10.0 * std::sqrt(v / 262144.0), 10.0, 40.0) *
                         std::max(1.0, std::sqrt(v / 33554432.0));
  return static_cast<int>(std::ceil(per_hit * static_cast<double>(std::max<int64_t>(k, 10))));
}

std::string SerializeDocumentCodes(const DocumentCodes& codes) {
  std::string out;
  const uint32_t n = static_cast<uint32_t>(codes.centroids.size());
  out.reserve(4 + n * 4 + codes.codes.size());
  out.append(reinterpret_cast<const char*>(&n), 4);
  out.append(reinterpret_cast<const char*>(codes.centroids.data()), n * 4);
  out.append(codes.codes);
  return out;
}

absl::StatusOr<DocumentCodesView> ViewDocumentCodes(absl::string_view bytes, int64_t code_bytes,
                                                    int64_t num_centroids) {
  uint32_t n = 0;
  if (bytes.size() < 4) {
    return absl::DataLossError(
        absl::StrCat("document codes: ", bytes.size(), " bytes, shorter than their 4-byte header"));
  }
  std::memcpy(&n, bytes.data(), 4);
  const uint64_t want = 4 + static_cast<uint64_t>(n) * (4 + static_cast<uint64_t>(code_bytes));
  if (bytes.size() != want) {
    return absl::DataLossError(absl::StrCat("document codes: ", bytes.size(), " bytes for ", n,
                                            " vectors of ", code_bytes, " code bytes, expected ",
                                            want));
  }
  DocumentCodesView view;
  view.size = n;
  view.centroids = bytes.data() + 4;
  view.codes = reinterpret_cast<const uint8_t*>(bytes.data()) + 4 + n * size_t{4};
  for (uint32_t v = 0; v < n; ++v) {
    const uint32_t id = view.centroid(v);
    if (id >= num_centroids) {
      return absl::DataLossError(absl::StrCat("document codes: vector ", v, " has centroid ", id,
                                              ", expected < ", num_centroids));
    }
  }
  return view;
}

absl::StatusOr<DocumentCodes> ParseDocumentCodes(absl::string_view bytes, int64_t code_bytes,
                                                 int64_t num_centroids) {
  TESSERA_ASSIGN_OR_RETURN(const DocumentCodesView view,
                           ViewDocumentCodes(bytes, code_bytes, num_centroids));
  DocumentCodes codes;
  codes.centroids.resize(view.size);
  if (view.size == 0) return codes;  // memcpy may not take the null data() of an empty vector
  std::memcpy(codes.centroids.data(), view.centroids, view.size * sizeof(uint32_t));
  codes.codes.assign(reinterpret_cast<const char*>(view.codes), view.size * code_bytes);
  return codes;
}

CentroidIndex::CentroidIndex(std::shared_ptr<const CentroidCodebook> codebook, int scan_nbits)
    : codebook_(std::move(codebook)),
      code_bytes_(codebook_->codec().code_bytes()),
      scan_codec_(scan_nbits < codebook_->codec().nbits()
                      ? codebook_->codec().Coarsened(std::max(scan_nbits, 1))
                      : codebook_->codec()),
      scan_code_bytes_(scan_codec_.code_bytes()),
      lists_(codebook_->num_centroids()) {}

DocumentCodes CentroidIndex::Encode(FloatMatrixView vectors) const {
  DocumentCodes codes;
  codes.centroids.resize(vectors.rows);
  codes.codes.resize(vectors.rows * code_bytes_);
  codebook_->Encode(vectors, codes.centroids.data(),
                    reinterpret_cast<uint8_t*>(codes.codes.data()));
  return codes;
}

std::vector<DocumentCodes> CentroidIndex::Encode(
    absl::Span<const FloatMatrixView> documents) const {
  int64_t rows = 0;
  for (const FloatMatrixView& document : documents) rows += document.rows;
  const int64_t dim = codebook_->dim();
  std::vector<float> all(rows * dim);
  int64_t at = 0;
  for (const FloatMatrixView& document : documents) {
    std::copy_n(document.data, document.rows * dim, &all[at * dim]);
    at += document.rows;
  }
  std::vector<uint32_t> ids(rows);
  std::vector<uint8_t> codes(rows * code_bytes_);
  codebook_->Encode(FloatMatrixView{all.data(), rows, dim}, ids.data(), codes.data());
  std::vector<DocumentCodes> out(documents.size());
  at = 0;
  for (size_t i = 0; i < documents.size(); ++i) {
    const int64_t n = documents[i].rows;
    out[i].centroids.assign(ids.begin() + at, ids.begin() + at + n);
    out[i].codes.assign(reinterpret_cast<const char*>(&codes[at * code_bytes_]), n * code_bytes_);
    at += n;
  }
  return out;
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
  // Not a comparison of code sizes: at dim ≤ 2 both codes are one byte.
  const bool coarsen = scan_codec_.nbits() != codebook_->codec().nbits();
  std::vector<uint8_t> scan_code(scan_code_bytes_);
  const std::vector<uint8_t> empty_block(ScanBlockBytes(scan_code_bytes_), 0);
  for (int64_t v = 0; v < n; ++v) {
    List& list = lists_[codes.centroids[v]];
    const int64_t entry = static_cast<int64_t>(list.ordinals.size());
    if (entry % kScanBlockEntries == 0) {
      AppendWithHeadroom(list.blocks, empty_block.data(), empty_block.size());
    }
    const uint8_t* listed = code + v * code_bytes_;
    if (coarsen) {
      codebook_->codec().CoarsenCode(listed, scan_codec_.nbits(), scan_code.data());
      listed = scan_code.data();
    }
    PutBlockedCode(listed, scan_code_bytes_, entry, list.blocks.data());
    AppendWithHeadroom(list.ordinals, &ordinal, 1);
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
  std::vector<uint8_t> code(scan_code_bytes_);
  for (List& list : lists_) {
    // In place: entry `kept` ≤ e, so a code is read before its slot is overwritten.
    size_t kept = 0;
    for (size_t e = 0; e < list.ordinals.size(); ++e) {
      const uint32_t ordinal = renumber[list.ordinals[e]];
      if (ordinal == std::numeric_limits<uint32_t>::max()) continue;
      list.ordinals[kept] = ordinal;
      GetBlockedCode(list.blocks.data(), scan_code_bytes_, e, code.data());
      PutBlockedCode(code.data(), scan_code_bytes_, kept, list.blocks.data());
      ++kept;
    }
    const size_t blocks = (kept + kScanBlockEntries - 1) / kScanBlockEntries;
    list.ordinals.resize(kept);
    list.blocks.resize(blocks * ScanBlockBytes(scan_code_bytes_));
    // The tail of the last block keeps no stale codes (a scan reads them, never uses them).
    for (size_t e = kept; e < blocks * kScanBlockEntries; ++e) {
      std::fill(code.begin(), code.end(), 0);
      PutBlockedCode(code.data(), scan_code_bytes_, e, list.blocks.data());
    }
    list.ordinals.shrink_to_fit();
    list.blocks.shrink_to_fit();
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

void CentroidIndex::SelectProbes(const float* query, const float* centroid_scores,
                                 const std::vector<std::pair<float, uint32_t>>* near, int nprobe,
                                 TokenScan* out) const {
  const int64_t C = codebook_->num_centroids();
  // The nprobe best centroids of this token (ties: lower id), through a bounded heap whose front
  // is the worst kept: most centroids fail the one comparison with it. Centroids come in id
  // order, so an equal score never displaces a kept one.
  auto better = [](const std::pair<float, uint32_t>& a, const std::pair<float, uint32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  std::vector<std::pair<float, uint32_t>> ranked;
  ranked.reserve(nprobe + 1);
  auto offer = [&](float score, uint32_t c) {
    if (static_cast<int>(ranked.size()) == nprobe && !better({score, c}, ranked.front())) return;
    ranked.emplace_back(score, c);
    std::push_heap(ranked.begin(), ranked.end(), better);
    if (static_cast<int>(ranked.size()) > nprobe) {
      std::pop_heap(ranked.begin(), ranked.end(), better);
      ranked.pop_back();
    }
  };
  if (near != nullptr) {
    for (const auto& [score, c] : *near) offer(score, c);
  } else {
    for (int64_t c = 0; c < C; ++c) offer(centroid_scores[c], static_cast<uint32_t>(c));
  }
  // Fewer when the probed groups hold fewer than nprobe centroids.
  nprobe = static_cast<int>(ranked.size());
  std::sort(ranked.begin(), ranked.end(), better);
  out->missing = ranked[nprobe - 1].first;

  std::vector<float> lut(scan_codec_.nibbles() * 16);
  scan_codec_.BuildLookupTable(query, lut.data());
  ScanTables& tables = out->tables;
  QuantizeScanTables(lut.data(), scan_codec_.nibbles(), &tables);
  // The largest sum the tables give: each nibble's highest level.
  int64_t top_levels = 0;
  for (int64_t n = 0; n < scan_codec_.nibbles(); ++n) {
    top_levels += *std::max_element(&tables.levels[n * 16], &tables.levels[n * 16] + 16);
  }
  out->reach =
      ranked[0].first + tables.bias + tables.step * static_cast<float>(top_levels) - out->missing;
  out->probes.clear();
  int64_t levels = 0;
  for (int p = 0; p < nprobe; ++p) {
    const List& list = lists_[ranked[p].second];
    if (list.ordinals.empty()) continue;
    out->probes.push_back(Probe{&list, ranked[p].first + tables.bias, levels});
    levels += static_cast<int64_t>(list.blocks.size()) / ScanBlockBytes(scan_code_bytes_) *
              kScanBlockEntries;
  }
  // Every entry is written by the scan: no zero fill.
  out->levels.reset(new uint8_t[levels]);
}

void CentroidIndex::ScanProbes(const MarginScale& scale, TokenScan* token) const {
  const float inverse_unit = 1.0f / scale.unit;
  const float ratio = token->tables.step * inverse_unit;
  const std::vector<Probe>& probes = token->probes;
  std::vector<uint16_t>& sums = ThreadScanSums();
  for (size_t p = 0; p < probes.size(); ++p) {
    const List& list = *probes[p].list;
    if (p + 1 < probes.size()) {  // the next list's first bytes, while this one is scanned
      const std::vector<uint8_t>& next = probes[p + 1].list->blocks;
      PrefetchScan(next.data(),
                   std::min<int64_t>(static_cast<int64_t>(next.size()), kScanPrefetchBytes / 2));
    }
    const int64_t blocks =
        static_cast<int64_t>(list.blocks.size()) / ScanBlockBytes(scan_code_bytes_);
    if (static_cast<int64_t>(sums.size()) < blocks * kScanBlockEntries) {
      sums.resize(blocks * kScanBlockEntries);
    }
    ScanBlocks(list.blocks.data(), blocks, scan_code_bytes_, token->tables, sums.data());
    MarginLevels(sums.data(), blocks * kScanBlockEntries,
                 (probes[p].offset - token->missing) * inverse_unit + 0.5f, ratio,
                 static_cast<float>(scale.cap), &token->levels[probes[p].levels]);
  }
}

bool CentroidIndex::BetterOrdinal(const std::pair<uint32_t, float>& a,
                                  const std::pair<uint32_t, float>& b) const {
  return a.second != b.second ? a.second > b.second : ordinal_doc_[a.first] < ordinal_doc_[b.first];
}

CentroidIndex::MarginScale CentroidIndex::QueryMarginScale(absl::Span<const TokenScan> tokens) {
  float reach = 0.0f;
  for (const TokenScan& token : tokens) reach = std::max(reach, token.reach);
  MarginScale scale;
  scale.cap = MarginLevelCap(static_cast<int64_t>(tokens.size()));
  // No token can score above its estimate (reach ≤ 0) or the tables overflowed: any unit gives
  // the same (empty or unranked) result.
  const float unit = reach / static_cast<float>(scale.cap);
  scale.unit = unit > 0.0f && std::isfinite(unit) ? unit : 1.0f;
  return scale;
}

void CentroidIndex::ScoreTile(absl::Span<const TokenScan> tokens, const MarginScale& scale,
                              uint32_t first_ordinal, uint32_t end_ordinal, float missing_sum,
                              int64_t keep, std::vector<std::pair<uint32_t, float>>* out) const {
  const size_t n = end_ordinal - first_ordinal;
  TileScratch& scratch = ThreadTileScratch();
  scratch.Begin(n);
  uint8_t* margin = scratch.margin.data();
  uint16_t* sum = scratch.sum.data();
  std::fill(sum, sum + n, 0);
  std::fill(margin, margin + n, 0);
  // One probed list's entries in this tile: [begin, end) of its ordinals.
  struct Run {
    const uint32_t* ordinals;
    const uint8_t* levels;
    uint32_t begin;
    uint32_t end;
  };
  std::vector<Run> runs;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const TokenScan& token = tokens[i];
    runs.clear();
    size_t entries = 0;
    for (const Probe& probe : token.probes) {
      // A list's ordinals ascend, so the tile's entries are one run of it, found here (the lines
      // the searches touch are the run's first and last, which the loop below reads next; finding
      // every tile's bounds per token up front measured no faster on the 1M-document shard, nor
      // did a per-list index of where each 16,384-ordinal tile starts, which needs no search).
      const uint32_t* ordinals = probe.list->ordinals.data();
      const uint32_t* list_end = ordinals + probe.list->ordinals.size();
      const auto begin = static_cast<uint32_t>(
          InterpolatedLowerBound(ordinals, list_end, first_ordinal) - ordinals);
      const auto end = static_cast<uint32_t>(
          InterpolatedLowerBound(ordinals + begin, list_end, end_ordinal) - ordinals);
      runs.push_back(Run{ordinals, &token.levels[probe.levels], begin, end});
      entries += end - begin;
    }
    uint8_t* tile_margin = margin - first_ordinal;
    for (const Run& run : runs) {
      // Locals, not members: the stores to `margin` (bytes) alias everything else in memory and
      // would force a reload per entry.
      const uint32_t* run_ordinals = run.ordinals;
      const uint8_t* run_levels = run.levels;
      const uint32_t run_end = run.end;
      for (uint32_t e = run.begin; e < run_end; ++e) {
        uint8_t* slot = tile_margin + run_ordinals[e];
        *slot = std::max(*slot, run_levels[e]);
      }
    }
    if (entries * static_cast<size_t>(kSparseFoldRatio) < n) {
      // A document's later entries of this token find its margin cleared and add 0.
      for (const Run& run : runs) {
        for (uint32_t e = run.begin; e < run.end; ++e) {
          const uint32_t o = run.ordinals[e] - first_ordinal;
          sum[o] = static_cast<uint16_t>(sum[o] + margin[o]);
          margin[o] = 0;
        }
      }
    } else {
      FoldToken(n, margin, sum);
    }
  }
  // The documents some token found above its estimate (a positive sum), live ones
  // only (dead ordinals were scored like live ones and are dropped here, once); with `keep` ≥ 0,
  // only the best `keep` of them, through a bounded heap whose front is the worst kept.
  auto better = [this](const std::pair<uint32_t, float>& a, const std::pair<uint32_t, float>& b) {
    mu_.AssertReaderHeld();
    return BetterOrdinal(a, b);
  };
  if (keep == 0) return;
  const size_t first_out = out->size();
  // Once `keep` are held, a document must beat the worst of them: a sum below the worst's cannot
  // (a document of the same sum still can, by its id), which rejects most documents with one
  // predictable comparison.
  uint16_t sum_cut = 1;
  for (size_t o = 0; o < n; ++o) {
    if (sum[o] < sum_cut || ordinal_dead_[first_ordinal + o]) continue;
    const std::pair<uint32_t, float> hit(static_cast<uint32_t>(first_ordinal + o),
                                         missing_sum + scale.unit * static_cast<float>(sum[o]));
    if (keep < 0) {
      out->push_back(hit);
      continue;
    }
    if (static_cast<int64_t>(out->size() - first_out) < keep) {
      out->push_back(hit);
    } else if (better(hit, (*out)[first_out])) {
      std::pop_heap(out->begin() + static_cast<ptrdiff_t>(first_out), out->end(), better);
      out->back() = hit;
    } else {
      continue;
    }
    std::push_heap(out->begin() + static_cast<ptrdiff_t>(first_out), out->end(), better);
    if (static_cast<int64_t>(out->size() - first_out) == keep) {
      sum_cut = std::max<uint16_t>(1, sum[(*out)[first_out].first - first_ordinal]);
    }
  }
}

namespace {

// out[i · out_stride + c] = in[c · in_stride + i] for i < rows and c < cols: a centroid-major block
// of scores (QuerySimilarity::Compute's) as token-major rows, 4 × 4 at a time with SSE, where a
// value at a time reads one cache line per centroid for each query row.
void TransposeBlock(const float* in, int64_t in_stride, int64_t rows, int64_t cols, float* out,
                    int64_t out_stride) {
  int64_t c = 0;
#if defined(__SSE2__)
  for (; c + 4 <= cols; c += 4) {
    const float* column = in + c * in_stride;
    int64_t i = 0;
    for (; i + 4 <= rows; i += 4) {
      __m128 r0 = _mm_loadu_ps(column + i);
      __m128 r1 = _mm_loadu_ps(column + in_stride + i);
      __m128 r2 = _mm_loadu_ps(column + 2 * in_stride + i);
      __m128 r3 = _mm_loadu_ps(column + 3 * in_stride + i);
      _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
      _mm_storeu_ps(out + i * out_stride + c, r0);
      _mm_storeu_ps(out + (i + 1) * out_stride + c, r1);
      _mm_storeu_ps(out + (i + 2) * out_stride + c, r2);
      _mm_storeu_ps(out + (i + 3) * out_stride + c, r3);
    }
    for (; i < rows; ++i) {
      for (int64_t k = 0; k < 4; ++k) out[i * out_stride + c + k] = column[k * in_stride + i];
    }
  }
#endif
  for (; c < cols; ++c) {
    for (int64_t i = 0; i < rows; ++i) out[i * out_stride + c] = in[c * in_stride + i];
  }
}

}  // namespace

CentroidScoreTable ScoreEveryCentroid(std::shared_ptr<const CentroidCodebook> codebook,
                                      FloatMatrixView queries, ThreadPool* pool) {
  const int64_t C = codebook->num_centroids();
  const int64_t nq = queries.rows;
  const int64_t dim = queries.cols;
  const QuerySimilarity similarity(queries);
  const int64_t stride = similarity.stride();
  // Every score is written below: no zero fill of the nq × C floats.
  std::unique_ptr<float[]> scores(new float[nq * C]);
  // A share per thread, rounded up to 64 centroids, and at most kCentroidChunk.
  const int64_t threads = pool != nullptr ? pool->num_threads() : 1;
  const int64_t chunk_size = std::min(kCentroidChunk, ((C + threads - 1) / threads + 63) / 64 * 64);
  const int64_t chunks = (C + chunk_size - 1) / chunk_size;
  auto score_chunks = [&](int64_t begin, int64_t end) {
    std::vector<float> block(chunk_size * stride);
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      const int64_t first = chunk * chunk_size;
      const int64_t n = std::min(chunk_size, C - first);
      similarity.Compute(codebook->centroids() + first * dim, n, block.data());
      TransposeBlock(block.data(), stride, nq, n, &scores[first], C);
    }
  };
  if (pool != nullptr) {
    pool->ParallelFor(chunks, 1, score_chunks);
  } else {
    score_chunks(0, chunks);
  }
  return CentroidScoreTable{std::move(codebook), nq, std::move(scores)};
}

std::unique_ptr<float[]> ScoreUsedCentroids(const CentroidCodebook& codebook,
                                            const QuerySimilarity& similarity,
                                            absl::Span<const DocumentCodesView> documents,
                                            ThreadPool* pool) {
  const int64_t C = codebook.num_centroids();
  std::vector<uint8_t> used(C, 0);
  for (const DocumentCodesView& document : documents) {
    for (int64_t t = 0; t < document.size; ++t) used[document.centroid(t)] = 1;
  }
  std::vector<uint32_t> ids;
  for (int64_t c = 0; c < C; ++c) {
    if (used[c]) ids.push_back(static_cast<uint32_t>(c));
  }
  const bool whole = static_cast<int64_t>(ids.size()) * 8 >= C * 7;
  const int64_t count = whole ? C : static_cast<int64_t>(ids.size());
  // Only the rows scored are read: no zero fill of the C × stride floats.
  std::unique_ptr<float[]> table(new float[C * similarity.stride()]);
  // Parts of at least kMinRowsPerPart rows, a few per thread so that uneven threads even out.
  constexpr int64_t kMinRowsPerPart = 256;
  const int64_t parts = std::max<int64_t>(
      1, std::min<int64_t>(count / kMinRowsPerPart, int64_t{4} * pool->num_threads()));
  pool->ParallelFor(parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t part = begin; part < end; ++part) {
      const int64_t first = count * part / parts;
      const int64_t n = count * (part + 1) / parts - first;
      if (whole) {
        similarity.Compute(codebook.centroids() + first * codebook.dim(), n,
                           &table[first * similarity.stride()]);
      } else {
        similarity.ComputeRows(
            codebook.centroids(),
            absl::MakeConstSpan(ids).subspan(static_cast<size_t>(first), static_cast<size_t>(n)),
            table.get());
      }
    }
  });
  return table;
}

absl::StatusOr<std::vector<CentroidHit>> CentroidIndex::Search(
    FloatMatrixView queries, const CentroidSearchOptions& options,
    const std::function<bool(uint64_t)>* accept, ThreadPool* pool) const {
  if (queries.rows < 1 || queries.rows > kMaxCentroidQueryTokens ||
      queries.cols != codebook_->dim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("centroid search: query of ", queries.rows, " tokens × ", queries.cols,
                     ", expected 1 to ", kMaxCentroidQueryTokens, " tokens × ", codebook_->dim()));
  }
  const int64_t C = codebook_->num_centroids();
  const int nprobe = static_cast<int>(
      std::clamp<int64_t>(options.nprobe > 0 ? options.nprobe : DefaultNprobe(C), 1, C));
  const int64_t nq = queries.rows;
  const int64_t dim = queries.cols;
  const int64_t keep = std::max<int64_t>(options.num_documents, 0);

  // A codebook with groups (CentroidCodebook::has_groups) is scored only at the centroids of each
  // token's ProbedGroups(nprobe) nearest groups, unless the caller wants the table and the
  // codebook is at most kMaxKeptTableCentroids. Otherwise: query × centroid scores,
  // centroids split over the pool, stored token-major (row i: token i's score of every centroid)
  // so that each token's selection reads one contiguous row instead of one cache line per
  // centroid.
  const bool keep_table = options.centroid_scores != nullptr && nq * C <= kMaxKeptCentroidScores &&
                          (!codebook_->has_groups() || C <= kMaxKeptTableCentroids);
  const bool full_table = !codebook_->has_groups() || keep_table;
  std::unique_ptr<float[]> token_scores;
  if (full_table) token_scores = ScoreEveryCentroid(codebook_, queries, pool).scores;
  // With groups, each token's candidates: the centroids of its nearest groups, all tokens at once.
  std::vector<std::vector<std::pair<float, uint32_t>>> near;
  if (codebook_->has_groups()) {
    codebook_->ScoreNearCentroids(queries, ProbedGroups(nprobe), token_scores.get(), pool, &near);
  }

  ReaderMutexLock lock(&mu_);
  // Ordinal tiles: the accumulation over documents runs one tile at a time, so that its scratch
  // stays in cache instead of taking one random access to a shard-sized array per vector.
  const uint32_t ordinals = static_cast<uint32_t>(ordinal_doc_.size());
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  const uint32_t tile_size = static_cast<uint32_t>(
      std::clamp<int64_t>((ordinals + threads - 1) / threads, kMinTileOrdinals, kMaxTileOrdinals));
  std::vector<uint32_t> tile_starts;
  for (uint32_t start = 0; start < ordinals; start += tile_size) tile_starts.push_back(start);
  tile_starts.push_back(ordinals);
  const size_t tiles = tile_starts.size() - 1;

  // Per token, its probes and tables; then, in the unit those give the query, its lists' margins.
  std::vector<TokenScan> tokens(nq);
  auto for_each_token = [&](const std::function<void(int64_t)>& work) {
    auto range = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) work(i);
    };
    if (pool != nullptr) {
      pool->ParallelFor(nq, 1, range);
    } else {
      range(0, nq);
    }
  };
  for_each_token([&](int64_t i) {
    mu_.AssertReaderHeld();
    SelectProbes(queries.data + i * dim, near.empty() ? &token_scores[i * C] : nullptr,
                 near.empty() ? nullptr : &near[i], nprobe, &tokens[i]);
  });
  const MarginScale scale = QueryMarginScale(tokens);
  for_each_token([&](int64_t i) {
    mu_.AssertReaderHeld();
    ScanProbes(scale, &tokens[i]);
  });

  // Per tile: (ordinal, approximate MaxSim) of its live documents found above an estimate, cut to
  // the best `keep` when no filter has to see them first.
  float missing_sum = 0.0f;
  for (const TokenScan& token : tokens) missing_sum += token.missing;
  std::vector<std::vector<std::pair<uint32_t, float>>> tile_hits(tiles);
  auto score_tiles = [&](int64_t begin, int64_t end) {
    mu_.AssertReaderHeld();
    for (int64_t t = begin; t < end; ++t) {
      ScoreTile(tokens, scale, tile_starts[t], tile_starts[t + 1], missing_sum,
                accept == nullptr ? keep : -1, &tile_hits[t]);
    }
  };
  if (pool != nullptr) {
    pool->ParallelFor(static_cast<int64_t>(tiles), 1, score_tiles);
  } else {
    score_tiles(0, static_cast<int64_t>(tiles));
  }

  std::vector<CentroidHit> hits;
  for (const auto& tile : tile_hits) {
    for (const auto& [ordinal, score] : tile) {
      const uint64_t doc = ordinal_doc_[ordinal];
      if (accept != nullptr && !(*accept)(doc)) continue;
      hits.push_back(CentroidHit{doc, score});
    }
  }
  const size_t kept = std::min<size_t>(hits.size(), keep);
  auto better = [](const CentroidHit& a, const CentroidHit& b) {
    return a.score != b.score ? a.score > b.score : a.doc < b.doc;
  };
  std::partial_sort(hits.begin(), hits.begin() + kept, hits.end(), better);
  hits.resize(kept);
  if (keep_table) {
    *options.centroid_scores = CentroidScoreTable{codebook_, nq, std::move(token_scores)};
  }
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
                                  list.blocks.capacity() + sizeof(List));
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
