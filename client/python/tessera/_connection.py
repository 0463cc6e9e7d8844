"""What `Client` and `AsyncClient` share besides the conversions of `tessera._convert`: the
channel and its stubs, the call metadata, the default deadline and the retry schedule of a call.
Each client adds only the transport: calls on a blocking channel (`grpc`) or on an asyncio one
(`grpc.aio`), and sleeping between retries the same way.
"""

import time
from typing import Any, Optional, Sequence, Tuple

import grpc

from tessera import _convert
from tessera._convert import PemLike
from tessera._proto.tessera.v1 import admin_pb2_grpc, ingest_pb2_grpc, query_pb2_grpc
from tessera.types import RetryPolicy, TesseraError


class Attempts:
    """The tries of one unary call: the timeout each gets, and whether a failure is retried
    (`policy`: None fails at once)."""

    def __init__(self, policy: Optional[RetryPolicy], timeout: Optional[float]):
        self._policy = policy
        self._timeout = timeout
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._retry = 0

    def timeout(self) -> Optional[float]:
        # The caller's timeout as given on the first try (gRPC fails a negative one at once);
        # what is left of it on a retry (retry_delay leaves some).
        if self._retry == 0 or self._deadline is None:
            return self._timeout
        return self._deadline - time.monotonic()

    def delay(self, error: grpc.RpcError) -> float:
        """Seconds to wait before the next try after `error`; raises it as TesseraError when it is
        not retried (see _convert.retry_delay)."""
        delay = _convert.retry_delay(self._policy, error, self._retry, self._deadline)
        if delay is None:
            raise TesseraError.from_rpc_error(error) from None
        self._retry += 1
        return delay


class Connection:
    """One channel of `channels` (the module grpc, or grpc.aio) to `address`, the stubs of the
    three public services and the health method on it; arguments as `tessera.Client`'s."""

    def __init__(self, channels: Any, address: str, api_key: Optional[str],
                 tls_root_cert: PemLike, timeout: Optional[float], tls_client_cert: PemLike,
                 tls_client_key: PemLike, tls_server_name: Optional[str],
                 options: Sequence[Tuple[str, Any]], retry: Optional[RetryPolicy]):
        self.address = address
        self.timeout = timeout
        self.retry = retry
        self.metadata = _convert.call_metadata(api_key)
        settings = _convert.channel_options(tls_server_name, options)
        credentials = _convert.channel_credentials(tls_root_cert, tls_client_cert,
                                                   tls_client_key)
        if credentials is not None:
            self.channel = channels.secure_channel(address, credentials, options=settings)
        else:
            self.channel = channels.insecure_channel(address, options=settings)
        self.admin_stub = admin_pb2_grpc.AdminServiceStub(self.channel)
        self.ingest_stub = ingest_pb2_grpc.IngestServiceStub(self.channel)
        self.query_stub = query_pb2_grpc.QueryServiceStub(self.channel)
        self._health = self.channel.unary_unary(_convert.HEALTH_METHOD)

    def _timeout(self, timeout: Optional[float]) -> Optional[float]:
        return self.timeout if timeout is None else timeout

    def _attempts(self, timeout: Optional[float], idempotent: bool) -> Attempts:
        """An idempotent call is retried as `self.retry` says, within its deadline."""
        return Attempts(self.retry if idempotent else None, self._timeout(timeout))
