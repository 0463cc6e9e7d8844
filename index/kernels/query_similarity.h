// Inner products of vectors with a fixed set of query rows on the MaxSim micro-kernels: stage 1's
// exact candidate scans (index/candidate), its centroid scoring and k-means assignment
// (index/centroid), and the centroid table of the compact rerank (index/collection/shard.cc).
#ifndef TESSERA_INDEX_KERNELS_QUERY_SIMILARITY_H_
#define TESSERA_INDEX_KERNELS_QUERY_SIMILARITY_H_

#include <cstdint>

#include "absl/types/span.h"
#include "index/kernels/cpu_kernels.h"
#include "tessera/matrix.h"
#include "tessera/maxsim.h"

namespace tessera::internal {

// Inner products of fp32 vectors with a fixed set of query rows, computed by the MaxSim
// micro-kernels of one ISA (vector lanes over query rows, a panel of vectors per step) with a store
// instead of a running max. Immutable after construction: Compute() may run concurrently.
class QuerySimilarity {
 public:
  // queries: nq ≥ 1 rows of dim ≥ 1 values (copied). isa: kAuto (DetectCpuIsa()) or a concrete
  // ISA the CPU supports.
  explicit QuerySimilarity(FloatMatrixView queries, CpuIsa isa = CpuIsa::kAuto);

  // The row stride of Compute's output: nq rounded up to the kernel's vector width.
  int64_t stride() const { return lanes_; }

  // out[j * stride() + i] = Σ_k vectors[j * dim + k] · queries[i][k] for j < n and i < nq (fp32
  // fused multiply-adds over k in order); lanes nq ≤ i < stride() hold 0. vectors: n × dim
  // values; out: n × stride() values.
  void Compute(const float* vectors, int64_t n, float* out) const;
  // The same for the rows `ids` of `vectors` (row r at vectors[r * dim]), each stored at its own
  // place: out[r * stride() + i] for r in ids, the values Compute gives row r; nothing else of out
  // is written. The rows are copied a few dozen at a time into a contiguous block for the
  // kernel, so that a scattered subset costs about as much a row as a contiguous one.
  void ComputeRows(const float* vectors, absl::Span<const uint32_t> ids, float* out) const;

 private:
  int64_t dim_;
  int64_t lanes_;
  AlignedBuffer query_t_;
  void (*kernel_)(const float*, int64_t, int64_t, const float*, int64_t, float*);
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_KERNELS_QUERY_SIMILARITY_H_
