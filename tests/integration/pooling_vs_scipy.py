#!/usr/bin/env python3
"""Compares tessera-pool's hierarchical pooling with SciPy, the implementation it reproduces.

Builds a realistic test set (topic-clustered token embeddings with near-duplicate and exactly
duplicated tokens, n from 1 to 1,100, dim 128), pools it with the tessera-pool binary, and checks
against SciPy on the same float32 inputs:
  reference: linkage(1 - E @ E.T, method="ward") + fcluster(t, "maxclust")   (ColBERT/PyLate recipe)
  ward:      linkage(pdist(E, "cosine"), method="ward") + fcluster(t, "maxclust")
  ward with a merge-height limit h (tessera-pool's default for ward): the maxclust cut where
             every merge it applies is at height <= h, else fcluster(h, "distance")
Partitions must be equal up to renaming on >= 99% of documents, and every document that differs
must have an exact tie among SciPy's merge heights (so that either answer is a valid Ward result).
Pooled vectors must be the means of their clusters.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import pdist


# tessera-pool's default merge-height limit for ward (kAdaptiveMergeHeight in tessera/pooling.h).
ADAPTIVE_MERGE_HEIGHT = 0.3


def make_documents(seed, count, dim):
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([[1, 2, 3, 4, 1100], rng.integers(5, 300, count - 10),
                              rng.integers(300, 1100, 5)])
    docs = {}
    for index, n in enumerate(lengths):
        topics = max(1, int(n) // 12)
        centers = rng.standard_normal((topics, dim))
        assignment = rng.integers(0, topics, int(n))
        spread = rng.choice([0.05, 0.3, 0.8])  # near-duplicates ... loosely related tokens
        tokens = centers[assignment] + spread * rng.standard_normal((int(n), dim))
        if n > 8 and index % 4 == 0:  # exact repeats, like a word that occurs twice
            repeats = rng.integers(0, n, int(n) // 10)
            tokens[repeats] = tokens[rng.integers(0, n, len(repeats))]
        tokens /= np.linalg.norm(tokens, axis=1, keepdims=True)
        docs[f"doc{index:03d}"] = tokens.astype(np.float32)
    return docs


def canonical(labels):
    mapping = {}
    return [mapping.setdefault(label, len(mapping)) for label in labels]


def scipy_labels(tokens, pool_factor, method, max_merge_height):
    """SciPy's partition for tessera-pool's options, and whether SciPy's merge heights tie (so
    that another valid Ward tree exists) or one lies within float noise of the height limit."""
    n = len(tokens)
    if n == 1:
        return [0], False
    if method == "reference":
        z = linkage(1 - tokens @ tokens.T, method="ward")
    else:
        z = linkage(pdist(tokens.astype(np.float64), "cosine"), method="ward")
    heights = z[:, 2]
    tie = bool(np.any(np.diff(heights) == 0))
    clusters = max(n // pool_factor, 1)
    merges = n - clusters
    if max_merge_height > 0:
        tie = tie or bool(np.any(np.abs(heights - max_merge_height) < 1e-6))
        merges = min(merges, int(np.count_nonzero(heights <= max_merge_height)))
    if n == 2:
        # SciPy's cluster_maxclust_monocrit reads past its one-element array when n = 2, so its
        # answer depends on uninitialised memory; Tessera gives the defined one.
        return ([0, 0] if merges == 1 else [0, 1]), tie
    if merges < n - clusters:
        labels = fcluster(z, t=max_merge_height, criterion="distance")
    else:
        labels = fcluster(z, t=clusters, criterion="maxclust")
    return canonical(labels), tie


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tessera-pool", required=True)
    parser.add_argument("--documents", type=int, default=160)
    args = parser.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

    docs = make_documents(seed=20261202, count=args.documents, dim=128)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "docs.npz")
        np.savez(source, **docs)
        # (method, merge-height limit): None runs tessera-pool with its default for the method
        # (no limit for reference, ADAPTIVE_MERGE_HEIGHT for ward); 0 asks for no limit.
        variants = [("reference", None, 0.0), ("ward", "0", 0.0),
                    ("ward", None, ADAPTIVE_MERGE_HEIGHT)]
        for method, height_flag, max_merge_height in variants:
            for pool_factor in (2, 3, 4):
                name = f"{method} p{pool_factor} h{max_merge_height:g}"
                pooled_path = os.path.join(tmp, f"{method}{pool_factor}-{max_merge_height}.npz")
                command = [args.tessera_pool, "--input", source, "--output", pooled_path,
                           "--method", method, "--pool-factor", str(pool_factor)]
                if height_flag is not None:
                    command += ["--max-merge-height", height_flag]
                subprocess.run(command, check=True)
                pooled = np.load(pooled_path)
                same, differing, unexplained, limited = 0, [], [], 0
                for key, tokens in docs.items():
                    ours = pooled[f"{key}.labels"].tolist()
                    expected, tie = scipy_labels(tokens, pool_factor, method, max_merge_height)
                    limited += max(expected) + 1 > max(len(tokens) // pool_factor, 1)
                    vectors = pooled[key]
                    for cluster in range(vectors.shape[0]):
                        members = tokens[np.asarray(ours) == cluster].astype(np.float64)
                        if not np.allclose(vectors[cluster], members.mean(axis=0), atol=1e-6):
                            failures.append(f"{name} {key}: vector {cluster} is not the mean "
                                            "of its members")
                            break
                    if canonical(ours) == expected:
                        same += 1
                    else:
                        differing.append(key)
                        if not tie:
                            unexplained.append(key)
                agreement = same / len(docs)
                print(f"{name:16s}: same partition as SciPy on {same}/{len(docs)} documents "
                      f"({100 * agreement:.1f}%), {limited} kept more than n/p by the height "
                      f"limit; differing: {differing or 'none'}")
                if agreement < 0.99:
                    failures.append(f"{name}: agreement {agreement:.3f} < 0.99")
                if unexplained:
                    failures.append(f"{name}: differences without an exact tie in SciPy's merge "
                                    f"heights: {unexplained}")
                if max_merge_height > 0 and limited == 0:
                    failures.append(f"{name}: no document reached the height limit, so this case "
                                    "checks nothing beyond the plain cut")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
