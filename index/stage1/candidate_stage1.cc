#include "index/stage1/candidate_stage1.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "index/common/thread_pool.h"
#include "tessera/pooling.h"
#include "tessera/status_macros.h"

namespace tessera::internal {
namespace {

FloatMatrixView View(const StoredMatrix& matrix) {
  return FloatMatrixView{reinterpret_cast<const float*>(matrix.bytes.data()), matrix.rows,
                         matrix.cols};
}

}  // namespace

absl::StatusOr<std::vector<float>> CandidateVectors(FloatMatrixView vectors,
                                                    const CandidateSpec& spec, int64_t* rows) {
  const int64_t dim = vectors.cols;
  if (spec.kind == CandidateSpec::Kind::kGlobalMean) {
    std::vector<double> sum(dim, 0.0);
    for (int64_t v = 0; v < vectors.rows; ++v) {
      for (int64_t k = 0; k < dim; ++k) sum[k] += vectors.data[v * dim + k];
    }
    double norm = 0.0;
    for (double x : sum) norm += x * x;
    const double scale = norm > 0.0 ? 1.0 / std::sqrt(norm) : 0.0;
    std::vector<float> out(dim);
    for (int64_t k = 0; k < dim; ++k) out[k] = static_cast<float>(sum[k] * scale);
    *rows = 1;
    return out;
  }
  TokenPoolingOptions options;
  options.pool_factor = spec.pool_factor;
  options.renormalize = true;
  TESSERA_ASSIGN_OR_RETURN(PooledMatrix pooled, PoolTokens(vectors, options));
  *rows = pooled.num_vectors();
  return std::move(pooled.vectors);
}

CandidateStage1::CandidateStage1(std::unique_ptr<CandidateIndex> index, int64_t dim,
                                 const CandidateSpec& spec, uint64_t max_iid)
    : Stage1Index(dim), index_(std::move(index)), spec_(spec), max_iid_(max_iid) {}

absl::StatusOr<std::vector<Stage1Payload>> CandidateStage1::DeriveImpl(
    absl::Span<const Stage1Source> documents, ThreadPool* pool) const {
  const int64_t n = static_cast<int64_t>(documents.size());
  std::vector<Stage1Payload> payloads(n);
  std::vector<absl::Status> statuses(n);
  pool->ParallelFor(n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Stage1Source& document = documents[i];
      std::vector<float> stored_values;
      FloatMatrixView vectors = document.pooled;
      if (vectors.data == nullptr) {
        stored_values = MatrixToFloat(*document.stored);
        vectors = FloatMatrixView{stored_values.data(), document.stored->rows, dim()};
      }
      int64_t rows = 0;
      absl::StatusOr<std::vector<float>> candidates = CandidateVectors(vectors, spec_, &rows);
      if (!candidates.ok()) {
        statuses[i] = absl::Status(
            candidates.status().code(),
            absl::StrCat(document.what, ": candidate vectors: ", candidates.status().message()));
        continue;
      }
      // What CandidateIndex::Add checks, so that it cannot fail after the write.
      if (rows < 1 || rows > kMaxCandidateVectorsPerDocument) {
        statuses[i] = absl::InvalidArgumentError(absl::StrCat(document.what, ": ", rows,
                                                              " candidate vectors, expected 1 … ",
                                                              kMaxCandidateVectorsPerDocument));
        continue;
      }
      for (int64_t v = 0; v < rows * dim(); ++v) {
        if (!std::isfinite((*candidates)[v])) {
          statuses[i] = absl::InvalidArgumentError(
              absl::StrCat(document.what, ": candidate vectors: value ", v % dim(), " of vector ",
                           v / dim(), " is not finite (fp32)"));
          break;
        }
      }
      payloads[i].candidates = MatrixFromFloat(*candidates, rows, dim(), VectorDtype::kFloat32);
    }
  });
  for (const absl::Status& status : statuses) TESSERA_RETURN_IF_ERROR(status);
  return payloads;
}

void CandidateStage1::Persist(const Stage1Payload& payload, DocumentWrite* write) const {
  write->candidates = payload.candidates;
}

absl::Status CandidateStage1::Add(uint64_t iid, const Stage1Payload& payload) {
  MutexLock lock(&mu_);
  max_iid_ = std::max(max_iid_, iid);
  return index_->Add(iid, View(payload.candidates));
}

absl::Status CandidateStage1::Remove(uint64_t iid) { return index_->Remove(iid); }

int CandidateStage1::DefaultNumDocuments(int k, int64_t vectors) const {
  return std::max(10 * k, 100);
}

Stage1Stats CandidateStage1::Stats() const {
  const CandidateIndexStats stats = index_->Stats();
  return Stage1Stats{stats.description, stats.vectors, stats.memory_bytes};
}

absl::Status CandidateStage1::Save(const std::string& path) const {
  MutexLock lock(&mu_);
  return index_->Save(path, max_iid_);
}

absl::StatusOr<std::vector<Stage1Hit>> CandidateStage1::SearchImpl(
    const Stage1Query& request, const std::function<bool(uint64_t)>* accept,
    ThreadPool* pool) const {
  const FloatMatrixView query = request.query;
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::vector<CandidateHit>> hits,
                           index_->Search(query, request.per_token, accept, pool));
  absl::flat_hash_map<uint64_t, std::vector<float>> best;  // doc → per-token best
  std::vector<float> floor(query.rows, 0.0f);
  for (int64_t i = 0; i < query.rows; ++i) {
    const std::vector<CandidateHit>& token = hits[i];
    if (token.empty()) continue;
    floor[i] = token.back().similarity;
    for (const CandidateHit& hit : token) {
      std::vector<float>& per_token_best = best[hit.doc];
      if (per_token_best.empty()) {
        per_token_best.assign(query.rows, -std::numeric_limits<float>::infinity());
      }
      per_token_best[i] = std::max(per_token_best[i], hit.similarity);
    }
  }
  std::vector<Stage1Hit> out;
  out.reserve(best.size());
  for (const auto& [iid, per_token_best] : best) {
    float score = 0.0f;
    for (int64_t i = 0; i < query.rows; ++i) {
      score += std::isinf(per_token_best[i]) ? floor[i] : per_token_best[i];
    }
    out.push_back(Stage1Hit{iid, score});
  }
  const size_t keep = std::min<size_t>(std::max(request.num_documents, 0), out.size());
  std::partial_sort(out.begin(), out.begin() + keep, out.end(),
                    [](const Stage1Hit& a, const Stage1Hit& b) {
                      return a.score != b.score ? a.score > b.score : a.iid < b.iid;
                    });
  out.resize(keep);
  return out;
}

}  // namespace tessera::internal
