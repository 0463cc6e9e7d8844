// Crash safety of the whole write path (validate → pool → RocksDB → FAISS): a child process ingests
// through the Engine API and reports every acknowledged write on a pipe; the parent SIGKILLs it at
// a random moment, reopens the engine and checks that every acknowledged document is present and
// byte-identical to what pooling its content gives, that acknowledged deletes (by id, and by
// filter: Collection::DeleteMatching) stuck, that nothing
// half-written is visible, and that searches find the documents: 20 trials at random moments, and
// 6 more killed inside a background training of the centroid index.
//
// The binary re-executes itself with --child=DIR for the writer (a fresh process, so RocksDB's
// threads start cleanly), hence its own main().
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "index/collection/collection_impl.h"
#include "tessera/engine.h"
#include "tessera/float16.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kDim = 32;
const char* g_self = nullptr;

CollectionSchema Schema() {
  CollectionSchema schema;
  schema.name = "crash";
  schema.dim = kDim;
  schema.num_shards = 2;
  schema.attributes = {{"generation", AttributeType::kInt64}, {"key", AttributeType::kInt64}};
  return schema;
}

// Stage 1 is the centroid index from 2,000 rerank vectors per shard on, retrained at every
// kRetrainGrowth-fold growth: the writers are killed while a training runs.
CollectionSchema CentroidSchema() {
  CollectionSchema schema = Schema();
  schema.name = "crash_centroid";
  schema.candidates.factory = "centroid";
  schema.candidates.centroid_min_training_vectors = 2000;
  return schema;
}

// Deterministic content for (id, generation): the parent can recompute what the child wrote. The
// tokens gather around one direction per (id, generation), so a document's own tokens find it
// first.
Document MakeDocument(int id, int64_t generation) {
  std::mt19937 rng(static_cast<uint32_t>(id * 7919 + generation));
  std::normal_distribution<float> normal;
  std::vector<float> direction(kDim);
  for (float& v : direction) v = normal(rng);
  Document document;
  document.id = absl::StrCat("doc-", id);
  document.num_tokens = 4 + (id * 13 + generation) % 40;
  document.dim = kDim;
  document.tokens.resize(document.num_tokens * kDim);
  for (int64_t i = 0; i < document.num_tokens; ++i) {
    double norm = 0;
    for (int64_t k = 0; k < kDim; ++k) {
      const float v = direction[k] + 0.5f * normal(rng);
      document.tokens[i * kDim + k] = v;
      norm += v * v;
    }
    for (int64_t k = 0; k < kDim; ++k) document.tokens[i * kDim + k] /= std::sqrt(norm);
  }
  document.attributes["generation"] = generation;
  document.attributes["key"] = int64_t{id};
  return document;
}

// Writer: batches of new documents, rewrites of earlier ones (generation + 1) and deletes of ids it
// never touches again. One line per acknowledged operation: "U id generation" or "D id", and
// "P id" before a delete starts (pending: it may or may not land if the kill comes first).
// With `announce_training` = n > 0, the n-th training of a shard, once it has encoded the shard,
// reports "T" and then takes 300 ms more before it swaps its index in, so that the parent can kill
// the writer inside it.
int RunChild(const std::string& dir, const std::string& name, int seed, int announce_training) {
  auto engine = Engine::Open(dir);
  if (!engine.ok()) return 3;
  auto collection = (*engine)->GetCollection(name);
  if (!collection.ok()) return 4;
  if (announce_training > 0) {
    auto trainings = std::make_shared<std::atomic<int>>(0);
    dynamic_cast<internal::CollectionImpl&>(**collection)
        .SetTrainingHookForTesting([trainings, announce_training] {
          if (++*trainings != announce_training) return;
          if (::write(STDOUT_FILENO, "T\n", 2) != 2) ::_exit(8);
          ::usleep(300 * 1000);
        });
  }
  std::mt19937 rng(seed);
  std::map<int, int64_t> generation;
  int next_id = 0;
  for (int round = 0; round < 100000; ++round) {
    std::vector<Document> batch;
    std::vector<std::pair<int, int64_t>> written;
    const int size = 1 + static_cast<int>(rng() % 12);
    for (int b = 0; b < size; ++b) {
      int id;
      if (!generation.empty() && rng() % 3 == 0) {
        id = std::next(generation.begin(), rng() % generation.size())->first;
      } else {
        id = next_id++;
      }
      // One write per id per batch keeps "the acknowledged generation" unambiguous.
      bool duplicate = false;
      for (const auto& w : written) duplicate = duplicate || w.first == id;
      if (duplicate) continue;
      const int64_t g = generation.count(id) ? generation[id] + 1 : 1;
      batch.push_back(MakeDocument(id, g));
      written.emplace_back(id, g);
    }
    for (const UpsertOutcome& outcome : (*collection)->Upsert(std::move(batch))) {
      if (!outcome.status.ok()) return 5;
    }
    std::string report;
    for (const auto& [id, g] : written) {
      generation[id] = g;
      absl::StrAppend(&report, "U ", id, " ", g, "\n");
    }
    if (round % 5 == 4 && generation.size() > 10) {
      const int id = std::next(generation.begin(), rng() % generation.size())->first;
      // Announce the delete first: if the kill lands during it, the parent accepts either outcome.
      absl::StrAppend(&report, "P ", id, "\n");
      if (::write(STDOUT_FILENO, report.data(), report.size()) !=
          static_cast<ssize_t>(report.size())) {
        return 7;
      }
      report.clear();
      // Every other delete by filter (DeleteMatching: acknowledged as Delete is), nested as a
      // client would write "key == id, or a key no document has, and not a missing key".
      if (round % 10 == 4) {
        Filter filter;
        filter.any_of.resize(2);
        filter.any_of[0].all_of.push_back({"key", FilterCondition::Op::kEq, {int64_t{id}}});
        filter.any_of[1].all_of.push_back({"key", FilterCondition::Op::kLt, {int64_t{-1}}});
        filter.none_of.resize(1);
        filter.none_of[0].all_of.push_back({"key", FilterCondition::Op::kMissing, {}});
        auto deleted = (*collection)->DeleteMatching(filter);
        if (!deleted.ok() || *deleted != 1) return 6;
      } else {
        auto existed = (*collection)->Delete({absl::StrCat("doc-", id)});
        if (!existed.ok()) return 6;
      }
      generation.erase(id);
      absl::StrAppend(&report, "D ", id, "\n");
    }
    if (::write(STDOUT_FILENO, report.data(), report.size()) !=
        static_cast<ssize_t>(report.size())) {
      return 7;
    }
  }
  return 0;
}

// Reads the child's reports until a line "T" arrives (true) or the child exits or 60 s pass.
bool ReadUntilTraining(int fd, std::string* lines) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  char buffer[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd poll_fd{fd, POLLIN, 0};
    if (::poll(&poll_fd, 1, 100) <= 0) continue;
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n <= 0) return false;
    lines->append(buffer, n);
    if (lines->find("T\n") != std::string::npos) return true;
  }
  return false;
}

// Trials of: start a writer on the collection `schema` names, SIGKILL it, verify what it
// acknowledged. With `during_training`, the kill lands within a training of the centroid index.
void RunTrials(const CollectionSchema& schema, int trials, bool during_training) {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       absl::StrCat("collection_crash_", schema.name, "_", ::getpid());
  fs::remove_all(dir);
  {
    auto engine = Engine::Open(dir.string());
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE((*engine)->CreateCollection(schema).ok());
  }
  std::mt19937 rng(2026);
  // What the children acknowledged, across all trials (each trial continues the same collection).
  std::map<int, int64_t> acknowledged;
  std::map<int, bool> deleted;
  std::set<int> pending_delete;
  int total_acknowledged = 0;
  int killed_in_training = 0;
  for (int trial = 0; trial < trials; ++trial) {
    if (during_training) {
      // A fresh collection, so that its trainings come at the same sizes in every trial.
      auto engine = Engine::Open(dir.string());
      ASSERT_TRUE(engine.ok()) << engine.status();
      ASSERT_TRUE((*engine)->DropCollection(schema.name).ok());
      ASSERT_TRUE((*engine)->CreateCollection(schema).ok());
    }
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      const std::string child = absl::StrCat("--child=", dir.string());
      const std::string name = absl::StrCat("--collection=", schema.name);
      const std::string seed = absl::StrCat("--seed=", 1000 + trial);
      // Alternately the first training (candidate scan → centroid index) and a retraining.
      const std::string announce =
          absl::StrCat("--announce_training=", during_training ? 1 + trial % 2 : 0);
      ::execl(g_self, g_self, child.c_str(), name.c_str(), seed.c_str(), announce.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(fds[1]);
    std::string lines;
    if (during_training) {
      ASSERT_TRUE(ReadUntilTraining(fds[0], &lines)) << "trial " << trial << ": no training";
      ++killed_in_training;
      ::usleep(static_cast<int>(rng() % 400) * 1000);
    } else {
      ::usleep((100 + static_cast<int>(rng() % 500)) * 1000);
    }
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited early with " << WEXITSTATUS(status);
    char buffer[4096];
    for (ssize_t n; (n = ::read(fds[0], buffer, sizeof(buffer))) > 0;) lines.append(buffer, n);
    ::close(fds[0]);
    // Only whole lines count: the child may die after a partial write (it writes one report per
    // acknowledged batch, so a torn report can only be the last).
    std::string whole = lines.substr(0, lines.rfind('\n') + 1);
    for (size_t at; (at = whole.find("T\n")) != std::string::npos;) whole.erase(at, 2);
    std::istringstream in(whole);
    std::string op;
    int id;
    // Ids are per child run; keep them apart across trials.
    const int offset = trial * 1000000;
    while (in >> op >> id) {
      if (op == "U") {
        int64_t g;
        in >> g;
        acknowledged[offset + id] = g;
        deleted.erase(offset + id);
        ++total_acknowledged;
      } else if (op == "P") {
        pending_delete.insert(offset + id);
      } else {
        deleted[offset + id] = true;
        acknowledged.erase(offset + id);
        pending_delete.erase(offset + id);
      }
    }
    // Each child numbers documents from 0, so verify this trial's documents now and empty the
    // collection before the next child starts.
    auto engine = Engine::Open(dir.string());
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto collection = (*engine)->GetCollection(schema.name);
    ASSERT_TRUE(collection.ok());
    int64_t present = 0;
    for (const auto& [key, g] : acknowledged) {
      if (key / 1000000 != trial) continue;
      const int local = key % 1000000;
      auto stored = (*collection)->Get(absl::StrCat("doc-", local));
      if (pending_delete.count(key) && absl::IsNotFound(stored.status())) continue;
      ASSERT_TRUE(stored.ok()) << "trial " << trial << " acknowledged doc-" << local << " lost";
      const int64_t found = std::get<int64_t>(stored->attributes.at("generation"));
      // A write after the last acknowledged one may also have landed before the kill.
      ASSERT_GE(found, g) << "doc-" << local;
      const Document expected_source = MakeDocument(local, found);
      auto pooled = PoolDocument(
          FloatMatrixView{expected_source.tokens.data(), expected_source.num_tokens, kDim},
          std::nullopt, schema.pooling);
      ASSERT_TRUE(pooled.ok());
      std::vector<Float16> half(pooled->vectors.size());
      FloatToHalf(pooled->vectors.data(), pooled->vectors.size(), half.data());
      std::vector<float> decoded(half.size());
      HalfToFloat(half.data(), half.size(), decoded.data());
      ASSERT_EQ(stored->vectors, decoded) << "doc-" << local << " is not byte-identical";
      ++present;
      // Searches find it: its own tokens as the query, default cascade.
      if (present % 7 == 0) {
        auto result = (*collection)
                          ->Search(FloatMatrixView{expected_source.tokens.data(),
                                                   expected_source.num_tokens, kDim},
                                   {});
        ASSERT_TRUE(result.ok());
        ASSERT_FALSE(result->hits.empty());
        EXPECT_EQ(result->hits[0].id, stored->id);
      }
    }
    for (const auto& [key, unused] : deleted) {
      if (key / 1000000 != trial) continue;
      EXPECT_EQ((*collection)->Get(absl::StrCat("doc-", key % 1000000)).status().code(),
                absl::StatusCode::kNotFound);
    }
    // Nothing half-written: every live document is readable; start the next trial empty. (Searches
    // return at most max_k = 1000 hits, so empty the collection in rounds.)
    const int64_t live = (*collection)->Stats().documents;
    int64_t seen = 0;
    SearchOptions everything;
    everything.exhaustive = true;
    everything.k = 1000;
    const std::vector<float> probe(kDim, 1.0f / std::sqrt(static_cast<float>(kDim)));
    while ((*collection)->Stats().documents > 0) {
      auto all = (*collection)->Search(FloatMatrixView{probe.data(), 1, kDim}, everything);
      ASSERT_TRUE(all.ok()) << all.status();
      ASSERT_FALSE(all->hits.empty());
      std::vector<std::string> ids;
      for (const SearchHit& hit : all->hits) {
        EXPECT_TRUE((*collection)->Get(hit.id).ok()) << hit.id;
        ids.push_back(hit.id);
      }
      seen += static_cast<int64_t>(ids.size());
      ASSERT_TRUE((*collection)->Delete(ids).ok());
    }
    EXPECT_EQ(seen, live);
  }
  std::printf(
      "%s: %d acknowledged upserts over %d SIGKILLed writers (%d inside a training), all "
      "verified\n",
      schema.name.c_str(), total_acknowledged, trials, killed_in_training);
  EXPECT_GT(total_acknowledged, 100);
  fs::remove_all(dir);
}

TEST(CollectionCrash, AcknowledgedWritesSurviveSigkill) { RunTrials(Schema(), 20, false); }

TEST(CollectionCrash, AcknowledgedWritesSurviveSigkillDuringCentroidTraining) {
  RunTrials(CentroidSchema(), 6, true);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::g_self = argv[0];
  if (argc == 5 && std::strncmp(argv[1], "--child=", 8) == 0) {
    return tessera::RunChild(argv[1] + 8, argv[2] + std::strlen("--collection="),
                             std::atoi(argv[3] + std::strlen("--seed=")),
                             std::atoi(argv[4] + std::strlen("--announce_training=")));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
