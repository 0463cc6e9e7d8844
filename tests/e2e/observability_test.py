"""What the real tessera-server shows of itself (issue 32, items 5, 9 and 10): a centroid training
logged as structured JSON lines (start and end, with the shard, vectors, centroids and seconds) and
counted in /metrics; a /metrics text that promtool accepts (skipped without promtool, which Debian's
prometheus package ships); per-collection samples that go when the collection is dropped; disk
figures that count what the collection's files occupy (preallocated space included); and the
segment figures, which are the segment files on disk."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402


def allocated_bytes(path):
    """st_blocks × 512 of the regular files under `path` (what `du` counts)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            total += st.st_blocks * 512
    return total


class ObservabilityTest(e2e_util.ServerTestCase):

    def log_lines(self, message):
        """The server's structured (JSON) log lines whose msg is `message`."""
        lines = []
        for line in self.server.log().splitlines():
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if record.get("msg") == message:
                lines.append(record)
        return lines

    def sample(self, text, name, **labels):
        """The value of the sample `name{labels}` in the metrics text, or None."""
        label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        pattern = re.escape(f"{name}{{{label_text}}}" if labels else name) + r" (\S+)$"
        for line in text.splitlines():
            match = re.match(pattern, line)
            if match:
                return match.group(1)
        return None

    def test_training_is_logged_and_counted(self):
        dim = 16
        with self.server.client() as client:
            client.create_collection("trained", dim=dim, pool_factor=1, max_merge_height=0,
                                     candidates={"factory": "centroid",
                                                 "centroid_min_training_vectors": 1000})
            rng = np.random.default_rng(7)
            docs = [(f"d{i}", e2e_util.normalized(rng, 24, dim)) for i in range(60)]
            self.assertTrue(all(r.ok for r in client.upsert("trained", docs)))
            deadline = time.monotonic() + 120
            while not self.log_lines("training finished"):
                self.assertLess(time.monotonic(), deadline,
                                f"no 'training finished' line:\n{self.server.log()[-4000:]}")
                time.sleep(0.1)
        started = self.log_lines("training started")
        finished = self.log_lines("training finished")
        self.assertEqual(len(started), 1, started)
        self.assertEqual(len(finished), 1, finished)
        for record in (started[0], finished[0]):
            self.assertEqual(record["level"], "info")
            self.assertEqual(record["collection"], "trained")
            self.assertEqual(record["shard"], "0")
            self.assertEqual(record["vectors"], str(60 * 24))
            self.assertEqual(record["centroids"], "256")
        self.assertGreaterEqual(float(finished[0]["seconds"]), 0.0)

        text = self.server.metrics()
        self.assertEqual(self.sample(text, "tessera_trainings_total", collection="trained",
                                     outcome="completed"), "1", text)
        self.assertEqual(self.sample(text, "tessera_trainings_total", collection="trained",
                                     outcome="failed"), "0", text)
        self.assertEqual(self.sample(text, "tessera_training_shards", collection="trained"), "0")
        self.assertAlmostEqual(
            float(self.sample(text, "tessera_last_training_seconds", collection="trained")),
            float(finished[0]["seconds"]), delta=0.0006)

    def test_segment_figures_are_the_files(self):
        """collection_info's segment figures and their gauges: before a flush the rows wait in
        RocksDB (the 64 MiB threshold is far off) and there is no segment file; after it the
        rerank-*.seg files' count and sizes, nothing unflushed. No codes without a codebook."""
        with self.server.client() as client:
            client.create_collection("segmented", dim=8, num_shards=2)
            rng = np.random.default_rng(11)
            docs = [(f"d{i}", e2e_util.normalized(rng, 12, 8)) for i in range(40)]
            self.assertTrue(all(r.ok for r in client.upsert("segmented", docs)))

            def check(stats, segments, segment_bytes, unflushed):
                self.assertEqual(stats["rerank_segments"], segments, stats)
                self.assertEqual(stats["rerank_segment_bytes"], segment_bytes, stats)
                self.assertEqual(stats["rerank_unflushed_bytes"], unflushed, stats)
                for field in ("code_segments", "code_segment_bytes", "code_unflushed_bytes"):
                    self.assertEqual(stats[field], 0, field)
                text = self.server.metrics()
                for name, rerank in (("tessera_segment_files", segments),
                                     ("tessera_segment_bytes", segment_bytes),
                                     ("tessera_unflushed_bytes", unflushed)):
                    self.assertEqual(self.sample(text, name, collection="segmented",
                                                 kind="rerank"), str(rerank), text)
                    self.assertEqual(self.sample(text, name, collection="segmented",
                                                 kind="codes"), "0", text)

            def files():
                collections = os.path.join(self.server.data_dir, "collections")
                sizes = []
                for d in os.listdir(collections):
                    if not d.startswith("segmented@"):
                        continue
                    for root, _, names in os.walk(os.path.join(collections, d)):
                        sizes += [os.path.getsize(os.path.join(root, name)) for name in names
                                  if name.startswith("rerank-") and name.endswith(".seg")]
                return sizes

            stats = client.collection_info("segmented")["stats"]
            self.assertGreater(stats["rerank_unflushed_bytes"], 0, stats)
            self.assertEqual(files(), [])
            check(stats, 0, 0, stats["rerank_unflushed_bytes"])
            client.flush("segmented")
            sizes = files()
            self.assertGreaterEqual(len(sizes), 1)
            check(client.collection_info("segmented")["stats"], len(sizes), sum(sizes), 0)

    def test_metrics_pass_promtool_and_follow_drops(self):
        with self.server.client() as client:
            client.create_collection("sixteen", dim=8, num_shards=16)
            client.create_collection("dropped", dim=8)
            stats = client.collection_info("sixteen")["stats"]
            collections = os.path.join(self.server.data_dir, "collections")
            measured = sum(allocated_bytes(os.path.join(collections, d))
                           for d in os.listdir(collections) if d.startswith("sixteen@"))
            # Per shard: one 1 MiB WAL preallocation step, a 64 KiB MANIFEST step, a few KiB of
            # OPTIONS, CURRENT and RocksDB's info log (2.3 GB for 16 shards before).
            self.assertLess(measured, 16 * (2 << 20))
            self.assertAlmostEqual(int(stats["disk_bytes"]), measured, delta=16 * (16 << 10))
            text = self.server.metrics()
            self.assertAlmostEqual(
                int(self.sample(text, "tessera_disk_bytes", collection="sixteen")), measured,
                delta=16 * (16 << 10))
            promtool = shutil.which("promtool")
            if promtool is None:
                print("promtool not found: install Debian's prometheus package to check the "
                      "/metrics text with it (scripts/setup does)", file=sys.stderr)
            else:
                checked = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                                         capture_output=True)
                self.assertEqual(checked.returncode, 0,
                                 f"{checked.stdout.decode()}{checked.stderr.decode()}\n{text}")
            self.assertIn('collection="dropped"', text)
            client.drop_collection("dropped")
            self.assertNotIn('collection="dropped"', self.server.metrics())


if __name__ == "__main__":
    e2e_util.main()
