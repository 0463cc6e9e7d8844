// API keys, their scopes and rate limits, checked once per call for every method the server
// exports (tessera.v1.*, grpc.health.v1, grpc.reflection.*) by the transport before any handler
// runs (server/credentials.h): no handler checks a key, and no method is served unchecked.
//
// The key file holds one key per line, stored hashed:
//   sha256:<64 hex digits> SCOPES [name=NAME] [rate=CALLS_PER_SECOND]
// where the hash is the SHA-256 of the key (`printf %s KEY | sha256sum`), SCOPES is a
// comma-separated subset of read, write, admin (admin implies write implies read), NAME labels the
// key in errors and logs (default: the first 12 hex digits of its hash), and rate caps the key's
// calls per second (a token bucket holding one second's worth; default unlimited). '#' starts a
// comment. Clients send "authorization: Bearer KEY" as call metadata.
#ifndef TESSERA_SERVER_AUTH_H_
#define TESSERA_SERVER_AUTH_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tessera/base/mutex.h"

namespace tessera::server {

enum class Scope { kRead = 1, kWrite = 2, kAdmin = 3 };

// The scope a method needs, by its full gRPC path ("/tessera.v1.QueryService/Search"): reads,
// health and reflection need read; writes need write; creating and dropping collections need
// admin, and so does any method this table does not name.
Scope RequiredScope(absl::string_view method);

using Sha256 = std::array<uint8_t, 32>;
Sha256 HashKey(absl::string_view key);

// Thread-safe. Loaded once at startup; only the rate-limit buckets change afterwards.
class ApiKeys {
 public:
  // INVALID_ARGUMENT naming the file, the line and what was expected for a malformed line (a key
  // in plain text among them); NOT_FOUND when the file cannot be read; INVALID_ARGUMENT for a
  // file without keys (authentication would silently be off).
  static absl::StatusOr<std::unique_ptr<ApiKeys>> Load(const std::string& path);

  // Whether `authorization` (the header's value, "" when absent) may call `method`: OK,
  // UNAUTHENTICATED (no or unknown key), PERMISSION_DENIED (the key lacks the scope) or
  // RESOURCE_EXHAUSTED (the key is over its rate). The key is compared by its hash against every
  // stored hash in constant time.
  absl::Status Authorize(absl::string_view authorization, absl::string_view method) const;

  size_t size() const { return keys_.size(); }

 private:
  struct Key {
    Sha256 hash;
    Scope scope;
    std::string name;
    double rate = 0;  // calls per second; 0 = unlimited
    // Token bucket: `tokens` as of `refilled`.
    mutable Mutex mu;
    mutable double tokens ABSL_GUARDED_BY(mu) = 0;
    mutable std::chrono::steady_clock::time_point refilled ABSL_GUARDED_BY(mu);
  };

  // True when the key may make one more call now (and takes the token).
  static bool TakeToken(const Key& key);

  std::vector<std::unique_ptr<Key>> keys_;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_AUTH_H_
