"""Unit tests of the Python client's conversions: matrices, documents, filters, schemas, the
progress bar; and, against the real tessera-server (--server, as every e2e test), that a document
the client cannot encode raises its own TypeError or ValueError, naming the document and the
field, before anything is sent (not gRPC's "UNKNOWN: Exception iterating requests!").

    /usr/bin/python3 tests/e2e/python_client_test.py --server build/bin/tessera-server
"""

import io
import os
import sys
import unittest
from unittest import mock

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402  (puts client/python on the path unless TESSERA_PYTHON_INSTALLED=1)
import tessera  # noqa: E402
from tessera import _ingest  # noqa: E402
from tessera.pb import admin_pb2, common_pb2  # noqa: E402


class MatrixTest(unittest.TestCase):

    def test_round_trip_fp32_and_fp16(self):
        values = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
        m = tessera.encode_matrix(values)
        self.assertEqual((m.rows, m.cols, m.dtype, len(m.data)), (5, 7, common_pb2.DTYPE_FLOAT32,
                                                                  140))
        np.testing.assert_array_equal(tessera.decode_matrix(m), values)
        m = tessera.encode_matrix(values.astype(np.float16))
        self.assertEqual((m.dtype, len(m.data)), (common_pb2.DTYPE_FLOAT16, 70))
        decoded = tessera.decode_matrix(m)
        self.assertEqual(decoded.dtype, np.float32)
        np.testing.assert_array_equal(decoded, values.astype(np.float16).astype(np.float32))
        # Little-endian on the wire whatever the array's byte order.
        big_endian = values.astype(">f4")
        self.assertEqual(tessera.encode_matrix(big_endian).data, values.astype("<f4").tobytes())
        # float64 travels as fp32; dtype= forces the wire type.
        self.assertEqual(tessera.encode_matrix(values.astype(np.float64)).dtype,
                         common_pb2.DTYPE_FLOAT32)
        self.assertEqual(tessera.encode_matrix(values, dtype="fp16").dtype,
                         common_pb2.DTYPE_FLOAT16)

    def test_shapes(self):
        self.assertEqual(tessera.encode_matrix(np.zeros((0, 4), np.float32)).rows, 0)
        with self.assertRaises(ValueError):
            tessera.encode_matrix(np.zeros(4, np.float32))
        with self.assertRaises(ValueError):
            tessera.encode_matrix(np.zeros((2, 2)), dtype="int8")


class DocumentTest(unittest.TestCase):

    def test_forms(self):
        tokens = np.ones((6, 4), np.float32)
        as_dict = tessera.encode_document({"id": "a", "tokens": tokens, "layout": (2, 2, 1, 1),
                                           "attributes": {"n": 3, "x": 0.5, "s": "t",
                                                          "b": True}})
        as_tuple = tessera.encode_document(("a", tokens, {"rows": 2, "cols": 2, "prefix": 1,
                                                          "suffix": 1},
                                            {"n": 3, "x": 0.5, "s": "t", "b": True}))
        self.assertEqual(as_dict, as_tuple)
        self.assertEqual(as_dict.attributes["n"].int_value, 3)
        self.assertEqual(as_dict.attributes["b"].int_value, 1)
        self.assertEqual(as_dict.attributes["x"].double_value, 0.5)
        self.assertEqual(as_dict.layout.prefix_tokens, 1)
        self.assertFalse(tessera.encode_document(("b", tokens)).HasField("layout"))
        with self.assertRaises(ValueError):
            tessera.encode_document(("c",))
        with self.assertRaises(TypeError):
            tessera.encode_document(("c", tokens, None, {"bad": [1]}))

    def test_errors_name_the_document_and_the_field(self):
        tokens = np.ones((3, 4), np.float32)
        cases = [
            (TypeError, (7, tokens), "document: 'id' is int (7); expected str"),
            (TypeError, {"id": None, "tokens": tokens}, "document: 'id' is NoneType (None)"),
            (TypeError, {"id": "a"}, "document ('a'): no 'tokens' key; a document is a dict"),
            (TypeError, {"tokens": tokens}, "document: no 'id' key"),
            (TypeError, ("a", None), "document ('a'): 'tokens' is NoneType; expected a float "
                                     "array, n_tokens × dim"),
            (TypeError, ("a", np.array([["x", "y"]])), "document ('a'): 'tokens' has dtype <U1"),
            (TypeError, ("a", [[1.0, 2.0], [3.0]]), "document ('a'): 'tokens' is not an array"),
            (ValueError, ("a", np.ones(4, np.float32)),
             "document ('a'): 'tokens' has shape (4,); expected 2-D"),
            (TypeError, ("a", tokens, None, {"year": None}),
             "document ('a'): attribute 'year' is NoneType (None); expected int, float or str"),
            (TypeError, ("a", tokens, None, {"tags": ["x"]}),
             "document ('a'): attribute 'tags' is list (['x'])"),
            (TypeError, ("a", tokens, None, {1: 2}), "document ('a'): attribute name 1 is int"),
            (TypeError, ("a", tokens, None, [("year", 1)]),
             "document ('a'): 'attributes' is list"),
            (ValueError, ("a", tokens, (2,)), "document ('a'): 'layout' (2,) has 1 items"),
            (TypeError, ("a", tokens, {"rows": 2}), "document ('a'): 'layout' {'rows': 2} has no "
                                                    "'cols'"),
            (TypeError, ("a", tokens, (2, "2")), "document ('a'): 'layout': cols is str ('2')"),
            (ValueError, ("a", tokens, (2, 2, -1)), "document ('a'): 'layout': prefix is -1"),
            (TypeError, 42, "document is int (42); a document is a dict"),
            (ValueError, ("a", tokens, None, None, "extra"), "document: a tuple of 5 items"),
        ]
        for error_type, doc, message in cases:
            with self.subTest(message=message):
                with self.assertRaises(error_type) as context:
                    tessera.encode_document(doc)
                self.assertIn(message, str(context.exception))
        # Long ids are cut short in messages.
        with self.assertRaises(TypeError) as context:
            tessera.encode_document(("x" * 5000, tokens, None, {"n": None}))
        self.assertLess(len(str(context.exception)), 300)


class FilterTest(unittest.TestCase):

    def test_ops_and_values(self):
        f = tessera.encode_filter([("year", ">=", 2020), ("lang", "in", ["en", "fr"]),
                                   ("score", "<", 0.5), ("tag", "IN", "x")])
        ops = [c.op for c in f.all_of]
        self.assertEqual(ops, [common_pb2.Condition.OP_GE, common_pb2.Condition.OP_IN,
                               common_pb2.Condition.OP_LT, common_pb2.Condition.OP_IN])
        self.assertEqual([v.string_value for v in f.all_of[1].values], ["en", "fr"])
        self.assertEqual([v.string_value for v in f.all_of[3].values], ["x"])
        self.assertEqual(f.all_of[2].values[0].double_value, 0.5)
        single = tessera.encode_filter(("year", "==", 1))
        self.assertEqual(len(single.all_of), 1)
        self.assertEqual(tessera.encode_filter({"year": 1}), single)
        self.assertIsNone(tessera.encode_filter(None))
        for op in ("==", "!=", "<", "<=", ">", ">="):
            tessera.encode_filter([("f", op, 1)])
        with self.assertRaises(ValueError):
            tessera.encode_filter([("year", "~", 1)])
        with self.assertRaises(TypeError) as context:
            tessera.encode_filter([("year", "in", [2020, None])])
        self.assertIn("filter value for 'year' is NoneType (None); expected int, float or str",
                      str(context.exception))


class SchemaTest(unittest.TestCase):

    def test_message_to_dict(self):
        schema = admin_pb2.CollectionSchema(name="x", dim=8, dtype=common_pb2.DTYPE_FLOAT32)
        schema.spatial.mode = admin_pb2.SpatialPooling.MODE_ROW_WINDOWS
        schema.attributes["year"] = common_pb2.ATTRIBUTE_TYPE_INT64
        d = tessera.message_to_dict(schema)
        self.assertEqual(d["dtype"], "fp32")
        self.assertIsNone(d["hierarchical"])
        self.assertEqual(d["spatial"]["mode"], "row_windows")
        self.assertEqual(d["attributes"], {"year": "int64"})
        stats = tessera.message_to_dict(admin_pb2.CollectionStats(documents=2 ** 40))
        self.assertEqual(stats["documents"], 2 ** 40)

    def test_create_collection_request(self):
        client = tessera.Client("127.0.0.1:1")
        sent = {}

        def fake(request, metadata=None, timeout=None):
            sent["request"] = request
            return admin_pb2.CreateCollectionResponse(schema=request.schema)

        with mock.patch.object(client, "admin_stub") as stub:
            stub.CreateCollection.side_effect = fake
            client.create_collection("p", dim=16, pool_factor=3, method="reference",
                                     dtype="fp32", candidates="HNSW32",
                                     attributes={"y": int, "s": "string"})
            schema = sent["request"].schema
            self.assertEqual(schema.hierarchical.pool_factor, 3)
            self.assertEqual(schema.hierarchical.method,
                             admin_pb2.HierarchicalPooling.METHOD_REFERENCE)
            self.assertEqual(schema.candidates.factory, "HNSW32")
            self.assertEqual(dict(schema.attributes), {"y": 1, "s": 3})
            client.create_collection("q", dim=16, spatial={"mode": "tiles", "tile_rows": 2},
                                     candidates={"kind": "global_mean"})
            schema = sent["request"].schema
            self.assertFalse(schema.HasField("hierarchical"))
            self.assertEqual(schema.spatial.tile_rows, 2)
            self.assertEqual(schema.candidates.kind, admin_pb2.CandidateVectors.KIND_GLOBAL_MEAN)
            # Spatial with a pool factor: both poolings (the pool factor was dropped).
            client.create_collection("b", dim=16, pool_factor=3,
                                     spatial={"mode": "tiles", "tile_rows": 2, "tile_cols": 2})
            schema = sent["request"].schema
            self.assertEqual(schema.hierarchical.pool_factor, 3)
            self.assertEqual(schema.spatial.mode, admin_pb2.SpatialPooling.MODE_TILES)
            with self.assertRaises(ValueError):
                client.create_collection("r", dim=16, method="median")
        client.close()


class BatchingTest(unittest.TestCase):

    def test_batches_bound_documents_and_token_bytes(self):
        page = np.zeros((1030, 128), np.float32)  # a ColPali page: 527,360 bytes
        docs = [(f"p{i}", page) for i in range(20)]
        sizes = [len(b) for b in _ingest.batched(docs, 64, 4 << 20)]
        self.assertEqual(sizes, [7, 7, 6])  # 7 pages = 3.7 MB ≤ 4 MiB < 8 pages
        sizes = [len(b) for b in _ingest.batched(docs, 5, 4 << 20)]
        self.assertEqual(sizes, [5, 5, 5, 5])
        # A document larger than the byte bound goes alone; without a bound, only the count.
        big = [("big", np.zeros((5000, 128), np.float32))] + docs[:2]
        self.assertEqual([len(b) for b in _ingest.batched(big, 64, 1 << 20)], [1, 1, 1])
        self.assertEqual([len(b) for b in _ingest.batched(docs, 64)], [20])
        dicts = [{"id": "a", "tokens": page}, {"id": "b", "tokens": page}]
        self.assertEqual([len(b) for b in _ingest.batched(dicts, 64, 600_000)], [1, 1])
        messages = [tessera.encode_document(d) for d in dicts]
        self.assertEqual([len(b) for b in _ingest.batched(messages, 64, 600_000)], [1, 1])


class ClientValidationTest(e2e_util.ServerTestCase):
    """upsert/ingest against the real server: a document the client cannot encode raises its
    TypeError in the caller, naming the document's index and id and the field, and (upsert)
    nothing is sent, or (a lazy ingest) only the batches before it, every one acknowledged."""

    DIM = 8

    def setUp(self):
        self.client = self.server.client(timeout=30)
        self.name = self.id().rsplit(".", 1)[-1].replace("_", "-")
        self.client.create_collection(self.name, dim=self.DIM, attributes={"year": "int64"})

    def tearDown(self):
        self.client.drop_collection(self.name)
        self.client.close()

    def tokens(self, rows=3):
        return np.random.default_rng(rows).standard_normal((rows, self.DIM)).astype(np.float32)

    def stored(self):
        return self.client.collection_info(self.name)["stats"]["documents"]

    def test_upsert_refuses_before_sending(self):
        good = [("a", self.tokens()), ("b", self.tokens(), None, {"year": 2020})]
        cases = [
            ((7, self.tokens()), TypeError, "document 2: 'id' is int (7); expected str"),
            (("c", self.tokens(), None, {"year": None}), TypeError,
             "document 2 ('c'): attribute 'year' is NoneType (None); expected int, float or str"),
            ({"id": "c"}, TypeError, "document 2 ('c'): no 'tokens' key"),
            (("c", self.tokens()[0]), ValueError, "document 2 ('c'): 'tokens' has shape (8,)"),
        ]
        for bad, error_type, message in cases:
            with self.subTest(message=message):
                with self.assertRaises(error_type) as context:
                    self.client.upsert(self.name, good + [bad], batch_size=1)
                self.assertIn(message, str(context.exception))
                self.assertEqual(self.stored(), 0, "documents were sent before the error")
        self.assertTrue(all(r.ok for r in self.client.upsert(self.name, good)))
        self.assertEqual(self.stored(), 2)

    def test_lazy_ingest_raises_the_documents_error(self):
        def docs():
            for i in range(5):
                yield (f"d{i}", self.tokens())
            yield ("d5", self.tokens(), None, {"year": None})
            yield ("d6", self.tokens())

        with self.assertRaises(TypeError) as context:
            self.client.ingest(self.name, docs(), batch_size=2, progress=False)
        self.assertIn("document 5 ('d5'): attribute 'year' is NoneType", str(context.exception))
        # Batches [d0 d1] [d2 d3] were sent and acknowledged; [d4 d5] never was.
        self.assertEqual(self.stored(), 4)
        self.assertEqual(self.client.get(self.name, "d3")["version"], 1)

    def test_failing_iterator_is_raised_as_is(self):
        def docs():
            yield ("d0", self.tokens())
            raise RuntimeError("the corpus reader failed")

        with self.assertRaises(RuntimeError) as context:
            self.client.ingest(self.name, docs(), batch_size=1, progress=False)
        self.assertEqual(str(context.exception), "the corpus reader failed")
        self.assertEqual(self.stored(), 1)


class ProgressBarTest(unittest.TestCase):

    def test_built_in_bar(self):
        err = io.StringIO()
        with mock.patch.object(sys, "stderr", err), \
                mock.patch.dict(sys.modules, {"tqdm": None}):
            bar = _ingest.ProgressBar(100, "ingest x", True)
            bar.update(50)
            bar.update(50, failed=2)
            bar.close()
        text = err.getvalue()
        self.assertIn("ingest x", text)
        self.assertIn("100/100", text)
        self.assertIn("docs/s", text)
        self.assertIn("2 failed", text)
        self.assertTrue(text.endswith("\n"))

    def test_disabled_bar_is_silent(self):
        err = io.StringIO()
        with mock.patch.object(sys, "stderr", err):
            bar = _ingest.ProgressBar(None, "x", False)
            bar.update(5)
            bar.close()
        self.assertEqual(err.getvalue(), "")


if __name__ == "__main__":
    e2e_util.main()
