// One node's services wired as server_main wires them (engine, admission, metrics, the engine
// backend, the public services and optionally one more), over a real engine in a directory, on a
// real gRPC server on a free loopback port: the fixture of the services' tests.
#ifndef TESSERA_SERVER_TESTING_LOOPBACK_SERVER_H_
#define TESSERA_SERVER_TESTING_LOOPBACK_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "server/admission.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/engine_backend.h"
#include "server/metrics.h"
#include "server/services.h"
#include "tessera/engine.h"

namespace tessera::server {

struct LoopbackServerOptions {
  // config.max_k and config.max_num_candidates are also the engine's limits, as in server_main.
  ServerConfig config;
  AdmissionOptions admission;
  // Checked by the server's credentials when set (not owned; must outlive the server).
  const ApiKeys* keys = nullptr;
  // A service registered beside the public ones, built on the node's context (a shard service);
  // unset: none.
  std::function<std::unique_ptr<grpc::Service>(const ServiceContext*)> extra_service;
};

class LoopbackServer {
 public:
  // Opens the engine in `data_dir` (2 threads, unsynced writes: a test's data is thrown away) and
  // starts the services on 127.0.0.1 at a port the kernel picks.
  static absl::StatusOr<std::unique_ptr<LoopbackServer>> Start(
      const std::string& data_dir, const LoopbackServerOptions& options);
  // Shuts the server down, then runs what the admission queue holds and closes the engine.
  ~LoopbackServer();

  Engine* engine() const { return engine_.get(); }
  Admission* admission() const { return admission_.get(); }
  // Plaintext, to the server's port.
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  // "127.0.0.1:PORT".
  const std::string& address() const { return address_; }

 private:
  LoopbackServer() = default;

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<SnapshotStore> snapshots_;
  std::unique_ptr<Admission> admission_;
  Metrics metrics_;
  ServiceContext context_;
  std::unique_ptr<EngineBackend> backend_;
  std::unique_ptr<AdminServiceImpl> admin_;
  std::unique_ptr<IngestServiceImpl> ingest_;
  std::unique_ptr<QueryServiceImpl> query_;
  std::unique_ptr<grpc::Service> extra_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::string address_;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_TESTING_LOOPBACK_SERVER_H_
