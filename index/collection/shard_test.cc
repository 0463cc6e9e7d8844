// Shard::Apply is atomic end to end: everything that can reject a write runs before the durable
// RocksDB write, and a failure after it (the derived index) marks the shard failed instead of
// leaving it serving a table that no longer matches the store.
#include "index/collection/shard.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/centroid/centroid_codebook.h"
#include "index/centroid/centroid_index.h"
#include "index/collection/collection_test_util.h"
#include "index/common/thread_pool.h"

namespace tessera::internal {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kDim = 8;

CollectionSchema Schema(VectorDtype dtype = VectorDtype::kFloat32) {
  CollectionSchema schema;
  schema.name = "shard";
  schema.dim = kDim;
  schema.dtype = dtype;
  return schema;
}

// A schema whose shards train from their first rerank vector: ValidateSchema refuses it since
// the fix, but collections created before it keep it, and Shard::Open takes it as stored.
CollectionSchema TrainsAtOnce() {
  CollectionSchema schema = Schema();
  schema.candidates.centroid_min_vectors = 1;
  return schema;
}

// Row r of document `seed`: a unit vector pointing mostly along axis (seed + r) % dim.
std::vector<float> Vectors(int seed, int64_t rows) {
  std::vector<float> values(rows * kDim, 0.01f);
  for (int64_t r = 0; r < rows; ++r) values[r * kDim + (seed + r) % kDim] = 1.0f;
  return Normalized(values, kDim);
}

ShardWrite Write(const std::string& id, int seed, VectorDtype dtype = VectorDtype::kFloat32) {
  constexpr int64_t kRows = 3;
  ShardWrite write;
  write.pooled = Vectors(seed, kRows);
  DocumentRecord& record = write.document.record;
  record.external_id = id;
  record.num_tokens = kRows;
  for (int32_t r = 0; r <= kRows; ++r) record.member_offsets.push_back(r);
  for (int32_t r = 0; r < kRows; ++r) record.members.push_back(r);
  write.document.rerank = MatrixFromFloat(write.pooled, kRows, kDim, dtype);
  return write;
}

class ShardTest : public ::testing::Test {
 protected:
  void Open(VectorDtype dtype = VectorDtype::kFloat32) { Open(Schema(dtype)); }
  void Open(const CollectionSchema& schema, int64_t resident_bytes = 1 << 20) {
    shard_.reset();
    absl::StatusOr<std::unique_ptr<Shard>> shard =
        Shard::Open(dir_.path() + "/shard", schema, ShardStoreOptions{}, resident_bytes, pool_);
    ASSERT_TRUE(shard.ok()) << shard.status();
    shard_ = std::move(*shard);
  }

  // Whether the shard's background training has ended, polled for up to a minute: a shard that
  // retrains forever never gets there, and WaitForTrainingForTesting would hang the test.
  bool TrainingSettles() const {
    for (int i = 0; i < 600; ++i) {
      if (!shard_->Stats().training) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  // The external ids stage 1 nominates for a query along `seed`'s first vector.
  absl::StatusOr<std::set<std::string>> Search(int seed) const {
    const std::vector<float> query = Vectors(seed, 1);
    Stage1Request request;
    request.query = FloatMatrixView{query.data(), 1, kDim};
    request.num_documents = 100;
    absl::StatusOr<std::vector<Stage1Hit>> hits = shard_->SearchCandidates(request);
    if (!hits.ok()) return hits.status();
    std::vector<uint64_t> iids;
    for (const Stage1Hit& hit : *hits) iids.push_back(hit.iid);
    std::set<std::string> ids;
    for (const std::optional<LiveEntry>& entry : shard_->Describe(iids, false)) {
      if (entry.has_value()) ids.insert(entry->external_id);
    }
    return ids;
  }

  // The external ids the store holds and the shard's table lists, which must agree.
  std::set<std::string> Stored() const {
    std::set<std::string> table;
    shard_->ForEachLive(Filter{}, [&](uint64_t iid, const LiveDocument& document) {
      table.insert(document.external_id);
    });
    std::set<std::string> store;
    for (const std::string& id : table) {
      if (shard_->LookupId(id).ok()) store.insert(id);
    }
    EXPECT_EQ(table, store);
    return table;
  }

  TempDir dir_;
  std::shared_ptr<ThreadPool> pool_ = std::make_shared<ThreadPool>(2);
  std::unique_ptr<Shard> shard_;
};

// Candidate vectors with a NaN (here derived from pooled vectors with one) pass the shape checks;
// the candidate index refuses them. Before this was checked ahead of the write, the document was
// durable when Apply failed, and every later open failed while rebuilding the candidate index from
// the store.
TEST_F(ShardTest, NonFiniteCandidateVectorsAreRejectedBeforeTheWrite) {
  Open();
  std::vector<ShardWrite> good;
  good.push_back(Write("a", 0));
  ASSERT_TRUE(shard_->Apply(std::move(good), {}).ok());

  std::vector<ShardWrite> batch;
  batch.push_back(Write("b", 1));
  batch.push_back(Write("bad", 2));
  batch.back().pooled[kDim + 3] = std::numeric_limits<float>::quiet_NaN();
  const absl::StatusOr<WriteResult> result = shard_->Apply(std::move(batch), {});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_THAT(result.status().message(), HasSubstr("'bad'"));
  EXPECT_THAT(result.status().message(), HasSubstr("not finite"));
  // Nothing of the batch was written, and the shard still takes writes.
  EXPECT_EQ(Stored(), (std::set<std::string>{"a"}));
  std::vector<ShardWrite> after;
  after.push_back(Write("c", 3));
  ASSERT_TRUE(shard_->Apply(std::move(after), {}).ok());

  Open();
  EXPECT_EQ(Stored(), (std::set<std::string>{"a", "c"}));
  EXPECT_TRUE(absl::IsNotFound(shard_->LookupId("bad").status()));
  EXPECT_TRUE(absl::IsNotFound(shard_->LookupId("b").status()));
  absl::StatusOr<std::set<std::string>> found = Search(2);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, (std::set<std::string>{"a", "c"}));
}

// A search's read of a batch (FetchForRanking): per document its id, version, attributes and
// rerank vectors from one pass of the table, whether they are resident or read from the store,
// and nothing for documents replaced, deleted or never written; the resident budget accounts for
// the replacement and the delete, and after a reopen for the documents loaded in iid order.
TEST_F(ShardTest, FetchForRankingDescribesAndReadsABatchInOnePass) {
  // Each document's rows take 3 × 8 × 4 = 96 bytes: two fit in 200.
  constexpr int64_t kBudget = 200;
  Open(Schema(), kBudget);
  std::vector<ShardWrite> first;
  const std::vector<std::string> colours = {"red", "green", "blue", "white"};
  for (int d = 0; d < 4; ++d) {
    first.push_back(Write(std::string(1, static_cast<char>('a' + d)), d));
    first.back().document.record.attributes = {{"colour", colours[d]}};
  }
  const absl::StatusOr<WriteResult> written = shard_->Apply(std::move(first), {});
  ASSERT_TRUE(written.ok()) << written.status();
  const std::vector<uint64_t> iids = written->upserted_iids;  // a, b, c, d
  EXPECT_EQ(shard_->Stats().resident_bytes, 192) << "a and b resident, c and d not";

  // "b" again (its old iid is replaced: its 96 bytes go back, the new version takes them) and
  // "a" deleted (its 96 bytes go back).
  std::vector<ShardWrite> second;
  second.push_back(Write("b", 7));
  second.back().document.record.attributes = {{"colour", "black"}};
  const absl::StatusOr<WriteResult> replaced = shard_->Apply(std::move(second), {"a"});
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  const uint64_t new_b = replaced->upserted_iids[0];
  EXPECT_EQ(replaced->replaced_iids[0], iids[1]);
  EXPECT_EQ(replaced->deleted_iids[0], iids[0]);
  EXPECT_EQ(shard_->Stats().resident_bytes, 96) << "the new b only";

  struct Want {
    uint64_t iid;
    std::string id;  // empty: not live
    uint64_t version;
    std::string colour;
    int seed;
  };
  const std::vector<Want> wants = {{iids[3], "d", 1, "white", 3}, {iids[2], "c", 1, "blue", 2},
                                   {new_b, "b", 2, "black", 7},   {iids[1], "", 0, "", 0},
                                   {iids[0], "", 0, "", 0},       {999999, "", 0, "", 0}};
  std::vector<uint64_t> batch;
  for (const Want& want : wants) batch.push_back(want.iid);
  auto check = [&](const std::string& when) {
    for (bool want_attributes : {true, false}) {
      absl::StatusOr<std::vector<RankingDocument>> fetched =
          shard_->FetchForRanking(batch, want_attributes);
      ASSERT_TRUE(fetched.ok()) << when << ": " << fetched.status();
      ASSERT_EQ(fetched->size(), wants.size()) << when;
      for (size_t i = 0; i < wants.size(); ++i) {
        const Want& want = wants[i];
        const RankingDocument& got = (*fetched)[i];
        const std::string what = absl::StrCat(when, ", iid ", want.iid, " ('", want.id, "')");
        if (want.id.empty()) {
          EXPECT_EQ(got.rerank, nullptr) << what << ": not live, yet fetched";
          EXPECT_TRUE(got.external_id.empty()) << what << ": described as " << got.external_id;
          continue;
        }
        ASSERT_NE(got.rerank, nullptr) << what;
        EXPECT_EQ(got.external_id, want.id) << what;
        EXPECT_EQ(got.version, want.version) << what;
        if (want_attributes) {
          ASSERT_EQ(got.attributes.count("colour"), 1u) << what;
          EXPECT_EQ(std::get<std::string>(got.attributes.at("colour")), want.colour) << what;
        } else {
          EXPECT_TRUE(got.attributes.empty()) << what;
        }
        ASSERT_EQ(got.rerank->rows, 3) << what;
        EXPECT_EQ(
            MatrixToFloat(*got.rerank),
            MatrixToFloat(MatrixFromFloat(Vectors(want.seed, 3), 3, kDim, VectorDtype::kFloat32)))
            << what << ": not the rows of the version described";
      }
    }
  };
  check("after the writes");
  // Reopened: loaded resident in iid order until the budget is spent (c and d; the new b is read
  // from the store).
  Open(Schema(), kBudget);
  EXPECT_EQ(shard_->Stats().resident_bytes, 192);
  check("after a reopen");
}

// fp16 storage turns a finite fp32 value beyond 65504 into infinity: stored, it would poison every
// score against the document. Refused before the write as well.
TEST_F(ShardTest, RerankVectorsThatOverflowFp16AreRejectedBeforeTheWrite) {
  Open(VectorDtype::kFloat16);
  std::vector<ShardWrite> batch;
  batch.push_back(Write("big", 0, VectorDtype::kFloat16));
  std::vector<float> vectors = Vectors(0, 3);
  vectors[5] = 1e6f;
  batch.back().document.rerank = MatrixFromFloat(vectors, 3, kDim, VectorDtype::kFloat16);
  const absl::StatusOr<WriteResult> result = shard_->Apply(std::move(batch), {});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_THAT(result.status().message(), HasSubstr("'big'"));
  Open(VectorDtype::kFloat16);
  EXPECT_TRUE(absl::IsNotFound(shard_->LookupId("big").status()));
}

// A failure of the in-memory index after the durable write (FAISS, allocation: nothing the input
// can cause any more) is simulated through the test seam. The write is durable and reported as
// failed; the shard then refuses writes and searches, never serving an index that misses a
// stored document, while Get-style reads of the store go on; reopening rebuilds it.
TEST_F(ShardTest, IndexFailureAfterTheWriteFailsTheShardUntilReopened) {
  Open();
  std::vector<ShardWrite> first;
  first.push_back(Write("a", 0));
  ASSERT_TRUE(shard_->Apply(std::move(first), {}).ok());

  shard_->FailNextIndexUpdateForTesting(absl::ResourceExhaustedError("injected: out of memory"));
  std::vector<ShardWrite> second;
  second.push_back(Write("b", 1));
  const absl::StatusOr<WriteResult> failed = shard_->Apply(std::move(second), {});
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
  EXPECT_THAT(failed.status().message(), HasSubstr("injected: out of memory"));
  EXPECT_THAT(failed.status().message(), HasSubstr("durable"));
  EXPECT_THAT(failed.status().message(), HasSubstr("reopen"));

  // The table matches the store ("b" is durable), searches and writes are refused.
  EXPECT_EQ(Stored(), (std::set<std::string>{"a", "b"}));
  const absl::StatusOr<std::set<std::string>> search = Search(1);
  ASSERT_FALSE(search.ok());
  EXPECT_EQ(search.status().code(), absl::StatusCode::kInternal);
  std::vector<ShardWrite> third;
  third.push_back(Write("c", 2));
  const absl::StatusOr<WriteResult> refused = shard_->Apply(std::move(third), {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(refused.status().message(), HasSubstr("injected: out of memory"));
  absl::StatusOr<uint64_t> b = shard_->LookupId("b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(shard_->GetRecord(*b).ok());

  Open();
  EXPECT_EQ(Stored(), (std::set<std::string>{"a", "b"}));
  EXPECT_TRUE(absl::IsNotFound(shard_->LookupId("c").status()));
  const absl::StatusOr<std::set<std::string>> found = Search(1);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, (std::set<std::string>{"a", "b"}));
  std::vector<ShardWrite> fourth;
  fourth.push_back(Write("d", 3));
  EXPECT_TRUE(shard_->Apply(std::move(fourth), {}).ok());
}

// A shard below kMinCentroids vectors trains a codebook of fewer centroids than
// DefaultNumCentroids' floor (k-means keeps one per sampled vector at most). OutgrewTraining
// compared the floor with the codebook and stayed true, so the training thread retrained the same 6
// vectors back to back (each training a generation, each dropping the last one's codes with a
// compaction) and resumed at every open. One training now, and none after a reopen, until the shard
// grows.
TEST_F(ShardTest, TrainingOnTooFewVectorsForTheCodebookRunsOnce) {
  Open(TrainsAtOnce());
  std::vector<ShardWrite> batch;
  batch.push_back(Write("a", 0));
  batch.push_back(Write("b", 1));
  ASSERT_TRUE(shard_->Apply(std::move(batch), {}).ok());
  ASSERT_TRUE(TrainingSettles()) << "still training after a minute, centroid generation "
                                 << shard_->CentroidGenerationForTesting();
  EXPECT_EQ(shard_->CentroidGenerationForTesting(), 1u);
  EXPECT_EQ(shard_->Stats().candidate_index, "Centroid6,Residual2bit");
  // Nothing runs once training_ is false; a retraining would need a write to start it.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(shard_->Stats().training);
  EXPECT_EQ(shard_->CentroidGenerationForTesting(), 1u);

  Open(TrainsAtOnce());
  ASSERT_TRUE(TrainingSettles()) << "still training after a reopen, centroid generation "
                                 << shard_->CentroidGenerationForTesting();
  EXPECT_EQ(shard_->CentroidGenerationForTesting(), 1u);
  absl::StatusOr<std::set<std::string>> found = Search(0);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, (std::set<std::string>{"a", "b"}));

  // Grown kRetrainGrowth times (6 → 24 vectors), it trains again, once.
  std::vector<ShardWrite> more;
  for (int i = 0; i < 6; ++i) more.push_back(Write(absl::StrCat("c", i), 2 + i));
  ASSERT_TRUE(shard_->Apply(std::move(more), {}).ok());
  ASSERT_TRUE(TrainingSettles()) << "still training after growing, centroid generation "
                                 << shard_->CentroidGenerationForTesting();
  EXPECT_EQ(shard_->CentroidGenerationForTesting(), 2u);
  EXPECT_EQ(shard_->Stats().candidate_index, "Centroid24,Residual2bit");
}

// Stage 2 of a rerank_from_codes search takes its query × centroid scores from stage 1's table
// when that table was built for this query under the documents' codebook, and computes them itself
// otherwise (an exhaustive search, a retraining between the two stages). A table whose every score
// is 1 more than the true one raises each document's MaxSim by exactly 1 per query row when it is
// used; a table of another codebook (an equal copy: reuse goes by identity) or of another query's
// length is ignored.
TEST_F(ShardTest, CompactScoringReusesOnlyTheTableOfItsQueryAndCodebook) {
  CollectionSchema schema = TrainsAtOnce();
  schema.candidates.rerank_from_codes = true;
  schema.candidates.residual_bits = 4;
  schema.candidates.centroid_min_training_vectors = 1;
  Open(schema);
  std::vector<ShardWrite> batch;
  for (int i = 0; i < 12; ++i) batch.push_back(Write(absl::StrCat("d", i), i));
  ASSERT_TRUE(shard_->Apply(std::move(batch), {}).ok());
  ASSERT_TRUE(TrainingSettles());
  std::vector<uint64_t> iids;
  for (int i = 0; i < 12; ++i) {
    absl::StatusOr<uint64_t> iid = shard_->LookupId(absl::StrCat("d", i));
    ASSERT_TRUE(iid.ok()) << iid.status();
    iids.push_back(*iid);
  }
  absl::StatusOr<Shard::CodedDocuments> documents = shard_->FetchCodes(iids);
  ASSERT_TRUE(documents.ok()) << documents.status();
  const CentroidCodebook& codebook = *documents->codebook;
  const int64_t nq = 2;
  const int64_t C = codebook.num_centroids();
  const std::vector<float> query = Vectors(5, nq);
  const FloatMatrixView view{query.data(), nq, kDim};

  // Every centroid score, plus `offset`, for a table of `rows` query rows.
  auto table = [&](std::shared_ptr<const CentroidCodebook> of, int64_t rows, float offset) {
    CentroidScoreTable shifted{std::move(of), rows, std::make_unique<float[]>(rows * C)};
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t c = 0; c < C; ++c) {
        float dot = 0;
        for (int64_t k = 0; k < kDim; ++k) {
          dot += query[(i % nq) * kDim + k] * codebook.centroids()[c * kDim + k];
        }
        shifted.scores[i * C + c] = dot + offset;
      }
    }
    return shifted;
  };
  absl::StatusOr<std::vector<std::optional<float>>> own =
      shard_->ScoreCodes(view, *documents, nullptr);
  ASSERT_TRUE(own.ok()) << own.status();
  ASSERT_EQ(own->size(), iids.size());

  // Stage 2 scores only the centroids its documents use: fewer for one document than for twelve,
  // with the same score for that document.
  absl::StatusOr<Shard::CodedDocuments> first = shard_->FetchCodes({iids[0]});
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::vector<std::optional<float>>> alone =
      shard_->ScoreCodes(view, *first, nullptr);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ((*alone)[0], (*own)[0]);

  const CentroidScoreTable reused = table(documents->codebook, nq, 1.0f);
  absl::StatusOr<std::vector<std::optional<float>>> shifted =
      shard_->ScoreCodes(view, *documents, &reused);
  ASSERT_TRUE(shifted.ok()) << shifted.status();
  for (size_t d = 0; d < iids.size(); ++d) {
    ASSERT_TRUE((*own)[d].has_value() && (*shifted)[d].has_value()) << "document " << d;
    EXPECT_NEAR(*(*shifted)[d], *(*own)[d] + nq, 1e-5) << "document " << d;
  }

  absl::StatusOr<std::unique_ptr<CentroidCodebook>> copy =
      CentroidCodebook::Parse(codebook.Serialize());
  ASSERT_TRUE(copy.ok()) << copy.status();
  const CentroidScoreTable other_codebook = table(std::move(*copy), nq, 1.0f);
  const CentroidScoreTable other_length = table(documents->codebook, nq + 1, 1.0f);
  for (const CentroidScoreTable* ignored : {&other_codebook, &other_length}) {
    absl::StatusOr<std::vector<std::optional<float>>> scores =
        shard_->ScoreCodes(view, *documents, ignored);
    ASSERT_TRUE(scores.ok()) << scores.status();
    EXPECT_EQ(*scores, *own);
  }
}

// Writes run at most kMaxTrainingLagDocuments ahead of a training's catch-up: held here between
// the training's free catch-up rounds and its last catch-up, the training encodes nothing more, so
// a writer stops once that many documents wait past it (for up to kMaxTrainingStall per write,
// longer than this test looks), and goes on when the training ends. All writes land. Without the
// bound, a training slower than the ingest chased it with both indexes growing (a 3M-document
// build ran out of memory that way).
TEST_F(ShardTest, WritesWaitWhileATrainingLagsBehindThem) {
  Open(TrainsAtOnce());
  // Shared with the hook, which a retraining may call after this test's body.
  struct Gate {
    std::atomic<bool> hooked{false};
    std::promise<void> in_hook;
    std::promise<void> release;
  };
  auto gate = std::make_shared<Gate>();
  std::shared_future<void> released = gate->release.get_future().share();
  // A training held in the hook is let go on every exit of this test (TearDown waits for it).
  bool gate_released = false;
  const auto release_gate = [&] {
    if (!std::exchange(gate_released, true)) gate->release.set_value();
  };
  absl::Cleanup release_on_exit = release_gate;
  shard_->SetTrainingHookForTesting([gate, released] {
    if (gate->hooked.exchange(true)) return;  // only the first training waits
    gate->in_hook.set_value();
    released.wait();
  });
  std::vector<ShardWrite> seed;
  seed.push_back(Write("a", 0));
  seed.push_back(Write("b", 1));
  ASSERT_TRUE(shard_->Apply(std::move(seed), {}).ok());
  gate->in_hook.get_future().wait();

  constexpr int64_t kBatch = 256;
  const int64_t total = static_cast<int64_t>(kMaxTrainingLagDocuments) + 8 * kBatch;
  std::atomic<int64_t> written{0};
  std::atomic<bool> failed{false};
  std::thread writer([&] {
    for (int64_t start = 0; start < total; start += kBatch) {
      std::vector<ShardWrite> batch;
      for (int64_t i = start; i < start + kBatch; ++i) {
        batch.push_back(Write(absl::StrCat("w", i), static_cast<int>(i)));
      }
      if (!shard_->Apply(std::move(batch), {}).ok()) failed = true;
      written += kBatch;
    }
  });
  // Whatever the checks below find, the writer is joined, after the training was let go.
  absl::Cleanup join_writer = [&] {
    release_gate();
    if (writer.joinable()) writer.join();
  };

  // The writer gets to the bound without waiting, then waits: one that is merely slow passes this
  // check too, one that does not wait fails it.
  for (int i = 0; i < 600 && written < static_cast<int64_t>(kMaxTrainingLagDocuments); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(written, static_cast<int64_t>(kMaxTrainingLagDocuments) - kBatch);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_LE(written, static_cast<int64_t>(kMaxTrainingLagDocuments) + kBatch);
  release_gate();
  writer.join();
  EXPECT_FALSE(failed);
  EXPECT_EQ(written, total);
  ASSERT_TRUE(TrainingSettles());
  EXPECT_EQ(shard_->num_documents(), total + 2);
  // The trained index holds every document's vectors (3 each).
  const ShardStats stats = shard_->Stats();
  EXPECT_EQ(stats.candidate_vectors, 3 * (total + 2));
  EXPECT_EQ(stats.candidate_vectors, stats.rerank_vectors);
}

}  // namespace
}  // namespace tessera::internal
