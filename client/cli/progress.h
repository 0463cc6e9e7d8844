// The progress display of long `tessera` commands on stderr: a bar redrawn in place when stderr is
// a terminal, plain periodic lines otherwise (logs, CI), with done/total, rate and ETA.
#ifndef TESSERA_CLIENT_CLI_PROGRESS_H_
#define TESSERA_CLIENT_CLI_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "tessera/base/mutex.h"

namespace tessera::client {

// One progress line: "[#####     ] 150/300 docs  1234 docs/s  ETA 0:05" for a terminal
// (`bar_width` > 0), "label: 150/300 docs (50%), 1234 docs/s, ETA 0:05" otherwise. The rate is the
// average since the start; before anything is done the ETA reads "?".
std::string FormatProgressLine(absl::string_view label, uint64_t done, uint64_t total,
                               absl::Duration elapsed, int bar_width);
// "1:02:03" / "2:03" / "0:05".
std::string FormatEta(absl::Duration duration);

// Reports the progress of `total` units of work from a background thread. Thread-safe: any thread
// may call Add.
class ProgressReporter {
 public:
  // Disabled (`enabled` false) it prints nothing. `out` is usually stderr; whether it is a terminal
  // decides the style.
  ProgressReporter(std::string label, uint64_t total, bool enabled, FILE* out = stderr);
  ~ProgressReporter();  // Finish()
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  void Add(uint64_t done) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the thread and prints the final state once. Idempotent.
  void Finish() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  void Print(bool final) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string label_;
  const uint64_t total_;
  const bool enabled_;
  FILE* const out_;
  const bool tty_;
  const absl::Time start_;
  Mutex mu_;
  // Signalled when stop_ is set.
  CondVar stop_cv_;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_CLI_PROGRESS_H_
