"""Bad input against the real tessera-server: each case gets the right gRPC code (per document in an
Upsert response, or as the call's status) and a message naming the field and the expected value;
afterwards the server is healthy and the stored data is unchanged (checked after every test).
Also: a client that cancels an Upsert stream halfway."""

import os
import queue
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402
from e2e_util import grpc, tessera  # noqa: E402
from tessera.pb import common_pb2, ingest_pb2  # noqa: E402

INVALID = grpc.StatusCode.INVALID_ARGUMENT
DIM = 32


class BadInputTest(e2e_util.ServerTestCase):
    server_args = ("--max_tokens_per_document", 100, "--max_message_bytes", 1 << 20,
                   "--max_k", 50, "--max_num_candidates", 200, "--max_documents_per_batch", 100)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.client = cls.server.client()
        rng = np.random.default_rng(21)
        cls.rng = rng
        cls.client.create_collection("b", dim=DIM, attributes={"year": "int64"})
        cls.client.create_collection("pages", dim=16, spatial={"mode": "tiles", "tile_rows": 2,
                                                               "tile_cols": 2})
        docs = [(f"doc{i}", e2e_util.normalized(rng, int(rng.integers(5, 60)), DIM), None,
                 {"year": 2000 + i}) for i in range(30)]
        pages = [(f"page{i}", e2e_util.normalized(rng, 2 + 16, 16), (4, 4, 1, 1))
                 for i in range(5)]
        assert all(r.ok for r in cls.client.upsert("b", docs))
        assert all(r.ok for r in cls.client.upsert("pages", pages))
        cls.query = e2e_util.normalized(rng, 6, DIM)
        cls.fingerprint_before = cls.fingerprint()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        super().tearDownClass()

    @classmethod
    def fingerprint(cls):
        """What must not change: collections, their stats, an exhaustive ranking, a few docs."""
        c = cls.client
        state = {"collections": sorted(n for n in c.list_collections() if n in ("b", "pages"))}
        for name in ("b", "pages"):
            stats = c.collection_info(name)["stats"]
            state[name] = (stats["documents"], stats["original_tokens"], stats["rerank_vectors"])
        hits = c.search("b", cls.query, k=30, exhaustive=True)
        state["ranking"] = [(h.id, round(h.score, 5), h.version) for h in hits]
        for doc_id in ("doc0", "doc7", "doc29"):
            doc = c.get("b", doc_id)
            state[doc_id] = (doc["version"], doc["num_tokens"], doc["vectors"].tobytes())
        doc = c.get("pages", "page3")
        state["page3"] = (doc["version"], doc["layout"], doc["vectors"].tobytes())
        return state

    def tearDown(self):
        self.server.assert_healthy(self)
        self.assertEqual(self.fingerprint(), self.fingerprint_before, "stored data changed")

    # Helpers -----------------------------------------------------------------------------------

    def tokens(self, n=10, dim=DIM):
        return e2e_util.normalized(self.rng, n, dim)

    def rejected(self, doc, collection="b", code=INVALID, *fragments):
        """Upserts one bad document: it must come back with `code` and name `fragments`, and must
        not be readable afterwards."""
        [result] = self.client.upsert(collection, [doc])
        self.assertFalse(result.ok, f"accepted: {result}")
        self.assertCode(result, code, *fragments)
        self.assertEqual(result.version, 0)
        return result

    def search_error(self, *fragments, code=INVALID, query=None, **options):
        query = self.query if query is None else query
        with self.assertRaises(tessera.TesseraError) as context:
            self.client.search("b", query, **options)
        self.assertCode(context, code, *fragments)

    # Documents ---------------------------------------------------------------------------------

    def test_wrong_dimension(self):
        self.rejected(("wrongdim", self.tokens(10, 16)), "b", INVALID, "wrongdim", "dim", "16",
                      "32")
        self.rejected(("wrongdim", self.tokens(10, 33)), "b", INVALID, "dim", "33", "32")

    def test_nan_and_inf(self):
        for value, label in ((np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")):
            for dtype in (np.float32, np.float16):
                tokens = self.tokens(10).astype(dtype)
                tokens[3, 5] = value
                self.rejected((f"bad-{label}", tokens), "b", INVALID, f"bad-{label}", label,
                              "token 3", "finite")

    def test_zero_tokens(self):
        self.rejected(("empty", np.zeros((0, DIM), np.float32)), "b", INVALID, "empty",
                      "num_tokens 0", "at least 1")

    def test_more_tokens_than_the_limit(self):
        self.rejected(("long", self.tokens(101)), "b", INVALID, "long", "101", "limit of 100")
        # The limit itself is fine (in a scratch collection, so "b" stays unchanged).
        self.client.create_collection("scratch-limit", dim=DIM)
        [ok] = self.client.upsert("scratch-limit", [("at-limit", self.tokens(100))])
        self.assertTrue(ok.ok, ok)
        self.client.drop_collection("scratch-limit")

    def test_bytes_not_a_multiple_of_dim_times_dtype_size(self):
        for dtype, itemsize in ((np.float32, 4), (np.float16, 2)):
            matrix = tessera.encode_matrix(self.tokens(10).astype(dtype))
            matrix.data = matrix.data[:-1]
            expected = 10 * DIM * itemsize
            self.rejected(ingest_pb2.Document(id=b"short", tokens=matrix), "b", INVALID, "short",
                          f"{expected - 1} bytes", f"= {expected}")
            matrix.data = matrix.data + b"\0\0\0"
            self.rejected(ingest_pb2.Document(id=b"long", tokens=matrix), "b", INVALID,
                          f"{expected + 2} bytes", f"= {expected}")

    def test_unknown_dtype(self):
        matrix = tessera.encode_matrix(self.tokens(10))
        matrix.dtype = common_pb2.DTYPE_UNSPECIFIED
        self.rejected(ingest_pb2.Document(id=b"nodtype", tokens=matrix), "b", INVALID, "nodtype",
                      "dtype", "DTYPE_UNSPECIFIED", "DTYPE_FLOAT32 or DTYPE_FLOAT16")
        matrix.dtype = 7  # proto3 enums are open: a value this build does not know
        self.rejected(ingest_pb2.Document(id=b"dtype7", tokens=matrix), "b", INVALID, "dtype7",
                      "dtype 7", "DTYPE_FLOAT32 or DTYPE_FLOAT16")
        query = tessera.encode_matrix(self.query)
        query.dtype = 7
        request = tessera.pb.query_pb2.SearchRequest(collection="b", query=query, k=5)
        with self.assertRaises(grpc.RpcError) as context:
            self.client.query_stub.Search(request)
        self.assertEqual(context.exception.code(), INVALID)
        self.assertIn("dtype 7", context.exception.details())

    def test_message_over_the_size_limit(self):
        # 1 MiB limit: one 8,200-token document of dim 32 is ~1.05 MB on the wire.
        big = ("big", np.ones((8200, DIM), np.float32))
        with self.assertRaises(tessera.TesseraError) as context:
            self.client.upsert("b", [big])
        self.assertCode(context, grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max", "1048576")
        # Many small documents in one request message exceed it too.
        docs = [(f"small{i}", self.tokens(100)) for i in range(90)]  # 90 × 12.8 KB
        with self.assertRaises(tessera.TesseraError) as context:
            self.client.upsert("b", docs, batch_size=90)
        self.assertCode(context, grpc.StatusCode.RESOURCE_EXHAUSTED, "1048576")
        self.search_error("larger than max", "1048576", code=grpc.StatusCode.RESOURCE_EXHAUSTED,
                          query=np.ones((9000, DIM), np.float32))

    def test_too_many_documents_in_one_message(self):
        docs = [(f"many{i}", self.tokens(2)) for i in range(101)]
        with self.assertRaises(tessera.TesseraError) as context:
            self.client.upsert("b", docs, batch_size=101)
        self.assertCode(context, grpc.StatusCode.RESOURCE_EXHAUSTED, "101", "limit of 100")

    def test_empty_and_too_long_ids(self):
        self.rejected(("", self.tokens()), "b", INVALID, "id", "empty")
        self.rejected(("x" * 10240, self.tokens()), "b", INVALID, "id", "10240 bytes",
                      "at most 1024")
        for doc_id in ("", "x" * 10240):
            with self.assertRaises(tessera.TesseraError) as context:
                self.client.get("b", doc_id)
            self.assertIn(context.exception.code, (INVALID, grpc.StatusCode.NOT_FOUND))

    def test_non_utf8_id(self):
        # Python protobuf cannot put invalid UTF-8 into a string field, so each request is
        # serialized with a placeholder id whose bytes are then swapped on the wire (same length).
        placeholder, invalid = "ID\u00e9X", b"ID\xff\xfeX"
        wire = placeholder.encode()
        doc = tessera.encode_document((placeholder, self.tokens()))
        raw = ingest_pb2.UpsertRequest(collection="b", documents=[doc]).SerializeToString()
        self.assertEqual(raw.count(wire), 1)
        raw = raw.replace(wire, invalid)
        upsert = self.client.channel.stream_stream(
            "/tessera.v1.IngestService/Upsert",
            response_deserializer=ingest_pb2.UpsertResponse.FromString)
        with self.subTest("Upsert"):
            try:
                responses = list(upsert(iter([raw]), timeout=10))
                # Expected: one response, rejecting the document with INVALID_ARGUMENT.
                self.assertEqual(len(responses), 1,
                                 "the Upsert stream ended OK without answering its request")
                [result] = responses[0].results
                self.assertEqual(result.code, INVALID.value[0], result)
                self.assertIn("utf-8", result.message.lower())
            except grpc.RpcError as error:  # or: the stream fails with INVALID_ARGUMENT
                self.assertEqual(error.code(), INVALID, error.details())
                self.assertIn("utf-8", error.details().lower())
        with self.subTest("Get"):
            request = ingest_pb2.GetRequest(collection="b")
            request.id = doc.id  # str or bytes, whichever the protocol uses
            raw = request.SerializeToString().replace(wire, invalid)
            get = self.client.channel.unary_unary("/tessera.v1.IngestService/Get")
            with self.assertRaises(grpc.RpcError) as context:
                get(raw, timeout=10)
            self.assertIn(context.exception.code(), (INVALID, grpc.StatusCode.NOT_FOUND),
                          context.exception.details())

    def test_unknown_collection(self):
        calls = {
            "upsert": lambda: self.client.upsert("nope", [("a", self.tokens())]),
            "search": lambda: self.client.search("nope", self.query),
            "get": lambda: self.client.get("nope", "a"),
            "delete": lambda: self.client.delete("nope", ["a"]),
            "drop": lambda: self.client.drop_collection("nope"),
            "info": lambda: self.client.collection_info("nope"),
            "flush": lambda: self.client.flush("nope"),
        }
        for what, call in calls.items():
            with self.subTest(what), self.assertRaises(tessera.TesseraError) as context:
                call()
            self.assertCode(context, grpc.StatusCode.NOT_FOUND, "'nope'")
        self.assertNotIn("nope", self.client.list_collections())

    def test_duplicate_collection(self):
        with self.assertRaises(tessera.TesseraError) as context:
            self.client.create_collection("b", dim=64)
        self.assertCode(context, grpc.StatusCode.ALREADY_EXISTS, "'b'", "already exists")
        self.assertEqual(self.client.collection_info("b")["schema"]["dim"], DIM)

    def test_invalid_schema(self):
        cases = [
            (dict(pool_factor=0), "pool_factor", "0", "1 … 64"),
            (dict(pool_factor=65), "pool_factor", "65", "1 … 64"),
            (dict(dim=0), "dim 0", "1 … 4096"),
            (dict(dim=5000), "dim 5000", "1 … 4096"),
            (dict(name="bad name!"), "bad name!", "[A-Za-z0-9_.-]"),
            (dict(candidates="NotAFactory,Bogus"), "factory", "NotAFactory,Bogus"),
            (dict(candidates="IVF16,PQ7"), "factory", "IVF16,PQ7"),  # 32 % 7 ≠ 0
            (dict(candidates={"kind": "pooled", "pool_factor": 100}), "pool_factor", "100"),
        ]
        for overrides, *fragments in cases:
            settings = {"name": "schema-test", "dim": DIM, **overrides}
            with self.subTest(overrides), self.assertRaises(tessera.TesseraError) as context:
                self.client.create_collection(**settings)
            self.assertCode(context, INVALID, *fragments)
            self.assertNotIn(settings["name"], self.client.list_collections())

    def test_grid_rows_times_cols_not_token_count(self):
        self.rejected(("grid", self.tokens(20, 16), (4, 4, 0, 0)), "pages", INVALID, "grid",
                      "4x4", "16 tokens", "20")
        self.rejected(("grid2", self.tokens(17, 16), (4, 4, 1, 1)), "pages", INVALID, "grid2",
                      "18 tokens", "17")
        self.rejected(("nogrid", self.tokens(16, 16)), "pages", INVALID, "nogrid", "layout",
                      "spatial")

    def test_mixed_batch_rejects_only_the_bad_document(self):
        self.client.create_collection("scratch-mixed", dim=DIM)
        good, bad = ("good", self.tokens()), ("bad", self.tokens(10, 8))
        results = self.client.upsert("scratch-mixed", [good, bad, ("good2", self.tokens())])
        self.assertEqual([r.ok for r in results], [True, False, True])
        self.assertEqual(self.client.collection_info("scratch-mixed")["stats"]["documents"], 2)
        self.client.drop_collection("scratch-mixed")

    # Searches ----------------------------------------------------------------------------------

    def test_k_limits(self):
        # k = 0 in the protocol means the default, 10.
        self.assertEqual(len(self.client.search("b", self.query, k=0)), 10)
        self.assertEqual(len(self.client.search("b", self.query, k=50)), 30)
        self.search_error("k 51", "limit of 50", k=51)
        self.search_error("k 4294967295", "limit of 50", k=2 ** 32 - 1)

    def test_num_candidates_below_k_or_above_limit(self):
        self.search_error("num_candidates 5", "k 10", k=10, num_candidates=5)
        self.search_error("num_candidates 201", "limit of 200", k=10, num_candidates=201)
        self.assertEqual(len(self.client.search("b", self.query, k=10, num_candidates=10)), 10)

    def test_bad_queries(self):
        self.search_error("query", "0 tokens", "at least 1",
                          query=np.zeros((0, DIM), np.float32))
        self.search_error("query", "dim", "16", "32", query=self.tokens(4, 16))
        bad = self.tokens(4)
        bad[2, 0] = np.nan
        self.search_error("query", "nan", "token 2", "finite", query=bad)
        bad[2, 0] = np.inf
        self.search_error("query", "inf", "finite", query=bad)
        self.search_error("query", "1025 tokens", "limit of 1024", query=self.tokens(1025))

    def test_bad_filters(self):
        self.search_error("nofield", "attribute", filter=[("nofield", "==", 1)])
        self.search_error("year", "string", "int64", filter=[("year", "==", "2001")])
        self.search_error("year", "0 values", filter=[("year", "in", [])])
        # The same filters in a batch name the failing search.
        with self.assertRaises(tessera.TesseraError) as context:
            self.client.search_batch("b", [self.query, self.query], k=5,
                                     filter=[("nofield", "==", 1)])
        self.assertCode(context, INVALID, "searches[0]", "nofield")

    # Streams -----------------------------------------------------------------------------------

    def test_cancel_upsert_stream_halfway(self):
        name = "scratch-stream"
        self.client.create_collection(name, dim=DIM, pool_factor=2)
        batches = [[(f"s{b}-{i}", self.tokens(int(self.rng.integers(20, 100))))
                    for i in range(40)] for b in range(5)]
        sent = queue.Queue()

        def requests():
            while True:
                batch = sent.get()
                if batch is None:
                    return
                yield ingest_pb2.UpsertRequest(
                    collection=name, documents=[tessera.encode_document(d) for d in batch])

        call = self.client.ingest_stub.Upsert(requests(), metadata=self.client.metadata,
                                              timeout=60)
        acknowledged = []
        for batch in batches[:2]:
            sent.put(batch)
            response = next(call)
            self.assertEqual([r.code for r in response.results], [0] * len(batch))
            acknowledged.extend(batch)
        sent.put(batches[2])  # in flight when the client gives up
        call.cancel()
        with self.assertRaises(grpc.RpcError) as context:
            for _ in call:
                pass
        self.assertEqual(context.exception.code(), grpc.StatusCode.CANCELLED)
        sent.put(None)

        def check_complete(doc_id, tokens):
            stored = self.client.get(name, doc_id)
            self.assertEqual(stored["version"], 1)
            self.assertEqual(stored["num_tokens"], tokens.shape[0])
            self.assertEqual(stored["vectors"].shape, (tokens.shape[0] // 2, DIM))
            offsets, members = stored["member_offsets"], stored["members"]
            self.assertEqual(sorted(members.tolist()), list(range(tokens.shape[0])))
            for v in range(stored["vectors"].shape[0]):
                mean = tokens[members[offsets[v]:offsets[v + 1]]].mean(axis=0)
                np.testing.assert_allclose(stored["vectors"][v], mean, atol=2e-3, rtol=0)

        for doc_id, tokens in acknowledged:  # acknowledged → stays, complete
            check_complete(doc_id, tokens)
        visible = len(acknowledged)
        for doc_id, tokens in batches[2]:  # in flight → all there or not there at all
            try:
                check_complete(doc_id, tokens)
                visible += 1
            except tessera.TesseraError as error:
                self.assertEqual(error.code, grpc.StatusCode.NOT_FOUND, error)
        for doc_id, _ in batches[3] + batches[4]:  # never sent
            with self.assertRaises(tessera.TesseraError):
                self.client.get(name, doc_id)
        self.assertEqual(self.client.collection_info(name)["stats"]["documents"], visible)
        hits = self.client.search(name, self.query, k=50, exhaustive=True)
        self.assertEqual(len(hits), min(50, visible))
        # The server still takes new streams, and the unsent documents can be written now.
        results = self.client.upsert(name, batches[3])
        self.assertTrue(all(r.ok and r.version == 1 for r in results))
        self.client.drop_collection(name)

    def test_upsert_stream_error_keeps_earlier_batches(self):
        # A request-level error (here: unknown collection in the 2nd message) ends the stream;
        # what the first message wrote stays written.
        name = "scratch-error"
        self.client.create_collection(name, dim=DIM)
        first = [(f"e{i}", self.tokens()) for i in range(5)]
        requests = [ingest_pb2.UpsertRequest(collection=name, documents=[
                        tessera.encode_document(d) for d in first]),
                    ingest_pb2.UpsertRequest(collection="nope", documents=[
                        tessera.encode_document(("x", self.tokens()))])]
        call = self.client.ingest_stub.Upsert(iter(requests), timeout=30)
        self.assertEqual(len(next(call).results), 5)
        with self.assertRaises(grpc.RpcError) as context:
            next(call)
        self.assertEqual(context.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertEqual(self.client.collection_info(name)["stats"]["documents"], 5)
        self.client.drop_collection(name)


if __name__ == "__main__":
    e2e_util.main()
