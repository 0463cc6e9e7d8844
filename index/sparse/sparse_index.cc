// The sparse inverted index and its Block-Max MaxScore search (sparse_index.h).
#include "index/sparse/sparse_index.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tessera/sparse.h"
#include "tessera/status_macros.h"

namespace tessera::internal {
namespace {

constexpr uint32_t kEnd = std::numeric_limits<uint32_t>::max();
// Ordinals run below kEnd; one more is the limit of documents between compactions.
constexpr uint64_t kMaxOrdinals = kEnd - 1;
constexpr char kMagic[8] = {'T', 'S', 'P', 'A', 'R', 'S', 'E', '1'};

// Bounds and partial sums are rounded differently from the final score (other summation orders),
// by far less than this relative margin; a candidate is dropped only when even its bound inflated
// by it stays below the k-th best score.
constexpr double kBoundSlack = 1e-9;

// One term's contribution, the same arithmetic in every path so that the skipping search and the
// exhaustive one produce the same doubles.
struct Scorer {
  bool bm25 = true;
  double k1 = 1.2;
  double b = 0.75;
  double average_length = 1.0;

  double operator()(double scale, float weight, float length) const {
    const double w = weight;
    if (!bm25) return scale * w;
    const double norm = k1 * ((1.0 - b) + b * (static_cast<double>(length) / average_length));
    return scale * (w / (w + norm));
  }
};

// (score desc, iid asc).
struct Ranked {
  double score;
  uint64_t iid;
};
bool Better(const Ranked& a, const Ranked& b) {
  if (a.score != b.score) return a.score > b.score;
  return a.iid < b.iid;
}

// A top-k heap whose front is the worst kept hit.
class TopK {
 public:
  explicit TopK(int64_t k) : k_(static_cast<size_t>(k)) {}
  void Offer(Ranked hit) {
    if (heap_.size() < k_) {
      heap_.push_back(hit);
      std::push_heap(heap_.begin(), heap_.end(), Better);
    } else if (Better(hit, heap_.front())) {
      std::pop_heap(heap_.begin(), heap_.end(), Better);
      heap_.back() = hit;
      std::push_heap(heap_.begin(), heap_.end(), Better);
    }
  }
  // The score a hit must reach to enter (−∞ until k are kept).
  double Threshold() const {
    return heap_.size() < k_ ? -std::numeric_limits<double>::infinity() : heap_.front().score;
  }
  std::vector<SparseHit> Take() {
    std::sort(heap_.begin(), heap_.end(), Better);
    std::vector<SparseHit> hits;
    hits.reserve(heap_.size());
    for (const Ranked& r : heap_) hits.push_back({r.iid, static_cast<float>(r.score)});
    return hits;
  }

 private:
  size_t k_;
  std::vector<Ranked> heap_;
};

bool Prunable(double bound, double threshold) { return bound * (1.0 + kBoundSlack) < threshold; }

template <typename T>
void Put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

}  // namespace

struct SparseIndex::PreparedQuery {
  struct Term {
    const PostingList* list = nullptr;
    size_t position = 0;  // in the query
    double scale = 0;     // q_t · IDF(t), or q_t
    double bound = 0;     // the largest contribution any of its postings can make
  };
  std::vector<Term> terms;  // only those with postings here and a weight > 0
  size_t num_positions = 0;
  Scorer scorer;

  double BlockBound(const Term& term, const Block& block) const {
    return scorer(term.scale, block.max_weight, block.min_length);
  }
};

// Iterates one posting list; NextGeq skips whole blocks by their last ordinal, ShallowTo finds the
// block a target would fall in without moving the cursor (for its bound).
class SparseIndex::Cursor {
 public:
  explicit Cursor(const PostingList* list)
      : list_(list),
        docs_(list->docs.data()),
        weights_(list->weights.data()),
        size_(list->docs.size()) {}

  uint32_t doc() const { return pos_ < size_ ? docs_[pos_] : kEnd; }
  float weight() const { return weights_[pos_]; }
  void Next() { ++pos_; }
  void NextGeq(uint32_t target) {
    if (pos_ >= size_ || docs_[pos_] >= target) return;
    size_t block = pos_ / kSparseBlockSize;
    const size_t num_blocks = list_->blocks.size();
    while (block < num_blocks && list_->blocks[block].last_doc < target) ++block;
    if (block == num_blocks) {
      pos_ = size_;
      return;
    }
    const size_t begin = std::max(pos_, block * kSparseBlockSize);
    const size_t end = std::min(size_, (block + 1) * kSparseBlockSize);
    pos_ = std::lower_bound(docs_ + begin, docs_ + end, target) - docs_;
  }
  // The block that holds `target` if the list has it (targets never decrease); null past the end.
  const Block* ShallowTo(uint32_t target) {
    const size_t num_blocks = list_->blocks.size();
    while (shallow_ < num_blocks && list_->blocks[shallow_].last_doc < target) ++shallow_;
    return shallow_ < num_blocks ? &list_->blocks[shallow_] : nullptr;
  }

 private:
  const PostingList* list_;
  const uint32_t* docs_;
  const float* weights_;
  size_t size_;
  size_t pos_ = 0;
  size_t shallow_ = 0;
};

absl::StatusOr<SparseIndex> SparseIndex::Create(const SparseIndexOptions& options) {
  TESSERA_RETURN_IF_ERROR(ValidateSparseScoring(options.scoring));
  if (options.max_terms < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse index: max_terms = ", options.max_terms, "; expected a value >= 1"));
  }
  return SparseIndex(options);
}

void SparseIndex::AppendPosting(PostingList* list, uint32_t doc, float weight, float length) {
  if (list->docs.size() % kSparseBlockSize == 0) {
    list->blocks.push_back({doc, weight, length});
  } else {
    Block& block = list->blocks.back();
    block.last_doc = doc;
    block.max_weight = std::max(block.max_weight, weight);
    block.min_length = std::min(block.min_length, length);
  }
  list->docs.push_back(doc);
  list->weights.push_back(weight);
}

absl::Status SparseIndex::Add(uint64_t iid, const SparseVectorView& vector,
                              std::optional<float> length) {
  TESSERA_RETURN_IF_ERROR(ValidateSparseVector(
      vector, absl::StrCat("document ", iid, " sparse vector"), options_.max_terms));
  if (length.has_value() && (!std::isfinite(*length) || *length < 0)) {
    return absl::InvalidArgumentError(absl::StrCat("document ", iid, " sparse length = ", *length,
                                                   "; expected a finite length >= 0"));
  }
  Remove(iid);
  if (documents_.size() >= kMaxOrdinals) Compact();
  if (documents_.size() >= kMaxOrdinals) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sparse index: ", num_live_, " documents; at most ", kMaxOrdinals, " are supported"));
  }
  float dl = 0.0f;
  if (length.has_value()) {
    dl = *length;
  } else {
    double sum = 0;
    for (float v : vector.values) sum += v;
    dl = static_cast<float>(sum);
  }
  const uint32_t ordinal = static_cast<uint32_t>(documents_.size());
  Document document{iid, dl, true, terms_.size(), 0};
  for (size_t i = 0; i < vector.indices.size(); ++i) {
    if (vector.values[i] == 0.0f) continue;
    PostingList& list = lists_[vector.indices[i]];
    AppendPosting(&list, ordinal, vector.values[i], dl);
    ++list.doc_freq;
    terms_.push_back(vector.indices[i]);
    ++num_postings_;
  }
  document.terms_end = terms_.size();
  documents_.push_back(document);
  live_length_.push_back(dl);
  ordinal_of_[iid] = ordinal;
  ++num_live_;
  total_length_ += dl;
  return absl::OkStatus();
}

bool SparseIndex::Remove(uint64_t iid) {
  const auto it = ordinal_of_.find(iid);
  if (it == ordinal_of_.end()) return false;
  Document& document = documents_[it->second];
  live_length_[it->second] = -1.0f;
  ordinal_of_.erase(it);
  document.live = false;
  for (uint64_t t = document.terms_begin; t < document.terms_end; ++t) {
    --lists_[terms_[t]].doc_freq;
  }
  --num_live_;
  total_length_ -= document.length;
  if (num_live_ == 0) total_length_ = 0;  // no rounding residue from the subtractions
  const int64_t dead = static_cast<int64_t>(documents_.size()) - num_live_;
  if (dead >= kSparseBlockSize && dead > num_live_) Compact();
  return true;
}

bool SparseIndex::Contains(uint64_t iid) const { return ordinal_of_.contains(iid); }

void SparseIndex::Compact() {
  std::vector<uint32_t> renumbered(documents_.size(), kEnd);
  std::vector<Document> documents;
  std::vector<uint32_t> terms;
  documents.reserve(num_live_);
  double total_length = 0;
  for (size_t ordinal = 0; ordinal < documents_.size(); ++ordinal) {
    const Document& old = documents_[ordinal];
    if (!old.live) continue;
    renumbered[ordinal] = static_cast<uint32_t>(documents.size());
    Document document = old;
    document.terms_begin = terms.size();
    terms.insert(terms.end(), terms_.begin() + old.terms_begin, terms_.begin() + old.terms_end);
    document.terms_end = terms.size();
    ordinal_of_[old.iid] = renumbered[ordinal];
    total_length += old.length;
    documents.push_back(document);
  }
  num_postings_ = 0;
  for (auto it = lists_.begin(); it != lists_.end();) {
    PostingList& list = it->second;
    PostingList compacted;
    compacted.doc_freq = list.doc_freq;
    for (size_t i = 0; i < list.docs.size(); ++i) {
      const uint32_t ordinal = renumbered[list.docs[i]];
      if (ordinal == kEnd) continue;
      AppendPosting(&compacted, ordinal, list.weights[i], documents[ordinal].length);
    }
    if (compacted.docs.empty()) {
      lists_.erase(it++);
      continue;
    }
    num_postings_ += static_cast<int64_t>(compacted.docs.size());
    list = std::move(compacted);
    ++it;
  }
  documents_ = std::move(documents);
  live_length_.resize(documents_.size());
  for (size_t ordinal = 0; ordinal < documents_.size(); ++ordinal) {
    live_length_[ordinal] = documents_[ordinal].length;
  }
  terms_ = std::move(terms);
  total_length_ = total_length;
}

SparseStatistics SparseIndex::Statistics(absl::Span<const uint32_t> terms) const {
  SparseStatistics statistics;
  statistics.num_documents = num_live_;
  statistics.total_length = total_length_;
  for (uint32_t term : terms) {
    const auto it = lists_.find(term);
    statistics.doc_freq[term] = it == lists_.end() ? 0 : it->second.doc_freq;
  }
  return statistics;
}

absl::StatusOr<SparseIndex::PreparedQuery> SparseIndex::PrepareQuery(
    const SparseSearchRequest& request) const {
  TESSERA_RETURN_IF_ERROR(ValidateSparseVector(request.query, "sparse query", options_.max_terms));
  if (request.k < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse search: k = ", request.k, "; expected k >= 1"));
  }
  const SparseStatistics* global = options_.scoring.idf ? request.statistics : nullptr;
  if (global != nullptr) {
    if (global->num_documents < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse statistics: num_documents = ", global->num_documents, "; expected a count >= 0"));
    }
    if (!std::isfinite(global->total_length) || global->total_length < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse statistics: total_length = ", global->total_length,
                       "; expected a finite length >= 0"));
    }
  }
  PreparedQuery query;
  query.num_positions = request.query.indices.size();
  query.scorer.bm25 = options_.scoring.idf;
  query.scorer.k1 = options_.scoring.k1;
  query.scorer.b = options_.scoring.b;
  if (options_.scoring.idf) {
    SparseStatistics own;
    own.num_documents = num_live_;
    own.total_length = total_length_;
    query.scorer.average_length = (global != nullptr ? *global : own).AverageLength();
  }
  const int64_t n = global != nullptr ? global->num_documents : num_live_;
  for (size_t i = 0; i < request.query.indices.size(); ++i) {
    const uint32_t term = request.query.indices[i];
    const float weight = request.query.values[i];
    double scale = weight;
    if (options_.scoring.idf) {
      int64_t df = 0;
      const auto it = lists_.find(term);
      if (global != nullptr) {
        const auto found = global->doc_freq.find(term);
        if (found == global->doc_freq.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat("sparse statistics: no doc_freq for query term ", term,
                           "; expected one for every term of the query"));
        }
        df = found->second;
        if (df < 0 || df > n) {
          return absl::InvalidArgumentError(absl::StrCat("sparse statistics: doc_freq[", term,
                                                         "] = ", df, "; expected 0 to ",
                                                         "num_documents = ", n));
        }
      } else if (it != lists_.end()) {
        df = it->second.doc_freq;
      }
      scale = weight * Bm25Idf(n, df);
    }
    if (!(scale > 0)) continue;
    const auto it = lists_.find(term);
    if (it == lists_.end() || it->second.docs.empty()) continue;
    PreparedQuery::Term t;
    t.list = &it->second;
    t.position = i;
    t.scale = scale;
    for (const Block& block : t.list->blocks)
      t.bound = std::max(t.bound, query.BlockBound(t, block));
    query.terms.push_back(t);
  }
  return query;
}

absl::StatusOr<SparseSearchResult> SparseIndex::Search(const SparseSearchRequest& request) const {
  TESSERA_ASSIGN_OR_RETURN(PreparedQuery query, PrepareQuery(request));
  SparseSearchResult result;
  for (const PreparedQuery::Term& term : query.terms) {
    result.postings_total += static_cast<int64_t>(term.list->docs.size());
  }
  if (request.exhaustive) {
    SearchExhaustive(request, query, &result);
  } else {
    SearchMaxScore(request, query, &result);
  }
  return result;
}

void SparseIndex::SearchExhaustive(const SparseSearchRequest& request, const PreparedQuery& query,
                                   SparseSearchResult* result) const {
  // Terms in query order, so that each document's sum runs in the order SearchMaxScore's does.
  std::vector<double> scores(documents_.size(), 0.0);
  std::vector<uint8_t> seen(documents_.size(), 0);
  std::vector<uint32_t> touched;
  for (const PreparedQuery::Term& term : query.terms) {
    const PostingList& list = *term.list;
    for (size_t i = 0; i < list.docs.size(); ++i) {
      const float length = live_length_[list.docs[i]];
      if (length < 0) continue;
      if (!seen[list.docs[i]]) {
        seen[list.docs[i]] = 1;
        touched.push_back(list.docs[i]);
      }
      scores[list.docs[i]] += query.scorer(term.scale, list.weights[i], length);
      ++result->postings_scored;
    }
  }
  TopK top(request.k);
  for (uint32_t ordinal : touched) {
    const Document& document = documents_[ordinal];
    if (request.filter && !request.filter(document.iid)) continue;
    ++result->documents_scored;
    top.Offer({scores[ordinal], document.iid});
  }
  result->hits = top.Take();
}

void SparseIndex::SearchMaxScore(const SparseSearchRequest& request, const PreparedQuery& query,
                                 SparseSearchResult* result) const {
  // Terms by ascending bound; bounds[i] = Σ bound of terms 0..i. Terms [0, essential) are
  // non-essential: together they cannot lift a document to the threshold.
  std::vector<const PreparedQuery::Term*> terms;
  for (const PreparedQuery::Term& term : query.terms) terms.push_back(&term);
  std::stable_sort(terms.begin(), terms.end(),
                   [](const auto* a, const auto* b) { return a->bound < b->bound; });
  const size_t q = terms.size();
  std::vector<Cursor> cursors;
  std::vector<double> bounds(q);
  cursors.reserve(q);
  for (size_t i = 0; i < q; ++i) {
    cursors.emplace_back(terms[i]->list);
    bounds[i] = terms[i]->bound + (i > 0 ? bounds[i - 1] : 0.0);
  }
  std::vector<double> contributions(query.num_positions, 0.0);
  std::vector<size_t> filled;
  TopK top(request.k);
  double threshold = top.Threshold();
  size_t essential = 0;

  uint32_t current = kEnd;
  for (size_t i = 0; i < q; ++i) current = std::min(current, cursors[i].doc());
  while (current != kEnd) {
    uint32_t next = kEnd;
    const float length = live_length_[current];
    const bool live = length >= 0;
    double partial = 0;
    for (size_t i = essential; i < q; ++i) {
      if (cursors[i].doc() == current) {
        if (live) {
          const double v = query.scorer(terms[i]->scale, cursors[i].weight(), length);
          contributions[terms[i]->position] = v;
          filled.push_back(terms[i]->position);
          partial += v;
          ++result->postings_scored;
        }
        cursors[i].Next();
      }
      next = std::min(next, cursors[i].doc());
    }
    bool keep = live;
    if (keep && essential > 0) {
      if (Prunable(partial + bounds[essential - 1], threshold)) {
        keep = false;
      } else {
        double bound = partial;
        for (size_t i = 0; i < essential; ++i) {
          const Block* block = cursors[i].ShallowTo(current);
          if (block != nullptr) bound += query.BlockBound(*terms[i], *block);
        }
        if (Prunable(bound, threshold)) {
          keep = false;
          ++result->blocks_skipped;
        }
      }
    }
    if (keep && request.filter && !request.filter(documents_[current].iid)) keep = false;
    for (size_t i = essential; keep && i-- > 0;) {
      if (Prunable(partial + bounds[i], threshold)) {
        keep = false;
        break;
      }
      cursors[i].NextGeq(current);
      if (cursors[i].doc() == current) {
        const double v = query.scorer(terms[i]->scale, cursors[i].weight(), length);
        contributions[terms[i]->position] = v;
        filled.push_back(terms[i]->position);
        partial += v;
        ++result->postings_scored;
      }
    }
    if (keep) {
      double score = 0;
      for (double v : contributions) score += v;
      ++result->documents_scored;
      top.Offer({score, documents_[current].iid});
      const double raised = top.Threshold();
      if (raised != threshold) {
        threshold = raised;
        while (essential < q && Prunable(bounds[essential], threshold)) ++essential;
      }
    }
    for (size_t position : filled) contributions[position] = 0.0;
    filled.clear();
    current = next;
  }
  result->hits = top.Take();
}

std::string SparseIndex::Serialize() const {
  std::string out(kMagic, sizeof(kMagic));
  Put<uint64_t>(&out, static_cast<uint64_t>(num_live_));
  std::vector<float> weights;
  for (size_t ordinal = 0; ordinal < documents_.size(); ++ordinal) {
    const Document& document = documents_[ordinal];
    if (!document.live) continue;
    const uint32_t n = static_cast<uint32_t>(document.terms_end - document.terms_begin);
    Put<uint64_t>(&out, document.iid);
    Put<float>(&out, document.length);
    Put<uint32_t>(&out, n);
    weights.clear();
    for (uint64_t t = document.terms_begin; t < document.terms_end; ++t) {
      Put<uint32_t>(&out, terms_[t]);
      const PostingList& list = lists_.at(terms_[t]);
      const size_t at =
          std::lower_bound(list.docs.begin(), list.docs.end(), ordinal) - list.docs.begin();
      weights.push_back(list.weights[at]);
    }
    out.append(reinterpret_cast<const char*>(weights.data()), weights.size() * sizeof(float));
  }
  return out;
}

absl::StatusOr<SparseIndex> SparseIndex::Deserialize(absl::string_view bytes,
                                                     const SparseIndexOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(SparseIndex index, Create(options));
  size_t at = 0;
  const auto take = [&](void* out, size_t size, absl::string_view what) -> absl::Status {
    if (bytes.size() - at < size) {
      return absl::DataLossError(absl::StrCat("sparse index snapshot: ", bytes.size(),
                                              " bytes end inside ", what, " at byte ", at));
    }
    std::memcpy(out, bytes.data() + at, size);
    at += size;
    return absl::OkStatus();
  };
  char magic[sizeof(kMagic)] = {};
  TESSERA_RETURN_IF_ERROR(take(magic, sizeof(magic), "the header"));
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("sparse index snapshot: bad header; expected 'TSPARSE1'");
  }
  uint64_t count = 0;
  TESSERA_RETURN_IF_ERROR(take(&count, sizeof(count), "the header"));
  std::vector<uint32_t> indices;
  std::vector<float> values;
  for (uint64_t d = 0; d < count; ++d) {
    uint64_t iid = 0;
    float length = 0;
    uint32_t n = 0;
    TESSERA_RETURN_IF_ERROR(take(&iid, sizeof(iid), "a document"));
    TESSERA_RETURN_IF_ERROR(take(&length, sizeof(length), "a document"));
    TESSERA_RETURN_IF_ERROR(take(&n, sizeof(n), "a document"));
    if ((bytes.size() - at) / (sizeof(uint32_t) + sizeof(float)) < n) {
      return absl::DataLossError(absl::StrCat("sparse index snapshot: document ", iid, " has ", n,
                                              " terms but ", bytes.size() - at, " bytes remain"));
    }
    indices.resize(n);
    values.resize(n);
    TESSERA_RETURN_IF_ERROR(take(indices.data(), n * sizeof(uint32_t), "a document"));
    TESSERA_RETURN_IF_ERROR(take(values.data(), n * sizeof(float), "a document"));
    if (index.Contains(iid)) {
      return absl::DataLossError(
          absl::StrCat("sparse index snapshot: document ", iid, " appears twice"));
    }
    TESSERA_RETURN_IF_ERROR(index.Add(iid, {indices, values}, length));
  }
  if (at != bytes.size()) {
    return absl::DataLossError(absl::StrCat("sparse index snapshot: ", bytes.size() - at,
                                            " bytes after the last document"));
  }
  return index;
}

}  // namespace tessera::internal
