#include "server/admission.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera::server {

Admission::Admission(const AdmissionOptions& options) : options_(options) {
  workers_.reserve(options_.workers);
  for (int i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

Admission::~Admission() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_cv_.SignalAll();
  for (std::thread& worker : workers_) worker.join();
}

absl::Status Admission::BeginCall() {
  MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("the server is shutting down; retry elsewhere");
  ++open_calls_;
  return absl::OkStatus();
}

void Admission::EndCall() {
  {
    MutexLock lock(&mu_);
    --open_calls_;
  }
  calls_cv_.SignalAll();
}

absl::Status Admission::Submit(int64_t bytes, std::function<void()> task, absl::Time deadline,
                               int64_t units) {
  {
    MutexLock lock(&mu_);
    const absl::Duration wait = ExpectedWaitLocked();
    const absl::Duration left = deadline - absl::Now();
    if (wait > absl::ZeroDuration() && wait > left) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "server busy: the ", queued_units_, " queued requests need about ",
          absl::ToInt64Milliseconds(wait), " ms before a worker is free, more than the ",
          absl::ToInt64Milliseconds(left), " ms left of the call's deadline; retry with backoff"));
    }
    if (queued_units_ > 0 && queued_units_ + units > options_.max_queued) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "server busy: ", queued_units_, " requests already wait for a worker",
          units > 1 ? absl::StrCat(" and this one counts as ", units, " (one per search)") : "",
          " (--max_queued_requests ", options_.max_queued, "); retry with backoff"));
    }
    if (inflight_bytes_ > 0 && inflight_bytes_ + bytes > options_.max_inflight_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("server busy: ", inflight_bytes_, " request bytes in flight + ", bytes,
                       " would exceed --max_inflight_bytes ", options_.max_inflight_bytes,
                       "; retry with backoff"));
    }
    inflight_bytes_ += bytes;
    queued_units_ += units;
    queue_.push_back(Task{bytes, units, std::move(task)});
  }
  work_cv_.Signal();
  return absl::OkStatus();
}

void Admission::WorkerLoop() {
  while (true) {
    Task task;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) work_cv_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
      queued_units_ -= task.units;
      ++running_;
      running_units_ += task.units;
    }
    const absl::Time start = absl::Now();
    task.run();
    const absl::Duration ran = absl::Now() - start;
    MutexLock lock(&mu_);
    --running_;
    running_units_ -= task.units;
    inflight_bytes_ -= task.bytes;
    mean_run_ += (ran / task.units - mean_run_) / 16;
  }
}

absl::Duration Admission::ExpectedWaitLocked() const {
  // Every queued unit and the remaining half of every running one, shared by the workers.
  if (static_cast<int64_t>(queue_.size()) + running_ < options_.workers) {
    return absl::ZeroDuration();
  }
  return mean_run_ * (static_cast<double>(queued_units_) + 0.5 * running_units_) / options_.workers;
}

absl::Duration Admission::ExpectedWait() const {
  ReaderMutexLock lock(&mu_);
  return ExpectedWaitLocked();
}

int64_t Admission::Drain(absl::Time deadline) {
  MutexLock lock(&mu_);
  draining_ = true;
  while (open_calls_ > 0) {
    if (calls_cv_.WaitWithTimeout(&mu_, deadline - absl::Now())) break;
  }
  return open_calls_;
}

int64_t Admission::queued() const {
  ReaderMutexLock lock(&mu_);
  return queued_units_;
}

int64_t Admission::inflight_bytes() const {
  ReaderMutexLock lock(&mu_);
  return inflight_bytes_;
}

}  // namespace tessera::server
