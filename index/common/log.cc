// The default log sink and the helpers every library module logs through.
#include "tessera/log.h"

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace tessera {

const char* LogSeverityName(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kInfo:
      return "info";
    case LogSeverity::kWarning:
      return "warning";
    case LogSeverity::kError:
      return "error";
  }
  return "info";
}

void LogToStderr(const LogRecord& record) {
  std::string line =
      absl::StrCat("tessera: ", LogSeverityName(record.severity), ": ", record.message);
  for (const auto& [key, value] : record.fields) absl::StrAppend(&line, " ", key, "=", value);
  line += "\n";
  // One write per line, so that lines of concurrent threads do not interleave.
  std::fwrite(line.data(), 1, line.size(), stderr);
}

void Log(const LogSink& sink, const LogRecord& record) {
  if (sink) {
    sink(record);
  } else {
    LogToStderr(record);
  }
}

}  // namespace tessera
