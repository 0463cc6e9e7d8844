// API keys with scopes. Keys come from a file, one "KEY SCOPES" per line (scopes comma-separated
// among read, write, admin; '#' starts a comment); admin implies write implies read. Clients send
// "authorization: Bearer KEY" as call metadata. Without a key file, authentication is off.
#ifndef TESSERA_SERVER_AUTH_H_
#define TESSERA_SERVER_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera::server {

enum class Scope { kRead = 1, kWrite = 2, kAdmin = 3 };

// Immutable after construction; thread-safe.
class ApiKeys {
 public:
  // An empty key set: authentication off.
  ApiKeys() = default;
  // INVALID_ARGUMENT naming the line for a malformed file; NOT_FOUND when it cannot be read.
  static absl::StatusOr<ApiKeys> Load(const std::string& path);

  bool enabled() const { return !keys_.empty(); }
  // OK, UNAUTHENTICATED (no or unknown key) or PERMISSION_DENIED (the key lacks the scope). An
  // absl::Status like every other check a handler makes; the handler maps it (ToGrpcStatus).
  absl::Status Check(const grpc::CallbackServerContext& context, Scope needed) const;

 private:
  absl::flat_hash_map<std::string, Scope> keys_;  // key → highest scope
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_AUTH_H_
