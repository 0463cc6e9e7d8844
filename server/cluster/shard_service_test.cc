// ShardService behind a real gRPC server on a loopback port, over a real engine in a temporary
// directory, next to the public services on the same engine: replicas of two shards of one
// collection are independent, a shard's search is the public search of a collection holding the
// same documents, and bad input is answered as the public API answers it.
#include "server/cluster/shard_service.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/convert.h"
#include "server/testing/loopback_server.h"
#include "tessera/merge.h"

namespace tessera::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kDim = 8;

TEST(ReplicaName, IsOneToOneAndKeepsTheClusterName) {
  EXPECT_EQ(ReplicaName("papers", 3), "papers.shard-3");
  EXPECT_EQ(*ParseReplicaName("papers.shard-3"), std::make_pair(std::string("papers"), 3u));
  // A cluster name may itself contain the separator.
  EXPECT_EQ(*ParseReplicaName(ReplicaName("a.shard-1", 0)),
            std::make_pair(std::string("a.shard-1"), 0u));
  for (const char* other : {"papers", "papers.shard-", "papers.shard-01", "papers.shard-256",
                            ".shard-1", "papers.shard-1x"}) {
    EXPECT_FALSE(ParseReplicaName(other).has_value()) << other;
  }
  EXPECT_LE(ReplicaName(std::string(kMaxClusterCollectionName, 'x'), kMaxShards - 1).size(), 128u);
}

TEST(ShardRoleConfig, ShardNeedsNodeIdAndEtcd) {
  auto standalone = ParseServerConfig({"s"});
  ASSERT_TRUE(standalone.ok());
  EXPECT_EQ(standalone->role, "standalone");
  auto shard = ParseServerConfig(
      {"s", "--role", "shard", "--node_id", "shard-0", "--etcd", "127.0.0.1:2379"});
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->role, "shard");
  EXPECT_EQ(shard->node_id, "shard-0");
  EXPECT_EQ(shard->etcd, "127.0.0.1:2379");
  const auto no_node = ParseServerConfig({"s", "--role", "shard", "--etcd", "127.0.0.1:2379"});
  EXPECT_TRUE(absl::IsInvalidArgument(no_node.status()));
  EXPECT_THAT(no_node.status().message(), HasSubstr("--node_id"));
  const auto no_etcd = ParseServerConfig({"s", "--role", "shard", "--node_id", "n"});
  EXPECT_TRUE(absl::IsInvalidArgument(no_etcd.status()));
  EXPECT_THAT(no_etcd.status().message(), HasSubstr("--etcd"));
  EXPECT_THAT(ParseServerConfig({"s", "--role", "coordinator"}).status().message(),
              HasSubstr("--role 'coordinator', expected standalone, shard or router"));
  EXPECT_THAT(ParseServerConfig({"s", "--node_id", "a/b"}).status().message(),
              HasSubstr("--node_id 'a/b'"));
  EXPECT_THAT(ParseServerConfig({"s", "--etcd", "nohost"}).status().message(),
              HasSubstr("--etcd 'nohost', expected HOST:PORT"));
}

class ShardServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("shard_service_test_", ::getpid(), "_", counter_++);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    config_.max_k = 50;
    config_.max_num_candidates = 200;
    config_.max_documents_per_batch = 64;
    LoopbackServerOptions options;
    options.config = config_;
    options.extra_service = [](const ServiceContext* context) {
      return std::make_unique<ShardServiceImpl>(context, "node-a");
    };
    auto node = LoopbackServer::Start((dir_ / "data").string(), options);
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
    shard_stub_ = v1::ShardService::NewStub(node_->channel());
    admin_stub_ = v1::AdminService::NewStub(node_->channel());
    ingest_stub_ = v1::IngestService::NewStub(node_->channel());
    query_stub_ = v1::QueryService::NewStub(node_->channel());
  }

  void TearDown() override {
    node_.reset();
    std::filesystem::remove_all(dir_);
  }

  static v1::CollectionSchema Schema(const std::string& name, uint32_t num_shards = 1,
                                     uint32_t dim = kDim) {
    v1::CollectionSchema schema;
    schema.set_name(name);
    schema.set_dim(dim);
    schema.set_num_shards(num_shards);
    return schema;
  }

  // Document `id` with `num_tokens` random tokens of `dim` from `seed`.
  static v1::Document RandomDocument(const std::string& id, int num_tokens, uint32_t seed,
                                     int64_t dim = kDim) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::vector<float> tokens(num_tokens * dim);
    for (float& value : tokens) value = normal(rng);
    v1::Document document;
    document.set_id(id);
    EncodeMatrix(tokens.data(), num_tokens, dim, VectorDtype::kFloat32, document.mutable_tokens());
    return document;
  }

  grpc::Status CreateReplica(const v1::CollectionSchema& schema, uint32_t shard) {
    v1::ShardCreateCollectionRequest request;
    *request.mutable_schema() = schema;
    request.set_shard(shard);
    v1::ShardCreateCollectionResponse response;
    grpc::ClientContext call;
    return shard_stub_->CreateCollection(&call, request, &response);
  }

  grpc::Status CreatePublic(const v1::CollectionSchema& schema) {
    v1::CreateCollectionRequest request;
    *request.mutable_schema() = schema;
    v1::CreateCollectionResponse response;
    grpc::ClientContext call;
    return admin_stub_->CreateCollection(&call, request, &response);
  }

  grpc::Status ShardUpsert(const std::string& collection, uint32_t shard,
                           const std::vector<v1::Document>& documents,
                           v1::UpsertResponse* response) {
    v1::ShardUpsertRequest request;
    request.set_collection(collection);
    request.set_shard(shard);
    for (const v1::Document& document : documents) *request.add_documents() = document;
    grpc::ClientContext call;
    return shard_stub_->Upsert(&call, request, response);
  }

  // One message on the public Upsert stream.
  grpc::Status PublicUpsert(const std::string& collection,
                            const std::vector<v1::Document>& documents,
                            v1::UpsertResponse* response) {
    v1::UpsertRequest request;
    request.set_collection(collection);
    for (const v1::Document& document : documents) *request.add_documents() = document;
    grpc::ClientContext call;
    auto stream = ingest_stub_->Upsert(&call);
    stream->Write(request);
    stream->WritesDone();
    stream->Read(response);
    return stream->Finish();
  }

  grpc::Status ShardGet(const std::string& collection, uint32_t shard, const std::string& id,
                        v1::GetResponse* response) {
    v1::ShardGetRequest request;
    request.set_collection(collection);
    request.set_shard(shard);
    request.set_id(id);
    grpc::ClientContext call;
    return shard_stub_->Get(&call, request, response);
  }

  grpc::Status PublicGet(const std::string& collection, const std::string& id,
                         v1::GetResponse* response) {
    v1::GetRequest request;
    request.set_collection(collection);
    request.set_id(id);
    grpc::ClientContext call;
    return ingest_stub_->Get(&call, request, response);
  }

  grpc::Status ShardDelete(const std::string& collection, uint32_t shard,
                           const std::vector<std::string>& ids, v1::DeleteResponse* response) {
    v1::ShardDeleteRequest request;
    request.set_collection(collection);
    request.set_shard(shard);
    for (const std::string& id : ids) request.add_ids(id);
    grpc::ClientContext call;
    return shard_stub_->Delete(&call, request, response);
  }

  static v1::SearchRequest Query(const std::string& collection, uint32_t k, uint32_t seed,
                                 int64_t dim = kDim) {
    v1::SearchRequest request;
    request.set_collection(collection);
    request.set_k(k);
    *request.mutable_query() = RandomDocument("q", 3, seed, dim).tokens();
    return request;
  }

  grpc::Status ShardSearch(const v1::SearchRequest& search, uint32_t shard,
                           v1::ShardSearchResponse* response, uint32_t whole_shards = 0) {
    v1::ShardSearchRequest request;
    request.set_shard(shard);
    *request.mutable_search() = search;
    request.set_whole_shards(whole_shards);
    grpc::ClientContext call;
    return shard_stub_->Search(&call, request, response);
  }

  grpc::Status PublicSearch(const v1::SearchRequest& search, v1::SearchResponse* response) {
    grpc::ClientContext call;
    return query_stub_->Search(&call, search, response);
  }

  v1::ShardInfoResponse Info() {
    v1::ShardInfoResponse response;
    grpc::ClientContext call;
    const grpc::Status status = shard_stub_->Info(&call, v1::ShardInfoRequest{}, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  static std::vector<std::string> Replicas(const v1::ShardInfoResponse& info) {
    std::vector<std::string> out;
    for (const v1::ShardReplica& r : info.replicas()) {
      out.push_back(absl::StrCat(r.collection(), "/", r.shard()));
    }
    return out;
  }

  std::filesystem::path dir_;
  ServerConfig config_;
  std::unique_ptr<LoopbackServer> node_;
  std::unique_ptr<v1::ShardService::Stub> shard_stub_;
  std::unique_ptr<v1::AdminService::Stub> admin_stub_;
  std::unique_ptr<v1::IngestService::Stub> ingest_stub_;
  std::unique_ptr<v1::QueryService::Stub> query_stub_;

 private:
  static inline std::atomic<int> counter_{0};
};

// Equal codes and messages.
void ExpectSameStatus(const grpc::Status& shard, const grpc::Status& expected,
                      const std::string& what) {
  EXPECT_EQ(shard.error_code(), expected.error_code()) << what << ": " << shard.error_message();
  EXPECT_EQ(shard.error_message(), expected.error_message()) << what;
}

TEST_F(ShardServiceTest, ReplicasOfTwoShardsAreIndependent) {
  ASSERT_TRUE(CreateReplica(Schema("c", 2), 0).ok());
  ASSERT_TRUE(CreateReplica(Schema("c", 2), 1).ok());
  EXPECT_THAT(Replicas(Info()), ElementsAre("c/0", "c/1"));
  EXPECT_EQ(Info().node_id(), "node-a");

  v1::UpsertResponse upserted;
  ASSERT_TRUE(ShardUpsert("c", 0, {RandomDocument("a", 4, 1)}, &upserted).ok());
  ASSERT_EQ(upserted.results_size(), 1);
  EXPECT_EQ(upserted.results(0).code(), 0) << upserted.results(0).message();
  EXPECT_EQ(upserted.results(0).version(), 1u);

  v1::GetResponse got;
  ASSERT_TRUE(ShardGet("c", 0, "a", &got).ok());
  EXPECT_EQ(got.id(), "a");
  EXPECT_EQ(got.num_tokens(), 4u);
  const grpc::Status missing = ShardGet("c", 1, "a", &got);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(missing.error_message(), "document 'a' not found in collection 'c'");

  v1::ShardSearchResponse found;
  ASSERT_TRUE(ShardSearch(Query("c", 5, 7), 0, &found).ok());
  ASSERT_EQ(found.search().hits_size(), 1);
  EXPECT_EQ(found.search().hits(0).id(), "a");
  EXPECT_EQ(found.documents(), 1u);
  ASSERT_TRUE(ShardSearch(Query("c", 5, 7), 1, &found).ok());
  EXPECT_EQ(found.search().hits_size(), 0);

  // The same id on the other shard is a separate document.
  ASSERT_TRUE(ShardUpsert("c", 1, {RandomDocument("a", 2, 2)}, &upserted).ok());
  EXPECT_EQ(upserted.results(0).version(), 1u);
  v1::DeleteResponse deleted;
  ASSERT_TRUE(ShardDelete("c", 1, {"a", "b"}, &deleted).ok());
  EXPECT_THAT(deleted.existed(), ElementsAre(true, false));
  ASSERT_TRUE(ShardGet("c", 0, "a", &got).ok());
  EXPECT_EQ(got.num_tokens(), 4u);

  v1::ShardDropCollectionRequest drop;
  drop.set_collection("c");
  drop.set_shard(1);
  v1::ShardDropCollectionResponse dropped;
  grpc::ClientContext call;
  ASSERT_TRUE(shard_stub_->DropCollection(&call, drop, &dropped).ok());
  EXPECT_THAT(Replicas(Info()), ElementsAre("c/0"));
  ASSERT_TRUE(ShardGet("c", 0, "a", &got).ok());
  EXPECT_EQ(ShardGet("c", 1, "a", &got).error_message(), "collection 'c' not found");
}

// A replica searched alone is the public search of the same documents; searched as one of
// whole_shards shards, it reranks its share of N.
TEST_F(ShardServiceTest, ShardSearchIsThePublicSearchOfTheSameDocuments) {
  ASSERT_TRUE(CreatePublic(Schema("p")).ok());
  ASSERT_TRUE(CreateReplica(Schema("c", 4), 2).ok());
  std::vector<v1::Document> documents;
  for (int i = 0; i < 60; ++i) {
    documents.push_back(RandomDocument(absl::StrCat("doc", i), 3 + i % 5, 100 + i));
  }
  v1::UpsertResponse response;
  ASSERT_TRUE(PublicUpsert("p", documents, &response).ok());
  ASSERT_TRUE(ShardUpsert("c", 2, documents, &response).ok());
  // A second version of some, so that versions are compared too.
  ASSERT_TRUE(PublicUpsert("p", {documents[3], documents[7]}, &response).ok());
  ASSERT_TRUE(ShardUpsert("c", 2, {documents[3], documents[7]}, &response).ok());

  for (uint32_t seed : {1u, 2u, 3u}) {
    // N 0: the default (100) covers the 60 documents; N 20: the cascade.
    for (uint32_t num_candidates : {0u, 20u}) {
      SCOPED_TRACE(absl::StrCat("seed ", seed, " N ", num_candidates));
      v1::SearchRequest search = Query("p", 10, seed);
      search.set_num_candidates(num_candidates);
      v1::SearchResponse expected;
      ASSERT_TRUE(PublicSearch(search, &expected).ok());
      ASSERT_EQ(expected.hits_size(), 10);
      search.set_collection("c");

      v1::ShardSearchResponse alone;
      ASSERT_TRUE(ShardSearch(search, 2, &alone).ok());
      EXPECT_EQ(alone.documents(), 60u);
      const uint32_t n = num_candidates == 0 ? 100u : 20u;
      EXPECT_EQ(alone.num_candidates(), n);
      std::vector<SearchResult> answers;
      answers.push_back(SearchResultFromShardProto(&alone));
      const SearchResult merged = MergeTopK(answers, 10);
      ASSERT_EQ(merged.hits.size(), 10u);
      for (int i = 0; i < 10; ++i) {
        EXPECT_EQ(merged.hits[i].id, expected.hits(i).id()) << i;
        EXPECT_EQ(merged.hits[i].score, expected.hits(i).score()) << i;
        EXPECT_EQ(merged.hits[i].version, expected.hits(i).version()) << i;
      }
      EXPECT_EQ(merged.documents_scored, static_cast<int64_t>(expected.documents_scored()));
      EXPECT_EQ(merged.exhaustive, expected.exhaustive());
      EXPECT_GT(alone.search().timings().total_ms(), 0);

      // As one of 4 shards: ⌈N / 4⌉ of its documents, 25 or 5, go to the rerank.
      v1::ShardSearchResponse part;
      ASSERT_TRUE(ShardSearch(search, 2, &part, 4).ok());
      EXPECT_EQ(part.num_candidates(), n);
      EXPECT_EQ(part.search().documents_scored(), (n + 3) / 4);
      EXPECT_FALSE(part.search().exhaustive());
      EXPECT_EQ(part.search().hits_size(), std::min(10u, (n + 3) / 4));
    }
  }
}

// The snapshot RPCs a router's cluster snapshots use: a replica's snapshot (its archive's length
// as announced), downloaded and restored under another replica's local name, answers the same;
// bad input names what is wrong.
TEST_F(ShardServiceTest, ReplicaSnapshotRestoresUnderAnotherReplicaName) {
  ASSERT_TRUE(CreateReplica(Schema("papers", 2), 1).ok());
  std::vector<v1::Document> documents;
  for (int i = 0; i < 20; ++i) {
    documents.push_back(RandomDocument(absl::StrCat("d", i), 4, static_cast<uint32_t>(i)));
  }
  v1::UpsertResponse upserted;
  ASSERT_TRUE(ShardUpsert("papers", 1, documents, &upserted).ok());

  v1::ShardSnapshotRequest create;
  create.set_collection("papers");
  create.set_shard(0);  // not held here
  v1::ShardSnapshotResponse created;
  {
    grpc::ClientContext call;
    const grpc::Status status = shard_stub_->CreateReplicaSnapshot(&call, create, &created);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("'papers'"));
  }
  create.set_shard(1);
  {
    grpc::ClientContext call;
    const grpc::Status status = shard_stub_->CreateReplicaSnapshot(&call, create, &created);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_THAT(created.snapshot().id(), ::testing::StartsWith("papers.shard-1@"));

  std::string archive;
  {
    v1::DownloadSnapshotRequest request;
    request.set_id(created.snapshot().id());
    grpc::ClientContext call;
    auto reader = shard_stub_->DownloadReplicaSnapshot(&call, request);
    v1::SnapshotChunk chunk;
    while (reader->Read(&chunk)) archive += chunk.data();
    ASSERT_TRUE(reader->Finish().ok());
  }
  EXPECT_EQ(archive.size(), created.archive_bytes());

  const auto restore = [&](const std::string& name) {
    grpc::ClientContext call;
    v1::RestoreSnapshotResponse response;
    auto writer = shard_stub_->RestoreReplicaSnapshot(&call, &response);
    v1::RestoreSnapshotRequest request;
    request.set_new_collection(name);
    request.set_data(archive);
    writer->Write(request);
    writer->WritesDone();
    return writer->Finish();
  };
  const grpc::Status not_a_replica = restore("copy");
  EXPECT_EQ(not_a_replica.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(not_a_replica.error_message(), HasSubstr("new_collection 'copy': not a replica"));
  const grpc::Status restored = restore(ReplicaName("copy", 1));
  ASSERT_TRUE(restored.ok()) << restored.error_message();
  for (const v1::Document& document : documents) {
    v1::GetResponse want;
    v1::GetResponse got;
    ASSERT_TRUE(ShardGet("papers", 1, document.id(), &want).ok());
    ASSERT_TRUE(ShardGet("copy", 1, document.id(), &got).ok()) << document.id();
    EXPECT_EQ(got.vectors().data(), want.vectors().data()) << document.id();
    EXPECT_EQ(got.version(), want.version()) << document.id();
  }

  v1::DeleteSnapshotRequest drop;
  drop.set_id(created.snapshot().id());
  v1::DeleteSnapshotResponse dropped;
  {
    grpc::ClientContext call;
    EXPECT_TRUE(shard_stub_->DeleteReplicaSnapshot(&call, drop, &dropped).ok());
  }
  {
    grpc::ClientContext call;
    EXPECT_EQ(shard_stub_->DeleteReplicaSnapshot(&call, drop, &dropped).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
}

TEST_F(ShardServiceTest, BadInputIsAnsweredAsThePublicApiAnswersIt) {
  // The public collection "c" and the replica c/0 ("c.shard-0") live side by side, so that
  // messages naming the collection must come out the same.
  ASSERT_TRUE(CreatePublic(Schema("c")).ok());
  ASSERT_TRUE(CreateReplica(Schema("c", 2), 0).ok());

  ExpectSameStatus(CreateReplica(Schema("c", 2), 0), CreatePublic(Schema("c")), "existing");
  ExpectSameStatus(CreateReplica(Schema("bad name", 2), 0), CreatePublic(Schema("bad name")),
                   "bad name");
  ExpectSameStatus(CreateReplica(Schema("x", 2, 0), 0), CreatePublic(Schema("x", 1, 0)), "dim 0");
  ExpectSameStatus(CreateReplica(Schema("x", 300), 0), CreatePublic(Schema("x", 300)),
                   "num_shards 300");

  v1::GetResponse got;
  ExpectSameStatus(ShardGet("", 0, "a", &got), PublicGet("", "a", &got), "empty collection");
  ExpectSameStatus(ShardGet("nope", 0, "a", &got), PublicGet("nope", "a", &got), "unknown");
  ExpectSameStatus(ShardGet("c", 0, "a", &got), PublicGet("c", "a", &got), "unknown id");
  ExpectSameStatus(ShardGet("c", 1, "a", &got),
                   grpc::Status(grpc::StatusCode::NOT_FOUND, "collection 'c' not found"),
                   "replica not held");

  v1::SearchResponse searched;
  v1::ShardSearchResponse shard_searched;
  for (auto [what, tweak] :
       std::vector<std::pair<std::string, std::function<void(v1::SearchRequest*)>>>{
           {"k over max_k", [](v1::SearchRequest* r) { r->set_k(51); }},
           {"num_candidates over the limit",
            [](v1::SearchRequest* r) { r->set_num_candidates(201); }},
           {"query dim", [](v1::SearchRequest* r) { *r = Query("c", 5, 1, kDim + 1); }},
           {"query bytes", [](v1::SearchRequest* r) { r->mutable_query()->set_data("xyz"); }},
           {"filter on an unknown field",
            [](v1::SearchRequest* r) { r->mutable_filter()->add_all_of()->set_field("missing"); }},
       }) {
    v1::SearchRequest search = Query("c", 5, 1);
    tweak(&search);
    const grpc::Status expected = PublicSearch(search, &searched);
    EXPECT_FALSE(expected.ok()) << what;
    ExpectSameStatus(ShardSearch(search, 0, &shard_searched), expected, what);
  }

  // Per-document results: a wrong dimension, an empty id, an attribute the schema lacks.
  std::vector<v1::Document> documents = {RandomDocument("ok", 2, 1),
                                         RandomDocument("wide", 2, 2, kDim + 1),
                                         RandomDocument("", 2, 3), RandomDocument("attr", 2, 4)};
  (*documents[3].mutable_attributes())["year"].set_int_value(2020);
  v1::UpsertResponse expected, actual;
  ASSERT_TRUE(PublicUpsert("c", documents, &expected).ok());
  ASSERT_TRUE(ShardUpsert("c", 0, documents, &actual).ok());
  ASSERT_EQ(actual.results_size(), expected.results_size());
  for (int i = 0; i < actual.results_size(); ++i) {
    EXPECT_EQ(actual.results(i).code(), expected.results(i).code()) << i;
    EXPECT_EQ(actual.results(i).message(), expected.results(i).message()) << i;
  }
  EXPECT_NE(actual.results(1).code(), 0);
  EXPECT_NE(actual.results(2).code(), 0);
  EXPECT_NE(actual.results(3).code(), 0);
  EXPECT_THAT(actual.results(3).message(), HasSubstr("collection 'c'"));

  // Too many documents in one request.
  const std::vector<v1::Document> many(config_.max_documents_per_batch + 1,
                                       RandomDocument("m", 1, 4));
  ExpectSameStatus(ShardUpsert("c", 0, many, &actual), PublicUpsert("c", many, &expected), "batch");

  // What only a shard request can get wrong.
  const grpc::Status beyond = CreateReplica(Schema("y", 2), 2);
  EXPECT_EQ(beyond.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(beyond.error_message(), "shard 2, collection 'y' has 2 shards");
  const grpc::Status huge = ShardGet("c", 256, "a", &got);
  EXPECT_EQ(huge.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(huge.error_message(), "shard 256, expected 0 … 255");
  const grpc::Status long_name =
      CreateReplica(Schema(std::string(kMaxClusterCollectionName + 1, 'n'), 1), 0);
  EXPECT_EQ(long_name.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(long_name.error_message(), HasSubstr("at most 118"));
  EXPECT_TRUE(CreateReplica(Schema(std::string(kMaxClusterCollectionName, 'n'), 256), 255).ok());
}

}  // namespace
}  // namespace tessera::server
