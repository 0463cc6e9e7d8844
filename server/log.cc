#include "server/log.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tessera::server {
namespace {

std::string Quote(const std::string& text) {
  std::string out = "\"";
  for (const unsigned char c : text) {
    if (c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\", std::string(1, static_cast<char>(c)));
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

void Log(const char* level, const std::string& message,
         const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string line = absl::StrCat(
      "{\"ts\":", Quote(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone())),
      ",\"level\":", Quote(level), ",\"msg\":", Quote(message));
  for (const auto& [key, value] : fields)
    absl::StrAppend(&line, ",", Quote(key), ":", Quote(value));
  line += "}\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

LogSink ServerLogSink() {
  return [](const LogRecord& record) {
    Log(LogSeverityName(record.severity), record.message, record.fields);
  };
}

}  // namespace tessera::server
