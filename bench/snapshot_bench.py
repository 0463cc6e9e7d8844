"""Snapshot figures: the time to create, download and restore a snapshot of a collection, and its
sizes (the archive, and the disk the local snapshot adds beside the collection: mostly hard links).

One tessera-server on loopback (tests/e2e/e2e_util.py's launcher) with a fresh data dir; a
collection of --docs synthetic documents (--tokens tokens of --dim, pool factor 2, fp16), ingested
with the Python client; then, each --repeat times: create_snapshot, download_snapshot to a file,
restore_snapshot (the server's copy into a new collection), restore_snapshot_from_file (the upload),
and a check that the restored collection counts the documents. Prints one JSON object with the
medians, the sizes and the machine (bench/machine.py).

    python3 bench/snapshot_bench.py --server build/bin/tessera-server --docs 20000
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(REPO_ROOT, "bench"))

import e2e_util  # noqa: E402  (also puts client/python on the path)
import machine  # noqa: E402
import numpy as np  # noqa: E402


def du_bytes(path):
    """Disk the files under `path` occupy (du -sB1: a hard-linked file counts once)."""
    return int(subprocess.check_output(["du", "-sB1", path]).split()[0])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="tessera-snapshot-bench-")
    server = e2e_util.Server(binary=args.server, work_dir=work, threads=None)
    server.start()
    rng = np.random.default_rng(7)
    try:
        client = server.client(timeout=None)
        client.create_collection("bench", dim=args.dim, pool_factor=2, num_shards=args.shards,
                                 attributes={"n": "int64"})
        t0 = time.monotonic()

        def documents():
            for i in range(args.docs):
                yield {"id": f"d{i:06d}", "tokens": e2e_util.normalized(rng, args.tokens, args.dim),
                       "attributes": {"n": i}}

        summary = client.ingest("bench", documents(), batch_size=256)
        ingest_s = time.monotonic() - t0
        assert summary.stored == args.docs, summary
        client.flush("bench")
        collection_dir = os.path.join(server.data_dir, "collections")
        collection_bytes = du_bytes(collection_dir)

        rows = []
        for r in range(args.repeat):
            t = time.monotonic()
            snapshot = client.create_snapshot("bench")
            create_s = time.monotonic() - t
            cut_s = [s for s in client.list_snapshots("bench") if s["id"] == snapshot][0][
                "cut_seconds"]
            snapshot_dir = os.path.join(server.data_dir, "snapshots", "bench", snapshot)
            # du over both counts the hard-linked files once: what the snapshot adds.
            together = int(subprocess.check_output(
                ["du", "-sB1", "-c", collection_dir, snapshot_dir]).split()[-2])
            alone = du_bytes(snapshot_dir)
            archive = os.path.join(work, f"bench-{r}.tsnap")
            t = time.monotonic()
            archive_bytes = client.download_snapshot(snapshot, archive)
            download_s = time.monotonic() - t
            t = time.monotonic()
            client.restore_snapshot(snapshot, f"local{r}")
            restore_local_s = time.monotonic() - t
            t = time.monotonic()
            client.restore_snapshot_from_file(archive, f"upload{r}")
            restore_upload_s = time.monotonic() - t
            assert client.count(f"local{r}") == args.docs
            assert client.count(f"upload{r}") == args.docs
            rows.append({"create_s": create_s, "cut_s": cut_s, "download_s": download_s,
                         "restore_local_s": restore_local_s, "restore_upload_s": restore_upload_s,
                         "archive_bytes": archive_bytes,
                         "snapshot_disk_added_bytes": together - collection_bytes,
                         "snapshot_files_bytes": alone})
            for name in (f"local{r}", f"upload{r}"):
                client.drop_collection(name)
            client.delete_snapshot(snapshot)
            os.remove(archive)

        def median(key):
            return statistics.median(row[key] for row in rows)

        print(json.dumps({
            "docs": args.docs, "tokens": args.tokens, "dim": args.dim, "shards": args.shards,
            "ingest_s": round(ingest_s, 2), "collection_disk_bytes": collection_bytes,
            "create_s": round(median("create_s"), 3), "cut_s": round(median("cut_s"), 3),
            "download_s": round(median("download_s"), 3),
            "restore_local_s": round(median("restore_local_s"), 3),
            "restore_upload_s": round(median("restore_upload_s"), 3),
            "archive_bytes": rows[0]["archive_bytes"],
            "snapshot_disk_added_bytes": median("snapshot_disk_added_bytes"),
            "runs": rows, "machine": machine.describe(),
        }, indent=1))
        client.close()
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
