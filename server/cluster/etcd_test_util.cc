#include "server/cluster/etcd_test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace tessera::cluster {
namespace {

constexpr char kMemberName[] = "tessera-test";

absl::Status SystemError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Two distinct loopback ports that were free: both sockets are bound (port 0) before either is
// closed. etcd binds them a moment later; another process could take one in between (Start
// retries).
absl::Status PickPorts(int* client_port, int* peer_port) {
  int fds[2] = {-1, -1};
  int ports[2] = {0, 0};
  absl::Status status;
  for (int i = 0; i < 2 && status.ok(); ++i) {
    fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t length = sizeof(addr);
    if (fds[i] < 0 || bind(fds[i], reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fds[i], reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
      status = SystemError("picking a free loopback port");
    }
    ports[i] = ntohs(addr.sin_port);
  }
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  *client_port = ports[0];
  *peer_port = ports[1];
  return status;
}

std::string Url(int port) { return absl::StrCat("http://127.0.0.1:", port); }

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdTestServer>> EtcdTestServer::Start(
    const EtcdTestServerOptions& options) {
  if (access(options.binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("no etcd at ", options.binary,
                                            " (Debian package etcd-server, see scripts/setup): "
                                            "skipping the tests that need a real etcd"));
  }
  absl::Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/tessera-etcd-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) return SystemError("creating a temporary directory");
    int client_port = 0;
    int peer_port = 0;
    absl::Status ports = PickPorts(&client_port, &peer_port);
    // Owns the directory from here on.
    std::unique_ptr<EtcdTestServer> server(
        new EtcdTestServer(options, pattern, client_port, peer_port));
    if (!ports.ok()) return ports;
    last = server->Launch();
    if (last.ok()) return server;
  }
  return last;
}

EtcdTestServer::EtcdTestServer(EtcdTestServerOptions options, std::string dir, int client_port,
                               int peer_port)
    : options_(std::move(options)),
      dir_(std::move(dir)),
      client_port_(client_port),
      peer_port_(peer_port),
      endpoint_(absl::StrCat("127.0.0.1:", client_port)) {}

EtcdTestServer::~EtcdTestServer() {
  Kill().IgnoreError();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

absl::Status EtcdTestServer::Launch() {
  if (running()) return absl::FailedPreconditionError("etcd is already running");
  // Short raft timings: a single member elects itself within a few ticks of starting, and the
  // minimum lease TTL (1.5 election timeouts) drops to 1 s.
  const std::vector<std::string> args = {
      options_.binary,
      "--name",
      kMemberName,
      "--data-dir",
      data_dir(),
      "--listen-client-urls",
      Url(client_port_),
      "--advertise-client-urls",
      Url(client_port_),
      "--listen-peer-urls",
      Url(peer_port_),
      "--initial-advertise-peer-urls",
      Url(peer_port_),
      "--initial-cluster",
      absl::StrCat(kMemberName, "=", Url(peer_port_)),
      "--initial-cluster-state",
      "new",
      "--initial-cluster-token",
      "tessera-test",
      "--heartbeat-interval",
      "25",
      "--election-timeout",
      "250",
      "--logger",
      "zap",
      "--log-outputs",
      "stderr",
  };
  std::vector<char*> argv;
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  const std::string log_path = dir_ + "/etcd.log";
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return SystemError(absl::StrCat("opening ", log_path));

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return SystemError("fork");
  }
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(log_fd);
  pid_ = pid;

  // Ready once a linearizable read succeeds: the member has elected itself and serves the API.
  grpc::ChannelArguments channel_args;
  channel_args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  channel_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
  channel_args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto kv = etcdserverpb::KV::NewStub(
      grpc::CreateCustomChannel(endpoint_, grpc::InsecureChannelCredentials(), channel_args));
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  grpc::Status last;
  while (absl::Now() < deadline) {
    int wait_status = 0;
    if (waitpid(pid_, &wait_status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::UnavailableError(absl::StrCat("etcd on ", endpoint_,
                                                 " exited during start-up (status ", wait_status,
                                                 "); log:\n", LogTail()));
    }
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(250)));
    etcdserverpb::RangeRequest request;
    request.set_key("tessera-test-ready");
    etcdserverpb::RangeResponse response;
    last = kv->Range(&context, request, &response);
    if (last.ok()) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Kill().IgnoreError();
  return absl::UnavailableError(absl::StrCat("etcd on ", endpoint_, " did not answer within ",
                                             absl::FormatDuration(options_.start_timeout), " (",
                                             last.error_message(), "); log:\n", LogTail()));
}

absl::Status EtcdTestServer::Signal(int signal, absl::Duration kill_after) {
  if (!running()) return absl::OkStatus();
  if (kill(pid_, signal) != 0) return SystemError(absl::StrCat("kill ", pid_));
  const absl::Time kill_at = absl::Now() + kill_after;
  while (true) {
    int wait_status = 0;
    const pid_t done = waitpid(pid_, &wait_status, WNOHANG);
    if (done == pid_ || (done < 0 && errno == ECHILD)) break;
    if (done < 0 && errno != EINTR) return SystemError(absl::StrCat("waitpid ", pid_));
    if (absl::Now() >= kill_at && signal != SIGKILL) {
      kill(pid_, SIGKILL);
      signal = SIGKILL;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  pid_ = -1;
  return absl::OkStatus();
}

absl::Status EtcdTestServer::Stop() { return Signal(SIGTERM, absl::Seconds(10)); }

absl::Status EtcdTestServer::Kill() { return Signal(SIGKILL, absl::ZeroDuration()); }

absl::Status EtcdTestServer::Restart() {
  if (absl::Status stopped = Stop(); !stopped.ok()) return stopped;
  return Launch();
}

std::string EtcdTestServer::LogTail() const {
  std::ifstream in(dir_ + "/etcd.log");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string log = buffer.str();
  constexpr size_t kTail = 4000;
  return log.size() <= kTail ? log : log.substr(log.size() - kTail);
}

}  // namespace tessera::cluster
