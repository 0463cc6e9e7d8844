// The CPU MaxSim backend: picks a kernel (AVX-512, AVX2 or portable) once at construction and
// splits the documents of each Score() call across a thread pool it owns. Also QuerySimilarity:
// the same micro-kernels computing plain inner products, for stage 1's exact candidate scans.
#ifndef TESSERA_INDEX_RERANK_CPU_MAXSIM_SCORER_H_
#define TESSERA_INDEX_RERANK_CPU_MAXSIM_SCORER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "index/common/thread_pool.h"
#include "index/rerank/cpu_maxsim_kernels.h"
#include "tessera/maxsim.h"

namespace tessera {
namespace internal {

// Memory aligned to kMaxSimAlignment (the kernels' aligned loads need it).
struct AlignedFree {
  void operator()(void* p) const;
};
using AlignedBuffer = std::unique_ptr<void, AlignedFree>;
AlignedBuffer AllocateAligned(int64_t bytes);

// Thread-safe: Score() may run concurrently from several threads; calls share the pool (see
// ThreadPool) and each call's scratch is private to it.
class CpuMaxSimScorer final : public MaxSimScorer {
 public:
  // isa: a concrete ISA the CPU supports (not kAuto); num_threads ≥ 1.
  CpuMaxSimScorer(CpuIsa isa, int num_threads);

  std::string_view name() const override { return name_; }
  CpuIsa isa() const { return isa_; }
  int num_threads() const { return pool_->num_threads(); }

 private:
  absl::Status ScoreImpl(FloatMatrixView query, const DocumentBatch& docs,
                         const MaxSimOptions& options, MaxSimResult* result) const override;

  const CpuIsa isa_;
  const std::string name_;
  void (*const kernel_)(const MaxSimKernelArgs&, int64_t, int64_t, void*);
  const int64_t lane_multiple_;
  const std::unique_ptr<ThreadPool> pool_;
};

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

 private:
  int64_t dim_;
  int64_t lanes_;
  AlignedBuffer query_t_;
  void (*kernel_)(const float*, int64_t, int64_t, const float*, int64_t, float*);
};

// Whether this CPU (and OS) can run kernels of `isa`; kAuto and kPortable are always supported.
bool CpuSupportsIsa(CpuIsa isa);
// "avx512", "avx2", "portable" or "auto".
const char* CpuIsaName(CpuIsa isa);

}  // namespace internal
}  // namespace tessera

#endif  // TESSERA_INDEX_RERANK_CPU_MAXSIM_SCORER_H_
