// Admission control for the server's handlers. Handlers do not run on gRPC's callback threads
// (which also move the bytes of every connection): each request is handed to a fixed set of
// workers through a queue bounded in requests and in request bytes. A request counts as the
// units of work it holds (one for most, one per search for a SearchBatch), so that a batch
// cannot slip many searches past the queue's bound as one request. A request that would exceed
// either bound is refused at once with RESOURCE_EXHAUSTED naming the limit, so that overload
// turns into fast refusals a client can back off from, not into unbounded memory and latency.
// So is a request whose deadline would pass before a worker could reach it (the queue's expected
// wait, from the recent mean run time of a task): with short deadlines a deep queue would
// otherwise fill with requests that all expire while they wait, and almost nothing succeeds.
//
// It also counts open calls, so that shutdown can refuse new calls, wait for the open ones, and
// then close every connection at once (an idle client connection does not delay the exit).
#ifndef TESSERA_SERVER_ADMISSION_H_
#define TESSERA_SERVER_ADMISSION_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "tessera/base/mutex.h"

namespace tessera::server {

struct AdmissionOptions {
  int workers = 4;           // threads that run handlers; ≥ 1
  int64_t max_queued = 256;  // units of work (requests, or searches of a batch) queued; ≥ 1
  int64_t max_inflight_bytes = int64_t{1} << 30;  // request bytes queued or running; ≥ 1
};

// Thread-safe.
class Admission {
 public:
  explicit Admission(const AdmissionOptions& options);
  // Runs what is queued, then joins the workers.
  ~Admission();

  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // A call counts as open from a successful BeginCall to its EndCall (an Upsert stream from its
  // start to its end). UNAVAILABLE once draining.
  absl::Status BeginCall();
  void EndCall();

  // Queues `task` for a worker; `bytes` (the request's size) count against the byte limit until
  // the task has run, and `units` (≥ 1: the searches of a SearchBatch, else 1) against
  // max_queued while it waits. OK, or RESOURCE_EXHAUSTED naming the limit that is full, or
  // saying that the expected wait exceeds what is left of `deadline` (the task is then dropped
  // without running). A request larger than the whole byte limit is admitted when nothing else
  // is in flight, and one of more units than max_queued when nothing is queued, so that every
  // request the other limits let through can run.
  absl::Status Submit(int64_t bytes, std::function<void()> task,
                      absl::Time deadline = absl::InfiniteFuture(), int64_t units = 1);

  // Refuses new calls from now on and waits until no call is open or `deadline` passes. Returns
  // the number of calls still open.
  int64_t Drain(absl::Time deadline);

  // Units of work queued (a SearchBatch counts each of its searches).
  int64_t queued() const;
  int64_t inflight_bytes() const;
  // How long a request queued now would wait for a worker, by the recent mean run time of a
  // unit of work.
  absl::Duration ExpectedWait() const;

 private:
  struct Task {
    int64_t bytes;
    int64_t units;
    std::function<void()> run;
  };
  void WorkerLoop();
  absl::Duration ExpectedWaitLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const AdmissionOptions options_;
  mutable Mutex mu_;
  CondVar work_cv_;   // a task was queued, or stopping
  CondVar calls_cv_;  // open_calls_ dropped
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_units_ ABSL_GUARDED_BY(mu_) = 0;  // of the tasks in queue_
  int64_t inflight_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t open_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;        // tasks
  int64_t running_units_ ABSL_GUARDED_BY(mu_) = 0;  // of the running tasks
  // Exponentially weighted mean of a unit's run time (a task's over its units; weight 1/16 per
  // task).
  absl::Duration mean_run_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_ADMISSION_H_
