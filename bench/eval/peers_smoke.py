"""Smoke test of peers.py on a small synthetic data set; exits non-zero on failure.

Documents are bags of noisy copies of topic vectors; each query is a noisy subset of one
document's tokens and that document is its only relevant one. Checks: every peer runs
without error, the two exact peers return the same top-10 with the same scores, fast-plaid and
xtr-warp find most relevant documents, a second run of each with other search settings reuses
its index, and bad arguments come back as errors instead of exceptions.
Usage: python peers_smoke.py  (about a minute on 2 cores)
"""

import shutil
import sys
import tempfile

import numpy as np

import embed
import metrics
import peers

DIM = 384
DOCUMENTS = 1200
QUERIES = 40
QUERY_TOKENS = 24  # > 10, so maxsim-cpu's query slicing is exercised


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


def token_set(ids, matrices) -> embed.TokenSet:
    offsets = np.zeros(len(matrices) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(m) for m in matrices])
    return embed.TokenSet(ids, np.concatenate(matrices).astype(np.float16), offsets)


def synthetic_dataset(seed: int = 0) -> embed.Dataset:
    rng = np.random.default_rng(seed)
    topics = unit(rng.standard_normal((400, DIM)))
    documents = []
    for _ in range(DOCUMENTS):
        picks = topics[rng.integers(0, len(topics), size=int(rng.integers(20, 80)))]
        documents.append(unit(picks + 0.3 * rng.standard_normal(picks.shape) / np.sqrt(DIM)))
    sources = rng.choice(DOCUMENTS, size=QUERIES, replace=False)
    queries = []
    for source in sources:
        rows = documents[source][rng.integers(0, len(documents[source]), size=QUERY_TOKENS)]
        queries.append(unit(rows + 0.5 * rng.standard_normal(rows.shape) / np.sqrt(DIM)))
    doc_ids = [f"d{i}" for i in range(DOCUMENTS)]
    query_ids = [f"q{i}" for i in range(QUERIES)]
    qrels = {q: {doc_ids[s]: 1} for q, s in zip(query_ids, sources)}
    return embed.Dataset("synthetic", token_set(doc_ids, documents),
                         token_set(query_ids, queries), qrels, 0.0)


def check(condition: bool, message: str):
    print(("ok   " if condition else "FAIL ") + message, flush=True)
    if not condition:
        sys.exit(1)


def main():
    work_dir = tempfile.mkdtemp(prefix="tessera-peers-smoke-")
    try:
        run_checks(work_dir)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def run_checks(work_dir: str):
    dataset = synthetic_dataset()
    results = {name: peers.run_peer(name, dataset, k=10, work_dir=work_dir)
               for name in peers.PEERS}
    for name, result in results.items():
        check(result["error"] is None, f"{name} runs: {result['error']}")
        check(len(result["latencies_ms"]) == QUERIES and len(result["run"]) == QUERIES,
              f"{name} answers every query")
        print("     " + peers.report_line(result, dataset.qrels))

    exact, maxsim = results["numpy-brute-force"]["run"], results["maxsim-cpu"]["run"]
    same_lists = all(list(exact[q]) == list(maxsim[q]) for q in exact)
    worst = max(abs(exact[q][d] - maxsim[q][d]) / abs(exact[q][d]) for q in exact for d in exact[q])
    check(same_lists and worst < 1e-3,
          f"maxsim-cpu = brute force (same top-10, max rel diff {worst:.1e})")
    check(metrics.evaluate(dataset.qrels, exact)["ndcg@10"] > 0.9,
          "brute force finds the sources")
    plaid_ndcg = metrics.evaluate(dataset.qrels, results["fast-plaid"]["run"])["ndcg@10"]
    check(plaid_ndcg > 0.8, f"fast-plaid finds the sources (nDCG@10 {plaid_ndcg:.3f})")
    warp_ndcg = metrics.evaluate(dataset.qrels, results["xtr-warp"]["run"])["ndcg@10"]
    check(warp_ndcg > 0.8, f"xtr-warp finds the sources (nDCG@10 {warp_ndcg:.3f})")

    swept = peers.run_peer("fast-plaid", dataset, k=10, work_dir=work_dir, n_ivf_probe=2,
                           n_full_scores=256)
    check(swept["error"] is None and "reused" in swept["notes"]
          and "n_ivf_probe=2" in swept["config"],
          f"fast-plaid sweep reuses the index: {swept.get('config')}")
    check(peers.run_peer("fast-plaid", dataset, work_dir=work_dir, n_probe=2)["error"]
          is not None, "unknown fast-plaid setting is an error")
    warp_swept = peers.run_peer("xtr-warp", dataset, k=10, work_dir=work_dir, nprobe=8, bound=64)
    check(warp_swept["error"] is None and "reused" in warp_swept["notes"]
          and "nprobe=8" in warp_swept["config"],
          f"xtr-warp sweep reuses the index: {warp_swept.get('config')}")
    check(peers.run_peer("no-such-peer", dataset)["error"] is not None,
          "unknown peer is an error")


if __name__ == "__main__":
    main()
