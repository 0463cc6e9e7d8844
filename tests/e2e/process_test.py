"""The tessera-server process itself: one server per data dir and per port, flags refused with
precise messages, --version, the build-info metric, and /healthz while the server drains. Each test
starts real servers on loopback ports with temporary data dirs."""

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402


def project_version():
    """VERSION of the project() call in the top-level CMakeLists.txt."""
    with open(os.path.join(e2e_util.REPO_ROOT, "CMakeLists.txt")) as f:
        match = re.search(r"project\(tessera VERSION (\S+)", f.read())
    return match.group(1)


def run_second(args, timeout=60.0):
    """Runs tessera-server with `args` until it exits or logs that it listens (then kills it).
    Returns (exit code or None when it listened, its output)."""
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen([e2e_util.SERVER_BINARY, *args], stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        code = None
        while True:
            code = process.poll()
            log.seek(0)
            output = log.read().decode("utf-8", "replace")
            if code is not None:
                return code, output
            if "tessera-server listening on" in output or time.monotonic() > deadline:
                process.kill()
                process.wait()
                return None, output
            time.sleep(0.05)


def healthz(server):
    """(status, body) of /healthz, a 503 included."""
    try:
        return server.healthz()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


class DataDirLockTest(unittest.TestCase):
    """Two servers on one data dir: the second exits non-zero naming the directory and the first
    one's pid, and touches nothing of it. Before the lock, on an empty dir both served and each
    created its own collections; on a dir with collections the second failed only at RocksDB's
    LOCK, after it had emptied the first one's staging/ and trash/."""

    def test_second_server_on_a_data_dir_is_refused(self):
        rng = np.random.default_rng(5)
        for populated in (False, True):
            with self.subTest(populated=populated):
                first = e2e_util.Server()
                self.addCleanup(first.cleanup)
                first.start()
                if populated:
                    with first.client() as client:
                        client.create_collection("x", dim=8)
                    first.restart()
                data_dir = first.data_dir
                arriving = os.path.join(data_dir, "staging", "arriving")
                dropped = os.path.join(data_dir, "trash", "dropped")
                os.makedirs(arriving)
                os.makedirs(dropped)

                code, output = run_second(["--data_dir", data_dir, "--listen", "127.0.0.1:0",
                                           "--metrics_listen", ""])
                self.assertIsNotNone(code, f"the second server listened:\n{output}")
                self.assertNotEqual(code, 0, output)
                self.assertIn(f"data dir '{data_dir}' is in use by pid {first.process.pid}",
                              output)
                self.assertTrue(os.path.isdir(arriving), "the first server's staging/ emptied")
                self.assertTrue(os.path.isdir(dropped), "the first server's trash/ emptied")

                # The first server goes on; what it acknowledges survives its restart.
                first.assert_healthy(self)
                with first.client() as client:
                    if not populated:
                        client.create_collection("x", dim=8)
                    doc = ("d0", e2e_util.normalized(rng, 4, 8))
                    self.assertTrue(all(r.ok for r in client.upsert("x", [doc])))
                first.restart()
                with first.client() as client:
                    self.assertEqual(client.list_collections(), ["x"])
                    self.assertEqual(client.collection_info("x")["stats"]["documents"], 1)
                    self.assertEqual(client.collection_info("x")["schema"]["dim"], 8)
                self.assertEqual(first.stop(), 0)
                # Once the first has exited (SIGKILL too: the kernel drops the lock), it opens.
                code, output = run_second(["--data_dir", data_dir, "--listen", "127.0.0.1:0",
                                           "--metrics_listen", ""])
                self.assertIsNone(code, f"exited {code} after the first server stopped:\n{output}")


class PortTest(unittest.TestCase):
    """A second server on a port in use refuses to start, naming the address, in each role. Before
    the fix gRPC's default SO_REUSEPORT let both listen and split the calls between them."""

    def setUp(self):
        self.first = e2e_util.Server()
        self.addCleanup(self.first.cleanup)
        self.first.start()
        self.address = self.first.address
        self.work_dir = tempfile.mkdtemp(prefix="tessera-e2e-port-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", self.work_dir]))

    def assert_refused(self, *role_flags):
        code, output = run_second(["--data_dir", os.path.join(self.work_dir, "data"),
                                   "--listen", self.address, "--metrics_listen", "",
                                   *role_flags])
        self.assertIsNotNone(code, f"the second server listened on {self.address}:\n{output}")
        self.assertNotEqual(code, 0, output)
        self.assertNotIn('"serving"', output)
        self.assertIn(f"cannot listen on {self.address}", output)
        self.first.assert_healthy(self)

    def test_standalone(self):
        self.assert_refused()

    def test_shard(self):
        # A shard node listens before it registers in etcd: no etcd is needed to get this far.
        self.assert_refused("--role", "shard", "--node_id", "n2", "--etcd", "127.0.0.1:1")

    @unittest.skipUnless(e2e_util.Etcd.available(), "needs /usr/bin/etcd")
    def test_router(self):
        etcd = e2e_util.Etcd()
        self.addCleanup(etcd.cleanup)
        etcd.start()
        self.assert_refused("--role", "router", "--etcd", etcd.endpoint)


class FlagsTest(unittest.TestCase):
    """Flags the issue found answered misleadingly, now refused (exit 2) naming flag, value and
    what is expected; --version prints the project's version and exits 0."""

    def run_server(self, *args, cwd=None):
        """(exit code, stdout, stderr); a server that starts is stopped after 10 s (code None)."""
        try:
            result = subprocess.run([os.path.abspath(e2e_util.SERVER_BINARY), *args],
                                    capture_output=True, text=True, timeout=10,
                                    stdin=subprocess.DEVNULL, cwd=cwd)
        except subprocess.TimeoutExpired as expired:
            return None, expired.stdout, expired.stderr
        return result.returncode, result.stdout, result.stderr

    def test_version(self):
        code, out, err = self.run_server("--version")
        self.assertEqual(code, 0, err)
        self.assertRegex(out, rf"^tessera-server {re.escape(project_version())}( \(git \S+\))?\n$")

    def test_refused_flags(self):
        with tempfile.TemporaryDirectory() as work_dir:
            missing = os.path.join(work_dir, "nope.yaml")
            cases = [
                (["--data_dir", "", "--listen", "127.0.0.1:0", "--metrics_listen", ""],
                 "--data_dir '', expected a directory"),
                (["--listen", "notanaddress"],
                 "--listen 'notanaddress', expected HOST:PORT with a port 0-65535"),
                (["--config", missing],
                 f"--config '{missing}': cannot read it: No such file or directory"),
            ]
            for args, message in cases:
                with self.subTest(args=args):
                    code, out, err = self.run_server(*args, cwd=work_dir)
                    self.assertEqual(code, 2, err)
                    self.assertIn(message, err)
                    self.assertNotIn("other machines", err)
            # Nothing was created in the working directory, where an empty --data_dir put the
            # data.
            self.assertEqual(os.listdir(work_dir), [])


class BuildInfoTest(e2e_util.ServerTestCase):
    """tessera_build_info: the version as a label, value 1, with its # HELP and # TYPE."""

    def test_build_info_metric(self):
        # (Server.metrics is the flag that the metrics port is on, not the method.)
        url = f"http://127.0.0.1:{self.server.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            metrics = response.read().decode()
        self.assertIn("# HELP tessera_build_info ", metrics)
        self.assertIn("# TYPE tessera_build_info gauge\n", metrics)
        self.assertRegex(
            metrics, rf'(?m)^tessera_build_info\{{version="{re.escape(project_version())}",'
                     r'revision="[A-Za-z0-9._+-]*"\} 1$')


class DrainingHealthTest(unittest.TestCase):
    """While SIGTERM drains the server (an Upsert stream is still open), /healthz answers 503 as
    gRPC health answers NOT_SERVING; before, it answered 200 "ok" until the process exited."""

    def test_healthz_is_503_while_draining(self):
        server = e2e_util.Server("--shutdown_grace_seconds", "60")
        self.addCleanup(server.cleanup)
        server.start()
        self.assertEqual(healthz(server), (200, "ok\n"))
        rng = np.random.default_rng(3)
        release = threading.Event()
        with server.client() as client:
            client.create_collection("c", dim=8)

            def batches():
                yield [("d0", e2e_util.normalized(rng, 4, 8))]
                release.wait(120)  # the stream stays open until the test releases it

            stream = client.upsert_stream("c", batches())
            try:
                self.assertTrue(all(r.ok for r in next(stream)))
                server.process.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + 30
                status = healthz(server)
                while status[0] == 200 and time.monotonic() < deadline:
                    time.sleep(0.05)
                    status = healthz(server)
                self.assertEqual(status, (503, "draining\n"), server.log()[-2000:])
                # More stop signals while draining change nothing (a second SIGTERM once reached
                # a library thread that did not block it, and the default action killed the
                # process with signal 15).
                for repeated in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
                    server.process.send_signal(repeated)
                time.sleep(0.5)
                self.assertTrue(server.alive(), "exited while a call was open")
                with server.client() as other:
                    self.assertEqual(other.health(), "NOT_SERVING")
            finally:
                release.set()
            self.assertEqual(list(stream), [])  # the open call finishes normally
        # The first SIGTERM above is enough: the server exits 0 once the call has finished.
        self.assertEqual(server.process.wait(60), 0, server.log()[-2000:])
        server.process = None


if __name__ == "__main__":
    e2e_util.main()
