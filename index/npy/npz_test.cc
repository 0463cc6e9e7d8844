// Tests of the .npz reader and writer (on libzip): stored, deflated and ZIP64 round trips, archives
// written by numpy.savez / numpy.savez_compressed (also with every ZIP64 record) read here and
// archives written here read by NumPy (through testdata_gen.py), every kind of damage the reader
// must report, zip bombs refused from their headers, and a mutation loop that must never crash.
#include "tessera/npz.h"

#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/npy/npy_test_helpers.h"

namespace tessera {
namespace {

using namespace npy_testing;  // NOLINT(build/namespaces): shared test helpers

using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------

NpzEntries SpecEntries() {
  NpzEntries entries;
  for (const Spec& spec : Specs())
    entries.emplace_back(spec.name, ExpectedArray(spec.dtype, spec.shape));
  return entries;
}

void ExpectSameEntries(const NpzEntries& actual, const NpzEntries& expected,
                       const std::string& label) {
  ASSERT_EQ(actual.size(), expected.size()) << label;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_EQ(actual[i].first, expected[i].first) << label;
    ExpectSameArray(actual[i].second, expected[i].second,
                    absl::StrCat(label, "[", expected[i].first, "]"));
  }
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}

uint16_t Get16(const std::string& zip, size_t offset) {
  uint16_t value;
  std::memcpy(&value, zip.data() + offset, sizeof(value));
  return value;
}
uint32_t Get32(const std::string& zip, size_t offset) {
  uint32_t value;
  std::memcpy(&value, zip.data() + offset, sizeof(value));
  return value;
}
void Set16(std::string* zip, size_t offset, uint16_t value) {
  std::memcpy(&(*zip)[offset], &value, sizeof(value));
}
void Set32(std::string* zip, size_t offset, uint32_t value) {
  std::memcpy(&(*zip)[offset], &value, sizeof(value));
}

// Offsets of the structures in an archive this writer produced without ZIP64 (no comment).
size_t EndRecord(const std::string& zip) { return zip.size() - 22; }
size_t CentralEntry(const std::string& zip, int index) {
  size_t pos = Get32(zip, EndRecord(zip) + 16);
  for (int i = 0; i < index; ++i) {
    pos += 46 + Get16(zip, pos + 28) + Get16(zip, pos + 30) + Get16(zip, pos + 32);
  }
  return pos;
}
size_t LocalHeader(const std::string& zip, int index) {
  return Get32(zip, CentralEntry(zip, index) + 42);
}
// Where a member's data starts, after its local header's name and extra field.
size_t LocalData(const std::string& zip, int index) {
  const size_t local = LocalHeader(zip, index);
  return local + 30 + Get16(zip, local + 26) + Get16(zip, local + 28);
}
// Rewrites a member's CRC-32, compressed size and size in both its local header and its central
// directory entry (archives without ZIP64), as a consistent writer would have written them.
void SetDeclared(std::string* zip, int index, uint32_t crc, uint32_t compressed, uint32_t size) {
  for (const size_t at : {LocalHeader(*zip, index) + 14, CentralEntry(*zip, index) + 16}) {
    Set32(zip, at, crc);
    Set32(zip, at + 4, compressed);
    Set32(zip, at + 8, size);
  }
}
uint32_t DeclaredCrc(const std::string& zip, int index) {
  return Get32(zip, CentralEntry(zip, index) + 16);
}
uint32_t DeclaredCompressed(const std::string& zip, int index) {
  return Get32(zip, CentralEntry(zip, index) + 20);
}
uint32_t DeclaredSize(const std::string& zip, int index) {
  return Get32(zip, CentralEntry(zip, index) + 24);
}

// Two small members: "a.npy" (float32 2 × 3) and "b.npy" (int32, 4).
NpzEntries TwoArrays() {
  return {{"a", ExpectedArray(NpyDtype::kFloat32, {2, 3})},
          {"b", ExpectedArray(NpyDtype::kInt32, {4})}};
}

// NumPy's archives with every ZIP64 record (testdata_gen.py writes them with zipfile's ZIP64 limits
// at 0, as zipfile does for members past 4 GiB), by name; empty without NumPy.
const std::vector<std::pair<std::string, std::string>>& NumpyZip64Archives() {
  static const auto* const kArchives = [] {
    auto* out = new std::vector<std::pair<std::string, std::string>>;
    if (!HaveNumpy()) return out;
    ScopedTempDir dir;
    std::string output;
    if (RunTestdataGen("write", dir.path(), &output) != 0) {
      ADD_FAILURE() << output;
      return out;
    }
    for (const char* file : {"zip64.npz", "zip64_compressed.npz"}) {
      std::ifstream in(dir.File(file), std::ios::binary);
      out->emplace_back(file, std::string(std::istreambuf_iterator<char>(in), {}));
    }
    return out;
  }();
  return *kArchives;
}

// The archives the damage loops start from: ours, stored and deflated, and NumPy's ZIP64 ones.
std::vector<std::pair<std::string, std::string>> ValidArchives() {
  std::vector<std::pair<std::string, std::string>> archives = {
      {"stored", *SerializeNpz(TwoArrays(), false)},
      {"deflated", *SerializeNpz(TwoArrays(), true)}};
  for (const auto& archive : NumpyZip64Archives()) archives.push_back(archive);
  return archives;
}

// ---------------------------------------------------------------------------------------------
// Writing and reading back.

class NpzRoundTrip : public testing::TestWithParam<bool> {};

TEST_P(NpzRoundTrip, AllSpecArrays) {
  const bool compress = GetParam();
  const NpzEntries entries = SpecEntries();
  const absl::StatusOr<std::string> zip = SerializeNpz(entries, compress);
  ASSERT_TRUE(zip.ok()) << zip.status();
  const absl::StatusOr<NpzEntries> parsed = ParseNpz(*zip);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ExpectSameEntries(*parsed, entries, "spec arrays");
  // Every member uses the requested method.
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(Get16(*zip, CentralEntry(*zip, static_cast<int>(i)) + 10), compress ? 8 : 0);
  }
}

TEST_P(NpzRoundTrip, Files) {
  ScopedTempDir dir;
  const std::string path = dir.File("arrays.npz");
  const NpzEntries entries = SpecEntries();
  ASSERT_TRUE(WriteNpzFile(path, entries, GetParam()).ok());
  const absl::StatusOr<NpzEntries> read = ReadNpzFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameEntries(*read, entries, path);
}

TEST_P(NpzRoundTrip, LargeMember) {
  // 4 MiB, several times zlib's internal buffers.
  std::vector<float> values(1024 * 1024);
  std::mt19937 rng(7);
  for (float& v : values) v = static_cast<float>(rng() % 1000) / 8.0f;
  const NpzEntries entries = {{"big", NpyArray::FromFloat32(1024, 1024, values.data())}};
  const absl::StatusOr<NpzEntries> parsed = ParseNpz(*SerializeNpz(entries, GetParam()));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ExpectSameEntries(*parsed, entries, "big");
}

// An archive of more than 65535 members needs the ZIP64 end records, as a member or an offset past
// 4 GiB does: written and read back without 4 GiB of data.
TEST(SerializeNpz, Zip64ForManyMembers) {
  NpzEntries entries;
  for (int i = 0; i < 65536; ++i) {
    entries.emplace_back(absl::StrCat("a", i), NpyArray::FromInt32({i, -i}));
  }
  const absl::StatusOr<std::string> zip = SerializeNpz(entries);
  ASSERT_TRUE(zip.ok()) << zip.status();
  const size_t end = zip->size() - 22;
  ASSERT_EQ(Get32(*zip, end), 0x06054b50u);
  EXPECT_EQ(Get16(*zip, end + 10), 0xffff);       // The count is in the ZIP64 record.
  EXPECT_EQ(Get32(*zip, end - 20), 0x07064b50u);  // Its locator.
  const absl::StatusOr<NpzEntries> parsed = ParseNpz(*zip);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ExpectSameEntries(*parsed, entries, "65536 members");
}

INSTANTIATE_TEST_SUITE_P(StoredAndDeflated, NpzRoundTrip, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Deflated" : "Stored");
                         });

TEST(SerializeNpz, EmptyArchive) {
  const std::string zip = *SerializeNpz({});
  EXPECT_EQ(zip.size(), 22u);
  const absl::StatusOr<NpzEntries> parsed = ParseNpz(zip);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->empty());
}

TEST(SerializeNpz, DeflateCompresses) {
  const std::vector<float> zeros(64 * 128, 0.0f);
  const NpzEntries entries = {{"zeros", NpyArray::FromFloat32(64, 128, zeros.data())}};
  const std::string stored = *SerializeNpz(entries, false);
  const std::string deflated = *SerializeNpz(entries, true);
  EXPECT_GT(stored.size(), zeros.size() * sizeof(float));
  EXPECT_LT(deflated.size(), 1000u);
}

TEST(SerializeNpz, RejectsBadEntries) {
  const NpyArray array = NpyArray::FromFloat32({1.0f});
  NpyArray invalid = array;
  invalid.shape = {3};
  const std::vector<std::pair<NpzEntries, std::string>> cases = {
      {{{"a", array}, {"a", array}}, "duplicate .npz entry name 'a'"},
      {{{"", array}}, "invalid .npz entry name ''"},
      {{{std::string("a\0b", 3), array}}, "without NUL"},
      {{{std::string(70000, 'x'), array}}, "expected 1 to 65531 bytes"},
      {{{"bad", invalid}}, ".npz entry 'bad': shape (3,) of float32 needs"},
  };
  ScopedTempDir dir;
  for (const auto& [entries, message] : cases) {
    const absl::StatusOr<std::string> zip = SerializeNpz(entries);
    EXPECT_EQ(zip.status().code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(zip.status().message(), HasSubstr(message));
    const std::string path = dir.File("bad.npz");
    EXPECT_EQ(WriteNpzFile(path, entries).code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_FALSE(std::filesystem::exists(path)) << message;
  }
}

TEST(NpzFile, Errors) {
  ScopedTempDir dir;
  const absl::StatusOr<NpzEntries> missing = ReadNpzFile(dir.File("missing.npz"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("missing.npz"));

  std::string zip = *SerializeNpz(TwoArrays());
  zip[LocalData(zip, 1) + 70] ^= 0x40;  // In b's .npy header: the CRC-32 is reported first.
  WriteBytes(dir.File("corrupt.npz"), zip);
  const absl::StatusOr<NpzEntries> corrupt = ReadNpzFile(dir.File("corrupt.npz"));
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(corrupt.status().message()),
              HasSubstr("corrupt.npz' member 'b.npy': CRC-32 mismatch"));
}

// ---------------------------------------------------------------------------------------------
// Damage.

struct Damage {
  std::string label;
  bool compress;
  std::function<void(std::string*)> apply;
  std::string message;  // A substring the error must contain.
};

// What libzip 1.7.3 says of damage to the ZIP structure: it has no finer error codes (1.8 added
// details), so these messages name the archive but not the field.
const char kInconsistent[] =
    "damaged or unsupported ZIP archive (libzip: Zip archive inconsistent)";
const char kNotAZip[] =
    "not a ZIP archive, or its central directory is damaged (libzip: Not a zip archive)";

TEST(ParseNpz, ReportsDamage) {
  const auto rename_b = [](std::string* zip, bool local, bool central, absl::string_view name) {
    if (local) std::memcpy(&(*zip)[LocalHeader(*zip, 1) + 30], name.data(), 5);
    if (central) std::memcpy(&(*zip)[CentralEntry(*zip, 1) + 46], name.data(), 5);
  };
  const std::vector<Damage> cases = {
      {"central CRC", false, [](std::string* z) { (*z)[CentralEntry(*z, 0) + 17] ^= 1; },
       kInconsistent},
      {
          "local size",
          true,
          [](std::string* z) { Set32(z, LocalHeader(*z, 1) + 22, DeclaredSize(*z, 1) + 1000); },
          kInconsistent,
      },
      {"both CRCs", false,
       [](std::string* z) {
         SetDeclared(z, 0, DeclaredCrc(*z, 0) ^ 0x100, DeclaredCompressed(*z, 0),
                     DeclaredSize(*z, 0));
       },
       "member 'a.npy': CRC-32 mismatch"},
      {"stored data", false,
       [](std::string* z) { (*z)[LocalHeader(*z, 1) - 1] ^= 0x10; },  // a's last data byte.
       "member 'a.npy': CRC-32 mismatch"},
      {"deflated data", true, [](std::string* z) { (*z)[LocalData(*z, 0) + 20] ^= 0x55; },
       "member 'a.npy': "},
      {"bzip2", false,
       [](std::string* z) {
         Set16(z, LocalHeader(*z, 1) + 8, 12);
         Set16(z, CentralEntry(*z, 1) + 10, 12);
       },
       "member 'b.npy': uses compression method 12 (bzip2); expected 0 (stored"},
      {"encrypted", false, [](std::string* z) { Set16(z, CentralEntry(*z, 0) + 8, 1); },
       "member 'a.npy': is encrypted"},
      {"duplicate", false, [&](std::string* z) { rename_b(z, true, true, "a.npy"); },
       "member 'a.npy' appears more than once"},
      {"not npy", false, [&](std::string* z) { rename_b(z, true, true, "b.npx"); },
       "member 'b.npx': is not a .npy file"},
      {"local name", false, [&](std::string* z) { rename_b(z, true, false, "c.npy"); },
       kInconsistent},
      {"local offset", false,
       [](std::string* z) { Set32(z, CentralEntry(*z, 1) + 42, 0x7fffffff); }, kNotAZip},
      {"local signature", false, [](std::string* z) { Set32(z, CentralEntry(*z, 1) + 42, 1); },
       kNotAZip},
      {"stored sizes", false,
       [](std::string* z) {
         SetDeclared(z, 0, DeclaredCrc(*z, 0), DeclaredCompressed(*z, 0), DeclaredSize(*z, 0) + 1);
       },
       "is stored but its compressed size"},
      {"past the end", false,
       [](std::string* z) {
         SetDeclared(z, 1, DeclaredCrc(*z, 1), 0x7ffffff0, DeclaredSize(*z, 1));
       },
       kNotAZip},
      {"bomb", true,
       [](std::string* z) {
         SetDeclared(z, 0, DeclaredCrc(*z, 0), DeclaredCompressed(*z, 0), 0xfffffff0);
       },
       "more than deflate can produce"},
      // a's .npy header says 24 bytes of data follow it: a declared size one byte off disagrees
      // with it, found before the data is inflated.
      {"size disagrees with the shape", true,
       [](std::string* z) {
         SetDeclared(z, 0, DeclaredCrc(*z, 0), DeclaredCompressed(*z, 0), DeclaredSize(*z, 0) - 1);
       },
       "member 'a.npy': truncated: shape (2, 3) of float32 needs 24 bytes of data, but the ZIP "
       "directory declares 23"},
      {"truncated deflate", true,
       [](std::string* z) {
         SetDeclared(z, 0, DeclaredCrc(*z, 0), DeclaredCompressed(*z, 0) / 2, DeclaredSize(*z, 0));
       },
       "member 'a.npy': "},
      {"zip64 marker", false,
       [](std::string* z) { Set32(z, CentralEntry(*z, 0) + 24, 0xffffffff); },
       "libzip cannot read its central directory"},
      {"entry signature", false, [](std::string* z) { (*z)[CentralEntry(*z, 1)] = 'X'; }, kNotAZip},
      {"entry count", false,
       [](std::string* z) {
         Set16(z, EndRecord(*z) + 8, 1000);
         Set16(z, EndRecord(*z) + 10, 1000);
       },
       kInconsistent},
      {"split", false, [](std::string* z) { Set16(z, EndRecord(*z) + 8, 1); }, kNotAZip},
      {"directory offset", false, [](std::string* z) { Set32(z, EndRecord(*z) + 16, 0x10000000); },
       kInconsistent},
      {"comment length", false, [](std::string* z) { Set16(z, EndRecord(*z) + 20, 5); },
       kInconsistent},
      {"trailing npy damage", false,
       [](std::string* z) {
         // b's header says shape (5,) instead of (4,), with the CRC fixed up: a .npy error.
         const size_t local = LocalHeader(*z, 1);
         const size_t header = LocalData(*z, 1);
         const size_t shape = z->find("(4,)", header);
         (*z)[shape + 1] = '5';
         const size_t size = Get32(*z, local + 18);
         const uint32_t crc = static_cast<uint32_t>(
             crc32_z(0, reinterpret_cast<const Bytef*>(z->data() + header), size));
         Set32(z, local + 14, crc);
         Set32(z, CentralEntry(*z, 1) + 16, crc);
       },
       "member 'b.npy': truncated: shape (5,) of int32 needs 20 bytes of data, but the file has "
       "16"},
  };
  for (const Damage& damage : cases) {
    std::string zip = *SerializeNpz(TwoArrays(), damage.compress);
    ASSERT_TRUE(ParseNpz(zip).ok());
    damage.apply(&zip);
    const absl::StatusOr<NpzEntries> parsed = ParseNpz(zip, "test.npz");
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << damage.label;
    EXPECT_THAT(parsed.status().message(), HasSubstr("test.npz")) << damage.label;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(damage.message)) << damage.label;
  }
}

// ---------------------------------------------------------------------------------------------
// Zip bombs: archives whose declared sizes lie, refused from their headers.

// `head` followed by `zeros` zero bytes, raw-deflated as one stream (zeros fed 1 MiB at a time, so
// that a test can build a member of hundreds of MiB without holding it).
std::string DeflateWithZeros(const std::string& head, size_t zeros) {
  z_stream stream;
  std::memset(&stream, 0, sizeof(stream));
  EXPECT_EQ(deflateInit2(&stream, Z_BEST_SPEED, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY),
            Z_OK);
  const std::vector<char> zero_block(1 << 20, '\0');
  std::string out;
  std::vector<char> buffer(1 << 16);
  auto pump = [&](const char* data, size_t size, int flush) {
    stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data));
    stream.avail_in = static_cast<uInt>(size);
    do {
      stream.next_out = reinterpret_cast<Bytef*>(buffer.data());
      stream.avail_out = static_cast<uInt>(buffer.size());
      deflate(&stream, flush);
      out.append(buffer.data(), buffer.size() - stream.avail_out);
    } while (stream.avail_out == 0 || stream.avail_in > 0);
  };
  pump(head.data(), head.size(), Z_NO_FLUSH);
  for (size_t left = zeros; left > 0;) {
    const size_t chunk = std::min(left, zero_block.size());
    pump(zero_block.data(), chunk, Z_NO_FLUSH);
    left -= chunk;
  }
  pump(nullptr, 0, Z_FINISH);
  deflateEnd(&stream);
  return out;
}

// An archive of one deflated member NAME.npy holding `compressed`, whose local header and central
// directory both declare `size` bytes with CRC-32 `crc`: consistent headers that may lie about
// what the data inflates to.
std::string OneDeflatedMember(const std::string& name, const std::string& compressed, uint32_t crc,
                              uint32_t size) {
  auto put16 = [](std::string* out, uint16_t v) { out->append(reinterpret_cast<char*>(&v), 2); };
  auto put32 = [](std::string* out, uint32_t v) { out->append(reinterpret_cast<char*>(&v), 4); };
  const std::string file = name + ".npy";
  std::string zip;
  put32(&zip, 0x04034b50);
  for (uint16_t v : {20, 0, 8, 0, 33}) put16(&zip, v);  // version, flags, deflated, time, date
  put32(&zip, crc);
  put32(&zip, static_cast<uint32_t>(compressed.size()));
  put32(&zip, size);
  put16(&zip, static_cast<uint16_t>(file.size()));
  put16(&zip, 0);
  zip += file + compressed;
  const uint32_t directory = static_cast<uint32_t>(zip.size());
  put32(&zip, 0x02014b50);
  for (uint16_t v : {20, 20, 0, 8, 0, 33}) put16(&zip, v);  // made by, needed, flags, …
  put32(&zip, crc);
  put32(&zip, static_cast<uint32_t>(compressed.size()));
  put32(&zip, size);
  for (int v : {static_cast<int>(file.size()), 0, 0, 0, 0}) put16(&zip, v);
  put32(&zip, 0);  // external attributes
  put32(&zip, 0);  // local header offset
  zip += file;
  const uint32_t directory_size = static_cast<uint32_t>(zip.size()) - directory;
  put32(&zip, 0x06054b50);
  for (uint16_t v : {0, 0, 1, 1}) put16(&zip, v);
  put32(&zip, directory_size);
  put32(&zip, directory);
  put16(&zip, 0);
  return zip;
}

uint32_t CrcOf(absl::string_view bytes) {
  return static_cast<uint32_t>(
      crc32_z(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

// The .npy preamble and header of a float32 array of `shape`, without data.
std::string NpyHeaderOf(std::vector<int64_t> shape) {
  NpyArray array;
  array.shape = std::move(shape);
  return internal::NpyHeaderBytes(array);
}

TEST(ParseNpzBomb, SmallDeclaredSizeThatInflatesLarge) {
  // A valid 2 × 3 member declared as such, whose deflate stream goes on with 64 MiB of zeros.
  const std::string npy = *SerializeNpy(ExpectedArray(NpyDtype::kFloat32, {2, 3}));
  const std::string compressed = DeflateWithZeros(npy, size_t{64} << 20);
  ASSERT_LT(compressed.size(), 1u << 20);  // a small archive: 64 MiB deflate to ~290 KB
  const std::string zip =
      OneDeflatedMember("bomb", compressed, CrcOf(npy), static_cast<uint32_t>(npy.size()));
  internal::NpzReadStats stats;
  const absl::StatusOr<NpzEntries> parsed =
      internal::ParseNpzForTesting(zip, "bomb.npz", {}, &stats);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr(absl::StrCat("bomb.npz member 'bomb.npy': inflates to more than the ",
                                     npy.size(), " bytes the directory says; stopped there")));
  // Refused after one byte past the declared size, in a buffer of the declared size.
  EXPECT_LE(stats.inflated_bytes, npy.size() + 1);
  EXPECT_LE(stats.largest_buffer_bytes, npy.size());
}

TEST(ParseNpzBomb, DeclaredSizeThatDisagreesWithTheShape) {
  // The header says 2 × 3 float32 (24 bytes of data); the directory declares 200 MiB more, which
  // the stream does inflate to: refused from the first MiB, the rest never inflated.
  const std::string header = NpyHeaderOf({2, 3});
  const size_t zeros = size_t{200} << 20;
  const std::string compressed = DeflateWithZeros(header, zeros);
  const uint32_t size = static_cast<uint32_t>(header.size() + zeros);
  const std::string zip = OneDeflatedMember("bomb", compressed, 0, size);
  internal::NpzReadStats stats;
  const absl::StatusOr<NpzEntries> parsed =
      internal::ParseNpzForTesting(zip, "bomb.npz", {}, &stats);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr(absl::StrCat("bomb.npz member 'bomb.npy': shape (2, 3) of float32 needs 24 "
                                     "bytes of data, but the ZIP directory declares ",
                                     zeros)));
  EXPECT_LE(stats.inflated_bytes, uint64_t{1} << 20);
  EXPECT_LE(stats.largest_buffer_bytes, uint64_t{1} << 20);
}

TEST(ParseNpzBomb, ArrayOverTheLimitIsRefusedBeforeItIsInflated) {
  // A consistent member of 16 MiB of zeros (4096 × 1024 float32): within no limit it reads; over
  // max_array_bytes it is refused from its header.
  const std::string header = NpyHeaderOf({4096, 1024});
  const size_t data = size_t{16} << 20;
  const std::string compressed = DeflateWithZeros(header, data);
  const std::string zeros(data, '\0');
  const uint32_t crc = static_cast<uint32_t>(
      crc32_z(CrcOf(header), reinterpret_cast<const Bytef*>(zeros.data()), zeros.size()));
  const std::string zip =
      OneDeflatedMember("big", compressed, crc, static_cast<uint32_t>(header.size() + data));

  const absl::StatusOr<NpzEntries> unlimited = ParseNpz(zip);
  ASSERT_TRUE(unlimited.ok()) << unlimited.status();
  EXPECT_THAT((*unlimited)[0].second.shape, testing::ElementsAre(4096, 1024));

  NpzLimits limits;
  limits.max_array_bytes = data - 1;
  limits.array_limit_hint = "--max-document-bytes";
  internal::NpzReadStats stats;
  const absl::StatusOr<NpzEntries> limited =
      internal::ParseNpzForTesting(zip, "big.npz", limits, &stats);
  EXPECT_EQ(limited.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(limited.status().message()),
              HasSubstr(absl::StrCat("big.npz member 'big.npy': its array of float32 (4096, 1024) "
                                     "holds 16777216 bytes, more than the limit of ",
                                     data - 1, " bytes per array (--max-document-bytes)")));
  EXPECT_LE(stats.inflated_bytes, uint64_t{1} << 20);
  EXPECT_LE(stats.largest_buffer_bytes, uint64_t{1} << 20);
}

TEST(ParseNpzBomb, TotalOverTheLimitIsRefusedBeforeAnythingIsInflated) {
  const std::string zip = *SerializeNpz(TwoArrays(), /*compress=*/true);
  NpzLimits limits;
  limits.max_total_bytes = 200;  // a.npy declares 152 bytes, b.npy 144
  limits.total_limit_hint = "this machine's memory";
  internal::NpzReadStats stats;
  const absl::StatusOr<NpzEntries> parsed =
      internal::ParseNpzForTesting(zip, "two.npz", limits, &stats);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr("two.npz: its members declare more than the limit of 200 bytes in all "
                        "(this machine's memory) (2 members; the limit is passed at member "
                        "'b.npy' of 144 bytes)"));
  EXPECT_EQ(stats.inflated_bytes, 0u);
  limits.max_total_bytes = 296;
  EXPECT_TRUE(ParseNpz(zip, "two.npz", limits).ok());
}

TEST(ParseNpzBomb, StreamShorterThanDeclared) {
  // 1000 float32 declared (header + 4000 bytes), but the stream ends 200 bytes into the data.
  const std::string header = NpyHeaderOf({1000});
  const std::string compressed = DeflateWithZeros(header, 200);
  const std::string zip =
      OneDeflatedMember("short", compressed, 0, static_cast<uint32_t>(header.size() + 4000));
  const absl::StatusOr<NpzEntries> parsed = ParseNpz(zip, "short.npz");
  EXPECT_THAT(
      std::string(parsed.status().message()),
      HasSubstr(absl::StrCat("short.npz member 'short.npy': inflates to ", header.size() + 200,
                             " bytes, but the directory says ", header.size() + 4000)));
}

TEST(ParseNpz, ReportsZip64Damage) {
  if (NumpyZip64Archives().empty()) GTEST_SKIP() << "needs NumPy's ZIP64 archives";
  const std::string valid = NumpyZip64Archives()[0].second;
  ASSERT_TRUE(ParseNpz(valid).ok());
  const size_t locator = valid.size() - 22 - 20;
  const size_t record = locator - 56;
  ASSERT_EQ(Get32(valid, locator), 0x07064b50u);
  ASSERT_EQ(Get32(valid, record), 0x06064b50u);
  // The first central entry's ZIP64 extra field: id 1, length 16 (its two sizes; its offset, 0,
  // is not saturated).
  const size_t entry = Get32(valid, record + 48);
  const size_t extra = entry + 46 + Get16(valid, entry + 28);
  ASSERT_EQ(Get16(valid, extra), 1);
  ASSERT_EQ(Get16(valid, extra + 2), 16);

  const std::vector<std::tuple<std::string, std::function<void(std::string*)>, std::string>> cases =
      {
          {"locator offset", [&](std::string* z) { Set32(z, locator + 8, 0x7fffffff); },
           kInconsistent},
          {"record signature", [&](std::string* z) { (*z)[record] = 'X'; }, kInconsistent},
          {"record count", [&](std::string* z) { Set32(z, record + 32, 3); },
           "multi-disk (split) ZIP archives are not supported"},
          {"extra too short", [&](std::string* z) { Set16(z, extra + 2, 8); }, kInconsistent},
          {"extra overruns", [&](std::string* z) { Set16(z, extra + 2, 200); }, kInconsistent},
          {"no extra", [&](std::string* z) { Set16(z, extra, 7); },
           "libzip cannot read its central directory"},
          {"extra size", [&](std::string* z) { (*z)[extra + 4] ^= 0x20; }, kInconsistent},
          {"extra compressed size", [&](std::string* z) { (*z)[extra + 4 + 8] ^= 0x01; },
           kInconsistent},
      };
  for (const auto& [label, apply, message] : cases) {
    std::string zip = valid;
    apply(&zip);
    const absl::StatusOr<NpzEntries> parsed = ParseNpz(zip, "zip64.npz");
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << label;
    EXPECT_THAT(parsed.status().message(), HasSubstr("zip64.npz")) << label;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(message)) << label;
  }
}

TEST(ParseNpz, NotAZipFile) {
  for (const std::string& bytes :
       {std::string(), std::string("PK"), std::string(100, '\0'), std::string(70000, 'x'),
        *SerializeNpy(NpyArray::FromFloat32({1.0f}))}) {
    const absl::StatusOr<NpzEntries> parsed = ParseNpz(bytes);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr("not a ZIP archive"));
  }
}

TEST(ParseNpz, EveryTruncationIsAnError) {
  for (const auto& [label, zip] : ValidArchives()) {
    for (size_t size = 0; size < zip.size(); ++size) {
      EXPECT_EQ(ParseNpz(absl::string_view(zip).substr(0, size)).status().code(),
                absl::StatusCode::kInvalidArgument)
          << "prefix of " << size << " bytes of " << label;
    }
  }
}

TEST(ParseNpz, RandomMutationsNeverCrash) {
  std::mt19937 rng(2024);
  for (const auto& [label, valid] : ValidArchives()) {
    {
      int rejected = 0;
      for (int iteration = 0; iteration < 2000; ++iteration) {
        std::string zip = valid;
        const int mutations = 1 + static_cast<int>(rng() % 6);
        for (int m = 0; m < mutations; ++m) {
          size_t pos;
          switch (rng() % 3) {
            case 0:  // The directory and end records, where the offsets are.
              pos = zip.size() - 1 - rng() % std::min<size_t>(zip.size(), 250);
              break;
            case 1:  // The first local header and .npy header.
              pos = rng() % std::min<size_t>(zip.size(), 120);
              break;
            default:
              pos = rng() % zip.size();
          }
          const uint8_t interesting[] = {0x00, 0xff, 0x7f, 0x80, 0x01, 0xfe};
          zip[pos] = static_cast<char>(rng() % 2 == 0 ? rng() : interesting[rng() % 6]);
        }
        if (rng() % 10 == 0) zip.resize(rng() % zip.size());
        const absl::StatusOr<NpzEntries> parsed = ParseNpz(zip);
        if (parsed.ok()) {
          for (const auto& [name, array] : *parsed) EXPECT_TRUE(array.Validate().ok()) << name;
        } else {
          ++rejected;
          EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << parsed.status();
        }
      }
      // Most mutations are caught; the rest hit fields that readers ignore (times, attributes).
      EXPECT_GT(rejected, 1500) << label;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// NumPy interoperability.

TEST(NpzNumpyInterop, ReadsWhatNumpyWrites) {
  SKIP_WITHOUT_NUMPY();
  ScopedTempDir dir;
  std::string output;
  ASSERT_EQ(RunTestdataGen("write", dir.path(), &output), 0) << output;
  const NpzEntries expected = SpecEntries();
  for (const char* file :
       {"savez.npz", "savez_compressed.npz", "zip64.npz", "zip64_compressed.npz"}) {
    const absl::StatusOr<NpzEntries> read = ReadNpzFile(dir.File(file));
    ASSERT_TRUE(read.ok()) << read.status();
    ExpectSameEntries(*read, expected, file);
  }
}

TEST(NpzNumpyInterop, NumpyReadsWhatWeWrite) {
  SKIP_WITHOUT_NUMPY();
  ScopedTempDir dir;
  const NpzEntries entries = SpecEntries();
  ASSERT_TRUE(WriteNpzFile(dir.File("stored.npz"), entries, false).ok());
  ASSERT_TRUE(WriteNpzFile(dir.File("deflated.npz"), entries, true).ok());
  std::string output;
  EXPECT_EQ(RunTestdataGen("check", dir.path(), &output), 0) << output;
  EXPECT_THAT(output, HasSubstr("checked 2 files, 0 errors"));
}

TEST(NpzNumpyInterop, CheckerCatchesBadCrc) {
  // The NumPy check must be able to fail: Python's zipfile rejects a member whose data no longer
  // matches its CRC-32.
  SKIP_WITHOUT_NUMPY();
  ScopedTempDir dir;
  std::string zip = *SerializeNpz(SpecEntries());
  zip[LocalHeader(zip, 1) - 1] ^= 0x10;  // The last byte of f4's data.
  WriteBytes(dir.File("stored.npz"), zip);
  std::string output;
  EXPECT_NE(RunTestdataGen("check", dir.path(), &output), 0) << output;
  EXPECT_THAT(output, HasSubstr("Bad CRC-32"));
}

}  // namespace
}  // namespace tessera
