"""Peer engines on the vectors a Tessera shard stores, at scale (scripts/bench-scale --peers).

Reads what `tessera-bench-index --export_dir DIR` wrote (file formats at the top of
bench/index_benchmark.cc): every document's stored (pooled, fp16) vectors, the timed queries and
the exact top-10 reference (exact MaxSim over those vectors). Each peer indexes the same vectors
and answers each query alone (bench/eval/peers.py: batch size 1, after untimed warm-up queries);
every setting is reported with its build seconds, index bytes per stored vector, P50/P95 latency,
QPS and recall@10 against the reference. "QPS at equal recall" is then, per engine, its fastest
setting whose recall@10 is at least --target_recall − 0.005.

  fast-plaid   CPU, built once per --nbits (default 4, its own; 0: not run — its build passes
               30 minutes beyond ~90,000 documents of 64 vectors on 2 cores) and searched with every
               --n_ivf_probe × --n_full_scores. Its k-means samples enough documents for 32
               vectors per centroid, as Tessera's centroid trainer does, of the centroid count
               fast-plaid picks (16,384 of 100,000 documents of 64 vectors); its own default
               samples 16·√(120·documents) documents (55,000 of 100,000), which would make k-means
               most of the build, and bench/eval's 1,024 are too few at scale. The index lives in
               --work_dir (default: a temporary folder, removed); one already built there with the
               same settings is reused, and its build seconds are then the earlier build's.
  xtr-warp     CPU (xtr-warp-rs, WARP in Rust), built once with its defaults (4 bits, its own
               centroid count) and searched with its own per-query tuning and with each nonzero
               --xtr_nprobe (bound = 8·nprobe, as its tuning sets it); search num_threads =
               --threads.
  numpy        exhaustive fp32 MaxSim on the first --check_queries queries: a check of the export,
               not a peer. Its top 10 must be the reference's (a document may differ only where
               its score ties the 10th within a relative 1e-4) or the script exits with status 1.

--engine NAME=FILE adds a tessera-bench-index JSON: its settings join the table and the
equal-recall lines (its bytes per vector are the candidate structures' memory; the peers' are
their on-disk index), and the JSON is kept under NAME. --target_recall defaults to the first
engine's recall@10 (its first setting, the defaults in scripts/bench-scale). Threads: the process
is pinned to --threads cores before NumPy, torch and peers.py (which sizes every thread pool from
the CPU affinity) are imported.

  python peers_at_scale.py --export_dir DIR [--engine NAME=FILE ...] [--target_recall R]
                           [--threads 2] [--json FILE]
"""

import argparse
import itertools
import json
import math
import os
import shutil
import sys
import tempfile
import time

RECALL_TOLERANCE = 0.005
TIE_RTOL = 1e-4
SAMPLE_VECTORS_PER_CENTROID = 32  # index/collection/shard.cc kSampleVectorsPerCentroid


def int_list(text: str) -> list:
    return [int(value) for value in text.split(",") if value]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export_dir", required=True)
    parser.add_argument("--engine", action="append", default=[], metavar="NAME=FILE",
                        help="a tessera-bench-index JSON to compare with (repeatable)")
    parser.add_argument("--target_recall", type=float,
                        help="recall@10 to compare QPS at (default: the first engine's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--nbits", type=int_list, default="4",
                        help="fast-plaid builds, comma-separated; 0 skips fast-plaid")
    parser.add_argument("--n_ivf_probe", type=int_list, default="8,32",
                        help="fast-plaid sweep, comma-separated")
    parser.add_argument("--n_full_scores", type=int_list, default="256,1024,4096",
                        help="fast-plaid sweep, comma-separated")
    parser.add_argument("--n_samples_kmeans", type=int, default=0,
                        help="fast-plaid k-means sample in documents (0: 32 vectors per centroid)")
    parser.add_argument("--xtr_nprobe", type=int_list, default="0,8,16,32",
                        help="xtr-warp sweep of nprobe, comma-separated (0: its own tuning; "
                             "bound = 8·nprobe otherwise); an empty value skips xtr-warp")
    parser.add_argument("--check_queries", type=int, default=3)
    parser.add_argument("--work_dir",
                        help="the peers' indexes (default: a temporary folder)")
    parser.add_argument("--json")
    return parser.parse_args()


if __name__ == "__main__":
    ARGS = parse_args()
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:ARGS.threads])

import numpy as np  # noqa: E402  (after the pinning above)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "eval"))
import embed  # noqa: E402
import peers  # noqa: E402


def load_export(directory: str):
    """The export as peers.py's dataset (corpus: the stored vectors, memory-mapped fp16; queries:
    fp32, ids "q0", "q1", …) and the reference: one set of top-10 ids per checked query."""
    def path(name):
        return os.path.join(directory, name)

    doc_offsets = np.fromfile(path("doc_offsets.u64"), dtype="<u8").astype(np.int64)
    vectors = np.memmap(path("doc_vectors.f16"), dtype="<f2", mode="r")
    dim = vectors.size // int(doc_offsets[-1])
    with open(path("doc_ids.txt")) as f:
        doc_ids = f.read().splitlines()
    query_offsets = np.fromfile(path("query_offsets.u64"), dtype="<u8").astype(np.int64)
    queries = np.fromfile(path("queries.f32"), dtype="<f4").reshape(-1, dim)
    with open(path("exact_top10.txt")) as f:
        reference = [set(line.split()) for line in f]
    if len(doc_ids) + 1 != len(doc_offsets) or queries.shape[0] != query_offsets[-1]:
        raise SystemExit(f"{directory}: ids, offsets and vectors disagree")
    corpus = embed.TokenSet(doc_ids, vectors.reshape(-1, dim), doc_offsets)
    query_set = embed.TokenSet([f"q{i}" for i in range(len(query_offsets) - 1)], queries,
                               query_offsets)
    dataset = embed.Dataset(os.path.basename(os.path.normpath(directory)), corpus, query_set,
                            qrels={}, embed_seconds=0.0)
    return dataset, reference


def check_reference(dataset, reference, count: int) -> dict:
    """Exhaustive NumPy MaxSim of the first `count` checked queries against the reference."""
    tokens = peers.corpus_fp32(dataset)
    starts = dataset.corpus.offsets[:-1]
    ids = dataset.corpus.ids
    failures, ties, seconds = [], 0, 0.0
    count = min(count, len(reference))
    for q in range(count):
        start = time.perf_counter()
        scores = peers.maxsim_all(tokens, starts, dataset.queries.matrix(q))
        best, best_scores = peers.top_k(scores, 10)
        seconds += time.perf_counter() - start
        found = {ids[d] for d in best}
        if found == reference[q]:
            continue
        cut = float(best_scores[-1])
        index = {doc_id: d for d, doc_id in enumerate(ids)}
        differing = [index[doc_id] for doc_id in found ^ reference[q]]
        if all(abs(scores[d] - cut) <= TIE_RTOL * abs(cut) for d in differing):
            ties += 1
        else:
            failures.append(q)
    return dict(queries=count, ms_per_query=1000 * seconds / max(count, 1),
                queries_tied_at_cut=ties, failed_queries=failures)


def recall_at_10(run: dict, query_ids, reference) -> float:
    return float(np.mean([len(set(run[query_id]) & truth) / 10
                          for query_id, truth in zip(query_ids, reference)]))


def kmeans_sample_documents(lengths: np.ndarray) -> int:
    """Documents for 32 vectors per centroid of fast-plaid 1.7.0's count, 2^⌊log2(16·√vectors)⌋."""
    centroids = 2 ** math.floor(math.log2(16 * math.sqrt(int(lengths.sum()))))
    return min(len(lengths), math.ceil(SAMPLE_VECTORS_PER_CENTROID * centroids / lengths.mean()))


def run_fast_plaid(dataset, reference, args, work_dir: str) -> list:
    """One row per build × search setting; each index is built by its first search setting and
    reused by the rest (peers.build_fast_plaid)."""
    samples = args.n_samples_kmeans or kmeans_sample_documents(dataset.corpus.lengths())
    rows = []
    for nbits, probes, full in itertools.product(args.nbits, args.n_ivf_probe,
                                                 args.n_full_scores):
        # batch_size 256: fast-plaid's "auto" sizes batches from GPU memory (see run_eval.py).
        result = peers.run_peer("fast-plaid", dataset, 10, work_dir, nbits=nbits,
                                n_samples_kmeans=samples, batch_size=256, n_ivf_probe=probes,
                                n_full_scores=full)
        rows.append(peer_row("fast-plaid",
                             f"nbits={nbits}, n_ivf_probe={probes}, n_full_scores={full}",
                             result, dataset, reference))
        print(format_row(rows[-1]), flush=True)
    return rows


def run_xtr_warp(dataset, reference, args, work_dir: str) -> list:
    """One row per --xtr_nprobe; the index (its defaults: 4 bits, its own centroid count) is built
    by the first and reused by the rest (peers.build_or_reuse)."""
    rows = []
    for nprobe in args.xtr_nprobe:
        settings = dict(nprobe=nprobe, bound=8 * nprobe) if nprobe else {}
        result = peers.run_peer("xtr-warp", dataset, 10, work_dir, **settings)
        rows.append(peer_row("xtr-warp", f"nprobe={nprobe}, bound={8 * nprobe}" if nprobe
                             else "its own tuning", result, dataset, reference))
        print(format_row(rows[-1]), flush=True)
    return rows


def peer_row(engine: str, setting: str, result: dict, dataset, reference) -> dict:
    """A peers.run_peer result as a table row."""
    row = dict(engine=engine, setting=setting, error=result["error"])
    if "run" in result:
        latencies = result["latencies_ms"]
        row.update(build_s=result["index_seconds"],
                   bytes_per_vector=result["index_bytes"] / len(dataset.corpus.tokens),
                   p50_ms=float(np.percentile(latencies, 50)),
                   p95_ms=float(np.percentile(latencies, 95)), qps=result["qps"],
                   recall_at_10=recall_at_10(result["run"], dataset.queries.ids, reference),
                   config=result["config"], notes=result["notes"])
    return row


def engine_rows(name: str, bench: dict) -> list:
    """The settings of a tessera-bench-index JSON as rows."""
    return [dict(engine=name,
                 setting=(f"nprobe={s['nprobe']}, num_candidates={s['num_candidates']}"
                          if s["nprobe"] or s["num_candidates"] else "defaults"),
                 error=None, build_s=bench["build_s"],
                 bytes_per_vector=bench["ram_candidate_bytes_per_vector"], p50_ms=s["p50_ms"],
                 p95_ms=s["p95_ms"], qps=s["qps"], recall_at_10=s["recall_at_10"])
            for s in bench["settings"]]


def equal_recall(rows: list, target: float) -> list:
    """Per engine (in row order): its fastest row within RECALL_TOLERANCE of the target or above
    it, else its best-recall row with reaches=False."""
    lines = []
    for engine in dict.fromkeys(row["engine"] for row in rows):
        measured = [row for row in rows if row["engine"] == engine and not row["error"]]
        if not measured:
            lines.append(dict(engine=engine, reaches=False, setting=None))
            continue
        reaching = [row for row in measured if row["recall_at_10"] >= target - RECALL_TOLERANCE]
        best = (max(reaching, key=lambda row: row["qps"]) if reaching
                else max(measured, key=lambda row: row["recall_at_10"]))
        lines.append(dict({key: best[key] for key in ("engine", "setting", "qps", "recall_at_10",
                                                      "p50_ms", "p95_ms", "build_s",
                                                      "bytes_per_vector")},
                          reaches=bool(reaching)))
    return lines


HEADER = (f"{'engine':<16} {'setting':<44} {'build s':>8} {'B/vector':>9} {'P50 ms':>8} "
          f"{'P95 ms':>8} {'QPS':>8} {'recall@10':>9}")


def format_row(row: dict) -> str:
    if "qps" not in row:
        return f"{row['engine']:<16} {row['setting']:<44} ERROR {row['error']}"
    return (f"{row['engine']:<16} {row['setting']:<44} {row['build_s']:8.1f} "
            f"{row['bytes_per_vector']:9.2f} {row['p50_ms']:8.2f} {row['p95_ms']:8.2f} "
            f"{row['qps']:8.1f} {row['recall_at_10']:9.4f}")


def format_line(line: dict) -> str:
    if line["setting"] is None:
        return f"  {line['engine']:<16} no setting ran"
    if not line["reaches"]:
        return (f"  {line['engine']:<16} none reaches the target (best recall@10 "
                f"{line['recall_at_10']:.4f}, {line['qps']:.1f} QPS: {line['setting']})")
    return (f"  {line['engine']:<16} {line['qps']:8.1f} QPS  recall@10 {line['recall_at_10']:.4f}"
            f"  P95 {line['p95_ms']:.2f} ms  ({line['setting']})")


def main(args):
    dataset, reference = load_export(args.export_dir)
    engines = {}
    for spec in args.engine:
        name, _, path = spec.partition("=")
        with open(path) as f:
            engines[name] = json.load(f)
    target = args.target_recall
    if target is None:
        if not engines:
            raise SystemExit("--target_recall is needed without --engine")
        target = next(iter(engines.values()))["recall_at_10"]
    lengths = dataset.corpus.lengths()
    print(f"{args.export_dir}: {len(lengths)} documents, {int(lengths.sum())} stored vectors "
          f"(dim {dataset.corpus.tokens.shape[1]}), {len(dataset.queries)} queries, "
          f"{len(reference)} with a reference; {len(os.sched_getaffinity(0))} threads", flush=True)

    check = check_reference(dataset, reference, args.check_queries)
    print(f"numpy exhaustive MaxSim: {check['ms_per_query']:.1f} ms/query; top 10 vs the "
          f"reference on {check['queries']} queries: {len(check['failed_queries'])} differ, "
          f"{check['queries_tied_at_cut']} only by ties at the cut", flush=True)
    if check["failed_queries"]:
        raise SystemExit(f"the export's reference is not exact MaxSim over its vectors "
                         f"(queries {check['failed_queries']})")

    rows = [row for name, bench in engines.items() for row in engine_rows(name, bench)]
    print(HEADER)
    for row in rows:
        print(format_row(row), flush=True)
    peer_rows = {}
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="tessera-peers-at-scale-")
    try:
        if args.nbits != [0]:
            peer_rows["fast-plaid"] = run_fast_plaid(dataset, reference, args, work_dir)
        if args.xtr_nprobe:
            peer_rows["xtr-warp"] = run_xtr_warp(dataset, reference, args, work_dir)
    finally:
        if not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    all_peer_rows = [row for rows_of_peer in peer_rows.values() for row in rows_of_peer]

    lines = equal_recall(rows + all_peer_rows, target)
    print(f"QPS at equal recall@10 (target {target:.4f}, down to {target - RECALL_TOLERANCE:.4f}):")
    for line in lines:
        print(format_line(line))
    result = dict(export_dir=os.path.abspath(args.export_dir), documents=len(lengths),
                  stored_vectors=int(lengths.sum()), queries=len(dataset.queries),
                  reference_queries=len(reference), threads=len(os.sched_getaffinity(0)),
                  target_recall_at_10=target, recall_tolerance=RECALL_TOLERANCE,
                  numpy_check=check, engines=engines, peers=peer_rows,
                  qps_at_equal_recall=lines)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if any(row["error"] for row in all_peer_rows):
        sys.exit(1)


if __name__ == "__main__":
    main(ARGS)
