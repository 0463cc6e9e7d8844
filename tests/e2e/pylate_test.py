"""PyLate (from PyPI) retrieving from the real tessera-server through tessera.pylate.TesseraIndex:
`pylate.retrieve.ColBERT(index=TesseraIndex(...))` returns exactly what the client's own
search_batch returns (ids, order, scores); with exhaustive search its scores equal PyLate's own
`rank.rerank` over the vectors `get_documents_embeddings` returns; removed documents are gone and
updated ones replaced. Embeddings need no model: random unit token vectors by default, or the token
embeddings the eval harness cached (--embeddings DIR, a bench/eval cache directory with
corpus_tokens.npy, corpus_offsets.npy, corpus_ids.json and the same for queries).

Needs torch and pylate (`pip install pylate`; the eval venv of scripts/eval-env has torch): where
they are not importable the test exits 77, which CTest reports as skipped.

    PYTHON_WITH_PYLATE tests/e2e/pylate_test.py --server build/bin/tessera-server \
        [--embeddings ~/.cache/tessera-eval/embeddings/cranfield-minilm-l6-...]
"""

import argparse
import json
import os
import sys
import time

import numpy as np

try:
    import torch
    from pylate import rank, retrieve
    from pylate.indexes.base import Base as PyLateIndex
except ImportError as error:  # CI's Debian Python: no torch, no pylate
    print(f"pylate_test: skipped: torch and pylate are not importable ({error})")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402
from e2e_util import grpc, tessera  # noqa: E402
from tessera.pylate import TesseraIndex  # noqa: E402

EMBEDDINGS = None  # --embeddings
DOCUMENTS, QUERIES = 600, 60


def load_data():
    """(doc ids, doc token matrices, query token matrices), float32, unit rows."""
    if EMBEDDINGS:
        def side(name, count):
            tokens = np.load(os.path.join(EMBEDDINGS, f"{name}_tokens.npy"), mmap_mode="r")
            offsets = np.load(os.path.join(EMBEDDINGS, f"{name}_offsets.npy"))
            with open(os.path.join(EMBEDDINGS, f"{name}_ids.json")) as f:
                ids = json.load(f)
            count = min(count, len(ids))
            return ids[:count], [np.array(tokens[offsets[i]:offsets[i + 1]], np.float32)
                                 for i in range(count)]
        ids, docs = side("corpus", DOCUMENTS)
        return ids, docs, side("queries", QUERIES)[1]
    rng = np.random.default_rng(2024)
    docs = [e2e_util.normalized(rng, int(rng.integers(8, 61)), 48) for _ in range(DOCUMENTS)]
    queries = [e2e_util.query_near(rng, docs[int(rng.integers(0, DOCUMENTS))], 12)
               for _ in range(QUERIES)]
    return [f"doc-{i}" for i in range(DOCUMENTS)], docs, queries


class PyLateBackendTest(e2e_util.ServerTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ids, cls.docs, cls.queries = load_data()
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        super().tearDownClass()

    def make_index(self, collection, **options):
        index = TesseraIndex(address=self.server.address, collection=collection, override=True,
                             **options)
        self.addCleanup(index.close)
        # As PyLate's models.ColBERT.encode returns them: a list of tensors (here half of them
        # numpy arrays, which PyLate's indexes take too).
        embeddings = [torch.from_numpy(d) if i % 2 else d for i, d in enumerate(self.docs)]
        self.assertIs(index.add_documents(documents_ids=self.ids,
                                          documents_embeddings=embeddings), index)
        # Past centroid_min_training_vectors the server trains its candidate index in the
        # background and then switches to it: compare answers once it has.
        deadline = time.monotonic() + 120
        while self.client.collection_info(collection)["stats"]["training_shards"]:
            self.assertLess(time.monotonic(), deadline, "candidate index still training")
            time.sleep(0.1)
        return index

    def direct(self, collection, k, **options):
        """The client's own answers to the same queries."""
        return [hits for start in range(0, len(self.queries), 32)
                for hits in self.client.search_batch(collection, self.queries[start:start + 32],
                                                     k=k, **options)]

    def test_retriever_equals_the_client(self):
        index = self.make_index("pylate-cascade")
        self.assertIsInstance(index, PyLateIndex)
        self.assertEqual(self.client.collection_info("pylate-cascade")["stats"]["documents"],
                         len(self.ids))
        retriever = retrieve.ColBERT(index=index)
        results = retriever.retrieve(queries_embeddings=[torch.from_numpy(q)
                                                         for q in self.queries], k=10)
        direct = self.direct("pylate-cascade", 10)
        self.assertEqual(len(results), len(self.queries))
        for query_results, hits in zip(results, direct):
            self.assertEqual([r["id"] for r in query_results], hits.ids)
            self.assertEqual([r["score"] for r in query_results], [h.score for h in hits])
            self.assertEqual(len(hits), 10)
        # A 3-D batch (queries padded to one length is how PyLate batches them) is the same call.
        same_length = np.stack([q[:8] for q in self.queries[:5]])
        batched = index(same_length, k=5)
        one_by_one = [index(q[:8], k=5)[0] for q in self.queries[:5]]
        self.assertEqual(batched, one_by_one)

    def test_exhaustive_scores_equal_pylates_own_rerank(self):
        index = self.make_index("pylate-exhaustive", search_options={"exhaustive": True})
        results = retrieve.ColBERT(index=index).retrieve(queries_embeddings=self.queries, k=20)
        for query, query_results in zip(self.queries[:20], results):
            ids = [r["id"] for r in query_results]
            vectors = index.get_documents_embeddings([ids])
            # With pool_factor=1 the stored vectors are the documents' tokens (in fp16).
            for doc_id, stored in zip(ids, vectors[0]):
                original = self.docs[self.ids.index(doc_id)]
                self.assertEqual(stored.shape, original.shape)
                np.testing.assert_allclose(stored, original, atol=1e-3)
            reranked = rank.rerank(documents_ids=[ids], queries_embeddings=[query],
                                   documents_embeddings=vectors)[0]
            np.testing.assert_allclose([r["score"] for r in reranked],
                                       [r["score"] for r in query_results], atol=1e-4)
            scores = {r["id"]: r["score"] for r in reranked}
            for r in query_results:  # same order, up to ties within the tolerance
                self.assertAlmostEqual(scores[r["id"]], r["score"], delta=1e-4)
        # And the top 20 equal a brute-force MaxSim over every stored document.
        stored = dict(zip(self.ids, index.get_documents_embeddings([self.ids])[0]))
        for query, query_results in zip(self.queries[:5], results):
            hits = [tessera.Hit(r["id"], r["score"], 1) for r in query_results]
            e2e_util.assert_matches_reference(self, hits, e2e_util.brute_force(query, stored),
                                              20)

    def test_remove_and_update_documents(self):
        index = self.make_index("pylate-edit", search_options={"exhaustive": True})
        removed = self.ids[:5]
        self.assertIs(index.remove_documents(removed), index)
        for query, hits in zip(self.queries, index(self.queries, k=len(self.ids))):
            self.assertEqual(len(hits), len(self.ids) - 5)
            self.assertFalse(set(removed) & {h["id"] for h in hits})
        with self.assertRaises(tessera.TesseraError) as context:
            index.get_documents_embeddings([[removed[0]]])
        self.assertEqual(context.exception.code, grpc.StatusCode.NOT_FOUND)
        # An update replaces the document: its new tokens as the query find it first.
        rng = np.random.default_rng(7)
        replacement = e2e_util.normalized(rng, 20, self.docs[0].shape[1])
        index.update_documents([self.ids[10]], [replacement])
        self.assertEqual(index(replacement, k=1)[0][0]["id"], self.ids[10])
        self.assertEqual(self.client.get("pylate-edit", self.ids[10])["version"], 2)
        # A reopened index (no override) keeps the collection.
        again = TesseraIndex(address=self.server.address, collection="pylate-edit")
        self.addCleanup(again.close)
        self.assertEqual(again(replacement, k=1)[0][0]["id"], self.ids[10])

    def test_what_the_index_refuses(self):
        empty = TesseraIndex(address=self.server.address, collection="pylate-empty",
                             override=True)
        self.addCleanup(empty.close)
        with self.assertRaises(ValueError) as context:
            empty(self.queries[:1], k=3)
        self.assertIn("the index is empty", str(context.exception))
        index = self.make_index("pylate-refuses")
        with self.assertRaises(ValueError) as context:
            index(self.queries[:1], k=3, subset=[self.ids[0]])
        self.assertIn("subset", str(context.exception))
        with self.assertRaises(ValueError) as context:
            index.add_documents(["a", "b"], [self.docs[0]])
        self.assertIn("2 documents_ids and 1 documents_embeddings", str(context.exception))
        wrong_dim = np.ones((3, self.docs[0].shape[1] + 1), np.float32)
        with self.assertRaises(tessera.TesseraError) as context:
            index.add_documents(["wrong"], [wrong_dim])
        self.assertEqual(context.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("document 'wrong'", context.exception.message)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--embeddings", default=None)
    args, rest = parser.parse_known_args()
    EMBEDDINGS = args.embeddings
    sys.argv = [sys.argv[0]] + rest
    e2e_util.main()
