// What the files under a directory occupy on disk, measured by the test itself (lstat's st_blocks ×
// 512, preallocated space included, as du counts it) rather than with the code under test's own
// accounting (AllocatedBytes in index/common/file_io.h), so that a test can check one against the
// other.
#ifndef TESSERA_INDEX_TESTING_ALLOCATED_BYTES_H_
#define TESSERA_INDEX_TESTING_ALLOCATED_BYTES_H_

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace tessera {

// The allocated bytes of the regular files under `dir`, recursively.
inline int64_t MeasureAllocatedBytes(const std::string& dir) {
  int64_t total = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    struct stat st;
    if (::lstat(entry.path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      total += static_cast<int64_t>(st.st_blocks) * 512;
    }
  }
  return total;
}

}  // namespace tessera

#endif  // TESSERA_INDEX_TESTING_ALLOCATED_BYTES_H_
