// Tests of the ingest resume journal and the document content hash.
#include "client/cli/ingest_journal.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::client {
namespace {

using ::testing::HasSubstr;

class JournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("tessera_journal_test_", ::getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "docs.npz.tessera-ingest").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Contents() {
    std::ifstream in(path_, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  void WriteContents(const std::string& text) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out << text;
  }

  std::filesystem::path dir_;
  std::string path_;
};

TEST(Hash64, IsDeterministicAndSpreadsSmallChanges) {
  EXPECT_EQ(Hash64("hello"), Hash64("hello"));
  EXPECT_NE(Hash64("hello"), Hash64("hellp"));
  EXPECT_NE(Hash64("hello", 1), Hash64("hello", 2));
  EXPECT_NE(Hash64(""), Hash64(std::string(1, '\0')));
  // Every length class of the tail loop.
  std::string text = "0123456789abcdef0";
  for (size_t n = 0; n < text.size(); ++n) {
    EXPECT_NE(Hash64(text.substr(0, n)), Hash64(text.substr(0, n + 1))) << n;
  }
}

TEST(DocumentContentHash, CoversBytesShapeDtypeLayoutAndAttributes) {
  const std::string bytes(32, '\x01');
  const std::vector<int64_t> shape = {2, 4};
  const uint64_t base = DocumentContentHash("float32", shape, bytes, std::nullopt, {});
  EXPECT_EQ(base, DocumentContentHash("float32", shape, bytes, std::nullopt, {}));

  std::string changed = bytes;
  changed[31] = '\x02';
  EXPECT_NE(base, DocumentContentHash("float32", shape, changed, std::nullopt, {}));
  EXPECT_NE(base,
            DocumentContentHash("float32", std::vector<int64_t>{4, 2}, bytes, std::nullopt, {}));
  EXPECT_NE(base,
            DocumentContentHash("float16", std::vector<int64_t>{4, 4}, bytes, std::nullopt, {}));
  EXPECT_NE(base, DocumentContentHash("float32", shape, bytes, PatchLayout{1, 2, 0, 0}, {}));
  EXPECT_NE(DocumentContentHash("float32", shape, bytes, PatchLayout{1, 2, 0, 0}, {}),
            DocumentContentHash("float32", shape, bytes, PatchLayout{1, 2, 0, 1}, {}));

  const Attributes year_int = {{"year", int64_t{2020}}};
  const Attributes year_double = {{"year", 2020.0}};
  const Attributes year_string = {{"year", std::string("2020")}};
  const uint64_t a = DocumentContentHash("float32", shape, bytes, std::nullopt, year_int);
  EXPECT_NE(a, base);
  EXPECT_NE(a, DocumentContentHash("float32", shape, bytes, std::nullopt, year_double));
  EXPECT_NE(a, DocumentContentHash("float32", shape, bytes, std::nullopt, year_string));
  // Field names and values do not run together.
  EXPECT_NE(DocumentContentHash("float32", shape, bytes, std::nullopt, {{"ab", std::string("c")}}),
            DocumentContentHash("float32", shape, bytes, std::nullopt, {{"a", std::string("bc")}}));
}

// A sparse vector changes the hash; none leaves it as it was before sparse vectors existed.
TEST(DocumentContentHash, CoversTheSparseVector) {
  const std::string bytes(32, '\x01');
  const std::vector<int64_t> shape = {2, 4};
  const uint64_t base = DocumentContentHash("float32", shape, bytes, std::nullopt, {});
  EXPECT_EQ(base, DocumentContentHash("float32", shape, bytes, std::nullopt, {}, std::nullopt));
  const uint64_t sparse =
      DocumentContentHash("float32", shape, bytes, std::nullopt, {}, SparseVector{{1}, {2.0f}});
  EXPECT_NE(sparse, base);
  EXPECT_NE(sparse, DocumentContentHash("float32", shape, bytes, std::nullopt, {},
                                        SparseVector{{1}, {3.0f}}));
  EXPECT_NE(sparse, DocumentContentHash("float32", shape, bytes, std::nullopt, {},
                                        SparseVector{{2}, {2.0f}}));
  EXPECT_NE(base, DocumentContentHash("float32", shape, bytes, std::nullopt, {}, SparseVector{}));
}

TEST(JournalIds, EscapeRoundTrips) {
  const std::vector<std::string> ids = {
      "plain",       "with space", "per%cent", "tab\tnew\nline", std::string("nul\0byte", 8),
      "caf\xc3\xa9", "\x7f"};
  for (const std::string& id : ids) {
    const std::string escaped = EscapeJournalId(id);
    EXPECT_EQ(escaped.find_first_of(" \n\t\r"), std::string::npos) << escaped;
    absl::StatusOr<std::string> back = UnescapeJournalId(escaped);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, id);
  }
  EXPECT_EQ(EscapeJournalId("a b%"), "a%20b%25");
  EXPECT_FALSE(UnescapeJournalId("bad%2").ok());
  EXPECT_FALSE(UnescapeJournalId("bad%zz").ok());
}

TEST_F(JournalTest, RecordsAndReopens) {
  {
    auto journal = IngestJournal::Open(path_, "papers", /*reset=*/false);
    ASSERT_TRUE(journal.ok()) << journal.status();
    EXPECT_EQ((*journal)->size(), 0u);
    ASSERT_TRUE((*journal)->Append({{"a", 1}, {"b c", 0xfedcba9876543210ULL}}).ok());
    ASSERT_TRUE((*journal)->Append({{"a", 2}}).ok());  // a later entry replaces
    EXPECT_TRUE((*journal)->Contains("a", 2));
    EXPECT_FALSE((*journal)->Contains("a", 1));
  }
  EXPECT_EQ(Contents(),
            "# tessera-ingest journal v1 collection=papers\n"
            "a 0000000000000001\n"
            "b%20c fedcba9876543210\n"
            "a 0000000000000002\n");
  auto journal = IngestJournal::Open(path_, "papers", false);
  ASSERT_TRUE(journal.ok()) << journal.status();
  EXPECT_EQ((*journal)->size(), 2u);
  EXPECT_TRUE((*journal)->Contains("a", 2));
  EXPECT_FALSE((*journal)->Contains("a", 1));
  EXPECT_TRUE((*journal)->Contains("b c", 0xfedcba9876543210ULL));
  EXPECT_FALSE((*journal)->Contains("missing", 1));
}

TEST_F(JournalTest, DropsATornLastLineAndAppendsOnANewLine) {
  WriteContents(
      "# tessera-ingest journal v1 collection=papers\n"
      "a 0000000000000001\n"
      "b 00000000");  // killed mid-append
  {
    auto journal = IngestJournal::Open(path_, "papers", false);
    ASSERT_TRUE(journal.ok()) << journal.status();
    EXPECT_EQ((*journal)->size(), 1u);
    EXPECT_FALSE((*journal)->Contains("b", 0));
    ASSERT_TRUE((*journal)->Append({{"c", 3}}).ok());
  }
  EXPECT_EQ(Contents(),
            "# tessera-ingest journal v1 collection=papers\n"
            "a 0000000000000001\n"
            "c 0000000000000003\n");
  // A header torn before its newline is an empty journal.
  WriteContents("# tessera-ingest jour");
  auto journal = IngestJournal::Open(path_, "papers", false);
  ASSERT_TRUE(journal.ok()) << journal.status();
  EXPECT_EQ((*journal)->size(), 0u);
  EXPECT_EQ(Contents(), "# tessera-ingest journal v1 collection=papers\n");
}

TEST_F(JournalTest, BelongsToOneCollection) {
  ASSERT_TRUE(IngestJournal::Open(path_, "papers", false).ok());
  absl::Status other = IngestJournal::Open(path_, "images", false).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.message(), HasSubstr("'papers'"));
  EXPECT_THAT(other.message(), HasSubstr("--no-resume"));
  // --no-resume starts it over for the new collection.
  auto reset = IngestJournal::Open(path_, "images", /*reset=*/true);
  ASSERT_TRUE(reset.ok()) << reset.status();
  EXPECT_EQ(Contents(), "# tessera-ingest journal v1 collection=images\n");
}

TEST_F(JournalTest, ResetForgetsEverything) {
  auto journal = IngestJournal::Open(path_, "papers", false);
  ASSERT_TRUE(journal.ok());
  ASSERT_TRUE((*journal)->Append({{"a", 1}}).ok());
  ASSERT_TRUE((*journal)->Reset().ok());
  EXPECT_EQ((*journal)->size(), 0u);
  ASSERT_TRUE((*journal)->Append({{"b", 2}}).ok());
  EXPECT_EQ(Contents(),
            "# tessera-ingest journal v1 collection=papers\n"
            "b 0000000000000002\n");
}

TEST_F(JournalTest, RejectsForeignAndMalformedFiles) {
  WriteContents("id,hash\n");
  EXPECT_EQ(IngestJournal::Open(path_, "papers", false).status().code(),
            absl::StatusCode::kInvalidArgument);
  WriteContents("# tessera-ingest journal v1 collection=papers\nonlyid\n");
  absl::Status status = IngestJournal::Open(path_, "papers", false).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("line 2"));
  WriteContents("# tessera-ingest journal v1 collection=papers\na 12345\n");
  EXPECT_FALSE(IngestJournal::Open(path_, "papers", false).ok());
  EXPECT_EQ(
      IngestJournal::Open((dir_ / "no" / "such" / "dir").string(), "papers", false).status().code(),
      absl::StatusCode::kNotFound);
}

TEST_F(JournalTest, ConcurrentAppendsKeepWholeLines) {
  {
    auto journal = IngestJournal::Open(path_, "papers", false);
    ASSERT_TRUE(journal.ok());
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 25; ++i) {
          ASSERT_TRUE((*journal)->Append({{absl::StrCat("t", t, "-", i), uint64_t(i)}}).ok());
        }
      });
    }
    for (auto& thread : threads) thread.join();
    EXPECT_EQ((*journal)->size(), 100u);
  }
  auto journal = IngestJournal::Open(path_, "papers", false);
  ASSERT_TRUE(journal.ok()) << journal.status();
  EXPECT_EQ((*journal)->size(), 100u);
  EXPECT_TRUE((*journal)->Contains("t3-24", 24));
  EXPECT_EQ((*journal)->SampleIds(3).size(), 3u);
}

}  // namespace
}  // namespace tessera::client
