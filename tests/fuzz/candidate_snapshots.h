// Candidate index snapshots written by the real CandidateIndex::Save, one per kind of index the
// store keeps (exact Flat, HNSW, SQ8, a trained IVF, and an empty one): the seeds of the
// candidate_snapshot target, and the FAISS sections it splices into what it loads.
#ifndef TESSERA_TESTS_FUZZ_CANDIDATE_SNAPSHOTS_H_
#define TESSERA_TESTS_FUZZ_CANDIDATE_SNAPSHOTS_H_

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "index/candidate/candidate_index.h"
#include "tests/fuzz/fuzz_util.h"

namespace tessera::fuzz {

// (name, snapshot file bytes). Aborts if an index cannot be built (a broken harness).
inline std::vector<std::pair<std::string, std::string>> CandidateSnapshots() {
  struct Recipe {
    const char* name;
    const char* factory;
    int64_t dim;
    int documents;
  };
  std::vector<std::pair<std::string, std::string>> snapshots;
  for (const Recipe& r : {Recipe{"auto", "auto", 4, 5}, Recipe{"flat", "Flat", 8, 3},
                          Recipe{"hnsw", "HNSW8", 4, 6}, Recipe{"sq8", "SQ8", 4, 4},
                          Recipe{"ivf", "IVF2,Flat", 4, 6}, Recipe{"empty", "auto", 4, 0}}) {
    internal::CandidateIndexOptions options;
    options.dim = r.dim;
    options.factory = r.factory;
    options.min_training_vectors = 8;
    auto index = internal::CandidateIndex::Create(options);
    FUZZ_CHECK(index.ok(), index.status().ToString());
    uint64_t state = 12345;
    for (int d = 1; d <= r.documents; ++d) {
      std::vector<float> vectors(2 * r.dim);
      for (int64_t row = 0; row < 2; ++row) {
        float norm = 0;
        for (int64_t k = 0; k < r.dim; ++k) {
          state = state * 6364136223846793005ull + 1442695040888963407ull;
          const float v = static_cast<float>(state >> 40) / static_cast<float>(1 << 24) - 0.5f;
          vectors[row * r.dim + k] = v;
          norm += v * v;
        }
        for (int64_t k = 0; k < r.dim; ++k) vectors[row * r.dim + k] /= std::sqrt(norm);
      }
      const absl::Status added = (*index)->Add(3 * d, FloatMatrixView{vectors.data(), 2, r.dim});
      FUZZ_CHECK(added.ok(), added.ToString());
    }
    if (r.documents > 2) FUZZ_CHECK((*index)->Remove(3).ok(), "Remove");
    const std::string path = ScratchDir() + "/seed-snapshot";
    const absl::Status saved = (*index)->Save(path, 0x1234);
    FUZZ_CHECK(saved.ok(), saved.ToString());
    std::string bytes;
    FILE* file = std::fopen(path.c_str(), "rb");
    FUZZ_CHECK(file != nullptr, path);
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) bytes.append(buffer, n);
    std::fclose(file);
    snapshots.emplace_back(r.name, std::move(bytes));
  }
  return snapshots;
}

}  // namespace tessera::fuzz

#endif  // TESSERA_TESTS_FUZZ_CANDIDATE_SNAPSHOTS_H_
