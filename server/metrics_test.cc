// The /metrics text: accepted by Prometheus's own checker (promtool, Debian's prometheus package),
// one # HELP and # TYPE per family with its samples together, integers exact, the per-collection
// families (training included) following the engine's collections, dropped ones gone.
#include "server/metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/engine.h"

namespace tessera::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Two collections ("alpha" with documents, "beta" empty) in a real engine, and metrics that have
// seen a few RPCs, searches and documents.
class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/metrics_test.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << pattern << ": " << std::strerror(errno);
    dir_ = pattern;
    auto engine = Engine::Open(dir_);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    for (const std::string name : {"alpha", "beta"}) {
      CollectionSchema schema;
      schema.name = name;
      schema.dim = 4;
      schema.num_shards = 2;
      ASSERT_TRUE(engine_->CreateCollection(schema).ok());
    }
    auto alpha = engine_->GetCollection("alpha");
    ASSERT_TRUE(alpha.ok());
    std::vector<Document> documents;
    for (int i = 0; i < 5; ++i) {
      Document document;
      document.id = absl::StrCat("doc", i);
      document.dim = 4;
      document.num_tokens = 3;
      document.tokens.assign(12, 0.5f);
      documents.push_back(std::move(document));
    }
    for (const UpsertOutcome& outcome : (*alpha)->Upsert(documents)) {
      ASSERT_TRUE(outcome.status.ok()) << outcome.status;
    }
    metrics_.RecordRpc("Search", "OK", 3.5);
    metrics_.RecordRpc("Search", "INVALID_ARGUMENT", 0.2);
    metrics_.RecordRpc("Upsert", "OK", 1234.5678);
    metrics_.RecordSearchStages(1.25, 0.5, 2.0);
    metrics_.RecordDocuments(5, 1, 15, 5);
    metrics_.SetGauge("tessera_inflight_request_bytes", "Bytes of the requests queued or running.",
                      83965400);
    metrics_.SetCollections(*engine_);
  }

  // The sample lines (not comments) of `text` whose metric name is `name`.
  static std::vector<std::string> Samples(const std::string& text, const std::string& name) {
    std::vector<std::string> out;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (absl::StartsWith(line, name + "{") || absl::StartsWith(line, name + " ")) {
        out.emplace_back(line);
      }
    }
    return out;
  }

  void TearDown() override {
    engine_.reset();
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  std::string dir_;
  std::unique_ptr<Engine> engine_;
  Metrics metrics_;
};

// The promtool on PATH; empty when there is none.
std::string FindPromtool() {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin", ':')) {
    std::string candidate = absl::StrCat(dir, "/promtool");
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

TEST_F(MetricsTest, PromtoolAcceptsTheText) {
  const std::string promtool = FindPromtool();
  if (promtool.empty()) {
    GTEST_SKIP() << "promtool not found on PATH: install Debian's prometheus package "
                    "(scripts/setup does) to check the /metrics text with it";
  }
  const std::string text = metrics_.Render();
  const std::string file = dir_ + "/metrics.txt";
  {
    std::ofstream out(file);
    out << text;
  }
  FILE* pipe = ::popen(absl::StrCat(promtool, " check metrics < ", file, " 2>&1").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  const int status = ::pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "promtool check metrics: " << output << "\non:\n"
      << text;
  EXPECT_EQ(output, "") << "on:\n" << text;
}

// Every family once: its # HELP and # TYPE, then all its samples, before the next family starts.
TEST_F(MetricsTest, EachFamilyHasOneHelpAndTypeAndItsSamplesTogether) {
  const std::string text = metrics_.Render();
  std::map<std::string, int> helps, types;
  std::set<std::string> finished;
  std::string current;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::vector<std::string> words = absl::StrSplit(line, ' ');
    std::string family;
    if (absl::StartsWith(line, "# HELP ")) {
      family = words[2];
      ++helps[family];
    } else if (absl::StartsWith(line, "# TYPE ")) {
      family = words[2];
      ++types[family];
      EXPECT_EQ(helps[family], 1) << "# TYPE before # HELP for " << family;
    } else {
      family = std::string(line.substr(0, line.find_first_of("{ ")));
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        if (absl::EndsWith(family, suffix) &&
            types.count(family.substr(0, family.size() - strlen(suffix)))) {
          family = family.substr(0, family.size() - strlen(suffix));
        }
      }
      EXPECT_EQ(types[family], 1) << "sample without # TYPE: " << line;
    }
    if (family != current) {
      EXPECT_FALSE(finished.count(family) > 0) << "family " << family << " interleaved:\n" << text;
      if (!current.empty()) finished.insert(current);
      current = family;
    }
  }
  for (const auto& [family, count] : helps) EXPECT_EQ(count, 1) << family;
  for (const auto& [family, count] : types) EXPECT_EQ(count, 1) << family;
  EXPECT_GT(types.size(), 10u) << text;
}

// Byte counts were printed with 6 significant digits ("8.39654e+07").
TEST_F(MetricsTest, IntegersArePrintedExactly) {
  const std::string text = metrics_.Render();
  EXPECT_THAT(Samples(text, "tessera_inflight_request_bytes"),
              ::testing::ElementsAre("tessera_inflight_request_bytes 83965400"));
  auto alpha = engine_->GetCollection("alpha");
  ASSERT_TRUE(alpha.ok());
  const int64_t disk_bytes = (*alpha)->Stats().disk_bytes;
  ASSERT_GT(disk_bytes, 1'000'000) << "a collection of 2 shards takes more than 1 MB (its WALs)";
  EXPECT_THAT(
      Samples(text, "tessera_disk_bytes"),
      ::testing::Contains(absl::StrCat("tessera_disk_bytes{collection=\"alpha\"} ", disk_bytes)));
  EXPECT_THAT(Samples(text, "tessera_documents"),
              ::testing::ElementsAre("tessera_documents{collection=\"alpha\"} 5",
                                     "tessera_documents{collection=\"beta\"} 0"));
  // 1234.5678 + 3.5 + 0.2 ms of RPCs, in seconds, to the microsecond the histogram keeps.
  EXPECT_THAT(
      Samples(text, "tessera_rpc_duration_seconds_sum"),
      ::testing::ElementsAre("tessera_rpc_duration_seconds_sum{method=\"Search\"} 0.0037",
                             "tessera_rpc_duration_seconds_sum{method=\"Upsert\"} 1.234567"));
}

TEST_F(MetricsTest, TrainingFamiliesPerCollection) {
  const std::string text = metrics_.Render();
  EXPECT_THAT(text, HasSubstr("# TYPE tessera_training_shards gauge\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE tessera_trainings_total counter\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE tessera_last_training_seconds gauge\n"));
  EXPECT_THAT(Samples(text, "tessera_training_shards"),
              ::testing::ElementsAre("tessera_training_shards{collection=\"alpha\"} 0",
                                     "tessera_training_shards{collection=\"beta\"} 0"));
  EXPECT_THAT(Samples(text, "tessera_trainings_total"),
              ::testing::ElementsAre(
                  "tessera_trainings_total{collection=\"alpha\",outcome=\"completed\"} 0",
                  "tessera_trainings_total{collection=\"alpha\",outcome=\"failed\"} 0",
                  "tessera_trainings_total{collection=\"beta\",outcome=\"completed\"} 0",
                  "tessera_trainings_total{collection=\"beta\",outcome=\"failed\"} 0"));
  EXPECT_THAT(Samples(text, "tessera_last_training_seconds"),
              ::testing::ElementsAre("tessera_last_training_seconds{collection=\"alpha\"} 0",
                                     "tessera_last_training_seconds{collection=\"beta\"} 0"));
}

// The segment families: per collection, one sample per kind, each the collection's own figure;
// alpha's rows wait in RocksDB until Snapshot (the Flush RPC) writes them to segment files.
TEST_F(MetricsTest, SegmentFamiliesPerCollectionAndKind) {
  auto alpha = engine_->GetCollection("alpha");
  ASSERT_TRUE(alpha.ok());
  const auto samples = [](const std::string& name, int64_t alpha_rerank, int64_t alpha_codes) {
    return ::testing::ElementsAre(
        absl::StrCat(name, "{collection=\"alpha\",kind=\"rerank\"} ", alpha_rerank),
        absl::StrCat(name, "{collection=\"alpha\",kind=\"codes\"} ", alpha_codes),
        absl::StrCat(name, "{collection=\"beta\",kind=\"rerank\"} 0"),
        absl::StrCat(name, "{collection=\"beta\",kind=\"codes\"} 0"));
  };
  std::string text = metrics_.Render();
  for (const char* family :
       {"tessera_segment_files", "tessera_segment_bytes", "tessera_unflushed_bytes"}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("# TYPE ", family, " gauge\n")));
  }
  const CollectionStats before = (*alpha)->Stats();
  ASSERT_GT(before.segments.rerank_unflushed_bytes, 0)
      << "5 documents' rerank rows wait in RocksDB";
  EXPECT_THAT(Samples(text, "tessera_segment_files"), samples("tessera_segment_files", 0, 0));
  EXPECT_THAT(Samples(text, "tessera_segment_bytes"), samples("tessera_segment_bytes", 0, 0));
  EXPECT_THAT(Samples(text, "tessera_unflushed_bytes"),
              samples("tessera_unflushed_bytes", before.segments.rerank_unflushed_bytes, 0));

  ASSERT_TRUE((*alpha)->Snapshot().ok());
  metrics_.SetCollections(*engine_);
  text = metrics_.Render();
  const CollectionStats after = (*alpha)->Stats();
  ASSERT_GE(after.segments.rerank_segments, 1);
  ASSERT_GT(after.segments.rerank_segment_bytes, 0);
  EXPECT_THAT(Samples(text, "tessera_segment_files"),
              samples("tessera_segment_files", after.segments.rerank_segments, 0));
  EXPECT_THAT(Samples(text, "tessera_segment_bytes"),
              samples("tessera_segment_bytes", after.segments.rerank_segment_bytes, 0));
  EXPECT_THAT(Samples(text, "tessera_unflushed_bytes"), samples("tessera_unflushed_bytes", 0, 0));
}

// A dropped collection's samples were kept (and reported) until the server restarted.
TEST_F(MetricsTest, ADroppedCollectionsSamplesGoWithIt) {
  EXPECT_THAT(metrics_.Render(), HasSubstr("collection=\"beta\""));
  ASSERT_TRUE(engine_->DropCollection("beta").ok());
  metrics_.SetCollections(*engine_);
  const std::string text = metrics_.Render();
  EXPECT_THAT(text, Not(HasSubstr("beta"))) << text;
  EXPECT_THAT(Samples(text, "tessera_documents"),
              ::testing::ElementsAre("tessera_documents{collection=\"alpha\"} 5"));
  // With no collection left, no per-collection family is rendered at all.
  ASSERT_TRUE(engine_->DropCollection("alpha").ok());
  metrics_.SetCollections(*engine_);
  EXPECT_THAT(metrics_.Render(), Not(HasSubstr("collection=")));
}

}  // namespace
}  // namespace tessera::server
