"""docs/clients/cpp.md cannot drift from the program it documents.

Every ```cpp block of the page must be an excerpt of client/cpp/examples/quickstart.cc, the last
one that file verbatim, and the ```cmake block a line of client/cpp/examples/CMakeLists.txt. The
built example (tessera-cpp-quickstart) then runs against a real tessera-server on loopback and
must print what the page's ```text block says it prints (but the score-and-timing line).

    /usr/bin/python3 tests/e2e/cpp_docs_test.py --server build/bin/tessera-server \
        --example build/bin/tessera-cpp-quickstart [unittest args]
"""

import os
import re
import subprocess
import sys
import unittest

import e2e_util

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(REPO_ROOT, "docs", "clients", "cpp.md")
EXAMPLE_DIR = os.path.join(REPO_ROOT, "client", "cpp", "examples")
EXAMPLE_SOURCE = os.path.join(EXAMPLE_DIR, "quickstart.cc")
EXAMPLE = None  # the built binary, from --example
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
# Lines of the output that differ from run to run.
_VARIES = re.compile(r"^  score \d+\.\d+, \d+\.\d+ ms$")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def blocks(language):
    return [code for lang, code in _FENCE.findall(read(PAGE)) if lang == language]


class PageMatchesExampleTest(unittest.TestCase):

    def test_last_cpp_block_is_the_example_verbatim(self):
        cpp = blocks("cpp")
        self.assertGreater(len(cpp), 1, f"{PAGE} has no ```cpp blocks")
        self.assertEqual(cpp[-1], read(EXAMPLE_SOURCE),
                         f"the last ```cpp block of {PAGE} is not {EXAMPLE_SOURCE} verbatim")

    def test_every_other_cpp_block_is_an_excerpt(self):
        source = read(EXAMPLE_SOURCE)
        for i, code in enumerate(blocks("cpp")[:-1]):
            self.assertIn(code, source,
                          f"```cpp block {i} of {PAGE} is not an excerpt of {EXAMPLE_SOURCE}:\n"
                          f"{code}")

    def test_cmake_block_is_the_example_target(self):
        cmake = blocks("cmake")
        self.assertEqual(len(cmake), 1, f"{PAGE}: expected one ```cmake block")
        self.assertIn(cmake[0], read(os.path.join(EXAMPLE_DIR, "CMakeLists.txt")))


class ExampleRunsTest(e2e_util.ServerTestCase):

    def run_example(self, *args):
        return subprocess.run([EXAMPLE, "--addr", self.server.address, *args],
                              capture_output=True, text=True, timeout=120)

    def test_prints_what_the_page_shows(self):
        result = self.run_example()
        self.assertEqual(result.returncode, 0,
                         f"exit {result.returncode}\nstdout:\n{result.stdout}\n"
                         f"stderr:\n{result.stderr}")
        lines = result.stdout.splitlines()
        # The facts the page's prose relies on, each named if it fails.
        self.assertIn("top hit: doc7", lines)
        self.assertIn("count: 100", lines)
        self.assertIn("count year >= 2023 and en: 20", lines)
        self.assertIn("count any_of: 30", lines)
        self.assertIn("count none_of fr: 50", lines)
        self.assertIn("scrolled 10 documents in 3 pages", lines)
        self.assertIn("group year 2022: doc7 (2 hits)", lines)
        self.assertIn("deleted doc1: yes, no-such-doc: no", lines)
        self.assertIn("deleted by filter: 10", lines)
        self.assertIn("count after deletes: 89", lines)
        self.assertTrue(any(line.startswith("get doc1: NOT_FOUND (") for line in lines), lines)
        filtered = [line for line in lines if re.match(r"^  doc\d+ year \d+$", line)]
        self.assertEqual(len(filtered), 5, lines)
        self.assertTrue(all(int(line.split()[-1]) >= 2023 for line in filtered), filtered)

        texts = blocks("text")
        self.assertEqual(len(texts), 1, f"{PAGE}: expected one ```text block (the output)")
        shown = texts[0].splitlines()
        self.assertEqual(len(lines), len(shown), f"printed:\n{result.stdout}\npage:\n{texts[0]}")
        for printed, page in zip(lines, shown):
            if _VARIES.match(page):
                self.assertRegex(printed, _VARIES)
            else:
                self.assertEqual(printed, page)
        # The example drops its collection, so it runs again on the same server.
        self.assertEqual(self.run_example().returncode, 0)

    def test_unreachable_server_fails_with_the_status(self):
        port = e2e_util.free_port()
        result = subprocess.run([EXAMPLE, "--addr", f"127.0.0.1:{port}"], capture_output=True,
                                text=True, timeout=120)
        self.assertEqual(result.returncode, 1)
        self.assertIn("connect: UNAVAILABLE: cannot connect to 127.0.0.1:", result.stderr)


if __name__ == "__main__":
    (server, EXAMPLE), rest = e2e_util.parse_binaries("server", "example")
    e2e_util.SERVER_BINARY = server
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
