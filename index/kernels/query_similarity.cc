#include "index/kernels/query_similarity.h"

#include <algorithm>
#include <vector>

namespace tessera::internal {

QuerySimilarity::QuerySimilarity(FloatMatrixView queries, CpuIsa isa) {
  if (isa == CpuIsa::kAuto) isa = DetectCpuIsa();
  dim_ = queries.cols;
  const MaxSimKernels& kernels = KernelsFor(isa);
  lanes_ = (queries.rows + kernels.lanes - 1) / kernels.lanes * kernels.lanes;
  query_t_ = TransposeQuery(queries, lanes_);
  kernel_ = kernels.similarity;
}

void QuerySimilarity::Compute(const float* vectors, int64_t n, float* out) const {
  kernel_(static_cast<const float*>(query_t_.get()), lanes_, dim_, vectors, n, out);
}

void QuerySimilarity::ComputeRows(const float* vectors, absl::Span<const uint32_t> ids,
                                  float* out) const {
  // 48 rows: whole panels of every kernel (12 with AVX-512, 6 with AVX2), and at dim 128 a
  // 24 KiB block that stays in L1 while the kernel reads it once per lane group.
  constexpr int64_t kBlockRows = 48;
  std::vector<float> block(kBlockRows * dim_);
  std::vector<float> block_out(kBlockRows * lanes_);
  for (size_t first = 0; first < ids.size(); first += kBlockRows) {
    const int64_t n = std::min<int64_t>(kBlockRows, static_cast<int64_t>(ids.size() - first));
    for (int64_t j = 0; j < n; ++j) {
      std::copy_n(vectors + int64_t{ids[first + j]} * dim_, dim_, &block[j * dim_]);
    }
    Compute(block.data(), n, block_out.data());
    for (int64_t j = 0; j < n; ++j) {
      std::copy_n(&block_out[j * lanes_], lanes_, out + int64_t{ids[first + j]} * lanes_);
    }
  }
}

}  // namespace tessera::internal
