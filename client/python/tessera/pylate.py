"""A PyLate index stored in a Tessera collection: `TesseraIndex` implements PyLate's index
interface (`pylate.indexes.base.Base`: add_documents, remove_documents, __call__,
get_documents_embeddings), so `pylate.retrieve.ColBERT(index=TesseraIndex(...))` retrieves from a
running tessera-server. Like PyLate's PLAID it is an end-to-end index: `__call__` returns each
query's top-k documents scored by MaxSim on the server.

    from pylate import retrieve
    from tessera.pylate import TesseraIndex

    index = TesseraIndex(address="127.0.0.1:50051", collection="scifact", override=True)
    index.add_documents(documents_ids=ids, documents_embeddings=documents_embeddings)
    retriever = retrieve.ColBERT(index=index)
    results = retriever.retrieve(queries_embeddings=queries_embeddings, k=10)

Embeddings may be numpy arrays or torch tensors (n_tokens × dim each, or one batch × n_tokens ×
dim array); torch is not imported here. Document ids are strings on the server (other ids, such
as PLAID examples' ints, are stored as str(id) and come back as strings).

Without pylate installed the class still works on its own; with it, it subclasses PyLate's Base.
"""

from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import grpc
import numpy as np

from tessera.client import Client
from tessera.types import TesseraError

_IndexBase: Any = object
try:
    from pylate.indexes.base import Base as _PyLateBase
    _IndexBase = _PyLateBase
except ImportError:  # pylate (or its dependencies) not installed: a plain class
    pass

__all__ = ["TesseraIndex"]

# The server's default --max_searches_per_batch is 64.
_SEARCH_BATCH = 32


def _as_array(embedding: Any) -> np.ndarray:
    """A numpy array, a torch tensor (on any device, bfloat16 included) or nested lists → a
    float numpy array."""
    if hasattr(embedding, "detach"):  # a torch tensor
        embedding = embedding.detach()
        if str(embedding.dtype) == "torch.bfloat16":
            embedding = embedding.float()
        embedding = embedding.cpu().numpy()
    array = np.asarray(embedding)
    if array.dtype.kind not in "iuf":
        raise TypeError(f"embeddings of dtype {array.dtype}; expected floats")
    return array


def _as_matrices(embeddings: Any, what: str) -> List[np.ndarray]:
    """One n_tokens × dim matrix per item: `embeddings` is a list of 2-D arrays or tensors, or
    one 3-D array or tensor (batch × n_tokens × dim), or one 2-D matrix (a single item)."""
    if isinstance(embeddings, (list, tuple)):
        matrices = [_as_array(e) for e in embeddings]
    else:
        array = _as_array(embeddings)
        if array.ndim == 2:
            matrices = [array]
        elif array.ndim == 3:
            matrices = list(array)
        else:
            raise ValueError(f"{what} of shape {array.shape}; expected n_tokens × dim or "
                             "batch × n_tokens × dim")
    for i, matrix in enumerate(matrices):
        if matrix.ndim != 2:
            raise ValueError(f"{what} {i} has shape {matrix.shape}; expected n_tokens × dim")
    return matrices


class TesseraIndex(_IndexBase):
    """A PyLate index in the collection `collection` of the server at `address`.

    The collection is created on the first `add_documents` (its dim taken from the embeddings)
    unless it exists; `override=True` drops an existing one first. `collection_options` go to
    `Client.create_collection` (default: pool_factor=1, every token kept as PyLate's own indexes
    keep them; pool_factor=2 is Tessera's hierarchical pooling, half the vectors). Searches use
    `search_options` (`Client.search`'s keywords: num_candidates, exhaustive, nprobe, filter,
    ...). `client` reuses a `tessera.Client`; otherwise one is made from `address` and
    `client_options` (api_key, tls_root_cert, timeout, ...).
    """

    is_end_to_end_index = True

    def __init__(self, address: str = "127.0.0.1:50051", collection: str = "colbert",
                 override: bool = False, client: Optional[Client] = None,
                 collection_options: Optional[Mapping[str, Any]] = None,
                 search_options: Optional[Mapping[str, Any]] = None,
                 batch_size: int = 64, show_progress: bool = False,
                 **client_options: Any) -> None:
        self._own_client = client is None
        self.client = client if client is not None else Client(address, **client_options)
        self.collection = collection
        self.collection_options: Dict[str, Any] = {"pool_factor": 1,
                                                   **(collection_options or {})}
        self.search_options: Dict[str, Any] = dict(search_options or {})
        self.batch_size = batch_size
        self.show_progress = show_progress
        exists = collection in self.client.list_collections()
        if exists and override:
            self.client.drop_collection(collection)
            exists = False
        self._created = exists

    # PyLate's index interface ------------------------------------------------------------------

    def add_documents(self, documents_ids: Union[str, Sequence[Any]],
                      documents_embeddings: Any, batch_size: Optional[int] = None,
                      **kwargs: Any) -> "TesseraIndex":
        """Upserts the documents (a document whose id is stored already is replaced). Raises
        TesseraError naming the first document the server refused."""
        ids = [documents_ids] if isinstance(documents_ids, str) else list(documents_ids)
        matrices = _as_matrices(documents_embeddings, "documents_embeddings")
        if len(ids) != len(matrices):
            raise ValueError(f"{len(ids)} documents_ids and {len(matrices)} "
                             "documents_embeddings; expected one embedding matrix per id")
        if not ids:
            return self
        self._create(matrices[0].shape[1])
        summary = self.client.ingest(self.collection,
                                     [(str(i), m) for i, m in zip(ids, matrices)],
                                     batch_size=batch_size or self.batch_size,
                                     progress=self.show_progress)
        if summary.failed:
            first = summary.failed[0]
            raise TesseraError(first.status, f"{len(summary.failed)} of {summary.documents} "
                               f"documents refused; document '{first.id}': {first.message}")
        return self

    def update_documents(self, documents_ids: Union[str, Sequence[Any]],
                         documents_embeddings: Any) -> "TesseraIndex":
        """As PLAID's: replaces the documents' embeddings (an upsert, as add_documents)."""
        return self.add_documents(documents_ids, documents_embeddings)

    def remove_documents(self, documents_ids: Union[str, Sequence[Any]]) -> "TesseraIndex":
        """Deletes the documents; ids that are not stored are ignored."""
        ids = [documents_ids] if isinstance(documents_ids, str) else list(documents_ids)
        if ids and self._created:
            self.client.delete(self.collection, [str(i) for i in ids])
        return self

    def __call__(self, queries_embeddings: Any, k: int = 10,
                 subset: Optional[Sequence[Any]] = None) -> List[List[Dict[str, Any]]]:
        """Per query, its top-k documents as PyLate's RerankResult dicts {"id", "score"}, best
        first. `subset` (PLAID's document-id restriction) is not supported: restrict searches
        with attribute filters instead (search_options={"filter": [...]})."""
        if subset is not None:
            raise ValueError("TesseraIndex does not take 'subset' (a list of document ids); "
                             "restrict searches with search_options={'filter': [(field, op, "
                             "value)]} on the collection's attributes")
        if not self._created:
            raise ValueError(f"the index is empty (collection '{self.collection}' has not been "
                             "created); add documents before querying")
        queries = _as_matrices(queries_embeddings, "queries_embeddings")
        options = {**self.search_options, "k": k}
        results: List[List[Dict[str, Any]]] = []
        for start in range(0, len(queries), _SEARCH_BATCH):
            for hits in self.client.search_batch(self.collection,
                                                 queries[start:start + _SEARCH_BATCH],
                                                 **options):
                results.append([{"id": hit.id, "score": hit.score} for hit in hits])
        return results

    def get_documents_embeddings(
            self, documents_ids: Sequence[Sequence[Any]]) -> List[List[np.ndarray]]:
        """The stored vectors (float32 n_vectors × dim) of each document, grouped as the ids
        are: with the default pool_factor=1 the documents' tokens (as stored: fp16 by default);
        with pooling, the pooled vectors that searches score. NOT_FOUND for an unknown id."""
        return [[self.client.get(self.collection, str(doc_id))["vectors"] for doc_id in group]
                for group in documents_ids]

    # ------------------------------------------------------------------------------------------

    def _create(self, dim: int) -> None:
        if self._created:
            return
        try:
            self.client.create_collection(self.collection, dim=dim, **self.collection_options)
        except TesseraError as error:
            if error.code != grpc.StatusCode.ALREADY_EXISTS:  # made meanwhile by another writer
                raise
        self._created = True

    def close(self) -> None:
        """Closes the client the index made (not one it was given)."""
        if self._own_client:
            self.client.close()

    def __enter__(self) -> "TesseraIndex":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
