// A real single-member etcd for tests: started on loopback ports that were free a moment before,
// with its data in a fresh temporary directory, and stopped, killed or restarted on that same
// directory and those same ports while the test runs. Its log goes to etcd.log next to the data
// directory and is quoted when it fails to start. With `tls` it serves its client URL over TLS
// only and requires client certificates, from a throwaway CA that the openssl tool makes in the
// same directory.
//
//   absl::StatusOr<std::unique_ptr<EtcdTestServer>> etcd = EtcdTestServer::Start();
//   if (absl::IsNotFound(etcd.status())) GTEST_SKIP() << etcd.status();  // no etcd binary
#ifndef TESSERA_SERVER_CLUSTER_ETCD_TEST_UTIL_H_
#define TESSERA_SERVER_CLUSTER_ETCD_TEST_UTIL_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/cluster/etcd_client.h"

namespace tessera::cluster {

// Starts args[0] (a path) with `args`, its stdout and stderr appended to `log_path`: the child's
// pid, or INTERNAL naming the command when it cannot start. The caller waits for it.
absl::StatusOr<pid_t> SpawnWithLog(std::vector<std::string> args, const std::string& log_path);

struct EtcdTestServerOptions {
  std::string binary = "/usr/bin/etcd";  // Debian's etcd-server
  // How long a start may take until etcd answers a read.
  absl::Duration start_timeout = absl::Seconds(20);
  // Serve the client URL as https:// only (--cert-file, --key-file) and refuse clients without a
  // certificate signed by the test CA (--trusted-ca-file, --client-cert-auth). The PEM files:
  // EtcdTestServer::tls_files(). Peers stay plaintext (a single member has none).
  bool tls = false;
  std::string openssl = "/usr/bin/openssl";  // Debian's openssl; makes the certificates
};

// PEM files of a TLS test server, all under its temporary directory (tls/). Keys are ECDSA P-256,
// certificates valid for 2 days from the start.
struct EtcdTestTlsFiles {
  std::string ca;           // the CA etcd trusts; signed the server and client certificates
  std::string server_cert;  // etcd's: CN and subjectAltName IP:127.0.0.1
  std::string server_key;
  std::string client_cert;  // signed by `ca`, extendedKeyUsage clientAuth: etcd accepts it
  std::string client_key;
  // A second CA, which etcd does not trust and which did not sign etcd's certificate, and a
  // client certificate it signed: a client that trusts only `other_ca` refuses etcd, and etcd
  // refuses `other_client_cert`.
  std::string other_ca;
  std::string other_client_cert;
  std::string other_client_key;
};

// Not thread-safe: one test thread drives it. The process dies with the thread that started it
// (PR_SET_PDEATHSIG), so a crashed test leaves no etcd behind.
class EtcdTestServer {
 public:
  // Starts etcd and waits until it answers (over TLS with `tls`, presenting the client
  // certificate). NOT_FOUND naming the binary when it, or with `tls` the openssl tool, is missing
  // (the caller skips); INTERNAL with openssl's output when it fails; otherwise UNAVAILABLE with
  // the log's tail when etcd exits or does not answer in time (tried with new ports up to three
  // times, in case another process took them).
  static absl::StatusOr<std::unique_ptr<EtcdTestServer>> Start(
      const EtcdTestServerOptions& options = {});
  // Kills etcd (SIGKILL) if it runs and removes the data directory.
  ~EtcdTestServer();
  EtcdTestServer(const EtcdTestServer&) = delete;
  EtcdTestServer& operator=(const EtcdTestServer&) = delete;

  // "127.0.0.1:PORT", its client URL without the scheme (http://, or https:// with tls); the
  // same across restarts.
  const std::string& endpoint() const { return endpoint_; }
  bool tls() const { return options_.tls; }
  // The certificates and keys with tls; every path empty without. Kept across restarts.
  const EtcdTestTlsFiles& tls_files() const { return tls_files_; }
  // etcd's --data-dir.
  std::string data_dir() const { return dir_ + "/data"; }
  bool running() const { return pid_ > 0; }
  // Options for a plaintext client of this server (a TLS one needs credentials too): each call
  // within `call_timeout`, a broken connection retried within 500 ms.
  EtcdClientOptions ClientOptions(absl::Duration call_timeout = absl::Seconds(5)) const;

  // SIGTERM, then waits for the exit (SIGKILL after 10 s). OK when not running.
  absl::Status Stop();
  // SIGKILL, then waits for the exit. OK when not running.
  absl::Status Kill();
  // Starts etcd again on the same data directory and ports (stopping it first if it runs) and
  // waits until it answers.
  absl::Status Restart();

 private:
  EtcdTestServer(EtcdTestServerOptions options, std::string dir, int client_port, int peer_port);
  // Writes the CAs, certificates and keys of tls_files_ with the openssl tool.
  absl::Status MakeCertificates();
  // Spawns etcd and waits until it answers a read.
  absl::Status Launch();
  absl::Status Signal(int signal, absl::Duration kill_after);
  std::string LogTail() const;

  const EtcdTestServerOptions options_;
  const std::string dir_;  // the temporary directory: data/ and etcd.log
  const int client_port_;
  const int peer_port_;
  const std::string endpoint_;
  const EtcdTestTlsFiles tls_files_;
  pid_t pid_ = -1;
};

// A fixture with a fresh plaintext etcd for each test (skipped when the etcd binary is missing).
class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override;
  // A client of etcd_ (see EtcdTestServer::ClientOptions); null, with a test failure, when it
  // cannot be made.
  std::unique_ptr<EtcdClient> NewClient(absl::Duration call_timeout = absl::Seconds(5));

  std::unique_ptr<EtcdTestServer> etcd_;
};

}  // namespace tessera::cluster

#endif  // TESSERA_SERVER_CLUSTER_ETCD_TEST_UTIL_H_
