"""REST/JSON beside gRPC (--http_listen) against the real tessera-server, driven with Python
`requests` and `curl`: the lifecycle's answers equal gRPC's (ids, order, scores, stored vectors),
errors carry the HTTP status Google's API design guide gives their gRPC code and the body
{"error": {code, message, status, details}}, API keys and (mutual) TLS hold, the OpenAPI document
validates (openapi-spec-validator from PyPI, in the venv scripts/setup makes) and every route in it
answers, the curl examples of docs/clients/rest.md run as written, and every case of
bad_input_test.py is replayed through REST (its client's stubs swapped for REST calls built from
/openapi.json) with the same status and message."""

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import urllib.parse

import numpy as np
import requests
from google.protobuf import json_format, symbol_database

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bad_input_test  # noqa: E402
import e2e_util  # noqa: E402
import security_test  # noqa: E402
from e2e_util import grpc, tessera  # noqa: E402

DIM = 16
VALIDATOR_VENV = os.environ.get("TESSERA_TOOLS_VENV",
                                os.path.expanduser("~/.cache/tessera-tools/venv"))
# Google's API design guide (google/rpc/code.proto): the HTTP status of each gRPC code.
HTTP_STATUS = {
    "OK": 200, "CANCELLED": 499, "UNKNOWN": 500, "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504, "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "PERMISSION_DENIED": 403,
    "UNAUTHENTICATED": 401, "RESOURCE_EXHAUSTED": 429, "FAILED_PRECONDITION": 400,
    "ABORTED": 409, "OUT_OF_RANGE": 400, "UNIMPLEMENTED": 501, "INTERNAL": 500,
    "UNAVAILABLE": 503, "DATA_LOSS": 500,
}


# JSON ⇄ messages as the gateway maps them: proto JSON, ids (bytes fields id/ids) as text -------

def _walk_ids(value, descriptor, convert):
    if not isinstance(value, dict):
        return
    for key, item in value.items():
        field = next((f for f in descriptor.fields if key in (f.json_name, f.name)), None)
        if field is None or (field.message_type is not None
                             and field.message_type.GetOptions().map_entry):
            continue
        if field.type == field.TYPE_BYTES and field.name in ("id", "ids"):
            value[key] = [convert(i) for i in item] if isinstance(item, list) else convert(item)
        elif field.message_type is not None:
            for element in item if isinstance(item, list) else [item]:
                _walk_ids(element, field.message_type, convert)


def to_rest(message):
    body = json_format.MessageToDict(message)
    _walk_ids(body, message.DESCRIPTOR,
              lambda b64: base64.b64decode(b64).decode("utf-8", "surrogateescape"))
    return body


def from_rest(body, message_class):
    _walk_ids(body, message_class.DESCRIPTOR, lambda text: base64.b64encode(
        text.encode("utf-8", "surrogateescape")).decode())
    return json_format.ParseDict(body, message_class())


class RestError(grpc.RpcError):
    """A REST error answer, shaped as a gRPC error for the client's error handling."""

    def __init__(self, http_status, body):
        super().__init__(f"HTTP {http_status}: {body}")
        self.http_status = http_status
        self.body = body
        self._code = grpc.StatusCode[body["error"]["status"]]

    def code(self):
        return self._code

    def details(self):
        return self.body["error"]["message"]


class Rest:
    """requests against one server's REST port."""

    def __init__(self, port, scheme="http", api_key=None, verify=True, cert=None):
        self.base = f"{scheme}://127.0.0.1:{port}"
        self.session = requests.Session()
        self.session.verify = verify
        self.session.cert = cert
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def call(self, verb, path, body=None, timeout=None, data=None, headers=None):
        """The JSON answer of a 200; raises RestError (checking the status ↔ code mapping and
        the error body's fields) for anything else."""
        headers = dict(headers or {})
        if timeout is not None:
            headers["X-Server-Timeout"] = str(timeout)
        # verify= explicitly: a REQUESTS_CA_BUNDLE in the environment would replace the session's.
        response = self.session.request(verb, self.base + path, json=body, data=data,
                                        headers=headers, timeout=120,
                                        verify=self.session.verify)
        if response.status_code == 200:
            return response.json() if response.content else None
        error = response.json()
        assert set(error["error"]) == {"code", "message", "status", "details"}, error
        assert error["error"]["code"] == response.status_code, error
        assert HTTP_STATUS[error["error"]["status"]] == response.status_code, (
            f"{error['error']['status']} answered with HTTP {response.status_code}")
        raise RestError(response.status_code, error)

    def openapi(self):
        return self.session.get(self.base + "/openapi.json", timeout=30).json()


class _RestStub:
    """One gRPC service stub whose calls go through REST: the route of each RPC is read from
    /openapi.json (operationId = the RPC's name)."""

    def __init__(self, rest, operations):
        self._rest = rest
        self._operations = operations

    def _unary(self, name, request, timeout=None, metadata=None):
        # Get by the body's id (the GET route puts it in the URL, too short for 1 MB ids).
        verb, path, response_type = self._operations.get(name + "ByBody", self._operations[name])
        for field in re.findall(r"{(\w+)}", path):
            value = getattr(request, field)
            if isinstance(value, bytes):
                value = value.decode("utf-8", "surrogateescape")
            path = path.replace("{" + field + "}", urllib.parse.quote(value, safe=""))
        body = to_rest(request) if verb == "post" else None
        answer = self._rest.call(verb.upper(), path, body, timeout=timeout)
        return from_rest(answer or {}, symbol_database.Default().GetSymbol(response_type))

    def __getattr__(self, name):
        if name == "Upsert":
            return self._upsert
        return lambda request, timeout=None, metadata=None: self._unary(name, request, timeout)

    def _upsert(self, requests_iterator, timeout=None, metadata=None):
        unary = self._unary

        class Call:
            """Each stream message as its own POST .../documents, answered in order."""

            def __init__(self):
                self._responses = (unary("Upsert", r, timeout) for r in requests_iterator)

            def __iter__(self):
                return self

            def __next__(self):
                return next(self._responses)

            def cancel(self):
                pass

        return Call()


def rest_stubs(rest):
    operations = {}
    for path, item in rest.openapi()["paths"].items():
        for verb, operation in item.items():
            schema = operation["responses"]["200"]["content"]
            ref = next(iter(schema.values()))["schema"].get("$ref", "")
            operations[operation["operationId"]] = (verb, path, ref.rsplit("/", 1)[-1])
    return _RestStub(rest, operations)


# The bad-input table replayed through REST -------------------------------------------------------

bad_input_test.TABLE = None  # the gRPC run writes the table


class RestBadInputTest(bad_input_test.BadInputTest):
    """Every case of bad_input_test.BadInputTest with the client's three stubs going through
    REST; the data set up over gRPC is fingerprinted over REST after each case."""

    server_args = bad_input_test.BadInputTest.server_args + ("--http_listen", "127.0.0.1:0")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        stub = rest_stubs(Rest(cls.server.http_port))
        cls.client.admin_stub = cls.client.ingest_stub = cls.client.query_stub = stub

    def test_long_names_are_cut_short_in_messages(self):
        # A 1 MB name in a URL: HTTP refuses the request line before any route.
        rest = Rest(self.server.http_port)
        with self.assertRaises(RestError) as context:
            rest.call("GET", "/v1/collections/" + "n" * 1_000_000)
        self.assertEqual(context.exception.http_status, 400)
        self.assertEqual(context.exception.details(), "request line: longer than 8192 bytes")

    @unittest.skip("JSON strings are Unicode: REST cannot carry ids that are not UTF-8")
    def test_non_utf8_id(self):
        pass

    @unittest.skip("JSON strings are Unicode: REST cannot carry names that are not UTF-8")
    def test_create_collection_name_not_utf8(self):
        pass

    @unittest.skip("protobuf bytes that do not parse cannot be sent as JSON (JSON errors: "
                   "RestLifecycleTest.test_errors_map_to_http_statuses)")
    def test_request_that_does_not_parse(self):
        pass

    @unittest.skip("protobuf bytes that do not parse cannot be sent as JSON")
    def test_upsert_stream_message_that_does_not_parse(self):
        pass

    @unittest.skip("cancelling a stream halfway is gRPC's; a REST request is one message")
    def test_cancel_upsert_stream_halfway(self):
        pass


# The lifecycle, errors, OpenAPI, curl ------------------------------------------------------------

class RestLifecycleTest(e2e_util.ServerTestCase):
    server_args = ("--http_listen", "127.0.0.1:0", "--max_searches_per_batch", 4)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.rest = Rest(cls.server.http_port)
        cls.grpc = cls.server.client()
        cls.rng = np.random.default_rng(35)

    @classmethod
    def tearDownClass(cls):
        cls.grpc.close()
        super().tearDownClass()

    def test_lifecycle_equals_grpc(self):
        rest, client, rng = self.rest, self.grpc, self.rng
        rest.call("POST", "/v1/collections", {"schema": {"name": "life", "dim": DIM}})
        self.assertIn("life", rest.call("GET", "/v1/collections")["names"])
        docs = {f"doc/{i}": e2e_util.normalized(rng, int(rng.integers(3, 20)), DIM)
                for i in range(60)}
        items = list(docs.items())
        # 20 as nested arrays, 20 as packed base64 (proto JSON), 20 as NDJSON lines.
        answer = rest.call("POST", "/v1/collections/life/documents", {"documents": [
            {"id": i, "tokens": t.tolist()} for i, t in items[:20]]})
        self.assertEqual([r["id"] for r in answer["results"]], [i for i, _ in items[:20]])
        self.assertTrue(all(r["code"] == 0 and r["version"] == "1" for r in answer["results"]))
        packed = [to_rest(tessera.encode_document((i, t))) for i, t in items[20:40]]
        answer = rest.call("POST", "/v1/collections/life/documents", {"documents": packed})
        self.assertTrue(all(r["code"] == 0 for r in answer["results"]))
        lines = "".join(json.dumps({"id": i, "tokens": t.tolist()}) + "\n" for i, t in items[40:])
        response = requests.post(f"{rest.base}/v1/collections/life/documents:stream?batch_size=7",
                                 data=lines.encode(), timeout=60)
        self.assertEqual(response.status_code, 200, response.text)
        results = [json.loads(line) for line in response.text.splitlines()]
        self.assertEqual([r["id"] for r in results], [i for i, _ in items[40:]])
        self.assertTrue(all(r["code"] == 0 and r["numVectors"] > 0 for r in results))

        for q in range(3):
            query = e2e_util.query_near(rng, items[q * 7][1], 5)
            for options in ({"k": 8}, {"k": 60, "exhaustive": True}):
                hits = rest.call("POST", "/v1/collections/life:search",
                                 {"query": query.tolist(), **options})["hits"]
                expected = client.search("life", query, **options)
                self.assertEqual([h["id"] for h in hits], expected.ids)
                self.assertEqual([np.float32(h["score"]) for h in hits],
                                 [np.float32(h.score) for h in expected])
                self.assertEqual([int(h["version"]) for h in hits], [h.version for h in expected])
                # The packed form of the same query answers the same.
                packed_query = to_rest(tessera.encode_matrix(query))
                again = rest.call("POST", "/v1/collections/life:search",
                                  {"query": packed_query, **options})["hits"]
                self.assertEqual(again, hits)
        queries = [e2e_util.normalized(rng, 4, DIM) for _ in range(3)]
        batch = rest.call("POST", "/v1/search:batch", {"searches": [
            {"collection": "life", "query": q.tolist(), "k": 5} for q in queries]})
        self.assertEqual([[h["id"] for h in r["hits"]] for r in batch["responses"]],
                         [client.search("life", q, k=5).ids for q in queries])

        stored = rest.call("GET", "/v1/collections/life/documents/" +
                           urllib.parse.quote("doc/3", safe=""))
        expected = client.get("life", "doc/3")
        self.assertEqual(stored["id"], "doc/3")
        self.assertEqual(int(stored["version"]), expected["version"])
        vectors = tessera.decode_matrix(json_format.ParseDict(
            stored["vectors"], tessera.encode_matrix(expected["vectors"]).__class__()))
        np.testing.assert_array_equal(vectors, expected["vectors"])
        info = rest.call("GET", "/v1/collections/life")
        self.assertEqual(int(info["stats"]["documents"]), 60)
        self.assertEqual(int(info["stats"]["documents"]),
                         client.collection_info("life")["stats"]["documents"])
        deleted = rest.call("POST", "/v1/collections/life/documents:delete",
                            {"ids": ["doc/3", "never"]})
        self.assertEqual(deleted["existed"], [True, False])
        with self.assertRaises(RestError) as context:
            rest.call("GET", "/v1/collections/life/documents/doc%2F3")
        self.assertEqual(context.exception.http_status, 404)
        self.assertEqual(rest.call("POST", "/v1/collections/life:flush"), {})
        rest.call("DELETE", "/v1/collections/life")
        self.assertNotIn("life", client.list_collections())

    def test_errors_map_to_http_statuses(self):
        rest = self.rest
        rest.call("POST", "/v1/collections", {"schema": {"name": "errs", "dim": DIM}})
        query = e2e_util.normalized(self.rng, 2, DIM).tolist()
        cases = [
            (404, "NOT_FOUND", "collection 'nope' not found", "GET", "/v1/collections/nope",
             None, {}),
            (409, "ALREADY_EXISTS", "already exists", "POST", "/v1/collections",
             {"schema": {"name": "errs", "dim": 8}}, {}),
            (400, "INVALID_ARGUMENT", "query: cols (dim) 3, expected 16", "POST",
             "/v1/collections/errs:search", {"query": [[1, 2, 3]]}, {}),
            (400, "INVALID_ARGUMENT", "request body: not JSON", "POST",
             "/v1/collections/errs:search", None, {"data": b"{nope"}),
            (400, "INVALID_ARGUMENT", "quer: Cannot find field", "POST",
             "/v1/collections/errs:search", {"quer": query}, {}),
            (400, "INVALID_ARGUMENT", "query: row 1 holds 2 numbers, row 0 holds 16", "POST",
             "/v1/collections/errs:search", {"query": [query[0], [1, 2]]}, {}),
            (400, "INVALID_ARGUMENT", "collection: 'other' in the body, 'errs' in the path",
             "POST", "/v1/collections/errs:search", {"collection": "other", "query": query}, {}),
            (429, "RESOURCE_EXHAUSTED", "exceeds the limit of 4", "POST", "/v1/search:batch",
             {"searches": [{"collection": "errs", "query": query}] * 5}, {}),
            (504, "DEADLINE_EXCEEDED", "Deadline Exceeded", "POST",
             "/v1/collections/errs:search", {"query": query}, {"timeout": -1}),
            (404, "NOT_FOUND", "no route for GET /v2/things", "GET", "/v2/things", None, {}),
        ]
        for http_status, status, fragment, verb, path, body, extra in cases:
            with self.subTest(path=path, status=status):
                with self.assertRaises(RestError) as context:
                    rest.call(verb, path, body, **extra)
                error = context.exception
                self.assertEqual((error.http_status, error.body["error"]["status"]),
                                 (http_status, status), error.body)
                self.assertIn(fragment, error.body["error"]["message"])
        # The NDJSON stream: a line that does not parse gets its own result; a request-level
        # error ends the answer with an error line and the error's status.
        lines = (json.dumps({"id": "ok1", "tokens": query}) + "\nnot json\n" +
                 json.dumps({"id": "ok2", "tokens": query}) + "\n")
        response = requests.post(f"{rest.base}/v1/collections/errs/documents:stream",
                                 data=lines, timeout=30)
        results = [json.loads(line) for line in response.text.splitlines()]
        self.assertEqual(response.status_code, 200)
        self.assertEqual([(r["id"], r["code"]) for r in results], [("ok1", 0), ("", 3), ("ok2", 0)])
        self.assertIn("line 2: not JSON", results[1]["message"])
        response = requests.post(f"{rest.base}/v1/collections/nope/documents:stream", data=lines,
                                 timeout=30)
        self.assertEqual(response.status_code, 404)
        self.assertEqual(json.loads(response.text.splitlines()[-1])["error"]["status"],
                         "NOT_FOUND")
        rest.call("DELETE", "/v1/collections/errs")

    def test_metrics_and_healthz_on_the_http_port(self):
        self.rest.call("GET", "/v1/collections")
        response = requests.get(f"{self.rest.base}/healthz", timeout=10)
        self.assertEqual((response.status_code, response.text), (200, "ok\n"))
        metrics = requests.get(f"{self.rest.base}/metrics", timeout=10).text
        # REST calls are the services' calls: counted under the RPC's name.
        self.assertRegex(metrics, r'tessera_rpc_total\{method="ListCollections",code="OK"\} \d')
        self.assertEqual(metrics.split("\n")[0][:1], "#")

    @unittest.skipUnless(os.access(os.path.join(VALIDATOR_VENV, "bin", "python"), os.X_OK),
                         f"no {VALIDATOR_VENV} (scripts/setup installs openapi-spec-validator)")
    def test_openapi_validates_and_every_route_answers(self):
        document = self.rest.openapi()
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(document, f)
            f.flush()
            check = subprocess.run([os.path.join(VALIDATOR_VENV, "bin", "python"), "-c",
                                    "import sys; from openapi_spec_validator import validate; "
                                    "from openapi_spec_validator.readers import read_from_filename;"
                                    " validate(read_from_filename(sys.argv[1])[0]); print('valid')",
                                    f.name], capture_output=True, text=True, timeout=120)
        self.assertEqual(check.returncode, 0, check.stderr[-3000:])
        self.assertIn("valid", check.stdout)
        self.rest.call("POST", "/v1/collections", {"schema": {"name": "every", "dim": DIM}})
        tokens = e2e_util.normalized(self.rng, 3, DIM).tolist()
        self.rest.call("POST", "/v1/collections/every/documents",
                       {"documents": [{"id": "d", "tokens": tokens}]})
        bodies = {"CreateCollection": {"schema": {"name": "every2", "dim": DIM}},
                  "Upsert": {"documents": [{"id": "d", "tokens": tokens}]},
                  "Delete": {"ids": ["zz"]}, "Search": {"query": tokens},
                  "Count": {}, "Scroll": {"limit": 5},
                  "SearchBatch": {"searches": [{"collection": "every", "query": tokens}]}}
        operations = [(path, verb, op) for path, item in document["paths"].items()
                      for verb, op in item.items()]
        self.assertGreaterEqual(len(operations), 17)
        order = {"delete": 1}  # drops last
        for path, verb, op in sorted(operations, key=lambda o: order.get(o[1], 0)):
            url = path.replace("{name}", "every").replace("{collection}", "every")
            url = url.replace("{id}", "d")
            bodies["GetByBody"] = {"id": "d"}
            name = op["operationId"]
            if name == "UpsertStream":
                data = json.dumps({"id": "d2", "tokens": tokens}) + "\n"
            else:
                data = json.dumps(bodies[name]) if name in bodies else None
            with self.subTest(operation=name):
                response = requests.request(verb.upper(), self.rest.base + url, data=data,
                                            timeout=30)
                self.assertEqual(response.status_code, 200, f"{verb} {url}: {response.text}")
        self.assertNotIn("every", self.grpc.list_collections())
        self.grpc.drop_collection("every2")

    @unittest.skipIf(shutil.which("curl") is None, "curl is needed")
    def test_docs_curl_examples_run(self):
        """Every ```bash block of docs/clients/rest.md, as written, against this server."""
        with open(os.path.join(e2e_util.REPO_ROOT, "docs", "clients", "rest.md")) as f:
            blocks = re.findall(r"```bash\n(.*?)```", f.read(), re.S)
        self.assertGreaterEqual(len(blocks), 3)
        env = dict(os.environ, TESSERA=self.rest.base)
        outputs = []
        for block in blocks:
            run = subprocess.run(["bash", "-euo", "pipefail", "-c", block], env=env,
                                 capture_output=True, text=True, timeout=60)
            self.assertEqual(run.returncode, 0, f"{block}\n{run.stdout}\n{run.stderr}")
            outputs.append(run.stdout)
        text = "".join(outputs)
        self.assertIn('"name":"quickstart"', text)
        hits = [json.loads(line) for line in text.splitlines() if line.startswith('{"hits"')]
        self.assertTrue(hits and hits[0]["hits"][0]["id"] == "doc-1", text)


class RestAuthTest(e2e_util.ServerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.keys_dir = tempfile.mkdtemp(prefix="tessera-keys-")
        keys = os.path.join(cls.keys_dir, "api_keys")
        with open(keys, "w") as f:
            for key, scopes in (("admin-key", "admin"), ("reader-key", "read")):
                f.write(f"sha256:{hashlib.sha256(key.encode()).hexdigest()} {scopes}\n")
        cls.server_args = ("--api_keys", keys, "--http_listen", "127.0.0.1:0")
        cls.client_options = {"api_key": "admin-key"}
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls.keys_dir, ignore_errors=True)

    def test_keys_hold(self):
        port = self.server.http_port
        admin, reader = Rest(port, api_key="admin-key"), Rest(port, api_key="reader-key")
        admin.call("POST", "/v1/collections", {"schema": {"name": "keyed", "dim": DIM}})
        self.assertIn("keyed", reader.call("GET", "/v1/collections")["names"])
        # The api-key header works as the Authorization header does.
        anonymous = Rest(port)
        self.assertIn("keyed", anonymous.call("GET", "/v1/collections",
                                              headers={"api-key": "reader-key"})["names"])
        for rest, verb, path, body, http_status in (
                (anonymous, "GET", "/v1/collections", None, 401),
                (Rest(port, api_key="wrong"), "GET", "/v1/collections", None, 401),
                (reader, "POST", "/v1/collections", {"schema": {"name": "x", "dim": 4}}, 403),
                (reader, "DELETE", "/v1/collections/keyed", None, 403),
                (anonymous, "GET", "/metrics", None, 401)):
            with self.subTest(path=path, http_status=http_status):
                with self.assertRaises(RestError) as context:
                    rest.call(verb, path, body)
                self.assertEqual(context.exception.http_status, http_status)
        self.assertEqual(requests.get(f"{anonymous.base}/healthz", timeout=10).status_code, 200)
        self.assertIn("tessera_rpc_total", reader.session.get(f"{reader.base}/metrics").text)
        self.assertIn("keyed", self.server.client().list_collections())
        admin.call("DELETE", "/v1/collections/keyed")


@unittest.skipIf(shutil.which("openssl") is None, "openssl is needed to make test certificates")
class RestTlsTest(unittest.TestCase):
    """Mutual TLS on the REST port with the gRPC port's files."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tessera-tls-")
        security_test._make_certificates(cls.dir, "tessera-test-ca",
                                         [("server", "/CN=localhost"),
                                          ("client", "/CN=tessera-client")])
        path = lambda name: os.path.join(cls.dir, name)  # noqa: E731
        cls.ca, cls.cert = path("ca.pem"), (path("client.pem"), path("client.key"))
        cls.server = e2e_util.Server(
            "--tls_cert", path("server.pem"), "--tls_key", path("server.key"),
            "--tls_client_ca", path("ca.pem"), "--http_listen", "127.0.0.1:0",
            client_options=dict(tls_root_cert=cls.ca, tls_client_cert=cls.cert[0],
                                tls_client_key=cls.cert[1]))
        try:
            cls.server.start()
        except Exception:
            cls.server.cleanup()
            shutil.rmtree(cls.dir, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop()
        cls.server.cleanup()
        shutil.rmtree(cls.dir, ignore_errors=True)
        if code != 0:
            raise AssertionError(f"tessera-server exited with {code} on SIGTERM")

    def test_mutual_tls(self):
        port = self.server.http_port
        rest = Rest(port, scheme="https", verify=self.ca, cert=self.cert)
        rest.call("POST", "/v1/collections", {"schema": {"name": "tls", "dim": 8}})
        self.assertIn("tls", rest.call("GET", "/v1/collections")["names"])
        curl = subprocess.run(["curl", "-sS", "--cacert", self.ca, "--cert", self.cert[0],
                               "--key", self.cert[1], f"https://127.0.0.1:{port}/v1/collections"],
                              capture_output=True, text=True, timeout=30)
        self.assertIn('"tls"', curl.stdout, curl.stderr)
        with self.assertRaises(requests.exceptions.RequestException):  # no client certificate
            Rest(port, scheme="https", verify=self.ca).call("GET", "/v1/collections")
        with self.assertRaises(requests.exceptions.RequestException):  # plaintext
            Rest(port).call("GET", "/v1/collections")


if __name__ == "__main__":
    e2e_util.main()
