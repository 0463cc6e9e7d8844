// Tests of the structured log's line format: every field, and escaping that gives valid JSON for
// any bytes (control characters, quotes, invalid UTF-8); and of the sink through which the
// engine's own log lines reach it.
#include "server/log.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/engine.h"

namespace tessera::server {
namespace {

TEST(FormatLogLine, WritesEveryField) {
  const absl::Time time = absl::FromUnixMillis(1796083200123);  // 2026-12-01T00:00:00.123Z
  EXPECT_EQ(
      FormatLogLine(time, "warning", "write failed", {{"collection", "papers"}, {"shard", "3"}}),
      "{\"ts\":\"2026-12-01T00:00:00.123Z\",\"level\":\"warning\",\"msg\":\"write failed\","
      "\"collection\":\"papers\",\"shard\":\"3\"}\n");
}

TEST(JsonQuote, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(JsonQuote("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(JsonQuote(std::string("\0\n\t\x1f\x7f", 5)), "\"\\u0000\\u000a\\u0009\\u001f\\u007f\"");
}

TEST(JsonQuote, KeepsValidUtf8AndReplacesEveryInvalidByte) {
  EXPECT_EQ(JsonQuote("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
  // A lone continuation byte, a truncated sequence, an overlong '/', a surrogate, past U+10FFFF.
  EXPECT_EQ(JsonQuote("a\x80z"), "\"a\\ufffdz\"");
  EXPECT_EQ(JsonQuote("\xe2\x82"), "\"\\ufffd\\ufffd\"");
  EXPECT_EQ(JsonQuote("\xc0\xaf"), "\"\\ufffd\\ufffd\"");
  EXPECT_EQ(JsonQuote("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");
  EXPECT_EQ(JsonQuote("\xf4\x90\x80\x80"), "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");
  EXPECT_EQ(JsonQuote("\xff"), "\"\\ufffd\"");
}

// The engine logs through EngineOptions::log; the server's sink makes its records structured JSON
// lines on stderr, as the server's own: here the line an engine writes when it finds a collection
// whose schema file is corrupt.
TEST(ServerLogSink, WritesTheEnginesRecordsAsJsonLines) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "server_log_sink_test";
  fs::remove_all(dir);
  {
    auto engine = Engine::Open(dir.string());
    ASSERT_TRUE(engine.ok()) << engine.status();
    CollectionSchema schema;
    schema.name = "papers";
    schema.dim = 8;
    ASSERT_TRUE((*engine)->CreateCollection(schema).ok());
  }
  int corrupted = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.path().filename() == "schema") {
      std::ofstream(entry.path(), std::ios::trunc) << "not a schema";
      ++corrupted;
    }
  }
  ASSERT_EQ(corrupted, 1);
  EngineOptions options;
  options.log = ServerLogSink();
  ::testing::internal::CaptureStderr();
  auto engine = Engine::Open(dir.string(), options);
  const std::string written = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_THAT(written, ::testing::MatchesRegex(
                           "\\{\"ts\":\"[0-9T:.Z-]+\",\"level\":\"error\",\"msg\":\"collection "
                           "unavailable\",\"collection\":\"papers\",\"directory\":\"[^\"]+\","
                           "\"error\":\"[^\"]+\"\\}\n"));
  engine->reset();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera::server
