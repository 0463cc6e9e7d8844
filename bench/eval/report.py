"""results.json → results.md (tables) and PNG plots (matplotlib), for one data set; and one
summary table over several.

    python bench/eval/report.py OUT_DIR                 re-renders from OUT_DIR/results.json
    python bench/eval/report.py --summary DIR [DIR...]  prints the summary table (Markdown)
"""

import json
import os
import sys
from typing import Dict, List, Optional

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

FULL = "full-fp32"  # the exact full-MaxSim configuration every nDCG is compared with
# The cascade configuration's search with the server's default options for k = 10.
DEFAULT_SEARCH = "default (k=10)"
# The server's default merge-height limit for ward pooling (kAdaptiveMergeHeight).
ADAPTIVE_MERGE_HEIGHT = 0.3


def _full_ndcg(rows: List[Dict]) -> Optional[float]:
    for row in rows:
        if row["name"] == FULL and row.get("exhaustive"):
            return row["ndcg@10"]
    return None


def _label(row: Dict) -> str:
    if row["system"] != "tessera":
        return f"{row['system']} ({row['search']})" if row.get("search") not in (None, "defaults") \
            else row["system"]
    if row["search"] == "exhaustive":
        return row["name"] if row["group"] != "cascade" else f"{row['name']}: exhaustive"
    return f"{row['name']}: {row['search']}"


def _fmt(value, spec):
    return "–" if value is None else format(value, spec)


def table(results: Dict) -> str:
    rows = results["configurations"]
    full = _full_ndcg(rows)
    lines = [
        "| configuration | vec/doc | bytes/token | nDCG@10 | % of full | recall@100 | "
        "top-10 = exact | scored | QPS | P50 ms | P95 ms | P99 ms | ingest docs/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        if row.get("error"):
            lines.append(f"| {_label(row)} | not run: {row['error']} |" + " |" * 11)
            continue
        relative = 100.0 * row["ndcg@10"] / full if full else None
        scored = row.get("documents_scored_fraction")
        lines.append(
            f"| {_label(row)} | {_fmt(row.get('vectors_per_document'), '.1f')} | "
            f"{_fmt(row.get('bytes_per_token'), '.0f')} | {row['ndcg@10']:.4f} | "
            f"{_fmt(relative, '.1f')} | {row['recall@100']:.4f} | "
            f"{_fmt(row.get('recall@10_vs_exact'), '.3f')} | "
            f"{'–' if scored is None else format(100 * scored, '.1f') + '%'} | "
            f"{row['qps']:.1f} | {row['latency_ms']['p50']:.1f} | "
            f"{row['latency_ms']['p95']:.1f} | {row['latency_ms']['p99']:.1f} | "
            f"{_fmt(row.get('ingest_docs_per_s'), '.0f')} |")
    return "\n".join(lines)


def _footer(results: Dict) -> str:
    return (f"`{results['command']}` at {results['git_commit']}, {results['date']}, on "
            f"{results['machine']}")


def _finish(figure, axes, results: Dict, path: str, title: str, xlabel: str, ylabel: str,
            legend_size: int = 8):
    """Labels, grid, legend (when something is labelled: a partial run may leave nothing), the
    footer naming command, commit and machine; then writes the PNG."""
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(f"{results['dataset']}: {title}")
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=legend_size)
    figure.text(0.01, 0.005, _footer(results), fontsize=5)
    figure.tight_layout(rect=(0, 0.02, 1, 1))
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_pooling(results: Dict, path: str):
    rows = [r for r in results["configurations"]
            if r["system"] == "tessera" and r.get("exhaustive") and r["dtype"] == "fp16"]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    series = {"ward (hierarchical)": [r for r in rows if r["group"] == "pooling"
                                      and r["pooling"] in ("ward", "none")],
              "reference (hierarchical)": [r for r in rows if r["group"] == "pooling"
                                           and r["pooling"] in ("reference", "none")],
              "page simulation: spatial": [r for r in rows if r["group"] == "page"
                                           and r["pooling"] != "ward"],
              "page simulation: ward on the grid": [r for r in rows if r["group"] == "page"
                                                    and r["pooling"] == "ward"]}
    for (label, points), marker in zip(series.items(), "osD^"):
        points = sorted(points, key=lambda r: r["vectors_per_document"])
        if not points:
            continue
        axes.plot([r["vectors_per_document"] for r in points], [r["ndcg@10"] for r in points],
                  marker=marker, label=label,
                  linestyle="-" if "spatial" not in label else "none")
        if "spatial" in label:
            for r in points:
                axes.annotate(r["pooling"], (r["vectors_per_document"], r["ndcg@10"]),
                              fontsize=7, xytext=(3, 3), textcoords="offset points")
    axes.set_xscale("log")
    _finish(figure, axes, results, path,
            "nDCG@10 vs vectors per document",
            "vectors per document (log)",
            "nDCG@10 (exhaustive MaxSim)")


def plot_cascade(results: Dict, path: str):
    rows = [r for r in results["configurations"]
            if not r.get("error") and r.get("recall@10_vs_exact") is not None]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    systems = sorted({r["system"] if r["system"] != "tessera" else f"tessera {r['name']}"
                      for r in rows})
    for system, marker in zip(systems, "os^Dvx*"):
        points = sorted((r for r in rows
                         if (r["system"] if r["system"] != "tessera"
                             else f"tessera {r['name']}") == system),
                        key=lambda r: r["recall@10_vs_exact"])
        axes.plot([r["recall@10_vs_exact"] for r in points], [r["qps"] for r in points],
                  marker=marker, linestyle="none", label=system)
    axes.set_yscale("log")
    _finish(figure, axes, results, path,
            "speed vs recall",
            "recall@10 vs exact MaxSim over the same vectors",
            "queries per second (one at a time, log)")


def _latency_rows(results: Dict) -> List[Dict]:
    wanted = []
    for row in results["configurations"]:
        if row.get("error"):
            continue
        if row["system"] == "tessera" and (row["name"], row["search"]) in (
                ("cascade", DEFAULT_SEARCH), ("full-fp16", "exhaustive"),
                ("cascade-global", "cascade N=100"), ("cascade-global", "cascade N=500")):
            wanted.append(row)
        elif row["system"] != "tessera" and row.get("default", True):
            wanted.append(row)
    return wanted


def plot_latency(results: Dict, path: str):
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for row in _latency_rows(results):
        values = np.sort(np.asarray(row["latencies_ms"]))
        axes.plot(values, np.arange(1, len(values) + 1) / len(values), label=_label(row))
    axes.set_xscale("log")
    _finish(figure, axes, results, path,
            "latency CDF, one query at a time",
            "latency per query, ms (log)",
            "fraction of queries", legend_size=7)


def plot_peers(results: Dict, path: str):
    """nDCG@10 against QPS for every search of Tessera (exhaustive page simulations aside) and
    every peer run: 'equal quality, how fast' read off one picture."""
    rows = [r for r in results["configurations"] if not r.get("error") and r["group"] != "page"]
    figure, axes = plt.subplots(figsize=(8, 5))
    for system, marker in (("tessera", "o"), ("numpy-brute-force", "s"), ("maxsim-cpu", "D"),
                           ("fast-plaid", "^"), ("xtr-warp", "v")):
        points = [r for r in rows if r["system"] == system]
        if not points:
            continue
        axes.scatter([r["qps"] for r in points], [r["ndcg@10"] for r in points], marker=marker,
                     label=system, s=30)
        for r in points:
            if system != "tessera" or r in _latency_rows(results):
                axes.annotate(_label(r), (r["qps"], r["ndcg@10"]), fontsize=6,
                              xytext=(4, 2), textcoords="offset points")
    axes.set_xscale("log")
    _finish(figure, axes, results, path,
            "Tessera and peers on the same embeddings",
            "queries per second, one at a time (log)",
            "nDCG@10")


def write(results: Dict, out_dir: str):
    name = results["dataset"]
    plots = {"pooling": plot_pooling, "cascade": plot_cascade, "latency": plot_latency,
             "peers": plot_peers}
    for kind, plot in plots.items():
        plot(results, os.path.join(out_dir, f"{name}-{kind}.png"))
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(f"# {name}: {results['documents']} documents, {results['queries']} queries\n\n")
        f.write(f"Embeddings: {results['model']} (PyPI `{results['model_package']}`), "
                f"{results['tokens_per_document']:.1f} tokens per document (≤ "
                f"{results['doc_max_tokens']}), queries ≤ {results['query_max_tokens']} tokens. "
                f"Made by {_footer(results)}; whole run {results['seconds'] / 60:.1f} min.\n\n")
        f.write(table(results) + "\n\n")
        f.write("\n".join(f"![{kind}]({name}-{kind}.png)" for kind in plots) + "\n")


def _row(results: Dict, name: str, search: str) -> Optional[Dict]:
    return next((r for r in results["configurations"]
                 if r["name"] == name and r.get("search") == search and not r.get("error")), None)


def summary(all_results: List[Dict]) -> str:
    """One Markdown table over several data sets: the figures users compare."""
    lines = ["| | " + " | ".join(r["dataset"] for r in all_results) + " |",
             "|---|" + "---:|" * len(all_results)]

    def add(label, cell):
        lines.append(f"| {label} | " + " | ".join(cell(r) for r in all_results) + " |")

    def relative(name, search="exhaustive"):
        def cell(results):
            row, full = _row(results, name, search), _full_ndcg(results["configurations"])
            return "–" if row is None or not full else f"{100 * row['ndcg@10'] / full:.1f}%"
        return cell

    def figure(name, search, key, spec):
        def cell(results):
            row = _row(results, name, search)
            if row is None:
                return "–"
            value = row
            for part in key.split("."):
                value = value[part]
            return format(value, spec)
        return cell

    add("documents / queries", lambda r: f"{r['documents']:,} / {r['queries']}")
    add("tokens per document (MiniLM, ≤ 256)", lambda r: f"{r['tokens_per_document']:.0f}")
    add("full MaxSim nDCG@10 (p = 1, exact)", figure(FULL, "exhaustive", "ndcg@10", ".4f"))
    add(f"default pooling (ward p = 2, merges ≤ {ADAPTIVE_MERGE_HEIGHT}): vectors per document",
        figure("cascade", "exhaustive", "vectors_per_document", ".1f"))
    add("default pooling: nDCG@10 vs full", relative("cascade"))
    for p in (2, 3, 4, 6):
        add(f"ward p = {p}: vectors per document",
            figure(f"ward-{p}", "exhaustive", "vectors_per_document", ".0f"))
        add(f"ward p = {p}: nDCG@10 vs full", relative(f"ward-{p}"))
        add(f"reference p = {p}: nDCG@10 vs full", relative(f"reference-{p}"))
    add("bytes on disk per original token: p = 1 fp32 / fp16",
        lambda r: f"{figure(FULL, 'exhaustive', 'bytes_per_token', '.0f')(r)} / "
                  f"{figure('full-fp16', 'exhaustive', 'bytes_per_token', '.0f')(r)}")
    add("bytes on disk per original token: default (fp16, candidates)",
        figure("cascade", "exhaustive", "bytes_per_token", ".0f"))
    default = DEFAULT_SEARCH
    def cascade_vs_exhaustive(results):
        row, exhaustive = _row(results, "cascade", default), _row(results, "cascade", "exhaustive")
        if row is None or exhaustive is None:
            return "–"
        return f"{100 * row['ndcg@10'] / exhaustive['ndcg@10']:.1f}%"

    add("default cascade: nDCG@10 vs its exhaustive", cascade_vs_exhaustive)
    add("default cascade: documents scored exactly",
        lambda r: f"{100 * _row(r, 'cascade', default)['documents_scored_fraction']:.1f}%"
        if _row(r, "cascade", default) else "–")
    add("default cascade: QPS (one query at a time)", figure("cascade", default, "qps", ".1f"))
    add("default cascade: P50 / P95 / P99 ms", lambda r: " / ".join(
        figure("cascade", default, f"latency_ms.p{q}", ".1f")(r) for q in (50, 95, 99)))
    add("global-mean stage 1 + full rerank (N = 100): nDCG@10 vs full",
        relative("cascade-global", "cascade N=100"))
    add("global-mean stage 1 + full rerank (N = 100): QPS",
        figure("cascade-global", "cascade N=100", "qps", ".1f"))
    add("ingest docs/s (default collection, over gRPC)",
        figure("cascade", "exhaustive", "ingest_docs_per_s", ".0f"))
    for peer in ("numpy-brute-force", "maxsim-cpu", "fast-plaid", "xtr-warp"):
        def peer_cell(results, peer=peer):
            row = next((r for r in results["configurations"] if r["system"] == peer
                        and r.get("default", True)), None)
            if row is None:
                return "–"
            if row.get("error"):
                return "not run"
            return f"{row['ndcg@10']:.4f} at {row['qps']:.1f} QPS"
        add(f"{peer}: nDCG@10 at QPS", peer_cell)
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        collected = []
        for directory in sys.argv[2:]:
            with open(os.path.join(directory, "results.json")) as f:
                collected.append(json.load(f))
        print(summary(collected))
    else:
        directory = sys.argv[1]
        with open(os.path.join(directory, "results.json")) as f:
            write(json.load(f), directory)
