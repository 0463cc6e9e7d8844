#include "server/auth.h"

#include <fstream>
#include <vector>

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

}  // namespace

absl::StatusOr<ApiKeys> ApiKeys::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("api key file ", path, " cannot be read"));
  ApiKeys keys;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string content(absl::StripAsciiWhitespace(line.substr(0, line.find('#'))));
    if (content.empty()) continue;
    const std::vector<std::string> fields = absl::StrSplit(content, ' ', absl::SkipEmpty());
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", number, ": expected 'KEY SCOPES', e.g. 'k3y read,write'"));
    }
    Scope highest = Scope::kRead;
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
        return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": scope '", scope,
                                                       "', expected read, write or admin"));
      }
      if (!any || parsed > highest) highest = parsed;
      any = true;
    }
    keys.keys_[fields[0]] = highest;
  }
  return keys;
}

absl::Status ApiKeys::Check(const grpc::CallbackServerContext& context, Scope needed) const {
  if (keys_.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto header = metadata.find("authorization");
  if (header == metadata.end()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer KEY' metadata");
  }
  const std::string value(header->second.data(), header->second.size());
  constexpr absl::string_view kPrefix = "Bearer ";
  const auto key = keys_.find(absl::StartsWith(value, kPrefix) ? value.substr(kPrefix.size()) : "");
  if (key == keys_.end()) return absl::UnauthenticatedError("unknown API key");
  if (key->second < needed) {
    return absl::PermissionDeniedError(absl::StrCat("the API key has scope '",
                                                    ScopeName(key->second), "', this call needs '",
                                                    ScopeName(needed), "'"));
  }
  return absl::OkStatus();
}

}  // namespace tessera::server
