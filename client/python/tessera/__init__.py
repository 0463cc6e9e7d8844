"""Tessera: the Python clients of the Tessera multi-vector (late-interaction) retrieval server.

    import numpy as np, tessera
    client = tessera.Client("127.0.0.1:50051")
    client.create_collection("papers", dim=128, pool_factor=2)
    client.upsert("papers", [{"id": "a", "tokens": np.random.rand(40, 128).astype(np.float32)}])
    hits = client.search("papers", np.random.rand(16, 128).astype(np.float32), k=5)

`tessera.AsyncClient` has the same methods as coroutines (asyncio, `async with`);
`tessera.pylate.TesseraIndex` is a PyLate index backed by a server. `tessera.pb` holds the
generated protobuf modules (common_pb2, admin_pb2, ingest_pb2, query_pb2 and their *_pb2_grpc
services) for callers who want the raw messages.
"""

import sys as _sys

from tessera import _proto as pb
from tessera._convert import (decode_matrix, encode_document, encode_filter, encode_matrix,
                              message_to_dict)
from tessera.aio import AsyncClient
from tessera.client import Client
from tessera.types import (DocumentResult, Group, Hit, IngestSummary, RetryPolicy, ScrollPage,
                           SearchResult, TesseraError, TokenMatch)

__all__ = [
    "AsyncClient", "Client", "DocumentResult", "Group", "Hit", "IngestSummary", "RetryPolicy",
    "ScrollPage", "SearchResult", "TesseraError", "TokenMatch", "decode_matrix", "encode_document",
    "encode_filter", "encode_matrix", "message_to_dict", "pb",
]
__version__ = "0.2.0"
_sys.modules[__name__ + ".pb"] = pb  # so that `from tessera.pb import query_pb2` works
