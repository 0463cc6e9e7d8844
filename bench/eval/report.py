"""results.json → results.md (tables) and PNG plots (matplotlib), for one data set.

    python bench/eval/report.py OUT_DIR     (re-renders from OUT_DIR/results.json)
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


def _full_ndcg(rows: List[Dict]) -> Optional[float]:
    for row in rows:
        if row["name"] == FULL and row.get("exhaustive"):
            return row["ndcg@10"]
    return None


def _label(row: Dict) -> str:
    if row["system"] != "tessera":
        return f"{row['system']} ({row['search']})" if row.get("search") else row["system"]
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
    axes.set_xlabel("vectors per document (log)")
    axes.set_ylabel("nDCG@10 (exhaustive MaxSim)")
    axes.set_title(f"{results['dataset']}: nDCG@10 vs vectors per document")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.text(0.01, 0.005, _footer(results), fontsize=5)
    figure.tight_layout(rect=(0, 0.02, 1, 1))
    figure.savefig(path, dpi=120)
    plt.close(figure)


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
    axes.set_xlabel("recall@10 vs exact MaxSim over the same vectors")
    axes.set_ylabel("queries per second (one at a time, log)")
    axes.set_title(f"{results['dataset']}: speed vs recall")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.text(0.01, 0.005, _footer(results), fontsize=5)
    figure.tight_layout(rect=(0, 0.02, 1, 1))
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _latency_rows(results: Dict) -> List[Dict]:
    wanted = []
    for row in results["configurations"]:
        if row.get("error"):
            continue
        if row["system"] == "tessera" and (row["name"], row["search"]) in (
                ("cascade", "cascade N=100 (default for k=10)"), ("full-fp16", "exhaustive"),
                ("cascade", "exhaustive")):
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
    axes.set_xlabel("latency per query, ms (log)")
    axes.set_ylabel("fraction of queries")
    axes.set_title(f"{results['dataset']}: latency CDF, one query at a time")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    figure.text(0.01, 0.005, _footer(results), fontsize=5)
    figure.tight_layout(rect=(0, 0.02, 1, 1))
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_peers(results: Dict, path: str):
    rows = _latency_rows(results)
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5))
    labels = [_label(r) for r in rows]
    positions = np.arange(len(rows))
    left.barh(positions, [r["ndcg@10"] for r in rows])
    left.set_yticks(positions, labels, fontsize=7)
    left.set_xlabel("nDCG@10")
    right.barh(positions, [r["qps"] for r in rows])
    right.set_yticks(positions, [""] * len(rows))
    right.set_xscale("log")
    right.set_xlabel("queries per second (log)")
    figure.suptitle(f"{results['dataset']}: Tessera and peers on the same embeddings")
    figure.text(0.01, 0.005, _footer(results), fontsize=5)
    figure.tight_layout(rect=(0, 0.03, 1, 1))
    figure.savefig(path, dpi=120)
    plt.close(figure)


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


if __name__ == "__main__":
    directory = sys.argv[1]
    with open(os.path.join(directory, "results.json")) as f:
        write(json.load(f), directory)
