// tessera-server: the gRPC server over one Engine (embedded default: one process, one data dir),
// or, with --role router, the public API over the shard nodes of a cluster
// (server/cluster/router.h). With --role shard it serves the internal ShardService instead of the
// public API and registers the node in etcd (server/cluster/node_registration.h) while it runs,
// unregistering it on SIGTERM/SIGINT before draining.
#include <fcntl.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "server/admission.h"
#include "server/auth.h"
#include "server/cluster/cluster_state.h"
#include "server/cluster/etcd_client.h"
#include "server/cluster/node_registration.h"
#include "server/cluster/router.h"
#include "server/cluster/shard_service.h"
#include "server/config.h"
#include "server/credentials.h"
#include "server/engine_backend.h"
#include "server/http/http_server.h"
#include "server/http/rest_gateway.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/services.h"
#include "tessera/base/version.h"
#include "tessera/cuda_maxsim.h"
#include "tessera/engine.h"

namespace tessera::server {
namespace {

// The GPU scorer for --rerank_device (EngineOptions::scorer; null: the CPU only), and a name for
// logs. auto: the GPU when one is visible, else the CPU; cuda: the GPU or an error. The CPU scorer
// is the engine's own, on its pool of --threads (one pool of that size, not two); the engine falls
// back to it per call when the device fails, and each fallback is logged and counted
// (EngineOptions::on_scorer_fallback).
absl::StatusOr<std::pair<std::shared_ptr<const MaxSimScorer>, std::string>> RerankScorer(
    const ServerConfig& config) {
  if (config.rerank_device == "cpu") {
    return std::make_pair(std::shared_ptr<const MaxSimScorer>(), std::string("cpu"));
  }
  absl::StatusOr<std::unique_ptr<MaxSimScorer>> gpu = NewCudaMaxSimScorer();
  if (!gpu.ok()) {
    if (config.rerank_device == "cuda") {
      return absl::Status(gpu.status().code(),
                          absl::StrCat("--rerank_device cuda: ", gpu.status().message()));
    }
    Log("info", "exact MaxSim on the CPU", {{"reason", std::string(gpu.status().message())}});
    return std::make_pair(std::shared_ptr<const MaxSimScorer>(), std::string("cpu"));
  }
  return std::make_pair(std::shared_ptr<const MaxSimScorer>(std::move(*gpu)), std::string("cuda"));
}

// The credentials of every etcd client this process makes: TLS verified with --etcd_ca,
// presenting --etcd_cert/--etcd_key when set; null (plaintext) without --etcd_ca. Read once at
// start-up: NOT_FOUND naming a PEM file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> EtcdCredentials(
    const ServerConfig& config) {
  if (config.etcd_ca.empty()) return std::shared_ptr<grpc::ChannelCredentials>();
  auto credentials = NewClusterChannelCredentials(
      config.etcd_ca, TlsFiles{config.etcd_cert, config.etcd_key, /*client_ca=*/""});
  if (!credentials.ok()) {
    std::string flags = absl::StrCat("--etcd_ca '", config.etcd_ca, "'");
    if (!config.etcd_cert.empty()) {
      absl::StrAppend(&flags, ", --etcd_cert '", config.etcd_cert, "', --etcd_key '",
                      config.etcd_key, "'");
    }
    return absl::Status(
        credentials.status().code(),
        absl::StrCat("TLS to etcd (", flags, "): ", credentials.status().message()));
  }
  return credentials;
}

absl::StatusOr<std::unique_ptr<cluster::EtcdClient>> ConnectEtcd(
    const ServerConfig& config, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  cluster::EtcdClientOptions options;
  options.endpoint = config.etcd;
  options.credentials = std::move(credentials);
  auto etcd = cluster::EtcdClient::Create(options);
  if (!etcd.ok()) {
    return absl::Status(etcd.status().code(),
                        absl::StrCat("--etcd ", config.etcd, ": ", etcd.status().message()));
  }
  return etcd;
}

// Registers a shard node reachable at `address`.
absl::StatusOr<std::unique_ptr<cluster::NodeRegistration>> RegisterNode(
    const ServerConfig& config, std::shared_ptr<grpc::ChannelCredentials> etcd_credentials,
    const std::string& address) {
  auto etcd = ConnectEtcd(config, std::move(etcd_credentials));
  if (!etcd.ok()) return etcd.status();
  return cluster::NodeRegistration::Start(*std::move(etcd), config.node_id, address);
}

// The first line of the file, without surrounding whitespace.
absl::StatusOr<std::string> ReadClusterKey(const std::string& path) {
  std::ifstream in(path);
  std::string key;
  if (!in || !std::getline(in, key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cluster_key_file ", path, ": cannot read it"));
  }
  key = std::string(absl::StripAsciiWhitespace(key));
  if (key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cluster_key_file ", path, ": the first line holds no key"));
  }
  return key;
}

int Fail(const absl::Status& status) {
  Log("error", std::string(status.message()), {{"code", absl::StatusCodeToString(status.code())}});
  return 1;
}

// SIGTERM and SIGINT write their number to this pipe (the self-pipe pattern); the main thread
// reads the first one and drains. A handler rather than sigwait on a blocked set: threads that
// libraries start before main (OpenBLAS's pool) do not block the signals, and a second SIGTERM
// during draining, with no thread in sigwait, reached one of them and killed the process.
int g_stop_pipe[2] = {-1, -1};

extern "C" void OnStopSignal(int signal_number) {
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  const int saved_errno = errno;
  [[maybe_unused]] const ssize_t written = write(g_stop_pipe[1], &byte, 1);
  errno = saved_errno;
}

// Installs OnStopSignal for SIGTERM and SIGINT for the rest of the process's life.
absl::Status CatchStopSignals() {
  if (pipe2(g_stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", strerror(errno)));
  }
  // Only the write end may not block (a full pipe drops the byte: a stop is already pending).
  fcntl(g_stop_pipe[0], F_SETFL, 0);
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  for (int signal_number : {SIGTERM, SIGINT}) {
    if (sigaction(signal_number, &action, nullptr) != 0) {
      return absl::InternalError(absl::StrCat("sigaction: ", strerror(errno)));
    }
  }
  return absl::OkStatus();
}

// Blocks until SIGTERM or SIGINT arrives; returns its number.
int WaitForStopSignal() {
  unsigned char byte = 0;
  while (read(g_stop_pipe[0], &byte, 1) != 1) {
  }
  return byte;
}

int Run(const ServerConfig& config) {
  if (absl::Status status = CatchStopSignals(); !status.ok()) return Fail(status);

  std::unique_ptr<ApiKeys> keys;
  if (!config.api_keys.empty()) {
    auto loaded = ApiKeys::Load(config.api_keys);
    if (!loaded.ok()) return Fail(loaded.status());
    keys = std::move(*loaded);
  }
  Metrics metrics;
  // Of every call the key check refused, over gRPC or REST alike.
  const RefusalObserver on_refused = [&metrics](absl::string_view method,
                                                const absl::Status& status) {
    const absl::string_view name = method.substr(method.rfind('/') + 1);
    metrics.RecordRpc(std::string(name), absl::StatusCodeToString(status.code()), 0);
    Log("warning", "rpc refused",
        {{"method", std::string(method)},
         {"code", absl::StatusCodeToString(status.code())},
         {"message", std::string(status.message())}});
  };
  const TlsFiles tls_files{config.tls_cert, config.tls_key, config.tls_client_ca};
  auto credentials =
      NewServerCredentials(tls_files, keys.get(), on_refused, config.tls_reload_seconds);
  if (!credentials.ok()) return Fail(credentials.status());
  // A router holds no data: its backend is the cluster (server/cluster/router.h).
  const bool router_role = config.role == "router";
  const bool shard_role = config.role == "shard";
  std::shared_ptr<grpc::ChannelCredentials> etcd_credentials;
  if (router_role || shard_role) {
    auto loaded = EtcdCredentials(config);
    if (!loaded.ok()) return Fail(loaded.status());
    etcd_credentials = *std::move(loaded);
  }
  std::unique_ptr<Engine> engine;
  std::unique_ptr<SnapshotStore> snapshots;
  std::unique_ptr<cluster::EtcdClient> etcd;
  std::unique_ptr<cluster::ClusterState> cluster_state;
  if (router_role) {
    auto connected = ConnectEtcd(config, etcd_credentials);
    if (!connected.ok()) return Fail(connected.status());
    etcd = *std::move(connected);
    auto state = cluster::ClusterState::Start(etcd.get());
    if (!state.ok()) {
      return Fail(absl::Status(state.status().code(), absl::StrCat("--etcd ", config.etcd, ": ",
                                                                   state.status().message())));
    }
    cluster_state = *std::move(state);
    Log("info", "cluster state read",
        {{"etcd", config.etcd},
         {"shard_nodes", std::to_string(cluster_state->LiveNodes().size())},
         {"collections",
          std::to_string(cluster_state->CollectionsIn(v1::ClusterCollection::READY).size())}});
  } else {
    EngineOptions engine_options;
    auto scorer = RerankScorer(config);
    if (!scorer.ok()) return Fail(scorer.status());
    engine_options.scorer = std::move(scorer->first);
    engine_options.on_scorer_fallback = [&metrics](const absl::Status& s) {
      metrics.RecordRerankFallback();
      Log("warning", "GPU MaxSim failed; scored on the CPU", {{"error", std::string(s.message())}});
    };
    const std::string rerank_device = scorer->second;
    engine_options.threads = config.threads;
    engine_options.blas_threads = config.blas_threads;
    engine_options.log = ServerLogSink();
    engine_options.sync_writes = config.sync_writes;
    engine_options.resident_rerank_bytes = config.resident_rerank_bytes;
    engine_options.limits.max_tokens_per_document = config.max_tokens_per_document;
    engine_options.limits.max_k = static_cast<int>(config.max_k);
    engine_options.limits.max_num_candidates = static_cast<int>(config.max_num_candidates);
    engine_options.limits.max_query_tokens = static_cast<int>(config.max_query_tokens);
    auto opened = Engine::Open(config.data_dir, engine_options);
    if (!opened.ok()) return Fail(opened.status());
    engine = *std::move(opened);
    auto snapshot_store = SnapshotStore::Open(engine.get(), config.data_dir + "/snapshots");
    if (!snapshot_store.ok()) return Fail(snapshot_store.status());
    snapshots = *std::move(snapshot_store);
    Log("info", "engine open",
        {{"data_dir", config.data_dir},
         {"collections", std::to_string(engine->ListCollections().size())},
         {"rerank_device", rerank_device}});
  }

  AdmissionOptions admission_options;
  admission_options.workers =
      config.request_threads > 0
          ? config.request_threads
          : std::max(4, 2 * static_cast<int>(std::thread::hardware_concurrency()));
  admission_options.max_queued = config.max_queued_requests;
  admission_options.max_inflight_bytes = config.max_inflight_bytes;
  auto admission = std::make_unique<Admission>(admission_options);
  ServiceContext context;
  context.engine = engine.get();
  context.snapshots = snapshots.get();
  context.admission = admission.get();
  context.metrics = &metrics;
  context.config = config;
  if (!config.cluster_key_file.empty()) {
    auto key = ReadClusterKey(config.cluster_key_file);
    if (!key.ok()) return Fail(key.status());
    context.cluster_key = *std::move(key);
  }
  {
    auto credentials = NewClusterChannelCredentials(
        config.cluster_tls_ca, TlsFiles{config.tls_cert, config.tls_key, config.tls_client_ca});
    if (!credentials.ok()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--cluster_tls_ca: ", credentials.status().message())));
    }
    context.cluster_credentials = *std::move(credentials);
  }
  std::unique_ptr<Backend> backend;
  if (router_role) {
    cluster::RouterOptions router_options;
    router_options.max_message_bytes = config.max_message_bytes;
    router_options.max_documents_per_batch = config.max_documents_per_batch;
    router_options.cluster_key = context.cluster_key;
    router_options.channel_credentials = context.cluster_credentials;
    router_options.move_lost_replicas_after =
        absl::Seconds(config.move_lost_replicas_after_seconds);
    auto router = std::make_unique<cluster::Router>(cluster_state.get(), router_options);
    // The cluster's snapshots (server/cluster/router_snapshots.cc), served by the same handlers.
    snapshots = cluster::NewRouterSnapshots(router.get());
    context.snapshots = snapshots.get();
    backend = std::move(router);
  } else {
    backend = std::make_unique<EngineBackend>(&context);
  }
  context.backend = backend.get();
  AdminServiceImpl admin(&context);
  IngestServiceImpl ingest(&context);
  QueryServiceImpl query(&context);
  ShardServiceImpl shard(&context, config.node_id);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.listen, *credentials, &port);
  // gRPC sets SO_REUSEPORT by default, so that a second server on a port in use also started and
  // took a share of the connections: the port is this process's alone, or it does not start.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  // gRPC's own buffers (messages received before a handler admits them) under the same bound.
  grpc::ResourceQuota quota("tessera-server");
  quota.Resize(static_cast<size_t>(config.max_inflight_bytes) +
               static_cast<size_t>(config.max_message_bytes));
  builder.SetResourceQuota(quota);
  builder.SetMaxSendMessageSize(
      std::max<int>(static_cast<int>(config.max_message_bytes), 64 << 20));
  // A shard node serves only the internal protocol: a client calling the public API there gets
  // UNIMPLEMENTED.
  if (shard_role) {
    builder.RegisterService(&shard);
  } else {
    builder.RegisterService(&admin);
    builder.RegisterService(&ingest);
    builder.RegisterService(&query);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return Fail(absl::UnavailableError(
        absl::StrCat("cannot listen on ", config.listen,
                     ": the port is in use (by another process) or the host is not an address "
                     "of this machine")));
  }
  const auto render_metrics = [&] {
    if (engine != nullptr) metrics.SetCollections(*engine);
    metrics.SetGauge("tessera_queued_requests", "Requests waiting for an admission worker.",
                     admission->queued());
    metrics.SetGauge("tessera_inflight_request_bytes", "Bytes of the requests queued or running.",
                     admission->inflight_bytes());
    return metrics.Render();
  };
  std::unique_ptr<HttpServer> http;
  if (!config.metrics_listen.empty()) {
    HttpServerOptions options;
    options.address = config.metrics_listen;
    options.render_metrics = render_metrics;
    options.threads = 4;
    auto started = HttpServer::Start(std::move(options));
    if (!started.ok()) {
      server->Shutdown(std::chrono::system_clock::now());
      return Fail(absl::Status(started.status().code(),
                               absl::StrCat("--metrics_listen ", started.status().message())));
    }
    http = std::move(*started);
  }
  // REST beside gRPC: the same services, called through the in-process channel (a shard node
  // has no public API to serve).
  std::unique_ptr<RestGateway> rest;
  std::unique_ptr<HttpServer> rest_http;
  if (!config.http_listen.empty() && !shard_role) {
    grpc::ChannelArguments channel_args;
    channel_args.SetMaxReceiveMessageSize(-1);
    channel_args.SetMaxSendMessageSize(-1);
    RestGatewayOptions rest_options;
    rest_options.keys = keys.get();
    rest_options.on_refused = on_refused;
    rest_options.max_documents_per_batch = config.max_documents_per_batch;
    rest = std::make_unique<RestGateway>(server->InProcessChannel(channel_args), rest_options);
    HttpServerOptions options;
    options.address = config.http_listen;
    options.tls = tls_files;
    options.render_metrics = render_metrics;
    options.rest = rest.get();
    options.threads = std::max(16, 2 * static_cast<int>(std::thread::hardware_concurrency()));
    // JSON spells a request's bytes out at most ~10× (a float as decimal digits).
    options.max_body_bytes = static_cast<size_t>(config.max_message_bytes) * 10;
    auto started = HttpServer::Start(std::move(options));
    if (!started.ok()) {
      server->Shutdown(std::chrono::system_clock::now());
      return Fail(absl::Status(started.status().code(),
                               absl::StrCat("--http_listen ", started.status().message())));
    }
    rest_http = std::move(*started);
  }
  const std::string host = config.listen.substr(0, config.listen.rfind(':'));
  std::cerr << "tessera-server listening on " << host << ":" << port
            << (http ? absl::StrCat(" (metrics on port ", http->port(), ")") : "")
            << (rest_http ? absl::StrCat(" (http on port ", rest_http->port(), ")") : "")
            << std::endl;
  Log("info", "serving",
      {{"listen", absl::StrCat(host, ":", port)},
       {"tls", config.tls_cert.empty() ? "off" : (config.tls_client_ca.empty() ? "on" : "mutual")},
       {"auth", keys != nullptr ? absl::StrCat(keys->size(), " api keys") : "off"},
       {"http", rest_http
                    ? absl::StrCat(config.http_listen.substr(0, config.http_listen.rfind(':')), ":",
                                   rest_http->port())
                    : "off"},
       {"role", config.role}});
  std::unique_ptr<cluster::NodeRegistration> registration;
  if (shard_role) {
    const std::string address =
        config.advertise_address.empty() ? absl::StrCat(host, ":", port) : config.advertise_address;
    auto registered = RegisterNode(config, etcd_credentials, address);
    if (!registered.ok()) {
      server->Shutdown(std::chrono::system_clock::now());
      return Fail(registered.status());
    }
    registration = std::move(*registered);
  }

  const int signal_number = WaitForStopSignal();
  // Later signals only write to the pipe: the drain below runs to its end.
  Log("info", "draining", {{"signal", strsignal(signal_number)}});
  // /healthz: 503 from now on.
  if (http != nullptr) http->SetServing(false);
  if (rest_http != nullptr) rest_http->SetServing(false);
  // Routers stop choosing this node before it stops taking calls.
  registration.reset();
  // New calls are refused (UNAVAILABLE, health NOT_SERVING); open ones get the grace period.
  // Then every connection closes at once: gRPC's own graceful shutdown would also wait for idle
  // clients to answer a ping, which an idle client may never do.
  server->GetHealthCheckService()->SetServingStatus(false);
  const int64_t still_open =
      admission->Drain(absl::Now() + absl::Seconds(config.shutdown_grace_seconds));
  if (still_open > 0) {
    Log("warning", "grace period over; cancelling open calls",
        {{"calls", std::to_string(still_open)}});
  }
  // REST requests still open end with the gRPC calls they wait on (UNAVAILABLE or CANCELLED).
  server->Shutdown(std::chrono::system_clock::now());
  server->Wait();  // every call has finished
  rest_http.reset();
  rest.reset();
  http.reset();
  admission.reset();
  backend.reset();
  cluster_state.reset();
  snapshots.reset();
  engine.reset();  // snapshots candidate indexes and closes the shards
  Log("info", "stopped");
  return 0;
}

}  // namespace
}  // namespace tessera::server

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv, argv + argc);
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      std::cout << tessera::server::ServerUsage();
      return 0;
    }
    if (arg == "--version") {
      std::cout << "tessera-server " << tessera::VersionString() << "\n";
      return 0;
    }
  }
  auto config = tessera::server::ParseServerConfig(args);
  if (!config.ok()) {
    std::cerr << "tessera-server: " << config.status().message() << "\n\n"
              << tessera::server::ServerUsage();
    return 2;
  }
  return tessera::server::Run(*config);
}
