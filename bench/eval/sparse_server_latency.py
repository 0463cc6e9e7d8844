"""The sparse lane's latency through a real tessera-server: the synthetic corpus of
tessera-bench-sparse (Zipf vocabulary, s = 1; term frequencies from `--doc-terms` draws per
document) in a collection with a sparse field, each document with one tiny token vector (dim 4,
so that ingest measures the sparse path, not pooling), then sparse-only searches (BM25, k 10) of
`--query-terms` distinct terms, timed at the client (gRPC round trip included): mean, p50, p99.

    python sparse_server_latency.py --server build/bin/tessera-server [--docs 100000]
"""

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "e2e"))

import e2e_util  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", default=os.path.join(REPO_ROOT, "build", "bin",
                                                         "tessera-server"))
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--vocabulary", type=int, default=30_000)
    parser.add_argument("--doc-terms", type=int, default=100)
    parser.add_argument("--query-terms", type=int, default=10)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()

    rng = np.random.default_rng(1)
    weights = 1.0 / np.arange(1, args.vocabulary + 1)
    weights /= weights.sum()
    e2e_util.SERVER_BINARY = args.server
    server = e2e_util.Server(threads=args.threads)
    server.start()
    result = {"docs": args.docs, "vocabulary": args.vocabulary, "doc_terms": args.doc_terms,
              "query_terms": args.query_terms, "queries": args.queries, "k": 10}
    try:
        with server.client(timeout=600) as client:
            client.create_collection("sparse_latency", dim=4, sparse=True)
            token = np.array([[1, 0, 0, 0]], dtype=np.float32)

            def documents():
                for i in range(args.docs):
                    terms, counts = np.unique(
                        rng.choice(args.vocabulary, size=args.doc_terms, p=weights),
                        return_counts=True)
                    yield {"id": f"d{i:06d}", "tokens": token,
                           "sparse": (terms, counts.astype(np.float32))}

            start = time.monotonic()
            summary = client.ingest("sparse_latency", documents(), batch_size=500, progress=False,
                                    total=args.docs)
            assert not summary.failed, summary.failed[:3]
            result["ingest_s"] = time.monotonic() - start
            latencies = []
            for _ in range(args.queries):
                terms = rng.choice(args.vocabulary, size=args.query_terms, replace=False,
                                   p=weights)
                query = (np.sort(terms), np.ones(args.query_terms, dtype=np.float32))
                start = time.perf_counter()
                hits = client.search("sparse_latency", None, k=10, sparse_query=query)
                latencies.append((time.perf_counter() - start) * 1000)
                assert len(hits) == 10
            result.update(mean_ms=float(np.mean(latencies)),
                          p50_ms=float(np.percentile(latencies, 50)),
                          p99_ms=float(np.percentile(latencies, 99)))
    finally:
        server.stop()
        server.cleanup()
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
