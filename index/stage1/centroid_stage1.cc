#include "index/stage1/centroid_stage1.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "index/common/thread_pool.h"

namespace tessera::internal {
namespace {

// What CentroidIndex::Add checks, so that it cannot fail after the write. A mismatch is a bug in
// the encoder, caught before anything is written.
absl::Status CheckCodes(const DocumentCodes& codes, int64_t rows, const CentroidCodebook& codebook,
                        absl::string_view what) {
  const int64_t code_bytes = codebook.codec().code_bytes();
  bool valid = codes.size() == rows && rows >= 1 &&
               static_cast<int64_t>(codes.codes.size()) == rows * code_bytes;
  for (uint32_t id : codes.centroids) valid = valid && id < codebook.num_centroids();
  if (!valid) {
    return absl::InternalError(absl::StrCat(what, ": encoding gave ", codes.size(), " codes of ",
                                            codes.codes.size(), " bytes for ", rows, " vectors"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<DocumentCodes> EncodeOnPool(const CentroidIndex& index,
                                        absl::Span<const StoredMatrix* const> matrices,
                                        ThreadPool* pool) {
  std::vector<DocumentCodes> codes(matrices.size());
  const int64_t n = static_cast<int64_t>(matrices.size());
  const int64_t grain = std::max<int64_t>(1, n / (2 * pool->num_threads()));
  pool->ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
    std::vector<std::vector<float>> vectors;
    std::vector<FloatMatrixView> views;
    std::vector<int64_t> which;
    for (int64_t i = begin; i < end; ++i) {
      if (matrices[i] == nullptr) continue;
      vectors.push_back(MatrixToFloat(*matrices[i]));
      views.push_back(FloatMatrixView{vectors.back().data(), matrices[i]->rows, matrices[i]->cols});
      which.push_back(i);
    }
    std::vector<DocumentCodes> encoded = index.Encode(views);
    for (size_t k = 0; k < which.size(); ++k) codes[which[k]] = std::move(encoded[k]);
  });
  return codes;
}

CentroidStage1::CentroidStage1(std::shared_ptr<CentroidIndex> index, uint32_t generation)
    : Stage1Index(index->codebook().dim()), index_(std::move(index)), generation_(generation) {}

absl::StatusOr<std::vector<Stage1Payload>> CentroidStage1::DeriveImpl(
    absl::Span<const Stage1Source> documents, ThreadPool* pool) const {
  std::vector<const StoredMatrix*> stored(documents.size());
  for (size_t i = 0; i < documents.size(); ++i) stored[i] = documents[i].stored;
  std::vector<DocumentCodes> codes = EncodeOnPool(*index_, stored, pool);
  std::vector<Stage1Payload> payloads(documents.size());
  for (size_t i = 0; i < documents.size(); ++i) {
    const absl::Status valid =
        CheckCodes(codes[i], documents[i].stored->rows, index_->codebook(), documents[i].what);
    if (!valid.ok()) return valid;
    payloads[i].codes = std::move(codes[i]);
  }
  return payloads;
}

void CentroidStage1::Persist(const Stage1Payload& payload, DocumentWrite* write) const {
  write->codes = SerializeDocumentCodes(payload.codes);
  write->code_generation = generation_;
}

absl::Status CentroidStage1::Add(uint64_t iid, const Stage1Payload& payload) {
  return index_->Add(iid, payload.codes);
}

absl::Status CentroidStage1::Remove(uint64_t iid) {
  index_->Remove(iid);
  return absl::OkStatus();
}

int CentroidStage1::DefaultNumDocuments(int k, int64_t vectors) const {
  return DefaultNumCandidates(k, vectors);
}

Stage1Stats CentroidStage1::Stats() const {
  const CentroidIndexStats stats = index_->Stats();
  const CentroidCodebook& codebook = index_->codebook();
  return Stage1Stats{absl::StrCat("Centroid", codebook.num_centroids(), ",Residual",
                                  codebook.codec().nbits(), "bit"),
                     stats.vectors, stats.memory_bytes};
}

absl::Status CentroidStage1::Save(const std::string& path) const { return absl::OkStatus(); }

absl::StatusOr<std::vector<Stage1Hit>> CentroidStage1::SearchImpl(
    const Stage1Query& query, const std::function<bool(uint64_t)>* accept, ThreadPool* pool) const {
  CentroidSearchOptions options;
  options.nprobe = query.nprobe;
  options.num_documents = query.num_documents;
  options.centroid_scores = query.centroid_scores;
  absl::StatusOr<std::vector<CentroidHit>> hits =
      index_->Search(query.query, options, accept, pool);
  if (!hits.ok()) return hits.status();
  std::vector<Stage1Hit> out;
  out.reserve(hits->size());
  for (const CentroidHit& hit : *hits) out.push_back(Stage1Hit{hit.doc, hit.score});
  return out;
}

}  // namespace tessera::internal
