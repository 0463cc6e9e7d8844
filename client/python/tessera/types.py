"""The values both clients (`tessera.Client`, `tessera.AsyncClient`) return and raise, and their
retry policy. Plain data: no gRPC call happens here."""

import dataclasses
import random
from typing import Any, Dict, Iterable, List, Optional, Tuple

import grpc
import numpy as np

__all__ = ["TesseraError", "DocumentResult", "TokenMatch", "Hit", "Group", "SearchResult",
           "ScrollPage", "IngestSummary", "RetryPolicy"]

# google.rpc.Code number → grpc.StatusCode.
_STATUS_BY_NUMBER = {status.value[0]: status for status in grpc.StatusCode}


class TesseraError(Exception):
    """A failed call: `code` is a `grpc.StatusCode`, `message` the server's explanation."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "TesseraError":
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code if code is not None else grpc.StatusCode.UNKNOWN, details or "")


@dataclasses.dataclass
class DocumentResult:
    """The outcome of one upserted document; `code` is a google.rpc.Code number (0 = stored)."""
    id: str
    code: int
    message: str
    version: int
    num_vectors: int

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def status(self) -> grpc.StatusCode:
        return _STATUS_BY_NUMBER.get(self.code, grpc.StatusCode.UNKNOWN)


@dataclasses.dataclass
class TokenMatch:
    """For one query token: the best document vector, its similarity and the tokens it pools."""
    query_token: int
    document_vector: int
    similarity: float
    covered_tokens: List[int]


@dataclasses.dataclass
class Hit:
    id: str
    score: float
    version: int
    explanation: List[TokenMatch] = dataclasses.field(default_factory=list)
    # With search(with_attributes=…): the document's attributes (all, or the fields named).
    attributes: Dict[str, Any] = dataclasses.field(default_factory=dict)
    # A sparse or hybrid search (search(sparse_query=…)): the hit's MaxSim when known, and its
    # sparse (BM25) score when it was in the sparse lane; None otherwise.
    dense_score: Optional[float] = None
    sparse_score: Optional[float] = None


@dataclasses.dataclass
class Group:
    """One group of a grouped search (search(group_by=FIELD)): the field's value and the best
    hits sharing it, best first."""
    value: Any
    hits: List[Hit]


class SearchResult(List[Hit]):
    """The hits of one search, best first, with `timings` (ms per stage), `documents_scored`,
    `exhaustive` and `missing_shards` (from a router, with allow_partial_results: the shards
    that no replica answered for, whose hits are missing)."""

    def __init__(self, hits: Iterable[Hit] = (), timings: Optional[Dict[str, float]] = None,
                 documents_scored: int = 0, exhaustive: bool = False,
                 missing_shards: Iterable[int] = ()):
        super().__init__(hits)
        self.timings: Dict[str, float] = timings or {}
        self.documents_scored: int = documents_scored
        self.exhaustive: bool = exhaustive
        self.missing_shards: List[int] = list(missing_shards)
        # A grouped search (group_by): its groups, best first; the list of hits is then empty.
        self.groups: List[Group] = []

    @property
    def ids(self) -> List[str]:
        return [hit.id for hit in self]

    @property
    def scores(self) -> np.ndarray:
        return np.array([hit.score for hit in self], dtype=np.float32)


@dataclasses.dataclass
class ScrollPage:
    """One page of scroll(): documents as {id, version, attributes}, ascending by id, and the
    `after` of the next page (None when this page reached the end)."""
    documents: List[Dict[str, Any]]
    next_after: Optional[str]


@dataclasses.dataclass
class IngestSummary:
    """What `ingest` did: documents sent, stored, and the results of those that failed."""
    documents: int
    stored: int
    failed: List[DocumentResult]
    seconds: float


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Retries of idempotent calls (health, list_collections, collection_info, flush, get,
    search, search_batch, count, scroll) that fail with one of `codes`: at most `attempts`
    tries in all, the n-th retry after a random delay in [0, min(max_backoff, initial_backoff · multiplier^n)]
    seconds ("full jitter"), all within the call's timeout. Writes (create, drop, upsert,
    ingest, delete) are never retried: their answer could differ the second time."""
    attempts: int = 4
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    multiplier: float = 2.0
    codes: Tuple[grpc.StatusCode, ...] = (grpc.StatusCode.UNAVAILABLE,
                                          grpc.StatusCode.RESOURCE_EXHAUSTED)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts is {self.attempts}; expected at least 1")
        if self.initial_backoff < 0 or self.max_backoff < 0 or self.multiplier < 1:
            raise ValueError(f"RetryPolicy backoff {self.initial_backoff}/{self.max_backoff}"
                             f" x{self.multiplier}; expected non-negative delays and a "
                             "multiplier of at least 1")

    def delay(self, retry: int) -> Optional[float]:
        """Seconds to wait before retry number `retry` (0 = the first retry), or None when the
        attempts are used up."""
        if retry + 1 >= self.attempts:
            return None
        ceiling = min(self.max_backoff, self.initial_backoff * self.multiplier ** retry)
        return random.uniform(0.0, ceiling)

    def retries(self, code: Optional[grpc.StatusCode]) -> bool:
        return code in self.codes
