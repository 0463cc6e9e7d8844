// The command line's JSON: nlohmann::ordered_json (objects keep their members in insertion order,
// so printed output has a stable, readable field order), with the few conventions the CLI's
// output and input need on top of it.
#ifndef TESSERA_CLIENT_CLI_JSON_H_
#define TESSERA_CLIENT_CLI_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tessera::client {

using Json = nlohmann::ordered_json;

// A float as the double nearest to its shortest decimal form, so that a score of 0.1f prints as
// 0.1, not 0.10000000149011612 (JSON numbers are doubles; a float's exact value is not what was
// meant). Non-finite values pass through (and print as null).
double JsonFloat(float value);

// Compact JSON (no spaces). NaN and infinities, which JSON cannot express, print as null; bytes
// of a string that are not UTF-8 print as U+FFFD (nlohmann's default would throw).
std::string DumpJson(const Json& json);

// The member `key` of an object, or nullptr (also when `json` is not an object).
const Json* FindMember(const Json& json, absl::string_view key);

// Parses one JSON text (RFC 8259), surrounding whitespace allowed. INVALID_ARGUMENT naming the
// byte offset for anything malformed (nlohmann's strict parser: trailing characters, bad escapes,
// unpaired surrogates, control characters in strings, leading zeros, NaN), and for what it would
// accept but a document of ours must not have: duplicate object keys (which one wins is not
// defined by the RFC) and nesting deeper than 256.
absl::StatusOr<Json> ParseJson(absl::string_view text);

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_CLI_JSON_H_
