#include "index/kernels/query_similarity.h"

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

}  // namespace tessera::internal
