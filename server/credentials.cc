#include "server/credentials.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tessera/status_macros.h"

namespace tessera::server {
namespace {

absl::string_view SliceView(const grpc_slice& slice) {
  return {reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(slice)), GRPC_SLICE_LENGTH(slice)};
}

// What the transport's auth filter calls for every call, with its initial metadata (":path"
// among it). Answers synchronously; the authorization header is consumed, so handlers never see
// the key.
struct KeyCheck {
  const ApiKeys* keys;
  RefusalObserver on_refused;

  static void Process(void* state, grpc_auth_context*, const grpc_metadata* metadata, size_t count,
                      grpc_process_auth_metadata_done_cb done, void* user_data) {
    const auto* check = static_cast<const KeyCheck*>(state);
    absl::string_view method, authorization;
    const grpc_metadata* authorization_entry = nullptr;
    for (size_t i = 0; i < count; ++i) {
      const absl::string_view key = SliceView(metadata[i].key);
      if (key == ":path") method = SliceView(metadata[i].value);
      if (key == "authorization") {
        authorization = SliceView(metadata[i].value);
        authorization_entry = &metadata[i];
      }
    }
    const absl::Status status = check->keys->Authorize(authorization, method);
    if (!status.ok()) {
      if (check->on_refused) check->on_refused(method, status);
      const std::string message(status.message());
      done(user_data, nullptr, 0, nullptr, 0, static_cast<grpc_status_code>(status.code()),
           message.c_str());
      return;
    }
    done(user_data, authorization_entry, authorization_entry == nullptr ? 0 : 1, nullptr, 0,
         GRPC_STATUS_OK, nullptr);
  }

  static void Destroy(void* state) { delete static_cast<KeyCheck*>(state); }
};

// gRPC's C++ credentials cannot carry a metadata processor over plaintext (its insecure
// credentials abort on SetAuthMetadataProcessor), while its core credentials can, for plaintext
// and TLS alike: this wraps core credentials so that one key check serves both.
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit CoreServerCredentials(grpc_server_credentials* credentials)
      : credentials_(credentials) {}
  ~CoreServerCredentials() override { grpc_server_credentials_release(credentials_); }

  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& processor) override {
    // Not used: the key check is attached at construction (NewServerCredentials).
  }

  void SetKeyCheck(const ApiKeys* keys, RefusalObserver on_refused) {
    grpc_auth_metadata_processor processor{&KeyCheck::Process, &KeyCheck::Destroy,
                                           new KeyCheck{keys, std::move(on_refused)}};
    grpc_server_credentials_set_auth_metadata_processor(credentials_, processor);
  }

 private:
  int AddPortToServer(const std::string& address, grpc_server* server) override {
    return grpc_server_add_http2_port(server, address.c_str(), credentials_);
  }

  grpc_server_credentials* const credentials_;
};

absl::StatusOr<std::string> ReadPem(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// NOT_FOUND when `path` (the value of `flag`) cannot be read; INVALID_ARGUMENT when it holds no
// PEM block whose BEGIN line ends in `label_end` ("CERTIFICATE-----", "PRIVATE KEY-----").
absl::Status CheckPem(absl::string_view flag, const std::string& path,
                      absl::string_view label_end) {
  absl::StatusOr<std::string> text = ReadPem(path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat(flag, ": ", text.status().message()));
  }
  for (size_t at = text->find("-----BEGIN "); at != std::string::npos;
       at = text->find("-----BEGIN ", at + 1)) {
    const size_t line_end = text->find('\n', at);
    const absl::string_view line = absl::string_view(*text).substr(
        at, line_end == std::string::npos ? std::string::npos : line_end - at);
    if (absl::EndsWith(absl::StripTrailingAsciiWhitespace(line), label_end)) {
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " ", path, ": no PEM block \"-----BEGIN ...", label_end, "\""));
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> NewClusterChannelCredentials(
    const std::string& cluster_ca, const TlsFiles& own) {
  if (cluster_ca.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  TESSERA_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem(cluster_ca));
  if (!own.cert.empty() && !own.key.empty()) {
    TESSERA_ASSIGN_OR_RETURN(options.pem_cert_chain, ReadPem(own.cert));
    TESSERA_ASSIGN_OR_RETURN(options.pem_private_key, ReadPem(own.key));
  }
  return grpc::SslCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> NewServerCredentials(
    const TlsFiles& tls, const ApiKeys* keys, RefusalObserver on_refused, int64_t reload_seconds) {
  grpc_server_credentials* core = nullptr;
  if (tls.cert.empty()) {
    core = grpc_insecure_server_credentials_create();
  } else {
    // Checked here so that a wrong path or file stops the server at start, naming it; gRPC's
    // file watcher then reads them again every reload_seconds.
    TESSERA_RETURN_IF_ERROR(CheckPem("--tls_cert", tls.cert, "CERTIFICATE-----"));
    TESSERA_RETURN_IF_ERROR(CheckPem("--tls_key", tls.key, "PRIVATE KEY-----"));
    if (!tls.client_ca.empty()) {
      TESSERA_RETURN_IF_ERROR(CheckPem("--tls_client_ca", tls.client_ca, "CERTIFICATE-----"));
    }
    grpc_tls_certificate_provider* provider = grpc_tls_certificate_provider_file_watcher_create(
        tls.key.c_str(), tls.cert.c_str(), tls.client_ca.empty() ? nullptr : tls.client_ca.c_str(),
        static_cast<unsigned int>(std::max<int64_t>(reload_seconds, 1)));
    grpc_tls_credentials_options* options = grpc_tls_credentials_options_create();
    grpc_tls_credentials_options_set_certificate_provider(options, provider);  // takes a ref
    grpc_tls_certificate_provider_release(provider);
    grpc_tls_credentials_options_watch_identity_key_cert_pairs(options);
    if (tls.client_ca.empty()) {
      grpc_tls_credentials_options_set_cert_request_type(options,
                                                         GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    } else {
      grpc_tls_credentials_options_watch_root_certs(options);
      grpc_tls_credentials_options_set_cert_request_type(
          options, GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    }
    core = grpc_tls_server_credentials_create(options);  // owns `options`
  }
  auto credentials = std::make_shared<CoreServerCredentials>(core);
  if (keys != nullptr) credentials->SetKeyCheck(keys, std::move(on_refused));
  return std::shared_ptr<grpc::ServerCredentials>(std::move(credentials));
}

bool IsLoopbackAddress(const std::string& listen) {
  if (absl::StartsWith(listen, "unix:")) return true;
  absl::string_view host = listen;
  if (absl::StartsWith(host, "[")) {
    const size_t close = host.find(']');
    host = close == absl::string_view::npos ? absl::string_view() : host.substr(1, close - 1);
  } else {
    const size_t colon = host.rfind(':');
    if (colon != absl::string_view::npos) host = host.substr(0, colon);
  }
  return host == "localhost" || absl::StartsWith(host, "127.") || host == "::1" ||
         host == "0:0:0:0:0:0:0:1";
}

}  // namespace tessera::server
