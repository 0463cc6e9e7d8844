"""Shared helpers of Tessera's end-to-end tests: run the real tessera-server binary, drive it with
the Python client (client/python), and compare its answers with a NumPy brute-force MaxSim.

Every test script runs as
    /usr/bin/python3 tests/e2e/<name>_test.py --server PATH/TO/tessera-server [unittest args]
(--server defaults to $TESSERA_SERVER, then to the newest build*/bin/tessera-server of the tree).
"""

import argparse
import atexit
import base64
import contextlib
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# TESSERA_PYTHON_INSTALLED=1 (the tests that run in the venv where the wheel is installed): import
# the installed package, not the source tree's.
INSTALLED = os.environ.get("TESSERA_PYTHON_INSTALLED") == "1"
if not INSTALLED:
    sys.path.insert(0, os.path.join(REPO_ROOT, "client", "python"))

import grpc  # noqa: E402,F401  (re-exported to the test scripts)
import tessera  # noqa: E402  (generates the stubs on first import from the source tree)

if INSTALLED and os.path.abspath(tessera.__file__).startswith(
        os.path.join(REPO_ROOT, "client", "python") + os.sep):
    raise ImportError(f"TESSERA_PYTHON_INSTALLED=1 but tessera comes from {tessera.__file__}")

SERVER_BINARY = None  # set by main()
_RUNNING = set()  # servers to kill if the interpreter exits with them still up
_LISTENING = re.compile(r"tessera-server listening on (\S+):(\d+)(?: \(metrics on port (\d+)\))?"
                        r"(?: \(http on port (\d+)\))?")


@atexit.register
def _kill_leftovers():
    for server in list(_RUNNING):
        server.kill()


def _default_server():
    if os.environ.get("TESSERA_SERVER"):
        return os.environ["TESSERA_SERVER"]
    candidates = glob.glob(os.path.join(REPO_ROOT, "build*", "bin", "tessera-server"))
    return max(candidates, key=os.path.getmtime) if candidates else None


def parse_binaries(*names):
    """Parses a required --NAME PATH for each of `names` from the command line; returns (the
    absolute paths in `names`' order, the remaining arguments). Exits 1 naming a path that is not
    an executable."""
    parser = argparse.ArgumentParser(add_help=False)
    for name in names:
        parser.add_argument(f"--{name}", required=True)
    args, rest = parser.parse_known_args()
    paths = [os.path.abspath(getattr(args, name)) for name in names]
    for path in paths:
        if not os.access(path, os.X_OK):
            sys.stderr.write(f"{path} is not an executable\n")
            sys.exit(1)
    return paths, rest


def main():
    """Parses --server, then runs the unittest classes of the calling script."""
    global SERVER_BINARY
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--server", default=None)
    args, rest = parser.parse_known_args()
    SERVER_BINARY = args.server or _default_server()
    if not SERVER_BINARY or not os.access(SERVER_BINARY, os.X_OK):
        sys.stderr.write(f"tessera-server binary not found ({SERVER_BINARY!r}); pass --server\n")
        sys.exit(1)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


class Server:
    """One tessera-server process on loopback with its own data dir (work_dir/data unless given)
    and its logs in work_dir (server-<n>.log for the n-th start; a temporary directory, which
    cleanup() removes, unless given). Ports are chosen by the server (--listen 127.0.0.1:0) and
    read from its `tessera-server listening on HOST:PORT (metrics on port P)` line, so tests never
    race for a port. `stop()` sends SIGTERM and returns the exit code; `kill()` sends SIGKILL;
    `start()` again reopens the same data dir. threads=None leaves --threads to the server;
    metrics=False serves no metrics port; wait_healthy=False returns from start() once the
    server listens, without a health call (which a server with API keys would refuse)."""

    def __init__(self, *extra_args, data_dir=None, threads=2, client_options=None, binary=None,
                 work_dir=None, metrics=True, wait_healthy=True, client_class=None):
        self.binary = binary or SERVER_BINARY or _default_server()
        self._own_work_dir = work_dir is None
        self.work_dir = work_dir or tempfile.mkdtemp(prefix="tessera-e2e-")
        self.data_dir = data_dir or os.path.join(self.work_dir, "data")
        self.extra_args = [str(a) for a in extra_args]
        self.threads = threads
        self._serve_metrics = metrics  # not self.metrics: that is the method that scrapes it
        self.client_options = dict(client_options or {})  # e.g. TLS settings for every client
        self.client_class = client_class or tessera.Client
        self._wait_healthy = wait_healthy
        self.process = None
        self.address = None
        self.metrics_port = None
        self.http_port = None  # with --http_listen: the REST port
        self.started_at = None  # time.monotonic() of the last start
        self.starts = 0
        self._log_path = None

    # Process control ---------------------------------------------------------------------------

    def start(self, timeout=60.0, retried=False):
        assert self.process is None, "already running"
        self.starts += 1
        self._log_path = os.path.join(self.work_dir, f"server-{self.starts}.log")
        log = open(self._log_path, "wb")
        command = [self.binary, "--data_dir", self.data_dir, "--listen", "127.0.0.1:0",
                   "--metrics_listen", "127.0.0.1:0" if self._serve_metrics else ""]
        if self.threads is not None:
            command += ["--threads", str(self.threads)]
        command += self.extra_args
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        self.started_at = time.monotonic()
        _RUNNING.add(self)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            match = _LISTENING.search(self.log())
            if match:
                break
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                if code in (-signal.SIGTERM, -signal.SIGKILL) and not retried:
                    # Killed from outside before it could even block signals (e.g. someone's
                    # `pkill tessera-server` on a shared machine): not the server's fault.
                    sys.stderr.write(f"tessera-server killed by signal {-code} while starting; "
                                     "retrying once\n")
                    return self.start(timeout, retried=True)
                raise AssertionError(f"tessera-server exited with {code} before listening:\n"
                                     f"{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"tessera-server not listening after {timeout}s:\n"
                                     f"{self.log()[-4000:]}")
            time.sleep(0.05)
        self.address = f"{match.group(1)}:{match.group(2)}"
        self.metrics_port = int(match.group(3)) if match.group(3) else None
        self.http_port = int(match.group(4)) if match.group(4) else None
        if self._wait_healthy:
            self.wait_healthy(deadline - time.monotonic())
        return self

    def wait_healthy(self, timeout=30.0):
        deadline = time.monotonic() + max(timeout, 1.0)
        with self.client() as client:
            while True:
                try:
                    if client.health(timeout=2.0) == "SERVING":
                        return
                except tessera.TesseraError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"tessera-server not SERVING:\n{self.log()[-4000:]}")
                time.sleep(0.05)

    def stop(self, timeout=60.0):
        """SIGTERM, wait for exit; returns the exit code."""
        if self.process is None:
            return None
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            code = "timeout"
        self.process = None
        _RUNNING.discard(self)
        return code

    def kill(self):
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
        _RUNNING.discard(self)

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def restart(self):
        code = self.stop()
        if code != 0:
            raise AssertionError(f"tessera-server exited with {code} on SIGTERM:\n"
                                 f"{self.log()[-4000:]}")
        return self.start()

    def cleanup(self):
        self.kill()
        if self._own_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    @contextlib.contextmanager
    def running(self):
        """Starts the server for a `with` block; on leaving it, stops it (SIGTERM) and removes its
        work directory, then raises RuntimeError if it exited with other than 0 (an exception of
        the block itself propagates instead)."""
        self.start()
        try:
            yield self
        finally:
            code = self.stop()
            self.cleanup()
        if code != 0:
            raise RuntimeError(f"tessera-server exited with {code}")

    # Observation -------------------------------------------------------------------------------

    def log(self):
        if not self._log_path or not os.path.exists(self._log_path):
            return ""
        with open(self._log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def client(self, **kwargs):
        """A client of this server with `client_options` (`client_class`, default tessera.Client,
        makes it: async_client_test runs the same scenarios through tessera.AsyncClient)."""
        return self.client_class(self.address, **{**self.client_options, **kwargs})

    def healthz(self):
        """(HTTP status, body) of GET /healthz on the metrics port."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/healthz",
                                    timeout=5) as response:
            return response.status, response.read().decode()

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=5) as response:
            return response.read().decode()

    def assert_healthy(self, testcase):
        testcase.assertIsNotNone(self.process, "server not running")
        testcase.assertIsNone(self.process.poll(), f"server died:\n{self.log()[-4000:]}")
        with self.client() as client:
            testcase.assertEqual(client.health(), "SERVING")
        if self.metrics_port:
            status, body = self.healthz()
            testcase.assertEqual(status, 200)


class ServerTestCase(unittest.TestCase):
    """Starts one server for the class (`server_args` are extra flags; `client_options` the
    settings of every client it makes, e.g. an API key) and stops it at the end, asserting that
    SIGTERM makes it exit 0."""

    server_args = ()
    client_options = {}
    client_class = None  # tessera.Client
    server = None

    @classmethod
    def setUpClass(cls):
        server = Server(*cls.server_args, client_options=cls.client_options,
                        client_class=cls.client_class)
        # Class cleanups run even when a subclass's setUpClass fails after this point.
        cls.addClassCleanup(cls._stop_server, server)
        cls.server = server.start()

    @staticmethod
    def _stop_server(server):
        try:
            code = server.stop()
            if code not in (0, None):
                raise AssertionError(f"tessera-server exited with {code} on SIGTERM:\n"
                                     f"{server.log()[-4000:]}")
        finally:
            server.cleanup()

    def assertCode(self, context, code, *fragments):
        """Checks a TesseraError (from assertRaises) or a DocumentResult: its code and that its
        message names each fragment (case-insensitive)."""
        error = context.exception if hasattr(context, "exception") else context
        if isinstance(error, tessera.DocumentResult):
            self.assertEqual(error.status, code, f"{error}")
        else:
            self.assertEqual(error.code, code, f"{error}")
        for fragment in fragments:
            self.assertIn(str(fragment).lower(), error.message.lower(),
                          f"message {error.message!r} does not name {fragment!r}")


# Data and the brute-force reference ------------------------------------------------------------

def normalized(rng, rows, dim):
    values = rng.standard_normal((rows, dim)).astype(np.float32)
    return values / np.linalg.norm(values, axis=1, keepdims=True)


def query_near(rng, tokens, n_query, noise=0.3):
    """A query of n_query tokens, each near a random token of `tokens` (so that document wins)."""
    picks = rng.integers(0, tokens.shape[0], size=n_query)
    query = tokens[picks].astype(np.float32) + noise * normalized(rng, n_query, tokens.shape[1])
    return (query / np.linalg.norm(query, axis=1, keepdims=True)).astype(np.float32)


def maxsim(query, vectors):
    """Σ_i max_j ⟨q_i, d_j⟩ in float64."""
    return float((query.astype(np.float64) @ vectors.astype(np.float64).T).max(axis=1).sum())


def brute_force(query, stored, k=None):
    """[(id, score)] best first, ties by ascending id, over {id: rerank vectors}."""
    scored = sorted(((-maxsim(query, vectors), doc_id) for doc_id, vectors in stored.items()))
    scored = [(doc_id, -negative) for negative, doc_id in scored]
    return scored if k is None else scored[:k]


def assert_matches_reference(testcase, hits, reference, k=None, tolerance=1e-4):
    """The server's hits equal the top k of the full reference ranking `reference` (from
    brute_force over every candidate document): same length, same ids in the same order (where
    two reference scores are within `tolerance`, either order is accepted), each score within
    `tolerance` of the reference score of that id."""
    k = len(reference) if k is None else min(k, len(reference))
    reference_score = dict(reference)
    testcase.assertEqual(len(hits), k, "number of hits")
    for rank, (hit, (ref_id, ref_score)) in enumerate(zip(hits, reference[:k])):
        testcase.assertIn(hit.id, reference_score, f"rank {rank}: unexpected id {hit.id}")
        testcase.assertAlmostEqual(hit.score, reference_score[hit.id], delta=tolerance,
                                   msg=f"rank {rank}: score of {hit.id}")
        if hit.id != ref_id:
            testcase.assertAlmostEqual(reference_score[hit.id], ref_score, delta=tolerance,
                                       msg=f"rank {rank}: {hit.id} instead of {ref_id}")
    testcase.assertEqual(len({hit.id for hit in hits}), len(hits), "duplicate ids in hits")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """A single-member etcd (Debian's etcd-server, /usr/bin/etcd) on loopback ports that were free
    a moment before, with its data in a temporary directory. `available()` is False without the
    binary (tests skip)."""

    BINARY = "/usr/bin/etcd"

    @classmethod
    def available(cls):
        return os.access(cls.BINARY, os.X_OK)

    def __init__(self):
        self.work_dir = tempfile.mkdtemp(prefix="tessera-etcd-")
        self.client_port = free_port()
        self.peer_port = free_port()
        self.endpoint = f"127.0.0.1:{self.client_port}"
        self.process = None

    def start(self, timeout=30.0):
        peer = f"http://127.0.0.1:{self.peer_port}"
        client = f"http://{self.endpoint}"
        log = open(os.path.join(self.work_dir, "etcd.log"), "wb")
        self.process = subprocess.Popen(
            [self.BINARY, "--name", "e2e", "--data-dir", os.path.join(self.work_dir, "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"e2e={peer}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=2) as response:
                    if b'"health":"true"' in response.read():
                        return self
            except OSError:
                pass
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"etcd did not start:\n{self.log()[-3000:]}")

    def log(self):
        with open(os.path.join(self.work_dir, "etcd.log"), "rb") as f:
            return f.read().decode("utf-8", "replace")

    def keys(self, prefix):
        """The keys under `prefix`, through etcd's JSON gateway (v3 API)."""
        def b64(text):
            return base64.b64encode(text.encode()).decode()
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        body = json.dumps({"key": b64(prefix), "range_end": b64(end), "keys_only": True}).encode()
        request = urllib.request.Request(f"http://{self.endpoint}/v3/kv/range", data=body,
                                         method="POST")
        with urllib.request.urlopen(request, timeout=5) as response:
            kvs = json.loads(response.read()).get("kvs", [])
        return sorted(base64.b64decode(kv["key"]).decode() for kv in kvs)

    def cleanup(self):
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
        shutil.rmtree(self.work_dir, ignore_errors=True)
