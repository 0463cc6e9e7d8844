// The public services behind a real gRPC server on a loopback port, over a real engine in a
// temporary directory: API key refusals by the transport, the search limits (checked by the
// collection alone) and Get returning the stored vector bytes unchanged.
#include "server/services.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/auth.h"
#include "server/convert.h"
#include "server/testing/loopback_server.h"
#include "tessera/float16.h"

namespace tessera::server {
namespace {

using ::testing::HasSubstr;

class ServicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("services_test_", ::getpid(), "_", counter_++);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  void TearDown() override {
    node_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Starts the services as server_main does: the engine's limits from the config, and API keys
  // (checked by the credentials) when `key_file` has lines.
  void Start(const std::string& key_file = "") {
    LoopbackServerOptions options;
    options.config.max_k = 50;
    options.config.max_num_candidates = 200;
    options.config.max_searches_per_batch = max_searches_per_batch_;
    options.admission = admission_options_;
    if (!key_file.empty()) {
      const std::string path = (dir_ / "keys").string();
      std::ofstream(path) << key_file;
      auto keys = ApiKeys::Load(path);
      ASSERT_TRUE(keys.ok()) << keys.status();
      keys_ = std::move(*keys);
      options.keys = keys_.get();
    }
    auto node = LoopbackServer::Start((dir_ / "data").string(), options);
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
  }

  // A collection without pooling (every token is stored as it came) holding `tokens` (rows × dim)
  // as document "d".
  std::shared_ptr<Collection> CreateWithDocument(const std::string& name, VectorDtype dtype,
                                                 int64_t dim, const std::vector<float>& tokens) {
    CollectionSchema schema;
    schema.name = name;
    schema.dim = dim;
    schema.dtype = dtype;
    schema.pooling = PoolingSpec{};
    auto collection = node_->engine()->CreateCollection(schema);
    EXPECT_TRUE(collection.ok()) << collection.status();
    if (!collection.ok()) return nullptr;
    Document document;
    document.id = "d";
    document.dim = dim;
    document.num_tokens = static_cast<int64_t>(tokens.size()) / dim;
    document.tokens = tokens;
    const std::vector<UpsertOutcome> outcomes = (*collection)->Upsert({document});
    EXPECT_TRUE(outcomes[0].status.ok()) << outcomes[0].status;
    return *collection;
  }

  // A one-token search of collection "c" with `settings` applied to the request.
  grpc::Status SearchWith(const std::function<void(v1::SearchRequest*)>& settings,
                          const std::string& api_key = "") {
    v1::SearchRequest request;
    request.set_collection("c");
    const std::vector<float> query(kDim, 0.25f);
    EncodeMatrix(query.data(), 1, kDim, VectorDtype::kFloat32, request.mutable_query());
    settings(&request);
    grpc::ClientContext call;
    if (!api_key.empty()) call.AddMetadata("authorization", "Bearer " + api_key);
    v1::SearchResponse response;
    return v1::QueryService::NewStub(node_->channel())->Search(&call, request, &response);
  }

  grpc::Status Search(uint32_t k, uint32_t num_candidates, const std::string& api_key = "") {
    return SearchWith(
        [&](v1::SearchRequest* request) {
          request->set_k(k);
          request->set_num_candidates(num_candidates);
        },
        api_key);
  }

  static constexpr int64_t kDim = 4;

  std::filesystem::path dir_;
  AdmissionOptions admission_options_;
  int64_t max_searches_per_batch_ = 64;
  std::unique_ptr<ApiKeys> keys_;  // outlives node_
  std::unique_ptr<LoopbackServer> node_;

 private:
  static inline std::atomic<int> counter_{0};
};

TEST_F(ServicesTest, GetPutsTheStoredFp16BitsOnTheWire) {
  Start();
  // Values fp16 holds exactly, so the stored bits are known: normals, the largest finite value,
  // subnormals down to the smallest, and one that fp16 → fp32 → fp16 must not disturb.
  const std::vector<float> tokens = {0.5f,      -0.333251953125f, 65504.0f,     -65504.0f, 0x1p-24f,
                                     -0x1p-24f, 0x1p-14f,         0x1.ff8p-15f, 1.0f,      0.0f,
                                     -2.0f,     0.0999755859375f};
  std::string expected(tokens.size() * sizeof(Float16), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    const Float16 half = FloatToHalf(tokens[i]);
    ASSERT_EQ(HalfToFloat(half), tokens[i]) << i;  // exact in fp16
    std::memcpy(&expected[i * sizeof(Float16)], &half, sizeof(Float16));
  }
  std::shared_ptr<Collection> collection =
      CreateWithDocument("c", VectorDtype::kFloat16, kDim, tokens);
  ASSERT_NE(collection, nullptr);

  v1::GetRequest request;
  request.set_collection("c");
  request.set_id("d");
  v1::GetResponse response;
  grpc::ClientContext call;
  const grpc::Status status =
      v1::IngestService::NewStub(node_->channel())->Get(&call, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.vectors().dtype(), v1::DTYPE_FLOAT16);
  EXPECT_EQ(response.vectors().rows(), 3u);
  EXPECT_EQ(response.vectors().cols(), static_cast<uint32_t>(kDim));
  EXPECT_EQ(response.vectors().data(), expected);

  // The same bytes as the index holds, and as the fp32 decode re-encoded (what the wire carried
  // before the bytes went through unchanged).
  GetOptions as_stored;
  as_stored.stored_bytes = true;
  auto stored = collection->Get("d", as_stored);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE(stored->vectors.empty());
  EXPECT_EQ(stored->num_vectors(), 3);
  EXPECT_EQ(stored->vector_bytes, expected);
  auto decoded = collection->Get("d");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(decoded->vector_bytes.empty());
  EXPECT_EQ(decoded->vectors, tokens);
  v1::GetResponse reencoded;
  StoredDocumentToProto(*decoded, &reencoded);
  EXPECT_EQ(reencoded.SerializeAsString(), response.SerializeAsString());
}

TEST_F(ServicesTest, GetPutsStoredFp32BytesOnTheWire) {
  Start();
  // Values fp16 cannot hold: a subnormal of fp32 and more precision than fp16 has.
  const std::vector<float> tokens = {0.1f, -0.7f, 1e-40f, 12345.678f, 0.2f, 0.3f, -0.4f, 0.5f};
  ASSERT_NE(CreateWithDocument("c", VectorDtype::kFloat32, kDim, tokens), nullptr);
  v1::GetRequest request;
  request.set_collection("c");
  request.set_id("d");
  v1::GetResponse response;
  grpc::ClientContext call;
  ASSERT_TRUE(v1::IngestService::NewStub(node_->channel())->Get(&call, request, &response).ok());
  EXPECT_EQ(response.vectors().dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(response.vectors().rows(), 2u);
  EXPECT_EQ(response.vectors().data(),
            std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4));
}

TEST_F(ServicesTest, SearchLimitsComeFromTheCollectionWithFieldValueAndLimit) {
  Start();
  ASSERT_NE(CreateWithDocument("c", VectorDtype::kFloat16, kDim, std::vector<float>(8, 0.5f)),
            nullptr);
  EXPECT_TRUE(Search(50, 0).ok());
  EXPECT_TRUE(Search(0, 0).ok());  // 0 = the default k, 10
  EXPECT_TRUE(Search(10, 200).ok());
  struct Case {
    uint32_t k, num_candidates;
    std::string message;
  };
  const std::vector<Case> cases = {
      {51, 0, "k 51 exceeds the limit of 50"},
      {std::numeric_limits<uint32_t>::max(), 0, "k 4294967295 exceeds the limit of 50"},
      {10, 201, "num_candidates 201 exceeds the limit of 200"},
      {10, std::numeric_limits<uint32_t>::max(),
       "num_candidates 4294967295 exceeds the limit of 200"},
      {10, 5, "num_candidates 5 is below k 10"},
  };
  for (const Case& c : cases) {
    const grpc::Status status = Search(c.k, c.num_candidates);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message;
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
  }
}

TEST_F(ServicesTest, StageOneParametersReachTheCollectionUnclamped) {
  Start();
  ASSERT_NE(CreateWithDocument("c", VectorDtype::kFloat16, kDim, std::vector<float>(8, 0.5f)),
            nullptr);
  const auto search = [&](uint32_t per_token_candidates, uint32_t nprobe) {
    return SearchWith([&](v1::SearchRequest* request) {
      request->set_per_token_candidates(per_token_candidates);
      request->set_nprobe(nprobe);
    });
  };
  EXPECT_TRUE(search(100000, 16384).ok());
  const struct {
    uint32_t per_token_candidates, nprobe;
    std::string message;
  } cases[] = {
      {100001, 0, "per_token_candidates 100001, expected 0 … 100000"},
      {std::numeric_limits<uint32_t>::max(), 0,
       "per_token_candidates 4294967295, expected 0 … 100000"},
      {0, 16385, "nprobe 16385, expected 0 … 16384"},
      {0, std::numeric_limits<uint32_t>::max(), "nprobe 4294967295, expected 0 … 16384"},
  };
  for (const auto& c : cases) {
    const grpc::Status status = search(c.per_token_candidates, c.nprobe);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message;
    EXPECT_EQ(status.error_message(), c.message);
  }
}

// The key file line of `key` with `rest` (scopes and options): its SHA-256 in hex.
std::string KeyLine(const std::string& key, const std::string& rest) {
  std::string line = "sha256:";
  for (uint8_t byte : HashKey(key)) absl::StrAppend(&line, absl::Hex(byte, absl::kZeroPad2));
  return absl::StrCat(line, " ", rest, "\n");
}

TEST_F(ServicesTest, TheTransportRefusesCallsBeforeTheirHandlersWithCodeAndMessage) {
  Start(KeyLine("r3ad", "read name=reader") + KeyLine("wr1te", "write"));
  ASSERT_NE(CreateWithDocument("c", VectorDtype::kFloat16, kDim, std::vector<float>(8, 0.5f)),
            nullptr);
  EXPECT_TRUE(Search(5, 0, "r3ad").ok());

  grpc::Status status = Search(5, 0);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(status.error_message(), "missing 'authorization: Bearer KEY' metadata");
  status = Search(5, 0, "wrong");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(status.error_message(), "unknown API key");
  // An authorised call's own errors come through the handler's mapping.
  status = Search(51, 0, "r3ad");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  const std::string wr1te_name = KeyLine("wr1te", "").substr(7, 12);
  for (const auto& [key, label, scope] : {std::tuple{"r3ad", std::string("reader"), "read"},
                                          std::tuple{"wr1te", wr1te_name, "write"}}) {
    v1::DropCollectionRequest request;
    request.set_name("c");
    v1::DropCollectionResponse response;
    grpc::ClientContext call;
    call.AddMetadata("authorization", absl::StrCat("Bearer ", key));
    status = v1::AdminService::NewStub(node_->channel())->DropCollection(&call, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(status.error_message(),
              absl::StrCat("the API key '", label, "' has scope '", scope,
                           "', /tessera.v1.AdminService/DropCollection needs 'admin'"));
  }
  // The Upsert stream ends with the same status before its handler reads a message.
  grpc::ClientContext call;
  call.AddMetadata("authorization", "Bearer r3ad");
  auto stream = v1::IngestService::NewStub(node_->channel())->Upsert(&call);
  stream->WritesDone();
  v1::UpsertResponse response;
  EXPECT_FALSE(stream->Read(&response));
  status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(
      status.error_message(),
      "the API key 'reader' has scope 'read', /tessera.v1.IngestService/Upsert needs 'write'");
  EXPECT_TRUE(node_->engine()->GetCollection("c").ok());
}

TEST_F(ServicesTest, AKeyOverItsRateIsRefusedWithResourceExhaustedAndRecovers) {
  // 2 calls per second: a burst of two passes, the third is refused, and a second later the
  // bucket holds two again.
  Start(KeyLine("slow", "read name=slow rate=2") + KeyLine("fast", "read"));
  ASSERT_NE(CreateWithDocument("c", VectorDtype::kFloat16, kDim, std::vector<float>(8, 0.5f)),
            nullptr);
  EXPECT_TRUE(Search(5, 0, "slow").ok());
  EXPECT_TRUE(Search(5, 0, "slow").ok());
  const grpc::Status refused = Search(5, 0, "slow");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refused.error_message(),
            "the API key 'slow' is over its rate limit of 2 calls per second");
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(Search(5, 0, "fast").ok()) << "unlimited key " << i;
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_TRUE(Search(5, 0, "slow").ok());
  EXPECT_TRUE(Search(5, 0, "slow").ok());
}

// Blocks the admission's only worker until Release(): what a saturated server looks like.
// Release() returns once the admission has run everything queued behind it, so that the next
// call finds the server idle.
class BlockedWorker {
 public:
  explicit BlockedWorker(Admission* admission) : admission_(admission) {
    EXPECT_TRUE(admission
                    ->Submit(0,
                             [this] {
                               started_.Notify();
                               release_.WaitForNotification();
                               done_.Notify();
                             })
                    .ok());
    started_.WaitForNotification();
  }
  // The worker must have left the task (and its use of this object) before it is destroyed.
  ~BlockedWorker() { Release(); }

  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
    done_.WaitForNotification();
    while (admission_->queued() > 0 || admission_->inflight_bytes() > 0) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

 private:
  Admission* const admission_;
  absl::Notification started_, release_, done_;
};

TEST_F(ServicesTest, ASaturatedServerRefusesAtOnceWithResourceExhaustedNamingTheLimit) {
  admission_options_.workers = 1;
  admission_options_.max_queued = 1;
  Start();
  ASSERT_NE(CreateWithDocument("c", VectorDtype::kFloat16, kDim, std::vector<float>(8, 0.5f)),
            nullptr);
  BlockedWorker blocked(node_->admission());
  ASSERT_TRUE(node_->admission()->Submit(0, [] {}).ok());  // the queue's one place is taken

  const grpc::Status refused = Search(5, 0);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refused.error_message(),
            "server busy: 1 requests already wait for a worker (--max_queued_requests 1); retry "
            "with backoff");
  // The Upsert stream is refused per message, the same way.
  grpc::ClientContext call;
  auto stream = v1::IngestService::NewStub(node_->channel())->Upsert(&call);
  v1::UpsertRequest request;
  request.set_collection("c");
  ASSERT_TRUE(stream->Write(request));
  v1::UpsertResponse response;
  EXPECT_FALSE(stream->Read(&response));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  blocked.Release();
  EXPECT_TRUE(Search(5, 0).ok());
}

// SearchBatch had no cap on its searches and counted as one request against the queue's bound:
// a batch over --max_searches_per_batch is refused naming the value and the cap, and each search
// of an admitted one takes a place in the queue.
TEST_F(ServicesTest, SearchBatchIsCappedAndEachOfItsSearchesCountsAgainstTheQueue) {
  admission_options_.workers = 1;
  admission_options_.max_queued = 4;
  max_searches_per_batch_ = 8;
  Start();
  ASSERT_NE(CreateWithDocument("c", VectorDtype::kFloat16, kDim, std::vector<float>(8, 0.5f)),
            nullptr);
  auto batch = [this](int searches, v1::SearchBatchResponse* response) {
    v1::SearchBatchRequest request;
    const std::vector<float> query(kDim, 0.25f);
    for (int i = 0; i < searches; ++i) {
      v1::SearchRequest* search = request.add_searches();
      search->set_collection("c");
      search->set_k(5);
      EncodeMatrix(query.data(), 1, kDim, VectorDtype::kFloat32, search->mutable_query());
    }
    grpc::ClientContext call;
    return v1::QueryService::NewStub(node_->channel())->SearchBatch(&call, request, response);
  };
  v1::SearchBatchResponse response;
  // More searches than the queue holds, at the cap, with nothing queued: admitted, all answered.
  ASSERT_TRUE(batch(8, &response).ok());
  EXPECT_EQ(response.responses_size(), 8);
  const grpc::Status capped = batch(9, &response);
  EXPECT_EQ(capped.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(capped.error_message(),
            "searches: 9 in one SearchBatch exceeds the limit of 8 (--max_searches_per_batch)");

  BlockedWorker blocked(node_->admission());
  ASSERT_TRUE(node_->admission()->Submit(0, [] {}).ok());  // 1 of the queue's 4 places
  const grpc::Status refused = batch(4, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refused.error_message(),
            "server busy: 1 requests already wait for a worker and this one counts as 4 (one per "
            "search) (--max_queued_requests 4); retry with backoff");
  blocked.Release();
  response.Clear();
  ASSERT_TRUE(batch(4, &response).ok());
  EXPECT_EQ(response.responses_size(), 4);
}

TEST_F(ServicesTest, RequestBytesInFlightAreBounded) {
  admission_options_.workers = 1;
  admission_options_.max_inflight_bytes = 1024;
  Start();
  ASSERT_NE(CreateWithDocument("c", VectorDtype::kFloat16, kDim, std::vector<float>(8, 0.5f)),
            nullptr);
  BlockedWorker blocked(node_->admission());
  ASSERT_TRUE(node_->admission()->Submit(1000, [] {}).ok());
  const grpc::Status refused = Search(5, 0);  // ~30 bytes more than the limit allows
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("server busy: 1000 request bytes in flight + "));
  EXPECT_THAT(refused.error_message(), HasSubstr("would exceed --max_inflight_bytes 1024"));
  blocked.Release();
  EXPECT_TRUE(Search(5, 0).ok());
}

TEST_F(ServicesTest, DrainingRefusesNewCallsAndWaitsForOpenOnes) {
  Start();
  ASSERT_NE(CreateWithDocument("c", VectorDtype::kFloat16, kDim, std::vector<float>(8, 0.5f)),
            nullptr);
  // An open Upsert stream is an open call: Drain waits for it until its deadline.
  grpc::ClientContext call;
  auto stream = v1::IngestService::NewStub(node_->channel())->Upsert(&call);
  v1::UpsertRequest request;
  request.set_collection("c");
  ASSERT_TRUE(stream->Write(request));
  v1::UpsertResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(node_->admission()->Drain(absl::Now() + absl::Milliseconds(200)), 1);

  const grpc::Status refused = Search(5, 0);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(refused.error_message(), "the server is shutting down; retry elsewhere");
  // The open stream still works; when it ends, nothing is open.
  ASSERT_TRUE(stream->Write(request));
  ASSERT_TRUE(stream->Read(&response));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(node_->admission()->Drain(absl::Now() + absl::Seconds(10)), 0);
}

}  // namespace
}  // namespace tessera::server
