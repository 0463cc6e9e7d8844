"""scripts/bench-cluster: what the router costs and how it fails over (see `scripts/bench-cluster
--help`).

Phases, all processes on loopback on this machine: etcd + 3 shard nodes + 1 router, and one
standalone server → the same collection on both (3 shards; 2 replicas on the router) and the same
--docs documents, timed → Q queries one at a time, router and standalone interleaved (ABAB),
then --check queries, exhaustive and with default options, whose hits must be identical → failover: a steady
search load on the router while one shard node is SIGKILLed, then, with allow_partial_results,
while a second one is → JSON and a table.

Definitions used in the report:
  ingest docs/s     documents acknowledged per wall second over --ingest-streams Upsert streams
                    (client-side, encoding included). Through the router each write is stored on
                    2 replicas.
  p50/p95/p99/mean  client-side latency (ms) of one Search; qps = queries / summed latency (one
                    call in flight at a time, so it is 1000 / mean).
  fanout_ms         the router's own time from sending the per-shard searches to the last answer
                    (SearchResponse.timings.fanout_ms); total_ms the router's whole handler time.
  overhead_p50_ms   router p50 − standalone p50 (the same queries, interleaved).
  failover          calls are bucketed by the second (relative to the SIGKILL) in which they
                    finished; max_latency_ms_after_kill is the longest call in flight at any time
                    in the first second after the kill; seconds_until_down the time from the kill
                    until the router's GetCollection reports every replica of that node "down".
"""

import argparse
import json
import os
import signal
import sys
import threading
import time

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(REPO_ROOT, "tests", "e2e"), os.path.join(REPO_ROOT, "bench", "load")]

import e2e_util  # noqa: E402  (Server, Etcd: real processes on loopback)
import server_process  # noqa: E402  (machine_facts, binary_facts)
from e2e_util import tessera  # noqa: E402

COLLECTION = "bench"
SHARDS = 3
REPLICAS = 2
NODES = 3

EPILOG = """\
workload: --docs documents of --doc-tokens (32) random unit vectors of dim --dim (128), sent as
fp16 to a collection with pool factor 2 (the server's other defaults); queries: --query-tokens
(32) tokens near random tokens of a random stored document, k 10, default search options, every
call with a --deadline (5 s) deadline.

exit status: 1 when the router's hits (exhaustive or default options) differ from the
standalone server's, when a failover call failed with anything but UNAVAILABLE/DEADLINE_EXCEEDED,
or when a process failed to start or stop; 2 on bad arguments. Failed calls during failover are reported, not fatal.
"""


def _default_server():
    if os.environ.get("TESSERA_SERVER"):
        return os.environ["TESSERA_SERVER"]
    return os.path.join(REPO_ROOT, "build", "bin", "tessera-server")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="scripts/bench-cluster", description="Router overhead and failover of a 3-node "
        "Tessera cluster on loopback, against a standalone server with the same data.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, metavar="FILE", help="where to write results")
    parser.add_argument("--docs", type=int, default=20_000, help="documents (default 20,000)")
    parser.add_argument("--queries", type=int, default=200,
                        help="timed queries per server (default 200)")
    parser.add_argument("--check", type=int, default=20,
                        help="queries whose hits, exhaustive and with default options, must "
                             "match (default 20)")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="failover load after each SIGKILL, s (default 20)")
    parser.add_argument("--before-kill", type=float, default=3.0,
                        help="failover load before each SIGKILL, s (default 3)")
    parser.add_argument("--clients", type=int, default=2,
                        help="client threads of the failover load (default 2)")
    parser.add_argument("--deadline", type=float, default=5.0, help="per call, s (default 5)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--doc-tokens", type=int, default=32)
    parser.add_argument("--query-tokens", type=int, default=32)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--ingest-streams", type=int, default=2,
                        help="parallel Upsert streams (threads) per server (default 2)")
    parser.add_argument("--ingest-batch", type=int, default=64, help="documents per message")
    parser.add_argument("--threads", type=int, default=2,
                        help="--threads of every tessera-server (default 2)")
    parser.add_argument("--shard-threads", type=int, default=None,
                        help="--threads of the shard nodes instead (default: --threads); with "
                             "all nodes on one machine, 1 gives the three of them about the "
                             "cores the standalone server has")
    parser.add_argument("--server", default=None,
                        help="tessera-server binary (default $TESSERA_SERVER, else "
                        "build/bin/tessera-server)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    args.server = args.server or _default_server()
    if not os.access(args.server, os.X_OK):
        parser.error(f"tessera-server binary not found ({args.server!r}); pass --server")
    if not e2e_util.Etcd.available():
        parser.error(f"{e2e_util.Etcd.BINARY} not found (Debian's etcd-server)")
    if min(args.docs, args.queries, args.clients, args.ingest_streams, args.ingest_batch) < 1 \
            or args.seconds <= 0 or args.check < 0:
        parser.error("--docs, --queries, --clients, --ingest-* and --seconds must be positive")
    return args


# Data ------------------------------------------------------------------------------------------

def document_tokens(args, index):
    """The tokens of document `index` (the same on every call: seeded by the index)."""
    rng = np.random.default_rng([args.seed, index])
    return e2e_util.normalized(rng, args.doc_tokens, args.dim)


def doc_id(index):
    return f"doc-{index:06d}"


def make_queries(args, count, salt):
    rng = np.random.default_rng([args.seed, 1 << 40, salt])
    return [e2e_util.query_near(rng, document_tokens(args, int(rng.integers(args.docs))),
                                args.query_tokens) for _ in range(count)]


# Statistics ------------------------------------------------------------------------------------

def summary(latencies_ms, sequential=True):
    """Percentiles of latencies (ms); with `sequential` (one call in flight at a time) also qps."""
    values = np.asarray(latencies_ms, dtype=np.float64)
    if values.size == 0:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None, "mean_ms": None, "qps": None}
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    out = {"p50_ms": round(float(p50), 3), "p95_ms": round(float(p95), 3),
           "p99_ms": round(float(p99), 3), "mean_ms": round(float(values.mean()), 3),
           "max_ms": round(float(values.max()), 3)}
    if sequential:
        out["qps"] = round(1000.0 * values.size / float(values.sum()), 1)
    return out


def cpu_seconds(pid):
    """utime + stime of a process so far (its threads included)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class Bench:
    def __init__(self, args):
        self.args = args
        self.problems = []  # fatal findings, printed loudly at the end
        self.etcd = None
        self.nodes = []
        self.router = None
        self.standalone = None

    def log(self, text):
        print(text, flush=True)

    def fail(self, text):
        self.problems.append(text)
        print(f"\n!!!!! {text}\n", flush=True)

    # Processes ---------------------------------------------------------------------------------

    def start(self):
        args = self.args
        e2e_util.SERVER_BINARY = args.server
        self.etcd = e2e_util.Etcd().start()
        for i in range(NODES):
            node = e2e_util.Server("--role", "shard", "--node_id", f"shard-{i}", "--etcd",
                                   self.etcd.endpoint,
                                   threads=args.shard_threads or args.threads)
            self.nodes.append(node)
            node.start()
        deadline = time.monotonic() + 30
        while len(self.etcd.keys("/tessera/nodes/")) < NODES:
            if time.monotonic() > deadline:
                raise RuntimeError(f"shard nodes not registered: {self.etcd.keys('/tessera/')}")
            time.sleep(0.1)
        self.router = e2e_util.Server("--role", "router", "--etcd", self.etcd.endpoint,
                                      threads=args.threads)
        self.router.start()
        self.standalone = e2e_util.Server(threads=args.threads)
        self.standalone.start()
        self.log(f"started etcd {self.etcd.endpoint}, shard nodes "
                 f"{', '.join(n.address for n in self.nodes)}, router {self.router.address}, "
                 f"standalone {self.standalone.address} (--threads {args.threads}, shard nodes "
                 f"{args.shard_threads or args.threads})")

    def processes(self):
        named = {"router": self.router, "standalone": self.standalone}
        named.update({f"shard-{i}": node for i, node in enumerate(self.nodes)})
        return named

    def cpu_snapshot(self):
        out = {name: cpu_seconds(server.process.pid)
               for name, server in self.processes().items() if server.process is not None}
        if self.etcd and self.etcd.process is not None:
            out["etcd"] = cpu_seconds(self.etcd.process.pid)
        out["bench_client"] = cpu_seconds(os.getpid())
        return out

    def stop(self):
        codes = {}
        for name, server in self.processes().items():
            if server is None:
                continue
            if server.process is not None:
                code = server.stop()
                codes[name] = code
                if code != 0:
                    self.fail(f"{name} exited with {code} on SIGTERM:\n{server.log()[-3000:]}")
            server.cleanup()
        if self.etcd:
            self.etcd.cleanup()
        return codes

    # Phase 1: ingest ---------------------------------------------------------------------------

    def ingest(self, server, name, replicas):
        args = self.args
        with server.client() as client:
            created = client.create_collection(COLLECTION, args.dim, pool_factor=2,
                                               num_shards=SHARDS, replicas=replicas,
                                               timeout=30.0)
        failed = []
        errors = []

        def stream(first):
            batches = []
            for start in range(first * args.ingest_batch, args.docs,
                               args.ingest_streams * args.ingest_batch):
                batches.append(range(start, min(start + args.ingest_batch, args.docs)))

            def documents(batch):
                return [{"id": doc_id(i), "tokens": document_tokens(args, i).astype(np.float16)}
                        for i in batch]
            try:
                with server.client() as client:
                    for results in client.upsert_stream(COLLECTION,
                                                        (documents(b) for b in batches),
                                                        timeout=600.0):
                        failed.extend(r for r in results if not r.ok)
            except Exception as error:  # noqa: BLE001  (reported by the caller)
                errors.append(repr(error))

        started = time.monotonic()
        threads = [threading.Thread(target=stream, args=(i,))
                   for i in range(args.ingest_streams)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.monotonic() - started
        if errors or failed:
            raise RuntimeError(f"ingest into {name} failed: {errors[:3]} "
                               f"{[str(r) for r in failed[:3]]}")
        with server.client() as client:
            stats = client.collection_info(COLLECTION, timeout=30.0)["stats"]
        if int(stats.get("documents", 0)) != args.docs:
            raise RuntimeError(f"{name} holds {stats.get('documents')} documents after "
                               f"ingesting {args.docs}")
        rate = args.docs / seconds
        self.log(f"ingest {name}: {args.docs:,} documents in {seconds:.1f} s = {rate:,.0f} docs/s "
                 f"({stats.get('rerank_vectors', 0):,} rerank vectors, "
                 f"{stats.get('candidate_indexes')})")
        return {"seconds": round(seconds, 2), "docs_per_s": round(rate, 1),
                "pool_factor": created.get("hierarchical", {}).get("pool_factor"),
                "rerank_vectors": stats.get("rerank_vectors"),
                "candidate_indexes": stats.get("candidate_indexes")}

    def settle(self, server, name, timeout=300.0):
        """Until no shard trains a centroid index (three polls in a row: through a router the
        polls rotate over the replicas)."""
        started = time.monotonic()
        quiet = 0
        with server.client() as client:
            while quiet < 3:
                stats = client.collection_info(COLLECTION, timeout=30.0)["stats"]
                quiet = quiet + 1 if not stats.get("training_shards") else 0
                if time.monotonic() - started > timeout:
                    raise RuntimeError(f"{name} still training after {timeout:.0f} s")
                time.sleep(0.2 if quiet else 2.0)
        return round(time.monotonic() - started, 1)

    # Phase 2: router overhead ------------------------------------------------------------------

    def overhead(self):
        args = self.args
        queries = make_queries(args, args.queries, 0)
        warmup = make_queries(args, 10, 1)
        results = {"router": [], "standalone": []}
        timings = []
        scored = {"router": [], "standalone": []}
        with self.router.client() as router, self.standalone.client() as standalone:
            clients = {"router": router, "standalone": standalone}
            for query in warmup:
                for client in clients.values():
                    client.search(COLLECTION, query, k=args.k, timeout=args.deadline)
            cpu_before = self.cpu_snapshot()
            wall_started = time.monotonic()
            same_default = 0
            for i, query in enumerate(queries):
                order = ("router", "standalone") if i % 2 == 0 else ("standalone", "router")
                answers = {}
                for name in order:
                    t0 = time.perf_counter()
                    answers[name] = clients[name].search(COLLECTION, query, k=args.k,
                                                         timeout=args.deadline)
                    results[name].append(1000.0 * (time.perf_counter() - t0))
                timings.append(answers["router"].timings)
                for name, answer in answers.items():
                    scored[name].append(answer.documents_scored)
                same_default += answers["router"].ids == answers["standalone"].ids
            wall = time.monotonic() - wall_started
            cpu_after = self.cpu_snapshot()
            mismatches = []
            recall = {"router": [], "standalone": []}
            for i, query in enumerate(make_queries(args, args.check, 2)):
                got = router.search(COLLECTION, query, k=args.k, exhaustive=True,
                                    timeout=args.deadline)
                want = standalone.search(COLLECTION, query, k=args.k, exhaustive=True,
                                         timeout=args.deadline)
                defaults = {}
                for name, client in clients.items():  # default options vs exhaustive
                    defaults[name] = client.search(COLLECTION, query, k=args.k,
                                                   timeout=args.deadline)
                    recall[name].append(len(set(defaults[name].ids) & set(want.ids))
                                        / max(len(want), 1))
                for options, router_hits, standalone_hits in (
                        ("exhaustive", got, want),
                        ("default", defaults["router"], defaults["standalone"])):
                    if (router_hits.ids != standalone_hits.ids
                            or not np.array_equal(router_hits.scores, standalone_hits.scores)):
                        mismatches.append({
                            "query": i, "options": options,
                            "router": list(zip(router_hits.ids, router_hits.scores.tolist())),
                            "standalone": list(zip(standalone_hits.ids,
                                                   standalone_hits.scores.tolist()))})
        # Stage 1 on the centroid index ranks by each replica's own codebook, trained on what it
        # held when it trained: the router's shards and the standalone's train apart, so their
        # cascades nominate differently (as two standalone servers fed in different orders do).
        # The default-option answers must be identical only on the exact scan.
        with self.standalone.client() as client:
            indexes = client.collection_info(COLLECTION, timeout=30.0)["stats"].get(
                "candidate_indexes", [])
        centroid = any(str(index).startswith("Centroid") for index in indexes)
        must_match = [m for m in mismatches if m["options"] == "exhaustive" or not centroid]
        if must_match:
            self.fail(f"MISMATCH: the router's hits differ from the standalone server's in "
                      f"{len(must_match)} of {2 * args.check} searches ({args.check} queries, "
                      f"exhaustive and default options); first: {json.dumps(must_match[0])}")
        elif mismatches:
            self.log(f"check: exhaustive hits identical for all {args.check} queries; default "
                     f"options differ in {len(mismatches)}: stage 1 is the centroid index, whose "
                     f"codebooks the router's shard nodes and the standalone server train apart")
        else:
            self.log(f"check: hits (ids, order, scores) identical for all {args.check} queries, "
                     f"exhaustive and with default options")
        out = {name: summary(values) for name, values in results.items()}
        fanout = [t.get("fanout_ms", 0.0) for t in timings]
        total = [t["total_ms"] for t in timings]
        out["router"].update({
            "fanout_p50_ms": round(float(np.percentile(fanout, 50)), 3),
            "fanout_p95_ms": round(float(np.percentile(fanout, 95)), 3),
            "fanout_mean_ms": round(float(np.mean(fanout)), 3),
            "total_p50_ms": round(float(np.percentile(total, 50)), 3),
            "total_p95_ms": round(float(np.percentile(total, 95)), 3),
            "shard_rerank_p50_ms": round(float(np.percentile([t["rerank_ms"] for t in timings],
                                                             50)), 3),
            "shard_candidates_p50_ms": round(float(np.percentile(
                [t["candidates_ms"] for t in timings], 50)), 3),
            "fanout_share_of_total_p50": round(float(np.median(
                np.asarray(fanout) / np.maximum(np.asarray(total), 1e-9))), 3),
        })
        out["overhead_p50_ms"] = round(out["router"]["p50_ms"] - out["standalone"]["p50_ms"], 3)
        out["overhead_mean_ms"] = round(out["router"]["mean_ms"] - out["standalone"]["mean_ms"],
                                        3)
        out["ratio_p50"] = round(out["router"]["p50_ms"] / out["standalone"]["p50_ms"], 3)
        out["ratio_qps"] = round(out["router"]["qps"] / out["standalone"]["qps"], 3)
        out["default_options_same_ids_share"] = round(same_default / len(queries), 3)
        for name in ("router", "standalone"):
            out[name]["documents_scored_mean"] = round(float(np.mean(scored[name])), 1)
            out[name]["recall_at_k_vs_exhaustive"] = (round(float(np.mean(recall[name])), 4)
                                                     if recall[name] else None)
        out["answer_check"] = {"queries": args.check, "mismatches": len(mismatches),
                               "centroid_stage": centroid,
                               "first_mismatches": mismatches[:3]}
        out["cpu_cores_during_queries"] = {
            name: round((cpu_after[name] - cpu_before[name]) / wall, 3)
            for name in cpu_before if cpu_before[name] is not None
            and cpu_after.get(name) is not None}
        out["wall_s"] = round(wall, 2)
        return out

    # Phase 3: failover -------------------------------------------------------------------------

    def failover(self, victim, partial):
        """Searches from --clients threads on the router; SIGKILL of `victim` after
        --before-kill s; --seconds s more. Returns the report of the round."""
        args = self.args
        node_id = f"shard-{victim}"
        queries = make_queries(args, 64, 3 + victim)
        calls = []  # (start, end, code name or None, missing shards)
        lock = threading.Lock()
        stop = threading.Event()
        kill_at = [None]
        down_at = [None]

        def load(index):
            with self.router.client() as client:
                i = index
                while not stop.is_set():
                    query = queries[i % len(queries)]
                    i += args.clients
                    t0 = time.monotonic()
                    code, missing, message = None, 0, None
                    try:
                        result = client.search(COLLECTION, query, k=args.k,
                                               timeout=args.deadline,
                                               allow_partial_results=partial)
                        missing = len(result.missing_shards)
                    except tessera.TesseraError as error:
                        code, message = error.code.name, error.message
                    with lock:
                        calls.append((t0, time.monotonic(), code, missing, message))

        def watch():
            with self.router.client() as client:
                while not stop.is_set():
                    if kill_at[0] is not None and down_at[0] is None:
                        try:
                            shards = client.collection_info(COLLECTION, timeout=5.0)["shards"]
                        except tessera.TesseraError:
                            shards = []
                        states = [r["state"] for s in shards for r in s["replicas"]
                                  if r["node_id"] == node_id]
                        if states and all(s == "down" for s in states):
                            down_at[0] = time.monotonic()
                    time.sleep(0.1)

        router_log_before = len(self.router.log())
        threads = [threading.Thread(target=load, args=(i,)) for i in range(args.clients)]
        threads.append(threading.Thread(target=watch))
        for thread in threads:
            thread.start()
        try:
            time.sleep(args.before_kill)
            self.nodes[victim].process.send_signal(signal.SIGKILL)
            kill_at[0] = time.monotonic()
            self.log(f"failover: SIGKILL {node_id} (pid {self.nodes[victim].process.pid}), "
                     f"allow_partial_results={partial}")
            time.sleep(args.seconds)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        self.nodes[victim].process.wait()
        self.nodes[victim].process = None
        kill = kill_at[0]
        per_second = {}
        errors = {}
        messages = {}
        for t0, t1, code, missing, message in calls:
            second = int(np.floor(t1 - kill))
            bucket = per_second.setdefault(second, {"t": second, "calls": 0, "ok": 0,
                                                    "errors": 0, "partial": 0, "max_ms": 0.0})
            bucket["calls"] += 1
            bucket["max_ms"] = max(bucket["max_ms"], round(1000.0 * (t1 - t0), 1))
            if code is None:
                bucket["ok"] += 1
                bucket["partial"] += missing > 0
            else:
                bucket["errors"] += 1
                errors[code] = errors.get(code, 0) + 1
                messages.setdefault(code, message)
        after = [c for c in calls if c[0] >= kill]
        in_first_second = [1000.0 * (t1 - t0) for t0, t1, *_ in calls
                           if t0 < kill + 1.0 and t1 > kill]
        failed = sum(1 for c in calls if c[2] is not None)
        unexpected = {code: n for code, n in errors.items()
                      if code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED")}
        if unexpected:
            self.fail(f"failover ({node_id}): unexpected errors {unexpected}: "
                      f"{ {c: messages[c] for c in unexpected} }")
        new_log = self.router.log()[router_log_before:]
        report = {
            "killed": node_id,
            "allow_partial_results": partial,
            "calls": len(calls),
            "errors": failed,
            "errors_by_code": errors,
            "error_messages": messages,
            "calls_after_kill": len(after),
            "errors_after_kill": sum(1 for c in after if c[2] is not None),
            "partial_after_kill": sum(1 for c in after if c[2] is None and c[3] > 0),
            "partial_share_after_kill": round(
                sum(1 for c in after if c[2] is None and c[3] > 0) / max(len(after), 1), 3),
            "max_latency_ms_after_kill": round(max(in_first_second), 1)
            if in_first_second else None,
            "latency_after_kill": summary([1000.0 * (t1 - t0) for t0, t1, *_ in after], False),
            "latency_before_kill": summary([1000.0 * (t1 - t0) for t0, t1, *_ in calls
                                            if t1 < kill], False),
            "qps_before_kill": round(sum(1 for c in calls if c[1] < kill and c[2] is None)
                                     / args.before_kill, 1),
            "qps_after_kill": round(sum(1 for c in calls if c[1] >= kill and c[2] is None)
                                    / args.seconds, 1),
            "seconds_until_down": round(down_at[0] - kill, 2) if down_at[0] else None,
            "per_second": [per_second[s] for s in sorted(per_second)],
            "router_log_after_kill": [line for line in new_log.splitlines()
                                      if line.strip()][-20:],
        }
        if down_at[0] is None:
            self.log(f"  note: the router did not report {node_id} down within "
                     f"{args.seconds:.0f} s of the kill")
        return report

    # Run ---------------------------------------------------------------------------------------

    def run(self):
        args = self.args
        out = {"machine": server_process.machine_facts(),
               "server": server_process.binary_facts(args.server),
               "docs": args.docs, "queries": args.queries, "seconds": args.seconds,
               "dim": args.dim, "doc_tokens": args.doc_tokens, "query_tokens": args.query_tokens,
               "shards": SHARDS, "replicas": REPLICAS, "shard_nodes": NODES, "k": args.k,
               "threads_per_server": args.threads,
               "threads_per_shard_node": args.shard_threads or args.threads,
               "ingest_streams": args.ingest_streams,
               "clients": args.clients, "deadline_s": args.deadline}
        started = time.monotonic()
        try:
            self.start()
            out["ingest"] = {"standalone": self.ingest(self.standalone, "standalone", 1),
                             "router": self.ingest(self.router, "router", REPLICAS)}
            out["router_ingest_docs_per_s"] = out["ingest"]["router"]["docs_per_s"]
            out["standalone_ingest_docs_per_s"] = out["ingest"]["standalone"]["docs_per_s"]
            out["settle_s"] = {"standalone": self.settle(self.standalone, "standalone"),
                               "router": self.settle(self.router, "router")}
            with self.router.client() as client:
                out["placement"] = {
                    s["shard"]: [r["node_id"] for r in s["replicas"]]
                    for s in client.collection_info(COLLECTION, timeout=30.0)["shards"]}
            self.log(f"placement: {out['placement']}")
            overhead = self.overhead()
            out["router"] = overhead.pop("router")
            out["standalone"] = overhead.pop("standalone")
            out.update(overhead)
            out["failover"] = self.failover(1, partial=False)
            out["failover_partial"] = self.failover(2, partial=True)
            lost = [s for s, nodes in out["placement"].items()
                    if set(nodes) <= {"shard-1", "shard-2"}]
            out["failover_partial"]["lost_shards"] = lost
        finally:
            out["exit_codes"] = self.stop()
            out["wall_s"] = round(time.monotonic() - started, 1)
        out["problems"] = self.problems
        return out


def print_report(out):
    machine = out["machine"]
    print(f"\nscripts/bench-cluster: {out['docs']:,} docs × {out['doc_tokens']} tokens, dim "
          f"{out['dim']}, {out['shards']} shards (router: {out['replicas']} replicas on "
          f"{out['shard_nodes']} nodes); {machine['nproc']} × {machine['cpu_model']}")
    print(f"  ingest docs/s   standalone {out['standalone_ingest_docs_per_s']:>8,.0f}   "
          f"router {out['router_ingest_docs_per_s']:>8,.0f} (each write on "
          f"{out['replicas']} replicas)")
    print(f"  {'search':<11}{'p50':>8}{'p95':>8}{'p99':>8}{'mean':>8}{'qps':>8}{'scored':>8}"
          f"{'recall':>8}   (ms; {out['queries']} queries one at a time, ABAB; scored = "
          f"documents reranked per query, recall@{out['k']} vs exhaustive)")
    for name in ("standalone", "router"):
        row = out[name]
        recall = row["recall_at_k_vs_exhaustive"]
        print(f"  {name:<11}{row['p50_ms']:>8.2f}{row['p95_ms']:>8.2f}{row['p99_ms']:>8.2f}"
              f"{row['mean_ms']:>8.2f}{row['qps']:>8.1f}{row['documents_scored_mean']:>8.0f}"
              f"{'' if recall is None else format(recall, '.3f'):>8}")
    router = out["router"]
    print(f"  router/standalone p50 ×{out['ratio_p50']:.2f}, overhead p50 "
          f"{out['overhead_p50_ms']:+.2f} ms; router fanout p50 {router['fanout_p50_ms']:.2f} "
          f"p95 {router['fanout_p95_ms']:.2f}, handler total p50 {router['total_p50_ms']:.2f} ms")
    check = out["answer_check"]
    print(f"  answer check (exhaustive + default options): {check['mismatches']} mismatches in "
          f"{check['queries']} queries; default options: same ids as standalone for "
          f"{out['default_options_same_ids_share']:.0%} of queries")
    for key in ("failover", "failover_partial"):
        f = out[key]
        print(f"  {key}: killed {f['killed']}, {f['calls']} calls, {f['errors']} failed "
              f"{f['errors_by_code'] or ''}, QPS {f['qps_before_kill']} before / "
              f"{f['qps_after_kill']} after, max latency in the second after the kill "
              f"{f['max_latency_ms_after_kill']} ms, down after {f['seconds_until_down']} s"
              + (f", partial results {f['partial_share_after_kill']:.0%} of calls after the kill"
                 if f["allow_partial_results"] else ""))
        print("    per second (t: calls/errors" + ("/partial" if f["allow_partial_results"]
                                                   else "") + "): " + "  ".join(
            f"{b['t']}:{b['calls']}/{b['errors']}"
            + (f"/{b['partial']}" if f["allow_partial_results"] else "")
            for b in f["per_second"]))
    if out["problems"]:
        print("\nPROBLEMS:")
        for problem in out["problems"]:
            print(f"  - {problem}")


def main(argv=None):
    args = parse_args(argv)
    bench = Bench(args)
    try:
        out = bench.run()
    except Exception as error:
        bench.fail(f"benchmark aborted: {error!r}")
        raise
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print_report(out)
    print(f"\nwrote {args.json} ({out['wall_s']:.0f} s)")
    return 1 if out["problems"] else 0
