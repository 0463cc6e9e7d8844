"""Hybrid retrieval (sparse vectors beside the token matrices) against the real tessera-server on
loopback, through both Python clients: a collection created with sparse=True takes documents with
"sparse": (indices, values) made by tessera.bm25 from text; a sparse-only search (query=None)
equals a brute-force BM25 (Lucene's formula) in NumPy over the live documents, before and after
deletes and upserts and after a SIGKILL and restart (acknowledged sparse vectors are durable);
hybrid searches fuse the lanes as RRF and min-max score fusion say (checked against the lanes
searched alone); bad sparse input is INVALID_ARGUMENT naming the field and the value."""

import asyncio
import glob
import math
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402
from e2e_util import grpc, tessera  # noqa: E402
from tessera.bm25 import Bm25Encoder  # noqa: E402

DIM = 16
WORDS = ("retrieval index shard vector token query document score rank fusion sparse dense "
         "lexical semantic late interaction stemming stemmed stems running runner runs ran "
         "collection server router cluster replica snapshot filter group attribute").split()


def have_stemmer():
    """Whether PyStemmer imports: from this Python's packages, else from the venv scripts/setup
    installs it in (the same /usr/bin/python3, so its extension modules load here)."""
    try:
        import Stemmer  # noqa: F401
        return True
    except ImportError:
        pass
    venv = os.environ.get("TESSERA_TOOLS_VENV", os.path.expanduser("~/.cache/tessera-tools/venv"))
    sys.path.extend(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages")))
    try:
        import Stemmer  # noqa: F401,F811
        return True
    except ImportError:
        return False


def texts(rng, n):
    out = []
    for _ in range(n):
        length = int(rng.integers(3, 25))
        # Zipf-like: early words are common.
        picks = np.minimum((rng.pareto(1.2, size=length) * 3).astype(int), len(WORDS) - 1)
        out.append(" ".join(WORDS[i] for i in picks))
    return out


def bm25_reference(documents, query, k, k1=1.2, b=0.75, keep=None):
    """documents: {id: (indices, values)}; the best k (id, score) by Lucene's BM25, ties by id,
    among the ids `keep` accepts (all when None; the statistics are all documents' anyway)."""
    n = len(documents)
    total = sum(float(np.sum(v)) for _, v in documents.values())
    avgdl = total / n if n and total > 0 else 1.0
    df = {}
    for indices, values in documents.values():
        for t, w in zip(indices.tolist(), values.tolist()):
            if w > 0:
                df[t] = df.get(t, 0) + 1
    scored = []
    q_indices, q_values = query
    for doc_id, (indices, values) in documents.items():
        if keep is not None and not keep(doc_id):
            continue
        tf = dict(zip(indices.tolist(), values.tolist()))
        length = float(np.sum(values))
        score = 0.0
        for t, q in zip(q_indices.tolist(), q_values.tolist()):
            f = tf.get(t, 0.0)
            if f <= 0:
                continue
            idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
            score += q * idf * f / (f + k1 * (1 - b + b * length / avgdl))
        if score > 0:
            scored.append((doc_id, np.float32(score)))
    scored.sort(key=lambda e: (-e[1], e[0]))
    return scored[:k]


class HybridTest(e2e_util.ServerTestCase):

    def setUp(self):
        self.client = self.server.client()
        self.addCleanup(self.client.close)
        self.rng = np.random.default_rng(5)
        self.encoder = Bm25Encoder(language="english" if have_stemmer() else None,
                                   vocabulary={})

    def make_docs(self, n, prefix="d"):
        docs = []
        for i, text in enumerate(texts(self.rng, n)):
            docs.append({"id": f"{prefix}-{i:04d}", "tokens": e2e_util.normalized(self.rng, 8, DIM),
                         "attributes": {"group": i % 3}, "sparse": self.encoder.document(text)})
        return docs

    def assert_sparse_matches(self, name, live, queries, k=10):
        for text in queries:
            query = self.encoder.query(text)
            got = self.client.search(name, None, k=k, sparse_query=query)
            want = bm25_reference(live, query, k)
            self.assertEqual(got.ids, [i for i, _ in want], text)
            np.testing.assert_allclose(got.scores, [s for _, s in want], rtol=2e-6)
            self.assertEqual([h.sparse_score for h in got], [h.score for h in got])
            self.assertTrue(all(h.dense_score is None for h in got))

    def test_sparse_only_equals_brute_force_bm25_through_writes_and_a_sigkill(self):
        name = "bm25"
        schema = self.client.create_collection(name, dim=DIM, sparse=True,
                                               attributes={"group": "int64"})
        self.assertEqual(schema["sparse"], {"modifier": "idf", "k1": 1.2, "b": 0.75})
        docs = self.make_docs(300)
        self.assertTrue(all(r.ok for r in self.client.upsert(name, docs)))
        live = {d["id"]: d["sparse"] for d in docs}
        queries = texts(self.rng, 12)
        self.assert_sparse_matches(name, live, queries)

        stored = self.client.get(name, docs[3]["id"])
        np.testing.assert_array_equal(stored["sparse"][0], docs[3]["sparse"][0])
        np.testing.assert_array_equal(stored["sparse"][1], docs[3]["sparse"][1])

        gone = [d["id"] for d in docs[::5]]
        self.client.delete(name, gone)
        for doc_id in gone:
            live.pop(doc_id)
        changed = []
        for d in docs[1::7]:
            if d["id"] in live:
                d = dict(d, sparse=self.encoder.document(texts(self.rng, 1)[0]))
                live[d["id"]] = d["sparse"]
                changed.append(d)
        self.assertTrue(all(r.ok for r in self.client.upsert(name, changed)))
        self.assert_sparse_matches(name, live, queries)

        # Acknowledged sparse vectors survive a SIGKILL: the index is rebuilt from the records.
        self.client.close()
        self.server.kill()
        self.server.start()
        self.client = self.server.client()
        self.assert_sparse_matches(name, live, queries)

        # A filter applies to the sparse lane.
        query = self.encoder.query(queries[0])
        got = self.client.search(name, None, k=10, sparse_query=query,
                                 filter=[("group", "==", 1)], with_attributes=True)
        want = bm25_reference(live, query, 10, keep=lambda i: int(i.split("-")[1]) % 3 == 1)
        self.assertEqual(got.ids, [i for i, _ in want])
        self.assertTrue(all(h.attributes == {"group": 1} for h in got))
        self.client.drop_collection(name)

    def test_hybrid_fuses_the_lanes(self):
        name = "hybrid"
        self.client.create_collection(name, dim=DIM, sparse=True, attributes={"group": "int64"})
        docs = self.make_docs(200)
        self.assertTrue(all(r.ok for r in self.client.upsert(name, docs)))
        depth = 20
        for text in texts(self.rng, 6):
            query = e2e_util.normalized(self.rng, 4, DIM)
            sparse_query = self.encoder.query(text)
            dense = self.client.search(name, query, k=depth, exhaustive=True)
            sparse = self.client.search(name, None, k=depth, sparse_query=sparse_query)
            # RRF: Σ weight / (60 + rank).
            expected = {}
            for rank, hit in enumerate(dense, 1):
                expected[hit.id] = expected.get(hit.id, 0.0) + 1.0 / (60 + rank)
            for rank, hit in enumerate(sparse, 1):
                expected[hit.id] = expected.get(hit.id, 0.0) + 2.0 / (60 + rank)
            got = self.client.search(name, query, k=10, sparse_query=sparse_query,
                                     fusion="rrf", sparse_weight=2.0, fusion_candidates=depth,
                                     exhaustive=True)
            want = sorted(expected.items(), key=lambda e: (-np.float32(e[1]), e[0]))[:10]
            self.assertEqual(got.ids, [i for i, _ in want])
            np.testing.assert_allclose(got.scores, [s for _, s in want], rtol=1e-6)
            # Score fusion: min-max normalised per lane, summed.
            expected = {}
            for lane in (dense, sparse):
                if not lane:
                    continue
                low, high = min(lane.scores), max(lane.scores)
                for hit in lane:
                    norm = 1.0 if high == low else (hit.score - low) / (high - low)
                    expected[hit.id] = expected.get(hit.id, 0.0) + norm
            got = self.client.search(name, query, k=10, sparse_query=sparse_query,
                                     fusion="score", fusion_candidates=depth, exhaustive=True)
            np.testing.assert_allclose(sorted(got.scores, reverse=True),
                                       sorted(expected.values(), reverse=True)[:10], atol=1e-5)
            # Rerank: the fused candidates ordered by their exact MaxSim.
            got = self.client.search(name, query, k=10, sparse_query=sparse_query,
                                     fusion_candidates=depth, rerank=True, exhaustive=True)
            self.assertEqual(list(got.scores), sorted(got.scores, reverse=True))
            self.assertEqual([h.score for h in got], [h.dense_score for h in got])
        self.client.drop_collection(name)

    def test_async_client_hybrid(self):
        name = "hybrid_async"
        docs = self.make_docs(50, "a")

        async def run():
            async with tessera.AsyncClient(self.server.address) as client:
                await client.create_collection(name, dim=DIM, sparse={"k1": 0.9, "b": 0.4},
                                               attributes={"group": "int64"})
                results = await client.upsert(name, docs)
                self.assertTrue(all(r.ok for r in results))
                query = self.encoder.query(texts(self.rng, 1)[0] + " retrieval")
                got = await client.search(name, None, k=5, sparse_query=query)
                want = bm25_reference({d["id"]: d["sparse"] for d in docs}, query, 5, 0.9, 0.4)
                self.assertEqual(got.ids, [i for i, _ in want])
                await client.drop_collection(name)

        asyncio.run(run())

    def test_bad_sparse_input_is_invalid_argument_naming_field_and_value(self):
        self.client.create_collection("dense_only", dim=DIM)
        self.client.create_collection("with_sparse", dim=DIM, sparse=True)
        tokens = e2e_util.normalized(self.rng, 4, DIM)
        cases = [
            ("dense_only", ([1, 2], [1.0, 1.0]), "declares no sparse field"),
            ("with_sparse", ([1, 2], [1.0, float("nan")]), "values[1] = nan"),
            ("with_sparse", ([1, 2], [1.0, -2.0]), "values[1] = -2"),
            ("with_sparse", ([7, 3, 7], [1.0, 1.0, 1.0]), "indices[2] = 7 repeats"),
        ]
        for name, sparse, fragment in cases:
            (result,) = self.client.upsert(name, [{"id": "a17", "tokens": tokens,
                                                   "sparse": sparse}])
            self.assertCode(result, grpc.StatusCode.INVALID_ARGUMENT, "a17", fragment)
        # Mismatched lengths: the client refuses them; a raw message reaches the server.
        with self.assertRaises(ValueError):
            self.client.upsert("with_sparse", [{"id": "a", "tokens": tokens,
                                                "sparse": ([1, 2, 3], [1.0])}])
        message = tessera.encode_document({"id": "a18", "tokens": tokens})
        message.sparse.indices.extend([1, 2, 3])
        message.sparse.values.extend([1.0])
        (result,) = self.client.upsert("with_sparse", [message])
        self.assertCode(result, grpc.StatusCode.INVALID_ARGUMENT, "a18", "3 indices but 1 values")
        with self.assertRaises(tessera.TesseraError) as context:
            self.client.search("dense_only", None, sparse_query=([1], [1.0]))
        self.assertCode(context, grpc.StatusCode.INVALID_ARGUMENT, "sparse_query",
                        "declares no sparse field")
        with self.assertRaises(tessera.TesseraError) as context:
            self.client.search("with_sparse", None, sparse_query=([4, 4], [1.0, 1.0]))
        self.assertCode(context, grpc.StatusCode.INVALID_ARGUMENT, "sparse_query",
                        "indices[1] = 4 repeats")
        with self.assertRaises(tessera.TesseraError) as context:
            self.client.search("with_sparse", None, sparse_query=([4], [1.0]), rerank=True)
        self.assertCode(context, grpc.StatusCode.INVALID_ARGUMENT, "rerank")
        with self.assertRaises(tessera.TesseraError) as context:
            self.client.create_collection("bad_b", dim=DIM, sparse={"b": 2.0})
        self.assertCode(context, grpc.StatusCode.INVALID_ARGUMENT, "b = 2")
        self.client.drop_collection("dense_only")
        self.client.drop_collection("with_sparse")


class Bm25EncoderTest(unittest.TestCase):

    def test_stems_and_counts(self):
        if not have_stemmer():
            self.skipTest("PyStemmer is not installed (pip install PyStemmer)")
        encoder = Bm25Encoder(vocabulary={})
        self.assertEqual(encoder.tokenize("Running runners RUN!"), ["run", "runner", "run"])
        indices, values = encoder.document("running runs the runner")
        self.assertEqual(indices.dtype, np.uint32)
        self.assertEqual(dict(zip(indices.tolist(), values.tolist())),
                         {encoder.vocabulary["run"]: 2.0, encoder.vocabulary["the"]: 1.0,
                          encoder.vocabulary["runner"]: 1.0})
        # Unknown stems are dropped from queries; hashed ids are stable 32-bit values.
        self.assertEqual(encoder.query("unseen").__len__(), 2)
        self.assertEqual(len(encoder.query("unseen")[0]), 0)
        hashed = Bm25Encoder(stopwords=["the"])
        indices, _ = hashed.document("the running")
        self.assertEqual(len(indices), 1)
        self.assertEqual(indices.tolist(), Bm25Encoder().query("run")[0].tolist())


if __name__ == "__main__":
    e2e_util.main()
