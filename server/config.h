// Server configuration: defaults, then an optional YAML file (--config), then command-line flags.
// Every setting has the same name in all three (YAML keys are the flag names without "--").
#ifndef TESSERA_SERVER_CONFIG_H_
#define TESSERA_SERVER_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::server {

struct ServerConfig {
  // standalone: the public services over one engine. shard: the internal ShardService for the
  // replicas this node holds, registered in etcd as node_id (DESIGN §7).
  std::string role = "standalone";
  std::string node_id;  // [A-Za-z0-9_.-]{1,128}; required with role shard
  std::string etcd;     // HOST:PORT of an etcd member's client URL; required with role shard
  // PEM CA that signed etcd's server certificate: connect to etcd over TLS, verifying it with
  // this CA. Empty: plaintext.
  std::string etcd_ca;
  // PEM client certificate and key presented to etcd (for its --client-cert-auth); both or
  // neither, and only with etcd_ca.
  std::string etcd_cert;
  std::string etcd_key;
  // The gRPC address a shard node registers for routers to reach it; "" = the --listen host with
  // the port it bound.
  std::string advertise_address;
  std::string data_dir = "./tessera-data";
  std::string listen = "127.0.0.1:50051";
  std::string metrics_listen = "127.0.0.1:9464";  // "" disables the metrics endpoint
  // REST/JSON beside gRPC (server/http/rest_gateway.h), with /openapi.json, /metrics and
  // /healthz, under the same TLS and API keys; "" (the default) serves none.
  std::string http_listen;
  std::string api_keys;  // file of hashed keys (server/auth.h); empty: no authentication
  // File holding the API key (admin scope on the shard nodes' --api_keys) that routers present
  // to shard nodes and shard nodes to each other; empty: none sent.
  std::string cluster_key_file;
  std::string tls_cert;  // PEM; with tls_key enables TLS
  std::string tls_key;
  std::string tls_client_ca;  // PEM; requires and verifies client certificates (mTLS)
  // How often tls_cert, tls_key and tls_client_ca are read again (renewed certificates apply to
  // new connections without a restart).
  int64_t tls_reload_seconds = 60;
  // PEM CA that signed the shard nodes' --tls_cert: routers and nodes then call shard nodes over
  // TLS, verify them with it, and present their own --tls_cert/--tls_key when they have one (for
  // nodes that require client certificates). Empty: plaintext between nodes.
  std::string cluster_tls_ca;
  // Plaintext gRPC on an address beyond loopback; without it such a listener needs TLS.
  bool insecure = false;
  int threads = 0;       // EngineOptions::threads: its two pools' size; 0 = all cores
  int blas_threads = 1;  // EngineOptions::blas_threads: OpenBLAS threads; 0 = OpenBLAS's default
  int64_t resident_rerank_bytes = 0;   // per shard; 0 = none (read in place per search)
  bool sync_writes = true;             // fsync the WAL before acknowledging
  std::string rerank_device = "auto";  // auto | cpu | cuda
  int64_t max_message_bytes = 64 << 20;
  int64_t max_tokens_per_document = 4096;
  int64_t max_documents_per_batch = 1024;
  int64_t max_k = 1000;
  int64_t max_num_candidates = 10000;
  int64_t max_query_tokens = 1024;
  // Searches in one SearchBatch call (RESOURCE_EXHAUSTED beyond); each counts against
  // max_queued_requests as one request.
  int64_t max_searches_per_batch = 64;
  // Admission (server/admission.h): handler threads (0 = twice the cores, at least 4), requests
  // waiting for one, and request bytes queued or running; RESOURCE_EXHAUSTED beyond.
  int request_threads = 0;
  int64_t max_queued_requests = 256;
  int64_t max_inflight_bytes = int64_t{1} << 30;
  double shutdown_grace_seconds = 10;
  // A router moves the replicas of a shard node down this long to other live nodes; 0: never.
  double move_lost_replicas_after_seconds = 300;
};

// args[0] is the program name. INVALID_ARGUMENT naming the flag or YAML key for anything
// malformed or unknown; `--help` is handled by the caller.
absl::StatusOr<ServerConfig> ParseServerConfig(const std::vector<std::string>& args);
std::string ServerUsage();

}  // namespace tessera::server

#endif  // TESSERA_SERVER_CONFIG_H_
