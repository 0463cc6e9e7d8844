#include "server/http/http_server.h"

#include <httplib.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/http/rest_gateway.h"

namespace tessera::server {

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options) {
  const size_t colon = options.address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(options.address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", options.address, "', expected HOST:PORT"));
  }
  std::string host = options.address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  std::unique_ptr<httplib::Server> server;
  if (options.tls.cert.empty()) {
    server = std::make_unique<httplib::Server>();
  } else {
    auto tls_server = std::make_unique<httplib::SSLServer>(
        options.tls.cert.c_str(), options.tls.key.c_str(),
        options.tls.client_ca.empty() ? nullptr : options.tls.client_ca.c_str());
    if (!tls_server->is_valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.address, ": OpenSSL refused --tls_cert '", options.tls.cert,
                       "' / --tls_key '", options.tls.key, "'"));
    }
    server = std::move(tls_server);
  }
  const int threads = std::max(options.threads, 1);
  server->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server->set_payload_max_length(options.max_body_bytes);
  // Idle keep-alive connections hold a thread and delay the exit: a short wait, many requests.
  server->set_keep_alive_timeout(2);
  server->set_keep_alive_max_count(10000);
  server->set_read_timeout(30);
  server->set_write_timeout(30);
  const int bound =
      port == 0 ? server->bind_to_any_port(host) : (server->bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.address,
                                               ": the port is in use or the host is not an "
                                               "address of this machine"));
  }
  auto http = std::unique_ptr<HttpServer>(new HttpServer(std::move(options), std::move(server)));
  http->port_ = bound;
  return http;
}

HttpServer::HttpServer(HttpServerOptions options, std::unique_ptr<httplib::Server> server)
    : options_(std::move(options)), server_(std::move(server)) {
  const RestGateway* rest = options_.rest;
  server_->Get("/healthz", [this](const httplib::Request&, httplib::Response& response) {
    const bool serving = serving_.load(std::memory_order_relaxed);
    response.status = serving ? 200 : 503;
    response.set_content(serving ? "ok\n" : "draining\n", "text/plain");
  });
  server_->Get("/metrics",
               [this, rest](const httplib::Request& request, httplib::Response& response) {
                 if (rest != nullptr) {
                   const absl::Status allowed = rest->Authorize(request, "GET /metrics");
                   if (!allowed.ok()) {
                     response.status = HttpStatusOf(allowed.code());
                     response.set_content(ErrorJson(allowed), "application/json");
                     return;
                   }
                 }
                 response.set_content(options_.render_metrics ? options_.render_metrics() : "",
                                      "text/plain; version=0.0.4");
               });
  if (rest != nullptr) {
    rest->Register(server_.get());
    server_->set_error_handler([](const httplib::Request& request, httplib::Response& response) {
      if (!response.body.empty()) return;
      const absl::Status status =
          response.status == 404
              ? absl::NotFoundError(absl::StrCat("no route for ", request.method, " ", request.path,
                                                 " (see /openapi.json)"))
          : response.status == 413
              ? absl::ResourceExhaustedError("request body: larger than the server accepts")
          : response.status == 414
              ? absl::InvalidArgumentError("request line: longer than 8192 bytes")
              : absl::InvalidArgumentError(absl::StrCat("HTTP ", response.status));
      // The status of the error's code, as every other error of this port answers.
      if (response.status != 404) response.status = HttpStatusOf(status.code());
      response.set_content(ErrorJson(status), "application/json");
    });
  } else {
    server_->set_error_handler([](const httplib::Request&, httplib::Response& response) {
      if (response.body.empty()) response.set_content("not found\n", "text/plain");
    });
  }
  thread_ = std::thread([this] {
    server_->listen_after_bind();
    listen_returned_ = true;
  });
}

HttpServer::~HttpServer() {
  // stop() before the listener loop runs would be lost: wait for it to start.
  while (!server_->is_running() && !listen_returned_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  server_->stop();
  thread_.join();
}

}  // namespace tessera::server
