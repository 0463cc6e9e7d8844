"""Snapshots through a real tessera-server and the Python clients: a snapshot restored on the same
server (from the server's copy and from a downloaded archive) and on a second, fresh server equals
its source (count, every document's stored vectors and attributes, exhaustive answers); a
corrupt or truncated archive is refused with DATA_LOSS naming the file and leaves no collection;
delete removes the snapshot's files; the bad inputs' codes; the async client's snapshot calls."""

import asyncio
import os
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402
from e2e_util import grpc, tessera  # noqa: E402

DIM = 32
DOCS = 300


def make_documents(rng):
    return [{"id": f"doc-{i:04d}", "tokens": e2e_util.normalized(rng, int(rng.integers(5, 30)), DIM),
             "attributes": {"year": 2000 + i % 20, "lang": ["en", "fr"][i % 2]}}
            for i in range(DOCS)]


class SnapshotTest(e2e_util.ServerTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.rng = np.random.default_rng(34)
        cls.client = cls.server.client()
        cls.client.create_collection("papers", dim=DIM, num_shards=3,
                                     attributes={"year": "int64", "lang": "string"})
        cls.docs = make_documents(cls.rng)
        results = cls.client.upsert("papers", cls.docs, batch_size=50)
        assert all(r.ok for r in results)
        cls.client.delete("papers", ["doc-0007"])
        cls.queries = [e2e_util.query_near(cls.rng, cls.docs[i]["tokens"], 8) for i in (1, 50, 99)]
        cls.work = tempfile.mkdtemp(prefix="tessera-snapshot-e2e-")

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        super().tearDownClass()

    def assertSameCollection(self, source_client, source, copy_client, copy):
        self.assertEqual(copy_client.count(copy), source_client.count(source))
        for doc in self.docs:
            if doc["id"] == "doc-0007":
                with self.assertRaises(tessera.TesseraError) as missing:
                    copy_client.get(copy, doc["id"])
                self.assertCode(missing, grpc.StatusCode.NOT_FOUND)
                continue
            want = source_client.get(source, doc["id"])
            got = copy_client.get(copy, doc["id"])
            self.assertEqual(got["vectors"].tobytes(), want["vectors"].tobytes(), doc["id"])
            self.assertEqual(got["attributes"], want["attributes"], doc["id"])
            self.assertEqual(got["version"], want["version"], doc["id"])
        for query in self.queries:
            want = source_client.search(source, query, k=15, exhaustive=True)
            got = copy_client.search(copy, query, k=15, exhaustive=True)
            self.assertEqual([(h.id, h.score) for h in got],
                             [(h.id, h.score) for h in want])
            self.assertEqual(len(got), 15)

    def test_restore_equals_source_here_and_on_another_server(self):
        snapshot = self.client.create_snapshot("papers")
        self.assertTrue(snapshot.startswith("papers@"), snapshot)
        listed = self.client.list_snapshots("papers")
        self.assertIn(snapshot, [s["id"] for s in listed])
        info = [s for s in listed if s["id"] == snapshot][0]
        self.assertEqual(info["num_shards"], 3)
        self.assertGreater(info["bytes"], 0)
        # A write after the snapshot is not in it.
        self.client.upsert("papers", [{"id": "late", "tokens": e2e_util.normalized(self.rng, 4,
                                                                                   DIM)}])
        restored = self.client.restore_snapshot(snapshot, "papers-copy")
        self.assertEqual(restored["id"], snapshot)
        self.assertEqual(restored["collection"], "papers")
        with self.assertRaises(tessera.TesseraError) as late:
            self.client.get("papers-copy", "late")
        self.assertCode(late, grpc.StatusCode.NOT_FOUND)
        self.client.delete("papers", ["late"])
        self.assertSameCollection(self.client, "papers", self.client, "papers-copy")

        archive = os.path.join(self.work, "papers.tsnap")
        size = self.client.download_snapshot(snapshot, archive)
        self.assertEqual(size, os.path.getsize(archive))
        self.assertGreater(size, info["bytes"])
        self.client.restore_snapshot_from_file(archive, "papers-upload")
        self.assertSameCollection(self.client, "papers", self.client, "papers-upload")

        other = e2e_util.Server().start()
        try:
            with other.client() as client:
                client.restore_snapshot_from_file(archive, "papers")
                self.assertEqual(client.list_collections(), ["papers"])
                self.assertSameCollection(self.client, "papers", client, "papers")
                # The restored collection takes writes of its own.
                client.upsert("papers", [{"id": "new", "tokens": e2e_util.normalized(self.rng, 4,
                                                                                     DIM)}])
                self.assertEqual(client.count("papers"), DOCS)
        finally:
            self.assertEqual(other.stop(), 0)
            other.cleanup()
        for name in ("papers-copy", "papers-upload"):
            self.client.drop_collection(name)

    def test_corrupt_or_truncated_archive_is_refused_naming_the_file(self):
        snapshot = self.client.create_snapshot("papers")
        archive = os.path.join(self.work, "corrupt.tsnap")
        self.client.download_snapshot(snapshot, archive)
        with open(archive, "rb") as f:
            data = bytearray(f.read())
        # The archive's last file ends 8 bytes (the end marker) before the end: flip a byte in
        # it, then cut the archive in it.
        flipped = bytearray(data)
        flipped[-9] ^= 0x40
        with open(archive, "wb") as f:
            f.write(flipped)
        with self.assertRaises(tessera.TesseraError) as corrupt:
            self.client.restore_snapshot_from_file(archive, "broken")
        self.assertCode(corrupt, grpc.StatusCode.DATA_LOSS, "snapshot file '", "crc-32")
        with open(archive, "wb") as f:
            f.write(data[:len(data) - 20])
        with self.assertRaises(tessera.TesseraError) as truncated:
            self.client.restore_snapshot_from_file(archive, "broken")
        self.assertCode(truncated, grpc.StatusCode.DATA_LOSS, "truncated", "in file '")
        self.assertNotIn("broken", self.client.list_collections())
        staging = os.path.join(self.server.data_dir, "staging")
        self.assertEqual(os.listdir(staging), [])
        self.client.delete_snapshot(snapshot)

    def test_delete_removes_the_files(self):
        snapshot = self.client.create_snapshot("papers")
        directory = os.path.join(self.server.data_dir, "snapshots", "papers", snapshot)
        self.assertTrue(os.path.isdir(directory), directory)
        self.client.delete_snapshot(snapshot)
        self.assertFalse(os.path.exists(directory))
        self.assertNotIn(snapshot, [s["id"] for s in self.client.list_snapshots("papers")])
        with self.assertRaises(tessera.TesseraError) as gone:
            self.client.restore_snapshot(snapshot, "again")
        self.assertCode(gone, grpc.StatusCode.NOT_FOUND, snapshot)

    def test_bad_input(self):
        snapshot = self.client.create_snapshot("papers")
        cases = [
            (lambda: self.client.create_snapshot("nope"), grpc.StatusCode.NOT_FOUND, "'nope'"),
            (lambda: self.client.list_snapshots("nope"), grpc.StatusCode.NOT_FOUND, "'nope'"),
            (lambda: self.client.create_snapshot(""), grpc.StatusCode.INVALID_ARGUMENT,
             "collection"),
            (lambda: self.client.restore_snapshot("papers@20000101T000000Z-00000000", "c"),
             grpc.StatusCode.NOT_FOUND, "papers@20000101T000000Z-00000000"),
            (lambda: self.client.restore_snapshot("no-at-sign", "c"),
             grpc.StatusCode.INVALID_ARGUMENT, "snapshot id"),
            (lambda: self.client.delete_snapshot("papers@x"), grpc.StatusCode.NOT_FOUND,
             "papers@x"),
            (lambda: self.client.restore_snapshot(snapshot, "bad name!"),
             grpc.StatusCode.INVALID_ARGUMENT, "bad name!"),
            (lambda: self.client.restore_snapshot(snapshot, ""),
             grpc.StatusCode.INVALID_ARGUMENT, "new_collection"),
            (lambda: self.client.restore_snapshot(snapshot, "papers"),
             grpc.StatusCode.ALREADY_EXISTS, "'papers'"),
            (lambda: self.client.download_snapshot("papers@x", os.path.join(self.work, "x")),
             grpc.StatusCode.NOT_FOUND, "papers@x"),
        ]
        for call, code, fragment in cases:
            with self.subTest(fragment=fragment):
                with self.assertRaises(tessera.TesseraError) as error:
                    call()
                self.assertCode(error, code, fragment)
        self.assertFalse(os.path.exists(os.path.join(self.work, "x")))
        # Not an archive at all.
        garbage = os.path.join(self.work, "garbage")
        with open(garbage, "wb") as f:
            f.write(b"GET / HTTP/1.1\r\n\r\n")
        with self.assertRaises(tessera.TesseraError) as error:
            self.client.restore_snapshot_from_file(garbage, "c")
        self.assertCode(error, grpc.StatusCode.DATA_LOSS, "TSNAPv1")
        self.client.delete_snapshot(snapshot)

    def test_async_client(self):
        async def run():
            async with tessera.AsyncClient(self.server.address) as client:
                snapshot = await client.create_snapshot("papers")
                self.assertIn(snapshot, [s["id"] for s in await client.list_snapshots("papers")])
                archive = os.path.join(self.work, "async.tsnap")
                self.assertGreater(await client.download_snapshot(snapshot, archive), 0)
                await client.restore_snapshot_from_file(archive, "async-upload")
                await client.restore_snapshot(snapshot, "async-copy")
                with self.assertRaises(tessera.TesseraError) as taken:
                    await client.restore_snapshot(snapshot, "async-copy")
                self.assertCode(taken, grpc.StatusCode.ALREADY_EXISTS, "async-copy")
                await client.delete_snapshot(snapshot)
                return snapshot
        asyncio.run(run())
        for name in ("async-upload", "async-copy"):
            self.assertEqual(self.client.count(name), self.client.count("papers"))
            self.client.drop_collection(name)


if __name__ == "__main__":
    e2e_util.main()
