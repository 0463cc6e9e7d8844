// The command line's JSON conventions over nlohmann::ordered_json.
#include "client/cli/json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace tessera::client {
namespace {

constexpr int kMaxDepth = 256;

// Raised by the parse callback to stop at the first structural refusal; never leaves ParseJson.
struct Refusal {
  std::string message;
};

// nlohmann's what() is "[json.exception.parse_error.101] parse error at line 1, column 5: ...";
// the offset is given separately, so keep what follows the position.
std::string ParseErrorDetail(const nlohmann::json::parse_error& error) {
  absl::string_view what = error.what();
  const size_t colon = what.find(": ");
  return std::string(colon == absl::string_view::npos ? what : what.substr(colon + 2));
}

}  // namespace

double JsonFloat(float value) {
  if (!std::isfinite(value)) return value;
  char buffer[64];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof(buffer) - 1, value);
  if (error != std::errc()) return value;
  *end = '\0';
  return std::strtod(buffer, nullptr);
}

std::string DumpJson(const Json& json) {
  return json.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

const Json* FindMember(const Json& json, absl::string_view key) {
  if (!json.is_object()) return nullptr;
  auto it = json.find(std::string(key));
  return it == json.end() ? nullptr : &*it;
}

absl::StatusOr<Json> ParseJson(absl::string_view text) {
  // The keys seen in each open object, innermost last; arrays push an empty set so that the
  // stack's depth is the nesting depth.
  std::vector<absl::flat_hash_set<std::string>> open;
  auto check = [&open](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (static_cast<int>(open.size()) >= kMaxDepth) {
          throw Refusal{absl::StrCat("nesting deeper than ", kMaxDepth)};
        }
        open.emplace_back();
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        open.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open.back().insert(parsed.get_ref<const std::string&>()).second) {
          throw Refusal{absl::StrCat("duplicate key ", DumpJson(parsed))};
        }
        break;
      case Json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), check);
  } catch (const nlohmann::json::parse_error& error) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON at offset ", error.byte, ": ", ParseErrorDetail(error)));
  } catch (const Refusal& refusal) {
    return absl::InvalidArgumentError(absl::StrCat("invalid JSON: ", refusal.message));
  }
}

}  // namespace tessera::client
