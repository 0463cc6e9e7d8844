// Escaping for the human (non --json) output of the `tessera` command line. Ids, attribute
// values, collection and field names come from the server and, through it, from whoever wrote the
// documents: printed raw, an id holding "\x1b[2J" clears the screen, a newline forges a table row,
// and a right-to-left override (U+202E) makes text read backwards. Everything a terminal would act
// on instead of display is written as a visible escape.
#ifndef TESSERA_CLIENT_CLI_TERMINAL_H_
#define TESSERA_CLIENT_CLI_TERMINAL_H_

#include <string>

#include "absl/strings/string_view.h"

namespace tessera::client {

// Whether TerminalSafe doubles backslashes: ids and names are escaped unambiguously (kEscape: an
// id spelled "a\\x1b" and one holding the byte 0x1b print differently); error messages, prose
// that may already carry the server's own escapes, keep theirs (kKeep).
enum class TerminalBackslash { kEscape, kKeep };

// `text` safe to print on a terminal: a backslash becomes "\\" (unless kKeep); tab, newline and
// carriage return "\t", "\n", "\r"; other C0 controls, DEL and every byte that is not part of
// valid UTF-8 "\xNN"; the C1 controls (U+0080–U+009F), the bidirectional formatting characters
// (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069) and the line and paragraph separators
// (U+2028, U+2029) "\uXXXX". Everything else, printable ASCII and the rest of UTF-8, is kept.
std::string TerminalSafe(absl::string_view text,
                         TerminalBackslash backslash = TerminalBackslash::kEscape);

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_CLI_TERMINAL_H_
