// Test helpers shared by the collection tests: the temporary directory (index/testing), a
// structured synthetic corpus (topics, near duplicates, queries drawn from documents) and
// brute-force MaxSim over what Get() returns.
#ifndef TESSERA_INDEX_COLLECTION_COLLECTION_TEST_UTIL_H_
#define TESSERA_INDEX_COLLECTION_COLLECTION_TEST_UTIL_H_

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "index/testing/temp_dir.h"
#include "tessera/collection.h"

namespace tessera {

inline std::vector<float> Normalized(std::vector<float> v, int64_t dim) {
  for (size_t r = 0; r < v.size() / dim; ++r) {
    double s = 0;
    for (int64_t k = 0; k < dim; ++k) s += v[r * dim + k] * v[r * dim + k];
    const double inv = s > 0 ? 1.0 / std::sqrt(s) : 0.0;
    for (int64_t k = 0; k < dim; ++k) v[r * dim + k] = static_cast<float>(v[r * dim + k] * inv);
  }
  return v;
}

// A structured corpus: topics (directions), documents mixing a few topics with noise, and
// paraphrase-like near duplicates of earlier documents.
class Corpus {
 public:
  // Noise levels are relative to unit vectors (the norm of the noise added to a unit vector):
  // token_noise spreads a document's tokens around its topics, query_noise a query's tokens
  // around the document tokens they are drawn from.
  Corpus(int64_t dim, uint32_t seed, int num_topics = 256, float token_noise = 0.6f,
         float query_noise = 0.4f)
      : dim_(dim),
        num_topics_(num_topics),
        token_noise_(token_noise),
        query_noise_(query_noise),
        scale_(1.0f / std::sqrt(static_cast<float>(dim))),
        rng_(seed) {
    std::normal_distribution<float> normal;
    topics_.resize(num_topics * dim_);
    for (float& v : topics_) v = normal(rng_);
    topics_ = Normalized(topics_, dim_);
  }

  Document Make(const std::string& id, int64_t num_tokens) {
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> topic(0, num_topics_ - 1);
    Document document;
    document.id = id;
    document.num_tokens = num_tokens;
    document.dim = dim_;
    const int t1 = topic(rng_), t2 = topic(rng_), t3 = topic(rng_);
    document.tokens.resize(num_tokens * dim_);
    for (int64_t i = 0; i < num_tokens; ++i) {
      const int t = (i % 3 == 0) ? t1 : (i % 3 == 1 ? t2 : t3);
      for (int64_t k = 0; k < dim_; ++k) {
        document.tokens[i * dim_ + k] =
            topics_[t * dim_ + k] + token_noise_ * scale_ * normal(rng_);
      }
    }
    document.tokens = Normalized(document.tokens, dim_);
    return document;
  }

  // A near duplicate: the same tokens, perturbed by noise of the given scale.
  Document Paraphrase(const Document& source, const std::string& id, float noise = 0.05f) {
    std::normal_distribution<float> normal;
    Document document = source;
    document.id = id;
    for (float& v : document.tokens) v += noise * scale_ * normal(rng_);
    document.tokens = Normalized(document.tokens, dim_);
    return document;
  }

  // A query: a noisy subset of a document's tokens.
  std::vector<float> QueryFrom(const Document& document, int64_t num_tokens) {
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int64_t> pick(0, document.num_tokens - 1);
    std::vector<float> query(num_tokens * dim_);
    for (int64_t i = 0; i < num_tokens; ++i) {
      const int64_t row = pick(rng_);
      for (int64_t k = 0; k < dim_; ++k) {
        query[i * dim_ + k] =
            document.tokens[row * dim_ + k] + query_noise_ * scale_ * normal(rng_);
      }
    }
    return Normalized(query, dim_);
  }

  std::mt19937& rng() { return rng_; }

 private:
  int64_t dim_;
  int num_topics_;
  float token_noise_;
  float query_noise_;
  float scale_;  // per-coordinate standard deviation of noise of norm 1
  std::mt19937 rng_;
  std::vector<float> topics_;
};

// Brute-force MaxSim in double over what Get() returns, best first, ties by ascending id.
inline std::vector<std::pair<std::string, double>> BruteForce(const Collection& collection,
                                                              const std::vector<std::string>& ids,
                                                              const std::vector<float>& query,
                                                              int64_t dim) {
  std::vector<std::pair<std::string, double>> scored;
  const int64_t nq = static_cast<int64_t>(query.size()) / dim;
  for (const std::string& id : ids) {
    auto document = collection.Get(id);
    if (!document.ok()) continue;
    double total = 0;
    for (int64_t i = 0; i < nq; ++i) {
      double best = -INFINITY;
      for (int64_t v = 0; v < document->num_vectors(); ++v) {
        double dot = 0;
        for (int64_t k = 0; k < dim; ++k) {
          dot += static_cast<double>(query[i * dim + k]) * document->vectors[v * dim + k];
        }
        best = std::max(best, dot);
      }
      total += best;
    }
    scored.emplace_back(id, total);
  }
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  return scored;
}

inline CollectionSchema Schema(const std::string& name, int64_t dim) {
  CollectionSchema schema;
  schema.name = name;
  schema.dim = dim;
  schema.attributes = {{"group", AttributeType::kInt64}, {"lang", AttributeType::kString}};
  return schema;
}

inline void ExpectAllOk(const std::vector<UpsertOutcome>& outcomes) {
  for (size_t i = 0; i < outcomes.size(); ++i) {
    ASSERT_TRUE(outcomes[i].status.ok()) << i << ": " << outcomes[i].status;
  }
}

}  // namespace tessera

#endif  // TESSERA_INDEX_COLLECTION_COLLECTION_TEST_UTIL_H_
