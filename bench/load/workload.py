"""The client side of scripts/load: synthetic documents and queries, and the worker processes that
ingest, drive mixed traffic and verify writes against a running tessera-server.

Workers are separate processes (multiprocessing, spawn) so that client-side Python is not capped
by one GIL; each runs a command loop (`worker_main`) and, within a command, one thread per stream,
each stream with its own gRPC channel. Commands are plain dicts; answers are dicts of numpy arrays
and lists (cheap to pickle).

Data: dim-D unit vectors around TOPICS random topic directions. Base document i (id "d<i>") has
24-40 tokens (mean 32), each a topic of the document's 4 plus Gaussian noise of norm 0.6,
renormalised; it is regenerated from (seed, i, variant) wherever needed, so no process holds the
corpus. A query is 32 tokens near random tokens of a random base document (noise 0.3).

Write ownership: ids are split into `buckets` by index; at concurrency C, stream s alone writes
base ids whose bucket b has b % C == s, and new ids are named after (run tag, stream, counter). So
the order of acknowledged writes of any id is the order in which one stream issued them, which is
what lets the verifier know the expected final state of every id.
"""

import os
import resource
import threading
import time
import traceback

import numpy as np

TOPICS = 1024
TOPICS_PER_DOCUMENT = 4
MIN_TOKENS, MAX_TOKENS = 24, 40
TOKEN_NOISE = 0.6
QUERY_NOISE = 0.3

KIND_SEARCH, KIND_UPSERT, KIND_DELETE = 0, 1, 2
KIND_NAMES = ("search", "upsert", "delete")
# Ledger events: (id, version, certain); version DELETED = acknowledged delete.
DELETED = -1


def _normalized(values):
    return values / np.linalg.norm(values, axis=-1, keepdims=True)


class Corpus:
    """Deterministic synthetic documents and queries for one (seed, dim)."""

    def __init__(self, seed, dim):
        self.seed = seed
        self.dim = dim
        rng = np.random.default_rng([seed, 0xC0FFEE])
        self.topics = _normalized(rng.standard_normal((TOPICS, dim))).astype(np.float32)

    def document(self, index, variant=0):
        """Base document `index` (variant 0) or its overwrite number `variant`: float16
        n_tokens × dim, unit rows."""
        rng = np.random.default_rng([self.seed, index, variant])
        n = int(rng.integers(MIN_TOKENS, MAX_TOKENS + 1))
        topics = rng.choice(TOPICS, TOPICS_PER_DOCUMENT, replace=False)
        picks = topics[rng.integers(0, TOPICS_PER_DOCUMENT, n)]
        noise = _normalized(rng.standard_normal((n, self.dim)).astype(np.float32))
        return _normalized(self.topics[picks] + TOKEN_NOISE * noise).astype(np.float16)

    def query(self, rng, num_docs, query_tokens):
        """A float32 query_tokens × dim query near a random base document."""
        tokens = self.document(int(rng.integers(0, num_docs))).astype(np.float32)
        picks = rng.integers(0, tokens.shape[0], query_tokens)
        noise = _normalized(rng.standard_normal((query_tokens, self.dim)).astype(np.float32))
        return _normalized(tokens[picks] + QUERY_NOISE * noise).astype(np.float32)


def base_id(index):
    return f"d{index}"


def owned_indexes(stream, concurrency, buckets, num_docs):
    """The base-document indexes stream `stream` of `concurrency` may write (see the module
    docstring), as a numpy array; empty when the stream owns no bucket."""
    owned = [b for b in range(buckets) if b % concurrency == stream]
    if not owned:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(b, num_docs, buckets, dtype=np.int64) for b in owned])


def _cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------------------------------
# Worker process

def worker_main(index, config, commands, results, progress):
    """The loop of one worker process: takes commands from `commands` until None and puts
    (index, answer) on `results`. `progress` is a shared counter of documents ingested."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    import sys
    sys.path[:0] = [p for p in config["sys_path"] if p not in sys.path]
    import tessera  # noqa: F401  (after the path is set)
    worker = _Worker(index, config, progress)
    results.put((index, {"ready": True, "pid": os.getpid()}))
    while True:
        command = commands.get()
        if command is None:
            return
        try:
            answer = getattr(worker, command["kind"])(command)
        except Exception:  # reported to the parent, which fails the run
            answer = {"exception": traceback.format_exc()}
        results.put((index, answer))


class _Worker:
    def __init__(self, index, config, progress):
        self.index = index
        self.config = config
        self.progress = progress
        self.corpus = Corpus(config["seed"], config["dim"])

    def _client(self):
        import tessera
        return tessera.Client(self.config["address"])

    # Ingest ------------------------------------------------------------------------------------

    def ingest(self, command):
        """Upserts base documents command["first"], +step, … < num_docs over one stream in
        batches; answers the acknowledged (index, version) pairs and the unacknowledged ones."""
        import tessera
        collection, batch_size = self.config["collection"], command["batch_size"]
        indexes = list(range(command["first"], command["num_docs"], command["step"]))
        sent = []
        acked_index, acked_version, rejected = [], [], {}
        failure = None

        def batches():
            for start in range(0, len(indexes), batch_size):
                chunk = indexes[start:start + batch_size]
                sent.extend(chunk)
                yield [(base_id(i), self.corpus.document(i)) for i in chunk]

        started = time.monotonic()
        with self._client() as client:
            done = 0
            try:
                for results in client.upsert_stream(collection, batches(), dtype="fp16",
                                                    timeout=command["timeout"]):
                    for result in results:
                        i = int(result.id[1:])
                        if result.ok:
                            acked_index.append(i)
                            acked_version.append(result.version)
                        else:
                            rejected[result.status.name] = rejected.get(result.status.name, 0) + 1
                    done += len(results)
                    with self.progress.get_lock():
                        self.progress.value += len(results)
            except tessera.TesseraError as error:
                failure = error.code.name
        acked = set(acked_index)
        return {
            "acked_index": np.array(acked_index, dtype=np.int64),
            "acked_version": np.array(acked_version, dtype=np.int64),
            "uncertain_index": np.array([i for i in sent if i not in acked], dtype=np.int64),
            "rejected": rejected,
            "failure": failure,
            "seconds": time.monotonic() - started,
        }

    # Mixed traffic -----------------------------------------------------------------------------

    def traffic(self, command):
        """Runs command["streams"] (global stream numbers) from wall time command["start"] for
        command["seconds"]; answers per-op arrays (relative completion time, latency, kind,
        status code number) and the ledger of writes."""
        streams = command["streams"]
        outputs = [None] * len(streams)
        clients = [self._client() for _ in streams]
        for client in clients:  # connect before the clock starts
            client.health(timeout=10.0)
        cpu_before = _cpu_seconds()
        threads = [threading.Thread(target=self._stream, args=(command, s, clients[k], outputs, k))
                   for k, s in enumerate(streams)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        cpu = _cpu_seconds() - cpu_before
        for client in clients:
            client.close()
        answer = {"cpu_seconds": cpu, "wall_seconds": time.time() - command["start"]}
        for key in ("t_done", "latency_ms", "kind", "code"):
            answer[key] = np.concatenate([o[key] for o in outputs])
        answer["ledger"] = [event for o in outputs for event in o["ledger"]]
        answer["examples"] = {}
        for o in outputs:
            for key, messages in o["examples"].items():
                merged = answer["examples"].setdefault(key, [])
                merged.extend(m for m in messages if m not in merged and len(merged) < 2)
        exceptions = [o["exception"] for o in outputs if o.get("exception")]
        if exceptions:
            answer["exception"] = exceptions[0]
        return answer

    def _stream(self, command, stream, client, outputs, slot):
        import grpc
        import tessera
        collection = self.config["collection"]
        num_docs, concurrency = command["num_docs"], command["concurrency"]
        deadline, tag = command["deadline"], command["tag"]
        p_search, p_upsert = command["mix"][0], command["mix"][0] + command["mix"][1]
        rng = np.random.default_rng([self.config["seed"], 7, command["run"], stream])
        owned = owned_indexes(stream, concurrency, command["buckets"], num_docs)
        start, end = command["start"], command["start"] + command["seconds"]
        t_done, latency, kinds, codes, ledger = [], [], [], [], []
        examples = {}  # (kind name, code number) → up to 2 distinct error messages
        new_ids = 0
        exception = None
        delay = start - time.time()
        if delay > 0:
            time.sleep(delay)
        try:
            while time.time() < end:
                draw = rng.random()
                kind = KIND_SEARCH if draw < p_search else (
                    KIND_UPSERT if draw < p_upsert else KIND_DELETE)
                if kind != KIND_SEARCH and len(owned) == 0:
                    kind = KIND_SEARCH
                event = None
                code, message = 0, ""
                if kind == KIND_SEARCH:
                    query = self.corpus.query(rng, num_docs, command["query_tokens"])
                    began = time.perf_counter()
                    try:
                        client.search(collection, query, k=command["k"], timeout=deadline)
                    except tessera.TesseraError as error:
                        code, message = error.code.value[0], error.message
                elif kind == KIND_UPSERT:
                    if rng.random() < 0.5:  # a new id
                        doc_id = f"n{tag}-{stream}-{new_ids}"
                        new_ids += 1
                        tokens = self.corpus.document(num_docs + stream, 1_000_000 + new_ids)
                    else:  # an overwrite of an owned base document
                        i = int(owned[rng.integers(0, len(owned))])
                        doc_id = base_id(i)
                        tokens = self.corpus.document(i, int(rng.integers(1, 1 << 30)))
                    began = time.perf_counter()
                    try:
                        results = client.upsert(collection, [(doc_id, tokens)], dtype="fp16",
                                                timeout=deadline)
                        result = results[0]
                        if result.ok:
                            event = (doc_id, int(result.version), True)
                        else:
                            code, message = result.code, result.message
                    except tessera.TesseraError as error:
                        code, message = error.code.value[0], error.message
                    if event is None:
                        event = (doc_id, 0, False)
                else:
                    doc_id = base_id(int(owned[rng.integers(0, len(owned))]))
                    began = time.perf_counter()
                    try:
                        client.delete(collection, [doc_id], timeout=deadline)
                        event = (doc_id, DELETED, True)
                    except tessera.TesseraError as error:
                        code, message = error.code.value[0], error.message
                        event = (doc_id, DELETED, False)
                finished = time.perf_counter()
                t_done.append(time.time() - start)
                latency.append((finished - began) * 1000.0)
                kinds.append(kind)
                codes.append(code if 0 <= code <= 16 else grpc.StatusCode.UNKNOWN.value[0])
                if event is not None:
                    ledger.append(event)
                if code:
                    seen = examples.setdefault((KIND_NAMES[kind], codes[-1]), [])
                    if len(seen) < 2 and message[:200] not in seen:
                        seen.append(message[:200])
        except Exception:
            exception = traceback.format_exc()
        outputs[slot] = {
            "t_done": np.array(t_done, dtype=np.float64),
            "latency_ms": np.array(latency, dtype=np.float32),
            "kind": np.array(kinds, dtype=np.int8),
            "code": np.array(codes, dtype=np.int8),
            "ledger": ledger,
            "examples": examples,
            "exception": exception,
        }

    # Verification ------------------------------------------------------------------------------

    def verify(self, command):
        """Gets every id of command["ids"] and compares its version with command["expected"]
        (DELETED = must be absent). Answers the mismatches and the ids that could not be read."""
        import grpc
        import tessera
        ids, expected = command["ids"], command["expected"]
        mismatches, unreadable = [], []
        lock = threading.Lock()
        threads = command["threads"]

        def check(part):
            with self._client() as client:
                for k in range(part, len(ids), threads):
                    got = None
                    for attempt in range(4):
                        try:
                            got = client.get(self.config["collection"], ids[k],
                                             timeout=30.0)["version"]
                            break
                        except tessera.TesseraError as error:
                            if error.code == grpc.StatusCode.NOT_FOUND:
                                got = DELETED
                                break
                            if attempt == 3:
                                with lock:
                                    unreadable.append((ids[k], error.code.name))
                            time.sleep(0.5)
                    if got is not None and got != expected[k]:
                        with lock:
                            mismatches.append((ids[k], int(expected[k]), int(got)))

        workers = [threading.Thread(target=check, args=(p,)) for p in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return {"mismatches": mismatches, "unreadable": unreadable, "checked": len(ids)}
