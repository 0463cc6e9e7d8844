// A small fixed-size thread pool for data-parallel loops (the CPU MaxSim scorer splits documents
// across it). There is no task queue of arbitrary closures: the only operation is ParallelFor, in
// which the calling thread works alongside the pool's workers until its loop is finished.
#ifndef TESSERA_INDEX_COMMON_THREAD_POOL_H_
#define TESSERA_INDEX_COMMON_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "tessera/base/mutex.h"

namespace tessera {
namespace internal {

// Owns `num_threads() - 1` worker threads; the thread that calls ParallelFor is the last one.
//
// Thread-safe: ParallelFor may be called concurrently from several threads, and from inside a
// running ParallelFor body (nested). Each call is one job in a FIFO queue with an atomic chunk
// counter; idle workers help the oldest job that still has unclaimed chunks, and the caller claims
// chunks of its own job until none are left, then waits only for chunks already running on
// workers. A caller therefore never waits for a chunk nobody is running, so nesting cannot
// deadlock. Happens-before: everything fn wrote is visible to the caller when ParallelFor returns.
class ThreadPool {
 public:
  // num_threads: total parallelism including the calling thread; 0 = hardware concurrency.
  // 1 creates no workers and ParallelFor runs inline. Precondition: num_threads ≥ 0.
  explicit ThreadPool(int num_threads);
  // Joins the workers. Precondition: no ParallelFor is running.
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) on disjoint chunks that together cover [0, n), every chunk at least
  // `grain` long (grain < 1 counts as 1) except when n < grain, and returns when all have run.
  // Chunks run on the workers and the calling thread in no particular order. With one chunk or no
  // workers, fn(0, n) runs inline. n ≤ 0 does nothing. fn must not throw.
  void ParallelFor(int64_t n, int64_t grain,
                   absl::FunctionRef<void(int64_t begin, int64_t end)> fn);

 private:
  // One ParallelFor call; lives on the caller's stack.
  struct Job {
    Job(absl::FunctionRef<void(int64_t, int64_t)> f, int64_t size, int64_t chunks)
        : fn(f), n(size), num_chunks(chunks) {}

    absl::FunctionRef<void(int64_t, int64_t)> fn;
    const int64_t n;
    const int64_t num_chunks;
    std::atomic<int64_t> next_chunk{0};
    // Workers currently claiming chunks of this job. Guarded by ThreadPool::mu_ (the annotation
    // cannot name an outer member). A worker only takes a job while it is in queue_, and the
    // caller removes it before waiting for helpers == 0, after which no worker can touch it.
    int helpers = 0;
  };

  // Claims and runs chunks of `job` until none are left.
  static void RunChunks(Job* job);
  void WorkerLoop();
  void RemoveFromQueue(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int num_threads_;
  Mutex mu_;
  // Signalled when a job is queued or the pool stops.
  CondVar work_cv_;
  // Signalled when some job's helpers drops to 0.
  CondVar done_cv_;
  // Jobs that may still have unclaimed chunks, oldest first.
  std::deque<Job*> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace internal
}  // namespace tessera

#endif  // TESSERA_INDEX_COMMON_THREAD_POOL_H_
