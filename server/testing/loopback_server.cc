#include "server/testing/loopback_server.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/credentials.h"
#include "tessera/status_macros.h"

namespace tessera::server {

absl::StatusOr<std::unique_ptr<LoopbackServer>> LoopbackServer::Start(
    const std::string& data_dir, const LoopbackServerOptions& options) {
  std::unique_ptr<LoopbackServer> node(new LoopbackServer());
  EngineOptions engine_options;
  engine_options.threads = 2;
  engine_options.sync_writes = false;
  engine_options.limits.max_k = static_cast<int>(options.config.max_k);
  engine_options.limits.max_num_candidates = static_cast<int>(options.config.max_num_candidates);
  TESSERA_ASSIGN_OR_RETURN(node->engine_, Engine::Open(data_dir, engine_options));
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                           NewServerCredentials(TlsFiles{}, options.keys));
  node->admission_ = std::make_unique<Admission>(options.admission);
  ServiceContext& context = node->context_;
  context.engine = node->engine_.get();
  TESSERA_ASSIGN_OR_RETURN(node->snapshots_,
                           SnapshotStore::Open(node->engine_.get(), data_dir + "/snapshots"));
  context.snapshots = node->snapshots_.get();
  context.admission = node->admission_.get();
  context.metrics = &node->metrics_;
  context.config = options.config;
  node->backend_ = std::make_unique<EngineBackend>(&context);
  context.backend = node->backend_.get();
  node->admin_ = std::make_unique<AdminServiceImpl>(&context);
  node->ingest_ = std::make_unique<IngestServiceImpl>(&context);
  node->query_ = std::make_unique<QueryServiceImpl>(&context);
  if (options.extra_service) node->extra_ = options.extra_service(&context);

  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", credentials, &port);
  builder.RegisterService(node->admin_.get());
  builder.RegisterService(node->ingest_.get());
  builder.RegisterService(node->query_.get());
  if (node->extra_ != nullptr) builder.RegisterService(node->extra_.get());
  node->server_ = builder.BuildAndStart();
  if (node->server_ == nullptr || port == 0) {
    return absl::UnavailableError("loopback server: could not listen on 127.0.0.1");
  }
  node->address_ = absl::StrCat("127.0.0.1:", port);
  node->channel_ = grpc::CreateChannel(node->address_, grpc::InsecureChannelCredentials());
  return node;
}

LoopbackServer::~LoopbackServer() {
  if (server_ != nullptr) server_->Shutdown();
  server_.reset();
  admission_.reset();
  snapshots_.reset();
  engine_.reset();
}

}  // namespace tessera::server
