// Tests of CandidateIndex against a brute-force inner-product reference: exactness of Flat,
// filters that keep k hits, the auto switch, tombstones and compaction, deferred training,
// snapshots and their corruption, argument checks and concurrent use.
#include "index/candidate/candidate_index.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/common/thread_pool.h"

#if defined(__SANITIZE_THREAD__)
// OpenBLAS's worker threads synchronise in ways TSan cannot see; see tsan_suppressions.txt here.
extern "C" const char* __tsan_default_suppressions() { return "race:libopenblas.so.0\n"; }
#endif

namespace tessera::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<float> RandomUnitRows(int64_t rows, int64_t dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    float norm = 0;
    for (int64_t c = 0; c < dim; ++c) {
      v[r * dim + c] = normal(rng);
      norm += v[r * dim + c] * v[r * dim + c];
    }
    for (int64_t c = 0; c < dim; ++c) v[r * dim + c] /= std::sqrt(norm);
  }
  return v;
}

FloatMatrixView View(const std::vector<float>& v, int64_t dim) {
  return {v.data(), static_cast<int64_t>(v.size()) / dim, dim};
}

// What the index should hold: doc → its candidate vectors.
class Corpus {
 public:
  explicit Corpus(int64_t dim) : dim_(dim) {}

  absl::Status Add(CandidateIndex& index, uint64_t doc, std::vector<float> vectors) {
    absl::Status status = index.Add(doc, View(vectors, dim_));
    if (status.ok()) docs_[doc] = std::move(vectors);
    return status;
  }
  absl::Status Remove(CandidateIndex& index, uint64_t doc) {
    docs_.erase(doc);
    return index.Remove(doc);
  }
  // Adds docs [begin, end) with `rows` random vectors each, seeded by the doc id.
  void AddRange(CandidateIndex& index, uint64_t begin, uint64_t end, int rows) {
    for (uint64_t doc = begin; doc < end; ++doc) {
      ASSERT_TRUE(Add(index, doc, RandomUnitRows(rows, dim_, doc)).ok()) << "doc " << doc;
    }
  }
  // Adds docs first..first+count-1 with 1..max_slots random vectors each.
  void AddRandom(CandidateIndex& index, uint64_t first, int count, int max_slots, uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (int i = 0; i < count; ++i) {
      const int slots = 1 + static_cast<int>(rng() % max_slots);
      ASSERT_TRUE(Add(index, first + i, RandomUnitRows(slots, dim_, rng())).ok());
    }
  }

  // Exact top-k by inner product (double accumulation), ties by ascending (doc, slot).
  std::vector<std::vector<CandidateHit>> Search(
      const std::vector<float>& queries, int k,
      const std::function<bool(uint64_t)>& accept = nullptr) const {
    std::vector<std::vector<CandidateHit>> result;
    for (size_t q = 0; q * dim_ < queries.size(); ++q) {
      struct Scored {
        double similarity;
        uint64_t doc;
        int64_t slot;
      };
      std::vector<Scored> all;
      for (const auto& [doc, vectors] : docs_) {
        if (accept && !accept(doc)) continue;
        for (size_t s = 0; s * dim_ < vectors.size(); ++s) {
          double ip = 0;
          for (int64_t c = 0; c < dim_; ++c)
            ip += double{queries[q * dim_ + c]} * vectors[s * dim_ + c];
          all.push_back({ip, doc, static_cast<int64_t>(s)});
        }
      }
      std::sort(all.begin(), all.end(), [](const Scored& a, const Scored& b) {
        if (a.similarity != b.similarity) return a.similarity > b.similarity;
        return a.doc != b.doc ? a.doc < b.doc : a.slot < b.slot;
      });
      std::vector<CandidateHit> row;
      for (size_t i = 0; i < all.size() && i < static_cast<size_t>(k); ++i) {
        row.push_back({all[i].doc, static_cast<float>(all[i].similarity)});
      }
      result.push_back(std::move(row));
    }
    return result;
  }

  int64_t vectors() const {
    int64_t n = 0;
    for (const auto& [doc, v] : docs_) n += static_cast<int64_t>(v.size()) / dim_;
    return n;
  }
  std::vector<uint64_t> documents() const {
    std::vector<uint64_t> docs;
    for (const auto& [doc, v] : docs_) docs.push_back(doc);
    return docs;
  }
  const std::vector<float>& vectors_of(uint64_t doc) const { return docs_.at(doc); }

 private:
  int64_t dim_;
  std::map<uint64_t, std::vector<float>> docs_;
};

void ExpectSameHits(const std::vector<std::vector<CandidateHit>>& actual,
                    const std::vector<std::vector<CandidateHit>>& expected, float tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t q = 0; q < actual.size(); ++q) {
    ASSERT_EQ(actual[q].size(), expected[q].size()) << "row " << q;
    for (size_t i = 0; i < actual[q].size(); ++i) {
      EXPECT_EQ(actual[q][i].doc, expected[q][i].doc) << "row " << q << " hit " << i;
      EXPECT_NEAR(actual[q][i].similarity, expected[q][i].similarity, tolerance)
          << "row " << q << " hit " << i;
    }
  }
}

// Fraction of the reference hits (doc and similarity) found in `actual`.
double Recall(const std::vector<std::vector<CandidateHit>>& actual,
              const std::vector<std::vector<CandidateHit>>& expected) {
  int64_t found = 0, total = 0;
  for (size_t q = 0; q < expected.size(); ++q) {
    for (const CandidateHit& want : expected[q]) {
      ++total;
      for (const CandidateHit& got : actual[q]) {
        if (got.doc == want.doc && std::fabs(got.similarity - want.similarity) < 1e-4f) {
          ++found;
          break;
        }
      }
    }
  }
  return total == 0 ? 1.0 : static_cast<double>(found) / total;
}

void ExpectWellFormed(const std::vector<std::vector<CandidateHit>>& hits, int k,
                      const std::function<bool(uint64_t)>& accept) {
  for (const auto& row : hits) {
    EXPECT_LE(row.size(), static_cast<size_t>(k));
    for (size_t i = 0; i < row.size(); ++i) {
      if (accept) {
        EXPECT_TRUE(accept(row[i].doc)) << "doc " << row[i].doc;
      }
      if (i > 0) {
        EXPECT_GE(row[i - 1].similarity, row[i].similarity);
      }
    }
  }
}

std::unique_ptr<CandidateIndex> MakeIndex(const CandidateIndexOptions& options) {
  auto index = CandidateIndex::Create(options);
  EXPECT_TRUE(index.ok()) << index.status();
  return index.ok() ? std::move(index).value() : nullptr;
}

CandidateIndexOptions Options(int64_t dim, std::string factory) {
  CandidateIndexOptions options;
  options.dim = dim;
  options.factory = std::move(factory);
  return options;
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/candidate_" + std::to_string(::getpid()) + "_" + name;
}

std::vector<char> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void WriteFile(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class FlatExactness : public ::testing::TestWithParam<std::string> {};

TEST_P(FlatExactness, MatchesBruteForce) {
  constexpr int64_t kDim = 24;
  auto index = MakeIndex(Options(kDim, GetParam()));
  ASSERT_NE(index, nullptr);
  Corpus corpus(kDim);
  // Sparse, large document ids exercise the (doc << 16) | slot encoding.
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) {
    const uint64_t doc = (rng() % (uint64_t{1} << 40)) * 3 + (i % 3);
    ASSERT_TRUE(corpus.Add(*index, doc, RandomUnitRows(1 + i % 6, kDim, rng())).ok());
  }
  EXPECT_EQ(index->Stats().description, "IDMap2,Flat");
  const auto queries = RandomUnitRows(8, kDim, 99);
  for (int k : {1, 25, 100000}) {
    auto hits = index->Search(View(queries, kDim), k, nullptr, nullptr);
    ASSERT_TRUE(hits.ok()) << hits.status();
    ExpectSameHits(*hits, corpus.Search(queries, k), 1e-5f);
  }
  std::function<bool(uint64_t)> accept = [](uint64_t doc) { return doc % 3 == 0; };
  auto filtered = index->Search(View(queries, kDim), 25, &accept, nullptr);
  ASSERT_TRUE(filtered.ok()) << filtered.status();
  ExpectSameHits(*filtered, corpus.Search(queries, 25, accept), 1e-5f);
  // One query row takes the same path as many.
  auto single = index->Search({queries.data(), 1, kDim}, 25, &accept, nullptr);
  ASSERT_TRUE(single.ok());
  ExpectSameHits(*single, {corpus.Search(queries, 25, accept)[0]}, 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(CandidateIndex, FlatExactness, ::testing::Values("Flat", "auto"));

TEST(CandidateIndex, TiesAreOrderedByAscendingDocument) {
  auto index = MakeIndex(Options(8, "Flat"));
  const auto v = RandomUnitRows(1, 8, 3);
  for (uint64_t doc : {9, 3, 7, 5}) ASSERT_TRUE(index->Add(doc, View(v, 8)).ok());
  auto hits = index->Search(View(v, 8), 10, nullptr, nullptr);
  ASSERT_TRUE(hits.ok());
  ASSERT_EQ(hits->size(), 1u);
  std::vector<uint64_t> docs;
  for (const auto& hit : (*hits)[0]) docs.push_back(hit.doc);
  EXPECT_THAT(docs, ElementsAre(3, 5, 7, 9));
}

// Flat searches scan blocks of vectors (2 MiB each: 65,536 vectors of dim 8) split over a pool:
// with three blocks over three threads, hits from every part, ties across parts (one vector
// stored by a first and a last document), the gathered blocks of a filter and the positions that
// removals shift must all equal brute force.
TEST(CandidateIndex, ExactScanSplitOverAPoolMatchesBruteForce) {
  constexpr int64_t kDim = 8;
  ThreadPool pool(3);
  auto index = MakeIndex(Options(kDim, "Flat"));
  Corpus corpus(kDim);
  const auto shared = RandomUnitRows(1, kDim, 5);
  ASSERT_TRUE(corpus.Add(*index, 40'000, shared).ok());
  corpus.AddRandom(*index, 1, 36'000, 8, 6);
  ASSERT_TRUE(corpus.Add(*index, 7, shared).ok());  // replaces doc 7: now stored last
  ASSERT_GT(corpus.vectors(), 2 * 65'536);
  for (uint64_t doc : {100, 20'000, 35'999}) ASSERT_TRUE(corpus.Remove(*index, doc).ok());
  auto queries = RandomUnitRows(6, kDim, 8);
  queries.insert(queries.end(), shared.begin(), shared.end());
  for (int k : {1, 50, 700}) {
    auto hits = index->Search(View(queries, kDim), k, nullptr, &pool);
    ASSERT_TRUE(hits.ok()) << hits.status();
    ExpectSameHits(*hits, corpus.Search(queries, k), 1e-5f);
    EXPECT_EQ(hits->back()[0].doc, 7u);  // the tie goes to the lower document
    EXPECT_EQ(hits->back()[std::min(k, 2) - 1].doc, k == 1 ? 7u : 40'000u);
  }
  std::function<bool(uint64_t)> accept = [](uint64_t doc) { return doc % 5 != 0; };
  auto filtered = index->Search(View(queries, kDim), 50, &accept, &pool);
  ASSERT_TRUE(filtered.ok()) << filtered.status();
  ExpectSameHits(*filtered, corpus.Search(queries, 50, accept), 1e-5f);
  // Without a pool, the same hits.
  auto alone = index->Search(View(queries, kDim), 50, &accept, nullptr);
  ASSERT_TRUE(alone.ok());
  ExpectSameHits(*alone, *filtered, 0.0f);
}

// A filter matching 1% of 2,000 documents still yields k hits per row, for every index kind.
class SelectiveFilter : public ::testing::TestWithParam<std::string> {};

TEST_P(SelectiveFilter, ReturnsKAcceptedHits) {
  constexpr int64_t kDim = 32;
  CandidateIndexOptions options = Options(kDim, GetParam());
  options.auto_exact_limit = 500;
  options.min_training_vectors = 1000;
  auto index = MakeIndex(options);
  ASSERT_NE(index, nullptr);
  Corpus corpus(kDim);
  for (uint64_t doc = 0; doc < 2000; ++doc) {
    ASSERT_TRUE(corpus.Add(*index, doc, RandomUnitRows(2, kDim, 1000 + doc)).ok());
  }
  const bool exact = GetParam() == "Flat";
  // IVF on random data (no cluster structure) probing 8 of 16 lists finds fewer true neighbours;
  // what this test holds every kind to is the count and the filter.
  const double min_recall = exact ? 1.0 : GetParam() == "IVF16,Flat" ? 0.6 : 0.9;
  if (GetParam() == "auto") {
    EXPECT_EQ(index->Stats().description, "IDMap2,HNSW32");
  }

  std::function<bool(uint64_t)> accept = [](uint64_t doc) { return doc % 100 == 7; };  // 40 vectors
  const auto queries = RandomUnitRows(16, kDim, 5);
  for (int k : {10, 40, 64}) {
    auto hits = index->Search(View(queries, kDim), k, &accept, nullptr);
    ASSERT_TRUE(hits.ok()) << hits.status();
    ExpectWellFormed(*hits, k, accept);
    for (const auto& row : *hits) EXPECT_EQ(row.size(), std::min<size_t>(k, 40)) << "k " << k;
    const auto expected = corpus.Search(queries, k, accept);
    if (exact) {
      ExpectSameHits(*hits, expected, 1e-5f);
    } else {
      EXPECT_GE(Recall(*hits, expected), min_recall) << "k " << k;
    }
  }
  // Unfiltered recall of the approximate kinds.
  auto hits = index->Search(View(queries, kDim), 20, nullptr, nullptr);
  ASSERT_TRUE(hits.ok());
  ExpectWellFormed(*hits, 20, nullptr);
  EXPECT_GE(Recall(*hits, corpus.Search(queries, 20)), min_recall);
}

INSTANTIATE_TEST_SUITE_P(CandidateIndex, SelectiveFilter,
                         ::testing::Values("Flat", "HNSW32", "auto", "IVF16,Flat"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), ',', '_');
                           return name;
                         });

TEST(CandidateIndex, AutoSwitchesToHnswWhenCrossingTheLimit) {
  constexpr int64_t kDim = 16;
  CandidateIndexOptions options = Options(kDim, "auto");
  options.auto_exact_limit = 500;
  auto index = MakeIndex(options);
  Corpus corpus(kDim);
  ASSERT_NO_FATAL_FAILURE(corpus.AddRange(*index, 0, 124, 4));
  EXPECT_EQ(index->Stats().description, "IDMap2,Flat");
  EXPECT_EQ(index->Stats().vectors, 496);
  ASSERT_TRUE(corpus.Add(*index, 124, RandomUnitRows(4, kDim, 124)).ok());
  CandidateIndexStats stats = index->Stats();
  EXPECT_EQ(stats.description, "IDMap2,HNSW32");
  EXPECT_EQ(stats.vectors, 500);
  EXPECT_EQ(stats.documents, 125);
  EXPECT_TRUE(stats.trained);
  ASSERT_NO_FATAL_FAILURE(corpus.AddRange(*index, 125, 1000, 4));
  const auto queries = RandomUnitRows(16, kDim, 77);
  auto hits = index->Search(View(queries, kDim), 20, nullptr, nullptr);
  ASSERT_TRUE(hits.ok());
  ExpectWellFormed(*hits, 20, nullptr);
  EXPECT_GE(Recall(*hits, corpus.Search(queries, 20)), 0.9);
  EXPECT_EQ(index->Documents(), corpus.documents());
}

TEST(CandidateIndex, FlatRemoveAndReAdd) {
  constexpr int64_t kDim = 16;
  auto index = MakeIndex(Options(kDim, "Flat"));
  Corpus corpus(kDim);
  corpus.AddRandom(*index, 0, 200, 5, 11);
  for (uint64_t doc = 0; doc < 200; doc += 4) ASSERT_TRUE(corpus.Remove(*index, doc).ok());
  ASSERT_TRUE(index->Remove(123456).ok());  // unknown: a no-op
  EXPECT_EQ(index->Documents(), corpus.documents());
  EXPECT_EQ(index->Stats().documents, 150);
  EXPECT_EQ(index->Stats().vectors, corpus.vectors());
  const auto queries = RandomUnitRows(6, kDim, 12);
  auto hits = index->Search(View(queries, kDim), 30, nullptr, nullptr);
  ASSERT_TRUE(hits.ok());
  ExpectSameHits(*hits, corpus.Search(queries, 30), 1e-5f);

  // Re-adding replaces: fewer vectors than before, and a removed document comes back.
  ASSERT_TRUE(corpus.Add(*index, 1, RandomUnitRows(1, kDim, 13)).ok());
  ASSERT_TRUE(corpus.Add(*index, 4, RandomUnitRows(3, kDim, 14)).ok());
  EXPECT_EQ(index->Stats().vectors, corpus.vectors());
  hits = index->Search(View(queries, kDim), 30, nullptr, nullptr);
  ASSERT_TRUE(hits.ok());
  ExpectSameHits(*hits, corpus.Search(queries, 30), 1e-5f);
  auto self = index->Search(View(corpus.vectors_of(4), kDim), 1, nullptr, nullptr);
  ASSERT_TRUE(self.ok());
  for (const auto& row : *self) {
    ASSERT_EQ(row.size(), 1u);
    EXPECT_EQ(row[0].doc, 4u);
    EXPECT_NEAR(row[0].similarity, 1.0f, 1e-5f);
  }
}

// Every kind removes by tombstones and compacts past 20% of them; the exact kinds (Flat, and auto
// below its limit) must equal brute force throughout, and survive a snapshot with tombstones.
class TombstonesAndCompaction : public ::testing::TestWithParam<std::string> {};

TEST_P(TombstonesAndCompaction, RemovedVectorsAreNeverFound) {
  constexpr int64_t kDim = 16;
  const bool exact = GetParam() != "HNSW32";
  auto index = MakeIndex(Options(kDim, GetParam()));
  Corpus corpus(kDim);
  ASSERT_NO_FATAL_FAILURE(corpus.AddRange(*index, 0, 500, 4));
  const std::string path = TempPath("compaction");
  ASSERT_TRUE(index->Save(path, 0).ok());
  const size_t full_size = ReadFile(path).size();

  // 10% removed: tombstones only.
  std::vector<uint64_t> removed;
  for (uint64_t doc = 0; doc < 500; doc += 10) {
    ASSERT_TRUE(corpus.Remove(*index, doc).ok());
    removed.push_back(doc);
  }
  EXPECT_EQ(index->Stats().vectors, corpus.vectors());
  EXPECT_EQ(index->Documents(), corpus.documents());
  auto removed_doc = [&](uint64_t doc) {
    return std::find(removed.begin(), removed.end(), doc) != removed.end();
  };
  // Querying with a removed document's own vectors never finds it.
  std::vector<float> removed_queries;
  for (uint64_t doc : {10, 20, 30}) {
    const auto v = RandomUnitRows(4, kDim, doc);
    removed_queries.insert(removed_queries.end(), v.begin(), v.end());
  }
  auto hits = index->Search(View(removed_queries, kDim), 50, nullptr, nullptr);
  ASSERT_TRUE(hits.ok());
  for (const auto& row : *hits) {
    EXPECT_EQ(row.size(), 50u);
    for (const auto& hit : row) EXPECT_FALSE(removed_doc(hit.doc)) << hit.doc;
  }
  if (exact) {
    ExpectSameHits(*hits, corpus.Search(removed_queries, 50), 1e-5f);
    // A snapshot with tombstones loads with them.
    ASSERT_TRUE(index->Save(path, 7).ok());
    auto loaded = CandidateIndex::Load(path, Options(kDim, GetParam()));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    auto reloaded_hits = loaded->first->Search(View(removed_queries, kDim), 50, nullptr, nullptr);
    ASSERT_TRUE(reloaded_hits.ok());
    ExpectSameHits(*reloaded_hits, *hits, 0.0f);
  }

  // Re-adding removed documents (same ids, new vectors) makes them live again.
  for (uint64_t doc : {10, 20, 30}) {
    ASSERT_TRUE(corpus.Add(*index, doc, RandomUnitRows(3, kDim, 5000 + doc)).ok());
    removed.erase(std::find(removed.begin(), removed.end(), doc));
  }
  // Re-adding a live document tombstones its old vectors.
  ASSERT_TRUE(corpus.Add(*index, 11, RandomUnitRows(2, kDim, 5011)).ok());
  for (uint64_t doc : {10, 11, 20, 30}) {
    auto self = index->Search(View(corpus.vectors_of(doc), kDim), 1, nullptr, nullptr);
    ASSERT_TRUE(self.ok());
    for (const auto& row : *self) {
      ASSERT_EQ(row.size(), 1u);
      EXPECT_EQ(row[0].doc, doc);
      EXPECT_NEAR(row[0].similarity, 1.0f, 1e-5f);
    }
  }
  auto old_11 = index->Search(View(RandomUnitRows(4, kDim, 11), kDim), 5, nullptr, nullptr);
  ASSERT_TRUE(old_11.ok());
  for (const auto& row : *old_11) {
    for (const auto& hit : row) EXPECT_FALSE(hit.doc == 11 && hit.similarity > 0.999f);
  }

  // Past 20% tombstoned the index is rebuilt without them: the snapshot shrinks.
  for (uint64_t doc = 1; doc < 500; doc += 5) {
    if (doc == 11) continue;
    ASSERT_TRUE(corpus.Remove(*index, doc).ok());
    removed.push_back(doc);
  }
  ASSERT_TRUE(index->Save(path, 0).ok());
  EXPECT_LT(ReadFile(path).size(), full_size * 9 / 10);
  EXPECT_EQ(index->Stats().vectors, corpus.vectors());
  EXPECT_EQ(index->Stats().description, exact ? "IDMap2,Flat" : "IDMap2,HNSW32");
  const auto queries = RandomUnitRows(16, kDim, 42);
  hits = index->Search(View(queries, kDim), 20, nullptr, nullptr);
  ASSERT_TRUE(hits.ok());
  if (exact) {
    ExpectSameHits(*hits, corpus.Search(queries, 20), 1e-5f);
  } else {
    EXPECT_GE(Recall(*hits, corpus.Search(queries, 20)), 0.9);
  }
  for (const auto& row : *hits) {
    EXPECT_EQ(row.size(), 20u);
    for (const auto& hit : row) EXPECT_FALSE(removed_doc(hit.doc)) << hit.doc;
  }
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(CandidateIndex, TombstonesAndCompaction,
                         ::testing::Values("HNSW32", "Flat", "auto"));

// An IVF-PQ index's memory is its codes and ids, not the raw floats of a Flat index (the figure
// scripts/bench-scale reports per vector).
TEST(CandidateIndex, IvfPqMemoryCountsCodesNotFloats) {
  constexpr int64_t kDim = 16;
  CandidateIndexOptions options = Options(kDim, "IVF16,PQ4np");
  options.min_training_vectors = 1000;
  auto index = MakeIndex(options);
  Corpus corpus(kDim);
  ASSERT_NO_FATAL_FAILURE(corpus.AddRange(*index, 0, 400, 4));
  const CandidateIndexStats stats = index->Stats();
  ASSERT_TRUE(stats.trained);
  // Raw floats alone would be 64 bytes per vector; codes are 4, ids 8 each (the list's, the
  // direct map's, IDMap2's both ways), the 16 coarse centroids 1 KiB in all.
  EXPECT_GT(stats.memory_bytes, stats.vectors * 4);
  EXPECT_LT(stats.memory_bytes, stats.vectors * kDim * static_cast<int64_t>(sizeof(float)));
}

TEST(CandidateIndex, TrainableFactorySearchesExactlyUntilTrained) {
  constexpr int64_t kDim = 16;
  CandidateIndexOptions options = Options(kDim, "IVF16,Flat");
  options.min_training_vectors = 1000;
  auto index = MakeIndex(options);
  Corpus corpus(kDim);
  ASSERT_NO_FATAL_FAILURE(corpus.AddRange(*index, 0, 100, 4));
  ASSERT_TRUE(corpus.Remove(*index, 50).ok());
  CandidateIndexStats stats = index->Stats();
  EXPECT_FALSE(stats.trained);
  EXPECT_EQ(stats.description, "IDMap2,IVF16,Flat");
  EXPECT_EQ(stats.vectors, 396);
  const auto queries = RandomUnitRows(8, kDim, 21);
  std::function<bool(uint64_t)> accept = [](uint64_t doc) { return doc % 7 == 0; };
  auto hits = index->Search(View(queries, kDim), 15, nullptr, nullptr);
  ASSERT_TRUE(hits.ok());
  ExpectSameHits(*hits, corpus.Search(queries, 15), 1e-5f);
  hits = index->Search(View(queries, kDim), 15, &accept, nullptr);
  ASSERT_TRUE(hits.ok());
  ExpectSameHits(*hits, corpus.Search(queries, 15, accept), 1e-5f);

  ASSERT_NO_FATAL_FAILURE(corpus.AddRange(*index, 100, 400, 4));
  stats = index->Stats();
  EXPECT_TRUE(stats.trained);
  EXPECT_EQ(stats.description, "IDMap2,IVF16,Flat");
  EXPECT_EQ(stats.vectors, corpus.vectors());
  hits = index->Search(View(queries, kDim), 15, nullptr, nullptr);
  ASSERT_TRUE(hits.ok());
  EXPECT_GE(Recall(*hits, corpus.Search(queries, 15)), 0.9);
  // Removal after training (tombstones) and a 1% filter.
  for (uint64_t doc = 0; doc < 400; doc += 3) ASSERT_TRUE(corpus.Remove(*index, doc).ok());
  std::function<bool(uint64_t)> rare = [](uint64_t doc) { return doc % 100 == 1; };
  hits = index->Search(View(queries, kDim), 10, &rare, nullptr);
  ASSERT_TRUE(hits.ok());
  ExpectWellFormed(*hits, 10, rare);
  // docs 1, 101, 201, 301 minus those removed (201) → 3 docs × 4 vectors
  for (const auto& row : *hits) EXPECT_EQ(row.size(), 10u);
  EXPECT_EQ(index->Documents(), corpus.documents());
}

TEST(CandidateIndex, NonSelectorFactoryFiltersExactly) {
  // IndexPQ rejects IDSelectors; filtered searches go through the exact path. (4-bit codes and
  // "np", no polysemous training, keep training quick.)
  constexpr int64_t kDim = 16;
  CandidateIndexOptions options = Options(kDim, "PQ4x4np");
  options.min_training_vectors = 400;
  auto index = MakeIndex(options);
  Corpus corpus(kDim);
  ASSERT_NO_FATAL_FAILURE(corpus.AddRange(*index, 0, 200, 3));
  EXPECT_TRUE(index->Stats().trained);
  ASSERT_TRUE(corpus.Remove(*index, 42).ok());
  std::function<bool(uint64_t)> accept = [](uint64_t doc) { return doc % 50 == 42 || doc == 7; };
  const auto queries = RandomUnitRows(4, kDim, 8);
  auto hits = index->Search(View(queries, kDim), 8, &accept, nullptr);
  ASSERT_TRUE(hits.ok()) << hits.status();
  ExpectWellFormed(*hits, 8, accept);
  for (const auto& row : *hits) {
    EXPECT_EQ(row.size(), 8u);  // docs 7, 92, 142, 192 → 12 vectors
    for (const auto& hit : row) EXPECT_NE(hit.doc, 42u);
  }
  EXPECT_EQ(index->Stats().vectors, corpus.vectors());
}

void ExpectRoundTrip(CandidateIndex& index, const CandidateIndexOptions& options,
                     const std::string& name) {
  const std::string path = TempPath(name);
  ASSERT_TRUE(index.Save(path, 0xC0FFEE1234).ok());
  auto loaded = CandidateIndex::Load(path, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->second, 0xC0FFEE1234u);
  CandidateIndex& copy = *loaded->first;
  EXPECT_EQ(copy.Documents(), index.Documents());
  EXPECT_EQ(copy.Stats().vectors, index.Stats().vectors);
  EXPECT_EQ(copy.Stats().documents, index.Stats().documents);
  EXPECT_EQ(copy.Stats().description, index.Stats().description);
  EXPECT_EQ(copy.Stats().trained, index.Stats().trained);
  const auto queries = RandomUnitRows(8, options.dim, 31);
  const std::function<bool(uint64_t)> accept = [](uint64_t doc) { return doc % 5 != 0; };
  for (const auto* filter : {static_cast<const std::function<bool(uint64_t)>*>(nullptr), &accept}) {
    auto a = index.Search(View(queries, options.dim), 12, filter, nullptr);
    auto b = copy.Search(View(queries, options.dim), 12, filter, nullptr);
    ASSERT_TRUE(a.ok() && b.ok());
    ExpectSameHits(*b, *a, 0.0f);
  }
  // The loaded index keeps working, tombstones included.
  const uint64_t first = index.Documents().front();
  ASSERT_TRUE(copy.Remove(first).ok());
  auto after = copy.Search(View(queries, options.dim), 12, nullptr, nullptr);
  ASSERT_TRUE(after.ok());
  for (const auto& row : *after) {
    for (const auto& hit : row) EXPECT_NE(hit.doc, first);
  }
  std::remove(path.c_str());
}

TEST(CandidateIndex, SaveLoadRoundTrip) {
  constexpr int64_t kDim = 16;
  {
    auto index = MakeIndex(Options(kDim, "auto"));
    Corpus corpus(kDim);
    corpus.AddRandom(*index, 0, 100, 4, 1);
    ExpectRoundTrip(*index, Options(kDim, "auto"), "flat");
  }
  {
    auto index = MakeIndex(Options(kDim, "HNSW32"));
    Corpus corpus(kDim);
    corpus.AddRandom(*index, 0, 300, 4, 2);
    ASSERT_TRUE(corpus.Remove(*index, 3).ok());
    ASSERT_TRUE(corpus.Remove(*index, 4).ok());
    ASSERT_TRUE(corpus.Add(*index, 3, RandomUnitRows(2, kDim, 3)).ok());
    ExpectRoundTrip(*index, Options(kDim, "HNSW32"), "hnsw");
  }
  CandidateIndexOptions ivf = Options(kDim, "IVF16,Flat");
  ivf.min_training_vectors = 600;
  {
    auto index = MakeIndex(ivf);
    Corpus corpus(kDim);
    ASSERT_NO_FATAL_FAILURE(corpus.AddRange(*index, 0, 100, 4));
    ASSERT_FALSE(index->Stats().trained);
    ExpectRoundTrip(*index, ivf, "ivf_untrained");
    ASSERT_NO_FATAL_FAILURE(corpus.AddRange(*index, 100, 200, 4));
    ASSERT_TRUE(index->Stats().trained);
    ASSERT_TRUE(corpus.Remove(*index, 150).ok());
    ExpectRoundTrip(*index, ivf, "ivf_trained");
  }
}

TEST(CandidateIndex, LoadRejectsCorruptSnapshots) {
  constexpr int64_t kDim = 8;
  const CandidateIndexOptions options = Options(kDim, "auto");
  auto index = MakeIndex(options);
  Corpus corpus(kDim);
  corpus.AddRandom(*index, 0, 40, 3, 5);
  const std::string path = TempPath("corrupt_src");
  ASSERT_TRUE(index->Save(path, 7).ok());
  const std::vector<char> good = ReadFile(path);
  ASSERT_GT(good.size(), 100u);
  const std::string bad = TempPath("corrupt");

  for (size_t size :
       {size_t{0}, size_t{10}, size_t{39}, size_t{40}, good.size() / 2, good.size() - 1}) {
    WriteFile(bad, std::vector<char>(good.begin(), good.begin() + size));
    EXPECT_EQ(CandidateIndex::Load(bad, options).status().code(), absl::StatusCode::kDataLoss)
        << "truncated to " << size;
  }
  for (size_t offset : {size_t{0}, size_t{5}, size_t{9}, size_t{20}, size_t{30}, size_t{37},
                        size_t{45}, good.size() / 2, good.size() - 1}) {
    std::vector<char> flipped = good;
    flipped[offset] ^= 0x10;
    WriteFile(bad, flipped);
    EXPECT_EQ(CandidateIndex::Load(bad, options).status().code(), absl::StatusCode::kDataLoss)
        << "flipped byte " << offset;
  }
  std::vector<char> longer = good;
  longer.push_back(0);
  WriteFile(bad, longer);
  EXPECT_EQ(CandidateIndex::Load(bad, options).status().code(), absl::StatusCode::kDataLoss);

  EXPECT_EQ(CandidateIndex::Load(path, Options(kDim + 1, "auto")).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(CandidateIndex::Load(path, Options(kDim, "HNSW32")).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(CandidateIndex::Load(TempPath("missing"), options).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(index->Save(TempPath("no_such_dir/x"), 0).code(), absl::StatusCode::kNotFound);
  auto ok = CandidateIndex::Load(path, options);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->second, 7u);
  std::remove(path.c_str());
  std::remove(bad.c_str());
}

TEST(CandidateIndex, RejectsBadArguments) {
  auto bogus = CandidateIndex::Create(Options(8, "Bogus12"));
  EXPECT_EQ(bogus.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bogus.status().message(), HasSubstr("Bogus12"));
  EXPECT_EQ(CandidateIndex::Create(Options(8, "IDMap2,Flat")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CandidateIndex::Create(Options(8, "LSH")).status().code(),  // L2 only
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CandidateIndex::Create(Options(0, "auto")).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto index = MakeIndex(Options(8, "auto"));
  const auto rows = RandomUnitRows(2, 8, 1);
  // Empty index, zero query rows.
  auto empty = index->Search(View(rows, 8), 5, nullptr, nullptr);
  ASSERT_TRUE(empty.ok());
  EXPECT_THAT(*empty, ElementsAre(::testing::IsEmpty(), ::testing::IsEmpty()));
  auto none = index->Search({rows.data(), 0, 8}, 5, nullptr, nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  EXPECT_EQ(index->Add(1, {rows.data(), 2, 7}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(index->Add(1, {rows.data(), 0, 8}).code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> too_many((kMaxCandidateVectorsPerDocument + 1) * 8, 0.1f);
  EXPECT_EQ(index->Add(1, View(too_many, 8)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(index->Add(uint64_t{1} << 47, View(rows, 8)).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> nan = rows;
  nan[3] = std::nanf("");
  EXPECT_EQ(index->Add(1, View(nan, 8)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(index->Stats().vectors, 0);

  ASSERT_TRUE(index->Add((uint64_t{1} << 47) - 1, View(rows, 8)).ok());
  auto hits = index->Search(View(rows, 8), 1, nullptr, nullptr);
  ASSERT_TRUE(hits.ok());
  EXPECT_EQ((*hits)[0][0].doc, (uint64_t{1} << 47) - 1);
  EXPECT_EQ(index->Search({rows.data(), 2, 4}, 5, nullptr, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(index->Search(View(rows, 8), 0, nullptr, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CandidateIndex, ConcurrentSearchesWhileWriting) {
  constexpr int64_t kDim = 16;
  CandidateIndexOptions options = Options(kDim, "auto");
  options.auto_exact_limit = 600;  // crossed while the searchers run
  auto index = MakeIndex(options);
  for (uint64_t doc = 0; doc < 50; ++doc) {
    ASSERT_TRUE(index->Add(doc, View(RandomUnitRows(4, kDim, doc), kDim)).ok());
  }
  std::atomic<bool> done{false};
  std::atomic<int64_t> searches{0};
  std::vector<std::thread> searchers;
  for (int t = 0; t < 4; ++t) {
    searchers.emplace_back([&, t] {
      // 24 rows take FAISS's BLAS path in exact searches.
      const int rows = t == 0 ? 24 : 4;
      const auto queries = RandomUnitRows(rows, kDim, 100 + t);
      std::function<bool(uint64_t)> even = [](uint64_t doc) { return doc % 2 == 0; };
      for (int i = 0; !done.load() || i < 5; ++i) {
        const auto* filter = i % 2 == 0 ? &even : nullptr;
        auto hits = index->Search(View(queries, kDim), 10, filter, nullptr);
        ASSERT_TRUE(hits.ok()) << hits.status();
        ASSERT_EQ(hits->size(), static_cast<size_t>(rows));
        for (const auto& row : *hits) EXPECT_EQ(row.size(), 10u);
        ExpectWellFormed(*hits, 10, filter ? *filter : nullptr);
        index->Documents();
        index->Stats();
        searches.fetch_add(1);
      }
    });
  }
  std::thread writer([&] {
    for (uint64_t doc = 50; doc < 300; ++doc) {
      ASSERT_TRUE(index->Add(doc, View(RandomUnitRows(4, kDim, doc), kDim)).ok());
      if (doc % 3 == 0) {
        ASSERT_TRUE(index->Remove(doc - 30).ok());
      }
      if (doc % 7 == 0) {
        ASSERT_TRUE(index->Add(doc - 1, View(RandomUnitRows(2, kDim, doc * 7), kDim)).ok());
      }
    }
    done.store(true);
  });
  writer.join();
  for (auto& t : searchers) t.join();
  EXPECT_GT(searches.load(), 20);
  EXPECT_EQ(index->Stats().description, "IDMap2,HNSW32");
  const std::vector<uint64_t> docs = index->Documents();
  EXPECT_EQ(index->Stats().documents, static_cast<int64_t>(docs.size()));
  for (uint64_t doc = 50; doc < 300; ++doc) {
    if (doc % 3 == 0) {
      EXPECT_FALSE(std::binary_search(docs.begin(), docs.end(), doc - 30)) << doc - 30;
    }
  }
}

// The engine sets OpenBLAS's threads explicitly at open (EngineOptions::blas_threads) instead of
// a static initialiser pinning them to one when the first index was built; 0 leaves them.
TEST(ConfigureFaissForServing, SetsOpenBlasThreadsAndZeroLeavesThem) {
  ConfigureFaissForServing(2);
  EXPECT_EQ(BlasThreads(), 2);
  ConfigureFaissForServing(1);
  EXPECT_EQ(BlasThreads(), 1);
  ConfigureFaissForServing(0);
  EXPECT_EQ(BlasThreads(), 1);
}

}  // namespace
}  // namespace tessera::internal
