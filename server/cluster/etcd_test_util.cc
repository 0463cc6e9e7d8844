#include "server/cluster/etcd_test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
#include "absl/strings/str_join.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "server/credentials.h"
#include "tessera/status_macros.h"

extern char** environ;

namespace tessera::cluster {

absl::StatusOr<pid_t> SpawnWithLog(std::vector<std::string> args, const std::string& log_path) {
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  const int error = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    return absl::InternalError(
        absl::StrCat(absl::StrJoin(args, " "), ": cannot start: ", std::strerror(error)));
  }
  return pid;
}

namespace {

constexpr char kMemberName[] = "tessera-test";

// openssl's configuration for the test certificates: the extensions of a CA, of etcd's server
// certificate (for client auth too: etcd's own gRPC gateway presents it when it connects to
// etcd under --client-cert-auth) and of a client certificate. etcd (Go's TLS) checks the
// extended key usage of client certificates.
constexpr char kOpensslConfig[] = R"([req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = IP:127.0.0.1
[client]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
)";

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

std::string Url(absl::string_view scheme, int port) {
  return absl::StrCat(scheme, "://127.0.0.1:", port);
}

// The last 4000 bytes of a file.
std::string FileTail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  constexpr size_t kTail = 4000;
  return text.size() <= kTail ? text : text.substr(text.size() - kTail);
}

// Runs `args` (args[0] a path) to completion, its output appended to `log_path`. INTERNAL with
// that output when it cannot start or does not exit with 0.
absl::Status RunTool(std::vector<std::string> args, const std::string& log_path) {
  const std::string command = absl::StrJoin(args, " ");
  TESSERA_ASSIGN_OR_RETURN(const pid_t pid, SpawnWithLog(std::move(args), log_path));
  int wait_status = 0;
  while (waitpid(pid, &wait_status, 0) < 0) {
    if (errno != EINTR) return SystemError(absl::StrCat("waitpid ", pid));
  }
  if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
    return absl::InternalError(absl::StrCat(command, " failed (wait status ", wait_status,
                                            "); output:\n", FileTail(log_path)));
  }
  return absl::OkStatus();
}

// Where a test server's certificates, keys and openssl files live.
std::string TlsDir(const std::string& dir) { return dir + "/tls"; }

EtcdTestTlsFiles TlsFilesUnder(const std::string& dir, bool tls) {
  EtcdTestTlsFiles files;
  if (!tls) return files;
  const std::string tls_dir = TlsDir(dir) + "/";
  files.ca = tls_dir + "ca.pem";
  files.server_cert = tls_dir + "server.pem";
  files.server_key = tls_dir + "server.key";
  files.client_cert = tls_dir + "client.pem";
  files.client_key = tls_dir + "client.key";
  files.other_ca = tls_dir + "other-ca.pem";
  files.other_client_cert = tls_dir + "other-client.pem";
  files.other_client_key = tls_dir + "other-client.key";
  return files;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdTestServer>> EtcdTestServer::Start(
    const EtcdTestServerOptions& options) {
  if (access(options.binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("no etcd at ", options.binary,
                                            " (Debian package etcd-server, see scripts/setup): "
                                            "skipping the tests that need a real etcd"));
  }
  if (options.tls && access(options.openssl.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("no openssl at ", options.openssl,
                                            " (Debian package openssl, see scripts/setup): "
                                            "skipping the tests that need etcd over TLS"));
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
    if (options.tls) TESSERA_RETURN_IF_ERROR(server->MakeCertificates());
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
      endpoint_(absl::StrCat("127.0.0.1:", client_port)),
      tls_files_(TlsFilesUnder(dir_, options_.tls)) {}

EtcdTestServer::~EtcdTestServer() {
  Kill().IgnoreError();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

absl::Status EtcdTestServer::MakeCertificates() {
  const std::string tls_dir = TlsDir(dir_);
  if (mkdir(tls_dir.c_str(), 0700) != 0) return SystemError(absl::StrCat("mkdir ", tls_dir));
  const std::string config = tls_dir + "/openssl.cnf";
  {
    std::ofstream out(config);
    out << kOpensslConfig;
    if (!out.flush()) return SystemError(absl::StrCat("writing ", config));
  }
  const std::string log = tls_dir + "/openssl.log";
  const std::string& openssl = options_.openssl;
  // A new ECDSA P-256 key, unencrypted.
  const std::vector<std::string> new_key = {"-newkey", "ec", "-pkeyopt",
                                            "ec_paramgen_curve:prime256v1", "-nodes"};
  auto make_ca = [&](const std::string& cert, const std::string& key, const std::string& name) {
    std::vector<std::string> args = {openssl, "req",         "-x509", "-config",
                                     config,  "-extensions", "ca"};
    args.insert(args.end(), new_key.begin(), new_key.end());
    args.insert(args.end(), {"-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=" + name});
    return RunTool(std::move(args), log);
  };
  int serial = 1;
  // A certificate for `name` with the extensions of config section `section`, signed by a CA.
  auto make_signed = [&](const std::string& cert, const std::string& key, const std::string& name,
                         const std::string& section, const std::string& ca_cert,
                         const std::string& ca_key) {
    const std::string request = cert + ".csr";
    std::vector<std::string> args = {openssl, "req", "-new", "-config", config};
    args.insert(args.end(), new_key.begin(), new_key.end());
    args.insert(args.end(), {"-keyout", key, "-out", request, "-subj", "/CN=" + name});
    TESSERA_RETURN_IF_ERROR(RunTool(std::move(args), log));
    return RunTool({openssl, "x509", "-req", "-in", request, "-CA", ca_cert, "-CAkey", ca_key,
                    "-set_serial", absl::StrCat(++serial), "-days", "2", "-extfile", config,
                    "-extensions", section, "-out", cert},
                   log);
  };
  const EtcdTestTlsFiles& files = tls_files_;
  const std::string ca_key = tls_dir + "/ca.key";
  const std::string other_ca_key = tls_dir + "/other-ca.key";
  TESSERA_RETURN_IF_ERROR(make_ca(files.ca, ca_key, "tessera-test-ca"));
  TESSERA_RETURN_IF_ERROR(
      make_signed(files.server_cert, files.server_key, "127.0.0.1", "server", files.ca, ca_key));
  TESSERA_RETURN_IF_ERROR(make_signed(files.client_cert, files.client_key, "tessera-test-client",
                                      "client", files.ca, ca_key));
  TESSERA_RETURN_IF_ERROR(make_ca(files.other_ca, other_ca_key, "tessera-test-other-ca"));
  return make_signed(files.other_client_cert, files.other_client_key, "tessera-test-client",
                     "client", files.other_ca, other_ca_key);
}

absl::Status EtcdTestServer::Launch() {
  if (running()) return absl::FailedPreconditionError("etcd is already running");
  // How the readiness probe below connects: as a client that etcd accepts.
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options_.tls) {
    auto tls = server::NewClusterChannelCredentials(
        tls_files_.ca,
        server::TlsFiles{tls_files_.client_cert, tls_files_.client_key, /*client_ca=*/""});
    if (!tls.ok()) return tls.status();
    credentials = *std::move(tls);
  }
  const std::string client_url = Url(options_.tls ? "https" : "http", client_port_);
  const std::string peer_url = Url("http", peer_port_);
  // Short raft timings: a single member elects itself within a few ticks of starting, and the
  // minimum lease TTL (1.5 election timeouts) drops to 1 s.
  std::vector<std::string> args = {
      options_.binary,
      "--name",
      kMemberName,
      "--data-dir",
      data_dir(),
      "--listen-client-urls",
      client_url,
      "--advertise-client-urls",
      client_url,
      "--listen-peer-urls",
      peer_url,
      "--initial-advertise-peer-urls",
      peer_url,
      "--initial-cluster",
      absl::StrCat(kMemberName, "=", peer_url),
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
  if (options_.tls) {
    args.insert(args.end(),
                {"--cert-file", tls_files_.server_cert, "--key-file", tls_files_.server_key,
                 "--trusted-ca-file", tls_files_.ca, "--client-cert-auth"});
  }
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
  auto kv =
      etcdserverpb::KV::NewStub(grpc::CreateCustomChannel(endpoint_, credentials, channel_args));
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

std::string EtcdTestServer::LogTail() const { return FileTail(dir_ + "/etcd.log"); }

EtcdClientOptions EtcdTestServer::ClientOptions(absl::Duration call_timeout) const {
  EtcdClientOptions options;
  options.endpoint = endpoint_;
  options.call_timeout = call_timeout;
  options.max_reconnect_backoff = absl::Milliseconds(500);
  return options;
}

void EtcdTest::SetUp() {
  absl::StatusOr<std::unique_ptr<EtcdTestServer>> etcd = EtcdTestServer::Start();
  if (absl::IsNotFound(etcd.status())) GTEST_SKIP() << etcd.status().message();
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  etcd_ = *std::move(etcd);
}

std::unique_ptr<EtcdClient> EtcdTest::NewClient(absl::Duration call_timeout) {
  absl::StatusOr<std::unique_ptr<EtcdClient>> client =
      EtcdClient::Create(etcd_->ClientOptions(call_timeout));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

}  // namespace tessera::cluster
