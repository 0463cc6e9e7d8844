// The server's HTTP/1.1 listeners, on cpp-httplib (Debian's libcpp-httplib-dev): a thread pool,
// TLS through OpenSSL (the library gRPC uses here too), keep-alive and chunked bodies, none of
// which a hand-written socket loop should redo. Every listener serves GET /metrics (Prometheus
// text) and GET /healthz (200 "ok" while serving, 503 "draining" after SetServing(false), as
// gRPC health's NOT_SERVING); --http_listen's also serves the REST API (server/http/
// rest_gateway.h) and /openapi.json, with the server's TLS files and API keys (/metrics then
// needs a read key; /healthz and /openapi.json need none).
#ifndef TESSERA_SERVER_HTTP_HTTP_SERVER_H_
#define TESSERA_SERVER_HTTP_HTTP_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/credentials.h"

namespace httplib {
class Server;
}

namespace tessera::server {

class RestGateway;

struct HttpServerOptions {
  std::string address;  // HOST:PORT; port 0 picks one
  TlsFiles tls;         // no cert: plaintext
  std::function<std::string()> render_metrics;
  const RestGateway* rest = nullptr;          // null: /metrics and /healthz only
  int threads = 16;                           // connections served at once (each holds one)
  size_t max_body_bytes = size_t{256} << 20;  // larger request bodies get 413
};

// Serves on its own threads from Start until destruction. Thread-safe.
class HttpServer {
 public:
  // Binds the address. INVALID_ARGUMENT for a malformed address or TLS files that OpenSSL
  // refuses; UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options);
  // Stops accepting, finishes the open requests and closes the connections.
  ~HttpServer();

  int port() const { return port_; }
  // What /healthz answers from now on.
  void SetServing(bool serving) { serving_.store(serving, std::memory_order_relaxed); }

 private:
  HttpServer(HttpServerOptions options, std::unique_ptr<httplib::Server> server);

  const HttpServerOptions options_;
  const std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::atomic<bool> serving_{true};
  std::atomic<bool> listen_returned_{false};
  std::thread thread_;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_HTTP_HTTP_SERVER_H_
