"""Text → BM25 term frequencies for a collection's sparse field (create_collection(sparse=True)).

The server computes BM25 (Lucene's formula, with the collection's own IDF and average length);
a document's sparse vector only carries its terms' frequencies, a query's its terms' counts.
This module turns text into those: lowercased word tokens (two or more word characters, the
pattern of scikit-learn's and bm25s's default tokenizers), stopwords removed when given, each
token stemmed with the Snowball stemmer of PyStemmer (`pip install PyStemmer`, imported when an
encoder is made), then counted.

    import tessera
    from tessera.bm25 import Bm25Encoder
    encoder = Bm25Encoder()  # term ids by a stable 32-bit hash of the stem
    client.create_collection("papers", dim=128, sparse=True)
    client.upsert("papers", [{"id": "a", "tokens": tokens, "sparse": encoder.document(text)}])
    hits = client.search("papers", query_tokens, sparse_query=encoder.query("what is…"))

Term ids are a stable hash of the stem (BLAKE2b, 32 bits: the same in every process and
version), or, with a `vocabulary` dict, its ids: documents add new stems to it, queries drop
the stems it lacks. Two stems may share a hashed id (with 100,000 distinct stems, about one pair
does); a vocabulary has no collisions but must be kept with the collection.
"""

import collections
import hashlib
import re
from typing import Any, Dict, Iterable, List, MutableMapping, Optional, Tuple

import numpy as np

__all__ = ["Bm25Encoder", "TOKEN_PATTERN"]

TOKEN_PATTERN = re.compile(r"(?u)\b\w\w+\b")

SparseTerms = Tuple[np.ndarray, np.ndarray]


class Bm25Encoder:
    """Tokenizes, stems and counts text into (indices uint32, values float32) sparse vectors.

    language: a Snowball stemmer of PyStemmer ("english", "french", …; None: no stemming).
    stopwords: tokens to drop (compared before stemming, lowercased); None: none (e.g.
    bm25s.stopwords.STOPWORDS_EN for bm25s's English list). vocabulary: stem → term id, grown by
    `document` (None: term ids by hash). Not thread-safe with a vocabulary.
    """

    def __init__(self, language: Optional[str] = "english",
                 stopwords: Optional[Iterable[str]] = None,
                 vocabulary: Optional[MutableMapping[str, int]] = None):
        self._stemmer: Any = None
        if language is not None:
            try:
                import Stemmer  # PyStemmer
            except ImportError as error:
                raise ImportError("tessera.bm25 needs PyStemmer (pip install PyStemmer), or "
                                  "language=None for no stemming") from error
            self._stemmer = Stemmer.Stemmer(language)
        self._stopwords = frozenset(word.lower() for word in (stopwords or ()))
        self.vocabulary = vocabulary

    def tokenize(self, text: str) -> List[str]:
        """The stems of `text`'s tokens, in order (stopwords removed)."""
        tokens = [t for t in TOKEN_PATTERN.findall(text.lower()) if t not in self._stopwords]
        if self._stemmer is None:
            return tokens
        return list(self._stemmer.stemWords(tokens))

    def term_id(self, stem: str, add: bool = False) -> Optional[int]:
        """The stem's term id: its hash, or its vocabulary id (a new one when `add`; None when
        the vocabulary lacks it and `add` is false)."""
        if self.vocabulary is None:
            digest = hashlib.blake2b(stem.encode("utf-8"), digest_size=4).digest()
            return int.from_bytes(digest, "little")
        if stem not in self.vocabulary:
            if not add:
                return None
            self.vocabulary[stem] = len(self.vocabulary)
        return self.vocabulary[stem]

    def _counts(self, stems: Iterable[str], add: bool) -> SparseTerms:
        counts: Dict[int, int] = collections.Counter()
        for stem in stems:
            term = self.term_id(stem, add)
            if term is not None:
                counts[term] += 1
        indices = np.array(sorted(counts), dtype=np.uint32)
        values = np.array([counts[int(i)] for i in indices], dtype=np.float32)
        return indices, values

    def document(self, text: str) -> SparseTerms:
        """A document's sparse vector: each term's frequency (its length is their sum)."""
        return self._counts(self.tokenize(text), add=True)

    def query(self, text: str) -> SparseTerms:
        """A query's sparse vector: each term's count (a term repeated n times weighs n), terms
        unknown to the vocabulary dropped."""
        return self._counts(self.tokenize(text), add=False)
