"""End-to-end test of the `tessera` command line against the real tessera-server.

Starts tessera-server on a loopback port it picks itself (--listen 127.0.0.1:0, read back from its
"tessera-server listening on HOST:PORT" line) with a temporary data dir, then drives only the CLI:
collections create/list/get/drop, ingest of a generated .npz of 300 documents with a JSONL sidecar
over 2 streams, search/get/stats --json, a SIGKILL of the CLI halfway through an ingest followed by
a rerun that the resume journal turns into "send only the rest" (the final count is exact), the
same after a SIGKILL of the server and its restart, a changed document being resent, and exit
codes.

    /usr/bin/python3 tests/e2e/cli_e2e_test.py --server build/bin/tessera-server \
        --cli build/bin/tessera [unittest args]

Needs Debian's python3 with python3-numpy; nothing else (not the Python client).
"""

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile

import numpy as np

import e2e_util

SERVER = None
CLI = None
NUM_DOCS = 300
DIM = 32
_LISTENING = re.compile(r"tessera-server listening on (\S+):(\d+)")


def make_corpus(directory, seed=7):
    """Writes docs.npz (one 2-D array per document; every fifth one float16) and docs.jsonl (its
    attributes and patch layouts: prefix 1, rows x 4 patches, suffix 0 or 1); returns the arrays
    and the sidecar entries by id."""
    rng = np.random.default_rng(seed)
    arrays = {}
    meta = {}
    for i in range(NUM_DOCS):
        doc_id = f"doc-{i:03d}"
        rows, cols, prefix, suffix = int(rng.integers(2, 5)), 4, 1, i % 2
        tokens = prefix + rows * cols + suffix
        matrix = rng.standard_normal((tokens, DIM)).astype(np.float32)
        matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
        arrays[doc_id] = matrix.astype(np.float16) if i % 5 == 0 else matrix
        meta[doc_id] = {
            "id": doc_id,
            "attributes": {"group": i % 3, "title": f"document {i}", "weight": i / 10},
            "layout": {"rows": rows, "cols": cols, "prefix": prefix, "suffix": suffix},
        }
    np.savez(os.path.join(directory, "docs.npz"), **arrays)
    write_jsonl(os.path.join(directory, "docs.jsonl"), meta.values())
    return arrays, meta


def write_jsonl(path, entries):
    with open(path, "w", encoding="utf-8") as f:
        for entry in entries:
            f.write(json.dumps(entry) + "\n")


def journal_entries(path):
    """The (id, hash) lines of an ingest journal, header excluded, torn last line ignored (a
    journal still without its whole header line has none)."""
    with open(path, "rb") as f:
        data = f.read().decode("utf-8", "replace")
    lines = data.split("\n")[:-1]  # the part after the last newline is torn or empty
    if not lines:
        return []
    assert lines[0].startswith("# tessera-ingest journal v1 collection="), lines[0]
    return [tuple(line.split(" ")) for line in lines[1:]]


class Server:
    """One tessera-server process on a loopback port of its choosing, over `data_dir`."""

    def __init__(self, data_dir, log_path):
        self.data_dir = data_dir
        self.log_path = log_path
        self.process = None
        self.addr = None

    def start(self):
        log = open(self.log_path, "ab")
        offset = log.tell()
        self.process = subprocess.Popen(
            [SERVER, "--data_dir", self.data_dir, "--listen", "127.0.0.1:0",
             "--metrics_listen", "127.0.0.1:0", "--threads", "2"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 60
        while True:
            match = _LISTENING.search(self.log()[offset:])
            if match:
                break
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError("tessera-server did not start:\n" + self.log()[-4000:])
            time.sleep(0.05)
        self.addr = f"{match.group(1)}:{match.group(2)}"
        # Serving once a call succeeds.
        while subprocess.run([CLI, "--addr", self.addr, "collections", "list"],
                             capture_output=True, stdin=subprocess.DEVNULL).returncode != 0:
            if time.monotonic() > deadline:
                raise AssertionError("tessera-server not answering:\n" + self.log()[-4000:])
            time.sleep(0.1)
        return self

    def kill(self):
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")


class CliEndToEndTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="tessera-cli-e2e-")
        cls.arrays, cls.meta = make_corpus(cls.work)
        cls.server = Server(os.path.join(cls.work, "data"),
                            os.path.join(cls.work, "server.log")).start()
        cls.addr = cls.server.addr

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        shutil.rmtree(cls.work, ignore_errors=True)

    @classmethod
    def read_server_log(cls):
        return cls.server.log()

    @classmethod
    def cli_command(cls, args):
        return [CLI, "--addr", cls.addr, "--timeout", "60s", *args]

    @classmethod
    def cli_raw(cls, args, timeout=120):
        return subprocess.run(cls.cli_command(args), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def cli(self, *args, expect=0):
        result = self.cli_raw(list(args))
        self.assertEqual(result.returncode, expect,
                         f"tessera {' '.join(args)}\nstdout: {result.stdout}\n"
                         f"stderr: {result.stderr}\nserver: {self.read_server_log()[-2000:]}")
        return result

    def cli_json(self, *args):
        return json.loads(self.cli(*args, "--json").stdout)

    def create(self, name):
        self.cli("collections", "create", name, "--dim", str(DIM), "--pool-factor", "2",
                 "--max-merge-height", "0", "--attribute", "group:int64", "--attribute", "title:string",
                 "--attribute", "weight:double")

    def query_file(self, doc_id):
        path = os.path.join(self.work, f"query-{doc_id}.npy")
        np.save(path, self.arrays[doc_id].astype(np.float32))
        return path

    # ---------------------------------------------------------------------------------------

    def test_ingest_search_get_stats_drop(self):
        self.create("papers")
        self.assertIn("papers", self.cli_json("collections", "list")["collections"])
        npz = os.path.join(self.work, "docs.npz")
        journal = os.path.join(self.work, "papers.journal")
        summary = self.cli_json("ingest", "papers", npz, "--meta",
                                os.path.join(self.work, "docs.jsonl"), "--streams", "2",
                                "--batch", "16", "--journal", journal)
        self.assertEqual(summary["documents"], NUM_DOCS)
        self.assertEqual(summary["stored"], NUM_DOCS)
        self.assertEqual(summary["skipped"], 0)
        self.assertEqual(summary["failed"], 0)
        self.assertEqual(summary["unacknowledged"], 0)
        self.assertIsNone(summary["error"])
        self.assertEqual(len(journal_entries(journal)), NUM_DOCS)

        stats = self.cli_json("stats", "papers")
        self.assertEqual(stats["documents"], NUM_DOCS)
        self.assertEqual(stats["original_tokens"], sum(a.shape[0] for a in self.arrays.values()))
        for field in ("rerank_vectors", "candidate_vectors", "disk_bytes", "vectors_per_document",
                      "disk_bytes_per_original_token", "disk_bytes_per_rerank_vector",
                      "candidate_indexes"):
            self.assertIn(field, stats)
        self.assertLess(stats["rerank_vectors"], stats["original_tokens"])  # pooled (p=2)

        # A document's own tokens find it first, by the cascade and exhaustively.
        for doc_id in ("doc-017", "doc-100", "doc-299"):
            for extra in ([], ["--exhaustive"]):
                result = self.cli_json("search", "papers", "--query", self.query_file(doc_id),
                                       "--k", "5", *extra)
                self.assertEqual(len(result["results"]), 5, result)
                self.assertEqual(result["results"][0]["id"], doc_id, result)
                scores = [hit["score"] for hit in result["results"]]
                self.assertEqual(scores, sorted(scores, reverse=True))
                self.assertEqual(set(result["timings_ms"]),
                                 {"candidates", "fetch", "rerank", "total"})
        explained = self.cli_json("search", "papers", "--query", self.query_file("doc-017"),
                                  "--k", "2", "--explain")
        explanation = explained["results"][0]["explanation"]
        self.assertEqual(len(explanation), self.arrays["doc-017"].shape[0])
        self.assertEqual({"query_token", "document_vector", "similarity", "covered_tokens"},
                         set(explanation[0]))
        # Filters take the schema's types: doc-017 is in group 2.
        filtered = self.cli_json("search", "papers", "--query", self.query_file("doc-017"),
                                 "--k", "10", "--filter", "group==1", "--filter", "weight>=10")
        self.assertTrue(filtered["results"])
        for hit in filtered["results"]:
            i = int(hit["id"].split("-")[1])
            self.assertEqual(i % 3, 1)
            self.assertGreaterEqual(i / 10, 10)
        human = self.cli("search", "papers", "--query", self.query_file("doc-017"), "--k", "3")
        self.assertIn("doc-017", human.stdout.splitlines()[1])

        document = self.cli_json("get", "papers", "doc-017")
        self.assertEqual(document["id"], "doc-017")
        self.assertEqual(document["version"], 1)
        self.assertEqual(document["num_tokens"], self.arrays["doc-017"].shape[0])
        self.assertEqual(document["num_vectors"], self.arrays["doc-017"].shape[0] // 2)
        self.assertEqual(document["attributes"], self.meta["doc-017"]["attributes"])
        self.assertEqual(document["layout"], self.meta["doc-017"]["layout"])
        self.assertNotIn("vectors", document)
        with_vectors = self.cli_json("get", "papers", "doc-017", "--vectors")
        vectors = np.array(with_vectors["vectors"], dtype=np.float32)
        self.assertEqual(vectors.shape, (document["num_vectors"], DIM))
        covered = sorted(t for members in with_vectors["members"] for t in members)
        self.assertEqual(covered, list(range(document["num_tokens"])))

        # A rerun sends nothing; a changed document (new attribute value) is sent again.
        again = self.cli_json("ingest", "papers", npz, "--meta",
                              os.path.join(self.work, "docs.jsonl"), "--journal", journal)
        self.assertEqual((again["stored"], again["skipped"], again["failed"]), (0, NUM_DOCS, 0))
        changed = dict(self.meta)
        changed["doc-042"] = json.loads(json.dumps(self.meta["doc-042"]))
        changed["doc-042"]["attributes"]["title"] = "a new title"
        changed_path = os.path.join(self.work, "changed.jsonl")
        write_jsonl(changed_path, changed.values())
        resent = self.cli_json("ingest", "papers", npz, "--meta", changed_path,
                               "--journal", journal)
        self.assertEqual((resent["stored"], resent["skipped"]), (1, NUM_DOCS - 1))
        updated = self.cli_json("get", "papers", "doc-042")
        self.assertEqual(updated["attributes"]["title"], "a new title")
        self.assertEqual(updated["version"], 2)
        self.assertEqual(self.cli_json("stats", "papers")["documents"], NUM_DOCS)

        self.cli("collections", "drop", "papers")
        self.assertNotIn("papers", self.cli_json("collections", "list")["collections"])

    def test_filters_count_scroll_groups_delete(self):
        """count, scroll, search --group-by / --attributes and delete by filter, with nested
        alternatives (--any-of, --none-of) and exists / prefix conditions, against the values the
        generator wrote (doc i: group i % 3, title "document i", weight i / 10)."""
        self.create("facets")
        self.cli_json("ingest", "facets", os.path.join(self.work, "docs.npz"), "--meta",
                      os.path.join(self.work, "docs.jsonl"), "--no-resume", "--journal",
                      os.path.join(self.work, "facets.journal"))
        ids = [f"doc-{i:03d}" for i in range(NUM_DOCS)]

        def count(*flags):
            return self.cli_json("count", "facets", *flags)["count"]

        self.assertEqual(count(), NUM_DOCS)
        self.assertEqual(count("--filter", "group==1"), sum(i % 3 == 1 for i in range(NUM_DOCS)))
        self.assertEqual(count("--any-of", "group==0 && weight<5", "--any-of", "group==2"),
                         sum((i % 3 == 0 and i / 10 < 5) or i % 3 == 2 for i in range(NUM_DOCS)))
        self.assertEqual(count("--filter", "title prefix document 1", "--none-of", "group==0"),
                         sum(str(i).startswith("1") and i % 3 != 0 for i in range(NUM_DOCS)))
        self.assertEqual(count("--filter", "title exists"), NUM_DOCS)
        self.assertEqual(count("--filter", "title missing"), 0)

        scrolled, after = [], []
        while True:
            page = self.cli_json("scroll", "facets", "--filter", "group==1", "--limit", "40",
                                 "--attributes", "group", *after)
            scrolled += [d["id"] for d in page["documents"]]
            self.assertTrue(all(d["attributes"] == {"group": 1} for d in page["documents"]))
            if not page["next_after"]:
                break
            after = ["--after", page["next_after"]]
        self.assertEqual(scrolled, [i for n, i in enumerate(ids) if n % 3 == 1])

        grouped = self.cli_json("search", "facets", "--query", self.query_file("doc-017"),
                                "--group-by", "group", "--group-size", "2", "--groups", "3",
                                "--exhaustive", "--attributes", "group")
        self.assertEqual(grouped["results"], [])
        self.assertEqual(len(grouped["groups"]), 3)
        self.assertEqual(grouped["groups"][0]["value"], 2)  # doc-017 is in group 2
        self.assertEqual(grouped["groups"][0]["results"][0]["id"], "doc-017")
        self.assertEqual(sorted(g["value"] for g in grouped["groups"]), [0, 1, 2])
        for group in grouped["groups"]:
            self.assertEqual(len(group["results"]), 2)
            for hit in group["results"]:
                self.assertEqual(hit["attributes"], {"group": group["value"]})
        human = self.cli("search", "facets", "--query", self.query_file("doc-017"),
                         "--group-by", "group", "--exhaustive").stdout
        self.assertTrue(human.startswith("group 2\n"), human)

        deleted = self.cli_json("delete", "facets", "--filter", "group==2")
        self.assertEqual(deleted["deleted"], NUM_DOCS // 3)
        self.assertEqual(count(), NUM_DOCS - NUM_DOCS // 3)
        self.assertEqual(count("--filter", "group==2"), 0)
        bad = self.cli("count", "facets", "--filter", "group prefix 1", expect=1)
        self.assertIn("INVALID_ARGUMENT: filter condition 0 on 'group': prefix on the int64 "
                      "field, expected a string field", bad.stderr)
        self.cli("collections", "drop", "facets")

    def test_killed_ingest_resumes_without_duplicates(self):
        self.create("resume")
        npz = os.path.join(self.work, "docs.npz")
        journal = os.path.join(self.work, "resume.journal")
        meta = os.path.join(self.work, "docs.jsonl")
        # Throttled so that it is surely still running when killed.
        process = subprocess.Popen(
            self.cli_command(["ingest", "resume", npz, "--meta", meta, "--streams", "2",
                              "--batch", "4", "--journal", journal, "--max-rate", "150"]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            entries = journal_entries(journal) if os.path.exists(journal) else []
            if len(entries) >= 60:
                break
            self.assertIsNone(process.poll(), "the ingest ended before it could be killed")
            self.assertLess(time.monotonic(), deadline, "the ingest made no progress")
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        self.assertEqual(process.wait(), -signal.SIGKILL)

        acknowledged = journal_entries(journal)
        self.assertGreaterEqual(len(acknowledged), 60)
        self.assertLess(len(acknowledged), NUM_DOCS, "the ingest finished before the kill")
        stored_before = self.cli_json("stats", "resume")["documents"]
        self.assertGreaterEqual(stored_before, len(acknowledged))

        summary = self.cli_json("ingest", "resume", npz, "--meta", meta, "--streams", "2",
                                "--journal", journal)
        self.assertEqual(summary["skipped"], len(acknowledged))
        self.assertEqual(summary["stored"], NUM_DOCS - len(acknowledged))
        self.assertEqual(summary["failed"], 0)
        self.assertEqual(summary["unacknowledged"], 0)
        self.assertEqual(self.cli_json("stats", "resume")["documents"], NUM_DOCS)
        self.assertEqual(len({doc_id for doc_id, _ in journal_entries(journal)}), NUM_DOCS)
        # Documents acknowledged before the kill were not sent again.
        for doc_id, _ in (acknowledged[0], acknowledged[len(acknowledged) // 2], acknowledged[-1]):
            self.assertEqual(self.cli_json("get", "resume", doc_id)["version"], 1, doc_id)
        self.cli("collections", "drop", "resume")

    def test_server_killed_during_ingest_then_resumed(self):
        """SIGKILL the server mid-ingest: the CLI reports the unacknowledged documents and exits
        1; after a restart on the same data dir, a rerun sends the rest and nothing acknowledged
        is lost or duplicated."""
        server = Server(os.path.join(self.work, "data-crash"),
                        os.path.join(self.work, "server-crash.log")).start()
        try:
            base = [CLI, "--addr", server.addr, "--timeout", "60s"]
            subprocess.run(base + ["collections", "create", "crash", "--dim", str(DIM)],
                           check=True, capture_output=True)
            npz = os.path.join(self.work, "docs.npz")
            journal = os.path.join(self.work, "crash.journal")
            process = subprocess.Popen(
                base + ["ingest", "crash", npz, "--batch", "4", "--journal", journal,
                        "--max-rate", "150", "--json"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + 60
            while len(journal_entries(journal) if os.path.exists(journal) else []) < 60:
                self.assertIsNone(process.poll(), "the ingest ended before the server was killed")
                self.assertLess(time.monotonic(), deadline, "the ingest made no progress")
                time.sleep(0.01)
            server.kill()
            stdout, stderr = process.communicate(timeout=60)
            self.assertEqual(process.returncode, 1, stderr)
            summary = json.loads(stdout)
            self.assertIn("rerun the same command to resume", stderr)
            self.assertIsNotNone(summary["error"])
            self.assertEqual(summary["stored"] + summary["unacknowledged"], NUM_DOCS)
            acknowledged = journal_entries(journal)
            self.assertEqual(len(acknowledged), summary["stored"])

            server.start()
            base = [CLI, "--addr", server.addr, "--timeout", "60s"]
            rerun = subprocess.run(base + ["ingest", "crash", npz, "--journal", journal, "--json"],
                                   capture_output=True, text=True)
            self.assertEqual(rerun.returncode, 0, rerun.stderr)
            again = json.loads(rerun.stdout)
            self.assertEqual(again["skipped"], len(acknowledged))
            self.assertEqual(again["stored"], NUM_DOCS - len(acknowledged))
            stats = json.loads(subprocess.run(base + ["stats", "crash", "--json"], check=True,
                                              capture_output=True, text=True).stdout)
            self.assertEqual(stats["documents"], NUM_DOCS)
            for doc_id, _ in (acknowledged[0], acknowledged[-1]):
                document = json.loads(subprocess.run(
                    base + ["get", "crash", doc_id, "--json"], check=True, capture_output=True,
                    text=True).stdout)
                self.assertEqual(document["version"], 1, doc_id)
        finally:
            server.kill()

    def test_snapshot_create_list_download_restore_delete(self):
        self.create("snapped")
        self.cli_json("ingest", "snapped", os.path.join(self.work, "docs.npz"), "--meta",
                      os.path.join(self.work, "docs.jsonl"), "--no-resume", "--journal",
                      os.path.join(self.work, "snapped.journal"))
        created = self.cli_json("snapshot", "create", "snapped")
        snapshot = created["id"]
        self.assertTrue(snapshot.startswith("snapped@"), created)
        self.assertGreater(created["bytes"], 0)
        self.assertTrue(self.cli("snapshot", "create", "snapped").stdout.startswith(
            "created snapshot snapped@"))
        listed = self.cli_json("snapshot", "list", "snapped")["snapshots"]
        self.assertEqual(len(listed), 2)
        self.assertEqual(listed[0]["id"], snapshot)
        archive = os.path.join(self.work, "snapped.tsnap")
        self.cli("snapshot", "download", snapshot, archive)
        self.assertGreater(os.path.getsize(archive), created["bytes"])
        restored = self.cli_json("snapshot", "restore", snapshot, "snapped-copy")
        self.assertEqual(restored["collection"], "snapped")
        self.cli("snapshot", "restore", "--file", archive, "snapped-upload")
        query = self.query_file("doc-005")
        want = self.cli_json("search", "snapped", "--query", query, "--exhaustive", "--k", "5")
        for name in ("snapped-copy", "snapped-upload"):
            self.assertEqual(self.cli_json("count", name)["count"], NUM_DOCS)
            got = self.cli_json("search", name, "--query", query, "--exhaustive", "--k", "5")
            self.assertEqual(got["results"], want["results"])
        # Errors: a taken name, an unknown id, a usage error.
        result = self.cli("snapshot", "restore", snapshot, "snapped", expect=1)
        self.assertTrue(result.stderr.startswith("tessera: ALREADY_EXISTS: "), result.stderr)
        result = self.cli("snapshot", "delete", "snapped@nope", expect=1)
        self.assertTrue(result.stderr.startswith("tessera: NOT_FOUND: "), result.stderr)
        self.cli("snapshot", "restore", "--file", archive, expect=2)
        self.cli("snapshot", expect=2)
        for entry in listed:
            self.cli("snapshot", "delete", entry["id"])
        self.assertEqual(self.cli_json("snapshot", "list", "snapped")["snapshots"], [])
        for name in ("snapped", "snapped-copy", "snapped-upload"):
            self.cli("collections", "drop", name)

    def test_errors_and_exit_codes(self):
        result = self.cli("stats", "no-such-collection", expect=1)
        self.assertTrue(result.stderr.startswith("tessera: NOT_FOUND: "), result.stderr)
        result = self.cli("collections", "create", "x", "--dim", "8", "--pooling", "diag",
                          expect=2)
        self.assertIn("--pooling", result.stderr)
        self.cli("frobnicate", expect=2)
        # A collection of another dimension rejects every document; each is reported.
        self.cli("collections", "create", "narrow", "--dim", "16")
        result = self.cli("ingest", "narrow", os.path.join(self.work, "docs.npz"),
                          "--journal", os.path.join(self.work, "narrow.journal"), "--json",
                          expect=1)
        summary = json.loads(result.stdout)
        self.assertEqual(summary["failed"], NUM_DOCS)
        self.assertEqual(summary["stored"], 0)
        self.assertEqual(summary["failures"][0]["code"], "INVALID_ARGUMENT")
        self.assertIn("tessera: document 'doc-000': INVALID_ARGUMENT:", result.stderr)
        self.assertEqual(journal_entries(os.path.join(self.work, "narrow.journal")), [])
        self.cli("collections", "drop", "narrow")


    # Hostile input: ids that would drive the terminal, and a zip bomb.

    def test_human_output_escapes_hostile_ids(self):
        self.cli("collections", "create", "hostile", "--dim", str(DIM), "--attribute",
                 "title:string")
        rng = np.random.default_rng(3)
        ids = {
            "clear": "\x1b[2J\x1b[Hcleared",         # clears the screen
            "row": "row\n   1  forged           9.9",  # forges a table row
            "rtl": "invoice\u202etxt.exe",            # reads backwards
            "c1": "csi\u009b31m",                     # a one-character CSI
        }
        arrays = {doc_id: normalized_rows(rng, 6) for doc_id in ids.values()}
        npz = os.path.join(self.work, "hostile.npz")
        np.savez(npz, **arrays)
        meta = os.path.join(self.work, "hostile.jsonl")
        write_jsonl(meta, [{"id": doc_id, "attributes": {"title": "\x1b[31mred\u2067"}}
                           for doc_id in ids.values()])
        summary = self.cli_json("ingest", "hostile", npz, "--meta", meta, "--journal",
                                os.path.join(self.work, "hostile.journal"))
        self.assertEqual(summary["stored"], len(ids), summary)

        query = os.path.join(self.work, "hostile-query.npy")
        np.save(query, arrays[ids["row"]])
        human = self.cli("search", "hostile", "--query", query, "--k", "4").stdout
        for raw in ("\x1b", "\u202e", "\u009b"):
            self.assertNotIn(raw, human)
        lines = human.splitlines()
        self.assertEqual(len(lines), 1 + len(ids) + 1, human)  # header, one row each, timings
        self.assertTrue(lines[1].startswith("   1  row\\n   1  forged           9.9 "), human)
        for escaped in ("\\x1b[2J\\x1b[Hcleared", "invoice\\u202etxt.exe", "csi\\u009b31m"):
            self.assertIn(escaped, human)
        # --json keeps the ids exact (JSON escapes them itself).
        hits = self.cli_json("search", "hostile", "--query", query, "--k", "4")["results"]
        self.assertEqual({hit["id"] for hit in hits}, set(ids.values()))

        shown = self.cli("get", "hostile", ids["clear"]).stdout
        self.assertNotIn("\x1b", shown)
        self.assertIn("id          \\x1b[2J\\x1b[Hcleared\n", shown)
        self.assertIn("title='\\x1b[31mred\\u2067'", shown)
        self.cli("collections", "drop", "hostile")

    def test_zip_bomb_is_refused_from_its_headers(self):
        """A 200 KB archive whose one member is a consistent (409600, 128) float32 array of zeros:
        200 MiB once inflated, over the 64 MiB per-document default; refused before inflating,
        so the CLI never holds it."""
        path = os.path.join(self.work, "bomb.npz")
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            header, {"descr": "<f4", "fortran_order": False, "shape": (409600, 128)})
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            with archive.open("bomb.npy", "w", force_zip64=True) as member:
                member.write(header.getvalue())
                zeros = bytes(1 << 20)
                for _ in range(200):
                    member.write(zeros)
        self.assertLess(os.path.getsize(path), 1 << 20)
        self.cli("collections", "create", "bombed", "--dim", "128")
        process = subprocess.Popen(
            self.cli_command(["ingest", "bombed", path, "--no-progress", "--journal",
                              os.path.join(self.work, "bomb.journal")]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        # wait4 for the CLI's own peak memory (its output is a few lines: no pipe fills up).
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        stderr = process.stderr.read()
        process.stdout.close()
        process.stderr.close()
        self.assertEqual(process.returncode, 1, stderr)
        # The 200 MiB array was never allocated (ru_maxrss is in KiB).
        self.assertLess(usage.ru_maxrss, 100 * 1024, "tessera ingest's peak RSS")
        self.assertIn("tessera: INVALID_ARGUMENT: ", stderr)
        self.assertIn("bomb.npz' member 'bomb.npy': its array of float32 (409600, 128) holds "
                      "209715200 bytes, more than the limit of 67108864 bytes per array (set by "
                      "--max-document-bytes", stderr)
        self.assertEqual(self.cli_json("stats", "bombed")["documents"], 0)
        # A lower limit refuses a member that is within the default.
        small = os.path.join(self.work, "docs.npz")
        result = self.cli("ingest", "bombed", small, "--max-document-bytes", "100", "--journal",
                          os.path.join(self.work, "bomb2.journal"), expect=1)
        self.assertIn("more than the limit of 100 bytes per array", result.stderr)
        self.cli("collections", "drop", "bombed")


def normalized_rows(rng, rows):
    matrix = rng.standard_normal((rows, DIM)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def main():
    global SERVER, CLI
    (SERVER, CLI), rest = e2e_util.parse_binaries("server", "cli")
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
