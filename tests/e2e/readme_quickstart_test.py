"""The README's quick starts, run as a new user would run them.

Extracts the code blocks under "## Quick start: CLI" and "## Quick start: Python" of README.md and
runs them against a real tessera-server started as `scripts/run` starts it (no flags but the
ports: its default data dir ./tessera-data lies in a temporary working directory). The only
changes to the README's text are these, each asserted to apply, so that the README cannot drift
away from the test unnoticed:

  CLI block     `B=build/bin`        -> `B=<the directory of --cli>`
                `$B/tessera `        -> `$B/tessera --addr <the server's address> `
                (run in a temporary directory, where it writes docs.npz, docs.jsonl and q.npy)
  Python blocks `"127.0.0.1:50051"`  -> `"<the server's address>"`
                (the sh block runs at the repository root, as written, with the python block on
                its interpreter's stdin, as if typed into it)

A second test runs scripts/run itself with its heavy steps stubbed out (scripts/setup, cmake, the
stub generator and the server binary record their arguments instead of running) and checks that
it builds every binary the quick starts call and generates the Python stubs they import.

    /usr/bin/python3 tests/e2e/readme_quickstart_test.py --server build/bin/tessera-server \
        --cli build/bin/tessera [unittest args]
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import e2e_util

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO_ROOT, "README.md")
SERVER = None
CLI = None
_LISTENING = re.compile(r"tessera-server listening on (\S+):(\d+)")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def section_blocks(title):
    """The (language, code) of each fenced block in the README section `## title`."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else len(text)]
    return [(match.group(1), match.group(2)) for match in _FENCE.finditer(section)]


def substitute(testcase, code, replacements):
    for old, new in replacements:
        testcase.assertIn(old, code, f"the README no longer holds {old!r}; update the test")
        code = code.replace(old, new)
    return code


class ReadmeQuickStartTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="tessera-readme-")
        cls.log_path = os.path.join(cls.work, "server.log")
        log = open(cls.log_path, "wb")
        # As scripts/run: `exec build/bin/tessera-server "$@"`, here with free loopback ports.
        cls.server = subprocess.Popen(
            [SERVER, "--listen", "127.0.0.1:0", "--metrics_listen", "127.0.0.1:0"],
            cwd=cls.work, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 60
        while not (match := _LISTENING.search(cls.server_log())):
            if cls.server.poll() is not None or time.monotonic() > deadline:
                cls.server.kill()
                raise AssertionError("tessera-server did not start:\n" + cls.server_log())
            time.sleep(0.05)
        cls.address = f"{match.group(1)}:{match.group(2)}"

    @classmethod
    def tearDownClass(cls):
        cls.server.send_signal(signal.SIGTERM)
        try:
            code = cls.server.wait(60)
        except subprocess.TimeoutExpired:
            cls.server.kill()
            code = "timeout"
        shutil.rmtree(cls.work, ignore_errors=True)
        if code != 0:
            raise AssertionError(f"tessera-server exited with {code} on SIGTERM")

    @classmethod
    def server_log(cls):
        with open(cls.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def run_shell(self, script, cwd, stdin=None, timeout=240):
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, input=stdin,
                                capture_output=True, text=True, timeout=timeout)
        self.assertEqual(result.returncode, 0,
                         f"script:\n{script}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
                         f"\nserver log:\n{self.server_log()[-3000:]}")
        return result

    def cli_json(self, *args):
        result = subprocess.run([CLI, "--addr", self.address, *args, "--json"],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        return json.loads(result.stdout)

    def test_cli_then_python_quick_start(self):
        """Both, in the README's order, against one server: as a reader would run them."""
        self.run_cli_quick_start()
        self.run_python_quick_start()
        # The Python quick start's collection lies beside the CLI's, not instead of it.
        self.assertEqual(set(self.cli_json("collections", "list")["collections"]),
                         {"papers", "papers-py"})

    def run_cli_quick_start(self):
        blocks = section_blocks("Quick start: CLI")
        self.assertEqual([language for language, _ in blocks], ["sh"])
        script = substitute(self, blocks[0][1], [
            ("B=build/bin", f"B={os.path.dirname(CLI)}"),
            ("$B/tessera ", f"$B/tessera --addr {self.address} "),
        ])
        directory = os.path.join(self.work, "cli")
        os.mkdir(directory)
        result = self.run_shell(script, directory)
        for name in ("docs.npz", "docs.jsonl", "q.npy"):
            self.assertTrue(os.path.exists(os.path.join(directory, name)), name)
        # Its --json outputs, in order: search, get, stats.
        outputs = [json.loads(line) for line in result.stdout.splitlines()
                   if line.startswith("{")]
        self.assertEqual(len(outputs), 3, result.stdout)
        search, document, stats = outputs
        self.assertEqual(search["results"][0]["id"], "doc-17", search)  # as the README says
        self.assertEqual(len(search["results"]), 10)
        self.assertEqual(document["id"], "doc-17")
        self.assertEqual(document["attributes"], {"year": 2022})
        self.assertEqual(stats["documents"], 100)

    def run_python_quick_start(self):
        blocks = section_blocks("Quick start: Python")
        self.assertEqual([language for language, _ in blocks], ["sh", "python"])
        shell = blocks[0][1]
        python = substitute(self, blocks[1][1], [('"127.0.0.1:50051"', f'"{self.address}"')])
        # The sh block starts /usr/bin/python3; typed into it: the python block.
        result = self.run_shell(shell, REPO_ROOT, stdin=python)
        self.assertIn("'candidates_ms'", result.stdout)  # the printed hits and timings
        hits = re.findall(r"\('(doc\d+)', ", result.stdout)
        self.assertEqual(len(hits), 10, result.stdout)
        info = self.cli_json("collections", "get", "papers-py")
        self.assertEqual(info["stats"]["documents"], 1000)


class ScriptsRunTest(unittest.TestCase):
    """scripts/run builds what the quick starts use, checked by running it with its heavy steps
    replaced by recorders in a copy of the tree: scripts/setup, cmake (on PATH), the Python stub
    generator and the server binary it execs."""

    def test_builds_every_binary_and_the_stubs_the_quick_starts_use(self):
        tree = tempfile.mkdtemp(prefix="tessera-scripts-run-")
        self.addCleanup(shutil.rmtree, tree, True)
        record = os.path.join(tree, "record")

        def recorder(path, name):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(f'#!/bin/sh\necho "{name} $*" >> "{record}"\n')
            os.chmod(path, 0o755)

        os.makedirs(os.path.join(tree, "scripts"))
        shutil.copy2(os.path.join(REPO_ROOT, "scripts", "run"), os.path.join(tree, "scripts"))
        recorder(os.path.join(tree, "scripts", "setup"), "setup")
        recorder(os.path.join(tree, "client", "python", "generate_stubs.sh"), "stubs")
        recorder(os.path.join(tree, "bin", "cmake"), "cmake")
        recorder(os.path.join(tree, "out", "bin", "tessera-server"), "server")
        environment = dict(os.environ, PATH=f"{tree}/bin:{os.environ['PATH']}",
                           BUILD_DIR=os.path.join(tree, "out"))
        result = subprocess.run(["bash", os.path.join(tree, "scripts", "run"), "--threads", "2"],
                                env=environment, capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(record) as f:
            steps = f.read().splitlines()

        builds = [step.split() for step in steps if step.startswith("cmake --build")]
        self.assertEqual(len(builds), 1, steps)
        targets = set(builds[0][builds[0].index("--target") + 1:])
        # Every binary the quick starts call ($B/NAME or build/bin/NAME), and the server.
        used = {"tessera-server"}
        for title in ("Quick start: CLI", "Quick start: Python"):
            for _, code in section_blocks(title):
                used |= set(re.findall(r"(?:\$B|build/bin)/([\w-]+)", code))
        self.assertIn("tessera", used)
        self.assertLessEqual(used, targets, f"scripts/run builds {sorted(targets)}")
        # The Python quick start imports the client, whose stubs are generated, before the server
        # starts (exec: the last step), with the flags given to scripts/run.
        names = [step.split()[0] for step in steps]
        self.assertIn("stubs", names)
        self.assertLess(names.index("stubs"), len(names) - 1)
        self.assertEqual(steps[-1], "server --threads 2")


def main():
    global SERVER, CLI
    (SERVER, CLI), rest = e2e_util.parse_binaries("server", "cli")
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
