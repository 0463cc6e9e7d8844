"""Quality and speed of Tessera on a BEIR-layout data set, next to peer engines, in one run.

    scripts/eval --data ../shared/data/scifact [--out DIR] [--server PATH]
                 [--skip-peers | --peers NAMES]

Starts a tessera-server on a loopback port, creates one collection per configuration, ingests
the data set's token embeddings (embed.py) through the Python client over gRPC, runs every judged
query one at a time and scores the runs with pytrec_eval (nDCG@10, recall@100). The peers
(peers.py) run on the same embeddings in the same process afterwards. Writes results.json,
results.md and plots (report.py) to --out (default build/eval/<data set name>).

Configurations (all exhaustive unless named "cascade"):
  full MaxSim          p = 1 (every token stored), fp32 and fp16 storage
  ward-p / reference-p hierarchical pooling at p = 2, 3, 4, 6 (fp16), the published n / p rule
  ward-p-hH            ward p = 3, 4 with the default merge-height limit (max_merge_height
                       0.3), and p = 2 with limits 0.2, 0.25, 0.35, 0.4
  ward-2-min-32        ward p = 2 with a floor of 32 vectors per document (min_vectors)
  cascade              the default collection (ward p = 2 cut at most at merge height 0.3,
                       fp16, centroid candidates from 16,384 vectors, exact scan below)
                       searched with the default options for k = 10 and a sweep of N / k'
  cascade-plain        the same with the plain n / p cut (max_merge_height 0)
  cascade-ivf          the default collection, stage 1 on FAISS IVF1024,Flat (nprobe 64)
                       instead of "auto"
  cascade-global       p = 1 with one global-mean candidate vector per document
  codes-b              the default pooling, centroid index from 65,536 vectors on (the compact
                       mode's first training), rerank from the b-bit codes scored without
                       decoding (no rerank vectors stored), exhaustive and the default search
                       for k = 10
  page-*               the page simulation (see simulate_pages): spatial pooling of a token grid
"""

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "e2e"))  # the e2e tests' server launcher
sys.path.insert(0, os.path.dirname(HERE))  # bench/machine.py

import e2e_util  # noqa: E402  (also puts client/python on the path)
import machine  # noqa: E402
import embed  # noqa: E402
from metrics import evaluate, recall_vs_exact  # noqa: E402
import peers  # noqa: E402
import report  # noqa: E402

TOP_K = 100  # every run keeps 100 hits so that recall@100 is defined
WARMUP_QUERIES = 5
TOKENS_PER_LINE = 16  # page simulation: tokens per grid row
# Settings per peer run ({} = the peer's defaults); the first is the peer's headline row.
# fast-plaid: k-means on a 1,024-document sample (its default samples every document of these
# sets: 8+ minutes of k-means for scifact's 16,384 centroids on 2 cores) and batch_size 256 (its
# "auto" sizes batches from GPU memory, which a CPU does not have: 3-8x slower here); two depths
# of exact rescoring, n_full_scores 1,024 and 256 (its default 4,096 rescores whole sets this
# small).
FAST_PLAID_BUILD = {"n_samples_kmeans": 1024}
# xtr-warp: its own per-query tuning first (optimize_hyperparams: nprobe 2-4 at these sizes),
# then two deeper probes (bound = 8 · nprobe, as its tuning sets it) for its quality ceiling.
# Its residual codec trains on at most 150,000 tokens: the default, 1,000,000, panics on scifact
# at dim 384 (torch's quantile(): "input tensor is too large"), while medline's 196,288 tokens
# passed.
XTR_WARP_BUILD = {"codec_sample_max_tokens": 150_000}
PEER_SWEEPS = {"fast-plaid": [dict(FAST_PLAID_BUILD, batch_size=256, n_full_scores=1024),
                              dict(FAST_PLAID_BUILD, batch_size=256, n_full_scores=256)],
               "xtr-warp": [dict(XTR_WARP_BUILD), dict(XTR_WARP_BUILD, nprobe=8, bound=64),
                            dict(XTR_WARP_BUILD, nprobe=16, bound=128)]}


@dataclasses.dataclass
class Search:
    label: str
    exhaustive: bool = True
    num_candidates: int = 0
    per_token_candidates: int = 0
    k: int = 0  # hits asked for; 0: TOP_K, or N when N < TOP_K


@dataclasses.dataclass
class Config:
    """One collection: how it is created, how documents are sent, how it is searched."""
    name: str
    group: str  # pooling | dtype | cascade | page
    create: Dict
    searches: List[Search]
    pooling: str = "none"
    pool_factor: int = 1
    dtype: str = "fp16"
    page_layout: bool = False  # send documents as token grids (page simulation)
    # The configuration whose exhaustive run ranks the same vectors exactly (recall@10 vs exact);
    # None: this one's own exhaustive search, when it has one.
    exact: Optional[str] = None


EXHAUSTIVE = [Search("exhaustive")]
# Exhaustive-only collections need no useful candidate index: one global vector is the cheapest.
NO_STAGE1 = {"kind": "global_mean", "factory": "Flat"}


def tessera_configs() -> List[Config]:
    configs = [
        Config("full-fp32", "dtype", dict(pool_factor=1, dtype="fp32", candidates=NO_STAGE1),
               EXHAUSTIVE, "none", 1, "fp32"),
        Config("full-fp16", "pooling", dict(pool_factor=1, dtype="fp16", candidates=NO_STAGE1),
               EXHAUSTIVE, "none", 1, "fp16"),
    ]
    for method in ("ward", "reference"):
        for p in (2, 3, 4, 6):
            configs.append(Config(f"{method}-{p}", "pooling",
                                  dict(pool_factor=p, method=method, max_merge_height=0,
                                       candidates=NO_STAGE1),
                                  EXHAUSTIVE, method, p))
    # The default's merge-height limit at higher pool factors (ward p = 2 with it is "cascade"'s
    # exhaustive row), other limits at p = 2 (how the default's was chosen), and the alternative
    # it was chosen over: a floor of vectors per document.
    for p in (3, 4):
        configs.append(Config(f"ward-{p}-h{report.ADAPTIVE_MERGE_HEIGHT}", "adaptive",
                              dict(pool_factor=p, candidates=NO_STAGE1), EXHAUSTIVE, "ward", p))
    for height in (0.2, 0.25, 0.35, 0.4):
        configs.append(Config(f"ward-2-h{height}", "adaptive",
                              dict(pool_factor=2, max_merge_height=height, candidates=NO_STAGE1),
                              EXHAUSTIVE, "ward", 2))
    configs.append(Config("ward-2-min-32", "adaptive",
                          dict(pool_factor=2, min_vectors=32, max_merge_height=0,
                               candidates=NO_STAGE1),
                          EXHAUSTIVE, "ward", 2))
    # "default": k = 10 with every other option the server's (N = 100 on every set here: the
    # centroid index's DefaultNumCandidates for k = 10 below 262,144 vectors, 154 on scifact); its
    # recall@100 counts those 10 hits. The N sweep asks for k = 100 hits, so that recall@100 is
    # defined.
    sweep = [Search("exhaustive"), Search(report.DEFAULT_SEARCH, False, k=10),
             Search("cascade N=100", False, 100)]
    sweep += [Search(f"cascade N={n}", False, n) for n in (20, 50, 200, 500)]
    sweep += [Search(f"cascade N=100 k'={kp}", False, 100, kp) for kp in (32, 256, 1000)]
    configs.append(Config("cascade", "cascade", {}, sweep, "ward", 2))
    # The default collection with the plain n / p cut (the default before 2026-12-05), searched
    # the same way: what the merge-height limit costs and gains in one run.
    configs.append(Config("cascade-plain", "cascade", dict(max_merge_height=0),
                          [Search("exhaustive"), Search(report.DEFAULT_SEARCH, False, k=10)],
                          "ward", 2))
    # Stage 1 as the exact scan of the candidate vectors (the default's below 16,384 vectors per
    # shard, and up to 262,144 before 2026-12-05), against the default's centroid index.
    configs.append(Config("cascade-scan", "cascade", dict(candidates={"factory": "Flat"}),
                          [Search("exhaustive"), Search(report.DEFAULT_SEARCH, False, k=10)] +
                          [Search(f"cascade N={n}", False, n) for n in (50, 100, 200)],
                          "ward", 2))
    # Stage 1 on an IVF index of the same pooled candidates (FAISS trains it once 50k candidate
    # vectors exist; smaller collections keep searching them exactly).
    configs.append(Config("cascade-ivf", "cascade",
                          dict(candidates={"kind": "pooled", "factory": "IVF1024,Flat"}),
                          [Search("cascade N=100", False, 100),
                           Search("cascade N=200", False, 200)],
                          "ward", 2, exact="cascade"))
    configs.append(Config("cascade-global", "cascade",
                          dict(pool_factor=1, candidates={"kind": "global_mean"}),
                          [Search(f"cascade N={n}", False, n) for n in (100, 500)], "none", 1,
                          exact="full-fp16"))
    for bits in (4, 2):
        configs.append(Config(f"codes-{bits}", "codes",
                              dict(candidates={"factory": "centroid", "residual_bits": bits,
                                               "rerank_from_codes": True}),
                              [Search("exhaustive"), Search(report.DEFAULT_SEARCH, False, k=10)],
                              "ward", 2, exact="cascade"))
    # The page simulation: a document's tokens laid out in reading order on a grid of
    # TOKENS_PER_LINE columns ([CLS] a prefix token, [SEP] a suffix token).
    page = [("page-rows", dict(spatial="rows")),
            ("page-tiles-2x4", dict(spatial={"mode": "tiles", "tile_rows": 2, "tile_cols": 4})),
            ("page-tiles-2x8", dict(spatial={"mode": "tiles", "tile_rows": 2, "tile_cols": 8})),
            ("page-windows-2-1",
             dict(spatial={"mode": "row_windows", "window_rows": 2, "window_stride": 1})),
            ("page-global", dict(spatial="global"))]
    for name, create in page:
        mode = create["spatial"] if isinstance(create["spatial"], str) else \
            create["spatial"]["mode"]
        configs.append(Config(name, "page", dict(create, candidates=NO_STAGE1), EXHAUSTIVE,
                              mode, 0, page_layout=True))
    for p in (4, 8, 16):
        configs.append(Config(f"page-ward-{p}", "page",
                              dict(pool_factor=p, candidates=NO_STAGE1), EXHAUSTIVE, "ward", p,
                              page_layout=True))
    configs.append(Config("page-global-rerank", "page",
                          dict(pool_factor=1, candidates={"kind": "global_mean"}),
                          [Search("cascade N=100", False, 100)], "global+full", 1,
                          page_layout=True, exact="full-fp16"))
    return configs


def page_document(tokens: np.ndarray):
    """(tokens, layout) of a document as a page: [CLS] as prefix, [SEP] as suffix, the body in
    rows of TOKENS_PER_LINE; the last line is completed by repeating its last token, which adds
    no new direction (MaxSim unchanged, a line's mean weighted toward its last token). A
    document without text ([CLS][SEP] only) becomes one line of its [SEP] vector."""
    body = tokens[1:-1] if tokens.shape[0] > 2 else tokens[-1:]
    rows = -(-body.shape[0] // TOKENS_PER_LINE)
    pad = rows * TOKENS_PER_LINE - body.shape[0]
    if pad:
        body = np.concatenate([body, np.repeat(body[-1:], pad, axis=0)])
    return np.concatenate([tokens[:1], body, tokens[-1:]]), (rows, TOKENS_PER_LINE, 1, 1)


def documents(dataset, page_layout: bool):
    corpus = dataset.corpus
    for i, doc_id in enumerate(corpus.ids):
        tokens = corpus.matrix(i)
        if page_layout:
            grid_tokens, layout = page_document(tokens)
            yield (doc_id, grid_tokens, layout)
        else:
            yield (doc_id, tokens)


def latency_summary(latencies_ms: List[float]) -> Dict:
    values = np.asarray(latencies_ms)
    return {"qps": float(len(values) / (values.sum() / 1000.0)),
            "latency_ms": {f"p{q}": float(np.percentile(values, q)) for q in (50, 95, 99)},
            "latencies_ms": [round(float(v), 3) for v in values]}


def run_searches(client, name, dataset, search: Search):
    queries = dataset.queries
    # k ≤ N: a sweep point with N < TOP_K returns N hits (its recall@100 counts only those).
    k = search.k or (min(TOP_K, search.num_candidates) if search.num_candidates else TOP_K)
    options = dict(k=k, exhaustive=search.exhaustive, num_candidates=search.num_candidates,
                   per_token_candidates=search.per_token_candidates)
    for i in range(min(WARMUP_QUERIES, len(queries))):
        client.search(name, queries.matrix(i), **options)
    run, latencies, scored, stages = {}, [], [], []
    for i, query_id in enumerate(queries.ids):
        start = time.perf_counter()
        result = client.search(name, queries.matrix(i), **options)
        latencies.append((time.perf_counter() - start) * 1000.0)
        run[query_id] = {hit.id: float(hit.score) for hit in result}
        scored.append(result.documents_scored)
        stages.append(result.timings)
    stage_means = {key: float(np.mean([s[key] for s in stages])) for key in stages[0]}
    return run, latencies, float(np.mean(scored)), stage_means


def wait_for_training(client, name, centroid=False, timeout=600.0):
    """Until no shard of the collection trains a centroid index in the background (a shard that
    passed its threshold during ingest searches the exact scan until its training ends), and with
    `centroid`, every shard searches a trained centroid index."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = client.collection_info(name)["stats"]
        if stats.get("training_shards", 0) == 0 and (not centroid or all(
                index.startswith("Centroid") for index in stats["candidate_indexes"])):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{name}: still training after {timeout:.0f} s")


def load_collection(client, dataset, config: Config) -> float:
    """Creates config's collection, ingests the corpus, waits for its trainings and flushes it;
    returns the ingest's seconds."""
    client.create_collection(config.name, dim=dataset.corpus.tokens.shape[1], **config.create)
    # codes-b: the documents in one stream, as a user writes them; the shard trains its codebook
    # in the background once it holds the mode's threshold of vectors (65,536), re-encodes the
    # documents written before and drops their vectors.
    summary = client.ingest(config.name, documents(dataset, config.page_layout), batch_size=32,
                            progress=False, total=len(dataset.corpus), dtype="fp32")
    if summary.failed:
        raise RuntimeError(f"{config.name}: {len(summary.failed)} documents rejected, "
                           f"first: {summary.failed[0]}")
    wait_for_training(client, config.name,
                      centroid=config.create.get("candidates", {}).get("factory") == "centroid")
    client.flush(config.name)
    return summary.seconds


def run_config(client, dataset, config: Config, exact_runs: Dict[str, Dict],
               log: Callable[[str], None]) -> List[Dict]:
    """Creates, fills, searches and drops one collection; the exhaustive run is kept in
    exact_runs[config.name] for the configurations that rerank the same vectors."""
    seconds = load_collection(client, dataset, config)
    stats = client.collection_info(config.name)["stats"]
    rows = []
    for search in config.searches:
        run, latencies, scored, stage_means = run_searches(client, config.name, dataset, search)
        if search.exhaustive:
            exact_runs[config.name] = run
        # Recall vs exact is defined for searches that could miss: not for a lone exhaustive run.
        alone = search.exhaustive and len(config.searches) == 1
        exact = None if alone else exact_runs.get(config.exact or config.name)
        row = dict(system="tessera", name=config.name, search=search.label, group=config.group,
                   pooling=config.pooling, pool_factor=config.pool_factor, dtype=config.dtype,
                   exhaustive=search.exhaustive, num_candidates=search.num_candidates,
                   per_token_candidates=search.per_token_candidates,
                   vectors_per_document=stats["vectors_per_document"],
                   bytes_per_token=stats["disk_bytes_per_original_token"],
                   candidate_indexes=sorted(set(stats["candidate_indexes"])),
                   ingest_docs_per_s=len(dataset.corpus) / seconds,
                   documents_scored=scored,
                   documents_scored_fraction=scored / len(dataset.corpus),
                   stage_ms=stage_means, **evaluate(dataset.qrels, run),
                   **{"recall@10_vs_exact": recall_vs_exact(run, exact) if exact else None},
                   **latency_summary(latencies))
        log(f"  {config.name:<18} {search.label:<26} nDCG@10 {row['ndcg@10']:.4f}  "
            f"R@100 {row['recall@100']:.4f}  {row['vectors_per_document']:6.1f} vec/doc  "
            f"{row['qps']:7.1f} QPS  P95 {row['latency_ms']['p95']:7.1f} ms")
        rows.append(row)
    client.drop_collection(config.name)
    return rows


def run_peers(dataset, work_dir, log, names: List[str]) -> List[Dict]:
    """The named peers (and each of their sweep settings); recall@10 vs exact is measured against
    the first peer, the NumPy brute force (none without it)."""
    rows, exact = [], None
    for name in names:
        for settings in PEER_SWEEPS.get(name, [{}]):
            start = time.monotonic()
            result = peers.run_peer(name, dataset, TOP_K, work_dir, **settings)
            # search: the settings of this run (short, for labels); config: every setting used.
            short = ", ".join(f"{key}={value}" for key, value in settings.items()
                              if key not in FAST_PLAID_BUILD and key not in XTR_WARP_BUILD)
            row = dict(system=name, name=name, group="peer", search=short or "defaults",
                       config=result.get("config", ""), error=result.get("error"))
            if not row["error"]:
                row.update({key: result[key] for key in
                            ("index_seconds", "ingest_docs_per_s", "index_bytes",
                             "bytes_per_token", "vectors_per_document", "notes")})
                row.update(evaluate(dataset.qrels, result["run"]))
                if name == "numpy-brute-force":
                    exact = result["run"]
                row["recall@10_vs_exact"] = recall_vs_exact(result["run"], exact) if exact else None
                row["default"] = settings == PEER_SWEEPS.get(name, [{}])[0]
                row.update(latency_summary(result["latencies_ms"]))
                log(f"  {name:<18} {row['search'][:26]:<26} nDCG@10 {row['ndcg@10']:.4f}  "
                    f"R@100 {row['recall@100']:.4f}  {row['qps']:7.1f} QPS  "
                    f"P95 {row['latency_ms']['p95']:7.1f} ms  "
                    f"({time.monotonic() - start:.0f} s)")
            else:
                log(f"  {name}: not run: {row['error']}")
            rows.append(row)
    return rows


def machine_description() -> str:
    info = machine.describe()
    return f"{info['cpu_model']} ({info['cpu_isa']} kernels), {os.cpu_count()} CPUs, " \
           f"{platform.system()} {platform.release()}"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a folder in BEIR layout")
    parser.add_argument("--out", help="output folder (default build/eval/<data set name>)")
    parser.add_argument("--server", help="tessera-server binary (default build/bin)")
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--peers", default=",".join(peers.PEERS),
                        help="comma-separated peers to run (default: all, "
                             f"{', '.join(peers.PEERS)})")
    parser.add_argument("--only", help="comma-separated configuration names to run")
    args = parser.parse_args()
    peer_names = args.peers.split(",")
    unknown = sorted(set(peer_names) - set(peers.PEERS))
    if unknown:
        parser.error(f"--peers: unknown {', '.join(unknown)}, expected some of "
                     f"{', '.join(peers.PEERS)}")

    started = time.monotonic()
    dataset = embed.load_dataset(args.data)
    out_dir = os.path.abspath(args.out or os.path.join(REPO_ROOT, "build", "eval", dataset.name))
    os.makedirs(out_dir, exist_ok=True)
    log_file = open(os.path.join(out_dir, "eval.log"), "w")

    def log(line):
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    lengths = dataset.corpus.lengths()
    log(f"{dataset.name}: {len(dataset.corpus)} documents ({lengths.mean():.1f} tokens each), "
        f"{len(dataset.queries)} queries; embeddings "
        + (f"computed in {dataset.embed_seconds:.0f} s" if dataset.embed_seconds else "cached"))

    e2e_util.SERVER_BINARY = args.server or os.path.join(REPO_ROOT, "build", "bin",
                                                         "tessera-server")
    rows, exact_runs = [], {}
    with e2e_util.Server(threads=os.cpu_count()).running() as server, server.client() as client:
        for config in tessera_configs():
            if args.only and config.name not in args.only.split(","):
                continue
            config_start = time.monotonic()
            rows.extend(run_config(client, dataset, config, exact_runs, log))
            log(f"    ({time.monotonic() - config_start:.0f} s)")
    if not args.skip_peers:
        rows.extend(run_peers(dataset, os.path.join(out_dir, "peers"), log, peer_names))

    results = dict(
        dataset=dataset.name, data_dir=os.path.abspath(args.data),
        command="scripts/eval " + " ".join(sys.argv[1:]),
        machine=machine_description(), cpu_model=machine.cpu_model(),
        cpu_isa=machine.best_isa(machine.cpu_flags()),
        git_commit=subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True).stdout.strip(),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        model=embed.MODEL_NAME, model_package=embed.MODEL_PACKAGE,
        doc_max_tokens=embed.DOC_MAX_TOKENS, query_max_tokens=embed.QUERY_MAX_TOKENS,
        documents=len(dataset.corpus), queries=len(dataset.queries),
        tokens_per_document=float(lengths.mean()), embed_seconds=dataset.embed_seconds,
        tokens_per_line=TOKENS_PER_LINE, configurations=rows,
        seconds=time.monotonic() - started)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    report.write(results, out_dir)
    log(f"wrote {out_dir}/results.json, results.md and plots in "
        f"{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
