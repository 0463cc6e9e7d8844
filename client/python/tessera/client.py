"""The blocking Python client of a Tessera server: numpy arrays in, numpy arrays out.

`Client` wraps the three public gRPC services of `tessera.v1` (AdminService, IngestService,
QueryService) on a blocking gRPC channel; `tessera.AsyncClient` (aio.py) is the same client on
asyncio. Both build their requests and convert the responses with `tessera._convert`, so they
take the same arguments and return the same values. Every gRPC error is raised as
`TesseraError`, which carries the status code and the server's message.

A `Client` owns one gRPC channel and is thread-safe (gRPC channels and stubs are).
"""

import time
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence,
                    Tuple, TypeVar, Union)

import grpc

from tessera import _convert, _ingest, _snapshots
from tessera._connection import Connection
from tessera._convert import (AttributesLike, DTypeLike, Document, FilterLike, PemLike, SparseLike,
                              decode_matrix, encode_document, encode_filter, encode_matrix,
                              message_to_dict)
from tessera._ingest import batched
from tessera.types import (DocumentResult, Group, Hit, IngestSummary, RetryPolicy, ScrollPage,
                           SearchResult, TesseraError, TokenMatch)

__all__ = [
    "Client", "TesseraError", "DocumentResult", "Hit", "TokenMatch", "SearchResult",
    "IngestSummary", "RetryPolicy", "Group", "ScrollPage", "encode_matrix", "decode_matrix", "encode_document",
    "encode_filter", "message_to_dict",
]

_Response = TypeVar("_Response")


class Client(Connection):
    """A connection to a Tessera server.

    address: "host:port". api_key: sent as `authorization: Bearer KEY` on every call.
    tls_root_cert: PEM bytes or a file path; turns TLS on (the server's CA). tls_client_cert /
    tls_client_key: PEM bytes or paths, for mutual TLS. timeout: default deadline of every call in
    seconds (None = none); each method takes its own `timeout` too. retry: a `RetryPolicy` for
    the idempotent calls (None, the default here, fails at once; `AsyncClient` retries by
    default).
    """

    def __init__(self, address: str = "127.0.0.1:50051", api_key: Optional[str] = None,
                 tls_root_cert: PemLike = None, timeout: Optional[float] = None,
                 tls_client_cert: PemLike = None, tls_client_key: PemLike = None,
                 tls_server_name: Optional[str] = None,
                 options: Sequence[Tuple[str, Any]] = (),
                 retry: Optional[RetryPolicy] = None):
        super().__init__(grpc, address, api_key, tls_root_cert, timeout, tls_client_cert,
                         tls_client_key, tls_server_name, options, retry)

    # Lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _call(self, method: Callable[..., _Response], request: Any, timeout: Optional[float],
              idempotent: bool = False) -> _Response:
        """One unary call; an idempotent one is retried as `self.retry` says, within the
        call's deadline."""
        attempts = self._attempts(timeout, idempotent)
        while True:
            try:
                return method(request, metadata=self.metadata, timeout=attempts.timeout())
            except grpc.RpcError as error:
                delay = attempts.delay(error)
            time.sleep(delay)

    def health(self, service: str = "", timeout: Optional[float] = 5.0) -> str:
        """grpc.health.v1 Check: "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN"."""
        return _convert.health_result(self._call(self._health, _convert.health_request(service),
                                                 timeout, idempotent=True))

    # Collections ---------------------------------------------------------------------------

    def create_collection(self, name: str, dim: int, pool_factor: Optional[int] = None,
                          method: str = "ward", dtype: DTypeLike = "fp16",
                          spatial: Union[str, Mapping[str, Any], None] = None,
                          candidates: Union[str, Mapping[str, Any], None] = None,
                          attributes: Optional[Mapping[str, Any]] = None, num_shards: int = 1,
                          protected_tokens: int = 0, renormalize: bool = False,
                          min_vectors: int = 0, max_merge_height: Optional[float] = None,
                          replicas: int = 1,
                          timeout: Optional[float] = None,
                          sparse: Union[bool, Mapping[str, Any]] = False) -> Dict[str, Any]:
        """Creates a collection and returns its schema with the server's defaults filled in.

        Rerank vectors are pooled hierarchically (pool_factor, None = 2; method "ward" or
        "reference", protected_tokens, renormalize, min_vectors: keep at least min(n,
        min_vectors) vectors per document, 0 = no floor; max_merge_height: no Ward merge above
        this height, so dissimilar tokens stay apart, None = the server's default for the method
        (0.3 for ward), 0 = no limit) unless `spatial` is given: a mode name ("rows",
        "columns", "tiles" (needs tile_rows and tile_cols), "row_windows" (needs window_rows and
        window_stride), "global") or a dict {mode, tile_rows, tile_cols, window_rows,
        window_stride, keep_special_tokens, renormalize}. With both `spatial` and `pool_factor`,
        the spatially pooled vectors are then pooled hierarchically as well. `candidates`: a
        FAISS factory string or a dict {kind: "pooled"|"global_mean", pool_factor, factory,
        residual_bits, centroid_min_vectors, centroid_min_training_vectors, rerank_from_codes}.
        `attributes`: {field: type} with type "int64", "double" or "string" (or int, float, str).
        `replicas`: copies of each shard on distinct shard nodes (a router only; a standalone
        server holds one). `sparse`: True declares a sparse field scored by BM25 (Lucene's, with
        the IDF modifier, k1 1.2, b 0.75), or a dict {idf: bool, k1, b}; documents may then carry
        "sparse": (indices, values) and searches a sparse_query.
        """
        request = _convert.create_collection_request(
            name, dim, pool_factor, method, dtype, spatial, candidates, attributes, num_shards,
            protected_tokens, renormalize, min_vectors, max_merge_height, replicas, sparse)
        return _convert.create_collection_result(
            self._call(self.admin_stub.CreateCollection, request, timeout))

    def drop_collection(self, name: str, timeout: Optional[float] = None) -> None:
        self._call(self.admin_stub.DropCollection, _convert.drop_collection_request(name),
                   timeout)

    def list_collections(self, timeout: Optional[float] = None) -> List[str]:
        return _convert.list_collections_result(self._call(
            self.admin_stub.ListCollections, _convert.list_collections_request(), timeout,
            idempotent=True))

    def collection_info(self, name: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        """{"schema": {...}, "stats": {documents, original_tokens, rerank_vectors, ...},
        "shards": [{shard, replicas: [{node_id, address, state}]}]} ("shards" empty except
        from a router; a replica's state is "serving", "down" or "stale")."""
        return _convert.collection_info_result(self._call(
            self.admin_stub.GetCollection, _convert.collection_info_request(name), timeout,
            idempotent=True))

    def flush(self, name: str, timeout: Optional[float] = None) -> None:
        self._call(self.admin_stub.Flush, _convert.flush_request(name), timeout, idempotent=True)

    # Snapshots -----------------------------------------------------------------------------

    def create_snapshot(self, name: str, timeout: Optional[float] = None) -> str:
        """Snapshots collection `name` on the server (every shard at one cut; cheap: hard
        links) and returns the snapshot's id ("NAME@TIME-HEX")."""
        response = self._call(self.admin_stub.CreateSnapshot, _snapshots.create_request(name),
                              timeout)
        return response.snapshot.id

    def list_snapshots(self, name: str, timeout: Optional[float] = None) -> List[Dict[str, Any]]:
        """Collection `name`'s snapshots, oldest first: [{id, collection,
        created_unix_micros, num_shards, files, bytes, cut_seconds}]."""
        return _snapshots.list_result(self._call(
            self.admin_stub.ListSnapshots, _snapshots.list_request(name), timeout,
            idempotent=True))

    def delete_snapshot(self, snapshot: str, timeout: Optional[float] = None) -> None:
        self._call(self.admin_stub.DeleteSnapshot, _snapshots.delete_request(snapshot), timeout)

    def download_snapshot(self, snapshot: str, path: str,
                          timeout: Optional[float] = None) -> int:
        """Writes the snapshot's archive to `path` (removed again if the download fails);
        returns its size in bytes. No deadline unless `timeout` is given."""
        with _snapshots.download_to(path) as download:
            for chunk in self.admin_stub.DownloadSnapshot(
                    _snapshots.download_request(snapshot), metadata=self.metadata,
                    timeout=timeout):
                download.write(chunk)
        return download.written

    def restore_snapshot(self, snapshot: str, new_name: str,
                         timeout: Optional[float] = None) -> Dict[str, Any]:
        """Restores snapshot `snapshot` (held by the server) into new collection `new_name`;
        returns the snapshot's info. ALREADY_EXISTS for a taken name, DATA_LOSS naming the file
        for a corrupt snapshot (nothing is left of the restore then)."""
        return self._restore(_snapshots.restore_by_id_requests(snapshot, new_name), timeout)

    def restore_snapshot_from_file(self, path: str, new_name: str,
                                   timeout: Optional[float] = None) -> Dict[str, Any]:
        """Uploads the archive at `path` (from `download_snapshot`, of this server or another)
        and restores it into new collection `new_name`."""
        return self._restore(_snapshots.restore_from_file_requests(path, new_name), timeout)

    def _restore(self, requests: Iterator[Any], timeout: Optional[float]) -> Dict[str, Any]:
        # Not through _call: a stream of requests is sent once, and no default deadline applies.
        with _convert.tessera_errors():
            response = self.admin_stub.RestoreSnapshot(requests, metadata=self.metadata,
                                                          timeout=timeout)
        return _snapshots.info_dict(response.snapshot)

    # Documents -----------------------------------------------------------------------------

    def upsert_stream(self, collection: str, batches: Iterable[Iterable[Document]],
                      dtype: DTypeLike = None,
                      timeout: Optional[float] = None) -> Iterator[List[DocumentResult]]:
        """One Upsert stream: sends each batch of documents as one request (lazily, as gRPC asks
        for it) and yields, per batch and in order, the per-document results once the server has
        acknowledged it. Closing the generator early cancels the stream."""
        # gRPC pulls the requests on its own thread, where an exception would only end the call
        # with "UNKNOWN: Exception iterating requests!". A document that does not encode (or a
        # failing `batches` iterator) instead ends the request stream there; once the server has
        # answered what was sent, the exception is raised here, as it was.
        failure: List[BaseException] = []

        def requests() -> Iterator[Any]:
            index = 0
            try:
                for batch in batches:
                    batch = list(batch)
                    yield _convert.upsert_request(collection, batch, dtype, index)
                    index += len(batch)
            except Exception as error:  # noqa: BLE001 (handed to the caller's thread)
                failure.append(error)

        call = self.ingest_stub.Upsert(requests(), metadata=self.metadata,
                                       timeout=self._timeout(timeout))
        try:
            for response in call:
                yield _convert.upsert_results(response)
        except grpc.RpcError as error:
            raise _convert.error_of(error, failure) from None
        finally:
            call.cancel()  # no-op once the call has finished
        if failure:
            raise failure[0]

    def upsert(self, collection: str, docs: Iterable[Document], batch_size: int = 64,
               dtype: DTypeLike = None, timeout: Optional[float] = None,
               batch_bytes: int = 4 << 20) -> List[DocumentResult]:
        """Writes documents over one Upsert stream, at most `batch_size` documents and
        `batch_bytes` of token bytes per request message (a larger document goes alone), and
        returns one result per document (check `.ok`: a rejected document does not fail the
        others).

        A document is a dict {id, tokens, layout?, attributes?} or a tuple (id, tokens[, layout[,
        attributes]]); tokens: n_tokens × dim float32 or float16 (sent as is unless `dtype` says
        "fp16"/"fp32"); layout: (rows, cols[, prefix_tokens, suffix_tokens]) or None; attributes:
        {field: int | float | str}. Raises TesseraError when the stream fails.
        """
        upsert = _ingest.Upsert(docs, batch_size, batch_bytes)
        for results in self.upsert_stream(collection, upsert.batches, dtype, timeout):
            upsert.acknowledged(results)
        return upsert.results()

    def ingest(self, collection: str, docs: Iterable[Document], batch_size: int = 64,
               progress: bool = True, total: Optional[int] = None, dtype: DTypeLike = None,
               timeout: Optional[float] = None, batch_bytes: int = 4 << 20) -> IngestSummary:
        """Streams any number of documents (a list or a lazy iterable, see `upsert`) in batches
        over one Upsert stream, with a progress bar on stderr (docs/s, ETA when the total is known).
        Returns an IngestSummary; rejected documents are in `.failed`."""
        with _ingest.Tally(collection, docs, total, progress) as tally:
            for results in self.upsert_stream(
                    collection, tally.counted(batched(docs, batch_size, batch_bytes)), dtype,
                    timeout):
                tally.acknowledged(results)
        return tally.summary()

    def delete(self, collection: str, ids: Union[str, Sequence[str], None] = None,
               timeout: Optional[float] = None,
               filter: FilterLike = None) -> Union[List[bool], int]:
        """Deletes documents by id, returning per id whether it existed; or, with `filter` (as
        for search, not empty) instead of ids, every document matching it, returning how many.
        Acknowledged (durable) when it returns, either way. Never retried."""
        request = _convert.delete_request(collection, ids, filter)
        return _convert.delete_result(
            self._call(self.ingest_stub.Delete, request, timeout), filter is not None)

    def get(self, collection: str, id: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        """A stored document: {id, version, num_tokens, layout, attributes, vectors (float32
        n_vectors × dim, decoded from the stored fp16/fp32), dtype, member_offsets, members}.
        NOT_FOUND (as TesseraError) for an unknown id."""
        return _convert.get_result(self._call(
            self.ingest_stub.Get, _convert.get_request(collection, id), timeout,
            idempotent=True))

    # Search --------------------------------------------------------------------------------

    def search(self, collection: str, query: Any, k: int = 10, num_candidates: int = 0,
               filter: FilterLike = None, exhaustive: bool = False, explain: bool = False,
               per_token_candidates: int = 0, dtype: DTypeLike = None,
               timeout: Optional[float] = None, nprobe: int = 0,
               allow_partial_results: bool = False,
               with_attributes: AttributesLike = False, group_by: Optional[str] = None,
               group_size: Optional[int] = None, groups: Optional[int] = None,
               sparse_query: SparseLike = None, fusion: Optional[str] = None,
               dense_weight: Optional[float] = None, sparse_weight: Optional[float] = None,
               rrf_k: Optional[float] = None, fusion_candidates: int = 0,
               rerank: bool = False) -> SearchResult:
        """Top-k documents by MaxSim for a query (n_query_tokens × dim). num_candidates: N
        documents scored exactly (0 = server default); filter: [(field, op, value(s))] with op
        among ==, !=, <, <=, >, >=, in; exhaustive: score every document exactly; explain: per hit
        and query token, the best document vector and the original tokens it covers; nprobe:
        centroids probed per query token when stage 1 is the centroid index (0 = server
        default); allow_partial_results (a router): when a shard has no replica that answers,
        return the other shards' hits with `missing_shards` set instead of raising UNAVAILABLE.
        Filters nest: {"any_of": [A, B]}, {"none_of": [A]} (each alternative a filter), and
        conditions (field, "exists"), (field, "missing"), (field, "prefix", "abc").
        with_attributes: True (all) or a list of fields: each Hit carries `.attributes`.
        group_by=FIELD: the result's `.groups` holds the best `groups` groups (default k) of
        hits sharing FIELD's value, each with its best `group_size` hits (default 1).

        Hybrid retrieval (a collection created with sparse=True): sparse_query=(indices, values)
        (e.g. tessera.bm25's term frequencies) with query=None searches the sparse lane alone
        (BM25 with the collection's IDF); with a query matrix too, each lane's best
        `fusion_candidates` (default k) are fused, fusion="rrf" (reciprocal rank, rrf_k 60) or
        "score" (min-max normalised scores), weighted by dense_weight and sparse_weight (1), and
        the best k of the fusion returned with the fused score; rerank=True orders the fused
        candidates by exact MaxSim instead. Hits carry .dense_score and .sparse_score."""
        request = _convert.search_request(collection, query, k, num_candidates, filter,
                                          exhaustive, explain, per_token_candidates, dtype,
                                          nprobe, allow_partial_results, with_attributes,
                                          group_by, group_size, groups, sparse_query, fusion,
                                          dense_weight, sparse_weight, rrf_k, fusion_candidates,
                                          rerank)
        return _convert.search_result(self._call(self.query_stub.Search, request, timeout,
                                                 idempotent=True))

    def search_batch(self, collection: str, queries: Iterable[Any],
                     timeout: Optional[float] = None, **options: Any) -> List[SearchResult]:
        """Several queries of one collection in one call; `options` as for `search`."""
        request = _convert.search_batch_request(collection, queries, options)
        return _convert.search_batch_result(self._call(self.query_stub.SearchBatch, request,
                                                       timeout, idempotent=True))

    def count(self, collection: str, filter: FilterLike = None,
              timeout: Optional[float] = None) -> int:
        """The number of documents matching `filter` (as for search; None: all)."""
        return _convert.count_result(self._call(
            self.query_stub.Count, _convert.count_request(collection, filter), timeout,
            idempotent=True))

    def scroll(self, collection: str, filter: FilterLike = None, after: Optional[str] = None,
               limit: int = 100, with_attributes: AttributesLike = False,
               timeout: Optional[float] = None) -> ScrollPage:
        """One page of the documents matching `filter`, ascending by id, with ids after `after`
        (the previous page's next_after). with_attributes: True for all attributes, or a list of
        field names."""
        request = _convert.scroll_request(collection, filter, after, limit, with_attributes)
        return _convert.scroll_result(self._call(self.query_stub.Scroll, request, timeout,
                                                 idempotent=True))
