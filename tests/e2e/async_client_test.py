"""tessera.AsyncClient against the real tessera-server: the sync client's lifecycle scenario
(lifecycle_test.LifecycleTest) and its document checks (python_client_test.ClientValidationTest)
run unchanged through the async client, driven from blocking test code by BlockingAsyncClient;
then what only the async client does: many calls at once on one channel, at most max_in_flight
unacknowledged batches in an ingest, and retries of idempotent calls (but never of writes) on a
key over its rate limit (RESOURCE_EXHAUSTED).

    /usr/bin/python3 tests/e2e/async_client_test.py --server build/bin/tessera-server

CTest runs it with the Python of the venv where the wheel built from client/python is installed
(TESSERA_PYTHON_INSTALLED=1), so the installed package is the one tested.
"""

import asyncio
import hashlib
import inspect
import os
import sys
import tempfile
import threading
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402
from e2e_util import grpc, tessera  # noqa: E402
import filters_test  # noqa: E402
import lifecycle_test  # noqa: E402
import python_client_test  # noqa: E402


class _LoopThread:
    """One asyncio event loop on a daemon thread, shared by every BlockingAsyncClient."""

    _loop = None
    _lock = threading.Lock()

    @classmethod
    def run(cls, coroutine):
        with cls._lock:
            if cls._loop is None:
                cls._loop = asyncio.new_event_loop()
                threading.Thread(target=cls._loop.run_forever, daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coroutine, cls._loop).result()


class BlockingAsyncClient:
    """A tessera.AsyncClient (made on the loop thread, as grpc.aio requires) whose coroutines are
    run to completion when called, so that a test written against tessera.Client drives it
    unchanged; async generators (upsert_stream) become generators."""

    def __init__(self, address, **options):
        async def make():
            return tessera.AsyncClient(address, **options)
        self._client = _LoopThread.run(make())

    def __getattr__(self, name):
        attribute = getattr(self._client, name)
        if inspect.iscoroutinefunction(attribute):
            return lambda *args, **kwargs: _LoopThread.run(attribute(*args, **kwargs))
        if inspect.isasyncgenfunction(attribute):
            def generator(*args, **kwargs):
                stream = attribute(*args, **kwargs)
                while True:
                    try:
                        yield _LoopThread.run(stream.__anext__())
                    except StopAsyncIteration:
                        return
            return generator
        return attribute

    def close(self):
        _LoopThread.run(self._client.close())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AsyncLifecycleTest(lifecycle_test.LifecycleTest):
    """lifecycle_test.LifecycleTest, every call through tessera.AsyncClient."""
    client_class = BlockingAsyncClient


class AsyncClientValidationTest(python_client_test.ClientValidationTest):
    """python_client_test.ClientValidationTest (documents that do not encode), through
    tessera.AsyncClient."""
    client_class = BlockingAsyncClient


class AsyncFiltersTest(filters_test.FiltersTest):
    """filters_test.FiltersTest (nested filters, count, scroll, delete by filter, attributes in
    hits, grouped results), every call through tessera.AsyncClient."""
    client_class = BlockingAsyncClient


class ParityTest(unittest.TestCase):
    """AsyncClient has every public method of Client, as a coroutine (upsert_stream: an async
    generator), with the same parameters and defaults; the only extras are the async ingest's
    `max_in_flight` and `on_progress`. A method added to Client alone fails here."""

    ASYNC_ONLY = {"max_in_flight", "on_progress"}

    def test_same_methods_and_parameters(self):
        methods = [name for name, value in vars(tessera.Client).items()
                   if callable(value) and not name.startswith("_") and name != "close"]
        self.assertIn("search", methods)
        for name in methods + ["__init__"]:
            with self.subTest(method=name):
                self.assertTrue(hasattr(tessera.AsyncClient, name), f"AsyncClient has no {name}")
                blocking = getattr(tessera.Client, name)
                asynchronous = getattr(tessera.AsyncClient, name)
                if name == "upsert_stream":
                    self.assertTrue(inspect.isasyncgenfunction(asynchronous))
                elif name != "__init__":
                    self.assertTrue(inspect.iscoroutinefunction(asynchronous))
                ours = inspect.signature(blocking).parameters
                theirs = inspect.signature(asynchronous).parameters
                self.assertEqual(set(theirs) - set(ours), set(theirs) & self.ASYNC_ONLY)
                for parameter in ours.values():
                    self.assertIn(parameter.name, theirs)
                    if name == "__init__" and parameter.name == "retry":
                        continue  # AsyncClient retries by default, Client does not
                    self.assertEqual(theirs[parameter.name].default, parameter.default,
                                     parameter.name)
                    self.assertEqual(theirs[parameter.name].kind, parameter.kind,
                                     parameter.name)
        self.assertIsNone(inspect.signature(tessera.Client).parameters["retry"].default)
        self.assertEqual(inspect.signature(tessera.AsyncClient).parameters["retry"].default,
                         tessera.RetryPolicy())
        self.assertEqual(tessera.AsyncClient.search.__doc__, tessera.Client.search.__doc__)


class AsyncOnlyTest(e2e_util.ServerTestCase):

    DIM = 16

    def run_async(self, coroutine):
        # One loop for the whole process: grpc.aio (1.51) polls its completion queue from the
        # first loop that used it and logs BlockingIOError on later ones.
        return _LoopThread.run(coroutine)

    def test_concurrent_calls_on_one_client_equal_sequential_ones(self):
        rng = np.random.default_rng(21)
        docs = [(f"c{i}", e2e_util.normalized(rng, 12, self.DIM)) for i in range(200)]
        queries = [e2e_util.normalized(rng, 6, self.DIM) for _ in range(24)]

        async def scenario():
            async with tessera.AsyncClient(self.server.address) as client:
                await client.create_collection("concurrent", dim=self.DIM, pool_factor=1)
                summary = await client.ingest("concurrent", docs, batch_size=16, progress=False)
                self.assertEqual((summary.documents, summary.stored), (200, 200))
                sequential = [await client.search("concurrent", q, k=5, exhaustive=True)
                              for q in queries]
                together = await asyncio.gather(*[
                    client.search("concurrent", q, k=5, exhaustive=True) for q in queries])
                gets = await asyncio.gather(*[client.get("concurrent", d[0]) for d in docs[:20]])
                # A deadline already past fails at once, retry policy or not (bad_input_test's
                # case for the blocking client).
                with self.assertRaises(tessera.TesseraError) as context:
                    await client.search("concurrent", queries[0], timeout=-1)
                self.assertEqual(context.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
                return sequential, together, gets

        sequential, together, gets = self.run_async(scenario())
        for one, other in zip(sequential, together):
            self.assertEqual(one.ids, other.ids)
            np.testing.assert_array_equal(one.scores, other.scores)
        self.assertEqual([g["id"] for g in gets], [d[0] for d in docs[:20]])
        for got, (_, tokens) in zip(gets, docs):
            np.testing.assert_allclose(got["vectors"], tokens, atol=2e-3)  # stored as fp16

    def test_ingest_keeps_at_most_max_in_flight_batches_unacknowledged(self):
        rng = np.random.default_rng(22)
        max_in_flight = 3
        ahead = []  # at each batch pulled: batches pulled so far minus batches acknowledged
        acknowledged = 0

        async def batches():
            for b in range(30):
                # The writer pulls batch b once batch b - max_in_flight - 1 is acknowledged.
                ahead.append(b - acknowledged)
                yield [(f"w{b}-{i}", e2e_util.normalized(rng, 8, self.DIM)) for i in range(4)]

        async def scenario():
            nonlocal acknowledged
            async with tessera.AsyncClient(self.server.address) as client:
                await client.create_collection("window", dim=self.DIM)
                stream = client.upsert_stream("window", batches(), max_in_flight=max_in_flight)
                async for results in stream:
                    self.assertTrue(all(r.ok for r in results), results)
                    acknowledged += 1
                return (await client.collection_info("window"))["stats"]["documents"]

        self.assertEqual(self.run_async(scenario()), 120)
        self.assertEqual(acknowledged, 30)
        self.assertLessEqual(max(ahead), max_in_flight, ahead)

        async def no_window():
            async with tessera.AsyncClient(self.server.address) as client:
                await client.upsert_stream("window", [], max_in_flight=0).__anext__()
        with self.assertRaises(ValueError):
            self.run_async(no_window())

    def test_ingest_reports_progress_and_takes_an_async_iterable(self):
        rng = np.random.default_rng(23)
        reports = []

        async def docs():
            for i in range(50):
                yield {"id": f"p{i}", "tokens": e2e_util.normalized(rng, 5, self.DIM)}

        async def scenario():
            async with tessera.AsyncClient(self.server.address) as client:
                await client.create_collection("progress", dim=self.DIM)
                return await client.ingest("progress", docs(), batch_size=20, progress=False,
                                           on_progress=lambda s, f: reports.append((s, f)))

        summary = self.run_async(scenario())
        self.assertEqual((summary.documents, summary.stored, summary.failed), (50, 50, []))
        self.assertEqual(reports, [(20, 0), (40, 0), (50, 0)])


class RetryTest(unittest.TestCase):
    """A key limited to 5 calls per second: a burst of reads fails with RESOURCE_EXHAUSTED
    without retries (the blocking client's default, or retry=None) and succeeds with a
    RetryPolicy; a write over the rate is not retried. And UNAVAILABLE while a server
    restarts."""

    KEY = "rate-limited-key"

    @classmethod
    def setUpClass(cls):
        cls.keys_dir = tempfile.mkdtemp(prefix="tessera-keys-")
        keys = os.path.join(cls.keys_dir, "api_keys")
        with open(keys, "w") as f:
            f.write(f"sha256:{hashlib.sha256(cls.KEY.encode()).hexdigest()} admin name=limited "
                    "rate=5\n")
        cls.server = e2e_util.Server("--api_keys", keys, client_options={"api_key": cls.KEY},
                                     wait_healthy=False)
        cls.addClassCleanup(cls.server.cleanup)
        cls.server.start()

    def burst(self, retry, calls=30):
        """Codes of `calls` list_collections calls made one after the other."""
        async def scenario():
            codes = []
            async with tessera.AsyncClient(self.server.address, api_key=self.KEY,
                                           retry=retry) as client:
                for _ in range(calls):
                    try:
                        await client.list_collections(timeout=30)
                        codes.append("OK")
                    except tessera.TesseraError as error:
                        codes.append(error.code.name)
                        self.assertIn("over its rate limit of 5 calls per second", error.message)
            return codes
        return _LoopThread.run(scenario())

    def test_reads_are_retried_and_writes_are_not(self):
        self.assertIn("RESOURCE_EXHAUSTED", self.burst(retry=None))
        policy = tessera.RetryPolicy(attempts=30, initial_backoff=0.05, max_backoff=0.4)
        self.assertEqual(self.burst(retry=policy), ["OK"] * 30)
        with self.server.client() as blocking:  # no retries by default
            codes = set()
            for _ in range(30):
                try:
                    blocking.list_collections()
                    codes.add("OK")
                except tessera.TesseraError as error:
                    codes.add(error.code.name)
            self.assertIn("RESOURCE_EXHAUSTED", codes)

        async def writes():
            codes = []
            async with tessera.AsyncClient(self.server.address, api_key=self.KEY,
                                           retry=policy) as client:
                for i in range(30):
                    try:
                        await client.create_collection(f"w{i}", dim=4)
                        codes.append("OK")
                    except tessera.TesseraError as error:
                        codes.append(error.code.name)
            return codes
        codes = _LoopThread.run(writes())
        self.assertIn("RESOURCE_EXHAUSTED", codes)  # not retried: the burst outruns the bucket

    def test_count_and_scroll_are_retried_and_delete_by_filter_is_not(self):
        policy = tessera.RetryPolicy(attempts=30, initial_backoff=0.05, max_backoff=0.4)

        async def scenario():
            async with tessera.AsyncClient(self.server.address, api_key=self.KEY,
                                           retry=policy) as client:
                for _ in range(40):  # a write is not retried: wait for the bucket to refill
                    try:
                        await client.create_collection("rc", dim=4, attributes={"n": "int64"})
                        break
                    except tessera.TesseraError as error:
                        self.assertEqual(error.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
                        await asyncio.sleep(0.25)
                reads = [await client.count("rc", [("n", "exists")])
                         for _ in range(15)]
                reads += [len((await client.scroll("rc")).documents)
                          for _ in range(15)]
                codes = []
                for _ in range(30):
                    try:
                        codes.append(await client.delete("rc", filter=[("n", "==", 1)]))
                    except tessera.TesseraError as error:
                        codes.append(error.code.name)
                return reads, codes
        reads, codes = _LoopThread.run(scenario())
        self.assertEqual(reads, [0] * 30)  # every read retried until it got through
        self.assertIn("RESOURCE_EXHAUSTED", codes)  # not retried: the burst outruns the bucket

    def test_reads_wait_out_a_restart_and_writes_do_not(self):
        """UNAVAILABLE: the server stops and comes back on the same port. A read with the retry
        policy waits it out; without one, or for a write, the call fails at once."""
        port = e2e_util.free_port()
        server = e2e_util.Server("--listen", f"127.0.0.1:{port}")  # the last --listen wins
        self.addCleanup(server.cleanup)
        server.start()
        policy = tessera.RetryPolicy(attempts=1000, initial_backoff=0.05, max_backoff=0.2)

        async def scenario():
            async with tessera.AsyncClient(server.address, retry=policy) as client, \
                    tessera.AsyncClient(server.address, retry=None) as impatient:
                await client.create_collection("kept", dim=4)
                self.assertEqual(server.stop(), 0)
                for call in (impatient.list_collections(timeout=30),
                             client.create_collection("new", dim=4, timeout=30)):
                    with self.assertRaises(tessera.TesseraError) as context:
                        await call
                    self.assertEqual(context.exception.code, grpc.StatusCode.UNAVAILABLE)
                restart = threading.Timer(0.5, server.start)
                restart.start()
                try:
                    return await client.list_collections(timeout=60)
                finally:
                    restart.join()

        self.assertEqual(_LoopThread.run(scenario()), ["kept"])
        self.assertEqual(server.address, f"127.0.0.1:{port}")

    def test_policy_arguments_are_checked(self):
        with self.assertRaises(ValueError):
            tessera.RetryPolicy(attempts=0)
        with self.assertRaises(ValueError):
            tessera.RetryPolicy(multiplier=0.5)
        policy = tessera.RetryPolicy(attempts=3, initial_backoff=0.1, max_backoff=0.15)
        self.assertIsNone(policy.delay(2))
        for retry in range(2):
            self.assertLessEqual(policy.delay(retry), min(0.15, 0.1 * 2 ** retry))
        self.assertTrue(policy.retries(grpc.StatusCode.UNAVAILABLE))
        self.assertFalse(policy.retries(grpc.StatusCode.INVALID_ARGUMENT))


if __name__ == "__main__":
    e2e_util.main()
