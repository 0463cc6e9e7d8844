// The CPU MaxSim backend: picks a kernel (AVX-512, AVX2 or portable) once at construction and
// splits the documents of each Score() call across the thread pool it is given (NewCpuMaxSimScorer
// makes one; the engine makes one sized by EngineOptions::threads). The kernels themselves live in
// index/kernels/, which stage 1 uses too.
#ifndef TESSERA_INDEX_RERANK_CPU_MAXSIM_SCORER_H_
#define TESSERA_INDEX_RERANK_CPU_MAXSIM_SCORER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "index/common/thread_pool.h"
#include "index/kernels/cpu_kernels.h"
#include "tessera/maxsim.h"

namespace tessera {
namespace internal {

// Thread-safe: Score() may run concurrently from several threads; calls share the pool (see
// ThreadPool) and each call's scratch is private to it.
class CpuMaxSimScorer final : public MaxSimScorer {
 public:
  // isa: a concrete ISA the CPU supports (not kAuto); pool not null. Other work may share the
  // pool (ThreadPool::ParallelFor is safe to call concurrently and from inside its own tasks).
  CpuMaxSimScorer(CpuIsa isa, std::shared_ptr<ThreadPool> pool);

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
  const std::shared_ptr<ThreadPool> pool_;
};

}  // namespace internal
}  // namespace tessera

#endif  // TESSERA_INDEX_RERANK_CPU_MAXSIM_SCORER_H_
