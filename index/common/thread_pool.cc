// ThreadPool: FIFO of ParallelFor jobs, chunks claimed with an atomic counter; see thread_pool.h
// for why a caller can always finish its own job.
#include "index/common/thread_pool.h"

#include <algorithm>

namespace tessera {
namespace internal {
namespace {

// Bounds of chunk `c` of `num_chunks` near-equal chunks of [0, n), without overflow.
void ChunkBounds(int64_t n, int64_t num_chunks, int64_t c, int64_t* begin, int64_t* end) {
  const int64_t base = n / num_chunks;
  const int64_t extra = n % num_chunks;
  *begin = c * base + std::min(c, extra);
  *end = *begin + base + (c < extra ? 1 : 0);
}

}  // namespace

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(num_threads > 0
                       ? num_threads
                       : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))) {
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    work_cv_.SignalAll();
  }
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::RunChunks(Job* job) {
  for (;;) {
    const int64_t c = job->next_chunk.fetch_add(1, std::memory_order_relaxed);
    if (c >= job->num_chunks) return;
    int64_t begin, end;
    ChunkBounds(job->n, job->num_chunks, c, &begin, &end);
    job->fn(begin, end);
  }
}

void ThreadPool::RemoveFromQueue(Job* job) {
  auto it = std::find(queue_.begin(), queue_.end(), job);
  if (it != queue_.end()) queue_.erase(it);
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             absl::FunctionRef<void(int64_t begin, int64_t end)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t num_chunks = std::max<int64_t>(1, n / grain);
  if (num_chunks == 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  Job job(fn, n, num_chunks);
  {
    MutexLock lock(&mu_);
    queue_.push_back(&job);
    // The caller takes chunks too, so at most num_chunks - 1 workers can be useful.
    if (num_chunks - 1 >= static_cast<int64_t>(workers_.size())) {
      work_cv_.SignalAll();
    } else {
      for (int64_t i = 0; i < num_chunks - 1; ++i) work_cv_.Signal();
    }
  }
  RunChunks(&job);
  // Every chunk is claimed; wait for those still running on workers. Once the job is out of the
  // queue no new helper can join, so helpers == 0 means nobody will touch `job` again.
  MutexLock lock(&mu_);
  RemoveFromQueue(&job);
  while (job.helpers > 0) done_cv_.Wait(&mu_);
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    Job* job;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) work_cv_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping, and no job left to help
      job = queue_.front();
      if (job->next_chunk.load(std::memory_order_relaxed) >= job->num_chunks) {
        queue_.pop_front();  // exhausted; its caller waits only for helpers already inside
        continue;
      }
      ++job->helpers;
    }
    RunChunks(job);
    MutexLock lock(&mu_);
    RemoveFromQueue(job);  // RunChunks returned: nothing left to claim
    // Last touch of `job`: its caller may return as soon as helpers reaches 0 and mu_ is free.
    if (--job->helpers == 0) done_cv_.SignalAll();
  }
}

}  // namespace internal
}  // namespace tessera
