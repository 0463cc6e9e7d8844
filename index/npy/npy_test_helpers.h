// Test helpers shared by npy_test.cc and npz_test.cc: the arrays testdata_gen.py writes, a scoped
// temporary directory, and running testdata_gen.py with Debian's python3.
#ifndef TESSERA_INDEX_NPY_NPY_TEST_HELPERS_H_
#define TESSERA_INDEX_NPY_NPY_TEST_HELPERS_H_

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/npy.h"

#ifndef TESSERA_PYTHON
#define TESSERA_PYTHON "/usr/bin/python3"
#endif

namespace tessera::npy_testing {

// The arrays of testdata_gen.py, in its order.
struct Spec {
  const char* name;
  NpyDtype dtype;
  std::vector<int64_t> shape;
};
inline const std::vector<Spec>& Specs() {
  static const auto* specs = new std::vector<Spec>{
      {"f4", NpyDtype::kFloat32, {4, 6}}, {"f2", NpyDtype::kFloat16, {5, 3}},
      {"i4", NpyDtype::kInt32, {7}},      {"i8", NpyDtype::kInt64, {2, 3, 4}},
      {"f8", NpyDtype::kFloat64, {6}},    {"empty", NpyDtype::kFloat32, {0, 128}},
      {"scalar", NpyDtype::kFloat64, {}},
  };
  return *specs;
}

// Element i (in C order) is a known function of i; testdata_gen.py computes the same bits.
inline NpyArray ExpectedArray(NpyDtype dtype, std::vector<int64_t> shape) {
  NpyArray array;
  array.dtype = dtype;
  array.shape = std::move(shape);
  const int64_t count = array.num_elements();
  array.data.resize(static_cast<size_t>(count) * array.itemsize());
  for (int64_t i = 0; i < count; ++i) {
    uint8_t* out = array.data.data() + i * array.itemsize();
    const double real = static_cast<double>(i) * 0.1 - 3.0;
    switch (dtype) {
      case NpyDtype::kFloat32: {
        const float value = static_cast<float>(real);
        std::memcpy(out, &value, sizeof(value));
        break;
      }
      case NpyDtype::kFloat16: {
        const Float16 value = FloatToHalf(static_cast<float>(real));
        std::memcpy(out, &value, sizeof(value));
        break;
      }
      case NpyDtype::kFloat64:
        std::memcpy(out, &real, sizeof(real));
        break;
      case NpyDtype::kInt32: {
        const int32_t value = static_cast<int32_t>(i * 7919 - 100000);
        std::memcpy(out, &value, sizeof(value));
        break;
      }
      case NpyDtype::kInt64: {
        const int64_t value = i * 3000000019LL - 7;
        std::memcpy(out, &value, sizeof(value));
        break;
      }
    }
  }
  return array;
}

inline void ExpectSameArray(const NpyArray& actual, const NpyArray& expected,
                            const std::string& label) {
  EXPECT_EQ(actual.dtype, expected.dtype) << label;
  EXPECT_EQ(actual.shape, expected.shape) << label;
  EXPECT_TRUE(actual.data == expected.data) << label << ": data differs";
}

// A fresh directory under testing::TempDir(), removed at the end of the test.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    std::string name =
        absl::StrCat("tessera_npy_", info->test_suite_name(), "_", info->name(), "_", getpid());
    std::replace(name.begin(), name.end(), '/', '_');
    path_ = std::filesystem::path(testing::TempDir()) / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScopedTempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string path() const { return path_.string(); }
  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline bool HaveNumpy() {
  return std::filesystem::exists(TESSERA_PYTHON) &&
         std::system(
             absl::StrCat("'", TESSERA_PYTHON, "' -c 'import numpy' >/dev/null 2>&1").c_str()) == 0;
}

// Runs `testdata_gen.py COMMAND DIR`; returns its exit status (-1 if it did not exit) and puts
// its output in `output`.
inline int RunTestdataGen(const std::string& command, const std::string& dir, std::string* output) {
  const std::string line = absl::StrCat("'", TESSERA_PYTHON, "' '", TESSERA_NPY_TESTDATA_GEN, "' ",
                                        command, " '", dir, "' 2>&1");
  std::FILE* pipe = popen(line.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output->append(buffer, got);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#define SKIP_WITHOUT_NUMPY()                                            \
  if (!HaveNumpy()) {                                                   \
    GTEST_SKIP() << TESSERA_PYTHON                                      \
                 << " with numpy is not available; skipping the NumPy " \
                    "interoperability test";                            \
  }

}  // namespace tessera::npy_testing

#endif  // TESSERA_INDEX_NPY_NPY_TEST_HELPERS_H_
