"""A Tessera cluster as real processes on loopback: etcd, a router and three shard nodes, next to
a standalone server holding the same documents in a collection of the same shard count. Checks
that the router answers exactly as the standalone server does (ids, order, scores; exhaustive and
through the cascade, whose N best nominees the router cuts over all shards), through the
Python client and the `tessera` CLI (create --shards --replicas, stats --json); that searches and
writes go on when a shard node is stopped (SIGSTOP) or SIGKILLed (replicas); that a shard with no live replica fails
with UNAVAILABLE naming it, or returns the other shards' hits with allow_partial_results; that a
replica that missed writes comes back stale, serves no reads, and catches up by a copy from a
serving replica, after which the cluster answers as the standalone server again; and that a
restarted router reads the cluster back from etcd. ClusterFaultsTest: 5,000 documents with a
shard node SIGKILLed mid-ingest (nothing acknowledged lost, catch-up), a SIGKILLed router replaced
by a second one, and etcd stopped and restarted. ClusterLostNodeTest: a lost node's replicas move
to a node that joined later and serve; the lost node's copies are dropped when it returns, and so
are those of a collection dropped while it was down. Snapshots through the router: a 3-shard ×
2-replica collection's snapshot restored by id and, downloaded, on a fresh cluster answers as the
source did; one taken during ingest holds a prefix of the acknowledged batches. Skips without
/usr/bin/etcd."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import sys
import threading
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402
from e2e_util import grpc, tessera  # noqa: E402

DIM = 32
SHARDS = 3
COLLECTION = "papers"


def shard_of(doc_id, shards):
    """The router's and a local collection's document → shard function: FNV-1a 64 of the id's
    bytes, modulo the shard count (an independent implementation of tessera::ShardOf)."""
    h = 14695981039346656037
    for byte in doc_id.encode():
        h = ((h ^ byte) * 1099511628211) % (1 << 64)
    return h % shards


def make_documents(rng, start, count):
    return [{"id": f"doc-{i:05d}", "tokens": e2e_util.normalized(rng, int(rng.integers(8, 33)), DIM)}
            for i in range(start, start + count)]


def start_etcd(add_cleanup):
    """A running etcd, handed to add_cleanup."""
    etcd = e2e_util.Etcd()
    add_cleanup(etcd.cleanup)
    return etcd.start()


def start_router(etcd, add_cleanup, *flags, client_options=None):
    """A running `--role router` server on `etcd`, handed to add_cleanup."""
    router = e2e_util.Server("--role", "router", "--etcd", etcd.endpoint, *flags,
                             client_options=client_options)
    add_cleanup(router.cleanup)
    return router.start()


def start_shard_nodes(etcd, names, add_cleanup, *flags, client_options=None):
    """A `--role shard` node per name on `etcd` (each handed to add_cleanup), once every one of
    them has registered."""
    nodes = []
    for name in names:
        node = e2e_util.Server("--role", "shard", "--node_id", name, "--etcd", etcd.endpoint,
                               *flags, client_options=client_options)
        add_cleanup(node.cleanup)
        nodes.append(node.start())
    deadline = time.monotonic() + 20
    while len(etcd.keys("/tessera/nodes/")) < len(names):
        assert time.monotonic() < deadline, etcd.keys("/tessera/nodes/")
        time.sleep(0.1)
    return nodes


def assert_same_answers(testcase, router, standalone, queries):
    """The router's top 10 equal the standalone server's (ids and scores), exhaustive and through
    the cascade, with no shard missing."""
    for query in queries:
        for options in ({"exhaustive": True}, {}):
            got = router.search(COLLECTION, query, k=10, **options)
            want = standalone.search(COLLECTION, query, k=10, **options)
            testcase.assertEqual(got.ids, want.ids, options)
            np.testing.assert_array_equal(got.scores, want.scores)
            testcase.assertEqual(got.missing_shards, [])


def wait_until_serving(client, collection, timeout=60.0):
    """Until every replica of every shard of `collection` is serving."""
    deadline = time.monotonic() + timeout
    while True:
        shards = client.collection_info(collection)["shards"]
        if all(r["state"] == "serving" for s in shards for r in s["replicas"]):
            return
        assert time.monotonic() < deadline, shards
        time.sleep(0.2)


@unittest.skipUnless(e2e_util.Etcd.available(), "needs /usr/bin/etcd (Debian etcd-server)")
class ClusterTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.etcd = start_etcd(cls.addClassCleanup)
        cls.shards = start_shard_nodes(cls.etcd, [f"shard-{i}" for i in range(3)],
                                       cls.addClassCleanup)
        cls.router = start_router(cls.etcd, cls.addClassCleanup)
        cls.standalone = e2e_util.Server()
        cls.addClassCleanup(cls.standalone.cleanup)
        cls.standalone.start()
        cls.cli = os.path.join(os.path.dirname(cls.router.binary), "tessera")
        cls.rng = np.random.default_rng(7)
        cls.queries = [e2e_util.normalized(cls.rng, 6, DIM) for _ in range(8)]

    def tessera(self, *args, expect_ok=True):
        result = subprocess.run([self.cli, "--addr", self.router.address, *args],
                                capture_output=True, text=True, timeout=60)
        if expect_ok:
            self.assertEqual(result.returncode, 0, result.stderr)
        return result

    def collection_answers(self, client, name, ids, queries):
        """What a restore must reproduce: the count, each id's Get (vectors, attributes,
        version; None when absent) and exhaustive top 15 (ids and scores)."""
        gets = {}
        for doc_id in ids:
            try:
                got = client.get(name, doc_id)
                gets[doc_id] = (got["vectors"].tobytes(), got["attributes"], got["version"])
            except tessera.TesseraError as error:
                self.assertEqual(error.code, grpc.StatusCode.NOT_FOUND, doc_id)
                gets[doc_id] = None
        searches = []
        for query in queries:
            hits = client.search(name, query, k=15, exhaustive=True)
            self.assertEqual(hits.missing_shards, [])
            searches.append([(h.id, h.score) for h in hits])
        return client.count(name), gets, searches

    def test_snapshot_restored_on_a_fresh_cluster(self):
        """A snapshot of a 3-shard × 2-replica collection through the router: listed, downloaded
        as one archive, restored by id on this cluster and from the archive on a fresh cluster
        (new etcd, nodes and router), both answering as the source did at the snapshot (count,
        Gets, exhaustive answers), placed like a create; writes after it are not in it; a corrupt
        or truncated archive is DATA_LOSS naming the file and leaves no collection."""
        router = self.router.client()
        self.addCleanup(router.close)
        name = "snapped"
        router.create_collection(name, DIM, attributes={"n": "int64"}, num_shards=SHARDS,
                                 replicas=2)
        self.addCleanup(router.drop_collection, name)
        rng = np.random.default_rng(18)
        docs = make_documents(rng, 0, 300)
        for i, doc in enumerate(docs):
            doc["attributes"] = {"n": i}
        router.upsert(name, docs)
        router.delete(name, ["doc-00003", "doc-00100"])
        ids = [doc["id"] for doc in docs] + ["doc-00300"]
        want = self.collection_answers(router, name, ids, self.queries)
        self.assertEqual(want[0], 298)

        snapshot = router.create_snapshot(name)
        self.assertTrue(snapshot.startswith(name + "@"), snapshot)
        listed = router.list_snapshots(name)
        self.assertEqual([info["id"] for info in listed], [snapshot])
        self.assertEqual(listed[0]["num_shards"], SHARDS)
        self.assertEqual(listed[0]["collection"], name)
        # Writes after the snapshot are not in it.
        router.upsert(name, make_documents(rng, 300, 20))
        router.delete(name, ["doc-00007"])

        router.restore_snapshot(snapshot, "snapped-copy")
        self.addCleanup(router.drop_collection, "snapped-copy")
        self.assertEqual(self.collection_answers(router, "snapped-copy", ids, self.queries), want)
        shards = router.collection_info("snapped-copy")["shards"]
        self.assertEqual([len(shard["replicas"]) for shard in shards], [2] * SHARDS)
        with self.assertRaises(tessera.TesseraError) as taken:
            router.restore_snapshot(snapshot, "snapped-copy")
        self.assertEqual(taken.exception.code, grpc.StatusCode.ALREADY_EXISTS)

        work = tempfile.mkdtemp(prefix="tessera-cluster-snapshot-")
        self.addCleanup(shutil.rmtree, work, True)
        archive = os.path.join(work, "snapped.tsnap")
        size = router.download_snapshot(snapshot, archive)
        self.assertEqual(size, os.path.getsize(archive))
        self.assertGreater(size, listed[0]["bytes"])

        # A fresh cluster: its own etcd, three nodes and a router.
        etcd = start_etcd(self.addCleanup)
        start_shard_nodes(etcd, [f"fresh-{i}" for i in range(3)], self.addCleanup)
        other = start_router(etcd, self.addCleanup).client()
        self.addCleanup(other.close)
        info = other.restore_snapshot_from_file(archive, "restored")
        self.assertEqual(info["id"], snapshot)
        self.assertEqual(self.collection_answers(other, "restored", ids, self.queries), want)
        shards = other.collection_info("restored")["shards"]
        self.assertEqual([len(shard["replicas"]) for shard in shards], [2] * SHARDS)
        # The restored collection takes writes like any other.
        other.upsert("restored", make_documents(rng, 400, 5))
        self.assertEqual(other.count("restored"), want[0] + 5)

        with open(archive, "rb") as f:
            data = f.read()
        # The last shard's archive ends 8 bytes (the end marker) before the end; its last file
        # ends 8 bytes before that.
        flipped = bytearray(data)
        flipped[-17] ^= 0x40
        broken = os.path.join(work, "broken.tsnap")
        with open(broken, "wb") as f:
            f.write(flipped)
        with self.assertRaises(tessera.TesseraError) as corrupt:
            other.restore_snapshot_from_file(broken, "broken")
        self.assertEqual(corrupt.exception.code, grpc.StatusCode.DATA_LOSS)
        self.assertIn("file '", corrupt.exception.message)
        self.assertIn("crc-32", corrupt.exception.message.lower())
        with open(broken, "wb") as f:
            f.write(data[:len(data) - 30])
        with self.assertRaises(tessera.TesseraError) as truncated:
            other.restore_snapshot_from_file(broken, "broken")
        self.assertEqual(truncated.exception.code, grpc.StatusCode.DATA_LOSS)
        self.assertIn("truncated", truncated.exception.message)
        self.assertIn("file '", truncated.exception.message)
        self.assertNotIn("broken", other.list_collections())
        self.assertNotIn("/tessera/collections/broken", etcd.keys("/tessera/collections/"))

        # The CLI through the router.
        listed_cli = json.loads(self.tessera("snapshot", "list", name, "--json").stdout)
        self.assertEqual([info["id"] for info in listed_cli["snapshots"]], [snapshot])
        self.tessera("snapshot", "restore", snapshot, "snapped-cli")
        self.addCleanup(router.drop_collection, "snapped-cli")
        self.assertEqual(router.count("snapped-cli"), want[0])

        router.delete_snapshot(snapshot)
        self.assertEqual(router.list_snapshots(name), [])
        with self.assertRaises(tessera.TesseraError) as gone:
            router.delete_snapshot(snapshot)
        self.assertEqual(gone.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_snapshot_during_ingest_is_a_prefix_of_acknowledged_writes(self):
        """A snapshot taken through the router while batches are upserted through it holds
        exactly the first j batches: every batch acknowledged before the snapshot was asked for,
        none begun after it returned, and no batch in part (every shard at one cut)."""
        router = self.router.client()
        self.addCleanup(router.close)
        name = "ingesting"
        router.create_collection(name, DIM, num_shards=SHARDS, replicas=2)
        self.addCleanup(router.drop_collection, name)
        rng = np.random.default_rng(19)
        batches = [make_documents(rng, 40 * b, 40) for b in range(60)]
        acked = []    # batch index → time.monotonic() of its acknowledgement
        started = []  # batch index → time.monotonic() before it was sent
        errors = []

        def ingest():
            writer = self.router.client()
            try:
                for batch in batches:
                    started.append(time.monotonic())
                    writer.upsert(name, batch, batch_size=len(batch))
                    acked.append(time.monotonic())
            except Exception as error:  # noqa: BLE001 (reported below)
                errors.append(error)
            finally:
                writer.close()

        thread = threading.Thread(target=ingest)
        thread.start()
        while len(acked) < 10:
            time.sleep(0.01)
        asked = time.monotonic()
        snapshot = router.create_snapshot(name)
        returned = time.monotonic()
        thread.join()
        self.assertEqual(errors, [])
        self.assertEqual(router.count(name), 40 * len(batches))
        router.restore_snapshot(snapshot, "ingesting-copy")
        self.addCleanup(router.drop_collection, "ingesting-copy")
        count = router.count("ingesting-copy")
        self.assertEqual(count % 40, 0, count)
        j = count // 40
        self.assertGreaterEqual(j, sum(1 for t in acked if t < asked))
        self.assertLessEqual(j, sum(1 for t in started if t < returned))
        self.assertLess(j, len(batches))  # the ingest went on after the cut
        ids = [doc["id"] for batch in batches[:j + 1] for doc in batch]
        present = []
        for doc_id in ids:
            try:
                router.get("ingesting-copy", doc_id)
                present.append(doc_id)
            except tessera.TesseraError as error:
                self.assertEqual(error.code, grpc.StatusCode.NOT_FOUND, doc_id)
        self.assertEqual(present, ids[:40 * j])

    def test_attributes_groups_counts_through_the_router(self):
        """Count, scroll, delete by filter, attributes in hits and grouped results through the
        router answer as the standalone server does (ids, order, scores, values)."""
        router = self.router.client()
        standalone = self.standalone.client()
        self.addCleanup(router.close)
        self.addCleanup(standalone.close)
        name = "facets"
        attributes = {"doc": "string", "page": "int64", "lang": "string"}
        router.create_collection(name, DIM, attributes=attributes, num_shards=SHARDS, replicas=2)
        standalone.create_collection(name, DIM, attributes=attributes, num_shards=SHARDS)
        rng = np.random.default_rng(34)
        docs = []
        for i in range(300):
            attrs = {"doc": f"pdf-{i // 6:02d}", "page": i % 6}
            if i % 5:
                attrs["lang"] = ["en", "en-GB", "de"][i % 3]
            docs.append({"id": f"p-{i:04d}", "tokens": e2e_util.normalized(rng, 12, DIM),
                         "attributes": attrs})
        self.assertTrue(all(r.ok for r in router.upsert(name, docs, batch_size=50)))
        self.assertTrue(all(r.ok for r in standalone.upsert(name, docs, batch_size=50)))
        filters = [None, [("lang", "prefix", "en")], [("lang", "missing")],
                   {"any_of": [[("page", "==", 0)], [("lang", "==", "de"), ("page", ">", 3)]]},
                   [("page", "<", 4), {"none_of": [[("doc", "in", ["pdf-01", "pdf-02"])]]}]]

        def same_hits(got, want):
            self.assertEqual([h.id for h in got], [h.id for h in want])
            self.assertEqual([h.score for h in got], [h.score for h in want])
            self.assertEqual([h.attributes for h in got], [h.attributes for h in want])

        def same_answers():
            for filter_ in filters:
                self.assertEqual(router.count(name, filter=filter_),
                                 standalone.count(name, filter=filter_))
                after = None
                while True:
                    got = router.scroll(name, filter=filter_, after=after, limit=7,
                                        with_attributes=True)
                    want = standalone.scroll(name, filter=filter_, after=after, limit=7,
                                             with_attributes=True)
                    self.assertEqual(got, want, (filter_, after))
                    if want.next_after is None:
                        break
                    after = want.next_after
            for query in self.queries[:4]:
                for options in ({"exhaustive": True}, {}, {"num_candidates": 30}):
                    for group_by, group_size, groups in (("doc", 3, 5), ("lang", 4, 3)):
                        got = router.search(name, query, group_by=group_by,
                                            group_size=group_size, groups=groups,
                                            with_attributes=True, **options)
                        want = standalone.search(name, query, group_by=group_by,
                                                 group_size=group_size, groups=groups,
                                                 with_attributes=True, **options)
                        self.assertEqual([g.value for g in got.groups],
                                         [g.value for g in want.groups])
                        self.assertEqual(len(want.groups), groups)
                        for g, w in zip(got.groups, want.groups):
                            same_hits(g.hits, w.hits)
                    same_hits(router.search(name, query, k=10, with_attributes=["doc"], **options),
                              standalone.search(name, query, k=10, with_attributes=["doc"],
                                                **options))

        same_answers()
        gone = {"any_of": [[("doc", "prefix", "pdf-1")], [("lang", "==", "de"), ("page", "==", 5)]]}
        deleted = standalone.delete(name, filter=gone)
        self.assertGreater(deleted, 0)
        self.assertEqual(router.delete(name, filter=gone), deleted)
        self.assertEqual(router.count(name), 300 - deleted)
        self.assertEqual(router.count(name, filter=gone), 0)
        same_answers()
        router.drop_collection(name)
        standalone.drop_collection(name)

    def test_hybrid_through_the_router(self):
        """Sparse-only and hybrid (dense + sparse, RRF or score fusion, with or without a MaxSim
        rerank, filtered, grouped, with attributes) searches through the router answer as the
        standalone server does: ids, order, scores, lane scores — the router gathers the
        collection's BM25 statistics from every shard before it searches. Again after deletes and
        upserts that change the statistics."""
        router = self.router.client()
        standalone = self.standalone.client()
        self.addCleanup(router.close)
        self.addCleanup(standalone.close)
        name = "hybrid"
        attributes = {"doc": "string", "page": "int64"}
        router.create_collection(name, DIM, attributes=attributes, num_shards=SHARDS, replicas=2,
                                 sparse=True)
        standalone.create_collection(name, DIM, attributes=attributes, num_shards=SHARDS,
                                     sparse=True)
        rng = np.random.default_rng(41)

        def terms():
            n = int(rng.integers(1, 10))
            indices = rng.choice(80, size=n, replace=False)
            return (indices.tolist(), rng.integers(1, 5, size=n).astype(float).tolist())

        docs = []
        for i in range(240):
            doc = {"id": f"h-{i:04d}", "tokens": e2e_util.normalized(rng, 10, DIM),
                   "attributes": {"doc": f"pdf-{i // 4:02d}", "page": i % 4}}
            if i % 9:
                doc["sparse"] = terms()
            docs.append(doc)
        self.assertTrue(all(r.ok for r in router.upsert(name, docs, batch_size=40)))
        self.assertTrue(all(r.ok for r in standalone.upsert(name, docs, batch_size=40)))
        sparse_queries = [terms() for _ in range(4)]

        def same_hits(got, want, what):
            self.assertEqual([h.id for h in got], [h.id for h in want], what)
            self.assertEqual([h.score for h in got], [h.score for h in want], what)
            self.assertEqual([h.dense_score for h in got], [h.dense_score for h in want], what)
            self.assertEqual([h.sparse_score for h in got], [h.sparse_score for h in want], what)
            self.assertEqual([h.attributes for h in got], [h.attributes for h in want], what)

        def same_answers():
            searched = 0
            for query, sparse_query in zip(self.queries[:4], sparse_queries):
                for options in ({"query": None}, {}, {"fusion": "score"},
                                {"rerank": True, "fusion_candidates": 25},
                                {"sparse_weight": 0.5, "rrf_k": 10.0, "exhaustive": True},
                                {"filter": [("page", "<", 3)], "with_attributes": True},
                                {"group_by": "doc", "group_size": 2, "groups": 4},
                                {"query": None, "group_by": "page", "group_size": 3}):
                    options = dict(options)
                    dense = options.pop("query", query)
                    got = router.search(name, dense, k=8, sparse_query=sparse_query, **options)
                    want = standalone.search(name, dense, k=8, sparse_query=sparse_query,
                                             **options)
                    same_hits(got, want, options)
                    self.assertEqual([g.value for g in got.groups],
                                     [g.value for g in want.groups], options)
                    for g, w in zip(got.groups, want.groups):
                        same_hits(g.hits, w.hits, options)
                    searched += len(want) + len(want.groups)
            self.assertGreater(searched, 0)

        same_answers()
        gone = [d["id"] for d in docs[::7]]
        self.assertEqual(router.delete(name, gone), standalone.delete(name, gone))
        changed = [dict(d, sparse=terms()) for d in docs[1::11]]
        self.assertTrue(all(r.ok for r in router.upsert(name, changed)))
        self.assertTrue(all(r.ok for r in standalone.upsert(name, changed)))
        same_answers()
        router.drop_collection(name)
        standalone.drop_collection(name)

    def test_cli_ingest_through_the_router(self):
        """`tessera ingest` against a router: same summary, journal and resume as standalone."""
        work = self.router.work_dir
        arrays = {f"ing-{i:03d}": e2e_util.normalized(self.rng, 10 + i % 7, DIM)
                  for i in range(60)}
        npz = os.path.join(work, "docs.npz")
        np.savez(npz, **arrays)
        journal = os.path.join(work, "docs.journal")
        self.tessera("collections", "create", "ingested", "--dim", str(DIM), "--shards", "2",
                     "--replicas", "2")
        run = ["ingest", "ingested", npz, "--streams", "2", "--batch", "8", "--journal", journal,
               "--json"]
        first = json.loads(self.tessera(*run).stdout)
        self.assertEqual((first["documents"], first["stored"], first["failed"]), (60, 60, 0))
        again = json.loads(self.tessera(*run).stdout)
        self.assertEqual((again["stored"], again["skipped"]), (0, 60))
        self.assertEqual(self.stats_of("ingested")["documents"], 60)
        self.tessera("collections", "drop", "ingested")

    def assert_same_answers(self, router, standalone, **options):
        for query in self.queries:
            got = router.search(COLLECTION, query, k=10, **options)
            want = standalone.search(COLLECTION, query, k=10, **options)
            self.assertEqual(got.ids, want.ids)
            np.testing.assert_array_equal(got.scores, want.scores)
            self.assertEqual(got.missing_shards, [])
            self.assertGreaterEqual(got.timings["fanout_ms"], 0.0)

    def stats_of(self, name):
        return json.loads(self.tessera("stats", name, "--json").stdout)

    def stats(self):
        return self.stats_of(COLLECTION)

    def wait_for(self, done, timeout=30.0):
        """Polls stats until done({(shard, node): state}) holds; returns that map."""
        deadline = time.monotonic() + timeout
        while True:
            states = {(s["shard"], r["node_id"]): r["state"]
                      for s in self.stats()["shards"] for r in s["replicas"]}
            if done(states):
                return states
            self.assertLess(time.monotonic(), deadline, states)
            time.sleep(0.2)

    def wait_for_states(self, node, state, timeout=20.0):
        deadline = time.monotonic() + timeout
        while True:
            shards = self.stats()["shards"]
            states = [r["state"] for s in shards for r in s["replicas"] if r["node_id"] == node]
            if states and all(s == state for s in states):
                return shards
            self.assertLess(time.monotonic(), deadline, f"{node}: {states}, want {state}")
            time.sleep(0.2)

    def test_cluster(self):
        router = self.router.client()
        standalone = self.standalone.client()
        self.addCleanup(router.close)
        self.addCleanup(standalone.close)

        # Placement: 3 shards × 2 replicas over 3 nodes, through the CLI.
        created = json.loads(self.tessera("collections", "create", COLLECTION, "--dim", str(DIM),
                                          "--shards", str(SHARDS), "--replicas", "2",
                                          "--json").stdout)
        self.assertEqual(created["num_shards"], SHARDS)
        standalone.create_collection(COLLECTION, DIM, num_shards=SHARDS)
        refused = self.tessera("collections", "create", "wide", "--dim", "8", "--replicas", "4",
                               expect_ok=False)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("FAILED_PRECONDITION", refused.stderr)
        self.assertIn("needs as many live shard nodes, 3 live", refused.stderr)
        again = self.tessera("collections", "create", COLLECTION, "--dim", "8", expect_ok=False)
        self.assertIn("ALREADY_EXISTS", again.stderr)
        self.assertIn(COLLECTION, router.list_collections())
        stats = self.stats()
        self.assertEqual(len(stats["shards"]), SHARDS)
        for shard in stats["shards"]:
            nodes = [r["node_id"] for r in shard["replicas"]]
            self.assertEqual(len(set(nodes)), 2, shard)
            self.assertEqual({r["state"] for r in shard["replicas"]}, {"serving"})

        # The same documents through both: the same answers, exactly.
        docs = make_documents(self.rng, 0, 240)
        self.assertTrue(all(r.ok for r in router.upsert(COLLECTION, docs, batch_size=50)))
        self.assertTrue(all(r.ok for r in standalone.upsert(COLLECTION, docs, batch_size=50)))
        self.assertEqual(self.stats()["documents"], 240)
        self.assert_same_answers(router, standalone, exhaustive=True)
        self.assert_same_answers(router, standalone, num_candidates=300)
        # The cascade: the router cuts the shards' nominees where the standalone server does.
        self.assert_same_answers(router, standalone)
        self.assert_same_answers(router, standalone, num_candidates=30)
        got, want = router.get(COLLECTION, "doc-00017"), standalone.get(COLLECTION, "doc-00017")
        np.testing.assert_array_equal(got["vectors"], want["vectors"])
        self.assertEqual(got["version"], want["version"])
        gone = [f"doc-{i:05d}" for i in range(0, 240, 24)] + ["never-stored"]
        self.assertEqual(router.delete(COLLECTION, gone), standalone.delete(COLLECTION, gone))
        self.assert_same_answers(router, standalone, exhaustive=True)
        with self.assertRaises(tessera.TesseraError) as missing:
            router.get(COLLECTION, "doc-00000")
        self.assertEqual(missing.exception.code, grpc.StatusCode.NOT_FOUND)

        # One node stopped (SIGSTOP: its connections stay open, it answers nothing): a search
        # that picks its replica gives it a share of the deadline, then asks the other replica.
        # Which replica a search tries first rotates, and concurrent shard calls share the turn
        # counter, so a few queries may all pick the other replicas: up to 16, until one has met
        # the stopped node.
        self.shards[0].process.send_signal(signal.SIGSTOP)
        try:
            for query in (self.queries * 2)[:16]:
                got = router.search(COLLECTION, query, k=10, exhaustive=True, timeout=4.0)
                want = standalone.search(COLLECTION, query, k=10, exhaustive=True)
                self.assertEqual(got.ids, want.ids)
                if "shard node tried last for a while" in self.router.log():
                    break
        finally:
            self.shards[0].process.send_signal(signal.SIGCONT)
        # The calls after the first timeout try the stopped node last (for a few seconds).
        self.assertIn("shard node tried last for a while", self.router.log())

        # One node SIGKILLed: every shard still has a replica. Reads retry on it at once (the
        # dead node's lease has not expired yet), writes are acknowledged by the live replicas.
        self.shards[1].kill()
        self.assert_same_answers(router, standalone, exhaustive=True)
        more = make_documents(self.rng, 240, 30)
        self.assertTrue(all(r.ok for r in router.upsert(COLLECTION, more, batch_size=10)))
        self.assertTrue(all(r.ok for r in standalone.upsert(COLLECTION, more, batch_size=10)))
        self.assert_same_answers(router, standalone, exhaustive=True)
        shards = self.wait_for_states("shard-1", "down")
        self.assert_same_answers(router, standalone, num_candidates=300)
        self.assert_same_answers(router, standalone)

        # A second node down: the shard whose replicas were both on them has none left.
        self.shards[2].kill()
        lost = [s["shard"] for s in shards
                if {r["node_id"] for r in s["replicas"]} == {"shard-1", "shard-2"}]
        self.assertEqual(len(lost), 1, shards)
        lost = lost[0]
        deadline = time.monotonic() + 20
        while True:  # until the router sees the node down (no retry is then possible)
            try:
                router.search(COLLECTION, self.queries[0], k=10)
            except tessera.TesseraError as error:
                self.assertEqual(error.code, grpc.StatusCode.UNAVAILABLE)
                self.assertIn(f"shard {lost} of collection '{COLLECTION}' unavailable",
                              str(error))
                break
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.2)
        for query in self.queries:
            partial = router.search(COLLECTION, query, k=10, exhaustive=True,
                                    allow_partial_results=True)
            self.assertEqual(partial.missing_shards, [lost])
            everything = standalone.search(COLLECTION, query, k=300, exhaustive=True)
            want = [i for i in everything.ids if shard_of(i, SHARDS) != lost][:10]
            self.assertEqual(partial.ids, want)
        in_lost = next(d["id"] for d in more if shard_of(d["id"], SHARDS) == lost)
        with self.assertRaises(tessera.TesseraError) as unavailable:
            router.get(COLLECTION, in_lost)
        self.assertEqual(unavailable.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn(f"shard {lost}", str(unavailable.exception))

        # shard-1 back on its data dir: its replicas missed acknowledged writes, so they come
        # back stale (no reads) and catch up by a copy from a serving replica of their shard —
        # except in the lost shard, whose other replica (shard-2) is still down.
        self.shards[1].start()
        self.wait_for(
            lambda st: all(v == ("stale" if shard == lost else "serving")
                           for (shard, node), v in st.items() if node == "shard-1"))
        with self.assertRaises(tessera.TesseraError) as still:
            router.search(COLLECTION, self.queries[0], k=10)
        self.assertEqual(still.exception.code, grpc.StatusCode.UNAVAILABLE)

        # shard-2 back: it holds every write acknowledged for the lost shard (the writes there
        # were refused while it was down), so it serves at once and is the source of shard-1's
        # copy; its own replicas elsewhere missed writes and catch up too. Then the cluster
        # answers as the standalone server again, and takes writes on every shard.
        self.shards[2].start()
        self.wait_for(lambda st: all(v == "serving" for v in st.values()), timeout=60)
        self.assert_same_answers(router, standalone, exhaustive=True)
        last = make_documents(self.rng, 270, 30)
        self.assertTrue(all(r.ok for r in router.upsert(COLLECTION, last, batch_size=10)))
        self.assertTrue(all(r.ok for r in standalone.upsert(COLLECTION, last, batch_size=10)))
        self.assert_same_answers(router, standalone, exhaustive=True)
        self.assert_same_answers(router, standalone)
        self.assert_same_answers(router, standalone, num_candidates=30)
        self.assertEqual(self.stats()["documents"],
                         standalone.collection_info(COLLECTION)["stats"]["documents"])
        self.assertIn("replica caught up", self.router.log())

        # A new router reads the cluster back from etcd.
        self.assertEqual(self.router.stop(), 0)
        self.router.start()
        with self.router.client() as fresh:
            self.assertIn(COLLECTION, fresh.list_collections())
            self.assertEqual(len(fresh.collection_info(COLLECTION)["shards"]), SHARDS)


@unittest.skipUnless(e2e_util.Etcd.available(), "needs /usr/bin/etcd (Debian etcd-server)")
class ClusterFaultsTest(unittest.TestCase):
    """5,000 documents through a router while a shard node is SIGKILLed mid-ingest: nothing
    acknowledged is lost and the answers equal a standalone server's; a SIGKILLed router is
    replaced by a second one serving the same data; with etcd stopped, searches and writes go on
    over the cached shard map (a write that needs no change to it, as here, needs no etcd), what
    must change the map fails with UNAVAILABLE naming etcd, and all recovers when it is back."""

    DOCS = 5000

    def setUp(self):
        self.etcd = start_etcd(self.addCleanup)
        self.nodes = start_shard_nodes(self.etcd, [f"node-{i}" for i in range(3)],
                                       self.addCleanup)
        self.routers = [start_router(self.etcd, self.addCleanup) for _ in range(2)]
        self.standalone = e2e_util.Server()
        self.addCleanup(self.standalone.cleanup)
        self.standalone.start()

    def test_faults_during_ingest(self):
        rng = np.random.default_rng(11)
        docs = make_documents(rng, 0, self.DOCS)
        queries = [e2e_util.query_near(rng, docs[int(i)]["tokens"], 6)
                   for i in rng.integers(self.DOCS, size=6)]
        first, second = (router.client() for router in self.routers)
        standalone = self.standalone.client()
        for client in (first, second, standalone):
            self.addCleanup(client.close)
        # Stage 1 the exact scan: each shard (~17,000 vectors) would otherwise train a centroid
        # index once it passes 16,384 vectors, on the documents it holds at that moment, which
        # the faults make differ between the cluster and the standalone server, and the cascades'
        # answers with them.
        first.create_collection(COLLECTION, DIM, num_shards=SHARDS, replicas=2, candidates="Flat")
        standalone.create_collection(COLLECTION, DIM, num_shards=SHARDS, candidates="Flat")
        self.assertTrue(all(r.ok for r in standalone.upsert(COLLECTION, docs, batch_size=100)))

        # Ingest through the first router; SIGKILL a shard node once a third is acknowledged.
        acknowledged, refused = set(), []
        for start in range(0, self.DOCS, 100):
            if start == 1700:
                self.nodes[1].kill()
            for result in first.upsert(COLLECTION, docs[start:start + 100], batch_size=50):
                if result.ok:
                    acknowledged.add(result.id)
                else:  # a write in flight when the node died: UNAVAILABLE, retryable
                    self.assertEqual(result.status, grpc.StatusCode.UNAVAILABLE, result.message)
                    refused.append(result.id)
        by_id = {d["id"]: d for d in docs}
        retried = first.upsert(COLLECTION, [by_id[i] for i in refused], batch_size=50)
        self.assertTrue(all(r.ok for r in retried), [r.message for r in retried if not r.ok])
        acknowledged.update(refused)
        self.assertEqual(len(acknowledged), self.DOCS)

        # Nothing acknowledged is lost; the answers are the standalone server's.
        self.assertEqual(first.collection_info(COLLECTION)["stats"]["documents"], self.DOCS)
        for i in sorted(acknowledged)[::7]:
            got = first.get(COLLECTION, i)
            np.testing.assert_array_equal(
                got["vectors"], standalone.get(COLLECTION, i)["vectors"])
        assert_same_answers(self, first, standalone, queries)

        # The node comes back, catches up and serves.
        states = {r["state"] for s in first.collection_info(COLLECTION)["shards"]
                  for r in s["replicas"] if r["node_id"] == "node-1"}
        self.assertNotIn("serving", states)
        self.nodes[1].start()
        wait_until_serving(first, COLLECTION)
        # Either router may run the copy (the other then finds it running and leaves it).
        self.assertTrue(any("replica caught up" in r.log() for r in self.routers),
                        [r.log()[-2000:] for r in self.routers])
        assert_same_answers(self, first, standalone, queries)

        # The first router SIGKILLed: the second serves the same data.
        self.routers[0].kill()
        assert_same_answers(self, second, standalone, queries)

        # etcd stopped: searches and writes over the cached map go on; creating a collection
        # (a change to the map) fails with UNAVAILABLE naming etcd.
        self.etcd.process.kill()
        self.etcd.process.wait()
        try:
            assert_same_answers(self, second, standalone, queries)
            extra = make_documents(rng, self.DOCS, 20)
            self.assertTrue(all(r.ok for r in second.upsert(COLLECTION, extra)))
            self.assertTrue(all(r.ok for r in standalone.upsert(COLLECTION, extra)))
            assert_same_answers(self, second, standalone, queries)
            with self.assertRaises(tessera.TesseraError) as down:
                second.create_collection("later", DIM, replicas=2, timeout=30)
            self.assertEqual(down.exception.code, grpc.StatusCode.UNAVAILABLE)
            self.assertIn("etcd", str(down.exception))
        finally:
            self.etcd.start()
        # etcd back (same data): the cluster takes new collections again.
        deadline = time.monotonic() + 30
        while True:
            try:
                second.create_collection("later", DIM, replicas=2)
                break
            except tessera.TesseraError as error:
                self.assertEqual(error.code, grpc.StatusCode.UNAVAILABLE, str(error))
                self.assertLess(time.monotonic(), deadline, str(error))
                time.sleep(0.5)
        self.assertIn("later", second.list_collections())
        assert_same_answers(self, second, standalone, queries)


@unittest.skipUnless(e2e_util.Etcd.available(), "needs /usr/bin/etcd (Debian etcd-server)")
class ClusterLostNodeTest(unittest.TestCase):
    """A shard node lost for good: once it has been down for --move_lost_replicas_after_seconds,
    its replicas move to a node that joined later (the live node holding the fewest), are copied
    from the serving replicas and serve; the answers equal a standalone server's before, during
    and after, and writes go on. When the lost node comes back, the router drops the replicas
    that moved away from it, and its data no longer counts anywhere. A collection dropped while a
    node is down keeps its name taken (FAILED_PRECONDITION) until that node is back and its
    replicas are dropped there too."""

    def setUp(self):
        self.etcd = start_etcd(self.addCleanup)
        self.nodes = start_shard_nodes(self.etcd, [f"node-{i}" for i in range(3)],
                                       self.addCleanup)
        self.router = start_router(self.etcd, self.addCleanup,
                                   "--move_lost_replicas_after_seconds", "2")
        self.standalone = e2e_util.Server()
        self.addCleanup(self.standalone.cleanup)
        self.standalone.start()

    def placement(self, client):
        """{shard: {node_id: state}} of the collection, as the router reports it."""
        return {s["shard"]: {r["node_id"]: r["state"] for r in s["replicas"]}
                for s in client.collection_info(COLLECTION)["shards"]}

    def test_replicas_of_a_lost_node_move_to_a_later_node(self):
        rng = np.random.default_rng(23)
        docs = make_documents(rng, 0, 600)
        queries = [e2e_util.query_near(rng, docs[int(i)]["tokens"], 6)
                   for i in rng.integers(len(docs), size=6)]
        router, standalone = self.router.client(), self.standalone.client()
        self.addCleanup(router.close)
        self.addCleanup(standalone.close)
        router.create_collection(COLLECTION, DIM, num_shards=SHARDS, replicas=2)
        standalone.create_collection(COLLECTION, DIM, num_shards=SHARDS)
        for client in (router, standalone):
            self.assertTrue(all(r.ok for r in client.upsert(COLLECTION, docs, batch_size=100)))
        lost = {s for s, replicas in self.placement(router).items() if "node-1" in replicas}
        self.assertEqual(len(lost), 2)  # 3 shards × 2 replicas over 3 nodes

        # node-1 is lost; node-3 joins. Writes and searches go on throughout.
        self.nodes[1].kill()
        later = e2e_util.Server("--role", "shard", "--node_id", "node-3", "--etcd",
                                self.etcd.endpoint)
        self.addCleanup(later.cleanup)
        later.start()
        more = make_documents(rng, len(docs), 60)
        for client in (router, standalone):
            self.assertTrue(all(r.ok for r in client.upsert(COLLECTION, more[:30])))
        assert_same_answers(self, router, standalone, queries)
        deadline = time.monotonic() + 90  # node-1's lease (10 s), 2 s down, the copies
        while True:
            placement = self.placement(router)
            if (all("node-1" not in replicas for replicas in placement.values())
                    and all(state == "serving" for replicas in placement.values()
                            for state in replicas.values())):
                break
            self.assertLess(time.monotonic(), deadline, (placement, self.router.log()[-3000:]))
            time.sleep(0.3)
        # node-3 (no replicas) took both of node-1's; the others kept theirs.
        self.assertEqual({s for s, replicas in placement.items() if "node-3" in replicas}, lost)
        self.assertTrue(all(len(replicas) == 2 for replicas in placement.values()))
        self.assertEqual(self.router.log().count("replica of a lost node moved"), 2)
        for client in (router, standalone):
            self.assertTrue(all(r.ok for r in client.upsert(COLLECTION, more[30:])))
        self.assertEqual(router.collection_info(COLLECTION)["stats"]["documents"],
                         len(docs) + len(more))
        # Reads rotate over the replicas: node-3 answers about half of these.
        assert_same_answers(self, router, standalone, queries)
        # node-1 comes back with its old replicas on disk: the router drops them there.
        self.nodes[1].start()
        deadline = time.monotonic() + 60
        while self.router.log().count("replica moved away from its node dropped there") < 2:
            self.assertLess(time.monotonic(), deadline, self.router.log()[-3000:])
            time.sleep(0.3)
        self.assertNotIn("node-1", {n for replicas in self.placement(router).values()
                                    for n in replicas})
        assert_same_answers(self, router, standalone, queries)


    def test_a_drop_finishes_when_a_down_node_comes_back(self):
        rng = np.random.default_rng(29)
        router = self.router.client()
        self.addCleanup(router.close)
        router.create_collection("gone", DIM, num_shards=SHARDS, replicas=2)
        self.assertTrue(all(r.ok for r in router.upsert("gone", make_documents(rng, 0, 60))))
        # node-2 is killed and the collection dropped at once (its registration has not expired:
        # the router tries it and fails); the name stays taken until node-2's replicas are gone.
        self.nodes[2].kill()
        router.drop_collection("gone")
        self.assertNotIn("gone", router.list_collections())
        with self.assertRaises(tessera.TesseraError) as taken:
            router.create_collection("gone", DIM, num_shards=SHARDS, replicas=2)
        self.assertEqual(taken.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("still being dropped", str(taken.exception))
        self.assertIn("node-2", str(taken.exception))
        # Back before it counts as lost: the router drops its replicas there, and the name is free.
        self.nodes[2].start()
        deadline = time.monotonic() + 60
        while "dropped on every node" not in self.router.log():
            self.assertLess(time.monotonic(), deadline, self.router.log()[-3000:])
            time.sleep(0.2)
        self.assertEqual(self.etcd.keys("/tessera/collections/"), [])
        router.create_collection("gone", DIM, num_shards=SHARDS, replicas=2)
        docs = make_documents(rng, 100, 30)
        self.assertTrue(all(r.ok for r in router.upsert("gone", docs)))
        self.assertEqual(router.collection_info("gone")["stats"]["documents"], 30)
        hits = router.search("gone", e2e_util.query_near(rng, docs[7]["tokens"], 6), k=1)
        self.assertEqual(hits.ids, [docs[7]["id"]])


@unittest.skipUnless(e2e_util.Etcd.available() and shutil.which("openssl"),
                     "needs /usr/bin/etcd (Debian etcd-server) and openssl")
class ClusterTlsTest(unittest.TestCase):
    """Shard nodes that serve mutual TLS: a router with --cluster_tls_ca (and its own certificate)
    creates, writes and searches through them, and a stale replica catches up by a copy between
    the nodes over TLS; a router without it cannot reach them."""

    def test_nodes_over_tls(self):
        d = tempfile.mkdtemp(prefix="tessera-cluster-tls-")
        self.addCleanup(lambda: shutil.rmtree(d, ignore_errors=True))

        def openssl(*args):
            subprocess.run(["openssl", *args], cwd=d, check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
                "-subj", "/CN=tessera-cluster-ca")
        with open(os.path.join(d, "node.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        openssl("req", *ec, "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=node")
        openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", "node.pem", "-days", "2", "-extfile", "node.ext")
        ca, cert, key = (os.path.join(d, name) for name in ("ca.pem", "node.pem", "node.key"))
        tls = ["--tls_cert", cert, "--tls_key", key, "--cluster_tls_ca", ca]
        client_tls = dict(tls_root_cert=ca, tls_client_cert=cert, tls_client_key=key)

        etcd = start_etcd(self.addCleanup)
        nodes = start_shard_nodes(etcd, ["t0", "t1"], self.addCleanup, *tls, "--tls_client_ca",
                                  ca, client_options=client_tls)
        router = start_router(etcd, self.addCleanup, *tls, client_options=dict(tls_root_cert=ca))
        plain = start_router(etcd, self.addCleanup)

        rng = np.random.default_rng(3)
        docs = make_documents(rng, 0, 200)
        with router.client() as client:
            client.create_collection("c", DIM, num_shards=2, replicas=2)
            self.assertTrue(all(r.ok for r in client.upsert("c", docs[:100])))
            nodes[1].kill()  # its replicas miss the next writes, then catch up over TLS
            self.assertTrue(all(r.ok for r in client.upsert("c", docs[100:])))
            nodes[1].start()
            wait_until_serving(client, "c")
            self.assertIn("replica caught up", router.log())
            hits = client.search("c", docs[150]["tokens"], k=3, exhaustive=True)
            self.assertEqual(hits.ids[0], docs[150]["id"])
            self.assertEqual(client.collection_info("c")["stats"]["documents"], 200)
        with plain.client() as client:  # plaintext to TLS nodes: no answer
            with self.assertRaises(tessera.TesseraError) as refused:
                client.search("c", docs[3]["tokens"], k=3, timeout=10)
            self.assertEqual(refused.exception.code, grpc.StatusCode.UNAVAILABLE)


@unittest.skipUnless(e2e_util.Etcd.available(), "needs /usr/bin/etcd (Debian etcd-server)")
class ClusterAuthTest(unittest.TestCase):
    """Shard nodes with API keys take calls only from routers that present the cluster key."""

    def test_router_needs_the_cluster_key(self):
        etcd = start_etcd(self.addCleanup)
        keys_dir = tempfile.mkdtemp(prefix="tessera-cluster-keys-")
        self.addCleanup(lambda: __import__("shutil").rmtree(keys_dir, ignore_errors=True))
        cluster_key, reader_key = "cluster-secret-1", "reader-secret-2"
        api_keys = os.path.join(keys_dir, "api_keys")
        with open(api_keys, "w") as f:
            for key, scopes in ((cluster_key, "admin"), (reader_key, "read")):
                f.write(f"sha256:{hashlib.sha256(key.encode()).hexdigest()} {scopes}\n")
        key_file = os.path.join(keys_dir, "cluster_key")
        with open(key_file, "w") as f:
            f.write(cluster_key + "\n")
        start_shard_nodes(etcd, ["n0"], self.addCleanup, "--api_keys", api_keys,
                          client_options={"api_key": reader_key})
        keyed = start_router(etcd, self.addCleanup, "--cluster_key_file", key_file)
        keyless = start_router(etcd, self.addCleanup)
        with keyless.client() as client:
            with self.assertRaises(tessera.TesseraError) as refused:
                client.create_collection("c", 8)
            self.assertEqual(refused.exception.code, grpc.StatusCode.UNAUTHENTICATED)
            self.assertEqual(client.list_collections(), [])  # nothing half-created
        with keyed.client() as client:
            client.create_collection("c", 8, num_shards=2)
            docs = [{"id": f"d{i}", "tokens": e2e_util.normalized(np.random.default_rng(i), 4, 8)}
                    for i in range(20)]
            self.assertTrue(all(r.ok for r in client.upsert("c", docs)))
            hits = client.search("c", docs[3]["tokens"], k=3, exhaustive=True)
            self.assertEqual(hits.ids[0], "d3")
        with keyless.client() as client:  # the map is shared, the nodes still refuse it
            with self.assertRaises(tessera.TesseraError) as refused:
                client.search("c", docs[3]["tokens"], k=3)
            self.assertEqual(refused.exception.code, grpc.StatusCode.UNAUTHENTICATED)


if __name__ == "__main__":
    e2e_util.main()
