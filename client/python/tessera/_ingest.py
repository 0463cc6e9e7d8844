"""What both clients' `ingest` and `upsert` share: batching by document count and token bytes,
the progress bar, and the bookkeeping around their Upsert streams (Upsert, Tally)."""

import math
import sys
import threading
import time
from typing import (Any, AsyncIterable, AsyncIterator, Iterable, Iterator, List, Mapping,
                    Optional, Union)

import grpc

from tessera import _convert
from tessera._convert import Document
from tessera._proto.tessera.v1 import ingest_pb2
from tessera.types import DocumentResult, IngestSummary, TesseraError


class ProgressBar:
    """docs/s and ETA on stderr; tqdm when it is installed, a one-line bar otherwise."""

    def __init__(self, total: Optional[int], description: str, enabled: bool):
        self._total = total
        self._description = description
        self._enabled = enabled
        self._count = 0
        self._failed = 0
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._tqdm: Any = None
        if enabled:
            try:
                import tqdm  # optional
                self._tqdm = tqdm.tqdm(total=total, desc=description, unit="docs", file=sys.stderr)
            except ImportError:
                pass

    def update(self, documents: int, failed: int = 0) -> None:
        self._count += documents
        self._failed += failed
        if not self._enabled:
            return
        if self._tqdm is not None:
            self._tqdm.update(documents)
            if self._failed:
                self._tqdm.set_postfix(failed=self._failed)
            return
        now = time.monotonic()
        if now - self._last_draw >= 0.1:
            self._last_draw = now
            self._draw(now)

    def _draw(self, now: float, final: bool = False) -> None:
        elapsed = max(now - self._start, 1e-9)
        rate = self._count / elapsed
        failed = f", {self._failed} failed" if self._failed else ""
        if self._total:
            fraction = min(self._count / self._total, 1.0)
            width = 30
            filled = int(round(width * fraction))
            bar = "#" * filled + "-" * (width - filled)
            remaining = (self._total - self._count) / rate if rate > 0 else math.inf
            eta = _format_seconds(elapsed if final else remaining)
            label = "in" if final else "ETA"
            line = (f"\r{self._description} [{bar}] {self._count}/{self._total} "
                    f"{fraction * 100:5.1f}% {rate:8.1f} docs/s {label} {eta}{failed}")
        else:
            line = (f"\r{self._description} {self._count} docs {rate:8.1f} docs/s "
                    f"{_format_seconds(elapsed)}{failed}")
        sys.stderr.write(line)
        sys.stderr.flush()

    def close(self) -> None:
        if not self._enabled:
            return
        if self._tqdm is not None:
            self._tqdm.close()
            return
        self._draw(time.monotonic(), final=True)
        sys.stderr.write("\n")
        sys.stderr.flush()


def _format_seconds(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "--:--"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes:02d}:{seconds:02d}"


def _token_bytes(doc: Any) -> int:
    """Token bytes of a document in any form encode_document accepts (0 when unknown, as for a
    malformed document, which the encoder then reports)."""
    if isinstance(doc, ingest_pb2.Document):
        return len(doc.tokens.data)
    try:
        tokens = doc["tokens"] if isinstance(doc, Mapping) else doc[1]
    except (KeyError, IndexError, TypeError):
        return 0
    nbytes = getattr(tokens, "nbytes", 0)
    return nbytes if isinstance(nbytes, int) else 0


class Batcher:
    """Cuts a stream of documents into batches of at most `size` documents and, when
    max_bytes > 0, at most `max_bytes` of token bytes (a larger document goes alone): one Upsert
    message each, well under the server's message limit even for ColPali pages (~0.5 MB each in
    fp32). Feed it with add(); finish() returns the last, partial batch."""

    def __init__(self, size: int, max_bytes: int = 0):
        if size < 1:
            raise ValueError(f"batch_size is {size}; expected at least 1")
        self._size = size
        self._max_bytes = max_bytes
        self._batch: List[Any] = []
        self._bytes = 0

    def add(self, item: Any) -> List[List[Any]]:
        """Adds one document; returns the batches it completed (none, one or two)."""
        done = []
        item_bytes = _token_bytes(item) if self._max_bytes > 0 else 0
        if self._batch and self._max_bytes > 0 and self._bytes + item_bytes > self._max_bytes:
            done.append(self._batch)
            self._batch, self._bytes = [], 0
        self._batch.append(item)
        self._bytes += item_bytes
        if len(self._batch) >= self._size:
            done.append(self._batch)
            self._batch, self._bytes = [], 0
        return done

    def finish(self) -> Optional[List[Any]]:
        batch, self._batch, self._bytes = self._batch, [], 0
        return batch or None


def batched(items: Iterable[Any], size: int, max_bytes: int = 0) -> Iterator[List[Any]]:
    """`items` in batches, as Batcher cuts them."""
    batcher = Batcher(size, max_bytes)
    for item in items:
        yield from batcher.add(item)
    last = batcher.finish()
    if last:
        yield last


async def abatched(items: Union[Iterable[Any], AsyncIterable[Any]], size: int,
                   max_bytes: int = 0) -> AsyncIterator[List[Any]]:
    """The same for an iterable or an async iterable (AsyncClient's ingest)."""
    batcher = Batcher(size, max_bytes)
    if isinstance(items, AsyncIterable):
        async for item in items:
            for batch in batcher.add(item):
                yield batch
    else:
        for item in items:
            for batch in batcher.add(item):
                yield batch
    last = batcher.finish()
    if last:
        yield last


class Upsert:
    """What `upsert` does around its Upsert stream: checks every document before anything is
    sent, cuts them into `batches`, and collects the per-document results as the server
    acknowledges each batch."""

    def __init__(self, docs: Iterable[Document], batch_size: int, batch_bytes: int):
        docs = list(docs)
        _convert.check_documents(docs)  # every document checked before anything is sent
        self.batches = list(batched(docs, batch_size, batch_bytes))
        self._results: List[DocumentResult] = []
        self._answered = 0

    def acknowledged(self, results: List[DocumentResult]) -> None:
        self._results.extend(results)
        self._answered += 1

    def results(self) -> List[DocumentResult]:
        """One per document, in order; TesseraError when a batch was not acknowledged."""
        if self._answered != len(self.batches):
            raise TesseraError(grpc.StatusCode.UNKNOWN,
                               f"server acknowledged {self._answered} of {len(self.batches)} "
                               "batches")
        return self._results


class Tally:
    """What `ingest` counts over its Upsert stream: the documents sent (on whichever thread pulls
    the batches: gRPC's own for the blocking client), stored and failed, on a progress bar that
    leaving the `with` block closes."""

    def __init__(self, collection: str, docs: Any, total: Optional[int], progress: bool):
        if total is None and hasattr(docs, "__len__"):
            total = len(docs)
        self._bar = ProgressBar(total, f"ingest {collection}", progress)
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._sent = 0
        self.stored = 0
        self.failed: List[DocumentResult] = []

    def __enter__(self) -> "Tally":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bar.close()

    def counted(self, batches: Iterable[List[Any]]) -> Iterator[List[Any]]:
        """`batches`, each counted as sent when it is taken."""
        for batch in batches:
            self._sent_batch(batch)
            yield batch

    async def acounted(self, batches: AsyncIterable[List[Any]]) -> AsyncIterator[List[Any]]:
        """The same for an async iterable."""
        async for batch in batches:
            self._sent_batch(batch)
            yield batch

    def _sent_batch(self, batch: List[Any]) -> None:
        with self._lock:
            self._sent += len(batch)

    def acknowledged(self, results: List[DocumentResult]) -> None:
        bad = [r for r in results if not r.ok]
        self.failed.extend(bad)
        self.stored += len(results) - len(bad)
        self._bar.update(len(results), len(bad))

    def summary(self) -> IngestSummary:
        """TesseraError when the server acknowledged fewer documents than were sent."""
        with self._lock:
            documents = self._sent
        if self.stored + len(self.failed) != documents:
            raise TesseraError(grpc.StatusCode.UNKNOWN,
                               f"server acknowledged {self.stored + len(self.failed)} of "
                               f"{documents} documents")
        return IngestSummary(documents, self.stored, self.failed, time.monotonic() - self._start)
