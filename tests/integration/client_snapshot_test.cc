// The C++ client's snapshot calls against a real server on a loopback port: create, list,
// download to a file, restore from it and from the server's copy, delete; a corrupt upload is
// DATA_LOSS naming the file, and a failed download leaves no file behind.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/testing/loopback_server.h"

namespace tessera::client {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr uint32_t kDim = 16;

// A fresh directory under $TMPDIR, removed at the end.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tessera-client-snapshot-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) != nullptr ? pattern : std::string();
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(ClientSnapshots, CreateListDownloadRestoreDelete) {
  TempDir dir;
  auto server = server::LoopbackServer::Start(dir.path() + "/data", {});
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions options;
  options.address = (*server)->address();
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();

  v1::CollectionSchema schema;
  schema.set_name("papers");
  schema.set_dim(kDim);
  schema.set_num_shards(2);
  ASSERT_TRUE((*client)->CreateCollection(schema).ok());
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<DocumentInput> documents;
  for (int i = 0; i < 40; ++i) {
    std::vector<float> values(6 * kDim);
    for (float& v : values) v = normal(rng);
    documents.push_back({absl::StrCat("d", i), TokenMatrix::FromFloat32(6, kDim, values), {}, {}});
  }
  ASSERT_TRUE((*client)->Upsert("papers", documents).ok());

  auto created = (*client)->CreateSnapshot("papers");
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->collection(), "papers");
  EXPECT_EQ(created->num_shards(), 2u);
  auto listed = (*client)->ListSnapshots("papers");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].id(), created->id());

  const std::string archive = dir.path() + "/papers.tsnap";
  ASSERT_TRUE((*client)->DownloadSnapshotToFile(created->id(), archive).ok());
  EXPECT_GT(static_cast<int64_t>(fs::file_size(archive)), static_cast<int64_t>(created->bytes()));
  auto uploaded = (*client)->RestoreSnapshotFromFile(archive, "uploaded");
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  EXPECT_EQ(uploaded->id(), created->id());
  ASSERT_TRUE((*client)->RestoreSnapshot(created->id(), "copied").ok());
  for (const std::string name : {"uploaded", "copied"}) {
    auto count = (*client)->Count(name);
    ASSERT_TRUE(count.ok()) << name << ": " << count.status();
    EXPECT_EQ(*count, 40u) << name;
    auto got = (*client)->Get(name, "d7");
    auto want = (*client)->Get("papers", "d7");
    ASSERT_TRUE(got.ok() && want.ok());
    EXPECT_EQ(got->vectors, want->vectors) << name;
  }

  // A byte flipped in the upload: DATA_LOSS naming the file, no collection left.
  {
    std::fstream file(archive, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-9, std::ios::end);
    char byte = 0;
    file.read(&byte, 1);
    byte ^= 1;
    file.seekp(-9, std::ios::end);
    file.write(&byte, 1);
  }
  const absl::Status corrupt = (*client)->RestoreSnapshotFromFile(archive, "broken").status();
  EXPECT_EQ(corrupt.code(), absl::StatusCode::kDataLoss) << corrupt;
  EXPECT_THAT(corrupt.message(), HasSubstr("snapshot file 'shard-001/"));
  EXPECT_EQ((*client)->Count("broken").status().code(), absl::StatusCode::kNotFound);

  // Unknown ids and a taken name.
  const std::string missing = dir.path() + "/missing.tsnap";
  EXPECT_EQ((*client)->DownloadSnapshotToFile("papers@nope", missing).code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(fs::exists(missing));
  EXPECT_EQ((*client)->RestoreSnapshot(created->id(), "copied").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ((*client)->RestoreSnapshotFromFile(missing, "x").status().code(),
            absl::StatusCode::kNotFound);

  ASSERT_TRUE((*client)->DeleteSnapshot(created->id()).ok());
  EXPECT_TRUE((*client)->ListSnapshots("papers")->empty());
  EXPECT_EQ((*client)->DeleteSnapshot(created->id()).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tessera::client
