// Flag parsing for the command line.
#include "client/cli/args.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tessera::client {

std::optional<std::string> ParsedArgs::Get(absl::string_view name) const {
  auto it = flags.find(std::string(name));
  if (it == flags.end() || it->second.empty()) return std::nullopt;
  return it->second.back();
}

std::vector<std::string> ParsedArgs::GetAll(absl::string_view name) const {
  auto it = flags.find(std::string(name));
  return it == flags.end() ? std::vector<std::string>() : it->second;
}

absl::StatusOr<ParsedArgs> ParseArgs(absl::Span<const std::string> args,
                                     absl::Span<const FlagSpec> specs) {
  ParsedArgs parsed;
  bool flags_ended = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (flags_ended || arg.size() < 2 || arg[0] != '-' || (arg[1] != '-' && arg != "-h")) {
      parsed.positionals.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_ended = true;
      continue;
    }
    std::string name = arg == "-h" ? "help" : arg.substr(2);
    std::optional<std::string> value;
    if (const size_t equals = name.find('='); equals != std::string::npos) {
      value = name.substr(equals + 1);
      name.resize(equals);
    }
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& candidate : specs) {
      if (name == candidate.name) spec = &candidate;
    }
    if (spec == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    if (!spec->takes_value) {
      if (value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      parsed.flags[name].push_back("true");
      continue;
    }
    if (!value.has_value()) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = args[++i];
    }
    parsed.flags[name].push_back(*std::move(value));
  }
  return parsed;
}

absl::StatusOr<uint32_t> ParseUint32Flag(absl::string_view flag, absl::string_view value,
                                         uint32_t min_value) {
  uint32_t parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < min_value) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " expects an integer ≥ ", min_value, ", got '", value, "'"));
  }
  return parsed;
}

absl::StatusOr<double> ParseDoubleFlag(absl::string_view flag, absl::string_view value) {
  double parsed = 0;
  if (!absl::SimpleAtod(value, &parsed) || !std::isfinite(parsed) || parsed < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " expects a non-negative number, got '", value, "'"));
  }
  return parsed;
}

absl::StatusOr<absl::Duration> ParseTimeoutFlag(absl::string_view flag, absl::string_view value) {
  if (value == "none" || value == "0") return absl::InfiniteDuration();
  double seconds = 0;
  absl::Duration duration;
  if (absl::SimpleAtod(value, &seconds) && std::isfinite(seconds) && seconds >= 0) {
    duration = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(value, &duration) || duration < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " expects a duration such as 30s, 500ms or 2m, got '", value, "'"));
  }
  if (duration == absl::ZeroDuration()) return absl::InfiniteDuration();
  return duration;
}

}  // namespace tessera::client
