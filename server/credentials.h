// The server's transport credentials: plaintext or TLS (optionally mutual), with the API key check
// (server/auth.h) run on every incoming call before its handler, for every service the server
// exports, including the ones gRPC provides (health, reflection). A refused call ends with the
// check's code and message; its handler never runs.
#ifndef TESSERA_SERVER_CREDENTIALS_H_
#define TESSERA_SERVER_CREDENTIALS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/auth.h"

namespace tessera::server {

struct TlsFiles {
  std::string cert;       // PEM; empty: plaintext
  std::string key;        // PEM
  std::string client_ca;  // PEM; requires and verifies client certificates
};

// Called with the method path and the status of every call the key check refused.
using RefusalObserver = std::function<void(absl::string_view method, const absl::Status& status)>;

// `keys` may be null (no authentication); it must outlive every server using the credentials.
// With TLS the three files are read again every `reload_seconds`: a renewed certificate applies
// to the connections made after it, without a restart; a file that becomes unreadable or
// malformed leaves the last good ones in use (gRPC logs the failed read). NOT_FOUND naming a
// PEM file that cannot be read, INVALID_ARGUMENT naming one that holds no PEM certificate (cert,
// client_ca) or private key (key).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> NewServerCredentials(
    const TlsFiles& tls, const ApiKeys* keys, RefusalObserver on_refused = nullptr,
    int64_t reload_seconds = 60);

// The credentials of calls a node makes: to other nodes of a cluster (`cluster_ca` =
// --cluster_tls_ca, `own` = its --tls_cert/--tls_key) and to etcd (--etcd_ca, --etcd_cert/
// --etcd_key). Plaintext without `cluster_ca`, else TLS verified against that CA, presenting
// `own.cert`/`own.key` as the client certificate when both are set (`own.client_ca` is not
// used). NOT_FOUND naming a PEM file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> NewClusterChannelCredentials(
    const std::string& cluster_ca, const TlsFiles& own);

// Whether `listen` ("HOST:PORT", "[::1]:PORT", "unix:PATH") only accepts connections from this
// machine: a loopback address, localhost or a unix socket.
bool IsLoopbackAddress(const std::string& listen);

}  // namespace tessera::server

#endif  // TESSERA_SERVER_CREDENTIALS_H_
