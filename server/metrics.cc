#include "server/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tessera/base/version.h"

namespace tessera::server {

void Histogram::Observe(double ms) {
  for (size_t b = 0; b < kBucketsMs.size(); ++b) {
    if (ms <= kBucketsMs[b]) buckets_[b].fetch_add(1, std::memory_order_relaxed);
  }
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_us_.fetch_add(static_cast<uint64_t>(ms * 1000.0), std::memory_order_relaxed);
}

void Histogram::Render(const std::string& name, const std::string& labels, std::string* out) const {
  const std::string sep = labels.empty() ? "" : ",";
  for (size_t b = 0; b < kBucketsMs.size(); ++b) {
    absl::StrAppend(out, name, "_bucket{", labels, sep, "le=\"", kBucketsMs[b] / 1000.0, "\"} ",
                    buckets_[b].load(std::memory_order_relaxed), "\n");
  }
  const uint64_t count = count_.load(std::memory_order_relaxed);
  absl::StrAppend(out, name, "_bucket{", labels, sep, "le=\"+Inf\"} ", count, "\n");
  absl::StrAppend(out, name, "_sum{", labels, "} ", sum_us_.load(std::memory_order_relaxed) / 1e6,
                  "\n");
  absl::StrAppend(out, name, "_count{", labels, "} ", count, "\n");
}

void Metrics::RecordRpc(const std::string& method, const std::string& code, double ms) {
  MutexLock lock(&mu_);
  auto& counter = rpc_counts_[absl::StrCat(method, "\t", code)];
  if (counter == nullptr) counter = std::make_unique<std::atomic<uint64_t>>(0);
  counter->fetch_add(1, std::memory_order_relaxed);
  auto& histogram = rpc_latency_[method];
  if (histogram == nullptr) histogram = std::make_unique<Histogram>();
  histogram->Observe(ms);
}

void Metrics::RecordSearchStages(double candidates_ms, double fetch_ms, double rerank_ms) {
  stage_candidates_.Observe(candidates_ms);
  stage_fetch_.Observe(fetch_ms);
  stage_rerank_.Observe(rerank_ms);
}

void Metrics::RecordDocuments(int64_t accepted, int64_t rejected, int64_t original_tokens,
                              int64_t stored_vectors) {
  documents_accepted_.fetch_add(accepted, std::memory_order_relaxed);
  documents_rejected_.fetch_add(rejected, std::memory_order_relaxed);
  original_tokens_.fetch_add(original_tokens, std::memory_order_relaxed);
  stored_vectors_.fetch_add(stored_vectors, std::memory_order_relaxed);
}

void Metrics::SetGauge(const std::string& name, const std::string& labels, double value) {
  MutexLock lock(&mu_);
  gauges_[absl::StrCat(name, "\t", labels)] = value;
}

std::string Metrics::Render() const {
  std::string out;
  MutexLock lock(&mu_);
  absl::StrAppend(&out, "# HELP tessera_build_info The version this server was built from.\n",
                  "# TYPE tessera_build_info gauge\n", "tessera_build_info{version=\"", Version(),
                  "\",revision=\"", GitRevision(), "\"} 1\n");
  absl::StrAppend(&out, "# HELP tessera_rpc_total Finished RPCs by method and status code.\n",
                  "# TYPE tessera_rpc_total counter\n");
  for (const auto& [key, counter] : rpc_counts_) {
    const std::vector<std::string> parts = absl::StrSplit(key, '\t');
    absl::StrAppend(&out, "tessera_rpc_total{method=\"", parts[0], "\",code=\"", parts[1], "\"} ",
                    counter->load(std::memory_order_relaxed), "\n");
  }
  absl::StrAppend(&out, "# HELP tessera_rpc_duration_seconds RPC latency.\n",
                  "# TYPE tessera_rpc_duration_seconds histogram\n");
  for (const auto& [method, histogram] : rpc_latency_) {
    histogram->Render("tessera_rpc_duration_seconds", absl::StrCat("method=\"", method, "\""),
                      &out);
  }
  absl::StrAppend(&out, "# HELP tessera_search_stage_duration_seconds Search latency per stage.\n",
                  "# TYPE tessera_search_stage_duration_seconds histogram\n");
  stage_candidates_.Render("tessera_search_stage_duration_seconds", "stage=\"candidates\"", &out);
  stage_fetch_.Render("tessera_search_stage_duration_seconds", "stage=\"fetch\"", &out);
  stage_rerank_.Render("tessera_search_stage_duration_seconds", "stage=\"rerank\"", &out);
  absl::StrAppend(&out, "# TYPE tessera_documents_total counter\n",
                  "tessera_documents_total{outcome=\"stored\"} ",
                  documents_accepted_.load(std::memory_order_relaxed), "\n",
                  "tessera_documents_total{outcome=\"rejected\"} ",
                  documents_rejected_.load(std::memory_order_relaxed), "\n");
  const uint64_t tokens = original_tokens_.load(std::memory_order_relaxed);
  const uint64_t vectors = stored_vectors_.load(std::memory_order_relaxed);
  absl::StrAppend(&out,
                  "# HELP tessera_pooling_ratio Original tokens per stored vector since start.\n",
                  "# TYPE tessera_pooling_ratio gauge\n", "tessera_pooling_ratio ",
                  vectors == 0 ? 0.0 : static_cast<double>(tokens) / vectors, "\n");
  absl::StrAppend(
      &out, "# HELP tessera_rerank_fallback_total GPU MaxSim calls redone on the CPU.\n",
      "# TYPE tessera_rerank_fallback_total counter\n", "tessera_rerank_fallback_total ",
      rerank_fallbacks_.load(std::memory_order_relaxed), "\n");
  for (const auto& [key, value] : gauges_) {
    const std::vector<std::string> parts = absl::StrSplit(key, '\t');
    absl::StrAppend(&out, parts[0], parts[1].empty() ? "" : absl::StrCat("{", parts[1], "}"), " ",
                    value, "\n");
  }
  return out;
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, Renderer render) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_listen '", address, "', expected HOST:PORT"));
  }
  const std::string host = address.substr(0, colon);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_listen host '", host, "', expected an IPv4 address"));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 16) != 0) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", error));
  }
  socklen_t length = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(fd, ntohs(addr.sin_port), std::move(render)));
}

MetricsHttpServer::MetricsHttpServer(int fd, int port, Renderer render)
    : fd_(fd), port_(port), render_(std::move(render)), thread_([this] { Serve(); }) {}

MetricsHttpServer::~MetricsHttpServer() {
  stopping_ = true;
  thread_.join();
  ::close(fd_);
}

void MetricsHttpServer::Serve() {
  while (!stopping_) {
    pollfd pfd{fd_, POLLIN, 0};
    if (::poll(&pfd, 1, 200) <= 0) continue;
    const int client = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    timeval timeout{2, 0};
    ::setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    char buffer[2048];
    const ssize_t n = ::recv(client, buffer, sizeof(buffer) - 1, 0);
    std::string status = "404 Not Found", body = "not found\n", type = "text/plain";
    if (n > 0) {
      buffer[n] = '\0';
      const std::string request(buffer);
      if (request.rfind("GET /metrics", 0) == 0) {
        status = "200 OK";
        body = render_();
        type = "text/plain; version=0.0.4";
      } else if (request.rfind("GET /healthz", 0) == 0) {
        const bool serving = serving_.load(std::memory_order_relaxed);
        status = serving ? "200 OK" : "503 Service Unavailable";
        body = serving ? "ok\n" : "draining\n";
      }
    }
    const std::string response =
        absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type,
                     "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
    ::send(client, response.data(), response.size(), MSG_NOSIGNAL);
    ::close(client);
  }
}

}  // namespace tessera::server
