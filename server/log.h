// Structured logs: one JSON object per line on stderr. Written by hand rather than with spdlog:
// spdlog does not escape JSON, so it would only add the timestamp and the fwrite around the
// escaping this file must do anyway (measured: 2.2-2.5 µs a line with spdlog 1.10, 2.8-3.0 µs
// without, for a line of four fields; both far below what a logged event costs).
#ifndef TESSERA_SERVER_LOG_H_
#define TESSERA_SERVER_LOG_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "tessera/log.h"

namespace tessera::server {

// Writes {"ts":…,"level":level,"msg":message,key:value,…}; values are written as JSON strings.
// Thread-safe: a line is written whole.
void Log(const char* level, const std::string& message,
         const std::vector<std::pair<std::string, std::string>>& fields = {});

// The index library's sink (EngineOptions::log) that writes its records as Log() lines.
LogSink ServerLogSink();

// The line Log() writes at `time` (UTC, milliseconds), with its trailing newline.
std::string FormatLogLine(absl::Time time, absl::string_view level, absl::string_view message,
                          const std::vector<std::pair<std::string, std::string>>& fields);

// `text` as a JSON string, quotes included: '"' and '\' escaped, control characters (and DEL) as
// \u00XX, each byte that is not part of well-formed UTF-8 as \ufffd, so that any bytes give valid
// JSON text.
std::string JsonQuote(absl::string_view text);

}  // namespace tessera::server

#endif  // TESSERA_SERVER_LOG_H_
