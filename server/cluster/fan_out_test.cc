// FanOut against a real gRPC server on a loopback port: completions in any order, continuations
// that start further calls, and a call to a node that is not there.
#include "server/cluster/fan_out.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tessera/v1/shard.grpc.pb.h"

namespace tessera::cluster {
namespace {

// Answers Count with the request's shard number after shard milliseconds of sleep, so that
// higher shards finish later; shard 999 fails NOT_FOUND.
class SlowCounter final : public v1::ShardService::Service {
  grpc::Status Count(grpc::ServerContext*, const v1::ShardCountRequest* request,
                     v1::CountResponse* response) override {
    if (request->shard() == 999) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no shard 999");
    std::this_thread::sleep_for(std::chrono::milliseconds(request->shard()));
    response->set_count(request->shard());
    return grpc::Status::OK;
  }
};

class FanOutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::ShardService::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                          grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(); }

  static std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return context;
  }

  SlowCounter service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::ShardService::Stub> stub_;
};

TEST_F(FanOutTest, WaitsForEveryCallWhateverOrderTheyFinishIn) {
  constexpr int kCalls = 8;
  std::vector<v1::ShardCountRequest> requests(kCalls);
  std::vector<v1::CountResponse> responses(kCalls);
  std::vector<grpc::StatusCode> codes(kCalls, grpc::StatusCode::UNKNOWN);
  std::vector<int> finish_order;
  FanOut fan_out;
  for (int i = 0; i < kCalls; ++i) {
    requests[i].set_shard(static_cast<uint32_t>(10 * (kCalls - i)));  // the first is slowest
    fan_out.Call(
        Context(),
        UnaryCall(stub_.get(), &v1::ShardService::Stub::AsyncCount, &requests[i], &responses[i]),
        [&, i](const grpc::Status& status) {
          codes[i] = status.error_code();
          finish_order.push_back(i);
        });
  }
  fan_out.Wait();
  ASSERT_EQ(finish_order.size(), static_cast<size_t>(kCalls));
  for (int i = 0; i < kCalls; ++i) {
    EXPECT_EQ(codes[i], grpc::StatusCode::OK) << i;
    EXPECT_EQ(responses[i].count(), static_cast<uint64_t>(10 * (kCalls - i))) << i;
  }
  EXPECT_EQ(finish_order.back(), 0);  // the slowest, which Wait had to wait for
}

TEST_F(FanOutTest, ContinuationsStartFurtherCallsThatWaitAlsoWaitsFor) {
  // A chain as the router's replica retries make: a failure's continuation starts the next call.
  v1::ShardCountRequest failing;
  failing.set_shard(999);
  v1::ShardCountRequest next;
  next.set_shard(30);
  v1::CountResponse first_response;
  v1::CountResponse second_response;
  std::vector<grpc::StatusCode> seen;
  FanOut fan_out;
  fan_out.Call(
      Context(),
      UnaryCall(stub_.get(), &v1::ShardService::Stub::AsyncCount, &failing, &first_response),
      [&](const grpc::Status& status) {
        seen.push_back(status.error_code());
        fan_out.Call(
            Context(),
            UnaryCall(stub_.get(), &v1::ShardService::Stub::AsyncCount, &next, &second_response),
            [&](const grpc::Status& retried) { seen.push_back(retried.error_code()); });
      });
  fan_out.Wait();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(seen[1], grpc::StatusCode::OK);
  EXPECT_EQ(second_response.count(), 30u);
}

TEST_F(FanOutTest, ACallToANodeThatIsNotThereFinishesUnavailable) {
  // A port with nothing listening: bind one, then close it.
  int port = 0;
  {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    SlowCounter unused;
    builder.RegisterService(&unused);
    std::unique_ptr<grpc::Server> closed = builder.BuildAndStart();
    closed->Shutdown();
  }
  auto stub = v1::ShardService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  v1::ShardCountRequest request;
  v1::CountResponse response;
  grpc::StatusCode code = grpc::StatusCode::OK;
  FanOut fan_out;
  fan_out.Call(Context(),
               UnaryCall(stub.get(), &v1::ShardService::Stub::AsyncCount, &request, &response),
               [&](const grpc::Status& status) { code = status.error_code(); });
  fan_out.Wait();
  EXPECT_EQ(code, grpc::StatusCode::UNAVAILABLE);
}

TEST_F(FanOutTest, OfNothingReturnsAtOnce) {
  FanOut fan_out;
  fan_out.Wait();
}

}  // namespace
}  // namespace tessera::cluster
