// Command-line flag parsing for `tessera`: GNU-style long flags ("--k 5", "--k=5", "--exhaustive")
// mixed freely with positional arguments, "--" ending the flags, and "-h" as "--help".
#ifndef TESSERA_CLIENT_CLI_ARGS_H_
#define TESSERA_CLIENT_CLI_ARGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tessera::client {

struct FlagSpec {
  const char* name;  // without the leading "--"
  bool takes_value;  // false: a boolean switch
};

struct ParsedArgs {
  std::vector<std::string> positionals;
  // Every occurrence of every flag given, in order; a switch has the value "true".
  std::map<std::string, std::vector<std::string>> flags;

  bool Has(absl::string_view name) const { return flags.count(std::string(name)) > 0; }
  // The last value of a flag, if given.
  std::optional<std::string> Get(absl::string_view name) const;
  std::vector<std::string> GetAll(absl::string_view name) const;
};

// INVALID_ARGUMENT for an unknown flag, a value given to a switch, or a missing value.
absl::StatusOr<ParsedArgs> ParseArgs(absl::Span<const std::string> args,
                                     absl::Span<const FlagSpec> specs);

// Flag value parsers; INVALID_ARGUMENT naming the flag and what was expected.
absl::StatusOr<uint32_t> ParseUint32Flag(absl::string_view flag, absl::string_view value,
                                         uint32_t min_value = 0);
absl::StatusOr<double> ParseDoubleFlag(absl::string_view flag, absl::string_view value);
// "30s", "500ms", "2m", "1h30m", or a bare number of seconds ("2.5"); "0" or "none" is
// absl::InfiniteDuration() (no deadline).
absl::StatusOr<absl::Duration> ParseTimeoutFlag(absl::string_view flag, absl::string_view value);

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_CLI_ARGS_H_
