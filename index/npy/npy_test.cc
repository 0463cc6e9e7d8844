// Tests of the .npy reader and writer: round trips for every dtype, files written by NumPy read
// here and files written here read by NumPy (through testdata_gen.py), conversions, and malformed
// input, including a mutation loop that must never crash.
#include "tessera/npy.h"

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
#include "index/npy/npy_test_helpers.h"

namespace tessera {
namespace {

using namespace npy_testing;  // NOLINT(build/namespaces): shared test helpers

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------

// An .npy payload with the given header dict and data, in format version `major`.0.
std::string MakeNpy(absl::string_view dict, absl::string_view data, int major = 1) {
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  const uint32_t length = static_cast<uint32_t>(dict.size());
  out.append(reinterpret_cast<const char*>(&length), major == 1 ? 2 : 4);
  out.append(dict.data(), dict.size());
  out.append(data.data(), data.size());
  return out;
}

template <typename T>
std::string Bytes(const std::vector<T>& values, bool big_endian = false) {
  std::string out(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  if (big_endian) {
    for (size_t i = 0; i < out.size(); i += sizeof(T)) {
      std::reverse(out.begin() + i, out.begin() + i + sizeof(T));
    }
  }
  return out;
}

template <typename T>
std::vector<T> Values(const NpyArray& array) {
  std::vector<T> out(array.data.size() / sizeof(T));
  std::memcpy(out.data(), array.data.data(), out.size() * sizeof(T));
  return out;
}

TEST(NpyArray, NumElements) {
  NpyArray array;
  EXPECT_EQ(array.num_elements(), 1);  // 0-d.
  array.shape = {0, 128};
  EXPECT_EQ(array.num_elements(), 0);
  array.shape = {3, 4, 5};
  EXPECT_EQ(array.num_elements(), 60);
  array.shape = {3, -1};
  EXPECT_EQ(array.num_elements(), -1);
  array.shape = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_EQ(array.num_elements(), -1);
  array.shape = {int64_t{1} << 40, int64_t{1} << 40, 0};
  EXPECT_EQ(array.num_elements(), 0);
}

TEST(NpyArray, ItemSizeAndNames) {
  EXPECT_EQ(NpyItemSize(NpyDtype::kFloat32), 4u);
  EXPECT_EQ(NpyItemSize(NpyDtype::kFloat16), 2u);
  EXPECT_EQ(NpyItemSize(NpyDtype::kInt32), 4u);
  EXPECT_EQ(NpyItemSize(NpyDtype::kInt64), 8u);
  EXPECT_EQ(NpyItemSize(NpyDtype::kFloat64), 8u);
  EXPECT_EQ(NpyDtypeName(NpyDtype::kFloat16), "float16");
}

TEST(NpyArray, Factories) {
  const std::vector<float> f = {1, 2, 3, 4, 5, 6};
  NpyArray a = NpyArray::FromFloat32(2, 3, f.data());
  EXPECT_EQ(a.dtype, NpyDtype::kFloat32);
  EXPECT_THAT(a.shape, ElementsAre(2, 3));
  EXPECT_EQ(Values<float>(a), f);
  EXPECT_TRUE(a.Validate().ok());

  NpyArray b = NpyArray::FromFloat32(f);
  EXPECT_THAT(b.shape, ElementsAre(6));
  EXPECT_EQ(Values<float>(b), f);

  const std::vector<Float16> h = {FloatToHalf(1.5f), FloatToHalf(-2.0f)};
  NpyArray c = NpyArray::FromFloat16(1, 2, h.data());
  EXPECT_EQ(c.dtype, NpyDtype::kFloat16);
  EXPECT_THAT(Values<uint16_t>(c), ElementsAre(0x3e00, 0xc000));

  const std::vector<int32_t> i32 = {-1, 7, 1 << 30};
  EXPECT_EQ(Values<int32_t>(NpyArray::FromInt32(i32)), i32);
  const std::vector<int64_t> i64 = {-1, int64_t{1} << 40};
  EXPECT_EQ(Values<int64_t>(NpyArray::FromInt64(i64)), i64);

  NpyArray empty = NpyArray::FromFloat32(0, 128, nullptr);
  EXPECT_THAT(empty.shape, ElementsAre(0, 128));
  EXPECT_TRUE(empty.data.empty());
  EXPECT_TRUE(empty.Validate().ok());

  const double scalar = 2.5;
  NpyArray d = NpyArray::FromBytes(NpyDtype::kFloat64, {}, &scalar);
  EXPECT_TRUE(d.shape.empty());
  EXPECT_THAT(Values<double>(d), ElementsAre(2.5));
}

TEST(NpyArray, ValidateRejectsInconsistentArrays) {
  NpyArray array = NpyArray::FromFloat32({1.0f, 2.0f});
  array.data.pop_back();
  EXPECT_EQ(array.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(array.Validate().message(), HasSubstr("data holds 7"));
  EXPECT_EQ(SerializeNpy(array).status().code(), absl::StatusCode::kInvalidArgument);
  array.shape = {-2};
  array.data.clear();
  EXPECT_THAT(array.Validate().message(), HasSubstr("invalid shape (-2,)"));
}

TEST(NpyArray, ToFloat32) {
  EXPECT_THAT(*NpyArray::FromFloat32({1.5f, -0.25f}).ToFloat32(), ElementsAre(1.5f, -0.25f));

  // fp16: 1, -2, the largest finite value, the smallest subnormal.
  const std::vector<uint16_t> half = {0x3c00, 0xc000, 0x7bff, 0x0001};
  NpyArray f2 = NpyArray::FromBytes(NpyDtype::kFloat16, {2, 2}, half.data());
  EXPECT_THAT(*f2.ToFloat32(), ElementsAre(1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24)));

  const std::vector<double> doubles = {0.1, -1e300, 3.0};
  NpyArray f8 = NpyArray::FromBytes(NpyDtype::kFloat64, {3}, doubles.data());
  EXPECT_THAT(*f8.ToFloat32(), ElementsAre(0.1f, -INFINITY, 3.0f));

  const absl::StatusOr<std::vector<float>> ints = NpyArray::FromInt32({1}).ToFloat32();
  EXPECT_EQ(ints.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ints.status().message(), HasSubstr("int32"));
}

TEST(NpyArray, ToInt64) {
  EXPECT_THAT(*NpyArray::FromInt32({-5, 1 << 30}).ToInt64(), ElementsAre(-5, 1 << 30));
  EXPECT_THAT(*NpyArray::FromInt64({int64_t{1} << 50}).ToInt64(), ElementsAre(int64_t{1} << 50));
  EXPECT_EQ(NpyArray::FromFloat32({1.0f}).ToInt64().status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Writing and reading back.

class NpyRoundTrip : public testing::TestWithParam<NpyDtype> {};

TEST_P(NpyRoundTrip, EveryShape) {
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {1}, {7}, {3, 5}, {0, 128}, {128, 0}, {0}, {2, 3, 4}, {1, 1, 1, 1, 3}};
  for (const auto& shape : shapes) {
    const NpyArray array = ExpectedArray(GetParam(), shape);
    const absl::StatusOr<std::string> bytes = SerializeNpy(array);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    // Version 1.0 with the data 64-byte aligned.
    ASSERT_GE(bytes->size(), 10u);
    EXPECT_EQ(bytes->substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
    const size_t header_len = static_cast<uint8_t>((*bytes)[8]) | static_cast<uint8_t>((*bytes)[9])
                                                                      << 8;
    EXPECT_EQ((10 + header_len) % 64, 0u);
    EXPECT_EQ((*bytes)[10 + header_len - 1], '\n');
    EXPECT_EQ(bytes->size(), 10 + header_len + array.data.size());

    const absl::StatusOr<NpyArray> parsed = ParseNpy(*bytes);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    ExpectSameArray(*parsed, array, absl::StrCat("shape (", absl::StrJoin(shape, ","), ")"));
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, NpyRoundTrip,
                         testing::Values(NpyDtype::kFloat32, NpyDtype::kFloat16, NpyDtype::kInt32,
                                         NpyDtype::kInt64, NpyDtype::kFloat64),
                         [](const testing::TestParamInfo<NpyDtype>& info) {
                           return std::string(NpyDtypeName(info.param));
                         });

TEST(SerializeNpy, HeaderIsNumpysDict) {
  const auto header = [](const NpyArray& array) {
    const std::string bytes = *SerializeNpy(array);
    const std::string dict = bytes.substr(10, bytes.size() - 10 - array.data.size());
    return dict.substr(0, dict.find('}') + 1);
  };
  EXPECT_EQ(header(ExpectedArray(NpyDtype::kFloat32, {2, 3})),
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }");
  EXPECT_EQ(header(ExpectedArray(NpyDtype::kInt64, {5})),
            "{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }");
  EXPECT_EQ(header(ExpectedArray(NpyDtype::kFloat16, {})),
            "{'descr': '<f2', 'fortran_order': False, 'shape': (), }");
}

TEST(NpyFile, WriteThenRead) {
  ScopedTempDir dir;
  for (const Spec& spec : Specs()) {
    const NpyArray array = ExpectedArray(spec.dtype, spec.shape);
    const std::string path = dir.File(absl::StrCat(spec.name, ".npy"));
    ASSERT_TRUE(WriteNpyFile(path, array).ok());
    const absl::StatusOr<NpyArray> read = ReadNpyFile(path);
    ASSERT_TRUE(read.ok()) << read.status();
    ExpectSameArray(*read, array, spec.name);
  }
}

TEST(NpyFile, Errors) {
  ScopedTempDir dir;
  const absl::StatusOr<NpyArray> missing = ReadNpyFile(dir.File("missing.npy"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("missing.npy"));

  EXPECT_EQ(ReadNpyFile(dir.path()).status().code(), absl::StatusCode::kInvalidArgument);

  // Parse errors name the file.
  const std::string bad = dir.File("bad.npy");
  std::ofstream(bad) << "not an npy file";
  const absl::StatusOr<NpyArray> parsed = ReadNpyFile(bad);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr("bad.npy"));
  EXPECT_THAT(parsed.status().message(), HasSubstr("magic"));

  // An invalid array or an unwritable path leaves nothing behind.
  NpyArray invalid = NpyArray::FromFloat32({1.0f});
  invalid.shape = {2};
  EXPECT_EQ(WriteNpyFile(dir.File("invalid.npy"), invalid).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir.File("invalid.npy")));
  EXPECT_EQ(WriteNpyFile(dir.File("no/such/dir.npy"), NpyArray::FromFloat32({1.0f})).code(),
            absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------------------------
// Headers NumPy may write that SerializeNpy never does.

TEST(ParseNpy, FormatVersions2And3) {
  const std::vector<float> values = {1, 2, 3};
  for (int major : {2, 3}) {
    const absl::StatusOr<NpyArray> array = ParseNpy(MakeNpy(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }\n", Bytes(values), major));
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_EQ(Values<float>(*array), values);
  }
}

TEST(ParseNpy, BigEndianIsSwapped) {
  const std::vector<float> f4 = {1.5f, -2.0f, 1e-30f};
  absl::StatusOr<NpyArray> array = ParseNpy(MakeNpy(
      "{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }", Bytes(f4, /*big_endian=*/true)));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(Values<float>(*array), f4);

  const std::vector<uint16_t> f2 = {0x3c00, 0xc000, 0x0001};
  array =
      ParseNpy(MakeNpy("{'descr': '>f2', 'fortran_order': False, 'shape': (3,)}", Bytes(f2, true)));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dtype, NpyDtype::kFloat16);
  EXPECT_EQ(Values<uint16_t>(*array), f2);

  const std::vector<int64_t> i8 = {-2, int64_t{1} << 40};
  array =
      ParseNpy(MakeNpy("{'descr': '>i8', 'fortran_order': False, 'shape': (2,)}", Bytes(i8, true)));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(Values<int64_t>(*array), i8);
}

TEST(ParseNpy, NativeAndNotApplicableByteOrders) {
  const std::vector<int32_t> values = {4, -5};
  for (const char* descr : {"'=i4'", "'|i4'", "\"<i4\""}) {
    const absl::StatusOr<NpyArray> array = ParseNpy(
        MakeNpy(absl::StrCat("{'descr': ", descr, ", 'fortran_order': False, 'shape': (2,)}"),
                Bytes(values)));
    ASSERT_TRUE(array.ok()) << descr << ": " << array.status();
    EXPECT_EQ(array->dtype, NpyDtype::kInt32);
    EXPECT_EQ(Values<int32_t>(*array), values);
  }
}

TEST(ParseNpy, FortranOrderIsTransposedToCOrder) {
  // A 2 × 3 matrix: C order 0 1 2 / 3 4 5; Fortran order lists columns: 0 3 1 4 2 5.
  const std::vector<float> fortran = {0, 3, 1, 4, 2, 5};
  absl::StatusOr<NpyArray> array = ParseNpy(
      MakeNpy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", Bytes(fortran)));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->shape, ElementsAre(2, 3));
  EXPECT_THAT(Values<float>(*array), ElementsAre(0, 1, 2, 3, 4, 5));

  // 3-D, against the index arithmetic: element (a, b, c) sits at a + 2b + 6c in Fortran order.
  const int64_t A = 2, B = 3, C = 4;
  std::vector<int64_t> f_order(A * B * C), c_order(A * B * C);
  for (int64_t a = 0; a < A; ++a) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t c = 0; c < C; ++c) {
        const int64_t value = 100 * a + 10 * b + c;
        f_order[a + A * b + A * B * c] = value;
        c_order[(a * B + b) * C + c] = value;
      }
    }
  }
  array = ParseNpy(
      MakeNpy("{'descr': '<i8', 'fortran_order': True, 'shape': (2, 3, 4), }", Bytes(f_order)));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(Values<int64_t>(*array), c_order);

  // A matrix larger than the transpose's 32 × 32 tiles, and not a multiple of them.
  const int64_t rows = 70, cols = 45;
  std::vector<float> f_matrix(rows * cols), c_matrix(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      f_matrix[c * rows + r] = c_matrix[r * cols + c] = static_cast<float>(r * 1000 + c);
    }
  }
  array = ParseNpy(
      MakeNpy("{'descr': '<f4', 'fortran_order': True, 'shape': (70, 45), }", Bytes(f_matrix)));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(Values<float>(*array), c_matrix);

  // Big-endian and Fortran order at once.
  array = ParseNpy(MakeNpy("{'descr': '>f4', 'fortran_order': True, 'shape': (2, 3), }",
                           Bytes(fortran, /*big_endian=*/true)));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(Values<float>(*array), ElementsAre(0, 1, 2, 3, 4, 5));

  // 1-D and empty arrays are the same in both orders.
  array = ParseNpy(MakeNpy("{'descr': '<f4', 'fortran_order': True, 'shape': (0, 5), }", ""));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->shape, ElementsAre(0, 5));
}

TEST(ParseNpy, Python2Longs) {
  const std::vector<int32_t> values = {1, 2, 3, 4, 5, 6};
  const absl::StatusOr<NpyArray> array = ParseNpy(
      MakeNpy("{'descr': '<i4', 'fortran_order': False, 'shape': (2L, 3L), }  \n", Bytes(values)));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->shape, ElementsAre(2, 3));
}

// ---------------------------------------------------------------------------------------------
// Malformed input.

struct BadNpy {
  std::string label;
  std::string bytes;
  std::string message;  // A substring the error must contain.
};

std::string Dict(absl::string_view descr, absl::string_view fortran, absl::string_view shape) {
  return absl::StrCat("{'descr': ", descr, ", 'fortran_order': ", fortran, ", 'shape': ", shape,
                      ", }");
}

TEST(ParseNpy, RejectsMalformedInput) {
  const std::string f4x3 = Bytes(std::vector<float>{1, 2, 3});
  std::string v1_long = MakeNpy(Dict("'<f4'", "False", "(3,)"), f4x3);
  v1_long[8] = '\xff';  // Header length beyond the end.
  std::string nested(1000, '(');
  const std::vector<BadNpy> cases = {
      {"empty", "", "magic"},
      {"bad magic", std::string("\x93NUMPX\x01\x00", 8) + std::string(100, ' '), "magic"},
      {"zip file", "PK\x03\x04 not npy", "not an NPY file"},
      {"version 4.0", MakeNpy(Dict("'<f4'", "False", "(3,)"), f4x3, 4), "version 4.0"},
      {"version 1.1", std::string("\x93NUMPY\x01\x01\x10\x00", 10) + "{}", "version 1.1"},
      {"short preamble", std::string("\x93NUMPY\x01\x00\x10", 9), "truncated"},
      {"short v2 preamble", std::string("\x93NUMPY\x02\x00\x10\x00", 10), "truncated"},
      {"header past end", v1_long, "truncated: the header is"},
      {"not a dict", MakeNpy("[1, 2]", f4x3), "not a dict"},
      {"syntax", MakeNpy("{'descr': '<f4' 'shape': (3,)}", f4x3), "cannot parse"},
      {"unterminated", MakeNpy("{'descr': '<f4", f4x3), "unterminated string"},
      {"trailing junk", MakeNpy(Dict("'<f4'", "False", "(3,)") + " x", f4x3), "after the literal"},
      {"no shape", MakeNpy("{'descr': '<f4', 'fortran_order': False}", f4x3), "lacks 'shape'"},
      {"no descr", MakeNpy("{'fortran_order': False, 'shape': (3,)}", f4x3), "lacks 'descr'"},
      {"extra key",
       MakeNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'foo': 1}", f4x3),
       "unexpected key 'foo'"},
      {"object", MakeNpy(Dict("'|O'", "False", "(3,)"), f4x3), "object arrays (descr '|O')"},
      {"structured", MakeNpy(Dict("[('a', '<f4'), ('b', '<i4')]", "False", "(3,)"), f4x3),
       "structured dtype (descr [('a', '<f4'), ('b', '<i4')]) is not supported"},
      {"complex", MakeNpy(Dict("'<c8'", "False", "(3,)"), f4x3), "unsupported dtype descr '<c8'"},
      {"uint32", MakeNpy(Dict("'<u4'", "False", "(3,)"), f4x3), "'<u4'"},
      {"descr not a string", MakeNpy(Dict("7", "False", "(3,)"), f4x3), "'descr' is '7'"},
      {"fortran not bool", MakeNpy(Dict("'<f4'", "1", "(3,)"), f4x3), "'fortran_order' is '1'"},
      {"negative dim", MakeNpy(Dict("'<f4'", "False", "(-3,)"), f4x3), "'shape' is '(-3,)'"},
      {"shape not tuple", MakeNpy(Dict("'<f4'", "False", "(3)"), f4x3), "'shape' is '(3)'"},
      {"shape list", MakeNpy(Dict("'<f4'", "False", "[3]"), f4x3), "'shape' is '[3]'"},
      {"float dim", MakeNpy(Dict("'<f4'", "False", "(3.0,)"), f4x3), "cannot parse"},
      {"huge dim", MakeNpy(Dict("'<f4'", "False", "(99999999999999999999,)"), f4x3),
       "out of range"},
      {"overflow", MakeNpy(Dict("'<f8'", "False", "(4611686018427387904, 4)"), f4x3),
       "too many elements"},
      {"too deep", MakeNpy(Dict("'<f4'", "False", nested), f4x3), "nested too deeply"},
      {"short data", MakeNpy(Dict("'<f4'", "False", "(4,)"), f4x3),
       "truncated: shape (4,) of float32 needs 16 bytes of data, but the file has 12"},
      {"long data", MakeNpy(Dict("'<f4'", "False", "(2,)"), f4x3), "needs 8 bytes"},
      {"long empty", MakeNpy(Dict("'<f4'", "False", "(0, 128)"), f4x3), "needs 0 bytes"},
  };
  for (const BadNpy& bad : cases) {
    const absl::StatusOr<NpyArray> array = ParseNpy(bad.bytes, "test.npy");
    EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument) << bad.label;
    EXPECT_THAT(array.status().message(), HasSubstr("test.npy: ")) << bad.label;
    EXPECT_THAT(array.status().message(), HasSubstr(bad.message)) << bad.label;
  }
}

TEST(ParseNpy, EveryTruncationIsAnError) {
  const std::string bytes = *SerializeNpy(ExpectedArray(NpyDtype::kFloat32, {3, 4}));
  for (size_t size = 0; size < bytes.size(); ++size) {
    EXPECT_EQ(ParseNpy(absl::string_view(bytes).substr(0, size)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << "prefix of " << size << " bytes";
  }
}

TEST(ParseNpy, RandomMutationsNeverCrash) {
  const std::string valid = *SerializeNpy(ExpectedArray(NpyDtype::kFloat16, {3, 4}));
  std::mt19937 rng(12345);
  int accepted = 0;
  for (int iteration = 0; iteration < 2000; ++iteration) {
    std::string bytes = valid;
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      // Mostly the preamble and header, where the structure is.
      const size_t limit = rng() % 4 == 0 ? bytes.size() : std::min<size_t>(bytes.size(), 80);
      const char printable[] = "{}()[]',:0123456789-L TrueFalse<>|=fi248O\n";
      bytes[rng() % limit] =
          rng() % 2 == 0 ? static_cast<char>(rng()) : printable[rng() % (sizeof(printable) - 1)];
    }
    if (rng() % 8 == 0) bytes.resize(rng() % bytes.size());
    const absl::StatusOr<NpyArray> array = ParseNpy(bytes);
    if (array.ok()) {
      ++accepted;
      EXPECT_TRUE(array->Validate().ok());
    } else {
      EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument) << array.status();
    }
  }
  EXPECT_GT(accepted, 0);  // Data-only mutations parse.
}

// ---------------------------------------------------------------------------------------------
// NumPy interoperability.

TEST(NpyNumpyInterop, ReadsWhatNumpyWrites) {
  SKIP_WITHOUT_NUMPY();
  ScopedTempDir dir;
  std::string output;
  ASSERT_EQ(RunTestdataGen("write", dir.path(), &output), 0) << output;

  for (const Spec& spec : Specs()) {
    const absl::StatusOr<NpyArray> array = ReadNpyFile(dir.File(absl::StrCat(spec.name, ".npy")));
    ASSERT_TRUE(array.ok()) << array.status();
    ExpectSameArray(*array, ExpectedArray(spec.dtype, spec.shape), spec.name);
  }
  // Variants: Fortran order, big-endian, format versions 2.0 and 3.0.
  const std::vector<std::pair<std::string, int>> variants = {
      {"f4_fortran", 0}, {"i8_fortran", 3}, {"f4_big", 0}, {"f2_big", 1},
      {"i8_big", 3},     {"f4_v2", 0},      {"f4_v3", 0},
  };
  for (const auto& [file, index] : variants) {
    const Spec& spec = Specs()[index];
    const absl::StatusOr<NpyArray> array = ReadNpyFile(dir.File(file + ".npy"));
    ASSERT_TRUE(array.ok()) << array.status();
    ExpectSameArray(*array, ExpectedArray(spec.dtype, spec.shape), file);
  }
}

TEST(NpyNumpyInterop, NumpyReadsWhatWeWrite) {
  SKIP_WITHOUT_NUMPY();
  ScopedTempDir dir;
  for (const Spec& spec : Specs()) {
    ASSERT_TRUE(WriteNpyFile(dir.File(absl::StrCat(spec.name, ".npy")),
                             ExpectedArray(spec.dtype, spec.shape))
                    .ok());
  }
  std::string output;
  EXPECT_EQ(RunTestdataGen("check", dir.path(), &output), 0) << output;
  EXPECT_THAT(output, HasSubstr("checked 7 files, 0 errors"));
}

TEST(NpyNumpyInterop, CheckerCatchesWrongValues) {
  // The NumPy check must be able to fail: one flipped value is reported.
  SKIP_WITHOUT_NUMPY();
  ScopedTempDir dir;
  NpyArray wrong = ExpectedArray(NpyDtype::kInt32, {7});
  wrong.data[4] ^= 1;
  ASSERT_TRUE(WriteNpyFile(dir.File("i4.npy"), wrong).ok());
  std::string output;
  EXPECT_EQ(RunTestdataGen("check", dir.path(), &output), 1) << output;
  EXPECT_THAT(output, HasSubstr("i4.npy: values differ"));
}

}  // namespace
}  // namespace tessera
