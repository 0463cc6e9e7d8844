// A small JSON value for the `tessera` command line: parsing the ingest sidecar (JSONL) and
// printing --json output. Integers without a fraction or exponent stay int64 (attribute values
// keep their type); objects keep their members in insertion order, so output reads in the order
// it was built. Not a general-purpose library: no comments, no streaming, input up to a few MB.
#ifndef TESSERA_CLIENT_CLI_JSON_H_
#define TESSERA_CLIENT_CLI_JSON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera::client {

class Json {
 public:
  enum class Type { kNull, kBool, kInt, kDouble, kString, kArray, kObject };
  using Members = std::vector<std::pair<std::string, Json>>;

  Json() = default;  // null
  Json(bool value) : type_(Type::kBool), bool_(value) {}
  Json(int value) : type_(Type::kInt), int_(value) {}
  Json(int64_t value) : type_(Type::kInt), int_(value) {}
  Json(uint64_t value);  // beyond int64's range it becomes a double
  Json(unsigned value) : type_(Type::kInt), int_(value) {}
  Json(double value) : type_(Type::kDouble), double_(value) {}
  // Stored as the double nearest to the float's shortest decimal form, so 0.1f prints as 0.1.
  Json(float value);
  Json(const char* value) : type_(Type::kString), string_(value) {}
  Json(std::string value) : type_(Type::kString), string_(std::move(value)) {}
  Json(absl::string_view value) : type_(Type::kString), string_(value) {}

  static Json Array() {
    Json json;
    json.type_ = Type::kArray;
    return json;
  }
  static Json Object() {
    Json json;
    json.type_ = Type::kObject;
    return json;
  }

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_number() const { return type_ == Type::kInt || type_ == Type::kDouble; }

  // Accessors; calling one for another type is a programming error (they return a default).
  bool bool_value() const { return bool_; }
  int64_t int_value() const { return int_; }
  // An int widens to double.
  double double_value() const { return type_ == Type::kInt ? static_cast<double>(int_) : double_; }
  const std::string& string_value() const { return string_; }
  const std::vector<Json>& array() const { return array_; }
  const Members& members() const { return members_; }

  // Arrays: appends. Objects: sets `key` (replacing an existing member in place).
  Json& Push(Json value);
  Json& Set(std::string key, Json value);
  // The member named `key`, or nullptr (also for non-objects).
  const Json* Find(absl::string_view key) const;

  // Compact JSON (no spaces). NaN and infinities, which JSON cannot express, print as null;
  // strings are UTF-8 with control characters, '"' and '\\' escaped.
  std::string Dump() const;
  void DumpTo(std::string* out) const;

  friend bool operator==(const Json& a, const Json& b);
  friend bool operator!=(const Json& a, const Json& b) { return !(a == b); }

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  int64_t int_ = 0;
  double double_ = 0;
  std::string string_;
  std::vector<Json> array_;
  Members members_;
};

// Parses one JSON text (RFC 8259), surrounding whitespace allowed. INVALID_ARGUMENT naming the
// byte offset for anything malformed: trailing characters, bad escapes, unpaired surrogates,
// control characters in strings, leading zeros, nesting deeper than 256, duplicate object keys.
absl::StatusOr<Json> ParseJson(absl::string_view text);

// `value` as a JSON string literal, quotes included.
std::string JsonQuote(absl::string_view value);

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_CLI_JSON_H_
