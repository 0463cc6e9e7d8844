// A real single-member etcd for tests: started on loopback ports that were free a moment before,
// with its data in a fresh temporary directory, and stopped, killed or restarted on that same
// directory and those same ports while the test runs. Its log goes to etcd.log next to the data
// directory and is quoted when it fails to start.
//
//   absl::StatusOr<std::unique_ptr<EtcdTestServer>> etcd = EtcdTestServer::Start();
//   if (absl::IsNotFound(etcd.status())) GTEST_SKIP() << etcd.status();  // no etcd binary
#ifndef TESSERA_SERVER_CLUSTER_ETCD_TEST_UTIL_H_
#define TESSERA_SERVER_CLUSTER_ETCD_TEST_UTIL_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera::cluster {

struct EtcdTestServerOptions {
  std::string binary = "/usr/bin/etcd";  // Debian's etcd-server
  // How long a start may take until etcd answers a read.
  absl::Duration start_timeout = absl::Seconds(20);
};

// Not thread-safe: one test thread drives it. The process dies with the thread that started it
// (PR_SET_PDEATHSIG), so a crashed test leaves no etcd behind.
class EtcdTestServer {
 public:
  // Starts etcd and waits until it answers. NOT_FOUND naming the binary when it is missing (the
  // caller skips); otherwise UNAVAILABLE with the log's tail when it exits or does not answer in
  // time (tried with new ports up to three times, in case another process took them).
  static absl::StatusOr<std::unique_ptr<EtcdTestServer>> Start(
      const EtcdTestServerOptions& options = {});
  // Kills etcd (SIGKILL) if it runs and removes the data directory.
  ~EtcdTestServer();
  EtcdTestServer(const EtcdTestServer&) = delete;
  EtcdTestServer& operator=(const EtcdTestServer&) = delete;

  // "127.0.0.1:PORT", its client URL without the scheme; the same across restarts.
  const std::string& endpoint() const { return endpoint_; }
  // etcd's --data-dir.
  std::string data_dir() const { return dir_ + "/data"; }
  bool running() const { return pid_ > 0; }

  // SIGTERM, then waits for the exit (SIGKILL after 10 s). OK when not running.
  absl::Status Stop();
  // SIGKILL, then waits for the exit. OK when not running.
  absl::Status Kill();
  // Starts etcd again on the same data directory and ports (stopping it first if it runs) and
  // waits until it answers.
  absl::Status Restart();

 private:
  EtcdTestServer(EtcdTestServerOptions options, std::string dir, int client_port, int peer_port);
  // Spawns etcd and waits until it answers a read.
  absl::Status Launch();
  absl::Status Signal(int signal, absl::Duration kill_after);
  std::string LogTail() const;

  const EtcdTestServerOptions options_;
  const std::string dir_;  // the temporary directory: data/ and etcd.log
  const int client_port_;
  const int peer_port_;
  const std::string endpoint_;
  pid_t pid_ = -1;
};

}  // namespace tessera::cluster

#endif  // TESSERA_SERVER_CLUSTER_ETCD_TEST_UTIL_H_
