#include "server/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <fstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tessera::server {
namespace {

const char* ScopeName(Scope scope) {
  switch (scope) {
    case Scope::kRead:
      return "read";
    case Scope::kWrite:
      return "write";
    case Scope::kAdmin:
      return "admin";
  }
  return "?";
}

// Parses "sha256:<64 hex digits>".
bool ParseHash(absl::string_view text, Sha256* hash) {
  if (!absl::ConsumePrefix(&text, "sha256:") || text.size() != 2 * hash->size()) return false;
  for (size_t i = 0; i < hash->size(); ++i) {
    int byte = 0;
    for (char c : text.substr(2 * i, 2)) {
      c = absl::ascii_tolower(c);
      if (c >= '0' && c <= '9') {
        byte = byte * 16 + (c - '0');
      } else if (c >= 'a' && c <= 'f') {
        byte = byte * 16 + (c - 'a' + 10);
      } else {
        return false;
      }
    }
    (*hash)[i] = static_cast<uint8_t>(byte);
  }
  return true;
}

std::string HexPrefix(const Sha256& hash, size_t bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes; ++i) {
    out.push_back(kHex[hash[i] >> 4]);
    out.push_back(kHex[hash[i] & 15]);
  }
  return out;
}

}  // namespace

Scope RequiredScope(absl::string_view method) {
  static const auto* const kScopes = new absl::flat_hash_map<absl::string_view, Scope>{
      {"/tessera.v1.AdminService/CreateCollection", Scope::kAdmin},
      {"/tessera.v1.AdminService/DropCollection", Scope::kAdmin},
      {"/tessera.v1.AdminService/ListCollections", Scope::kRead},
      {"/tessera.v1.AdminService/GetCollection", Scope::kRead},
      {"/tessera.v1.AdminService/Flush", Scope::kWrite},
      // A snapshot is a full copy of a collection's data, and a restore creates a collection.
      {"/tessera.v1.AdminService/CreateSnapshot", Scope::kAdmin},
      {"/tessera.v1.AdminService/ListSnapshots", Scope::kRead},
      {"/tessera.v1.AdminService/DeleteSnapshot", Scope::kAdmin},
      {"/tessera.v1.AdminService/DownloadSnapshot", Scope::kAdmin},
      {"/tessera.v1.AdminService/RestoreSnapshot", Scope::kAdmin},
      {"/tessera.v1.IngestService/Upsert", Scope::kWrite},
      {"/tessera.v1.IngestService/Delete", Scope::kWrite},
      {"/tessera.v1.IngestService/Get", Scope::kRead},
      {"/tessera.v1.QueryService/Search", Scope::kRead},
      {"/tessera.v1.QueryService/SearchBatch", Scope::kRead},
      {"/tessera.v1.QueryService/Count", Scope::kRead},
      {"/tessera.v1.QueryService/Scroll", Scope::kRead},
      {"/grpc.health.v1.Health/Check", Scope::kRead},
      {"GET /metrics", Scope::kRead},  // the REST port's (server/http/http_server.h)
      {"/grpc.health.v1.Health/Watch", Scope::kRead},
      {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", Scope::kRead},
      {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", Scope::kRead},
  };
  const auto found = kScopes->find(method);
  return found == kScopes->end() ? Scope::kAdmin : found->second;
}

Sha256 HashKey(absl::string_view key) {
  Sha256 hash;
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), hash.data());
  return hash;
}

absl::StatusOr<std::unique_ptr<ApiKeys>> ApiKeys::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("api key file ", path, " cannot be read"));
  auto keys = std::unique_ptr<ApiKeys>(new ApiKeys());
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string content(absl::StripAsciiWhitespace(line.substr(0, line.find('#'))));
    if (content.empty()) continue;
    const auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": ", what));
    };
    const std::vector<std::string> fields = absl::StrSplit(content, ' ', absl::SkipEmpty());
    auto key = std::make_unique<Key>();
    if (!ParseHash(fields[0], &key->hash)) {
      // The field may be a key in plain text: never echo it.
      return bad(
          "the first field must be sha256:<64 hex digits>, the SHA-256 of the key (keys are "
          "stored hashed: printf %s KEY | sha256sum)");
    }
    if (fields.size() < 2) return bad("expected 'sha256:HASH SCOPES [name=NAME] [rate=N]'");
    bool any = false;
    for (absl::string_view scope : absl::StrSplit(fields[1], ',')) {
      Scope parsed;
      if (scope == "read") {
        parsed = Scope::kRead;
      } else if (scope == "write") {
        parsed = Scope::kWrite;
      } else if (scope == "admin") {
        parsed = Scope::kAdmin;
      } else {
        return bad(absl::StrCat("scope '", scope, "', expected read, write or admin"));
      }
      if (!any || parsed > key->scope) key->scope = parsed;
      any = true;
    }
    key->name = HexPrefix(key->hash, 6);
    for (size_t i = 2; i < fields.size(); ++i) {
      absl::string_view field = fields[i];
      if (absl::ConsumePrefix(&field, "name=") && !field.empty()) {
        key->name = std::string(field);
      } else if (absl::ConsumePrefix(&field, "rate=")) {
        if (!absl::SimpleAtod(field, &key->rate) || !(key->rate > 0)) {
          return bad(absl::StrCat("rate '", field, "', expected calls per second > 0"));
        }
      } else {
        return bad(absl::StrCat("'", fields[i], "', expected name=NAME or rate=N"));
      }
    }
    for (const auto& other : keys->keys_) {
      if (other->hash == key->hash) return bad("the same key appears twice");
    }
    key->tokens = std::max(key->rate, 1.0);
    key->refilled = std::chrono::steady_clock::now();
    keys->keys_.push_back(std::move(key));
  }
  if (keys->keys_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("api key file ", path, " holds no keys"));
  }
  return keys;
}

bool ApiKeys::TakeToken(const Key& key) {
  if (key.rate == 0) return true;
  MutexLock lock(&key.mu);
  const auto now = std::chrono::steady_clock::now();
  const double elapsed_s = std::chrono::duration<double>(now - key.refilled).count();
  key.tokens = std::min(std::max(key.rate, 1.0), key.tokens + elapsed_s * key.rate);
  key.refilled = now;
  if (key.tokens < 1) return false;
  key.tokens -= 1;
  return true;
}

absl::Status ApiKeys::Authorize(absl::string_view authorization, absl::string_view method) const {
  if (authorization.empty()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer KEY' metadata");
  }
  if (!absl::ConsumePrefix(&authorization, "Bearer ")) {
    return absl::UnauthenticatedError("authorization metadata must be 'Bearer KEY'");
  }
  const Sha256 presented = HashKey(authorization);
  // Every stored hash is compared, in constant time, whichever matches: how long this takes says
  // nothing about the key.
  const Key* match = nullptr;
  for (const auto& key : keys_) {
    const bool equal = CRYPTO_memcmp(key->hash.data(), presented.data(), presented.size()) == 0;
    if (equal) match = key.get();
  }
  if (match == nullptr) return absl::UnauthenticatedError("unknown API key");
  const Scope needed = RequiredScope(method);
  if (match->scope < needed) {
    return absl::PermissionDeniedError(absl::StrCat("the API key '", match->name, "' has scope '",
                                                    ScopeName(match->scope), "', ", method,
                                                    " needs '", ScopeName(needed), "'"));
  }
  if (!TakeToken(*match)) {
    return absl::ResourceExhaustedError(absl::StrCat("the API key '", match->name,
                                                     "' is over its rate limit of ", match->rate,
                                                     " calls per second"));
  }
  return absl::OkStatus();
}

}  // namespace tessera::server
