// Snapshots: a restore equals its source (count, stored bytes of every document, exhaustive
// answers), a snapshot taken under ingest holds a prefix of the acknowledged writes, corrupt and
// truncated archives are refused with DATA_LOSS naming the file and leave nothing behind, a
// deleted snapshot frees its files, and the bad inputs' codes.
#include "tessera/snapshot.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/collection/collection_test_util.h"
#include "index/testing/allocated_bytes.h"
#include "tessera/engine.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int64_t kDim = 16;

struct Fixture {
  TempDir dir;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<SnapshotStore> snapshots;

  Fixture() {
    EngineOptions options;
    options.threads = 2;
    options.sync_writes = false;
    auto opened = Engine::Open(dir.path() + "/data", options);
    EXPECT_TRUE(opened.ok()) << opened.status();
    engine = *std::move(opened);
    auto store = SnapshotStore::Open(engine.get(), dir.path() + "/data/snapshots");
    EXPECT_TRUE(store.ok()) << store.status();
    snapshots = *std::move(store);
  }

  std::shared_ptr<Collection> Create(const std::string& name, int shards) {
    CollectionSchema schema = Schema(name, kDim);
    schema.num_shards = shards;
    auto created = engine->CreateCollection(schema);
    EXPECT_TRUE(created.ok()) << created.status();
    return *created;
  }

  std::string SnapshotPath(const std::string& id) const {
    return dir.path() + "/data/snapshots/" + id.substr(0, id.rfind('@')) + "/" + id;
  }
};

Document MakeDocument(Corpus& corpus, int i) {
  Document document = corpus.Make(absl::StrCat("doc-", i), 8 + i % 9);
  document.attributes["group"] = int64_t{i % 7};
  document.attributes["lang"] = std::string(i % 2 == 0 ? "en" : "fr");
  return document;
}

void Fill(Collection& collection, Corpus& corpus, int n) {
  for (int begin = 0; begin < n; begin += 50) {
    std::vector<Document> batch;
    for (int i = begin; i < std::min(n, begin + 50); ++i) batch.push_back(MakeDocument(corpus, i));
    ExpectAllOk(collection.Upsert(std::move(batch)));
  }
}

std::vector<std::string> Ids(int n) {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) ids.push_back(absl::StrCat("doc-", i));
  return ids;
}

TEST(SnapshotStore, RestoreEqualsSource) {
  Fixture f;
  auto source = f.Create("papers", 3);
  Corpus corpus(kDim, 7);
  constexpr int kDocs = 400;
  Fill(*source, corpus, kDocs);
  ASSERT_TRUE(source->Delete({"doc-3", "doc-10"}).ok());
  // Stage 1's snapshot goes with the copy (the derived state: loaded, not rebuilt, at restore),
  // and the writes after it are reconciled at open.
  ASSERT_TRUE(source->Snapshot().ok());
  ExpectAllOk(source->Upsert({MakeDocument(corpus, 1)}));
  ASSERT_TRUE(source->Delete({"doc-11"}).ok());

  auto manifest = f.snapshots->Create("papers");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_THAT(manifest->id, ::testing::StartsWith("papers@"));
  EXPECT_EQ(manifest->num_shards, 3);
  EXPECT_EQ(manifest->shard_sequences.size(), 3u);
  EXPECT_GT(manifest->total_bytes(), 0);
  EXPECT_GT(manifest->cut_micros, 0);
  int stage1_snapshots = 0;
  for (const SnapshotFile& file : manifest->files) {
    stage1_snapshots += absl::EndsWith(file.path, "/candidates.snapshot") ? 1 : 0;
  }
  EXPECT_EQ(stage1_snapshots, 3);
  // The manifest as stored reads back whole.
  auto stored = f.snapshots->Get(manifest->id);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(EncodeSnapshotManifest(*stored), EncodeSnapshotManifest(*manifest));
  EXPECT_EQ(stored->cut_micros, manifest->cut_micros);
  EXPECT_EQ(stored->shard_sequences, manifest->shard_sequences);
  ASSERT_EQ(stored->files.size(), manifest->files.size());
  for (size_t i = 0; i < stored->files.size(); ++i) {
    EXPECT_EQ(stored->files[i].path, manifest->files[i].path);
    EXPECT_EQ(stored->files[i].size, manifest->files[i].size);
    EXPECT_EQ(stored->files[i].crc32, manifest->files[i].crc32);
  }
  // Writes after the snapshot are not in it.
  ExpectAllOk(source->Upsert({MakeDocument(corpus, kDocs)}));

  // Once through the archive stream, once from the local snapshot.
  std::string archive;
  ASSERT_TRUE(f.snapshots
                  ->WriteArchive(
                      manifest->id,
                      [&archive](absl::string_view bytes) {
                        archive.append(bytes.data(), bytes.size());
                        return absl::OkStatus();
                      },
                      4096)
                  .ok());
  auto restore = f.snapshots->NewRestore("from-archive");
  for (size_t at = 0; at < archive.size(); at += 777) {
    ASSERT_TRUE(restore->Add(absl::string_view(archive).substr(at, 777)).ok());
  }
  ASSERT_TRUE(restore->Finish().ok());
  ASSERT_TRUE(f.snapshots->RestoreLocal(manifest->id, "from-local").ok());

  for (const std::string name : {"from-archive", "from-local"}) {
    SCOPED_TRACE(name);
    auto copy = f.engine->GetCollection(name);
    ASSERT_TRUE(copy.ok()) << copy.status();
    EXPECT_EQ((*copy)->schema().name, name);
    EXPECT_EQ((*copy)->schema().num_shards, 3);
    ASSERT_EQ(*(*copy)->Count({}), kDocs - 3);
    GetOptions stored;
    stored.stored_bytes = true;
    for (const std::string& id : Ids(kDocs + 1)) {
      auto want = source->Get(id, stored);
      auto got = (*copy)->Get(id, stored);
      if (id == "doc-3" || id == "doc-10" || id == "doc-11" || id == absl::StrCat("doc-", kDocs)) {
        EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << id;
        continue;
      }
      ASSERT_TRUE(want.ok() && got.ok()) << id << ": " << got.status();
      EXPECT_EQ(got->vector_bytes, want->vector_bytes) << id;
      EXPECT_EQ(got->version, want->version) << id;
      EXPECT_EQ(got->attributes, want->attributes) << id;
      EXPECT_EQ(got->members, want->members) << id;
    }
    for (int q = 0; q < 5; ++q) {
      const std::vector<float> query = corpus.QueryFrom(MakeDocument(corpus, q * 31), 6);
      SearchOptions options;
      options.k = 20;
      options.exhaustive = true;
      auto want = source->Search(FloatMatrixView{query.data(), 6, kDim}, options);
      auto got = (*copy)->Search(FloatMatrixView{query.data(), 6, kDim}, options);
      ASSERT_TRUE(want.ok() && got.ok());
      ASSERT_EQ(got->hits.size(), want->hits.size());
      for (size_t h = 0; h < got->hits.size(); ++h) {
        // The source holds one later document: compare where it is not the hit.
        if (want->hits[h].id == absl::StrCat("doc-", kDocs)) break;
        EXPECT_EQ(got->hits[h].id, want->hits[h].id) << "query " << q << " hit " << h;
        EXPECT_EQ(got->hits[h].score, want->hits[h].score) << "query " << q << " hit " << h;
      }
    }
    // The copy is a collection of its own: writes to it leave the source alone.
    ExpectAllOk((*copy)->Upsert({MakeDocument(corpus, 5000)}));
  }
  EXPECT_EQ(source->Get("doc-5000").status().code(), absl::StatusCode::kNotFound);

  // The snapshot outlives its collection and the engine.
  ASSERT_TRUE(f.engine->DropCollection("papers").ok());
  source.reset();
  auto listed = f.snapshots->List("papers");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].id, manifest->id);
  f.snapshots.reset();
  f.engine.reset();
  auto reopened = Engine::Open(f.dir.path() + "/data");
  ASSERT_TRUE(reopened.ok());
  auto store = SnapshotStore::Open(reopened->get(), f.dir.path() + "/data/snapshots");
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->RestoreLocal(manifest->id, "papers").ok());
  EXPECT_EQ(*(*(*reopened)->GetCollection("papers"))->Count({}), kDocs - 3);
}

// A writer acknowledges one document per call, in order; a snapshot taken meanwhile must hold
// exactly doc-0 … doc-(m-1) for some m: every document acknowledged before the snapshot began,
// none not yet written when it ended, and no gap (the cut falls between write calls, across the
// shards).
TEST(SnapshotStore, SnapshotUnderIngestHoldsAPrefixOfAcknowledgedWrites) {
  Fixture f;
  auto source = f.Create("live", 4);
  Corpus corpus(kDim, 11);
  std::vector<Document> documents;
  constexpr int kDocs = 1500;
  for (int i = 0; i < kDocs; ++i) documents.push_back(MakeDocument(corpus, i));
  std::atomic<int> acknowledged{0};
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; i < kDocs && !stop.load(); ++i) {
      const std::vector<UpsertOutcome> outcome = source->Upsert({documents[i]});
      ASSERT_TRUE(outcome[0].status.ok()) << outcome[0].status;
      acknowledged.store(i + 1);
    }
  });
  while (acknowledged.load() < 100) std::this_thread::yield();
  std::vector<std::pair<int, int>> bounds;
  std::vector<std::string> ids;
  for (int round = 0; round < 3; ++round) {
    const int before = acknowledged.load();
    auto manifest = f.snapshots->Create("live");
    const int after = acknowledged.load();
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    bounds.emplace_back(before, after);
    ids.push_back(manifest->id);
  }
  stop.store(true);
  writer.join();
  for (size_t round = 0; round < ids.size(); ++round) {
    const std::string name = absl::StrCat("restored", round);
    ASSERT_TRUE(f.snapshots->RestoreLocal(ids[round], name).ok());
    auto copy = *f.engine->GetCollection(name);
    const int64_t m = *copy->Count({});
    EXPECT_GE(m, bounds[round].first) << "an acknowledged write is missing";
    // The write in flight when the snapshot ended may be in it, unacknowledged yet.
    EXPECT_LE(m, bounds[round].second + 1) << "a write not yet made is present";
    for (int i = 0; i < m; ++i) {
      ASSERT_TRUE(copy->Get(absl::StrCat("doc-", i)).ok())
          << "round " << round << ": doc-" << i << " missing, " << m << " documents";
    }
  }
}

TEST(SnapshotStore, CorruptOrTruncatedSnapshotIsRefusedNamingTheFile) {
  Fixture f;
  auto source = f.Create("papers", 2);
  Corpus corpus(kDim, 3);
  Fill(*source, corpus, 200);
  auto manifest = f.snapshots->Create("papers");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  std::string archive;
  ASSERT_TRUE(f.snapshots
                  ->WriteArchive(manifest->id,
                                 [&archive](absl::string_view bytes) {
                                   archive.append(bytes.data(), bytes.size());
                                   return absl::OkStatus();
                                 })
                  .ok());

  // Truncated in the middle of a file, and before the end marker.
  const SnapshotFile& last = manifest->files.back();
  for (const size_t cut : {archive.size() - 8 - last.size / 2 - 1, archive.size() - 3}) {
    auto restore = f.snapshots->NewRestore("copy");
    ASSERT_TRUE(restore->Add(absl::string_view(archive).substr(0, cut)).ok());
    const absl::Status status = restore->Finish().status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_THAT(status.message(), HasSubstr("truncated"));
    if (cut < archive.size() - 8) {
      EXPECT_THAT(status.message(), HasSubstr(last.path));
    }
  }
  // Garbage after the end.
  {
    auto restore = f.snapshots->NewRestore("copy");
    const absl::Status status = restore->Add(archive + "x");
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  }

  // One byte flipped in the largest file of the local snapshot.
  const SnapshotFile* largest = &manifest->files[0];
  for (const SnapshotFile& file : manifest->files) {
    if (file.size > largest->size) largest = &file;
  }
  const std::string path = f.SnapshotPath(manifest->id) + "/data/" + largest->path;
  // A hard link shares its bytes with the live collection: break the link first, as a disk
  // error in the snapshot's copy would.
  const std::string copy = path + ".copy";
  fs::copy_file(path, copy);
  fs::rename(copy, path);
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(largest->size / 2);
    char byte = 0;
    file.read(&byte, 1);
    byte ^= 0x20;
    file.seekp(largest->size / 2);
    file.write(&byte, 1);
  }
  const absl::Status status = f.snapshots->RestoreLocal(manifest->id, "copy").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr(largest->path));

  // Nothing half-restored is visible, nothing is left in staging.
  EXPECT_EQ(f.engine->GetCollection("copy").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(fs::is_empty(f.engine->StagingDirectory()));
  EXPECT_EQ(f.engine->ListCollections(), std::vector<std::string>{"papers"});
}

TEST(SnapshotStore, DeleteFreesTheFiles) {
  Fixture f;
  auto source = f.Create("papers", 2);
  Corpus corpus(kDim, 5);
  Fill(*source, corpus, 200);
  auto first = f.snapshots->Create("papers");
  auto second = f.snapshots->Create("papers");
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE(first->id, second->id);
  auto listed = f.snapshots->List("papers");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].id, first->id);

  ASSERT_TRUE(f.snapshots->Delete(first->id).ok());
  EXPECT_FALSE(fs::exists(f.SnapshotPath(first->id)));
  EXPECT_TRUE(fs::exists(f.SnapshotPath(second->id)));
  EXPECT_EQ(f.snapshots->Get(first->id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f.snapshots->List("papers")->size(), 1u);
  ASSERT_TRUE(f.snapshots->Delete(second->id).ok());
  // With the collection dropped too, nothing of either is left on disk.
  ASSERT_TRUE(f.engine->DropCollection("papers").ok());
  source.reset();
  EXPECT_EQ(MeasureAllocatedBytes(f.dir.path() + "/data/snapshots"), 0);
}

TEST(SnapshotStore, BadInput) {
  Fixture f;
  auto source = f.Create("papers", 1);
  Corpus corpus(kDim, 5);
  Fill(*source, corpus, 20);
  auto manifest = f.snapshots->Create("papers");
  ASSERT_TRUE(manifest.ok());

  absl::Status status = f.snapshots->Create("nope").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("'nope'"));
  status = f.snapshots->List("nope").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("'nope'"));
  for (const std::string id : {"papers@20261206T000000Z-00000000", "nope@x"}) {
    status = f.snapshots->RestoreLocal(id, "copy").status();
    EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << id;
    EXPECT_THAT(status.message(), HasSubstr(id));
    EXPECT_EQ(f.snapshots->Delete(id).code(), absl::StatusCode::kNotFound) << id;
  }
  for (const std::string id : {"", "papers", "../papers@x", "papers@x/y"}) {
    EXPECT_EQ(f.snapshots->Get(id).status().code(), absl::StatusCode::kInvalidArgument) << id;
  }
  status = f.snapshots->RestoreLocal(manifest->id, "bad name!").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("bad name!"));
  status = f.snapshots->RestoreLocal(manifest->id, "papers").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists) << status;
  EXPECT_THAT(status.message(), HasSubstr("'papers'"));
  // A stream that is not an archive.
  auto restore = f.snapshots->NewRestore("copy");
  EXPECT_EQ(restore->Add("GET / HTTP/1.1\r\n").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(f.engine->ListCollections(), std::vector<std::string>{"papers"});
}

}  // namespace
}  // namespace tessera
