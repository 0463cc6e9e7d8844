// What every handler of the server needs, whatever the service: the engine (or the cluster behind
// a router), the admission, the metrics and the configuration. Below the services (services.h)
// and the backends (engine_backend.h), which both take it.
#ifndef TESSERA_SERVER_SERVICE_CONTEXT_H_
#define TESSERA_SERVER_SERVICE_CONTEXT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "server/admission.h"
#include "server/backend.h"
#include "server/config.h"
#include "server/metrics.h"
#include "tessera/engine.h"
#include "tessera/snapshot.h"

namespace tessera::server {

// Outlives the gRPC server. Not synchronised: set up before the server starts, read-only after.
struct ServiceContext {
  Engine* engine = nullptr;            // null on a router
  Backend* backend = nullptr;          // what the public services serve from
  SnapshotStore* snapshots = nullptr;  // the engine's snapshots; null on a router
  Admission* admission = nullptr;
  Metrics* metrics = nullptr;
  ServerConfig config;
  std::string cluster_key;  // from config.cluster_key_file; sent on calls to other nodes
  // Of calls to other nodes (config.cluster_tls_ca): TLS or plaintext.
  std::shared_ptr<grpc::ChannelCredentials> cluster_credentials =
      grpc::InsecureChannelCredentials();
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_SERVICE_CONTEXT_H_
