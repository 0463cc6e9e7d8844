"""A small scripts/bench-scale run as a test: one shard of 20,000 documents (1.28M pooled vectors,
well past the threshold where stage 1 becomes the centroid index, so the shard trains and
retrains in the background during ingest), 200 queries with default options against the same
queries searched exhaustively. Asserts that stage 1 is the centroid index and that the default
finds ≥ 95% of the exhaustive top 10.

  scale_recall_test.py --bench build/bin/tessera-bench-index [--resampled] [--docs N]

With --resampled, documents are spans of real token embeddings and queries are real queries: the
source that `scripts/bench-scale --corpus resampled` prepares (bench/scale/resample_source.py) in
$TESSERA_EVAL_CACHE/resampled/scifact-dim128 (default cache ~/.cache/tessera-eval). Preparing it
takes the evaluation environment (a 5 GB PyTorch install from PyPI), which the test does not
install: without the source it reports SKIPPED (exit 77). Without --resampled, the synthetic topic
corpus.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

MIN_RECALL = 0.95
SKIPPED = 77


def resample_source():
    cache = os.environ.get("TESSERA_EVAL_CACHE",
                           os.path.join(os.path.expanduser("~"), ".cache", "tessera-eval"))
    return os.path.join(cache, "resampled", "scifact-dim128")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", required=True)
    parser.add_argument("--resampled", action="store_true")
    parser.add_argument("--docs", type=int, default=20000)
    args = parser.parse_args()
    source = resample_source() if args.resampled else None
    if source and not os.path.exists(os.path.join(source, "query_offsets.npy")):
        print(f"SKIPPED: no resampling source at {source} "
              "(scripts/bench-scale --corpus resampled --docs 1000 prepares it)", file=sys.stderr)
        return SKIPPED
    with tempfile.TemporaryDirectory(prefix="tessera-scale-") as tmp:
        out = os.path.join(tmp, "result.json")
        command = [args.bench, "--docs", str(args.docs), "--queries", "200",
                   "--data_dir", os.path.join(tmp, "data"), "--json", out]
        if source:
            command += ["--resample_from", source]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            result = json.load(f)
    print(json.dumps(result, indent=2))
    failures = []
    if not result["candidate_index"].startswith("Centroid"):
        failures.append(f"stage 1 is {result['candidate_index']!r}, expected the centroid index")
    if result["pooled_vectors"] != args.docs * 64:
        failures.append(f"{result['pooled_vectors']} pooled vectors, expected {args.docs * 64}")
    if result["recall_at_10"] < MIN_RECALL:
        failures.append(f"recall@10 {result['recall_at_10']:.4f} vs exhaustive, "
                        f"expected ≥ {MIN_RECALL}")
    for failure in failures:
        print("FAIL:", failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
