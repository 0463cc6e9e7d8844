// Tests of TerminalSafe: what a terminal would act on (escape sequences, line breaks, NUL, C1
// controls, bidirectional overrides, bytes that are not UTF-8) is written as a visible escape,
// printable text of any script is kept, and no two inputs print alike.
#include "client/cli/terminal.h"

#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::client {
namespace {

TEST(TerminalSafe, KeepsPrintableText) {
  for (const std::string text : {"", "doc-17", "a b", "ünïcødé", "文档", "emoji 🙂",
                                 "zwj 👩\u200d💻", "it's \"quoted\" ~!@#$%^&*()"}) {
    EXPECT_EQ(TerminalSafe(text), text);
  }
}

TEST(TerminalSafe, EscapesControlCharacters) {
  EXPECT_EQ(TerminalSafe("\x1b[2Jcleared"), "\\x1b[2Jcleared");
  EXPECT_EQ(TerminalSafe("row\nforged  9.9  1"), "row\\nforged  9.9  1");
  EXPECT_EQ(TerminalSafe("a\tb\rc"), "a\\tb\\rc");
  EXPECT_EQ(TerminalSafe(std::string("nul\0byte", 8)), "nul\\x00byte");
  EXPECT_EQ(TerminalSafe("bell\a del\x7f"), "bell\\x07 del\\x7f");
  // C1 controls, encoded in UTF-8: U+009B is a one-character CSI on some terminals.
  EXPECT_EQ(TerminalSafe("\xc2\x9b"
                         "2J"),
            "\\u009b2J");
  EXPECT_EQ(TerminalSafe("\xc2\x85"), "\\u0085");
}

TEST(TerminalSafe, EscapesBidiControlsAndLineSeparators) {
  EXPECT_EQ(TerminalSafe("invoice\u202Efdp.exe"), "invoice\\u202efdp.exe");
  EXPECT_EQ(TerminalSafe("\u202A\u202B\u202C\u202D"), "\\u202a\\u202b\\u202c\\u202d");
  EXPECT_EQ(TerminalSafe("\u2066\u2067\u2068\u2069"), "\\u2066\\u2067\\u2068\\u2069");
  EXPECT_EQ(TerminalSafe("\u200E\u200F\u061C"), "\\u200e\\u200f\\u061c");
  EXPECT_EQ(TerminalSafe("a\u2028b\u2029c"), "a\\u2028b\\u2029c");
  // Neighbours of the escaped ranges stay.
  EXPECT_EQ(TerminalSafe("\u2027\u202F\u2065\u206A\u00A0"), "\u2027\u202F\u2065\u206A\u00A0");
}

TEST(TerminalSafe, EscapesBytesThatAreNotUtf8) {
  EXPECT_EQ(TerminalSafe("ID\xff\xfeX"), "ID\\xff\\xfeX");
  EXPECT_EQ(TerminalSafe("\xc3"), "\\xc3");                             // truncated
  EXPECT_EQ(TerminalSafe("\xc0\xaf"), "\\xc0\\xaf");                    // overlong '/'
  EXPECT_EQ(TerminalSafe("\xe0\x80\x9b"), "\\xe0\\x80\\x9b");           // overlong U+001B
  EXPECT_EQ(TerminalSafe("\xed\xa0\x80"), "\\xed\\xa0\\x80");           // a surrogate
  EXPECT_EQ(TerminalSafe("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(TerminalSafe("\x80"
                         "abc"),
            "\\x80abc");  // a lone continuation byte
}

TEST(TerminalSafe, BackslashesAreEscapedUnlessKept) {
  EXPECT_EQ(TerminalSafe("a\\x1b"), "a\\\\x1b");
  EXPECT_NE(TerminalSafe("a\\x1b"), TerminalSafe("a\x1b"));
  EXPECT_EQ(TerminalSafe("id 'a\\xff' \x1b", TerminalBackslash::kKeep), "id 'a\\xff' \\x1b");
}

TEST(TerminalSafe, OutputIsPrintableAndDistinctForDistinctInputs) {
  // Every string of up to two bytes: the output holds no byte below 0x20 or 0x7f, and different
  // inputs give different outputs.
  std::set<std::string> outputs;
  std::vector<std::string> inputs = {""};
  for (int a = 0; a < 256; ++a) {
    inputs.push_back(std::string(1, static_cast<char>(a)));
    for (int b = 0; b < 256; ++b) {
      inputs.push_back(std::string{static_cast<char>(a), static_cast<char>(b)});
    }
  }
  for (const std::string& input : inputs) {
    const std::string output = TerminalSafe(input);
    for (const char c : output) {
      const unsigned char byte = static_cast<unsigned char>(c);
      ASSERT_TRUE(byte >= 0x20 && byte != 0x7f) << "input " << testing::PrintToString(input);
    }
    EXPECT_TRUE(outputs.insert(output).second) << "input " << testing::PrintToString(input);
  }
}

}  // namespace
}  // namespace tessera::client
