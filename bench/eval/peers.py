"""Peer late-interaction engines, run on the same token embeddings as Tessera.

Each peer indexes `dataset.corpus` (see embed.py), then answers every query of
`dataset.queries` alone (batch size 1, after WARMUP_QUERIES untimed queries) so that its
latencies compare with a server answering one request at a time. `run_peer` returns the
measurements as a dict (contract in its docstring) and never raises: a peer that cannot be
imported or run comes back with `error` set.

Peers, in report order:
  numpy-brute-force  exact MaxSim in fp32 with NumPy (BLAS matmul + np.maximum.reduceat);
                     also the full-MaxSim reference the other peers are checked against.
  maxsim-cpu         the `maxsim-cpu` package (Mixedbread, Rust + libxsmm), exact MaxSim.
  fast-plaid         the `fast-plaid` package (LightOn, Rust + libtorch): PLAID index,
                     k-means centroids + residual compression, approximate.
  xtr-warp           the `xtr-warp-rs` package (WARP in Rust): k-means centroids, residual
                     codes, WARP's missing-similarity imputation, approximate; its own
                     per-query tuning (optimize_hyperparams) unless settings are given.

Threads: every engine gets all CPU cores of this process (THREADS). The environment
variables below are set at import, before NumPy, torch or the Rust extensions start their
thread pools; the pools that can be resized afterwards are also set explicitly.

Usage: python peers.py [DATA_DIR]  (default /work/shared/data/scifact) runs every peer and
prints nDCG@10, recall@100, QPS, latency percentiles, index time and bytes per token.
"""

import os

THREADS = len(os.sched_getaffinity(0))
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                  "RAYON_NUM_THREADS"):
    os.environ[_variable] = str(THREADS)
# maxsim-cpu links libxsmm statically, which otherwise prints a registry report at exit.
os.environ.setdefault("LIBXSMM_VERBOSE", "0")

import hashlib  # noqa: E402  (the thread variables above must precede these imports)
import inspect  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import numpy as np  # noqa: E402
import threadpoolctl  # noqa: E402

import embed  # noqa: E402
import metrics  # noqa: E402

PEERS = ["numpy-brute-force", "maxsim-cpu", "fast-plaid", "xtr-warp"]
WARMUP_QUERIES = 3  # searched once before timing, not counted
VERIFY_QUERIES = 3  # queries whose scores are compared with exact MaxSim
VERIFY_RTOL = 1e-3

# maxsim-cpu 0.1.0 hands each (64 document tokens × query tokens × dim) product to libxsmm,
# which JITs it only while M·N·K <= 64³; larger products fall back to a BLAS sgemm that the
# wheel does not link, and the call returns garbage or segfaults (seen with dim 384 and more
# than 10 query tokens). MaxSim is a sum over query tokens, so scoring the query in slices of
# at most 64³ / (64·dim) tokens and adding the slices' scores is exact.
MAXSIM_CPU_JIT_LIMIT = 64 ** 3
MAXSIM_CPU_DOC_BLOCK = 64


def default_work_dir() -> str:
    return os.path.join(embed.cache_root(), "peers")


# ----------------------------------------------------------------------------- shared parts

def corpus_fp32(dataset) -> np.ndarray:
    """All document tokens as one C-contiguous float32 (total × dim) matrix."""
    return np.ascontiguousarray(dataset.corpus.tokens, dtype=np.float32)


def maxsim_all(tokens: np.ndarray, starts: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Exact MaxSim of `query` (n × dim, fp32) against every document.

    `tokens` is the concatenated fp32 token matrix and `starts` the first row of each
    document (offsets[:-1]); every document must have at least one token, since reduceat
    returns the token at a start, not a maximum, for an empty range."""
    similarities = query @ tokens.T  # n × total
    return np.maximum.reduceat(similarities, starts, axis=1).sum(axis=0)


def maxsim_one(document: np.ndarray, query: np.ndarray) -> float:
    """Exact MaxSim of one document, both matrices in fp32."""
    return float((query @ document.T).max(axis=1).sum())


def top_k(scores: np.ndarray, k: int):
    """Indices and scores of the k highest scores, best first."""
    k = min(k, len(scores))
    best = np.argpartition(-scores, k - 1)[:k]
    best = best[np.argsort(-scores[best], kind="stable")]
    return best, scores[best]


def search_all(dataset, search_one, k: int) -> dict:
    """Times `search_one(query_index) -> (doc_indices, scores)` on each query alone.

    The timed span is one call: from the query's stored fp16 matrix to its top-k list, so the
    conversion into the engine's input type is counted, building the run dict is not.
    Returns latencies_ms, qps and run ({query id: {doc id: score}}, top-k of each query)."""
    queries = dataset.queries
    for i in range(min(WARMUP_QUERIES, len(queries))):
        search_one(i)
    latencies = []
    run = {}
    for i, query_id in enumerate(queries.ids):
        start = time.perf_counter()
        doc_indices, scores = search_one(i)
        latencies.append((time.perf_counter() - start) * 1000.0)
        run[query_id] = {dataset.corpus.ids[d]: float(s)
                         for d, s in zip(doc_indices[:k], scores[:k])}
    return dict(latencies_ms=latencies, qps=len(latencies) / (sum(latencies) / 1000.0),
                run=run)


def index_fields(dataset, index_seconds: float, index_bytes: int, builds_index: bool) -> dict:
    """The index_* / *_per_* keys of a result; every peer here scores all tokens. Brute-force
    peers build no index: their ingest_docs_per_s is None (index_seconds is a conversion)."""
    lengths = dataset.corpus.lengths()
    return dict(index_seconds=index_seconds,
                ingest_docs_per_s=len(lengths) / index_seconds if builds_index else None,
                index_bytes=int(index_bytes),
                bytes_per_token=index_bytes / int(lengths.sum()),
                vectors_per_document=float(lengths.mean()))


def check_nonempty(dataset):
    if (dataset.corpus.lengths() <= 0).any():
        raise ValueError("a document has no tokens; MaxSim of an empty document is undefined")


# ------------------------------------------------------------------------------------ peers

def run_numpy_brute_force(dataset, k: int, work_dir: str) -> dict:
    """Exact fp32 MaxSim against every document: one BLAS matmul per query."""
    check_nonempty(dataset)
    start = time.perf_counter()
    tokens = corpus_fp32(dataset)
    index_seconds = time.perf_counter() - start
    starts = dataset.corpus.offsets[:-1]

    def search_one(i):
        query = dataset.queries.matrix(i).astype(np.float32)
        return top_k(maxsim_all(tokens, starts, query), k)

    result = dict(config="fp32, exact MaxSim over all tokens", **search_all(dataset, search_one, k))
    result.update(index_fields(dataset, index_seconds, tokens.nbytes, builds_index=False))
    result["notes"] = (f"index = fp32 token matrix in memory; index_seconds = fp16→fp32 "
                       f"conversion; NumPy BLAS threads = {THREADS} (threadpoolctl)")
    return result


def maxsim_cpu_slice_tokens(dim: int) -> int:
    """Most query tokens per maxsim-cpu call (see MAXSIM_CPU_JIT_LIMIT)."""
    return max(1, MAXSIM_CPU_JIT_LIMIT // (MAXSIM_CPU_DOC_BLOCK * dim))


def maxsim_cpu_scores(maxsim_cpu, query: np.ndarray, documents: list) -> np.ndarray:
    """maxsim_cpu.maxsim_scores_variable, summed over query slices small enough for libxsmm."""
    slice_tokens = maxsim_cpu_slice_tokens(query.shape[1])
    scores = np.zeros(len(documents), dtype=np.float32)
    for first in range(0, query.shape[0], slice_tokens):
        piece = np.ascontiguousarray(query[first:first + slice_tokens])
        scores += maxsim_cpu.maxsim_scores_variable(piece, documents)
    return scores


def run_maxsim_cpu(dataset, k: int, work_dir: str) -> dict:
    """Exact MaxSim with maxsim-cpu's variable-length API, checked against NumPy."""
    import maxsim_cpu

    check_nonempty(dataset)
    start = time.perf_counter()
    tokens = corpus_fp32(dataset)
    offsets = dataset.corpus.offsets
    # Row slices of a C-contiguous matrix are contiguous views: no per-document copy.
    documents = [tokens[offsets[i]:offsets[i + 1]] for i in range(len(dataset.corpus))]
    index_seconds = time.perf_counter() - start

    def scores_of(i):
        return maxsim_cpu_scores(maxsim_cpu, dataset.queries.matrix(i).astype(np.float32),
                                 documents)

    worst = 0.0
    for i in range(min(VERIFY_QUERIES, len(dataset.queries))):
        exact = maxsim_all(tokens, offsets[:-1], dataset.queries.matrix(i).astype(np.float32))
        worst = max(worst, float(np.max(np.abs(scores_of(i) - exact) / np.abs(exact))))
    slice_tokens = maxsim_cpu_slice_tokens(tokens.shape[1])
    result = dict(config=f"maxsim_scores_variable, fp32, query sliced by {slice_tokens} tokens",
                  **search_all(dataset, lambda i: top_k(scores_of(i), k), k))
    result.update(index_fields(dataset, index_seconds, tokens.nbytes, builds_index=False))
    result["notes"] = (
        f"index = fp32 document views in memory; rayon/OpenMP threads = {THREADS} "
        f"(RAYON_NUM_THREADS, OMP_NUM_THREADS); the query is scored in slices of "
        f"{slice_tokens} tokens and summed, because 0.1.0 returns garbage or segfaults when "
        f"64 × query tokens × dim > 64³ (libxsmm falls back to an unlinked BLAS sgemm); "
        f"max relative score difference vs NumPy on {VERIFY_QUERIES} queries = {worst:.1e}")
    if not worst <= VERIFY_RTOL:
        result["error"] = (f"scores differ from exact MaxSim by up to {worst:.3g} relative "
                           f"(> {VERIFY_RTOL}) on the first {VERIFY_QUERIES} queries")
    return result


FAST_PLAID_BUILD_SETTINGS = ("nbits", "kmeans_niters", "max_points_per_centroid",
                             "n_samples_kmeans", "seed")
FAST_PLAID_SEARCH_SETTINGS = ("n_ivf_probe", "n_full_scores", "batch_size", "top_k")


def keyword_defaults(function, names) -> dict:
    """Default values of the named keyword parameters of `function`."""
    parameters = inspect.signature(function).parameters
    return {name: parameters[name].default for name in names}


def corpus_fingerprint(dataset) -> str:
    digest = hashlib.sha256(dataset.corpus.offsets.tobytes())
    digest.update(dataset.corpus.tokens[::997].tobytes())  # a sample of rows suffices to tell
    return digest.hexdigest()[:16]                         # cached embeddings apart


def directory_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def build_or_reuse(package: str, dataset, index_dir: str, build: dict, create, open_built):
    """Opens the index in `index_dir`, building it with `create(index_dir)` unless the same build
    is there (then `open_built(index_dir)`).

    A build is the same when the package's version, the corpus and the build settings match the
    marker written after the previous build; reusing it lets a caller sweep search settings
    without re-indexing. Returns (index, build seconds, reused)."""
    import importlib.metadata

    key = dict(build, corpus=corpus_fingerprint(dataset),
               version=importlib.metadata.version(package))
    marker = os.path.join(index_dir, "tessera_build.json")
    if os.path.exists(marker):
        with open(marker) as f:
            previous = json.load(f)
        if previous["key"] == key:
            return open_built(index_dir), previous["index_seconds"], True
        shutil.rmtree(index_dir)
    start = time.perf_counter()
    index = create(index_dir)
    index_seconds = time.perf_counter() - start
    with open(marker, "w") as f:
        json.dump(dict(key=key, index_seconds=index_seconds), f)
    return index, index_seconds, False


def document_tensors(dataset) -> list:
    """The corpus as one float32 torch tensor (tokens × dim) per document, sharing memory."""
    import torch

    tokens = corpus_fp32(dataset)
    offsets = dataset.corpus.offsets
    return [torch.from_numpy(tokens[offsets[i]:offsets[i + 1]]) for i in range(len(dataset.corpus))]


def peer_settings(name: str, settings: dict, create, search, build_names, search_names):
    """(build, search) keyword dicts: the package's own defaults for `build_names` (of `create`)
    and `search_names` (of `search`), overridden by `settings`; unknown settings raise."""
    unknown = set(settings) - set(build_names) - set(search_names)
    if unknown:
        raise ValueError(f"unknown {name} settings {sorted(unknown)}; known: "
                         f"{tuple(build_names) + tuple(search_names)}")
    build = keyword_defaults(create, build_names)
    build.update((key, settings[key]) for key in build_names if key in settings)
    search_options = keyword_defaults(search, search_names)
    search_options.update((key, settings[key]) for key in search_names if key in settings)
    return build, search_options


def max_relative_error(dataset, search_one) -> float:
    """Largest |score − exact MaxSim| / |exact| over the hits of the first VERIFY_QUERIES."""
    worst = 0.0
    for i in range(min(VERIFY_QUERIES, len(dataset.queries))):
        query = dataset.queries.matrix(i).astype(np.float32)
        for doc, score in zip(*search_one(i)):
            exact = maxsim_one(dataset.corpus.matrix(doc).astype(np.float32), query)
            worst = max(worst, abs(score - exact) / abs(exact))
    return worst


def run_fast_plaid(dataset, k: int, work_dir: str, **settings) -> dict:
    """PLAID index with fast-plaid on the CPU, searched one query at a time.

    `settings` may hold build settings (FAST_PLAID_BUILD_SETTINGS, passed to create) and
    search settings (FAST_PLAID_SEARCH_SETTINGS, passed to search); the rest are fast-plaid's
    own defaults, except top_k, which defaults to k. The index lives in
    work_dir/fast-plaid/<dataset>-<build settings> and is reused when already built there."""
    import torch
    from fast_plaid import search as fast_plaid_search

    torch.set_num_threads(THREADS)
    build, search = peer_settings("fast-plaid", dict({"top_k": k}, **settings),
                                  fast_plaid_search.FastPlaid.create,
                                  fast_plaid_search.FastPlaid.search, FAST_PLAID_BUILD_SETTINGS,
                                  FAST_PLAID_SEARCH_SETTINGS)

    def create(index_dir):
        index = fast_plaid_search.FastPlaid(index=index_dir, device="cpu")
        index.create(documents_embeddings=document_tensors(dataset), **build)
        return index

    build_name = "-".join(f"{name}{build[name]}" for name in FAST_PLAID_BUILD_SETTINGS)
    index_dir = os.path.join(work_dir, "fast-plaid", f"{dataset.name}-{build_name}")
    index, index_seconds, reused = build_or_reuse(
        "fast-plaid", dataset, index_dir, build, create,
        lambda path: fast_plaid_search.FastPlaid(index=path, device="cpu"))

    def search_one(i):
        query = torch.from_numpy(dataset.queries.matrix(i))
        hits = index.search(queries_embeddings=[query], show_progress=False, n_processes=1,
                            **search)[0]
        return [doc for doc, _ in hits], [score for _, score in hits]

    first_start = time.perf_counter()
    search_one(0)  # the first search loads the index from disk; reported in notes
    first_seconds = time.perf_counter() - first_start
    result = search_all(dataset, search_one, k)
    worst = max_relative_error(dataset, search_one)
    with open(os.path.join(index_dir, "metadata.json")) as f:
        centroids = json.load(f)["num_partitions"]
    result["config"] = ", ".join(
        [f"{name}={value}" for name, value in {**build, **search}.items()]
        + [f"centroids={centroids}"])
    result.update(index_fields(dataset, index_seconds, directory_bytes(index_dir),
                               builds_index=True))
    result["notes"] = (
        f"index = on-disk size of {index_dir}"
        + (" (reused from an earlier build; index_seconds is that build's)" if reused else "")
        + f"; torch intra-op threads = {torch.get_num_threads()}, RAYON_NUM_THREADS = "
        f"{THREADS}, n_processes=1; first search incl. index load = {first_seconds:.2f} s; "
        f"scores are from decompressed residuals: max relative difference vs exact MaxSim "
        f"on the returned documents of {VERIFY_QUERIES} queries = {worst:.1e}")
    return result


XTR_WARP_BUILD_SETTINGS = ("nbits", "kmeans_niters", "max_points_per_centroid", "seed",
                           "codec_sample_max_tokens")
# None = the package's own tuning (xtr_warp's optimize_hyperparams, from the index's density, k and
# the query's length), which is what its README recommends.
XTR_WARP_SEARCH_SETTINGS = ("bound", "nprobe", "t_prime", "max_candidates",
                            "centroid_score_threshold", "top_k")


def run_xtr_warp(dataset, k: int, work_dir: str, **settings) -> dict:
    """WARP index with xtr-warp-rs on the CPU (Rust; XTR's WARP engine: k-means centroids,
    residual codes, missing-similarity imputation), searched one query at a time with
    num_threads = THREADS.

    `settings` may hold build settings (XTR_WARP_BUILD_SETTINGS, passed to create) and search
    settings (XTR_WARP_SEARCH_SETTINGS, passed to search; unset ones are tuned by the package
    per query). The index lives in work_dir/xtr-warp/<dataset>-<build settings> and is reused
    when already built there."""
    import torch
    import xtr_warp

    torch.set_num_threads(THREADS)
    build, search = peer_settings("xtr-warp", dict({"top_k": k}, **settings),
                                  xtr_warp.XTRWarp.create, xtr_warp.XTRWarp.search,
                                  XTR_WARP_BUILD_SETTINGS, XTR_WARP_SEARCH_SETTINGS)

    def open_built(index_dir):
        return xtr_warp.XTRWarp(index=index_dir).load(device="cpu")

    def create(index_dir):
        xtr_warp.XTRWarp(index=index_dir).create(document_tensors(dataset), device="cpu",
                                                 show_progress=False, **build)
        return open_built(index_dir)

    build_name = "-".join(f"{name}{build[name]}" for name in XTR_WARP_BUILD_SETTINGS)
    index_dir = os.path.join(work_dir, "xtr-warp", f"{dataset.name}-{build_name}")
    index, index_seconds, reused = build_or_reuse("xtr-warp-rs", dataset, index_dir, build,
                                                  create, open_built)

    def search_one(i):
        query = torch.from_numpy(dataset.queries.matrix(i).astype(np.float32))
        hits = index.search(query, num_threads=THREADS, show_progress=False, **search)[0]
        return [int(doc) for doc, _ in hits], [float(score) for _, score in hits]

    first_start = time.perf_counter()
    search_one(0)
    first_seconds = time.perf_counter() - first_start
    result = search_all(dataset, search_one, k)
    worst = max_relative_error(dataset, search_one)
    with open(os.path.join(index_dir, "metadata.json")) as f:
        metadata = json.load(f)
    centroids = metadata.get("num_centroids", metadata.get("num_partitions"))
    tuned = index.optimize_hyperparams(k, torch.from_numpy(
        dataset.queries.matrix(0).astype(np.float32)).unsqueeze(0))
    result["config"] = ", ".join(
        [f"{name}={value}" for name, value in {**build, **search}.items()]
        + [f"centroids={centroids}", f"num_threads={THREADS}",
           "tuned (bound, nprobe, threshold, max_candidates, t_prime) for query 0 = "
           f"{tuned}"])
    result.update(index_fields(dataset, index_seconds, directory_bytes(index_dir),
                               builds_index=True))
    result["notes"] = (
        f"index = on-disk size of {index_dir}"
        + (" (reused from an earlier build; index_seconds is that build's)" if reused else "")
        + f"; search num_threads = {THREADS}, torch intra-op threads = "
        f"{torch.get_num_threads()}; first search = {first_seconds:.2f} s; scores are WARP's "
        f"estimates (missing similarities imputed): max relative difference vs exact MaxSim "
        f"on the returned documents of {VERIFY_QUERIES} queries = {worst:.1e}")
    return result


RUNNERS = {"numpy-brute-force": run_numpy_brute_force, "maxsim-cpu": run_maxsim_cpu,
           "fast-plaid": run_fast_plaid, "xtr-warp": run_xtr_warp}


def run_peer(name: str, dataset, k: int = 100, work_dir: str = None, **settings) -> dict:
    """Indexes `dataset.corpus` with peer `name` and searches every query alone.

    Returns a dict with: system, config (settings used), index_seconds, ingest_docs_per_s,
    index_bytes (what is counted is said in notes), bytes_per_token (over original document
    tokens), vectors_per_document, latencies_ms (one per query, batch size 1, after
    WARMUP_QUERIES untimed queries), qps (queries / summed latency), run ({query id:
    {doc id: score}}, top k), notes, error (None, or why the peer failed; then the other
    keys may be missing). Never raises. `settings` are only accepted by fast-plaid and xtr-warp
    (see run_fast_plaid, run_xtr_warp); `work_dir` (default default_work_dir()) holds on-disk indexes."""
    result = dict(system=name, error=None)
    try:
        if name not in RUNNERS:
            raise ValueError(f"unknown peer {name!r}; peers are {PEERS}")
        if settings and name not in ("fast-plaid", "xtr-warp"):
            raise ValueError(f"{name} takes no settings, got {sorted(settings)}")
        with threadpoolctl.threadpool_limits(THREADS):
            result.update(RUNNERS[name](dataset, k, work_dir or default_work_dir(), **settings))
    except BaseException as exception:  # a peer must not take the harness down with it
        # A Rust panic in a PyO3 extension (xtr-warp's) is a BaseException, not an Exception.
        if isinstance(exception, (KeyboardInterrupt, SystemExit)):
            raise
        result["error"] = (f"{type(exception).__name__}: {exception} | "
                           + traceback.format_exc(limit=-3).strip().replace("\n", " / "))
    return result


# ------------------------------------------------------------------------------- reporting

def report_line(result: dict, qrels: dict) -> str:
    if result["error"] and "run" not in result:
        return f"{result['system']:18s} ERROR {result['error']}"
    quality = metrics.evaluate(qrels, result["run"])
    ndcg, recall = quality["ndcg@10"], quality["recall@100"]
    p50, p95, p99 = np.percentile(result["latencies_ms"], [50, 95, 99])
    line = (f"{result['system']:18s} nDCG@10 {ndcg:.4f}  R@100 {recall:.4f}  "
            f"QPS {result['qps']:8.1f}  P50/P95/P99 {p50:.2f}/{p95:.2f}/{p99:.2f} ms  "
            f"index {result['index_seconds']:.1f} s  {result['bytes_per_token']:.1f} B/token")
    if result["error"]:
        line += f"  ERROR {result['error']}"
    return line


def main(data_dir: str):
    dataset = embed.load_dataset(data_dir)
    print(f"{dataset.name}: {len(dataset.corpus)} documents, "
          f"{int(dataset.corpus.lengths().sum())} tokens, {len(dataset.queries)} queries, "
          f"{THREADS} threads", flush=True)
    # A fresh work dir, so that fast-plaid's index is built (and timed) in this run.
    work_dir = tempfile.mkdtemp(prefix="tessera-peers-")
    try:
        for name in PEERS:
            start = time.perf_counter()
            result = run_peer(name, dataset, work_dir=work_dir)
            print(report_line(result, dataset.qrels), flush=True)
            print(f"    config: {result.get('config')}\n    notes: {result.get('notes')}\n"
                  f"    wall {time.perf_counter() - start:.0f} s", flush=True)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/work/shared/data/scifact")
