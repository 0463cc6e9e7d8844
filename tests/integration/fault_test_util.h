// Helpers of the disk fault tests: documents whose stored form is known exactly, checks that a
// set of acknowledged documents is what a collection holds (Get and Search), and byte flips.
#ifndef TESSERA_TESTS_INTEGRATION_FAULT_TEST_UTIL_H_
#define TESSERA_TESTS_INTEGRATION_FAULT_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tessera/collection.h"
#include "tessera/engine.h"

namespace tessera::testing {

inline constexpr int64_t kFaultDim = 64;

// fp32 storage, no pooling and one global-mean candidate vector: Get returns the tokens as sent
// (up to the rounding of a one-token cluster mean), and a document is rerank_bytes ≈ 4 · dim per
// token on disk.
inline CollectionSchema FaultSchema(const std::string& name) {
  CollectionSchema schema;
  schema.name = name;
  schema.dim = kFaultDim;
  schema.dtype = VectorDtype::kFloat32;
  schema.pooling = PoolingSpec{};
  schema.candidates.kind = CandidateSpec::Kind::kGlobalMean;
  schema.candidates.factory = "Flat";
  return schema;
}

// Document `id` of `tokens` unit vectors drawn from a generator seeded by the id.
inline Document FaultDocument(const std::string& id, int64_t tokens) {
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>()(id)));
  std::normal_distribution<float> normal;
  Document document;
  document.id = id;
  document.num_tokens = tokens;
  document.dim = kFaultDim;
  document.tokens.resize(tokens * kFaultDim);
  for (int64_t t = 0; t < tokens; ++t) {
    double norm = 0;
    float* row = &document.tokens[t * kFaultDim];
    for (int64_t k = 0; k < kFaultDim; ++k) {
      row[k] = normal(rng);
      norm += double{row[k]} * row[k];
    }
    for (int64_t k = 0; k < kFaultDim; ++k) row[k] = static_cast<float>(row[k] / std::sqrt(norm));
  }
  return document;
}

// Upserts one document; its outcome's status.
inline absl::Status UpsertOne(Collection& collection, const Document& document) {
  std::vector<UpsertOutcome> outcomes = collection.Upsert({document});
  return outcomes.at(0).status;
}

// Expects Get of every document of `acknowledged` to return its tokens, a search by its first
// four tokens to rank it first, Get of every id in `absent` to be NOT_FOUND, and the collection
// to hold exactly the acknowledged documents.
inline void ExpectExactly(const Collection& collection,
                          const std::map<std::string, Document>& acknowledged,
                          const std::vector<std::string>& absent, const std::string& when) {
  SCOPED_TRACE(when);
  EXPECT_EQ(collection.Stats().documents, static_cast<int64_t>(acknowledged.size()));
  SearchOptions options;
  options.k = 1;
  options.num_candidates = 1000;
  for (const auto& [id, sent] : acknowledged) {
    absl::StatusOr<StoredDocument> got = collection.Get(id);
    ASSERT_TRUE(got.ok()) << id << ": " << got.status();
    ASSERT_EQ(got->vectors.size(), sent.tokens.size()) << id;
    for (size_t i = 0; i < sent.tokens.size(); ++i) {
      ASSERT_NEAR(got->vectors[i], sent.tokens[i], 1e-6) << id << " value " << i;
    }
    const FloatMatrixView query{sent.tokens.data(), 4, kFaultDim};
    absl::StatusOr<SearchResult> result = collection.Search(query, options);
    ASSERT_TRUE(result.ok()) << id << ": " << result.status();
    ASSERT_EQ(result->hits.size(), 1u) << id;
    EXPECT_EQ(result->hits[0].id, id);
  }
  for (const std::string& id : absent) {
    EXPECT_EQ(collection.Get(id).status().code(), absl::StatusCode::kNotFound) << id;
  }
}

// XORs `count` bytes at `offset` of `path` with 0xff.
inline void FlipBytes(const std::filesystem::path& path, uint64_t offset, int count) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(file.good()) << path;
  std::string bytes(count, '\0');
  file.seekg(static_cast<std::streamoff>(offset));
  file.read(bytes.data(), count);
  ASSERT_EQ(file.gcount(), count) << path;
  for (char& c : bytes) c = static_cast<char>(c ^ 0xff);
  file.seekp(static_cast<std::streamoff>(offset));
  file.write(bytes.data(), count);
  ASSERT_TRUE(file.good()) << path;
}

// The directory of collection `name` under data_dir (the one the engine created).
inline std::filesystem::path CollectionDir(const std::string& data_dir, const std::string& name) {
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::path(data_dir) / "collections")) {
    const std::string dir = entry.path().filename().string();
    if (dir.substr(0, dir.rfind('@')) == name) return entry.path();
  }
  return {};
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_INTEGRATION_FAULT_TEST_UTIL_H_
