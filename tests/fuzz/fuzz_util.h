// Helpers shared by the fuzz targets: a check that aborts (so that libFuzzer records the input as a
// crash) when a property of a decoder fails, scratch files and directories under $TMPDIR, and a
// bit-exact comparison of attribute values.
#ifndef TESSERA_TESTS_FUZZ_FUZZ_UTIL_H_
#define TESSERA_TESTS_FUZZ_FUZZ_UTIL_H_

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <variant>

#include "absl/strings/string_view.h"
#include "tessera/document.h"

// Aborts with the condition and a message when `condition` is false: a decoder broke one of the
// properties the target checks (a round trip, an invariant of what it returned).
#define FUZZ_CHECK(condition, message)                                                           \
  do {                                                                                           \
    if (!(condition)) {                                                                          \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #condition, \
                   std::string(message).c_str());                                                \
      std::abort();                                                                              \
    }                                                                                            \
  } while (false)

namespace tessera::fuzz {

// A directory of its own under $TMPDIR (or /tmp), created on first use and removed when the
// process exits normally. scripts/fuzz points TMPDIR at a scratch directory that it removes, so
// that what a crashed run leaves behind goes too.
inline const std::string& ScratchDir() {
  static const std::string* const dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/tessera-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    auto* path = new std::string(pattern);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(*dir, ignored);
    });
    return path;
  }();
  return *dir;
}

// Replaces the file at `path` with `bytes`; aborts on an I/O error (the harness, not the code
// under test, is broken then).
inline void WriteScratchFile(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "cannot write scratch file %s\n", path.c_str());
    std::abort();
  }
}

inline absl::string_view AsStringView(const uint8_t* data, size_t size) {
  return absl::string_view(reinterpret_cast<const char*>(data), size);
}

// Whether two attribute values are the same to the bit: doubles compare by their bytes, so that a
// NaN equals itself and -0.0 differs from 0.0 (a round trip must keep both as they came).
inline bool SameBits(const AttributeValue& a, const AttributeValue& b) {
  if (a.index() != b.index()) return false;
  if (const auto* x = std::get_if<double>(&a)) {
    const double y = std::get<double>(b);
    return std::memcmp(x, &y, sizeof(y)) == 0;
  }
  return a == b;
}

}  // namespace tessera::fuzz

#endif  // TESSERA_TESTS_FUZZ_FUZZ_UTIL_H_
