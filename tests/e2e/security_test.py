"""API keys (missing key, unknown key, read key used for a write, write key used for admin calls)
and TLS / mutual TLS against the real tessera-server. Refused calls leave the data unchanged."""

import os
import shutil
import subprocess
import sys
import tempfile
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
            f.write("# e2e keys\nadmin-key admin\nwriter-key read,write\nreader-key read\n")
        cls.server_args = ("--api_keys", keys)
        super().setUpClass()
        cls.admin = cls.server.client(api_key="admin-key")
        cls.writer = cls.server.client(api_key="writer-key")
        cls.reader = cls.server.client(api_key="reader-key")
        cls.anonymous = cls.server.client()
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
        # Health checks need no key (load balancers and orchestrators probe them).
        self.assertEqual(self.anonymous.health(), "SERVING")

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


@unittest.skipIf(shutil.which("openssl") is None, "openssl is needed to make test certificates")
class TlsTest(unittest.TestCase):
    """A throw-away CA signs a server certificate (for 127.0.0.1/localhost) and a client
    certificate; the server runs mutual TLS."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tessera-tls-")
        d = cls.dir
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
                 "-subj", "/CN=tessera-test-ca", cwd=d)
        with open(os.path.join(d, "server.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for name, subject in (("server", "/CN=localhost"), ("client", "/CN=tessera-client")):
            _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
                     subject, cwd=d)
            extra = ["-extfile", "server.ext"] if name == "server" else []
            _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                     "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", *extra, cwd=d)
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


if __name__ == "__main__":
    e2e_util.main()
