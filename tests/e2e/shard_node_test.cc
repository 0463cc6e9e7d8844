// The real tessera-server binary with --role shard against a real etcd
// (server/cluster/etcd_test_util.h; skipped without /usr/bin/etcd): the node registers its
// address under /tessera/nodes/<node_id> with a lease, serves ShardService and not the public API,
// its key expires within the lease's TTL after SIGKILL and is deleted at once on SIGTERM. With
// etcd serving TLS only (ShardNodeEtcdTlsTest) the node registers with --etcd_ca/--etcd_cert/
// --etcd_key and cannot without them.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/cluster/etcd_client.h"
#include "server/cluster/etcd_test_util.h"
#include "server/convert.h"
#include "server/credentials.h"
#include "tessera/v1/ingest.grpc.pb.h"
#include "tessera/v1/shard.grpc.pb.h"

namespace tessera::server {
namespace {

using ::testing::HasSubstr;

constexpr char kKey[] = "/tessera/nodes/node-1";

// One tessera-server process; SIGKILLed if still running when destroyed.
class ServerProcess {
 public:
  static std::unique_ptr<ServerProcess> Spawn(const std::vector<std::string>& args,
                                              const std::string& log) {
    std::vector<std::string> argv = {TESSERA_SERVER_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    const absl::StatusOr<pid_t> pid = cluster::SpawnWithLog(std::move(argv), log);
    if (!pid.ok()) return nullptr;
    return std::unique_ptr<ServerProcess>(new ServerProcess(*pid));
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
  }
  void Signal(int signal) { ::kill(pid_, signal); }
  // The exit status (as waitpid reports it), waiting at most `timeout`; nullopt if still running.
  std::optional<int> Wait(absl::Duration timeout = absl::Seconds(30)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (pid_ > 0) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return status;
      }
      if (absl::Now() > deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return std::nullopt;
  }

 private:
  explicit ServerProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
};

class ShardNodeTest : public ::testing::Test {
 protected:
  // Whether etcd serves its client URL over TLS only, requiring client certificates.
  virtual bool etcd_tls() const { return false; }

  void SetUp() override {
    cluster::EtcdTestServerOptions etcd_options;
    etcd_options.tls = etcd_tls();
    absl::StatusOr<std::unique_ptr<cluster::EtcdTestServer>> etcd =
        cluster::EtcdTestServer::Start(etcd_options);
    if (absl::IsNotFound(etcd.status())) GTEST_SKIP() << etcd.status().message();
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    cluster::EtcdClientOptions options;
    options.endpoint = etcd_->endpoint();
    if (etcd_tls()) {
      const cluster::EtcdTestTlsFiles& files = etcd_->tls_files();
      auto credentials = NewClusterChannelCredentials(
          files.ca, TlsFiles{files.client_cert, files.client_key, /*client_ca=*/""});
      ASSERT_TRUE(credentials.ok()) << credentials.status();
      options.credentials = *std::move(credentials);
    }
    auto client = cluster::EtcdClient::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    dir_ = std::filesystem::path(::testing::TempDir()) / absl::StrCat("shard_node_", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string Log() const {
    std::ifstream in(dir_ / "server.log");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // The node's flags; with etcd_tls(), those for etcd's TLS too unless `etcd_tls_flags` is false.
  std::vector<std::string> ShardArgs(bool etcd_tls_flags = true) const {
    std::vector<std::string> args = {"--role",
                                     "shard",
                                     "--node_id",
                                     "node-1",
                                     "--etcd",
                                     etcd_->endpoint(),
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--metrics_listen=",
                                     "--data_dir",
                                     (dir_ / "data").string(),
                                     "--rerank_device",
                                     "cpu",
                                     "--threads",
                                     "2",
                                     "--sync_writes",
                                     "false"};
    if (etcd_tls() && etcd_tls_flags) {
      const cluster::EtcdTestTlsFiles& files = etcd_->tls_files();
      args.insert(args.end(), {"--etcd_ca", files.ca, "--etcd_cert", files.client_cert,
                               "--etcd_key", files.client_key});
    }
    return args;
  }

  // The node key's value once it exists (within `timeout`), else nullopt.
  std::optional<cluster::KeyValue> WaitForKey(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      auto got = client_->Get(kKey);
      if (got.ok() && got->has_value()) return **got;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return std::nullopt;
  }

  // How long the key took to disappear, or nullopt if it did not within `timeout`.
  std::optional<absl::Duration> WaitForNoKey(absl::Duration timeout) {
    const absl::Time start = absl::Now();
    while (absl::Now() - start < timeout) {
      auto got = client_->Get(kKey);
      if (got.ok() && !got->has_value()) return absl::Now() - start;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return std::nullopt;
  }

  // SIGTERM: the node deletes its key at once, not with the lease (10 s; 5 s leaves room for a
  // loaded machine), then drains and exits 0.
  void ExpectTermDeletesKeyAndExitsCleanly() {
    server_->Signal(SIGTERM);
    const std::optional<absl::Duration> deleted = WaitForNoKey(absl::Seconds(5));
    ASSERT_TRUE(deleted.has_value()) << Log();
    const std::optional<int> status = server_->Wait();
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << Log();
  }

  // Starts the shard node and returns the address it registered, once its registration is
  // complete: the key can be visible (the Put applied) while the node still waits for etcd's
  // answer and starts renewing its lease, and a SIGTERM then waits for that (seen on a loaded
  // machine), so tests that signal it wait for the node's own "node registered" line.
  std::string StartNode() {
    server_ = ServerProcess::Spawn(ShardArgs(), (dir_ / "server.log").string());
    EXPECT_NE(server_, nullptr);
    if (server_ == nullptr) return "";
    ++starts_;
    const std::optional<cluster::KeyValue> kv = WaitForKey(absl::Seconds(30));
    EXPECT_TRUE(kv.has_value()) << Log();
    if (!kv.has_value()) return "";
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (Registrations() < starts_ && absl::Now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(Registrations(), starts_) << Log();
    EXPECT_NE(kv->lease, 0);
    // {"address":"127.0.0.1:PORT","role":"shard","state":"serving"}
    EXPECT_THAT(kv->value, HasSubstr(R"("address":"127.0.0.1:)"));
    EXPECT_THAT(kv->value, HasSubstr(R"("state":"serving")"));
    const std::string prefix = R"({"address":")";
    const size_t begin = kv->value.find(prefix);
    if (begin == std::string::npos) return "";
    const size_t start = begin + prefix.size();
    return kv->value.substr(start, kv->value.find('"', start) - start);
  }

  // "node registered" lines in the log, which every start appends to.
  int Registrations() const {
    const std::string log = Log();
    int count = 0;
    for (size_t at = log.find(R"("msg":"node registered")"); at != std::string::npos;
         at = log.find(R"("msg":"node registered")", at + 1)) {
      ++count;
    }
    return count;
  }

  std::unique_ptr<cluster::EtcdTestServer> etcd_;
  std::unique_ptr<cluster::EtcdClient> client_;
  int starts_ = 0;  // StartNode calls
  std::filesystem::path dir_;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(ShardNodeTest, RegistersServesShardServiceAndLeavesOnKillOrTerm) {
  const std::string address = StartNode();
  ASSERT_FALSE(address.empty());
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto shard = v1::ShardService::NewStub(channel);

  {
    v1::ShardCreateCollectionRequest request;
    request.mutable_schema()->set_name("c");
    request.mutable_schema()->set_dim(4);
    request.mutable_schema()->set_num_shards(2);
    request.set_shard(1);
    v1::ShardCreateCollectionResponse response;
    grpc::ClientContext call;
    const grpc::Status status = shard->CreateCollection(&call, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.schema().name(), "c");
    EXPECT_EQ(response.schema().num_shards(), 2u);
  }
  {
    v1::ShardUpsertRequest request;
    request.set_collection("c");
    request.set_shard(1);
    v1::Document* document = request.add_documents();
    document->set_id("a");
    const std::vector<float> tokens = {1, 0, 0, 0, 0, 1, 0, 0};
    EncodeMatrix(tokens.data(), 2, 4, VectorDtype::kFloat32, document->mutable_tokens());
    v1::UpsertResponse response;
    grpc::ClientContext call;
    ASSERT_TRUE(shard->Upsert(&call, request, &response).ok());
    ASSERT_EQ(response.results_size(), 1);
    EXPECT_EQ(response.results(0).code(), 0) << response.results(0).message();
  }
  {
    v1::ShardSearchRequest request;
    request.set_shard(1);
    request.mutable_search()->set_collection("c");
    const std::vector<float> query = {1, 0, 0, 0};
    EncodeMatrix(query.data(), 1, 4, VectorDtype::kFloat32,
                 request.mutable_search()->mutable_query());
    v1::ShardSearchResponse response;
    grpc::ClientContext call;
    ASSERT_TRUE(shard->Search(&call, request, &response).ok());
    ASSERT_EQ(response.search().hits_size(), 1);
    EXPECT_EQ(response.search().hits(0).id(), "a");
    EXPECT_GT(response.search().hits(0).score(), 0.0f);
    EXPECT_EQ(response.documents(), 1u);
  }
  {
    v1::ShardInfoResponse response;
    grpc::ClientContext call;
    ASSERT_TRUE(shard->Info(&call, v1::ShardInfoRequest{}, &response).ok());
    EXPECT_EQ(response.node_id(), "node-1");
    ASSERT_EQ(response.replicas_size(), 1);
    EXPECT_EQ(response.replicas(0).collection(), "c");
    EXPECT_EQ(response.replicas(0).shard(), 1u);
  }
  {
    // The public API is not served by a shard node.
    v1::GetRequest request;
    request.set_collection("c");
    request.set_id("a");
    v1::GetResponse response;
    grpc::ClientContext call;
    EXPECT_EQ(v1::IngestService::NewStub(channel)->Get(&call, request, &response).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }

  // SIGKILL: nothing deletes the key; it goes with the lease (TTL 10 s), within TTL + 2 s.
  server_->Signal(SIGKILL);
  ASSERT_TRUE(server_->Wait().has_value());
  const std::optional<absl::Duration> expired = WaitForNoKey(absl::Seconds(12));
  ASSERT_TRUE(expired.has_value()) << "the node key outlived its lease";
  EXPECT_GT(*expired, absl::Seconds(1)) << "the key went before its lease could expire";

  // Restarted on the same data, the node registers again with its replica; SIGTERM deletes the
  // key before the process drains and exits.
  ASSERT_FALSE(StartNode().empty());
  ExpectTermDeletesKeyAndExitsCleanly();
}

TEST_F(ShardNodeTest, ShardRoleWithoutEtcdIsRefusedNamingTheFlag) {
  server_ = ServerProcess::Spawn({"--role", "shard", "--node_id", "node-1"},
                                 (dir_ / "server.log").string());
  ASSERT_NE(server_, nullptr);
  const std::optional<int> status = server_->Wait();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2);
  EXPECT_THAT(Log(), HasSubstr("--role shard needs --etcd"));
}

TEST_F(ShardNodeTest, UnreadableEtcdCaFailsAtStartupNamingTheFile) {
  std::vector<std::string> args = ShardArgs();
  const std::string missing = (dir_ / "no-such-ca.pem").string();
  args.insert(args.end(), {"--etcd_ca", missing});
  server_ = ServerProcess::Spawn(args, (dir_ / "server.log").string());
  ASSERT_NE(server_, nullptr);
  const std::optional<int> status = server_->Wait();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << Log();
  EXPECT_THAT(Log(), HasSubstr("NOT_FOUND"));
  EXPECT_THAT(Log(), HasSubstr(absl::StrCat("--etcd_ca '", missing, "'")));
  EXPECT_THAT(Log(), HasSubstr(absl::StrCat("cannot read ", missing)));
  auto key = client_->Get(kKey);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_FALSE(key->has_value());
}

class ShardNodeEtcdTlsTest : public ShardNodeTest {
 protected:
  bool etcd_tls() const override { return true; }
};

TEST_F(ShardNodeEtcdTlsTest, RegistersOverTlsWithClientCertificateAndLeavesOnTerm) {
  ASSERT_FALSE(StartNode().empty());
  ExpectTermDeletesKeyAndExitsCleanly();
}

TEST_F(ShardNodeEtcdTlsTest, NodeWithoutEtcdTlsFlagsCannotRegister) {
  // Plaintext to a TLS-only etcd: the registration's first call fails when its deadline (5 s)
  // passes, and the node exits 1 naming etcd.
  server_ =
      ServerProcess::Spawn(ShardArgs(/*etcd_tls_flags=*/false), (dir_ / "server.log").string());
  ASSERT_NE(server_, nullptr);
  const std::optional<int> status = server_->Wait();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << Log();
  EXPECT_THAT(Log(), HasSubstr(absl::StrCat("etcd at ", etcd_->endpoint(), " unavailable")));
  auto key = client_->Get(kKey);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_FALSE(key->has_value());
}

}  // namespace
}  // namespace tessera::server
