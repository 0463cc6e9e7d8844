"""BM25 through Tessera's sparse index against bm25s (method "lucene", the same k1 and b) on a BEIR
set: the same tokens (bm25s's English stopwords, PyStemmer's English stemmer, bm25s's token
pattern) feed both; reports nDCG@10 of each, how many queries get the same top 10 (as a list and
as a set) and the largest relative score difference.

    python sparse_bm25_check.py --data /work/shared/data/scifact \
        --bench build/bin/tessera-bench-sparse [--k1 1.2 --b 0.75] [--json out.json]

Needs bm25s and PyStemmer (pip install bm25s PyStemmer). Tessera's side runs through
tessera-bench-sparse's TSV mode (term ids and frequencies in, a ranked run out)."""

import argparse
import collections
import json
import math
import os
import re
import subprocess
import tempfile

import bm25s
import bm25s.stopwords
import numpy as np
import Stemmer

TOKEN = re.compile(r"(?u)\b\w\w+\b")


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_qrels(path):
    qrels = collections.defaultdict(dict)
    with open(path, encoding="utf-8") as f:
        next(f)
        for line in f:
            q, d, s = line.rstrip("\n").split("\t")
            qrels[q][d] = int(s)
    return qrels


def ndcg_at_10(ranking, judged):
    dcg = sum(judged.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranking[:10]))
    ideal = sorted(judged.values(), reverse=True)[:10]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def make_tokenizer():
    """The tokenizer both sides use: lowercased TOKEN matches, bm25s's English stopwords
    dropped, PyStemmer's English stemmer (also what hybrid_eval.py feeds the server)."""
    stemmer = Stemmer.Stemmer("english")
    stop = set(bm25s.stopwords.STOPWORDS_EN)

    def tokenize(text):
        return stemmer.stemWords([t for t in TOKEN.findall(text.lower()) if t not in stop])

    return tokenize


def load_set(data):
    """(corpus, qrels, queries with judgements) of a BEIR-layout folder."""
    corpus = read_jsonl(os.path.join(data, "corpus.jsonl"))
    qrels = read_qrels(os.path.join(data, "qrels", "test.tsv"))
    queries = [q for q in read_jsonl(os.path.join(data, "queries.jsonl")) if q["_id"] in qrels]
    return corpus, qrels, queries


def document_text(document):
    return (document.get("title", "") + " " + document.get("text", "")).strip()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--bench", required=True)
    parser.add_argument("--k1", type=float, default=1.2)
    parser.add_argument("--b", type=float, default=0.75)
    parser.add_argument("--json")
    args = parser.parse_args()

    tokenize = make_tokenizer()
    corpus, qrels, queries = load_set(args.data)
    doc_tokens = [tokenize(document_text(d)) for d in corpus]
    query_tokens = [tokenize(q["text"]) for q in queries]
    vocabulary = {}
    for tokens in doc_tokens:
        for t in tokens:
            vocabulary.setdefault(t, len(vocabulary))

    with tempfile.TemporaryDirectory() as tmp:
        docs_tsv, queries_tsv, run_tsv = (os.path.join(tmp, n) for n in ("d.tsv", "q.tsv", "r.tsv"))
        with open(docs_tsv, "w") as f:
            for i, tokens in enumerate(doc_tokens):
                counts = sorted(collections.Counter(vocabulary[t] for t in tokens).items())
                f.write(f"{i}\t" + " ".join(f"{t}:{c}" for t, c in counts) + "\n")
        with open(queries_tsv, "w") as f:
            for q, tokens in zip(queries, query_tokens):
                counts = sorted(collections.Counter(vocabulary[t] for t in tokens
                                                    if t in vocabulary).items())
                f.write(f"{q['_id']}\t" + " ".join(f"{t}:{c}" for t, c in counts) + "\n")
        subprocess.run([args.bench, "--corpus", docs_tsv, "--queries_tsv", queries_tsv, "--run",
                        run_tsv, "--k", "100", "--k1", str(args.k1), "--b", str(args.b)],
                       check=True)
        tessera = collections.defaultdict(list)
        with open(run_tsv) as f:
            for line in f:
                q, iid, _, score = line.rstrip("\n").split("\t")
                tessera[q].append((int(iid), float(score)))

    retriever = bm25s.BM25(method="lucene", k1=args.k1, b=args.b)
    retriever.index(doc_tokens, show_progress=False)
    ids = [d["_id"] for d in corpus]
    same_list = same_set = 0
    worst = 0.0
    ndcg_t, ndcg_r = [], []
    for q, tokens in zip(queries, query_tokens):
        known = [t for t in tokens if t in vocabulary]
        scores = retriever.get_scores(known) if known else np.zeros(len(corpus))
        order = sorted(range(len(corpus)), key=lambda i: (-scores[i], i))
        reference = [i for i in order[:100] if scores[i] > 0]
        ours = tessera.get(q["_id"], [])
        ours_ids = [i for i, _ in ours]
        same_list += ours_ids[:10] == reference[:10]
        same_set += set(ours_ids[:10]) == set(reference[:10])
        for i, s in ours[:10]:
            worst = max(worst, abs(s - float(scores[i])) / max(abs(float(scores[i])), 1e-12))
        ndcg_t.append(ndcg_at_10([ids[i] for i in ours_ids], qrels[q["_id"]]))
        ndcg_r.append(ndcg_at_10([ids[i] for i in reference], qrels[q["_id"]]))
    result = {
        "set": os.path.basename(os.path.normpath(args.data)),
        "documents": len(corpus), "queries": len(queries), "k1": args.k1, "b": args.b,
        "ndcg@10_tessera": float(np.mean(ndcg_t)), "ndcg@10_bm25s": float(np.mean(ndcg_r)),
        "top10_same_list": same_list / len(queries), "top10_same_set": same_set / len(queries),
        "max_relative_score_difference_top10": float(worst),
        "bm25s": bm25s.__version__,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
