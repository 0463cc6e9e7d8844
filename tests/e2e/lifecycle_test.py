"""End-to-end lifecycle of tessera-server driven by the Python client: create collections, ingest
1,000 documents (dim 64 and 128, 10-80 tokens, fp32 and fp16 on the wire), check that exhaustive
search equals a NumPy brute-force MaxSim over what `get` returns, that the default cascade finds the
same top hit, then upsert, delete, and restart the server on the same data dir."""

import os
import sys
import threading
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402
from e2e_util import grpc, tessera  # noqa: E402

# (name, dim, storage dtype, pool factor, documents)
COLLECTIONS = [("papers", 128, "fp16", 2, 600), ("notes", 64, "fp32", 1, 400)]
LANGS = ["en", "fr", "de"]


def make_documents(rng, name, dim, count):
    docs = []
    for i in range(count):
        tokens = e2e_util.normalized(rng, int(rng.integers(10, 81)), dim)
        if i % 2:  # every other document travels as fp16
            tokens = tokens.astype(np.float16)
        docs.append({"id": f"{name}-{i:04d}", "tokens": tokens,
                     "attributes": {"year": 2015 + i % 10, "lang": LANGS[i % 3],
                                    "rating": float(i % 7) / 2}})
    return docs


class LifecycleTest(e2e_util.ServerTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.rng = np.random.default_rng(1234)
        cls.client = cls.server.client()
        cls.docs = {}
        for name, dim, dtype, pool_factor, count in COLLECTIONS:
            # The plain n / p cut (no merge-height limit), so that each document's vector count
            # is known: these random tokens are all far apart.
            schema = cls.client.create_collection(
                name, dim=dim, dtype=dtype, pool_factor=pool_factor, max_merge_height=0,
                attributes={"year": "int64", "lang": "string", "rating": "double"})
            assert schema["dim"] == dim and schema["dtype"] == dtype, schema
            cls.docs[name] = make_documents(cls.rng, name, dim, count)
        # One collection through the batch helper (with its progress bar), one through upsert.
        summary = cls.client.ingest("papers", cls.docs["papers"], batch_size=50, progress=True)
        assert summary.stored == 600 and not summary.failed, summary
        results = cls.client.upsert("notes", cls.docs["notes"], batch_size=64)
        assert all(r.ok and r.version == 1 for r in results), [r for r in results if not r.ok]

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        super().tearDownClass()

    def stored(self, name):
        """{id: rerank vectors} of every document, as `get` returns them."""
        return {doc["id"]: self.client.get(name, doc["id"])["vectors"] for doc in self.docs[name]}

    # -------------------------------------------------------------------------------------------

    def test_get_returns_pooled_documents(self):
        for name, dim, dtype, pool_factor, count in COLLECTIONS:
            info = self.client.collection_info(name)
            self.assertEqual(info["stats"]["documents"], count)
            self.assertEqual(info["stats"]["original_tokens"],
                             sum(d["tokens"].shape[0] for d in self.docs[name]))
            self.assertIn(name, self.client.list_collections())
            total_vectors = 0
            for doc in self.docs[name][::7]:
                stored = self.client.get(name, doc["id"])
                tokens = doc["tokens"].astype(np.float32)
                n = tokens.shape[0]
                vectors = stored["vectors"]
                self.assertEqual(stored["num_tokens"], n)
                self.assertEqual(stored["version"], 1)
                self.assertEqual(stored["dtype"], dtype)
                self.assertEqual(stored["attributes"], doc["attributes"])
                self.assertIsNone(stored["layout"])
                self.assertEqual(vectors.shape, (max(n // pool_factor, 1), dim))
                total_vectors += vectors.shape[0]
                offsets, members = stored["member_offsets"], stored["members"]
                self.assertEqual(len(offsets), vectors.shape[0] + 1)
                self.assertEqual(sorted(members.tolist()), list(range(n)))
                # Each rerank vector is the mean of the tokens it pools (stored in `dtype`).
                atol = 2e-3 if dtype == "fp16" else 1e-5
                for v in range(vectors.shape[0]):
                    mean = tokens[members[offsets[v]:offsets[v + 1]]].mean(axis=0)
                    np.testing.assert_allclose(vectors[v], mean, atol=atol, rtol=0,
                                               err_msg=f"{doc['id']} vector {v}")
            self.assertGreater(total_vectors, 0)

    def test_default_pooling_stops_at_the_merge_height_limit(self):
        """A collection created without pooling options pools with ward p = 2 and no merge above
        height 0.3: tokens far apart (random directions, cosine distance ≈ 1) all stay, while
        near-duplicates are pooled to n / 2, as with the plain cut."""
        name = "default-pooling"
        schema = self.client.create_collection(name, dim=32)
        try:
            self.assertEqual(schema["hierarchical"]["pool_factor"], 2)
            self.assertAlmostEqual(schema["hierarchical"]["max_merge_height"], 0.3)
            rng = np.random.default_rng(5)
            apart = e2e_util.normalized(rng, 30, 32)
            topics = e2e_util.normalized(rng, 3, 32)
            near = topics[np.repeat(np.arange(3), 10)] + 0.01 * rng.standard_normal((30, 32))
            near = (near / np.linalg.norm(near, axis=1, keepdims=True)).astype(np.float32)
            self.assertTrue(all(r.ok for r in self.client.upsert(
                name, [("apart", apart), ("near", near)])))
            self.assertEqual(self.client.get(name, "apart")["vectors"].shape, (30, 32))
            self.assertEqual(self.client.get(name, "near")["vectors"].shape, (15, 32))
        finally:
            self.client.drop_collection(name)

    def test_exhaustive_search_equals_brute_force(self):
        for name, dim, _, _, count in COLLECTIONS:
            stored = self.stored(name)
            rng = np.random.default_rng(7)
            for q in range(8):
                target = self.docs[name][int(rng.integers(0, count))]
                query = e2e_util.query_near(rng, target["tokens"].astype(np.float32),
                                            int(rng.integers(4, 33)))
                if q % 2:
                    query = query.astype(np.float16)  # fp16 query on the wire
                reference = e2e_util.brute_force(query.astype(np.float32), stored)
                k = count if q == 0 else 10  # the first query ranks the whole collection
                hits = self.client.search(name, query, k=k, exhaustive=True)
                self.assertTrue(hits.exhaustive)
                self.assertEqual(hits.documents_scored, count)
                e2e_util.assert_matches_reference(self, hits, reference, k)
                self.assertEqual(hits[0].id, target["id"])
                # The default cascade (FAISS candidates, then exact MaxSim) agrees on the top hit
                # and its score.
                cascade = self.client.search(name, query, k=10)
                self.assertFalse(cascade.exhaustive)
                self.assertEqual(cascade[0].id, reference[0][0])
                self.assertAlmostEqual(cascade[0].score, reference[0][1], delta=1e-4)
                self.assertGreaterEqual(cascade.timings["total_ms"], 0.0)

    def test_filters_and_batch_search(self):
        name = "notes"
        stored = self.stored(name)
        attributes = {d["id"]: d["attributes"] for d in self.docs[name]}
        rng = np.random.default_rng(11)
        query = e2e_util.normalized(rng, 12, 64)
        filters = [
            ([("year", ">=", 2020)], lambda a: a["year"] >= 2020),
            ([("year", "<", 2017), ("lang", "!=", "fr")],
             lambda a: a["year"] < 2017 and a["lang"] != "fr"),
            ([("lang", "in", ["de", "en"]), ("rating", "<=", 1.5)],
             lambda a: a["lang"] in ("de", "en") and a["rating"] <= 1.5),
            ([("year", "==", 2019)], lambda a: a["year"] == 2019),
            ([("rating", ">", 2.0)], lambda a: a["rating"] > 2.0),
        ]
        for conditions, predicate in filters:
            subset = {i: v for i, v in stored.items() if predicate(attributes[i])}
            reference = e2e_util.brute_force(query, subset)
            hits = self.client.search(name, query, k=20, filter=conditions, exhaustive=True)
            e2e_util.assert_matches_reference(self, hits, reference, 20)
            # The cascade must not return documents outside the filter, nor fewer than k.
            cascade = self.client.search(name, query, k=20, filter=conditions)
            self.assertEqual(len(cascade), min(20, len(subset)), conditions)
            self.assertTrue(all(predicate(attributes[h.id]) for h in cascade), conditions)
        queries = [e2e_util.normalized(rng, 6, 64) for _ in range(3)]
        batch = self.client.search_batch(name, queries, k=5, exhaustive=True)
        self.assertEqual(len(batch), 3)
        for query, hits in zip(queries, batch):
            e2e_util.assert_matches_reference(self, hits, e2e_util.brute_force(query, stored), 5)

    def test_explain(self):
        name = "papers"
        doc = self.docs[name][42]
        rng = np.random.default_rng(3)
        query = e2e_util.query_near(rng, doc["tokens"].astype(np.float32), 9)
        hits = self.client.search(name, query, k=3, explain=True, exhaustive=True)
        stored = self.client.get(name, hits[0].id)
        vectors, offsets, members = (stored["vectors"], stored["member_offsets"],
                                     stored["members"])
        similarities = query.astype(np.float64) @ vectors.astype(np.float64).T
        explanation = hits[0].explanation
        self.assertEqual([m.query_token for m in explanation], list(range(9)))
        for match in explanation:
            best = similarities[match.query_token]
            self.assertAlmostEqual(match.similarity, best.max(), delta=1e-4)
            self.assertAlmostEqual(best[match.document_vector], best.max(), delta=1e-4)
            v = match.document_vector
            self.assertEqual(sorted(match.covered_tokens),
                             sorted(members[offsets[v]:offsets[v + 1]].tolist()))
        self.assertAlmostEqual(sum(m.similarity for m in explanation), hits[0].score, delta=1e-4)

    def test_deadline_exceeded_in_a_large_search(self):
        rng = np.random.default_rng(5)
        query = e2e_util.normalized(rng, 1024, 128)  # the largest query the server accepts
        with self.assertRaises(tessera.TesseraError) as context:
            self.client.search("papers", query, k=100, exhaustive=True, explain=True,
                               timeout=0.002)
        self.assertEqual(context.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
        # The server is fine and still answers that search without a deadline.
        self.server.assert_healthy(self)
        hits = self.client.search("papers", query, k=100, exhaustive=True)
        self.assertEqual(len(hits), 100)

    # Mutates the collections and restarts the server: unittest runs methods in name order, so this
    # one runs after the read-only tests above.
    def test_lifecycle_upsert_delete_restart(self):
        name, dim = "papers", 128
        rng = np.random.default_rng(99)
        # Upsert: new content under existing ids → version 2, content replaced.
        replaced = {}
        for doc in self.docs[name][100:110]:
            replaced[doc["id"]] = e2e_util.normalized(rng, int(rng.integers(10, 81)), dim)
        results = self.client.upsert(name, [(i, t, None, {"year": 2030, "lang": "xx"})
                                            for i, t in replaced.items()])
        self.assertTrue(all(r.ok for r in results), results)
        self.assertEqual([r.version for r in results], [2] * 10)
        for doc_id, tokens in replaced.items():
            stored = self.client.get(name, doc_id)
            self.assertEqual(stored["version"], 2)
            self.assertEqual(stored["num_tokens"], tokens.shape[0])
            self.assertEqual(stored["attributes"], {"year": 2030, "lang": "xx"})
            query = e2e_util.query_near(rng, tokens, 8)
            self.assertEqual(self.client.search(name, query, k=1)[0].id, doc_id)
        hits = self.client.search(name, e2e_util.normalized(rng, 4, dim), k=50,
                                  filter=[("year", "==", 2030)], exhaustive=True)
        self.assertEqual(sorted(h.id for h in hits), sorted(replaced))
        self.assertTrue(all(h.version == 2 for h in hits))

        # Delete: gone from get and search; deleting again reports it did not exist.
        deleted = [doc["id"] for doc in self.docs[name][200:210]] + ["papers-0105"]
        self.assertEqual(self.client.delete(name, deleted), [True] * 11)
        self.assertEqual(self.client.delete(name, deleted[:2] + ["never-there"]), [False] * 3)
        for doc_id in deleted:
            with self.assertRaises(tessera.TesseraError) as context:
                self.client.get(name, doc_id)
            self.assertCode(context, grpc.StatusCode.NOT_FOUND, doc_id)
        remaining = 600 - len(deleted)
        self.assertEqual(self.client.collection_info(name)["stats"]["documents"], remaining)
        for doc_id in deleted[:3]:
            target = next(d for d in self.docs[name] if d["id"] == doc_id)
            query = e2e_util.query_near(rng, target["tokens"].astype(np.float32), 8)
            everything = self.client.search(name, query, k=remaining, exhaustive=True)
            self.assertEqual(len(everything), remaining)
            self.assertNotIn(doc_id, everything.ids)
            self.assertNotIn(doc_id, self.client.search(name, query, k=10).ids)

        # Restart (SIGTERM → exit 0, same data dir) → the same documents and the same answers.
        queries = {n: [e2e_util.query_near(rng, self.docs[n][i]["tokens"].astype(np.float32), 8)
                       for i in (1, 50, 333)] for n, *_ in COLLECTIONS}
        before = {n: [(self.client.search(n, q, k=20, exhaustive=True),
                       self.client.search(n, q, k=10)) for q in queries[n]]
                  for n in queries}
        infos = {n: self.client.collection_info(n) for n in queries}
        samples = {n: {d["id"]: self.client.get(n, d["id"]) for d in self.docs[n][95:115]
                       if d["id"] not in deleted} for n in queries}
        self.client.close()
        type(self).server.restart()
        type(self).client = self.server.client()
        self.assertEqual(sorted(self.client.list_collections()), ["notes", "papers"])
        for n in queries:
            info = self.client.collection_info(n)
            self.assertEqual(info["schema"], infos[n]["schema"])
            self.assertEqual(info["stats"]["documents"], infos[n]["stats"]["documents"])
            for doc_id, stored in samples[n].items():
                again = self.client.get(n, doc_id)
                self.assertEqual(again["version"], stored["version"])
                self.assertEqual(again["attributes"], stored["attributes"])
                np.testing.assert_array_equal(again["vectors"], stored["vectors"])
            for query, (exhaustive, cascade) in zip(queries[n], before[n]):
                after = self.client.search(n, query, k=20, exhaustive=True)
                self.assertEqual(after.ids, exhaustive.ids)
                np.testing.assert_allclose(after.scores, exhaustive.scores, atol=1e-6)
                after = self.client.search(n, query, k=10)
                self.assertEqual(after.ids[0], cascade.ids[0])
            for doc_id in deleted:
                if n == name:
                    with self.assertRaises(tessera.TesseraError):
                        self.client.get(n, doc_id)


class ShutdownTest(unittest.TestCase):
    """SIGTERM with a client connected but idle: the server drains (no call is open) and exits 0
    at once. gRPC's own graceful shutdown waited ~5 s here for the idle client to answer a ping;
    the bound below is far under the 30 s grace period, so only a real wait fails it."""

    def test_an_idle_connection_does_not_delay_exit(self):
        server = e2e_util.Server("--shutdown_grace_seconds", "30")
        self.addCleanup(server.cleanup)
        server.start()
        with server.client() as client:
            client.create_collection("idle", dim=8)
            self.assertEqual(client.list_collections(), ["idle"])
            start = time.monotonic()
            code = server.stop()
            elapsed = time.monotonic() - start
        self.assertEqual(code, 0, server.log()[-2000:])
        self.assertLess(elapsed, 3.0, server.log()[-2000:])
        self.assertNotIn("cancelling open calls", server.log())


class DropWhileSearchingTest(e2e_util.ServerTestCase):
    """Dropping a collection while other threads search it: searches either succeed or get
    NOT_FOUND, the server stays healthy, and the name can be reused for an empty collection."""

    def test_drop_collection_while_searched(self):
        client = self.server.client()
        rng = np.random.default_rng(8)
        client.create_collection("dropme", dim=32, pool_factor=1)
        client.create_collection("bystander", dim=32)
        docs = [(f"d{i}", e2e_util.normalized(rng, 40, 32)) for i in range(300)]
        self.assertTrue(all(r.ok for r in client.upsert("dropme", docs)))
        self.assertTrue(all(r.ok for r in client.upsert("bystander", docs[:20])))
        query = e2e_util.normalized(rng, 32, 32)
        codes, stop = [], threading.Event()
        lock = threading.Lock()

        def searcher(exhaustive):
            with self.server.client() as own:
                while not stop.is_set():
                    try:
                        hits = own.search("dropme", query, k=10, exhaustive=exhaustive)
                        outcome = "OK" if len(hits) == 10 else f"OK with {len(hits)} hits"
                    except tessera.TesseraError as error:
                        outcome = error.code.name
                        if error.code != grpc.StatusCode.NOT_FOUND:
                            outcome += f" ({error.message})"
                    with lock:
                        codes.append(outcome)

        threads = [threading.Thread(target=searcher, args=(e,)) for e in (True, False, True)]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        client.drop_collection("dropme")
        time.sleep(0.3)
        stop.set()
        for thread in threads:
            thread.join(30)
        self.assertIn("OK", codes)
        self.assertIn("NOT_FOUND", codes)
        self.assertEqual(set(codes) - {"OK", "NOT_FOUND"}, set())
        # After the drop every search says NOT_FOUND (never a result from the dropped data).
        with self.assertRaises(tessera.TesseraError) as context:
            client.search("dropme", query, k=10)
        self.assertCode(context, grpc.StatusCode.NOT_FOUND, "dropme")
        self.server.assert_healthy(self)
        self.assertEqual(client.list_collections(), ["bystander"])
        self.assertEqual(client.collection_info("bystander")["stats"]["documents"], 20)
        client.create_collection("dropme", dim=32)
        self.assertEqual(client.collection_info("dropme")["stats"]["documents"], 0)
        self.assertEqual(len(client.search("dropme", query, k=10, exhaustive=True)), 0)
        client.close()


if __name__ == "__main__":
    e2e_util.main()
