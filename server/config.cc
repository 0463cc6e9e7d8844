#include "server/config.h"

#include <fcntl.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/credentials.h"
#include "tessera/status_macros.h"

namespace tessera::server {
namespace {

using Setter = std::function<absl::Status(const std::string& value)>;

absl::Status Bad(const std::string& name, const std::string& value, const std::string& expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", name, " '", value, "', expected ", expected));
}

// "HOST:PORT": a non-empty host (a name, an IPv4 address or a bracketed IPv6 one) and a decimal
// port 0-65535.
bool IsHostPort(const std::string& value) {
  const size_t colon = value.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  const std::string port = value.substr(colon + 1);
  uint32_t number = 0;
  return !port.empty() && port.size() <= 5 &&
         std::all_of(port.begin(), port.end(),
                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) &&
         absl::SimpleAtoi(port, &number) && number <= 65535;
}

// Every setting by name, with a parser that writes it into `config`. The names of true|false
// settings go into `booleans`: on the command line they may stand alone, meaning true.
std::map<std::string, Setter> Settings(ServerConfig* config, std::set<std::string>* booleans) {
  std::map<std::string, Setter> settings;
  auto text = [&settings](const std::string& name, std::string* field) {
    settings[name] = [field](const std::string& value) {
      *field = value;
      return absl::OkStatus();
    };
  };
  auto integer = [&settings](const std::string& name, int64_t* field, int64_t min) {
    settings[name] = [name, field, min](const std::string& value) {
      if (!absl::SimpleAtoi(value, field) || *field < min) {
        return Bad(name, value, absl::StrCat("an integer ≥ ", min));
      }
      return absl::OkStatus();
    };
  };
  settings["role"] = [config](const std::string& value) {
    if (value != "standalone" && value != "shard" && value != "router") {
      return Bad("role", value, "standalone, shard or router");
    }
    config->role = value;
    return absl::OkStatus();
  };
  settings["node_id"] = [config](const std::string& value) {
    const bool valid =
        !value.empty() && value.size() <= 128 && value != "." && value != ".." &&
        std::all_of(value.begin(), value.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
        });
    if (!valid) return Bad("node_id", value, "1-128 characters of [A-Za-z0-9_.-]");
    config->node_id = value;
    return absl::OkStatus();
  };
  auto address = [&settings](const std::string& name, std::string* field) {
    settings[name] = [name, field](const std::string& value) {
      if (!IsHostPort(value)) return Bad(name, value, "HOST:PORT");
      *field = value;
      return absl::OkStatus();
    };
  };
  address("etcd", &config->etcd);
  address("advertise_address", &config->advertise_address);
  text("etcd_ca", &config->etcd_ca);
  text("etcd_cert", &config->etcd_cert);
  text("etcd_key", &config->etcd_key);
  settings["data_dir"] = [config](const std::string& value) {
    if (value.empty()) {
      return Bad("data_dir", value,
                 "a directory (an empty path would put the data in the working directory)");
    }
    config->data_dir = value;
    return absl::OkStatus();
  };
  settings["listen"] = [config](const std::string& value) {
    const bool unix_socket = value.rfind("unix:", 0) == 0 && value.size() > 5;
    if (!unix_socket && !IsHostPort(value)) {
      return Bad("listen", value,
                 "HOST:PORT with a port 0-65535 (e.g. 127.0.0.1:50051; port 0 picks a free one) "
                 "or unix:PATH");
    }
    config->listen = value;
    return absl::OkStatus();
  };
  settings["metrics_listen"] = [config](const std::string& value) {
    if (!value.empty() && !IsHostPort(value)) {
      return Bad("metrics_listen", value,
                 "HOST:PORT with a port 0-65535 (e.g. 127.0.0.1:9464), or \"\" for none");
    }
    config->metrics_listen = value;
    return absl::OkStatus();
  };
  settings["http_listen"] = [config](const std::string& value) {
    if (!value.empty() && !IsHostPort(value)) {
      return Bad("http_listen", value,
                 "HOST:PORT with a port 0-65535 (e.g. 127.0.0.1:8080), or \"\" for none");
    }
    config->http_listen = value;
    return absl::OkStatus();
  };
  text("api_keys", &config->api_keys);
  text("cluster_key_file", &config->cluster_key_file);
  text("tls_cert", &config->tls_cert);
  text("tls_key", &config->tls_key);
  text("tls_client_ca", &config->tls_client_ca);
  text("cluster_tls_ca", &config->cluster_tls_ca);
  settings["threads"] = [config](const std::string& value) {
    if (!absl::SimpleAtoi(value, &config->threads) || config->threads < 0) {
      return Bad("threads", value, "an integer ≥ 0");
    }
    return absl::OkStatus();
  };
  settings["blas_threads"] = [config](const std::string& value) {
    if (!absl::SimpleAtoi(value, &config->blas_threads) || config->blas_threads < 0) {
      return Bad("blas_threads", value, "an integer ≥ 0");
    }
    return absl::OkStatus();
  };
  auto boolean = [&settings, booleans](const std::string& name, bool* field) {
    booleans->insert(name);
    settings[name] = [name, field](const std::string& value) {
      if (value != "true" && value != "false") return Bad(name, value, "true or false");
      *field = value == "true";
      return absl::OkStatus();
    };
  };
  boolean("sync_writes", &config->sync_writes);
  boolean("insecure", &config->insecure);
  settings["rerank_device"] = [config](const std::string& value) {
    if (value != "auto" && value != "cpu" && value != "cuda") {
      return Bad("rerank_device", value, "auto, cpu or cuda");
    }
    config->rerank_device = value;
    return absl::OkStatus();
  };
  integer("resident_rerank_bytes", &config->resident_rerank_bytes, 0);
  integer("tls_reload_seconds", &config->tls_reload_seconds, 1);
  integer("max_message_bytes", &config->max_message_bytes, 1024);
  integer("max_tokens_per_document", &config->max_tokens_per_document, 1);
  integer("max_documents_per_batch", &config->max_documents_per_batch, 1);
  integer("max_k", &config->max_k, 1);
  integer("max_num_candidates", &config->max_num_candidates, 1);
  integer("max_query_tokens", &config->max_query_tokens, 1);
  integer("max_searches_per_batch", &config->max_searches_per_batch, 1);
  integer("max_queued_requests", &config->max_queued_requests, 1);
  integer("max_inflight_bytes", &config->max_inflight_bytes, 1024);
  settings["request_threads"] = [config](const std::string& value) {
    if (!absl::SimpleAtoi(value, &config->request_threads) || config->request_threads < 0) {
      return Bad("request_threads", value, "an integer ≥ 0");
    }
    return absl::OkStatus();
  };
  auto seconds = [&settings](const std::string& name, double* field) {
    settings[name] = [name, field](const std::string& value) {
      if (!absl::SimpleAtod(value, field) || !std::isfinite(*field) || *field < 0) {
        return Bad(name, value, "a number of seconds ≥ 0");
      }
      return absl::OkStatus();
    };
  };
  seconds("shutdown_grace_seconds", &config->shutdown_grace_seconds);
  seconds("move_lost_replicas_after_seconds", &config->move_lost_replicas_after_seconds);
  return settings;
}

absl::Status ApplyYaml(const std::string& path, std::map<std::string, Setter>& settings) {
  // Read here rather than by yaml-cpp, whose only word for a file it cannot read is "bad file".
  std::string text;
  {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    int error = fd < 0 ? errno : 0;
    char buffer[1 << 16];
    while (error == 0) {
      const ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) error = errno;
      if (n <= 0) break;
      text.append(buffer, static_cast<size_t>(n));
    }
    if (fd >= 0) ::close(fd);
    if (error != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--config '", path,
          "': cannot read it: ", std::error_code(error, std::generic_category()).message()));
    }
  }
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("--config ", path, ": ", e.what()));
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat("--config ", path, ": expected a mapping"));
  }
  for (const auto& entry : root) {
    // A key can be any YAML node ("{a b}: 1" has a mapping as its key); only scalars name settings.
    if (!entry.first.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--config ", path, ": line ", entry.first.Mark().line + 1, ": keys must be plain names"));
    }
    const std::string key = entry.first.Scalar();
    const auto setting = settings.find(key);
    if (setting == settings.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--config ", path, ": unknown key '", key, "'"));
    }
    if (!entry.second.IsScalar()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--config ", path, ": key '", key, "' needs a scalar value"));
    }
    TESSERA_RETURN_IF_ERROR(setting->second(entry.second.Scalar()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ServerConfig> ParseServerConfig(const std::vector<std::string>& args) {
  ServerConfig config;
  std::set<std::string> booleans;
  std::map<std::string, Setter> settings = Settings(&config, &booleans);
  // Split "--name=value" and "--name value" into pairs; apply --config first.
  std::vector<std::pair<std::string, std::string>> flags;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    const size_t equals = arg.find('=');
    if (equals != std::string::npos) {
      flags.emplace_back(arg.substr(2, equals - 2), arg.substr(equals + 1));
    } else if (booleans.count(arg.substr(2)) > 0 &&
               (i + 1 == args.size() || args[i + 1].rfind("--", 0) == 0)) {
      flags.emplace_back(arg.substr(2), "true");
    } else if (i + 1 < args.size()) {
      flags.emplace_back(arg.substr(2), args[++i]);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
    }
  }
  for (const auto& [name, value] : flags) {
    if (name == "config") TESSERA_RETURN_IF_ERROR(ApplyYaml(value, settings));
  }
  for (const auto& [name, value] : flags) {
    if (name == "config") continue;
    const auto setting = settings.find(name);
    if (setting == settings.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    TESSERA_RETURN_IF_ERROR(setting->second(value));
  }
  if (config.role == "shard") {
    if (config.node_id.empty()) return absl::InvalidArgumentError("--role shard needs --node_id");
    if (config.etcd.empty()) return absl::InvalidArgumentError("--role shard needs --etcd");
  }
  if (config.role == "router" && config.etcd.empty()) {
    return absl::InvalidArgumentError("--role router needs --etcd");
  }
  if (config.etcd_cert.empty() != config.etcd_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd_cert '", config.etcd_cert, "' and --etcd_key '", config.etcd_key,
                     "': expected both (a client certificate and its key for etcd) or neither"));
  }
  if (!config.etcd_cert.empty() && config.etcd_ca.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd_cert '", config.etcd_cert,
                     "' needs --etcd_ca: a client certificate is presented to etcd only over "
                     "TLS, which --etcd_ca (the CA of etcd's server certificate) turns on"));
  }
  if (config.tls_cert.empty() != config.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (!config.tls_client_ca.empty() && config.tls_cert.empty()) {
    return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
  }
  if (config.tls_cert.empty() && !config.insecure && !IsLoopbackAddress(config.listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen ", config.listen,
        " accepts connections from other machines: serve TLS (--tls_cert and --tls_key) or "
        "allow plaintext with --insecure"));
  }
  if (!config.http_listen.empty() && config.tls_cert.empty() && !config.insecure &&
      !IsLoopbackAddress(config.http_listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_listen ", config.http_listen,
        " accepts connections from other machines: serve TLS (--tls_cert and --tls_key) or "
        "allow plaintext with --insecure"));
  }
  return config;
}

std::string ServerUsage() {
  return R"(usage: tessera-server [--config FILE.yaml] [--flag value ...]
       tessera-server --version | --help

  --role standalone|shard|router standalone: the public API over this process's data (default);
                                 shard: the internal ShardService, registered in etcd (needs
                                 --node_id and --etcd); router: the public API over the shard
                                 nodes etcd lists, holding no data (needs --etcd)
  --node_id NAME                 this node's name in the cluster ([A-Za-z0-9_.-]{1,128})
  --etcd HOST:PORT               etcd client URL of the cluster's metadata (plaintext unless
                                 --etcd_ca)
  --etcd_ca FILE                 PEM CA that signed etcd's server certificate: connect to etcd
                                 over TLS (its certificate must name --etcd's HOST)
  --etcd_cert FILE --etcd_key FILE
                                 PEM client certificate and key presented to etcd (for its
                                 --client-cert-auth); need --etcd_ca
  --advertise_address HOST:PORT  address a shard node registers (default: --listen's host and
                                 bound port)
  --data_dir DIR                 where collections live (default ./tessera-data); locked
                                 (DIR/LOCK) while this process runs: one server per data dir
  --listen HOST:PORT             gRPC address (default 127.0.0.1:50051; port 0 picks one)
  --metrics_listen HOST:PORT     Prometheus /metrics and /healthz (default 127.0.0.1:9464; "" off)
  --http_listen HOST:PORT        REST/JSON API, /openapi.json, /metrics and /healthz over HTTP/1.1
                                 (default "": off), with the same TLS and API keys as gRPC
  --api_keys FILE                "sha256:HASH SCOPES [name=NAME] [rate=N]" lines: enables auth
                                 (HASH: printf %s KEY | sha256sum; scopes: read, write, admin)
  --cluster_key_file FILE        the API key (first line) routers present to shard nodes and
                                 shard nodes to each other (admin scope in the nodes' --api_keys)
  --tls_cert FILE --tls_key FILE PEM server certificate and key: serve TLS
  --tls_client_ca FILE           PEM CA: require and verify client certificates (mTLS)
  --tls_reload_seconds S         how often the three files above are read again: renewed
                                 certificates apply to new connections (default 60)
  --cluster_tls_ca FILE          PEM CA of the shard nodes' certificates: call them over TLS
                                 (presenting --tls_cert/--tls_key when set)
  --insecure [true|false]        allow plaintext on an address beyond loopback (default false:
                                 such a --listen needs --tls_cert)
  --threads N                    size of each of the engine's two worker pools (pooling, stage
                                 1 and rerank reads; CPU MaxSim) (default 0 = all cores)
  --blas_threads N               OpenBLAS threads per matrix product in stage 1 (default 1:
                                 searches run in parallel already; 0 = OpenBLAS's own default)
  --sync_writes true|false       fsync before acknowledging writes (default true)
  --resident_rerank_bytes N      per shard, rerank vectors copied into memory (default 0 = none:
                                 they are read in place from the mapped rerank segments)
  --rerank_device auto|cpu|cuda  exact MaxSim on the GPU when one is visible (default auto)
  --max_message_bytes N          largest request (default 67108864)
  --max_tokens_per_document N    (default 4096)
  --max_documents_per_batch N    documents in one Upsert message (default 1024)
  --max_k N, --max_num_candidates N, --max_query_tokens N   search limits (1000, 10000, 1024)
  --max_searches_per_batch N     searches in one SearchBatch (default 64); each counts as one
                                 request against --max_queued_requests
  --request_threads N            threads that run handlers (default 0 = 2 × cores, at least 4)
  --max_queued_requests N        requests waiting for a handler thread (default 256)
  --max_inflight_bytes N         request bytes queued or running (default 1073741824); beyond
                                 either limit calls fail at once with RESOURCE_EXHAUSTED
  --shutdown_grace_seconds S     how long SIGTERM waits for in-flight calls (default 10)
  --move_lost_replicas_after_seconds S
                                 router: move the replicas of a shard node down this long to
                                 other live nodes, copied from a serving replica (default 300;
                                 0 = never)
A YAML file takes the same names as keys, e.g. "listen: 0.0.0.0:50051"; flags override it.
)";
}

}  // namespace tessera::server
