#include "index/sparse/sparse_index.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/sparse.h"

namespace tessera::internal {
namespace {

using ::testing::HasSubstr;

// A corpus whose term frequencies follow Zipf's law, as text's do: term ranks drawn from
// P(r) ∝ 1 / (r + 1), mapped to scattered term ids.
class ZipfCorpus {
 public:
  ZipfCorpus(int vocabulary, uint64_t seed) : rng_(seed) {
    double sum = 0;
    for (int r = 0; r < vocabulary; ++r) {
      sum += 1.0 / (r + 1);
      cdf_.push_back(sum);
    }
    for (double& c : cdf_) c /= sum;
  }

  uint32_t Term() {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    const size_t rank = std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin();
    return static_cast<uint32_t>(std::min(rank, cdf_.size() - 1) * 2654435761u % 4000000007u);
  }

  // `terms` draws; repeated draws add up (integer term frequencies) or, with float weights, each
  // distinct term gets a random weight.
  SparseVector Vector(int terms, bool integer_weights) {
    std::map<uint32_t, float> counts;
    for (int i = 0; i < terms; ++i) counts[Term()] += 1.0f;
    SparseVector v;
    for (const auto& [term, count] : counts) {
      v.indices.push_back(term);
      v.values.push_back(
          integer_weights ? count : std::uniform_real_distribution<float>(0.01f, 3.0f)(rng_));
    }
    return v;
  }

  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
  std::vector<double> cdf_;
};

// The test's own BM25 over the live documents, written from Lucene's definition.
struct ReferenceBm25 {
  struct Doc {
    SparseVector vector;
    double length = 0;
  };
  std::map<uint64_t, Doc> docs;
  double k1 = 1.2;
  double b = 0.75;
  bool idf = true;

  void Add(uint64_t iid, const SparseVector& v, std::optional<float> length = std::nullopt) {
    double sum = 0;
    for (float w : v.values) sum += w;
    docs[iid] = {v, length.has_value() ? *length : static_cast<float>(sum)};
  }

  // The score of every live document with a term of the query.
  std::map<uint64_t, double> Scores(const SparseVector& query) const {
    const double n = static_cast<double>(docs.size());
    double total = 0;
    for (const auto& [iid, doc] : docs) total += doc.length;
    const double avgdl = docs.empty() || total == 0 ? 1.0 : total / n;
    std::map<uint64_t, double> scores;
    for (size_t q = 0; q < query.indices.size(); ++q) {
      double df = 0;
      for (const auto& [iid, doc] : docs) {
        for (size_t i = 0; i < doc.vector.indices.size(); ++i) {
          if (doc.vector.indices[i] == query.indices[q] && doc.vector.values[i] > 0) ++df;
        }
      }
      const double term_idf = std::log(1 + (n - df + 0.5) / (df + 0.5));
      for (const auto& [iid, doc] : docs) {
        for (size_t i = 0; i < doc.vector.indices.size(); ++i) {
          const double tf = doc.vector.values[i];
          if (doc.vector.indices[i] != query.indices[q] || tf == 0) continue;
          scores[iid] +=
              idf ? query.values[q] * term_idf * tf / (tf + k1 * (1 - b + b * doc.length / avgdl))
                  : query.values[q] * tf;
        }
      }
    }
    return scores;
  }
};

SparseIndex MakeIndex(bool idf = true, double k1 = 1.2, double b = 0.75) {
  SparseIndexOptions options;
  options.scoring.idf = idf;
  options.scoring.k1 = k1;
  options.scoring.b = b;
  auto index = SparseIndex::Create(options);
  EXPECT_TRUE(index.ok()) << index.status();
  return std::move(index).value();
}

std::vector<SparseHit> Search(const SparseIndex& index, const SparseVector& query, int64_t k,
                              bool exhaustive, std::function<bool(uint64_t)> filter = nullptr,
                              const SparseStatistics* statistics = nullptr,
                              SparseSearchResult* details = nullptr) {
  SparseSearchRequest request;
  request.query = query.view();
  request.k = k;
  request.exhaustive = exhaustive;
  request.filter = std::move(filter);
  request.statistics = statistics;
  auto result = index.Search(request);
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return {};
  if (details != nullptr) *details = *result;
  return result->hits;
}

void ExpectSameHits(const std::vector<SparseHit>& got, const std::vector<SparseHit>& want,
                    const std::string& context) {
  ASSERT_EQ(got.size(), want.size()) << context;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].iid, want[i].iid) << context << " rank " << i;
    EXPECT_NEAR(got[i].score, want[i].score, 1e-5 * std::abs(want[i].score))
        << context << " rank " << i;
  }
}

// The skipping search against the exhaustive one on randomized Zipfian corpora: BM25 (integer
// term frequencies, many exact ties) and dot product (float weights), with and without a filter,
// for several k, then again after removes and upserts (which also compact the lists).
TEST(SparseIndex, SkippingSearchEqualsExhaustive) {
  for (const bool idf : {true, false}) {
    ZipfCorpus corpus(3000, idf ? 7 : 8);
    SparseIndex index = MakeIndex(idf);
    std::vector<uint64_t> iids;
    for (int d = 0; d < 3000; ++d) {
      // Scattered iids, so that insertion order is not iid order (ties break by iid).
      const uint64_t iid = (static_cast<uint64_t>(d) * 0x9E3779B97F4A7C15ull) >> 20;
      const int length = std::uniform_int_distribution<int>(1, 60)(corpus.rng());
      ASSERT_TRUE(index.Add(iid, corpus.Vector(length, idf).view()).ok());
      iids.push_back(iid);
    }
    const auto check = [&](const std::string& phase) {
      for (int q = 0; q < 60; ++q) {
        const int terms = std::uniform_int_distribution<int>(1, 12)(corpus.rng());
        SparseVector query = corpus.Vector(terms, /*integer_weights=*/true);
        for (const int64_t k : {1, 10, 100}) {
          for (const bool filtered : {false, true}) {
            std::function<bool(uint64_t)> filter;
            if (filtered) filter = [](uint64_t iid) { return iid % 3 != 0; };
            const std::string context = phase + " idf=" + std::to_string(idf) +
                                        " q=" + std::to_string(q) + " k=" + std::to_string(k) +
                                        " filtered=" + std::to_string(filtered);
            SparseSearchResult skipping;
            const auto want = Search(index, query, k, /*exhaustive=*/true, filter);
            const auto got =
                Search(index, query, k, /*exhaustive=*/false, filter, nullptr, &skipping);
            ExpectSameHits(got, want, context);
            EXPECT_LE(skipping.postings_scored, skipping.postings_total) << context;
            if (filtered) {
              for (const SparseHit& hit : got) EXPECT_NE(hit.iid % 3, 0u) << context;
            }
          }
        }
      }
    };
    check("fresh");
    // Remove 40%, upsert another 20% with new vectors.
    std::shuffle(iids.begin(), iids.end(), corpus.rng());
    for (size_t i = 0; i < iids.size() * 4 / 10; ++i) ASSERT_TRUE(index.Remove(iids[i]));
    for (size_t i = iids.size() * 4 / 10; i < iids.size() * 6 / 10; ++i) {
      ASSERT_TRUE(index.Add(iids[i], corpus.Vector(30, idf).view()).ok());
    }
    EXPECT_EQ(index.num_documents(), 1800);
    check("after removes and upserts");
  }
}

// Scores equal a BM25 written from Lucene's formula in this test, for default and other k1/b,
// and the ranking equals the reference's up to ties.
TEST(SparseIndex, Bm25EqualsReference) {
  for (const auto& [k1, b] :
       std::vector<std::pair<double, double>>{{1.2, 0.75}, {0.9, 0.4}, {2.0, 1.0}, {1.5, 0.0}}) {
    ZipfCorpus corpus(500, 11);
    SparseIndex index = MakeIndex(/*idf=*/true, k1, b);
    ReferenceBm25 reference;
    reference.k1 = k1;
    reference.b = b;
    for (uint64_t iid = 0; iid < 400; ++iid) {
      SparseVector v = corpus.Vector(std::uniform_int_distribution<int>(1, 40)(corpus.rng()), true);
      // Every 10th document declares its own length.
      std::optional<float> length;
      if (iid % 10 == 0) length = 25.0f;
      ASSERT_TRUE(index.Add(iid, v.view(), length).ok());
      reference.Add(iid, v, length);
    }
    for (uint64_t iid = 0; iid < 400; iid += 7) {
      index.Remove(iid);
      reference.docs.erase(iid);
    }
    for (int q = 0; q < 30; ++q) {
      SparseVector query =
          corpus.Vector(std::uniform_int_distribution<int>(1, 8)(corpus.rng()), true);
      const std::map<uint64_t, double> want = reference.Scores(query);
      std::vector<double> best;
      for (const auto& [iid, score] : want) best.push_back(score);
      std::sort(best.rbegin(), best.rend());
      const auto hits = Search(index, query, 20, /*exhaustive=*/false);
      ASSERT_EQ(hits.size(), std::min<size_t>(20, want.size()));
      for (size_t i = 0; i < hits.size(); ++i) {
        ASSERT_EQ(want.count(hits[i].iid), 1u);
        EXPECT_NEAR(hits[i].score, want.at(hits[i].iid), 1e-5 * want.at(hits[i].iid));
        EXPECT_NEAR(hits[i].score, best[i], 1e-5 * best[i]) << "rank " << i;
      }
    }
  }
}

// A hand-computed BM25 value: N = 2, avgdl = 3, document 1 = {7: 2, 9: 1}, document 2 = {9: 3}.
TEST(SparseIndex, Bm25HandComputed) {
  SparseIndex index = MakeIndex();
  ASSERT_TRUE(index.Add(1, SparseVector{{7, 9}, {2, 1}}.view()).ok());
  ASSERT_TRUE(index.Add(2, SparseVector{{9}, {3}}.view()).ok());
  const auto hits = Search(index, SparseVector{{7}, {1}}, 10, false);
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_EQ(hits[0].iid, 1u);
  // IDF = ln(1 + (2 − 1 + 0.5) / 1.5) = ln 2; dl = avgdl → 2 / (2 + 1.2).
  EXPECT_NEAR(hits[0].score, std::log(2.0) * 2 / 3.2, 1e-6);
}

TEST(SparseIndex, DotProductWithoutIdf) {
  SparseIndex index = MakeIndex(/*idf=*/false);
  ASSERT_TRUE(index.Add(1, SparseVector{{7, 9}, {0.5f, 2}}.view()).ok());
  ASSERT_TRUE(index.Add(2, SparseVector{{9}, {1}}.view()).ok());
  const auto hits = Search(index, SparseVector{{7, 9}, {2, 3}}, 10, false);
  ASSERT_EQ(hits.size(), 2u);
  EXPECT_EQ(hits[0].iid, 1u);
  EXPECT_FLOAT_EQ(hits[0].score, 0.5f * 2 + 2 * 3);
  EXPECT_EQ(hits[1].iid, 2u);
  EXPECT_FLOAT_EQ(hits[1].score, 3);
}

// Three shards searched with their merged statistics give the one-shard answer: the same ids,
// order and scores (integer frequencies, so the summed lengths are exact).
TEST(SparseIndex, MergedStatisticsEqualOneShard) {
  ZipfCorpus corpus(2000, 21);
  SparseIndex whole = MakeIndex();
  std::vector<SparseIndex> shards;
  for (int s = 0; s < 3; ++s) shards.push_back(MakeIndex());
  for (uint64_t iid = 0; iid < 2400; ++iid) {
    SparseVector v = corpus.Vector(std::uniform_int_distribution<int>(1, 50)(corpus.rng()), true);
    ASSERT_TRUE(whole.Add(iid, v.view()).ok());
    ASSERT_TRUE(shards[iid % 3].Add(iid, v.view()).ok());
  }
  for (uint64_t iid = 0; iid < 2400; iid += 5) {
    whole.Remove(iid);
    shards[iid % 3].Remove(iid);
  }
  for (int q = 0; q < 40; ++q) {
    SparseVector query =
        corpus.Vector(std::uniform_int_distribution<int>(1, 10)(corpus.rng()), true);
    SparseStatistics merged;
    for (const SparseIndex& shard : shards) merged.Merge(shard.Statistics(query.indices));
    const SparseStatistics own = whole.Statistics(query.indices);
    ASSERT_EQ(merged.num_documents, own.num_documents);
    ASSERT_EQ(merged.total_length, own.total_length);
    ASSERT_EQ(merged.doc_freq, own.doc_freq);

    const auto want = Search(whole, query, 10, false);
    std::vector<SparseHit> got;
    for (const SparseIndex& shard : shards) {
      const auto part = Search(shard, query, 10, false, nullptr, &merged);
      got.insert(got.end(), part.begin(), part.end());
    }
    std::sort(got.begin(), got.end(), [](const SparseHit& a, const SparseHit& b) {
      return a.score != b.score ? a.score > b.score : a.iid < b.iid;
    });
    if (got.size() > 10) got.resize(10);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].iid, want[i].iid) << "q " << q << " rank " << i;
      EXPECT_EQ(got[i].score, want[i].score) << "q " << q << " rank " << i;
    }
    // A shard's own statistics differ from the collection's, and so do its scores.
    const auto local = Search(shards[0], query, 1, false);
    const auto global = Search(shards[0], query, 1, false, nullptr, &merged);
    if (!local.empty() && query.indices.size() > 1) {
      EXPECT_NE(local[0].score, global[0].score) << "q " << q;
    }
  }
}

TEST(SparseIndex, StatisticsFollowAddsRemovesAndUpserts) {
  SparseIndex index = MakeIndex();
  ASSERT_TRUE(index.Add(1, SparseVector{{3, 5}, {2, 1}}.view()).ok());
  ASSERT_TRUE(index.Add(2, SparseVector{{5, 8}, {4, 0}}.view()).ok());  // 8 has weight 0
  ASSERT_TRUE(index.Add(3, SparseVector{{3}, {1}}.view(), 10.0f).ok());
  SparseStatistics s = index.Statistics(std::vector<uint32_t>{3, 5, 8, 99});
  EXPECT_EQ(s.num_documents, 3);
  EXPECT_EQ(s.total_length, 3 + 4 + 10);
  EXPECT_EQ(s.doc_freq[3], 2);
  EXPECT_EQ(s.doc_freq[5], 2);
  EXPECT_EQ(s.doc_freq[8], 0);
  EXPECT_EQ(s.doc_freq[99], 0);
  EXPECT_TRUE(index.Remove(1));
  EXPECT_FALSE(index.Remove(1));
  ASSERT_TRUE(index.Add(2, SparseVector{{3}, {6}}.view()).ok());  // upsert
  s = index.Statistics(std::vector<uint32_t>{3, 5});
  EXPECT_EQ(s.num_documents, 2);
  EXPECT_EQ(s.total_length, 6 + 10);
  EXPECT_EQ(s.doc_freq[3], 2);
  EXPECT_EQ(s.doc_freq[5], 0);
  EXPECT_TRUE(Search(index, SparseVector{{5}, {1}}, 10, false).empty());
  const auto hits = Search(index, SparseVector{{3}, {1}}, 10, false);
  ASSERT_EQ(hits.size(), 2u);
  EXPECT_EQ(hits[0].iid, 2u);
}

// Removing most documents compacts the lists; searches still equal the reference.
TEST(SparseIndex, CompactionKeepsAnswers) {
  ZipfCorpus corpus(300, 5);
  SparseIndex index = MakeIndex();
  ReferenceBm25 reference;
  for (uint64_t iid = 0; iid < 1000; ++iid) {
    SparseVector v = corpus.Vector(20, true);
    ASSERT_TRUE(index.Add(iid, v.view()).ok());
    reference.Add(iid, v);
  }
  const int64_t before = index.num_postings();
  for (uint64_t iid = 0; iid < 1000; ++iid) {
    if (iid % 4 != 0) {
      index.Remove(iid);
      reference.docs.erase(iid);
    }
  }
  EXPECT_LT(index.num_postings(), before / 2);  // compacted
  for (int q = 0; q < 20; ++q) {
    SparseVector query = corpus.Vector(5, true);
    const auto want = reference.Scores(query);
    const auto hits = Search(index, query, 1000, false);
    ASSERT_EQ(hits.size(), want.size());
    for (const SparseHit& hit : hits) EXPECT_NEAR(hit.score, want.at(hit.iid), 1e-5 * hit.score);
  }
}

TEST(SparseIndex, SkipsMostPostingsOnSkewedCorpus) {
  ZipfCorpus corpus(5000, 3);
  SparseIndex index = MakeIndex();
  for (uint64_t iid = 0; iid < 20000; ++iid) {
    ASSERT_TRUE(index.Add(iid, corpus.Vector(40, true).view()).ok());
  }
  int64_t scored = 0, total = 0;
  for (int q = 0; q < 20; ++q) {
    SparseSearchResult details;
    Search(index, corpus.Vector(10, true), 10, false, nullptr, nullptr, &details);
    scored += details.postings_scored;
    total += details.postings_total;
  }
  EXPECT_LT(scored, total / 2) << scored << " of " << total;
}

TEST(SparseIndex, SerializeRoundTrip) {
  ZipfCorpus corpus(500, 9);
  SparseIndex index = MakeIndex();
  for (uint64_t iid = 0; iid < 300; ++iid) {
    std::optional<float> length;
    if (iid % 5 == 0) length = 12.5f;
    ASSERT_TRUE(index.Add(iid * 3, corpus.Vector(25, true).view(), length).ok());
  }
  for (uint64_t iid = 0; iid < 300; iid += 4) index.Remove(iid * 3);
  const std::string bytes = index.Serialize();
  auto copy = SparseIndex::Deserialize(bytes, SparseIndexOptions{});
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(copy->num_documents(), index.num_documents());
  EXPECT_EQ(copy->Serialize(), bytes);
  for (int q = 0; q < 20; ++q) {
    SparseVector query = corpus.Vector(6, true);
    const auto want = Search(index, query, 20, false);
    const auto got = Search(*copy, query, 20, false);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].iid, want[i].iid);
      EXPECT_EQ(got[i].score, want[i].score);
    }
  }
  // Truncated, trailing bytes, bad header.
  auto truncated = SparseIndex::Deserialize(bytes.substr(0, bytes.size() - 3), {});
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(truncated.status().message(), HasSubstr("terms but"));
  EXPECT_EQ(SparseIndex::Deserialize(bytes + "x", {}).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(SparseIndex::Deserialize("garbage!12345678", {}).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(SparseIndex, RejectsBadVectorsNamingTheField) {
  SparseIndex index = MakeIndex();
  const auto add = [&](const SparseVector& v) { return index.Add(42, v.view()); };
  absl::Status s = add({{1, 2}, {1}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("document 42 sparse vector: 2 indices but 1 values"));
  s = add({{5, 3}, {1, 1}});
  EXPECT_THAT(s.message(), HasSubstr("indices[1] = 3 is below indices[0] = 5"));
  EXPECT_THAT(s.message(), HasSubstr("expected strictly increasing term ids"));
  s = add({{5, 5}, {1, 1}});
  EXPECT_THAT(s.message(), HasSubstr("indices[1] = 5 repeats indices[0] = 5"));
  s = add({{1, 2}, {1, -0.5f}});
  EXPECT_THAT(s.message(), HasSubstr("values[1] = -0.5 (term 2); expected a finite weight >= 0"));
  s = add({{1}, {std::numeric_limits<float>::quiet_NaN()}});
  EXPECT_THAT(s.message(), HasSubstr("values[0] = nan"));
  s = add({{1}, {std::numeric_limits<float>::infinity()}});
  EXPECT_THAT(s.message(), HasSubstr("values[0] = inf"));
  s = index.Add(42, SparseVector{{1}, {1}}.view(), -1.0f);
  EXPECT_THAT(s.message(), HasSubstr("document 42 sparse length = -1"));
  EXPECT_FALSE(index.Contains(42));

  SparseIndexOptions small;
  small.max_terms = 2;
  auto limited = SparseIndex::Create(small);
  ASSERT_TRUE(limited.ok());
  s = limited->Add(1, SparseVector{{1, 2, 3}, {1, 1, 1}}.view());
  EXPECT_THAT(s.message(), HasSubstr("3 terms; at most 2 are allowed"));

  SparseSearchRequest request;
  SparseVector query{{2, 1}, {1, 1}};
  request.query = query.view();
  EXPECT_THAT(index.Search(request).status().message(),
              HasSubstr("sparse query: indices[1] = 1 is below indices[0] = 2"));
  query = {{1}, {1}};
  request.query = query.view();
  request.k = 0;
  EXPECT_THAT(index.Search(request).status().message(), HasSubstr("k = 0; expected k >= 1"));
  request.k = 5;
  SparseStatistics statistics;
  statistics.num_documents = 3;
  request.statistics = &statistics;
  EXPECT_THAT(index.Search(request).status().message(), HasSubstr("no doc_freq for query term 1"));
  statistics.doc_freq[1] = 4;
  EXPECT_THAT(index.Search(request).status().message(),
              HasSubstr("doc_freq[1] = 4; expected 0 to num_documents = 3"));

  SparseIndexOptions bad;
  bad.scoring.b = 1.5;
  EXPECT_THAT(SparseIndex::Create(bad).status().message(),
              HasSubstr("b = 1.5; expected a value in [0, 1]"));
  bad.scoring.b = 0.5;
  bad.scoring.k1 = -1;
  EXPECT_THAT(SparseIndex::Create(bad).status().message(), HasSubstr("k1 = -1"));
}

TEST(SparseIndex, EmptyIndexAndQuery) {
  SparseIndex index = MakeIndex();
  EXPECT_TRUE(Search(index, SparseVector{{1}, {1}}, 10, false).empty());
  ASSERT_TRUE(index.Add(1, SparseVector{}.view()).ok());  // no terms: counts in N
  EXPECT_EQ(index.Statistics({}).num_documents, 1);
  EXPECT_TRUE(Search(index, SparseVector{}, 10, false).empty());
  EXPECT_TRUE(Search(index, SparseVector{{1}, {0}}, 10, false).empty());
}

}  // namespace
}  // namespace tessera::internal
