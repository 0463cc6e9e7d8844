"""Real token embeddings for the `resampled` corpus of scripts/bench-scale.

Reads a BEIR-layout data set's MiniLM token embeddings (bench/eval/embed.py, cached), projects
every token to DIM dimensions with one fixed random orthonormal matrix (seeded: the same for
every run), renormalises, and writes what tessera-bench-index resamples documents and queries
from:

  OUT/doc_tokens.npy     float32, T × DIM, every corpus token (documents concatenated)
  OUT/doc_offsets.npy    int64, n_docs + 1: document i is rows [offsets[i], offsets[i + 1])
  OUT/query_tokens.npy   float32, every judged query's tokens
  OUT/query_offsets.npy  int64, n_queries + 1

A projection by an orthonormal matrix keeps inner products up to the share of variance it drops,
so the clusters, spreads and anisotropy of real embeddings survive at the bench dim.

  python resample_source.py --data ../shared/data/scifact --dim 128 --out DIR
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "eval"))
import embed  # noqa: E402

PROJECTION_SEED = 20261203


def projection(source_dim: int, dim: int) -> np.ndarray:
    """source_dim × dim with orthonormal columns (dim ≤ source_dim)."""
    if dim > source_dim:
        raise SystemExit(f"--dim {dim} exceeds the encoder's {source_dim}")
    gaussian = np.random.default_rng(PROJECTION_SEED).standard_normal((source_dim, dim))
    q, _ = np.linalg.qr(gaussian)
    return q.astype(np.float32)


def project(tokens: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    out = tokens @ matrix
    out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out.astype(np.float32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="BEIR-layout folder")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    dataset = embed.load_dataset(args.data)
    matrix = projection(dataset.corpus.tokens.shape[1], args.dim)
    os.makedirs(args.out, exist_ok=True)
    for side, token_set in (("doc", dataset.corpus), ("query", dataset.queries)):
        np.save(os.path.join(args.out, f"{side}_tokens.npy"), project(token_set.tokens, matrix))
        np.save(os.path.join(args.out, f"{side}_offsets.npy"), token_set.offsets.astype(np.int64))
    print(f"{len(dataset.corpus)} documents ({dataset.corpus.tokens.shape[0]} tokens), "
          f"{len(dataset.queries)} queries, dim {dataset.corpus.tokens.shape[1]} → {args.dim}: "
          f"{args.out}")


if __name__ == "__main__":
    main()
