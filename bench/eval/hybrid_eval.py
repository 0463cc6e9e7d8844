"""nDCG@10 of BM25, MaxSim and their fusion through a real tessera-server, on a BEIR-layout set.

One collection holds every document's MiniLM token embeddings (embed.py's, all-MiniLM-L6-v2,
cached) and its BM25 term frequencies (sparse_bm25_check.py's tokenizer: bm25s's English
stopwords, PyStemmer's English stemmer; term ids from one vocabulary). Each query runs as
  bm25       the sparse lane alone (query=None), k1 1.2, b 0.75;
  maxsim     the query's token embeddings alone (the default cascade);
  rrf        both, fused by reciprocal rank (k 60, weights 1), each lane's best L;
  score      both, fused by min-max normalised scores, each lane's best L;
  rrf_rerank both, RRF's best L ordered by exact MaxSim;
(L = --fusion-candidates, default 100; 0 = k, the server's default: cheaper, the dense lane is
then the plain top-10 search)
and bm25s (method "lucene", same tokens, k1, b) is the reference the bm25 row must equal: the
share of queries whose top 10 equal bm25s's (as a list) is reported beside nDCG@10.

    python hybrid_eval.py --data /work/shared/data/scifact --server build/bin/tessera-server \\
        [--json out.json]

Runs in scripts/eval-env's environment (torch for the embeddings, bm25s and PyStemmer)."""

import argparse
import collections
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "e2e"))

import bm25s  # noqa: E402
import embed  # noqa: E402
import e2e_util  # noqa: E402
import sparse_bm25_check as check  # noqa: E402

K1, B = 1.2, 0.75


def sparse_terms(tokens, vocabulary, add):
    counts = collections.Counter()
    for token in tokens:
        if token not in vocabulary:
            if not add:
                continue
            vocabulary[token] = len(vocabulary)
        counts[vocabulary[token]] += 1
    indices = sorted(counts)
    return (indices, [float(counts[i]) for i in indices])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--server", default=os.path.join(REPO_ROOT, "build", "bin",
                                                         "tessera-server"))
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--fusion-candidates", type=int, default=100,
                        help="each lane's depth L in the fused searches (0: k)")
    parser.add_argument("--json")
    args = parser.parse_args()
    depth = args.fusion_candidates

    started = time.monotonic()
    tokenize = check.make_tokenizer()
    corpus, qrels, queries = check.load_set(args.data)
    dataset = embed.load_dataset(args.data)
    row_of_doc = {doc_id: i for i, doc_id in enumerate(dataset.corpus.ids)}
    row_of_query = {query_id: i for i, query_id in enumerate(dataset.queries.ids)}
    queries = [q for q in queries if q["_id"] in row_of_query]
    vocabulary = {}
    doc_tokens = [tokenize(check.document_text(d)) for d in corpus]
    doc_sparse = [sparse_terms(t, vocabulary, add=True) for t in doc_tokens]
    query_tokens = [tokenize(q["text"]) for q in queries]
    query_sparse = [sparse_terms(t, vocabulary, add=False) for t in query_tokens]

    # The reference: bm25s over the same tokens.
    retriever = bm25s.BM25(method="lucene", k1=K1, b=B)
    retriever.index(doc_tokens, show_progress=False)
    ids = [d["_id"] for d in corpus]
    reference = []
    for tokens in query_tokens:
        known = [t for t in tokens if t in vocabulary]
        scores = retriever.get_scores(known) if known else np.zeros(len(corpus))
        order = sorted(range(len(corpus)), key=lambda i: (-scores[i], i))
        reference.append([ids[i] for i in order[:10] if scores[i] > 0])

    e2e_util.SERVER_BINARY = args.server
    name = "hybrid_eval"
    runs = {n: [] for n in ("bm25", "maxsim", "rrf", "score", "rrf_rerank")}
    latency = {n: [] for n in runs}
    with e2e_util.Server(threads=args.threads).running() as server, \
            server.client(timeout=600) as client:
        client.create_collection(name, dim=int(dataset.corpus.tokens.shape[1]), sparse=True)
        documents = ({"id": d["_id"], "tokens": dataset.corpus.matrix(row_of_doc[d["_id"]]),
                      "sparse": sparse}
                     for d, sparse in zip(corpus, doc_sparse) if d["_id"] in row_of_doc)
        summary = client.ingest(name, documents, batch_size=64, progress=False)
        assert not summary.failed, summary.failed[:3]
        searches = {
            "bm25": lambda q, s: client.search(name, None, k=10, sparse_query=s),
            "maxsim": lambda q, s: client.search(name, q, k=10),
            "rrf": lambda q, s: client.search(name, q, k=10, sparse_query=s,
                                              fusion_candidates=depth),
            "score": lambda q, s: client.search(name, q, k=10, sparse_query=s,
                                                fusion="score", fusion_candidates=depth),
            "rrf_rerank": lambda q, s: client.search(name, q, k=10, sparse_query=s,
                                                     fusion_candidates=depth, rerank=True),
        }
        for query, sparse in zip(queries, query_sparse):
            matrix = dataset.queries.matrix(row_of_query[query["_id"]])
            for run, search in searches.items():
                start = time.perf_counter()
                hits = search(matrix, sparse)
                latency[run].append((time.perf_counter() - start) * 1000)
                runs[run].append(hits.ids)
        client.drop_collection(name)

    result = {"set": os.path.basename(os.path.normpath(args.data)), "documents": len(corpus),
              "queries": len(queries), "k1": K1, "b": B, "fusion_candidates": depth,
              "threads": args.threads, "bm25s": bm25s.__version__}
    for run, rankings in runs.items():
        result[f"ndcg@10_{run}"] = float(np.mean(
            [check.ndcg_at_10(r, qrels[q["_id"]]) for r, q in zip(rankings, queries)]))
        result[f"p50_ms_{run}"] = float(np.percentile(latency[run], 50))
    result["ndcg@10_bm25s"] = float(np.mean(
        [check.ndcg_at_10(r, qrels[q["_id"]]) for r, q in zip(reference, queries)]))
    result["bm25_top10_same_list_as_bm25s"] = float(np.mean(
        [a == b for a, b in zip(runs["bm25"], reference)]))
    result["seconds"] = time.monotonic() - started
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
