// Where the index library's log lines go (leveldb's Options::info_log): the library never writes
// to stderr itself; the binary that embeds it decides (the server routes them to its structured
// JSON log).
#ifndef TESSERA_LOG_H_
#define TESSERA_LOG_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

enum class LogSeverity { kInfo, kWarning, kError };

// One event: a short sentence without the values ("write failed", "training finished") and its
// values as key/value text ({"collection", "papers"}, {"shard", "3"}, {"documents", "64"}, …),
// so that a structured log can index them.
struct LogRecord {
  LogSeverity severity = LogSeverity::kInfo;
  std::string message;
  std::vector<std::pair<std::string, std::string>> fields;
};

// Called from any thread, concurrently: must be thread-safe. A sink must not call back into the
// engine.
using LogSink = std::function<void(const LogRecord&)>;

// The default sink: "tessera: <message> key=value …" on one line of stderr.
void LogToStderr(const LogRecord& record);

// Sends `record` to `sink`, or to LogToStderr when the sink is empty.
void Log(const LogSink& sink, const LogRecord& record);

// "info", "warning", "error".
const char* LogSeverityName(LogSeverity severity);

}  // namespace tessera

#endif  // TESSERA_LOG_H_
