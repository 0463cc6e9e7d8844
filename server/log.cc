#include "server/log.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tessera::server {
namespace {

// The length of the well-formed UTF-8 sequence (RFC 3629: no overlong forms, no surrogates, at
// most U+10FFFF) at the start of `text`, or 0 if it does not start with one.
size_t Utf8SequenceLength(absl::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  size_t length;
  unsigned char low = 0x80, high = 0xbf;  // The range of the second byte.
  if (lead < 0x80) return 1;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  } else {
    return 0;
  }
  if (text.size() < length || byte(1) < low || byte(1) > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xbf) return 0;
  }
  return length;
}

}  // namespace

std::string JsonQuote(absl::string_view text) {
  std::string out = "\"";
  out.reserve(text.size() + 2);
  while (!text.empty()) {
    const unsigned char c = static_cast<unsigned char>(text[0]);
    const size_t length = Utf8SequenceLength(text);
    if (length == 0) {
      out += "\\ufffd";  // Not UTF-8: one replacement character per byte.
      text.remove_prefix(1);
      continue;
    }
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out.append(text.data(), length);
    }
    text.remove_prefix(length);
  }
  return out + "\"";
}

std::string FormatLogLine(absl::Time time, absl::string_view level, absl::string_view message,
                          const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string line = absl::StrCat(
      "{\"ts\":", JsonQuote(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone())),
      ",\"level\":", JsonQuote(level), ",\"msg\":", JsonQuote(message));
  for (const auto& [key, value] : fields) {
    absl::StrAppend(&line, ",", JsonQuote(key), ":", JsonQuote(value));
  }
  line += "}\n";
  return line;
}

void Log(const char* level, const std::string& message,
         const std::vector<std::pair<std::string, std::string>>& fields) {
  const std::string line = FormatLogLine(absl::Now(), level, message, fields);
  // One fwrite per line: stdio's lock keeps concurrent lines whole.
  std::fwrite(line.data(), 1, line.size(), stderr);
}

LogSink ServerLogSink() {
  return [](const LogRecord& record) {
    Log(LogSeverityName(record.severity), record.message, record.fields);
  };
}

}  // namespace tessera::server
