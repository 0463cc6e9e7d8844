// Structured logs: one JSON object per line on stderr.
#ifndef TESSERA_SERVER_LOG_H_
#define TESSERA_SERVER_LOG_H_

#include <string>
#include <utility>
#include <vector>

#include "tessera/log.h"

namespace tessera::server {

// Writes {"ts":…,"level":level,"msg":message,key:value,…}; values are written as JSON strings.
void Log(const char* level, const std::string& message,
         const std::vector<std::pair<std::string, std::string>>& fields = {});

// The index library's sink (EngineOptions::log) that writes its records as Log() lines.
LogSink ServerLogSink();

}  // namespace tessera::server

#endif  // TESSERA_SERVER_LOG_H_
