// NodeRegistration against a real etcd (server/cluster/etcd_test_util.h; skipped without
// /usr/bin/etcd): the key and value it writes under a lease, the key written again under a new
// lease when that one is lost, the key deleted and the lease revoked when the registration is
// destroyed, and nothing registered when etcd cannot be reached.
#include "server/cluster/node_registration.h"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/cluster/etcd_client.h"
#include "server/cluster/etcd_test_util.h"

namespace tessera::cluster {
namespace {

constexpr char kKey[] = "/tessera/nodes/node-7";
constexpr char kValue[] = R"({"address":"10.0.0.7:50051","role":"shard","state":"serving"})";

class NodeRegistrationTest : public EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    observer_ = NewClient();
    ASSERT_NE(observer_, nullptr);
  }

  // The node's key as etcd holds it now.
  std::optional<KeyValue> Read() {
    absl::StatusOr<std::optional<KeyValue>> kv = observer_->Get(kKey);
    EXPECT_TRUE(kv.ok()) << kv.status();
    return kv.ok() ? *kv : std::nullopt;
  }

  std::unique_ptr<EtcdClient> observer_;  // reads what the registration wrote
};

TEST(NodeKeyAndValue, AreWhatRoutersRead) {
  EXPECT_EQ(NodeKey("node-7"), kKey);
  EXPECT_EQ(NodeValue("10.0.0.7:50051"), kValue);
}

TEST_F(NodeRegistrationTest, WritesTheKeyUnderALeaseAndDeletesItWhenDestroyed) {
  absl::StatusOr<std::unique_ptr<NodeRegistration>> registration =
      NodeRegistration::Start(NewClient(), "node-7", "10.0.0.7:50051");
  ASSERT_TRUE(registration.ok()) << registration.status();
  EXPECT_EQ((*registration)->key(), kKey);
  const std::optional<KeyValue> kv = Read();
  ASSERT_TRUE(kv.has_value());
  EXPECT_EQ(kv->value, kValue);
  ASSERT_NE(kv->lease, 0) << "the key must expire with a lease when the node dies";

  registration->reset();
  EXPECT_FALSE(Read().has_value());
  // The lease is revoked too: nothing can be attached to it any more.
  const absl::Status revoked = observer_->Put("/tessera/probe", "x", kv->lease).status();
  EXPECT_TRUE(absl::IsNotFound(revoked)) << revoked;
}

TEST_F(NodeRegistrationTest, RegistersAgainUnderANewLeaseWhenTheLeaseIsLost) {
  absl::StatusOr<std::unique_ptr<NodeRegistration>> registration =
      NodeRegistration::Start(NewClient(), "node-7", "10.0.0.7:50051");
  ASSERT_TRUE(registration.ok()) << registration.status();
  const std::optional<KeyValue> first = Read();
  ASSERT_TRUE(first.has_value());
  // As when the lease expires while etcd is out of reach: the key goes with it.
  ASSERT_TRUE(observer_->RevokeLease(first->lease).ok());
  EXPECT_FALSE(Read().has_value());

  // Noticed at the keepalive's next renewal (a third of the TTL), then written again.
  std::optional<KeyValue> again;
  const absl::Time give_up = absl::Now() + absl::Seconds(4 * kNodeLeaseSeconds);
  while (absl::Now() < give_up) {
    again = Read();
    if (again.has_value()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(again.has_value()) << "the node never registered again";
  EXPECT_EQ(again->value, kValue);
  EXPECT_NE(again->lease, 0);
  EXPECT_NE(again->lease, first->lease);

  registration->reset();
  EXPECT_FALSE(Read().has_value());
}

TEST_F(NodeRegistrationTest, NothingIsRegisteredWhenEtcdIsOutOfReach) {
  std::unique_ptr<EtcdClient> client = NewClient(absl::Seconds(1));
  ASSERT_TRUE(etcd_->Stop().ok());
  absl::StatusOr<std::unique_ptr<NodeRegistration>> registration =
      NodeRegistration::Start(std::move(client), "node-7", "10.0.0.7:50051");
  EXPECT_FALSE(registration.ok());
  ASSERT_TRUE(etcd_->Restart().ok());
  // The observer's channel reconnects after the restart.
  absl::StatusOr<std::optional<KeyValue>> kv = observer_->Get(kKey);
  for (int attempt = 0; attempt < 100 && absl::IsUnavailable(kv.status()); ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    kv = observer_->Get(kKey);
  }
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_FALSE(kv->has_value());
}

}  // namespace
}  // namespace tessera::cluster
