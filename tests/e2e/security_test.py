"""API keys (missing key, unknown key, read key used for a write, write key used for admin calls,
on every method the server exports: health, reflection and the internal shard service included),
TLS / mutual TLS, and the refusal to serve plaintext beyond loopback, against the real
tessera-server. Refused calls leave the data unchanged."""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402
from e2e_util import grpc, tessera  # noqa: E402

DIM = 16
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED


class ApiKeyTest(e2e_util.ServerTestCase):

    @classmethod
    def setUpClass(cls):
        cls.keys_dir = tempfile.mkdtemp(prefix="tessera-keys-")
        keys = os.path.join(cls.keys_dir, "api_keys")
        with open(keys, "w") as f:
            f.write("# e2e keys, stored hashed\n")
            for key, scopes in (("admin-key", "admin"), ("writer-key", "read,write"),
                                ("reader-key", "read")):
                f.write(f"sha256:{hashlib.sha256(key.encode()).hexdigest()} {scopes}"
                        f" name={key.split('-')[0]}\n")
        cls.server_args = ("--api_keys", keys)
        cls.client_options = {"api_key": "admin-key"}  # the harness's own health checks
        super().setUpClass()
        cls.admin = cls.server.client(api_key="admin-key")
        cls.writer = cls.server.client(api_key="writer-key")
        cls.reader = cls.server.client(api_key="reader-key")
        cls.anonymous = cls.server.client(api_key=None)
        cls.stranger = cls.server.client(api_key="not-a-key")
        cls.rng = np.random.default_rng(4)
        cls.admin.create_collection("secure", dim=DIM)
        docs = [(f"d{i}", e2e_util.normalized(cls.rng, 12, DIM)) for i in range(20)]
        assert all(r.ok for r in cls.writer.upsert("secure", docs))
        cls.query = e2e_util.normalized(cls.rng, 3, DIM)
        cls.before = cls.state()

    @classmethod
    def tearDownClass(cls):
        for client in (cls.admin, cls.writer, cls.reader, cls.anonymous, cls.stranger):
            client.close()
        super().tearDownClass()
        shutil.rmtree(cls.keys_dir, ignore_errors=True)

    @classmethod
    def state(cls):
        hits = cls.admin.search("secure", cls.query, k=20, exhaustive=True)
        return (cls.admin.list_collections(),
                cls.admin.collection_info("secure")["stats"]["documents"],
                [(h.id, h.version) for h in hits])

    def tearDown(self):
        self.server.assert_healthy(self)
        self.assertEqual(self.state(), self.before, "stored data changed")

    def calls(self, client):
        tokens = e2e_util.normalized(self.rng, 12, DIM)
        return {
            "list": (lambda: client.list_collections(), "read"),
            "info": (lambda: client.collection_info("secure"), "read"),
            "search": (lambda: client.search("secure", self.query), "read"),
            "get": (lambda: client.get("secure", "d1"), "read"),
            "upsert": (lambda: client.upsert("secure", [("d1", tokens)]), "write"),
            "delete": (lambda: client.delete("secure", ["d2"]), "write"),
            "flush": (lambda: client.flush("secure"), "write"),
            "create": (lambda: client.create_collection("other", dim=DIM), "admin"),
            "drop": (lambda: client.drop_collection("secure"), "admin"),
        }

    def test_missing_api_key(self):
        for what, (call, _) in self.calls(self.anonymous).items():
            with self.subTest(what), self.assertRaises(tessera.TesseraError) as context:
                call()
            self.assertCode(context, UNAUTHENTICATED, "authorization", "Bearer")
        # gRPC health needs a key too; orchestrators probe HTTP /healthz on the metrics port.
        with self.assertRaises(tessera.TesseraError) as context:
            self.anonymous.health()
        self.assertCode(context, UNAUTHENTICATED, "authorization")
        self.assertEqual(self.server.healthz(), (200, "ok\n"))
        self.assertEqual(self.reader.health(), "SERVING")

    def test_unknown_api_key(self):
        for what, (call, _) in self.calls(self.stranger).items():
            with self.subTest(what), self.assertRaises(tessera.TesseraError) as context:
                call()
            self.assertCode(context, UNAUTHENTICATED, "unknown API key")

    def test_read_key_used_for_a_write(self):
        for what, (call, needs) in self.calls(self.reader).items():
            with self.subTest(what):
                if needs == "read":
                    call()
                    continue
                with self.assertRaises(tessera.TesseraError) as context:
                    call()
                self.assertCode(context, PERMISSION_DENIED, "'read'", f"'{needs}'")

    def test_write_key_used_for_admin_calls(self):
        for what, (call, needs) in self.calls(self.writer).items():
            if needs != "admin":
                continue
            with self.subTest(what), self.assertRaises(tessera.TesseraError) as context:
                call()
            self.assertCode(context, PERMISSION_DENIED, "'write'", "'admin'")

    def raw_calls(self, api_key):
        """Every exported method outside the public API, called with raw bytes: (name, call,
        scope it needs). Reflection lists the services; the shard service is not served by a
        standalone server, so an authorised call reaches UNIMPLEMENTED."""
        channel = grpc.insecure_channel(self.server.address)
        self.addCleanup(channel.close)
        metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        list_services = b"\x3a\x00"  # ServerReflectionRequest{list_services: ""}

        def reflection(version):
            method = f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"
            stream = channel.stream_stream(method)
            return lambda: b"".join(stream(iter([list_services]), metadata=metadata, timeout=10))

        def unary(method):
            return lambda: channel.unary_unary(method)(b"", metadata=metadata, timeout=10)

        return [
            ("health", unary("/grpc.health.v1.Health/Check"), "read"),
            ("reflection", reflection("v1alpha"), "read"),
            ("shard info", unary("/tessera.v1.ShardService/Info"), "admin"),
            ("shard search", unary("/tessera.v1.ShardService/Search"), "admin"),
            ("unknown method", unary("/tessera.v1.Nothing/Here"), "admin"),
        ]

    def test_every_exported_method_checks_the_key(self):
        rank = {"read": 1, "write": 2, "admin": 3}
        for key, scope in ((None, None), ("not-a-key", None), ("reader-key", "read"),
                           ("writer-key", "write"), ("admin-key", "admin")):
            for what, call, needs in self.raw_calls(key):
                with self.subTest(key=key, method=what):
                    if scope is None:
                        with self.assertRaises(grpc.RpcError) as context:
                            call()
                        self.assertEqual(context.exception.code(), UNAUTHENTICATED)
                    elif rank[scope] < rank[needs]:
                        with self.assertRaises(grpc.RpcError) as context:
                            call()
                        self.assertEqual(context.exception.code(), PERMISSION_DENIED)
                        self.assertIn(f"needs '{needs}'", context.exception.details())
                    elif what == "reflection":
                        self.assertIn(b"tessera.v1.QueryService", call())
                    elif what == "health":
                        self.assertEqual(call(), b"\x08\x01")  # SERVING
                    else:
                        with self.assertRaises(grpc.RpcError) as context:
                            call()
                        self.assertEqual(context.exception.code(),
                                         grpc.StatusCode.UNIMPLEMENTED)

    def test_keys_with_enough_scope_work(self):
        # A write key writes (and an admin key can do everything) — in a scratch collection.
        self.admin.create_collection("scratch", dim=DIM)
        [result] = self.writer.upsert("scratch", [("w", e2e_util.normalized(self.rng, 5, DIM))])
        self.assertTrue(result.ok, result)
        self.assertEqual(self.reader.get("scratch", "w")["version"], 1)
        self.assertEqual(self.writer.delete("scratch", ["w"]), [True])
        self.admin.flush("scratch")
        self.admin.drop_collection("scratch")


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def _make_certificates(d, ca, leaves):
    """A throw-away CA `ca` (d/ca.pem, d/ca.key) signing a certificate d/NAME.pem with its key
    d/NAME.key for each (NAME, subject) of `leaves`; the one named "server" is for 127.0.0.1 and
    localhost."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", f"/CN={ca}", cwd=d)
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, subject in leaves:
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
                 cwd=d)
        extra = ["-extfile", "server.ext"] if name == "server" else []
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", *extra, cwd=d)


@unittest.skipIf(shutil.which("openssl") is None, "openssl is needed to make test certificates")
class TlsTest(unittest.TestCase):
    """A throw-away CA signs a server certificate (for 127.0.0.1/localhost) and a client
    certificate; the server runs mutual TLS."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tessera-tls-")
        d = cls.dir
        _make_certificates(d, "tessera-test-ca",
                           [("server", "/CN=localhost"), ("client", "/CN=tessera-client")])
        path = lambda name: os.path.join(d, name)  # noqa: E731
        cls.ca, cls.cert, cls.key = path("ca.pem"), path("client.pem"), path("client.key")
        cls.server = e2e_util.Server(
            "--tls_cert", path("server.pem"), "--tls_key", path("server.key"),
            "--tls_client_ca", path("ca.pem"),
            client_options=dict(tls_root_cert=cls.ca, tls_client_cert=cls.cert,
                                tls_client_key=cls.key))
        try:
            cls.server.start()
        except Exception:
            cls.server.cleanup()
            shutil.rmtree(cls.dir, ignore_errors=True)
            raise

    @classmethod
    def client(cls, **overrides):
        return cls.server.client(timeout=10, **overrides)

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop()
        cls.server.cleanup()
        shutil.rmtree(cls.dir, ignore_errors=True)
        if code != 0:
            raise AssertionError(f"tessera-server exited with {code} on SIGTERM")

    def test_mutual_tls(self):
        with self.client() as client:
            client.create_collection("tls", dim=8)
            rng = np.random.default_rng(0)
            [result] = client.upsert("tls", [("a", e2e_util.normalized(rng, 4, 8))])
            self.assertTrue(result.ok)
            self.assertEqual(client.search("tls", e2e_util.normalized(rng, 2, 8), k=1)[0].id,
                             "a")

    def test_client_without_certificate_is_refused(self):
        with self.client(tls_client_cert=None, tls_client_key=None) as client:
            with self.assertRaises(tessera.TesseraError) as context:
                client.list_collections()
            self.assertEqual(context.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_plaintext_client_is_refused(self):
        with tessera.Client(self.server.address, timeout=5) as client:
            with self.assertRaises(tessera.TesseraError) as context:
                client.list_collections()
            self.assertEqual(context.exception.code, grpc.StatusCode.UNAVAILABLE)


@unittest.skipIf(shutil.which("openssl") is None, "openssl is needed to make test certificates")
class TlsReloadTest(unittest.TestCase):
    """A renewed certificate applies to new connections without a restart (--tls_reload_seconds):
    the server's certificate and key are replaced by ones a second CA signed; within a few
    reloads new clients that trust the second CA connect and those that trust only the first are
    refused. A file that holds no PEM certificate stops the server at start, naming the flag."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tessera-tls-reload-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.first, self.second = (os.path.join(self.dir, n) for n in ("first", "second"))
        for d, ca in ((self.first, "tessera-first-ca"), (self.second, "tessera-second-ca")):
            os.mkdir(d)
            _make_certificates(d, ca, [("server", "/CN=localhost")])
        self.live = os.path.join(self.dir, "live")
        os.mkdir(self.live)
        for name in ("server.pem", "server.key"):
            shutil.copy(os.path.join(self.first, name), os.path.join(self.live, name))

    def answers(self, server, ca):
        """Whether a new client trusting only `ca` gets an answer from `server`."""
        with tessera.Client(server.address, timeout=5, tls_root_cert=ca) as client:
            try:
                client.list_collections()
                return True
            except tessera.TesseraError as error:
                self.assertEqual(error.code, grpc.StatusCode.UNAVAILABLE, str(error))
                return False

    def test_renewed_certificate_applies_without_restart(self):
        server = e2e_util.Server(
            "--tls_cert", os.path.join(self.live, "server.pem"),
            "--tls_key", os.path.join(self.live, "server.key"), "--tls_reload_seconds", "1",
            client_options=dict(tls_root_cert=os.path.join(self.first, "ca.pem")))
        self.addCleanup(server.cleanup)
        server.start()
        first_ca, second_ca = (os.path.join(d, "ca.pem") for d in (self.first, self.second))
        self.assertTrue(self.answers(server, first_ca))
        self.assertFalse(self.answers(server, second_ca))
        # Renewed as a certificate manager does it: each file replaced whole.
        for name in ("server.key", "server.pem"):
            staged = os.path.join(self.live, name + ".new")
            shutil.copy(os.path.join(self.second, name), staged)
            os.replace(staged, os.path.join(self.live, name))
        deadline = time.monotonic() + 15
        while not self.answers(server, second_ca):
            self.assertLess(time.monotonic(), deadline, server.log()[-3000:])
            time.sleep(0.5)
        self.assertFalse(self.answers(server, first_ca))
        self.assertEqual(server.stop(), 0)

    def test_a_file_without_a_certificate_stops_the_server_at_start(self):
        not_pem = os.path.join(self.dir, "not.pem")
        with open(not_pem, "w") as f:
            f.write("not a certificate\n")
        server = e2e_util.Server("--tls_cert", not_pem,
                                 "--tls_key", os.path.join(self.live, "server.key"))
        self.addCleanup(server.cleanup)
        with self.assertRaises(AssertionError):
            server.start(timeout=30)
        self.assertIn(f"--tls_cert {not_pem}: no PEM block", server.log())


class PlaintextBeyondLoopbackTest(unittest.TestCase):
    """A listener other machines can reach serves TLS unless --insecure says otherwise."""

    def run_server(self, *args):
        with tempfile.TemporaryDirectory(prefix="tessera-listen-") as d:
            return subprocess.run(
                [e2e_util.SERVER_BINARY or e2e_util._default_server(), "--data_dir", d,
                 "--metrics_listen", "", "--listen", "0.0.0.0:0", *args],
                capture_output=True, text=True, timeout=30)

    def test_refuses_to_start_without_tls_or_insecure(self):
        result = self.run_server()
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("--listen 0.0.0.0:0 accepts connections from other machines: serve TLS",
                      result.stderr)
        self.assertIn("--insecure", result.stderr)


if __name__ == "__main__":
    e2e_util.main()
