// TerminalSafe: a small UTF-8 decoder that keeps what a terminal prints and escapes the rest.
#include "client/cli/terminal.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace tessera::client {
namespace {

// The code point of the valid UTF-8 sequence at the start of `text` and its length, or length 0
// if the sequence is not valid (truncated, overlong, a surrogate, above U+10FFFF).
struct Decoded {
  uint32_t code_point = 0;
  size_t length = 0;
};

Decoded DecodeUtf8(absl::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(0);
  size_t length;
  uint32_t code_point;
  uint32_t minimum;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2, code_point = lead & 0x1f, minimum = 0x80;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3, code_point = lead & 0x0f, minimum = 0x800;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4, code_point = lead & 0x07, minimum = 0x10000;
  } else {
    return {};
  }
  if (text.size() < length) return {};
  for (size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xc0) != 0x80) return {};
    code_point = (code_point << 6) | (byte(i) & 0x3f);
  }
  if (code_point < minimum || code_point > 0x10ffff ||
      (code_point >= 0xd800 && code_point <= 0xdfff)) {
    return {};
  }
  return {code_point, length};
}

// Characters that reorder, hide or break the text around them.
bool IsFormatControl(uint32_t c) {
  return (c >= 0x80 && c <= 0x9f) ||      // C1 controls (CSI is U+009B)
         c == 0x061c ||                   // Arabic letter mark
         c == 0x200e || c == 0x200f ||    // left-to-right / right-to-left mark
         (c >= 0x202a && c <= 0x202e) ||  // embeddings and overrides
         (c >= 0x2066 && c <= 0x2069) ||  // isolates
         c == 0x2028 || c == 0x2029;      // line and paragraph separators
}

}  // namespace

std::string TerminalSafe(absl::string_view text, TerminalBackslash backslash) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const uint8_t c = static_cast<uint8_t>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      if (c == '\\' && backslash == TerminalBackslash::kEscape) out.push_back('\\');
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    if (c == '\n' || c == '\t' || c == '\r') {
      out += c == '\n' ? "\\n" : (c == '\t' ? "\\t" : "\\r");
      ++i;
      continue;
    }
    const Decoded decoded = c < 0x80 ? Decoded{} : DecodeUtf8(text.substr(i));
    if (decoded.length == 0) {  // A control character or a byte that is not UTF-8.
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
      ++i;
    } else if (IsFormatControl(decoded.code_point)) {
      absl::StrAppend(&out, "\\u", absl::Hex(decoded.code_point, absl::kZeroPad4));
      i += decoded.length;
    } else {
      out.append(text.data() + i, decoded.length);
      i += decoded.length;
    }
  }
  return out;
}

}  // namespace tessera::client
