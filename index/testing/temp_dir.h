// A fresh temporary directory for a test, removed with everything in it when the object goes:
// the one fixture for tests that need files (storage, shard, collection, engine, crash tests).
// Unique across processes and threads (mkdtemp under gtest's TempDir()).
#ifndef TESSERA_INDEX_TESTING_TEMP_DIR_H_
#define TESSERA_INDEX_TESTING_TEMP_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace tessera {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "tessera_test") {
    std::string pattern = ::testing::TempDir() + "/" + prefix + ".XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp " << pattern << " failed";
    }
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tessera

#endif  // TESSERA_INDEX_TESTING_TEMP_DIR_H_
