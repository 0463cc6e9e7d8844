#include "server/config.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ServerConfig, DefaultsFlagsAndYamlWithFlagsWinning) {
  auto config = ParseServerConfig({"tessera-server"});
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->data_dir, "./tessera-data");
  EXPECT_EQ(config->listen, "127.0.0.1:50051");
  EXPECT_EQ(config->metrics_listen, "127.0.0.1:9464");
  EXPECT_EQ(config->move_lost_replicas_after_seconds, 300);
  EXPECT_EQ(config->max_searches_per_batch, 64);

  const std::string yaml = ::testing::TempDir() + "/server_config_test.yaml";
  std::ofstream(yaml) << "listen: 0.0.0.0:7000\ninsecure: true\nmax_k: 50\nsync_writes: false\n";
  config = ParseServerConfig({"tessera-server", "--config", yaml, "--max_k=20", "--data_dir", "/d",
                              "--move_lost_replicas_after_seconds", "2.5"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->listen, "0.0.0.0:7000");
  EXPECT_TRUE(config->insecure);
  EXPECT_EQ(config->max_k, 20);
  EXPECT_FALSE(config->sync_writes);
  EXPECT_EQ(config->data_dir, "/d");
  EXPECT_EQ(config->move_lost_replicas_after_seconds, 2.5);
  config = ParseServerConfig({"tessera-server", "--max_searches_per_batch", "8"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->max_searches_per_batch, 8);
  EXPECT_THAT(ParseServerConfig({"s", "--max_searches_per_batch", "0"}).status().message(),
              HasSubstr("--max_searches_per_batch '0', expected an integer ≥ 1"));
  std::remove(yaml.c_str());
}

// OpenBLAS's threads are the engine's explicit EngineOptions::blas_threads, one by default.
TEST(ServerConfig, BlasThreadsDefaultsToOneAndIsAFlagAndAKey) {
  auto config = ParseServerConfig({"tessera-server"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->blas_threads, 1);
  const std::string yaml = ::testing::TempDir() + "/server_config_blas.yaml";
  std::ofstream(yaml) << "blas_threads: 0\n";
  config = ParseServerConfig({"tessera-server", "--config", yaml});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->blas_threads, 0);
  config = ParseServerConfig({"tessera-server", "--config", yaml, "--blas_threads", "4"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->blas_threads, 4);
  EXPECT_THAT(ParseServerConfig({"s", "--blas_threads", "-1"}).status().message(),
              HasSubstr("--blas_threads '-1', expected an integer ≥ 0"));
  std::remove(yaml.c_str());
}

TEST(ServerConfig, RejectsWhatItCannotUse) {
  EXPECT_THAT(ParseServerConfig({"s", "--bogus", "1"}).status().message(),
              HasSubstr("unknown flag --bogus"));
  EXPECT_THAT(ParseServerConfig({"s", "--max_k", "zero"}).status().message(),
              HasSubstr("--max_k 'zero'"));
  EXPECT_THAT(ParseServerConfig({"s", "--role", "router"}).status().message(),
              HasSubstr("--role router needs --etcd"));
  EXPECT_TRUE(ParseServerConfig({"s", "--role", "router", "--etcd", "127.0.0.1:2379"}).ok());
  EXPECT_THAT(ParseServerConfig({"s", "--role", "coordinator"}).status().message(),
              HasSubstr("standalone, shard or router"));
  EXPECT_THAT(ParseServerConfig({"s", "--rerank_device", "tpu"}).status().message(),
              HasSubstr("auto, cpu or cuda"));
  EXPECT_THAT(ParseServerConfig({"s", "--tls_cert", "a.pem"}).status().message(),
              HasSubstr("go together"));
  EXPECT_THAT(ParseServerConfig({"s", "--tls_reload_seconds", "0"}).status().message(),
              HasSubstr("--tls_reload_seconds '0', expected an integer ≥ 1"));
  for (const char* bad : {"-1", "nan", "inf", "soon"}) {
    EXPECT_THAT(
        ParseServerConfig({"s", "--move_lost_replicas_after_seconds", bad}).status().message(),
        HasSubstr(std::string("--move_lost_replicas_after_seconds '") + bad +
                  "', expected a number of seconds ≥ 0"));
  }
  const std::string yaml = ::testing::TempDir() + "/server_config_bad.yaml";
  std::ofstream(yaml) << "colour: red\n";
  EXPECT_THAT(ParseServerConfig({"s", "--config", yaml}).status().message(),
              HasSubstr("unknown key 'colour'"));
  // Found by server_config_fuzzer: a mapping as a key made yaml-cpp throw out of the parser.
  for (const char* bad_key : {"{listnw de_}:\n", "[a, b]: 1\n", "? ~\n: 1\n"}) {
    std::ofstream(yaml) << bad_key;
    EXPECT_THAT(ParseServerConfig({"s", "--config", yaml}).status().message(),
                HasSubstr("keys must be plain names"))
        << bad_key;
  }
  std::remove(yaml.c_str());
}

// Each flag the issue found answered with a misleading or no message: an empty data dir was taken
// as the working directory, an address that is none was called one that "accepts connections
// from other machines", and a config file that cannot be read was only a "bad file".
TEST(ServerConfig, NamesWhatIsWrongWithAFlag) {
  absl::Status status = ParseServerConfig({"s", "--data_dir", ""}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("--data_dir '', expected a directory"));
  status = ParseServerConfig({"s", "--data_dir="}).status();
  EXPECT_THAT(status.message(), HasSubstr("--data_dir '', expected a directory"));

  for (const char* bad : {"notanaddress", "127.0.0.1", ":50051", "127.0.0.1:", "127.0.0.1:http",
                          "127.0.0.1:65536", "127.0.0.1:-1", "localhost:123456", "unix:"}) {
    status = ParseServerConfig({"s", "--listen", bad}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(),
                HasSubstr(std::string("--listen '") + bad + "', expected HOST:PORT with a port"))
        << bad;
    EXPECT_THAT(status.message(), Not(HasSubstr("other machines"))) << bad;
  }
  for (const char* good : {"127.0.0.1:0", "127.0.0.1:65535", "localhost:50051", "[::1]:9"}) {
    EXPECT_TRUE(ParseServerConfig({"s", "--listen", good}).ok()) << good;
  }
  status = ParseServerConfig({"s", "--metrics_listen", "nowhere"}).status();
  EXPECT_THAT(status.message(), HasSubstr("--metrics_listen 'nowhere', expected HOST:PORT"));
  auto config = ParseServerConfig({"s", "--metrics_listen", ""});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->metrics_listen, "");  // no metrics endpoint

  // REST: off by default; a flag or a YAML key; beyond loopback only with TLS or --insecure.
  EXPECT_EQ(ParseServerConfig({"s"})->http_listen, "");
  status = ParseServerConfig({"s", "--http_listen", "nowhere"}).status();
  EXPECT_THAT(status.message(), HasSubstr("--http_listen 'nowhere', expected HOST:PORT"));
  config = ParseServerConfig({"s", "--http_listen", "127.0.0.1:0"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->http_listen, "127.0.0.1:0");
  status = ParseServerConfig({"s", "--http_listen", "0.0.0.0:8080"}).status();
  EXPECT_THAT(status.message(),
              HasSubstr("--http_listen 0.0.0.0:8080 accepts connections from other machines"));
  EXPECT_TRUE(ParseServerConfig({"s", "--http_listen", "0.0.0.0:8080", "--insecure"}).ok());
  const std::string http_yaml = ::testing::TempDir() + "/server_config_http.yaml";
  std::ofstream(http_yaml) << "http_listen: 127.0.0.1:8080\n";
  config = ParseServerConfig({"s", "--config", http_yaml});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->http_listen, "127.0.0.1:8080");

  // A missing file and a directory: the path and the OS's reason.
  const std::string missing = ::testing::TempDir() + "/server_config_missing.yaml";
  status = ParseServerConfig({"s", "--config", missing}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("--config '" + missing + "': cannot read it: No such file or directory"));
  status = ParseServerConfig({"s", "--config", ::testing::TempDir()}).status();
  EXPECT_THAT(status.message(), HasSubstr("cannot read it: Is a directory"));
  // Keys from a file are checked as flags are.
  const std::string yaml = ::testing::TempDir() + "/server_config_empty_dir.yaml";
  std::ofstream(yaml) << "data_dir: \"\"\n";
  EXPECT_THAT(ParseServerConfig({"s", "--config", yaml}).status().message(),
              HasSubstr("--data_dir '', expected a directory"));
  std::remove(yaml.c_str());
}

TEST(ServerConfig, EtcdTlsFromFlagsAndYaml) {
  auto config = ParseServerConfig({"s", "--role", "router", "--etcd", "etcd:2379"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->etcd_ca, "");  // plaintext by default
  EXPECT_EQ(config->etcd_cert, "");
  EXPECT_EQ(config->etcd_key, "");

  // TLS verifying etcd only, then with a client certificate for its --client-cert-auth.
  config = ParseServerConfig({"s", "--role", "router", "--etcd", "etcd:2379", "--etcd_ca", "ca"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->etcd_ca, "ca");
  EXPECT_EQ(config->etcd_cert, "");
  config = ParseServerConfig({"s", "--role", "shard", "--node_id", "n0", "--etcd", "etcd:2379",
                              "--etcd_ca=ca", "--etcd_cert", "c", "--etcd_key", "k"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->etcd_ca, "ca");
  EXPECT_EQ(config->etcd_cert, "c");
  EXPECT_EQ(config->etcd_key, "k");

  // The same keys in the YAML file; a flag wins over the file.
  const std::string yaml = ::testing::TempDir() + "/server_config_etcd_tls.yaml";
  std::ofstream(yaml) << "role: router\netcd: etcd:2379\netcd_ca: /tls/ca.crt\n"
                         "etcd_cert: /tls/tls.crt\netcd_key: /tls/tls.key\n";
  config = ParseServerConfig({"s", "--config", yaml, "--etcd_key", "/other/tls.key"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->etcd_ca, "/tls/ca.crt");
  EXPECT_EQ(config->etcd_cert, "/tls/tls.crt");
  EXPECT_EQ(config->etcd_key, "/other/tls.key");
  std::remove(yaml.c_str());
}

TEST(ServerConfig, RejectsIncompleteEtcdTls) {
  const std::vector<std::string> router = {"s", "--role", "router", "--etcd", "etcd:2379"};
  auto with = [&router](std::vector<std::string> flags) {
    flags.insert(flags.begin(), router.begin(), router.end());
    return ParseServerConfig(flags).status();
  };
  // A certificate without its key, a key without its certificate.
  absl::Status status = with({"--etcd_ca", "ca.pem", "--etcd_cert", "c.pem"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("--etcd_cert 'c.pem' and --etcd_key '': expected both"));
  status = with({"--etcd_ca", "ca.pem", "--etcd_key", "k.pem"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("--etcd_cert '' and --etcd_key 'k.pem': expected both"));
  // A client certificate is only presented over TLS, which needs etcd's CA.
  status = with({"--etcd_cert", "c.pem", "--etcd_key", "k.pem"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("--etcd_cert 'c.pem' needs --etcd_ca"));
  status = with({"--etcd_cert", "c.pem"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  // Empty values are unset, as for the other file flags.
  EXPECT_TRUE(with({"--etcd_ca", "", "--etcd_cert", "", "--etcd_key", ""}).ok());
}

TEST(ServerConfig, PlaintextBeyondLoopbackNeedsInsecure) {
  for (const char* local :
       {"127.0.0.1:1", "127.1.2.3:0", "localhost:50051", "[::1]:9", "unix:/s"}) {
    EXPECT_TRUE(ParseServerConfig({"s", "--listen", local}).ok()) << local;
  }
  for (const char* remote : {"0.0.0.0:50051", "[::]:50051", "10.0.0.7:1", "tessera:50051"}) {
    const auto refused = ParseServerConfig({"s", "--listen", remote});
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << remote;
    EXPECT_THAT(refused.status().message(),
                HasSubstr(std::string("--listen ") + remote +
                          " accepts connections from other machines: serve TLS"));
    // A bare --insecure means true, before another flag or at the end.
    auto allowed = ParseServerConfig({"s", "--listen", remote, "--insecure"});
    ASSERT_TRUE(allowed.ok()) << allowed.status();
    EXPECT_TRUE(allowed->insecure);
    allowed = ParseServerConfig({"s", "--insecure", "--listen", remote});
    ASSERT_TRUE(allowed.ok()) << allowed.status();
    EXPECT_FALSE(ParseServerConfig({"s", "--listen", remote, "--insecure", "false"}).ok());
    EXPECT_TRUE(
        ParseServerConfig({"s", "--listen", remote, "--tls_cert", "c", "--tls_key", "k"}).ok());
  }
}

}  // namespace
}  // namespace tessera::server
