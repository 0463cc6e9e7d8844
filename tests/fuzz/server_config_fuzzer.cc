// Fuzzes the server's YAML configuration: the bytes are written to a scratch file and parsed by
// ParseServerConfig({"tessera-server", "--config", FILE}) (server/config.h), i.e. yaml-cpp's
// parser and the key/value checks of config.cc.
//
// Asserts, beyond no crash, escaping exception or undefined behaviour (ASan, UBSan):
// - a rejected file is INVALID_ARGUMENT;
// - an accepted configuration keeps the documented ranges (threads ≥ 0, the limits ≥ 1, …), the
//   role's required settings and the TLS pairing rules;
// - round trip: the accepted settings given back as "--name=value" flags parse to the same
//   configuration.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/config.h"
#include "tests/fuzz/fuzz_util.h"

namespace tessera::fuzz {
namespace {

std::vector<std::string> AsFlags(const server::ServerConfig& c) {
  std::vector<std::string> flags = {"tessera-server", "--role=" + c.role};
  // Empty means "not set" for these, and is not a value their flags take.
  if (!c.node_id.empty()) flags.push_back("--node_id=" + c.node_id);
  if (!c.etcd.empty()) flags.push_back("--etcd=" + c.etcd);
  if (!c.advertise_address.empty()) flags.push_back("--advertise_address=" + c.advertise_address);
  const std::vector<std::string> rest = {
      "--data_dir=" + c.data_dir,
      "--listen=" + c.listen,
      "--metrics_listen=" + c.metrics_listen,
      "--http_listen=" + c.http_listen,
      "--api_keys=" + c.api_keys,
      "--tls_cert=" + c.tls_cert,
      "--tls_key=" + c.tls_key,
      "--tls_client_ca=" + c.tls_client_ca,
      absl::StrCat("--threads=", c.threads),
      absl::StrCat("--resident_rerank_bytes=", c.resident_rerank_bytes),
      std::string("--sync_writes=") + (c.sync_writes ? "true" : "false"),
      "--rerank_device=" + c.rerank_device,
      absl::StrCat("--max_message_bytes=", c.max_message_bytes),
      absl::StrCat("--max_tokens_per_document=", c.max_tokens_per_document),
      absl::StrCat("--max_documents_per_batch=", c.max_documents_per_batch),
      absl::StrCat("--max_k=", c.max_k),
      absl::StrCat("--max_num_candidates=", c.max_num_candidates),
      absl::StrCat("--max_query_tokens=", c.max_query_tokens),
      absl::StrFormat("--shutdown_grace_seconds=%.17g", c.shutdown_grace_seconds)};
  flags.insert(flags.end(), rest.begin(), rest.end());
  return flags;
}

bool Same(const server::ServerConfig& a, const server::ServerConfig& b) {
  return a.role == b.role && a.node_id == b.node_id && a.etcd == b.etcd &&
         a.advertise_address == b.advertise_address && a.data_dir == b.data_dir &&
         a.listen == b.listen && a.metrics_listen == b.metrics_listen &&
         a.http_listen == b.http_listen && a.api_keys == b.api_keys && a.tls_cert == b.tls_cert &&
         a.tls_key == b.tls_key && a.tls_client_ca == b.tls_client_ca && a.threads == b.threads &&
         a.resident_rerank_bytes == b.resident_rerank_bytes && a.sync_writes == b.sync_writes &&
         a.rerank_device == b.rerank_device && a.max_message_bytes == b.max_message_bytes &&
         a.max_tokens_per_document == b.max_tokens_per_document &&
         a.max_documents_per_batch == b.max_documents_per_batch && a.max_k == b.max_k &&
         a.max_num_candidates == b.max_num_candidates && a.max_query_tokens == b.max_query_tokens &&
         ((std::isnan(a.shutdown_grace_seconds) && std::isnan(b.shutdown_grace_seconds)) ||
          std::memcmp(&a.shutdown_grace_seconds, &b.shutdown_grace_seconds, sizeof(double)) == 0);
}

}  // namespace
}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using namespace tessera::fuzz;
  static const std::string* const path = new std::string(ScratchDir() + "/config.yaml");
  WriteScratchFile(*path, AsStringView(data, size));
  const absl::StatusOr<server::ServerConfig> config =
      server::ParseServerConfig({"tessera-server", "--config", *path});
  if (!config.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(config.status()), config.status().ToString());
    return 0;
  }
  FUZZ_CHECK(config->threads >= 0 && config->resident_rerank_bytes >= 0 &&
                 config->max_message_bytes >= 1024 && config->max_tokens_per_document >= 1 &&
                 config->max_documents_per_batch >= 1 && config->max_k >= 1 &&
                 config->max_num_candidates >= 1 && config->max_query_tokens >= 1 &&
                 !(config->shutdown_grace_seconds < 0),
             "a setting out of its range");
  FUZZ_CHECK(config->rerank_device == "auto" || config->rerank_device == "cpu" ||
                 config->rerank_device == "cuda",
             "rerank_device");
  FUZZ_CHECK(config->role == "standalone" ||
                 (config->role == "shard" && !config->node_id.empty() && !config->etcd.empty()),
             "role");
  FUZZ_CHECK(config->tls_cert.empty() == config->tls_key.empty() &&
                 (config->tls_client_ca.empty() || !config->tls_cert.empty()),
             "TLS settings");
  const absl::StatusOr<server::ServerConfig> again = server::ParseServerConfig(AsFlags(*config));
  FUZZ_CHECK(again.ok(), again.status().ToString());
  FUZZ_CHECK(Same(*config, *again), "the configuration changed when given back as flags");
  return 0;
}
