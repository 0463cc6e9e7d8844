// A full disk: the engine's data directory lives on a tmpfs of a few MiB that the test mounts,
// beside a filler file; documents are ingested one by one until a write fails. The failing write
// must say the disk is full (RESOURCE_EXHAUSTED naming the path), every acknowledged document
// must stay readable (Get and Search) while the disk is full and after a reopen, and once the
// filler is deleted, writes must be accepted again without reopening the engine. Each failed write
// and the resumption are logged through the engine's sink.
//
// Needs to mount a tmpfs (root or CAP_SYS_ADMIN); skipped otherwise.
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/testing/log_capture.h"
#include "tests/integration/fault_test_util.h"

namespace tessera::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// 8 MiB, of which the filler takes 5: the documents fill about 3 MiB. Resuming after the disk was
// full flushes the memtables (all of it here) to SST files, so the filler is larger than that.
constexpr char kTmpfsSize[] = "size=8m";
constexpr int64_t kFillerBytes = int64_t{5} << 20;
constexpr int64_t kTokens = 128;  // 32 KiB of fp32 rerank vectors per document

// A tmpfs mounted at a fresh directory, unmounted (lazily) and removed on destruction.
class Tmpfs {
 public:
  // Null, with the reason in *why, when the mount is not permitted.
  static std::unique_ptr<Tmpfs> Mount(std::string* why) {
    static int counter = 0;
    const fs::path dir =
        fs::path(::testing::TempDir()) / absl::StrCat("disk_full_", ::getpid(), "_", counter++);
    fs::create_directories(dir);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, kTmpfsSize) != 0) {
      *why = absl::StrCat("cannot mount a tmpfs at ", dir.string(), ": ", std::strerror(errno),
                          " (the test needs root or CAP_SYS_ADMIN)");
      fs::remove(dir);
      return nullptr;
    }
    return std::unique_ptr<Tmpfs>(new Tmpfs(dir));
  }
  ~Tmpfs() {
    ::umount2(dir_.c_str(), MNT_DETACH);
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  const fs::path& dir() const { return dir_; }

 private:
  explicit Tmpfs(fs::path dir) : dir_(std::move(dir)) {}
  fs::path dir_;
};

class DiskFullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    tmpfs_ = Tmpfs::Mount(&why);
    if (tmpfs_ == nullptr) GTEST_SKIP() << why;
    data_dir_ = (tmpfs_->dir() / "data").string();
    filler_ = tmpfs_->dir() / "filler";
    std::ofstream out(filler_, std::ios::binary);
    const std::string block(1 << 20, 'f');
    for (int64_t written = 0; written < kFillerBytes; written += block.size()) out << block;
    out.flush();
    ASSERT_TRUE(out.good());
  }

  absl::StatusOr<std::unique_ptr<Engine>> OpenEngine() {
    EngineOptions options;
    options.log = log_.sink();
    return Engine::Open(data_dir_, options);
  }

  // Ingests documents one by one until a write fails; the acknowledged ones go into
  // acknowledged_, the failing write's status is returned and its document id kept.
  absl::Status FillDisk(Collection& collection) {
    for (int i = 0; i < 10'000; ++i) {
      Document document = FaultDocument(absl::StrCat("doc", i), kTokens);
      absl::Status status = UpsertOne(collection, document);
      if (!status.ok()) {
        failed_id_ = document.id;
        return status;
      }
      acknowledged_.emplace(document.id, std::move(document));
    }
    return absl::InternalError("the disk never filled up");
  }

  void ExpectDiskFull(const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    EXPECT_THAT(status.message(), HasSubstr("disk full"));
    EXPECT_THAT(status.message(), HasSubstr(data_dir_));
  }

  std::unique_ptr<Tmpfs> tmpfs_;
  std::string data_dir_;
  fs::path filler_;
  std::map<std::string, Document> acknowledged_;
  std::string failed_id_;
  LogCapture log_;
};

TEST_F(DiskFullTest, WritesFailCleanlyAndResumeOnceSpaceIsFreedWithoutReopening) {
  {
    absl::StatusOr<std::unique_ptr<Engine>> engine = OpenEngine();
    ASSERT_TRUE(engine.ok()) << engine.status();
    absl::StatusOr<std::shared_ptr<Collection>> collection =
        (*engine)->CreateCollection(FaultSchema("full"));
    ASSERT_TRUE(collection.ok()) << collection.status();

    const absl::Status full = FillDisk(**collection);
    std::printf("full after %zu documents: %s\n", acknowledged_.size(), full.ToString().c_str());
    ExpectDiskFull(full);
    ASSERT_GE(acknowledged_.size(), 20u) << full;
    // A full disk used to log nothing (only documents_total{outcome="rejected"} moved).
    const std::vector<LogRecord> failed = log_.WithMessage("write failed");
    ASSERT_EQ(failed.size(), 1u) << log_.DescribeAll();
    EXPECT_EQ(failed[0].severity, LogSeverity::kError);
    EXPECT_EQ(LogCapture::Field(failed[0], "collection"), "full");
    EXPECT_EQ(LogCapture::Field(failed[0], "shard"), "0");
    EXPECT_EQ(LogCapture::Field(failed[0], "operation"), "upsert");
    EXPECT_EQ(LogCapture::Field(failed[0], "documents"), "1");
    EXPECT_EQ(LogCapture::Field(failed[0], "code"), "RESOURCE_EXHAUSTED");
    EXPECT_EQ(LogCapture::Field(failed[0], "error"), std::string(full.message()));

    // While the disk is full: reads work, writes keep failing the same way (and nothing crashes).
    ExpectExactly(**collection, acknowledged_, {failed_id_}, "disk full");
    ExpectDiskFull(UpsertOne(**collection, FaultDocument("while_full", kTokens)));
    ExpectDiskFull((*collection)->Delete({"doc0"}).status());
    const std::vector<LogRecord> failed_while_full = log_.WithMessage("write failed");
    ASSERT_EQ(failed_while_full.size(), 3u) << log_.DescribeAll();
    EXPECT_EQ(LogCapture::Field(failed_while_full[2], "operation"), "delete");

    // Space is freed: the next write resumes the database, in the same engine.
    fs::remove(filler_);
    Document after = FaultDocument("after_free", kTokens);
    const absl::Status resumed = UpsertOne(**collection, after);
    ASSERT_TRUE(resumed.ok()) << resumed;
    const std::vector<LogRecord> resumption =
        log_.WithMessage("disk space is available again, writes resumed");
    ASSERT_EQ(resumption.size(), 1u) << log_.DescribeAll();
    EXPECT_EQ(LogCapture::Field(resumption[0], "collection"), "full");
    EXPECT_EQ(LogCapture::Field(resumption[0], "shard"), "0");
    acknowledged_.emplace(after.id, std::move(after));
    ExpectExactly(**collection, acknowledged_, {failed_id_, "while_full"}, "after resume");
  }
  absl::StatusOr<std::unique_ptr<Engine>> engine = OpenEngine();
  ASSERT_TRUE(engine.ok()) << engine.status();
  absl::StatusOr<std::shared_ptr<Collection>> collection = (*engine)->GetCollection("full");
  ASSERT_TRUE(collection.ok()) << collection.status();
  ExpectExactly(**collection, acknowledged_, {failed_id_, "while_full"}, "after reopen");
}

TEST_F(DiskFullTest, AcknowledgedDocumentsSurviveClosingAndReopeningWhileFull) {
  {
    absl::StatusOr<std::unique_ptr<Engine>> engine = OpenEngine();
    ASSERT_TRUE(engine.ok()) << engine.status();
    absl::StatusOr<std::shared_ptr<Collection>> collection =
        (*engine)->CreateCollection(FaultSchema("full"));
    ASSERT_TRUE(collection.ok()) << collection.status();
    ExpectDiskFull(FillDisk(**collection));
    ASSERT_GE(acknowledged_.size(), 20u);
    // Closed while the disk is full (its snapshot on close fails, and is not needed).
  }
  // Opening replays the WAL into an SST file: on the full disk the engine does not open, and
  // says why.
  ExpectDiskFull(OpenEngine().status());
  fs::remove(filler_);
  absl::StatusOr<std::unique_ptr<Engine>> engine = OpenEngine();
  ASSERT_TRUE(engine.ok()) << engine.status();
  absl::StatusOr<std::shared_ptr<Collection>> collection = (*engine)->GetCollection("full");
  ASSERT_TRUE(collection.ok()) << collection.status();
  ExpectExactly(**collection, acknowledged_, {failed_id_}, "reopened after freeing space");
  Document more = FaultDocument("more", kTokens);
  ASSERT_TRUE(UpsertOne(**collection, more).ok());
  acknowledged_.emplace(more.id, std::move(more));
  ExpectExactly(**collection, acknowledged_, {failed_id_}, "written after reopening");
}

}  // namespace
}  // namespace tessera::testing
