// Progress lines and the reporter thread.
#include "client/cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace tessera::client {

std::string FormatEta(absl::Duration duration) {
  int64_t seconds = absl::ToInt64Seconds(absl::Ceil(duration, absl::Seconds(1)));
  if (seconds < 0) seconds = 0;
  const int64_t hours = seconds / 3600;
  const int64_t minutes = (seconds / 60) % 60;
  seconds %= 60;
  if (hours > 0) return absl::StrFormat("%d:%02d:%02d", hours, minutes, seconds);
  return absl::StrFormat("%d:%02d", minutes, seconds);
}

std::string FormatProgressLine(absl::string_view label, uint64_t done, uint64_t total,
                               absl::Duration elapsed, int bar_width) {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;
  std::string eta = "?";
  if (done >= total) {
    eta = "0:00";
  } else if (rate > 0) {
    eta = FormatEta(absl::Seconds(static_cast<double>(total - done) / rate));
  }
  const double fraction = total == 0 ? 1.0 : std::min(1.0, static_cast<double>(done) / total);
  const std::string rate_text =
      rate >= 100 ? absl::StrFormat("%.0f", rate) : absl::StrFormat("%.1f", rate);
  if (bar_width > 0) {
    const int filled = static_cast<int>(std::floor(fraction * bar_width));
    return absl::StrCat(label, " [", std::string(filled, '#'), std::string(bar_width - filled, ' '),
                        "] ", done, "/", total, " docs  ", rate_text, " docs/s  ETA ", eta);
  }
  return absl::StrCat(label, ": ", done, "/", total, " docs (",
                      static_cast<int>(std::floor(fraction * 100)), "%), ", rate_text,
                      " docs/s, ETA ", eta);
}

ProgressReporter::ProgressReporter(std::string label, uint64_t total, bool enabled, FILE* out)
    : label_(std::move(label)),
      total_(total),
      enabled_(enabled),
      out_(out),
      tty_(enabled && ::isatty(::fileno(out)) == 1),
      start_(absl::Now()) {
  if (enabled_) thread_ = std::thread([this] { Loop(); });
}

ProgressReporter::~ProgressReporter() { Finish(); }

void ProgressReporter::Add(uint64_t done) {
  MutexLock lock(&mu_);
  done_ += done;
}

void ProgressReporter::Loop() {
  // A terminal redraws often; a log gets a line every few seconds.
  const absl::Duration period = tty_ ? absl::Milliseconds(200) : absl::Seconds(2);
  MutexLock lock(&mu_);
  while (true) {
    // One period, cut short by Finish().
    const absl::Time deadline = absl::Now() + period;
    bool timed_out = false;
    while (!stop_ && !timed_out) timed_out = stop_cv_.WaitWithTimeout(&mu_, deadline - absl::Now());
    if (stop_) return;
    Print(/*final=*/false);
  }
}

void ProgressReporter::Print(bool final) {
  const std::string line =
      FormatProgressLine(label_, done_, total_, absl::Now() - start_, tty_ ? 30 : 0);
  if (tty_) {
    std::fprintf(out_, "\r%s\033[K%s", line.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void ProgressReporter::Finish() {
  {
    MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    stop_ = true;
    stop_cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  if (enabled_) {
    MutexLock lock(&mu_);
    Print(/*final=*/true);
  }
}

}  // namespace tessera::client
