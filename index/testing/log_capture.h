// A log sink for tests: keeps every record the library logs, so that a test can assert on the
// lines (message and fields) an event produced.
#ifndef TESSERA_INDEX_TESTING_LOG_CAPTURE_H_
#define TESSERA_INDEX_TESTING_LOG_CAPTURE_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/base/mutex.h"
#include "tessera/log.h"

namespace tessera {

// Thread-safe. sink() may outlive the LogCapture (records logged after it is gone are dropped).
class LogCapture {
 public:
  LogSink sink() const {
    return [state = state_](const LogRecord& record) {
      MutexLock lock(&state->mu);
      state->records.push_back(record);
    };
  }

  std::vector<LogRecord> records() const {
    MutexLock lock(&state_->mu);
    return state_->records;
  }

  // The records whose message is `message`, in order.
  std::vector<LogRecord> WithMessage(const std::string& message) const {
    std::vector<LogRecord> out;
    for (LogRecord& record : records()) {
      if (record.message == message) out.push_back(std::move(record));
    }
    return out;
  }

  // The value of `key` in `record`, or nullopt.
  static std::optional<std::string> Field(const LogRecord& record, const std::string& key) {
    for (const auto& [k, v] : record.fields) {
      if (k == key) return v;
    }
    return std::nullopt;
  }

  // "message key=value …", for failure messages.
  static std::string Describe(const LogRecord& record) {
    std::string out = record.message;
    for (const auto& [k, v] : record.fields) out.append(" ").append(k).append("=").append(v);
    return out;
  }
  std::string DescribeAll() const {
    std::string out;
    for (const LogRecord& record : records()) out.append(Describe(record)).append("\n");
    return out;
  }

 private:
  struct State {
    Mutex mu;
    std::vector<LogRecord> records ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace tessera

#endif  // TESSERA_INDEX_TESTING_LOG_CAPTURE_H_
