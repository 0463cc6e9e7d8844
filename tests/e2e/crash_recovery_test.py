"""SIGKILL tessera-server in the middle of an ingest, restart it on the same data dir and resume the
ingest: no acknowledged document is lost (each is readable, complete, version 1) and none is
duplicated (the collection holds exactly the ingested ids, each once)."""

import os
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402
from e2e_util import grpc, tessera  # noqa: E402

DIM = 48
DOCUMENTS = 1500
BATCH = 20


class CrashRecoveryTest(e2e_util.ServerTestCase):

    def check_document(self, client, doc_id, tokens):
        stored = client.get("crash", doc_id)
        self.assertEqual(stored["version"], 1, doc_id)
        self.assertEqual(stored["num_tokens"], tokens.shape[0], doc_id)
        self.assertEqual(stored["vectors"].shape, (tokens.shape[0] // 2, DIM), doc_id)
        offsets, members = stored["member_offsets"], stored["members"]
        first = tokens[members[offsets[0]:offsets[1]]].mean(axis=0)
        np.testing.assert_allclose(stored["vectors"][0], first, atol=2e-3, rtol=0,
                                   err_msg=doc_id)

    def test_sigkill_during_ingest_then_resume(self):
        rng = np.random.default_rng(77)
        docs = {f"c{i:05d}": e2e_util.normalized(rng, int(rng.integers(20, 61)), DIM)
                for i in range(DOCUMENTS)}
        ids = list(docs)
        client = self.server.client()
        client.create_collection("crash", dim=DIM, pool_factor=2, max_merge_height=0)

        # Ingest on a thread; record every acknowledgement; SIGKILL after a third of it.
        acknowledged, failure = [], []
        enough = threading.Event()

        def ingest():
            try:
                batches = ([(i, docs[i]) for i in ids[s:s + BATCH]]
                           for s in range(0, DOCUMENTS, BATCH))
                for results in client.upsert_stream("crash", batches, timeout=120):
                    for result in results:
                        if not result.ok:
                            failure.append(result)
                        acknowledged.append(result.id)
                    if len(acknowledged) >= DOCUMENTS // 3:
                        enough.set()
            except tessera.TesseraError as error:
                failure.append(error)
            finally:
                enough.set()

        thread = threading.Thread(target=ingest)
        thread.start()
        self.assertTrue(enough.wait(120), "ingest too slow")
        self.server.kill()
        thread.join(60)
        self.assertFalse(thread.is_alive())
        self.assertTrue(failure and isinstance(failure[-1], tessera.TesseraError),
                        "the stream must fail when the server dies")
        self.assertEqual(failure[-1].code, grpc.StatusCode.UNAVAILABLE, failure[-1])
        self.assertNotIn(False, [isinstance(f, tessera.TesseraError) for f in failure])
        self.assertGreaterEqual(len(acknowledged), DOCUMENTS // 3)
        self.assertLess(len(acknowledged), DOCUMENTS, "killed too late to test anything")
        client.close()

        # Restart on the same data dir: every acknowledged document is there, complete.
        self.server.start()
        client = self.server.client()
        for doc_id in acknowledged:
            self.check_document(client, doc_id, docs[doc_id])

        # Resume: skip what is stored (acknowledged or not), send the rest.
        done = set(acknowledged)
        missing = []
        for doc_id in ids:
            if doc_id in done:
                continue
            try:
                self.check_document(client, doc_id, docs[doc_id])  # written, not acknowledged
            except tessera.TesseraError as error:
                self.assertEqual(error.code, grpc.StatusCode.NOT_FOUND, error)
                missing.append(doc_id)
        sys.stderr.write(f"killed after {len(acknowledged)} acknowledged documents; "
                         f"{DOCUMENTS - len(acknowledged) - len(missing)} more were stored "
                         f"unacknowledged; resuming {len(missing)}\n")
        summary = client.ingest("crash", [(i, docs[i]) for i in missing], batch_size=BATCH,
                                progress=False)
        self.assertEqual(summary.stored, len(missing))
        self.assertFalse(summary.failed)

        # Exactly DOCUMENTS documents, each once, each version 1, and searchable.
        stats = client.collection_info("crash")["stats"]
        self.assertEqual(stats["documents"], DOCUMENTS)
        self.assertEqual(stats["original_tokens"], sum(t.shape[0] for t in docs.values()))
        for doc_id in ids[::10]:
            self.assertEqual(client.get("crash", doc_id)["version"], 1)
        query = e2e_util.normalized(rng, 8, DIM)
        hits = client.search("crash", query, k=1000, exhaustive=True)
        self.assertEqual(len(hits), 1000)
        self.assertEqual(len(set(hits.ids)), 1000)
        self.assertTrue(set(hits.ids) <= set(ids))
        for target in (ids[0], acknowledged[-1], ids[-1]):
            near = e2e_util.query_near(rng, docs[target], 8)
            self.assertEqual(client.search("crash", near, k=1)[0].id, target)
        client.close()

        # A clean restart after the recovery keeps everything too.
        self.server.restart()
        with self.server.client() as client:
            self.assertEqual(client.collection_info("crash")["stats"]["documents"], DOCUMENTS)


if __name__ == "__main__":
    e2e_util.main()
