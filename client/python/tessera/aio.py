"""The asyncio Python client of a Tessera server: `tessera.Client`'s methods as coroutines.

`AsyncClient` runs on `grpc.aio` and builds its requests and converts the responses with the same
code as the blocking `Client` (`tessera._convert`), so each method takes the same arguments and
returns the same values; see `Client` for what they mean. What differs:

- Lifetime: `async with AsyncClient(address) as client:` (or `await client.close()`). Create it
  inside the event loop that uses it: a grpc.aio channel belongs to one loop.
- Retries: the idempotent calls (health, list_collections, collection_info, flush, get, search,
  search_batch, count, scroll) are retried on UNAVAILABLE and RESOURCE_EXHAUSTED with jittered
  exponential backoff within their deadline (`retry=RetryPolicy(...)`, or None to fail at
  once). Writes (delete included) are not retried.
- Ingest: `ingest` and `upsert_stream` write batches while they read the acknowledgements, with
  at most `max_in_flight` batches sent and not yet acknowledged; `ingest` also takes an async
  iterable of documents and reports progress as `Client.ingest` does (and to `on_progress`).
"""

import asyncio
from typing import (Any, AsyncIterable, AsyncIterator, Callable, Dict, Iterable, Iterator, List,
                    Mapping, Optional, Sequence, Tuple, TypeVar, Union)

import grpc
import grpc.aio

from tessera import _convert, _ingest, _snapshots
from tessera._connection import Connection
from tessera._convert import (AttributesLike, DTypeLike, Document, FilterLike, PemLike,
                              SparseLike)
from tessera._ingest import abatched
from tessera.types import DocumentResult, IngestSummary, RetryPolicy, ScrollPage, SearchResult

__all__ = ["AsyncClient"]

_Response = TypeVar("_Response")
Batches = Union[Iterable[Iterable[Document]], AsyncIterable[Iterable[Document]]]


class AsyncClient(Connection):
    """A connection to a Tessera server on asyncio; arguments as `tessera.Client`'s, and
    retry: the `RetryPolicy` of the idempotent calls (None = fail at once)."""

    def __init__(self, address: str = "127.0.0.1:50051", api_key: Optional[str] = None,
                 tls_root_cert: _convert.PemLike = None, timeout: Optional[float] = None,
                 tls_client_cert: PemLike = None, tls_client_key: PemLike = None,
                 tls_server_name: Optional[str] = None,
                 options: Sequence[Tuple[str, Any]] = (),
                 retry: Optional[RetryPolicy] = RetryPolicy()):
        super().__init__(grpc.aio, address, api_key, tls_root_cert, timeout, tls_client_cert,
                         tls_client_key, tls_server_name, options, retry)

    # Lifecycle -----------------------------------------------------------------------------

    async def close(self) -> None:
        """Closes the channel; calls still open are cancelled."""
        await self.channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _call(self, method: Callable[..., Any], request: Any, timeout: Optional[float],
                    idempotent: bool = False) -> Any:
        attempts = self._attempts(timeout, idempotent)
        while True:
            try:
                return await method(request, metadata=self.metadata, timeout=attempts.timeout())
            except grpc.RpcError as error:
                delay = attempts.delay(error)
            await asyncio.sleep(delay)

    async def health(self, service: str = "", timeout: Optional[float] = 5.0) -> str:
        return _convert.health_result(await self._call(
            self._health, _convert.health_request(service), timeout, idempotent=True))

    # Collections ---------------------------------------------------------------------------

    async def create_collection(self, name: str, dim: int, pool_factor: Optional[int] = None,
                                method: str = "ward", dtype: DTypeLike = "fp16",
                                spatial: Union[str, Mapping[str, Any], None] = None,
                                candidates: Union[str, Mapping[str, Any], None] = None,
                                attributes: Optional[Mapping[str, Any]] = None,
                                num_shards: int = 1, protected_tokens: int = 0,
                                renormalize: bool = False, min_vectors: int = 0,
                                max_merge_height: Optional[float] = None, replicas: int = 1,
                                timeout: Optional[float] = None,
                                sparse: Union[bool, Mapping[str, Any]] = False) -> Dict[str, Any]:
        request = _convert.create_collection_request(
            name, dim, pool_factor, method, dtype, spatial, candidates, attributes, num_shards,
            protected_tokens, renormalize, min_vectors, max_merge_height, replicas, sparse)
        return _convert.create_collection_result(
            await self._call(self.admin_stub.CreateCollection, request, timeout))

    async def drop_collection(self, name: str, timeout: Optional[float] = None) -> None:
        await self._call(self.admin_stub.DropCollection, _convert.drop_collection_request(name),
                         timeout)

    async def list_collections(self, timeout: Optional[float] = None) -> List[str]:
        return _convert.list_collections_result(await self._call(
            self.admin_stub.ListCollections, _convert.list_collections_request(), timeout,
            idempotent=True))

    async def collection_info(self, name: str,
                              timeout: Optional[float] = None) -> Dict[str, Any]:
        return _convert.collection_info_result(await self._call(
            self.admin_stub.GetCollection, _convert.collection_info_request(name), timeout,
            idempotent=True))

    async def create_snapshot(self, name: str, timeout: Optional[float] = None) -> str:
        response = await self._call(self.admin_stub.CreateSnapshot,
                                    _snapshots.create_request(name), timeout)
        return response.snapshot.id

    async def list_snapshots(self, name: str,
                             timeout: Optional[float] = None) -> List[Dict[str, Any]]:
        return _snapshots.list_result(await self._call(
            self.admin_stub.ListSnapshots, _snapshots.list_request(name), timeout,
            idempotent=True))

    async def delete_snapshot(self, snapshot: str, timeout: Optional[float] = None) -> None:
        await self._call(self.admin_stub.DeleteSnapshot, _snapshots.delete_request(snapshot),
                         timeout)

    async def download_snapshot(self, snapshot: str, path: str,
                                timeout: Optional[float] = None) -> int:
        with _snapshots.download_to(path) as download:
            call = self.admin_stub.DownloadSnapshot(_snapshots.download_request(snapshot),
                                                    metadata=self.metadata, timeout=timeout)
            async for chunk in call:
                download.write(chunk)
        return download.written

    async def restore_snapshot(self, snapshot: str, new_name: str,
                               timeout: Optional[float] = None) -> Dict[str, Any]:
        return await self._restore(_snapshots.restore_by_id_requests(snapshot, new_name), timeout)

    async def restore_snapshot_from_file(self, path: str, new_name: str,
                                         timeout: Optional[float] = None) -> Dict[str, Any]:
        return await self._restore(_snapshots.restore_from_file_requests(path, new_name), timeout)

    async def _restore(self, requests: Iterator[Any], timeout: Optional[float]) -> Dict[str, Any]:
        # Not through _call: a stream of requests is sent once, and no default deadline applies.
        with _convert.tessera_errors():
            response = await self.admin_stub.RestoreSnapshot(requests, metadata=self.metadata,
                                                             timeout=timeout)
        return _snapshots.info_dict(response.snapshot)

    async def flush(self, name: str, timeout: Optional[float] = None) -> None:
        await self._call(self.admin_stub.Flush, _convert.flush_request(name), timeout,
                         idempotent=True)

    # Documents -----------------------------------------------------------------------------

    async def upsert_stream(self, collection: str, batches: Batches, dtype: DTypeLike = None,
                            timeout: Optional[float] = None,
                            max_in_flight: int = 4) -> AsyncIterator[List[DocumentResult]]:
        """One Upsert stream: writes each batch of documents as one request, at most
        `max_in_flight` of them ahead of the server's acknowledgements, and yields, per batch
        and in order, the per-document results once the server has acknowledged it. A document
        that does not encode (or a failing `batches` iterator) ends the request stream; its
        exception is raised once the server has answered the batches before it."""
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight is {max_in_flight}; expected at least 1")
        call = self.ingest_stub.Upsert(metadata=self.metadata, timeout=self._timeout(timeout))
        window = asyncio.Semaphore(max_in_flight)
        failure: List[BaseException] = []

        async def write() -> None:
            index = 0
            try:
                async for batch in _aiter(batches):
                    documents = list(batch)
                    request = _convert.upsert_request(collection, documents, dtype, index)
                    await window.acquire()
                    await call.write(request)
                    index += len(documents)
            except (grpc.RpcError, asyncio.InvalidStateError):
                return  # the call has ended: reading it reports its status
            except Exception as error:  # noqa: BLE001 (raised by the reader below)
                failure.append(error)
            try:
                await call.done_writing()
            except (grpc.RpcError, asyncio.InvalidStateError):
                pass

        writer = asyncio.ensure_future(write())
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    break
                window.release()
                yield _convert.upsert_results(response)
            await writer
        except grpc.RpcError as error:
            raise _convert.error_of(error, failure) from None
        finally:
            if not writer.done():
                writer.cancel()
            call.cancel()  # no-op once the call has finished
        if failure:
            raise failure[0]

    async def upsert(self, collection: str, docs: Iterable[Document], batch_size: int = 64,
                     dtype: DTypeLike = None, timeout: Optional[float] = None,
                     batch_bytes: int = 4 << 20,
                     max_in_flight: int = 4) -> List[DocumentResult]:
        """As `Client.upsert`: every document is checked before anything is sent."""
        upsert = _ingest.Upsert(docs, batch_size, batch_bytes)
        async for results in self.upsert_stream(collection, upsert.batches, dtype, timeout,
                                                max_in_flight):
            upsert.acknowledged(results)
        return upsert.results()

    async def ingest(self, collection: str,
                     docs: Union[Iterable[Document], AsyncIterable[Document]],
                     batch_size: int = 64, progress: bool = True, total: Optional[int] = None,
                     dtype: DTypeLike = None, timeout: Optional[float] = None,
                     batch_bytes: int = 4 << 20, max_in_flight: int = 4,
                     on_progress: Optional[Callable[[int, int], None]] = None) -> IngestSummary:
        """As `Client.ingest`, for an iterable or an async iterable of documents, with at most
        `max_in_flight` batches sent ahead of the acknowledgements. `on_progress(stored,
        failed)`, when given, is called after each acknowledged batch with the running
        totals."""
        with _ingest.Tally(collection, docs, total, progress) as tally:
            async for results in self.upsert_stream(
                    collection, tally.acounted(abatched(docs, batch_size, batch_bytes)), dtype,
                    timeout, max_in_flight):
                tally.acknowledged(results)
                if on_progress is not None:
                    on_progress(tally.stored, len(tally.failed))
        return tally.summary()

    async def delete(self, collection: str, ids: Union[str, Sequence[str], None] = None,
                     timeout: Optional[float] = None,
                     filter: FilterLike = None) -> Union[List[bool], int]:
        request = _convert.delete_request(collection, ids, filter)
        return _convert.delete_result(
            await self._call(self.ingest_stub.Delete, request, timeout), filter is not None)

    async def get(self, collection: str, id: str,
                  timeout: Optional[float] = None) -> Dict[str, Any]:
        return _convert.get_result(await self._call(
            self.ingest_stub.Get, _convert.get_request(collection, id), timeout,
            idempotent=True))

    # Search --------------------------------------------------------------------------------

    async def search(self, collection: str, query: Any, k: int = 10, num_candidates: int = 0,
                     filter: FilterLike = None, exhaustive: bool = False,
                     explain: bool = False, per_token_candidates: int = 0,
                     dtype: DTypeLike = None, timeout: Optional[float] = None, nprobe: int = 0,
                     allow_partial_results: bool = False,
                     with_attributes: AttributesLike = False, group_by: Optional[str] = None,
                     group_size: Optional[int] = None,
                     groups: Optional[int] = None, sparse_query: SparseLike = None,
                     fusion: Optional[str] = None, dense_weight: Optional[float] = None,
                     sparse_weight: Optional[float] = None, rrf_k: Optional[float] = None,
                     fusion_candidates: int = 0, rerank: bool = False) -> SearchResult:
        request = _convert.search_request(collection, query, k, num_candidates, filter,
                                          exhaustive, explain, per_token_candidates, dtype,
                                          nprobe, allow_partial_results, with_attributes,
                                          group_by, group_size, groups, sparse_query, fusion,
                                          dense_weight, sparse_weight, rrf_k, fusion_candidates,
                                          rerank)
        return _convert.search_result(await self._call(self.query_stub.Search, request, timeout,
                                                       idempotent=True))

    async def search_batch(self, collection: str, queries: Iterable[Any],
                           timeout: Optional[float] = None,
                           **options: Any) -> List[SearchResult]:
        request = _convert.search_batch_request(collection, queries, options)
        return _convert.search_batch_result(await self._call(
            self.query_stub.SearchBatch, request, timeout, idempotent=True))

    async def count(self, collection: str, filter: FilterLike = None,
                    timeout: Optional[float] = None) -> int:
        return _convert.count_result(await self._call(
            self.query_stub.Count, _convert.count_request(collection, filter), timeout,
            idempotent=True))

    async def scroll(self, collection: str, filter: FilterLike = None,
                     after: Optional[str] = None, limit: int = 100,
                     with_attributes: AttributesLike = False,
                     timeout: Optional[float] = None) -> ScrollPage:
        request = _convert.scroll_request(collection, filter, after, limit, with_attributes)
        return _convert.scroll_result(await self._call(self.query_stub.Scroll, request,
                                                       timeout, idempotent=True))


async def _aiter(items: Batches) -> AsyncIterator[Iterable[Document]]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


def _document_from_client() -> None:
    """Each coroutine without a docstring of its own takes the blocking method's."""
    from tessera.client import Client
    for name, method in vars(AsyncClient).items():
        blocking = getattr(Client, name, None)
        if callable(method) and method.__doc__ is None and blocking is not None:
            method.__doc__ = blocking.__doc__


_document_from_client()
