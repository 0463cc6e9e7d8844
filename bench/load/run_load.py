"""scripts/load: a load test of one real tessera-server (see `scripts/load --help`).

Phases: start the server (loopback, free ports, temporary data dir) → ingest --docs synthetic
documents over --ingest-streams parallel Upsert streams → wait for background centroid training
→ mixed traffic at rising concurrency until throughput stops growing → optionally a long run at
the saturation level → Get every acknowledged write → SIGTERM the server → JSON and a table.

Definitions used in the report:
  qps           successful ops (any kind) that completed inside the level's window, per second;
                search_qps the searches among them.
  p50/p95/p99   client-side latency (ms) of every op issued in the window, failed ones included
                (a DEADLINE_EXCEEDED op counts with its full deadline); search_* searches only.
  errors        failed ops by gRPC status; for upserts, a per-document non-OK result counts too.
  rss_mb_start  server RSS when mixed traffic starts (after ingest); rss_mb_end when it ends;
                rss_mb_max over the whole run, ingest included.
  lost_writes   acknowledged upserts whose id is not readable at the acknowledged version, plus
                acknowledged deletes whose id is still readable. Ids with an unacknowledged write
                (deadline, error) have an unknown state from then on and are not checked
                (`uncertain_ids`).
  *_cpu_cores   CPU seconds per wall second during a level: the client processes, the server,
                and the whole machine (/proc/stat; other work on the machine shows up here).
                Clients and server share the machine's cores; `client_bound` marks a level where
                a client process used > 70% of a core (its GIL) or the clients > half the cores.
  server_search_mean_ms, server_rpcs
                from the server's /metrics: its own mean Search time and the RPCs it finished,
                by status (a search finished OK for a client that got DEADLINE_EXCEEDED is work
                done for nothing).
"""

import argparse
import json
import math
import multiprocessing
import os
import queue
import shutil
import sys
import tempfile
import time

import numpy as np

import server_process
import workload

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTION = "load"
TOLERATED = ("RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")

EPILOG = """\
workload: documents of dim --dim (128) unit vectors, 24-40 tokens each (mean 32), drawn around
4 of 1,024 random topic directions with Gaussian noise (|noise| 0.6, renormalised), sent as fp16
to a collection with the server's defaults (pool factor 2, fp16); queries: 32 tokens near random
tokens of a random base document, default search options, k 10. Mixed traffic (--mix, default
80/15/5): searches / upserts of one document (half new ids, half overwrites of a base document)
/ deletes of one base document. Every op carries a --deadline (5 s) deadline. Each level runs
--seconds with that many concurrent streams (one gRPC channel each, closed loop: a stream issues
its next op when the last returns), spread over up to --processes client processes.

stopping rule: after at least 3 levels, stop when a level's QPS is not ≥ 5% above the best of the
two levels before it (--all-levels runs every level). The saturation level is the lowest
concurrency reaching 95% of the best QPS; --saturate-minutes M then runs there for M minutes.

exit status: 1 when a write was lost, when an error other than RESOURCE_EXHAUSTED or
DEADLINE_EXCEEDED occurred, when acknowledged ids could not be read back, or when the server died
or did not exit 0 on SIGTERM; 2 on bad arguments.
"""


def _default_server():
    if os.environ.get("TESSERA_SERVER"):
        return os.environ["TESSERA_SERVER"]
    return os.path.join(REPO_ROOT, "build", "bin", "tessera-server")


def _int_list(text):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}', expected comma-separated integers")
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"'{text}', expected integers ≥ 1")
    return values


def _mix(text):
    values = _int_list(text) if text else []
    if len(values) != 3:
        raise argparse.ArgumentTypeError(f"'{text}', expected SEARCH,UPSERT,DELETE e.g. 80,15,5")
    total = sum(values)
    return [v / total for v in values]


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="scripts/load", description="Load test of one real tessera-server: ingest, mixed "
        "traffic at rising concurrency until saturation, RSS over time, lost-write check.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, metavar="FILE", help="where to write results")
    parser.add_argument("--seconds", type=float, default=30.0, help="per level (default 30)")
    parser.add_argument("--docs", type=int, default=100_000,
                        help="documents ingested before the traffic (default 100,000)")
    parser.add_argument("--levels", type=_int_list, default=[1, 2, 4, 8, 16, 32, 64],
                        help="concurrent streams per level (default 1,2,4,8,16,32,64)")
    parser.add_argument("--server", default=None,
                        help="tessera-server binary (default $TESSERA_SERVER, else "
                        "build/bin/tessera-server)")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="extra server flag, repeatable (e.g. --server-arg=--threads=2)")
    parser.add_argument("--saturate-minutes", type=float, default=0.0, metavar="M",
                        help="after the levels, run M minutes at the saturation level")
    parser.add_argument("--saturate-concurrency", type=int, default=None, metavar="C",
                        help="run the long run at C streams instead of the saturation level")
    parser.add_argument("--all-levels", action="store_true", help="no early stop")
    parser.add_argument("--mix", type=_mix, default=_mix("80,15,5"),
                        help="search,upsert,delete percentages (default 80,15,5)")
    parser.add_argument("--deadline", type=float, default=5.0, help="per op, s (default 5)")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--query-tokens", type=int, default=32)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--processes", type=int, default=8,
                        help="most client processes; a level's streams are spread over "
                        "min(streams, this) processes (default 8)")
    parser.add_argument("--ingest-streams", type=int, default=4,
                        help="parallel Upsert streams, one process each (default 4)")
    parser.add_argument("--ingest-batch", type=int, default=64, help="documents per message")
    parser.add_argument("--ingest-timeout", type=float, default=3600.0,
                        help="deadline of each ingest stream, s (default 3600)")
    parser.add_argument("--settle-timeout", type=float, default=900.0,
                        help="longest wait for background training after ingest, s")
    parser.add_argument("--verify-threads", type=int, default=4,
                        help="Get threads per client process when verifying")
    parser.add_argument("--no-metrics", action="store_true",
                        help="start the server with --metrics_listen '' (no server-side timings)")
    parser.add_argument("--work-dir", default=None,
                        help="parent of the temporary data dir (default $TMPDIR)")
    parser.add_argument("--keep-data", action="store_true", help="keep the data dir and log")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    args.server = args.server or _default_server()
    if not args.server or not os.access(args.server, os.X_OK):
        parser.error(f"tessera-server binary not found ({args.server!r}); pass --server")
    if args.docs < 1 or args.seconds <= 0 or args.processes < 1 or args.ingest_streams < 1:
        parser.error("--docs, --seconds, --processes and --ingest-streams must be positive")
    return args


# ---------------------------------------------------------------------------------------------

class WorkerPool:
    """`size` spawned client processes (workload.worker_main), each with its own command queue."""

    def __init__(self, size, config):
        context = multiprocessing.get_context("spawn")
        self.progress = context.Value("q", 0)
        self.results = context.Queue()
        self.commands = [context.Queue() for _ in range(size)]
        self.processes = [context.Process(target=workload.worker_main,
                                          args=(i, config, self.commands[i], self.results,
                                                self.progress), daemon=True)
                          for i in range(size)]
        for process in self.processes:
            process.start()
        self.pids = {}
        for _ in range(size):
            index, answer = self._get(120.0)
            self.pids[index] = answer["pid"]

    def _get(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.results.get(timeout=1.0)
            except queue.Empty:
                dead = [p.pid for p in self.processes if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"client processes {dead} died")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no answer from the client processes in {timeout:.0f} s")

    def run(self, commands, timeout, tick=None):
        """commands: {worker index: command}. Returns {index: answer}; `tick()` runs about once
        a second while waiting."""
        self.send(commands)
        return self.collect(len(commands), timeout, tick)

    def send(self, commands):
        for index, command in commands.items():
            self.commands[index].put(command)

    def collect(self, count, timeout, tick=None):
        """The answers to the last `count` commands sent, as {worker index: answer}."""
        answers = {}
        deadline = time.monotonic() + timeout
        while len(answers) < count:
            try:
                index, answer = self.results.get(timeout=1.0)
            except queue.Empty:
                if tick:
                    tick()
                dead = [p.pid for p in self.processes if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"client processes {dead} died")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"client processes did not answer in {timeout:.0f} s")
                continue
            if "exception" in answer:
                raise RuntimeError(f"client process {index} failed:\n{answer['exception']}")
            answers[index] = answer
        return answers

    def close(self):
        for q in self.commands:
            q.put(None)
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join()


def _percentiles(values):
    if len(values) == 0:
        return None, None, None
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return round(float(p50), 2), round(float(p95), 2), round(float(p99), 2)


def _code_names():
    import grpc
    return {code.value[0]: code.name for code in grpc.StatusCode}


def _state(version):
    return "absent" if version == workload.DELETED else f"version {version}"


def _format_seconds(seconds):
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


def _rate(values_before, values_after, key_filter):
    """Δsum/Δcount (ms) of tessera_rpc_duration_seconds for labels passing key_filter."""
    sums = counts = 0.0
    for (name, labels), value in values_after.items():
        if not key_filter(labels):
            continue
        delta = value - values_before.get((name, labels), 0.0)
        if name.endswith("_sum"):
            sums += delta
        elif name.endswith("_count"):
            counts += delta
    return round(1000.0 * sums / counts, 2) if counts else None


def _rpc_counts(values_before, values_after):
    """{"METHOD CODE": finished RPCs} between two scrapes (tessera_rpc_total), data-path methods."""
    counts = {}
    for (name, labels), value in values_after.items():
        if name != "tessera_rpc_total":
            continue
        fields = dict(part.split("=", 1) for part in labels.split(","))
        method, code = fields.get("method", "").strip('"'), fields.get("code", "").strip('"')
        delta = int(value - values_before.get((name, labels), 0.0))
        if delta and method in ("Search", "Upsert", "Delete"):
            counts[f"{method} {code}"] = delta
    return counts


class LoadRun:
    def __init__(self, args):
        self.args = args
        self.codes = _code_names()
        self.ledger = {}  # id → [expected version or workload.DELETED, uncertain]
        self.acknowledged = 0
        self.phases = []
        self.runs = 0
        self.other_errors = 0
        self.problems = []
        self.stop_rule_level = None

    def log(self, text):
        print(text, flush=True)

    def phase(self, name):
        self.phases.append({"name": name, "t_s": round(self.sampler.now(), 2)})

    # Ledger -----------------------------------------------------------------------------------

    def record(self, doc_id, version, certain):
        entry = self.ledger.get(doc_id)
        if entry is None:
            entry = self.ledger[doc_id] = [version, not certain]
        elif certain and not entry[1]:
            entry[0] = version
        else:
            entry[1] = True
        if certain:
            self.acknowledged += 1

    # Phases -----------------------------------------------------------------------------------

    def ingest(self):
        args = self.args
        import tessera
        with tessera.Client(self.server.address) as client:
            client.create_collection(COLLECTION, dim=args.dim, timeout=30.0)
        streams = args.ingest_streams
        self.log(f"ingest: {args.docs:,} documents over {streams} Upsert streams "
                 f"(batches of {args.ingest_batch})")
        started = time.monotonic()
        last = [started]

        def tick():
            now = time.monotonic()
            if now - last[0] < 5.0:
                return
            done = self.pool.progress.value
            rate = done / max(now - started, 1e-9)
            eta = (args.docs - done) / rate if rate > 0 else math.inf
            rss = self.server.status_fields()
            self.log(f"  ingest {done:,}/{args.docs:,} ({100 * done / args.docs:4.1f}%) "
                     f"{rate:7.0f} docs/s, ETA {_format_seconds(eta) if rate else '--'}, "
                     f"server RSS {rss[0] if rss else 0:.0f} MB")
            last[0] = now
            if not self.server.alive():
                raise RuntimeError("tessera-server died during ingest")

        commands = {i: {"kind": "ingest", "first": i, "step": streams, "num_docs": args.docs,
                        "batch_size": args.ingest_batch, "timeout": args.ingest_timeout}
                    for i in range(streams)}
        answers = self.pool.run(commands, args.ingest_timeout + 120.0, tick)
        seconds = time.monotonic() - started
        acked = failures = 0
        rejected = {}
        for answer in answers.values():
            for i, version in zip(answer["acked_index"], answer["acked_version"]):
                self.record(workload.base_id(int(i)), int(version), True)
            for i in answer["uncertain_index"]:
                self.record(workload.base_id(int(i)), 0, False)
            acked += len(answer["acked_index"])
            for code, count in answer["rejected"].items():
                rejected[code] = rejected.get(code, 0) + count
            if answer["failure"]:
                failures += 1
                rejected[answer["failure"]] = rejected.get(answer["failure"], 0) + 1
        self.other_errors += sum(rejected.values())
        if rejected:
            self.problems.append(f"ingest errors {rejected}")
        self.log(f"ingest: {acked:,} of {args.docs:,} acknowledged in {seconds:.1f} s "
                 f"({acked / seconds:.0f} docs/s){', errors ' + str(rejected) if rejected else ''}")
        return {"docs_requested": args.docs, "docs_acknowledged": acked,
                "seconds": round(seconds, 1), "docs_per_s": round(acked / seconds, 1),
                "streams": streams, "batch": args.ingest_batch, "errors_by_code": rejected,
                "streams_failed": failures}

    def settle(self):
        """Waits until no shard is training a centroid index (twice in a row, 2 s apart)."""
        import tessera
        started = time.monotonic()
        quiet = 0
        stats = {}
        with tessera.Client(self.server.address) as client:
            while time.monotonic() - started < self.args.settle_timeout:
                stats = client.collection_info(COLLECTION, timeout=30.0)["stats"]
                quiet = quiet + 1 if stats["training_shards"] == 0 else 0
                if quiet >= 2:
                    break
                if stats["training_shards"]:
                    self.log(f"  waiting for background training "
                             f"({time.monotonic() - started:.0f} s, {stats['candidate_indexes']})")
                time.sleep(2.0 if stats["training_shards"] == 0 else 5.0)
        seconds = time.monotonic() - started
        self.log(f"settle: {seconds:.0f} s; stage 1 {stats.get('candidate_indexes')}, "
                 f"{stats.get('documents', 0):,} documents, "
                 f"{stats.get('rerank_vectors', 0):,} rerank vectors")
        return {"seconds": round(seconds, 1), "training_shards": stats.get("training_shards"),
                "candidate_indexes": stats.get("candidate_indexes"),
                "documents": stats.get("documents"), "rerank_vectors": stats.get("rerank_vectors"),
                "resident_bytes": stats.get("resident_bytes"),
                "candidate_bytes": stats.get("candidate_bytes")}

    def traffic(self, concurrency, seconds, tag):
        """One closed-loop run of `concurrency` streams for `seconds`; returns its summary and
        the raw per-op arrays."""
        args = self.args
        processes = min(concurrency, args.processes, len(self.pool.processes))
        self.runs += 1
        start = time.time() + 1.5 + 0.02 * concurrency
        common = {"kind": "traffic", "seconds": seconds, "start": start,
                  "concurrency": concurrency, "buckets": self.buckets, "num_docs": args.docs,
                  "deadline": args.deadline, "mix": args.mix, "k": args.k,
                  "query_tokens": args.query_tokens, "tag": tag, "run": self.runs}
        commands = {w: dict(common, streams=list(range(w, concurrency, processes)))
                    for w in range(processes)}
        metrics_before = self.server.scrape()
        self.pool.send(commands)
        time.sleep(max(0.0, start - time.time()))
        t_start = self.sampler.now()
        cpu_before = self.server.cpu_seconds()
        busy_before = server_process.machine_busy_seconds()
        answers = self.pool.collect(len(commands), seconds + args.deadline + 120.0)
        wall = max(time.time() - start, 1e-9)
        cpu_server = (self.server.cpu_seconds() - cpu_before) / wall
        busy = (server_process.machine_busy_seconds()[0] - busy_before[0]) / wall
        t_end = self.sampler.now()
        metrics_after = self.server.scrape()
        if not self.server.alive():
            raise RuntimeError(f"tessera-server died during traffic:\n{self.server.log()[-4000:]}")

        t_done = np.concatenate([a["t_done"] for a in answers.values()])
        latency = np.concatenate([a["latency_ms"] for a in answers.values()])
        kind = np.concatenate([a["kind"] for a in answers.values()])
        code = np.concatenate([a["code"] for a in answers.values()])
        for answer in answers.values():
            for event in answer["ledger"]:
                self.record(*event)
        window = t_done <= seconds
        ok = code == 0
        errors_by_code = {}
        for number, count in zip(*np.unique(code[~ok], return_counts=True)):
            errors_by_code[self.codes.get(int(number), str(number))] = int(count)
        errors_by_kind = {}
        for kind_number, kind_name in enumerate(workload.KIND_NAMES):
            failed = code[(kind == kind_number) & ~ok]
            if len(failed):
                errors_by_kind[kind_name] = {
                    self.codes.get(int(n), str(n)): int(c)
                    for n, c in zip(*np.unique(failed, return_counts=True))}
        error_examples = {}
        for answer in answers.values():
            for (kind_name, number), messages in answer["examples"].items():
                key = f"{kind_name} {self.codes.get(number, str(number))}"
                merged = error_examples.setdefault(key, [])
                merged.extend(m for m in messages if m not in merged and len(merged) < 3)
        other = sum(c for name, c in errors_by_code.items() if name not in TOLERATED)
        self.other_errors += other
        if other:
            self.problems.append(f"{tag}: errors {errors_by_code}")
        p50, p95, p99 = _percentiles(latency)
        s50, s95, s99 = _percentiles(latency[kind == workload.KIND_SEARCH])
        client_cpu = [a["cpu_seconds"] / max(a["wall_seconds"], 1e-9) for a in answers.values()]
        rss = self.sampler.between(t_start, t_end)
        threads = self.sampler.threads_between(t_start, t_end)
        search_ok = ok & (kind == workload.KIND_SEARCH)
        summary = {
            "concurrency": concurrency,
            "processes": processes,
            "seconds": seconds,
            "ops": int(len(code)),
            "qps": round(float((ok & window).sum()) / seconds, 2),
            "search_qps": round(float((search_ok & window).sum()) / seconds, 2),
            "upsert_qps": round(float((ok & window & (kind == workload.KIND_UPSERT)).sum())
                                / seconds, 2),
            "delete_qps": round(float((ok & window & (kind == workload.KIND_DELETE)).sum())
                                / seconds, 2),
            "p50_ms": p50, "p95_ms": p95, "p99_ms": p99,
            "search_p50_ms": s50, "search_p95_ms": s95, "search_p99_ms": s99,
            "errors": int((~ok).sum()),
            "errors_by_code": errors_by_code,
            "errors_by_kind": errors_by_kind,
            "error_examples": error_examples,  # "KIND CODE" → a few distinct messages
            "resource_exhausted": errors_by_code.get("RESOURCE_EXHAUSTED", 0),
            "deadline_exceeded": errors_by_code.get("DEADLINE_EXCEEDED", 0),
            "other_errors": other,
            "client_search_mean_ms": (round(float(latency[search_ok].mean()), 2)
                                      if search_ok.any() else None),
            "server_search_mean_ms": _rate(metrics_before, metrics_after,
                                           lambda labels: 'method="Search"' in labels),
            # RPCs the server finished in the level, by its own status (e.g. searches it completed
            # OK for clients that had given up: work done for nothing).
            "server_rpcs": _rpc_counts(metrics_before, metrics_after),
            "client_cpu_cores": round(sum(client_cpu), 2),
            "client_max_process_cpu": round(max(client_cpu), 2),
            "client_bound": bool(max(client_cpu) > 0.7
                                 or sum(client_cpu) > 0.5 * (os.cpu_count() or 1)),
            "server_cpu_cores": round(cpu_server, 2),
            "machine_busy_cores": round(busy, 2),
            "rss_mb_end": rss[-1] if rss else None,
            "rss_mb_max": max(rss) if rss else None,
            "server_threads_max": max(threads) if threads else None,
            "t_start_s": round(t_start, 2),
            "t_end_s": round(t_end, 2),
        }
        return summary, (t_done, latency, kind, code)

    def saturate(self, concurrency, minutes):
        seconds = minutes * 60.0
        self.log(f"saturation run: {concurrency} streams for {minutes:g} min")
        self.phase(f"saturate-{concurrency}")
        summary, (t_done, latency, kind, code) = self.traffic(concurrency, seconds, "S")
        width = 60.0 if seconds >= 120 else 10.0
        bins = []
        for b in range(int(math.ceil(seconds / width))):
            lo, hi = b * width, min((b + 1) * width, seconds)
            mask = (t_done > lo) & (t_done <= hi)
            rss = self.sampler.between(summary["t_start_s"] + lo, summary["t_start_s"] + hi)
            p50, p95, p99 = _percentiles(latency[mask])
            bins.append({"t_s": lo, "qps": round(float((mask & (code == 0)).sum()) / (hi - lo), 2),
                         "errors": int((mask & (code != 0)).sum()), "p50_ms": p50,
                         "p99_ms": p99, "rss_mb_max": max(rss) if rss else None})
        samples = [(t, mb) for t, mb in self.sampler.rss
                   if summary["t_start_s"] <= t <= summary["t_end_s"]]
        slope = None
        if len(samples) >= 10:
            ts, mbs = np.array(samples).T
            slope = round(float(np.polyfit(ts / 60.0, mbs, 1)[0]), 2)
        summary.update({"minutes": minutes, "bins": bins, "bin_seconds": width,
                        "rss_mb_start": samples[0][1] if samples else None,
                        "rss_slope_mb_per_min": slope})
        self.log(f"saturation run: {summary['qps']:.1f} QPS, p99 {summary['p99_ms']} ms, "
                 f"errors {summary['errors_by_code']}, RSS {summary['rss_mb_start']} → "
                 f"{summary['rss_mb_end']} MB (max {summary['rss_mb_max']}, "
                 f"slope {slope} MB/min)")
        return summary

    def verify(self):
        import tessera
        ids = [doc_id for doc_id, (_, uncertain) in self.ledger.items() if not uncertain]
        expected = [self.ledger[doc_id][0] for doc_id in ids]
        uncertain = len(self.ledger) - len(ids)
        workers = min(len(self.pool.processes), max(self.args.processes, 1))
        self.log(f"verify: Get of {len(ids):,} ids ({uncertain:,} with an unacknowledged write "
                 f"skipped) from {workers} processes")
        started = time.monotonic()
        commands = {w: {"kind": "verify", "ids": ids[w::workers], "expected": expected[w::workers],
                        "threads": self.args.verify_threads} for w in range(workers)}
        answers = self.pool.run(commands, 3600.0)
        mismatches = [m for a in answers.values() for m in a["mismatches"]]
        unreadable = [u for a in answers.values() for u in a["unreadable"]]
        seconds = time.monotonic() - started
        present_min = sum(1 for v, u in self.ledger.values() if not u and v != workload.DELETED)
        with tessera.Client(self.server.address) as client:
            documents = client.collection_info(COLLECTION, timeout=30.0)["stats"]["documents"]
        result = {
            "checked_ids": len(ids),
            "uncertain_ids": uncertain,
            "lost": len(mismatches),
            "lost_examples": [{"id": i, "expected": _state(e), "got": _state(g)}
                              for i, e, g in mismatches[:20]],
            "unreadable": len(unreadable),
            "unreadable_examples": unreadable[:20],
            "seconds": round(seconds, 1),
            "documents_reported": documents,
            "documents_expected_min": present_min,
            "documents_expected_max": present_min + uncertain,
        }
        self.log(f"verify: {len(mismatches)} lost, {len(unreadable)} unreadable in "
                 f"{seconds:.1f} s; server reports {documents:,} documents "
                 f"(expected {present_min:,}..{present_min + uncertain:,})")
        if unreadable:
            self.problems.append(f"{len(unreadable)} acknowledged ids could not be read")
        return result

    # The whole run ----------------------------------------------------------------------------

    def run(self):
        args = self.args
        import tessera  # noqa: F401  (generates the stubs when missing)
        self.work_dir = tempfile.mkdtemp(prefix="tessera-load-", dir=args.work_dir)
        self.server = server_process.ServerProcess(args.server, self.work_dir, args.server_arg,
                                                   metrics=not args.no_metrics)
        top = max(args.levels + ([args.saturate_concurrency] if args.saturate_concurrency else []))
        self.buckets = top
        out = {"machine": server_process.machine_facts()}
        out.update({"nproc": out["machine"]["nproc"], "cpu_model": out["machine"]["cpu_model"],
                    "docs": args.docs, "seconds_per_level": args.seconds, "dim": args.dim,
                    "mix": {"search": args.mix[0], "upsert": args.mix[1], "delete": args.mix[2]},
                    "deadline_s": args.deadline, "k": args.k, "query_tokens": args.query_tokens,
                    "server": dict(server_process.binary_facts(args.server),
                                   args=args.server_arg)})
        self.pool = None
        self.sampler = None
        exit_code = None
        try:
            self.server.start()
            self.sampler = server_process.Sampler(self.server).start()
            self.phase("server-started")
            self.log(f"server: {args.server} on {self.server.address}, data in "
                     f"{self.server.data_dir}, machine {out['nproc']} × {out['cpu_model']}")
            pool_size = max(args.ingest_streams, min(top, args.processes))
            config = {"address": self.server.address, "collection": COLLECTION,
                      "seed": args.seed, "dim": args.dim, "sys_path": list(sys.path)}
            self.pool = WorkerPool(pool_size, config)
            self.phase("ingest")
            out["ingest"] = self.ingest()
            self.phase("settle")
            out["settle"] = self.settle()
            out["rss_mb_after_ingest"] = (self.server.status_fields() or [None])[0]
            out["levels"] = self.levels()
            out["stopped_early"] = len(out["levels"]) < len(args.levels)
            out["stop_rule_level"] = self.stop_rule_level  # where it stops without --all-levels
            best = max(level["qps"] for level in out["levels"])
            saturation = next(level["concurrency"] for level in out["levels"]
                              if level["qps"] >= 0.95 * best)
            out["saturation_concurrency"] = saturation
            out["best_qps"] = best
            if args.saturate_minutes > 0:
                out["saturation"] = self.saturate(args.saturate_concurrency or saturation,
                                                  args.saturate_minutes)
            traffic_end = self.sampler.now()
            self.phase("verify")
            time.sleep(1.0)
            out["verify"] = self.verify()
            self.phase("shutdown")
        finally:
            if self.pool is not None:
                self.pool.close()
            if self.sampler is not None:
                self.sampler.stop()
            exit_code = self.server.stop()
            if exit_code not in (0, None):
                self.problems.append(f"tessera-server exited with {exit_code} on SIGTERM")
                out.setdefault("server", {})["log_tail"] = self.server.log()[-4000:]
            if not args.keep_data:
                shutil.rmtree(self.work_dir, ignore_errors=True)
            else:
                self.log(f"data and server log kept in {self.work_dir}")
        out["server"]["exit_code"] = exit_code
        traffic_start = out["levels"][0]["t_start_s"]
        traffic = self.sampler.between(traffic_start, traffic_end)
        everything = [mb for _, mb in self.sampler.rss]
        out["rss_mb_server_start"] = everything[0] if everything else None
        out["rss_mb_start"] = traffic[0] if traffic else None
        out["rss_mb_end"] = traffic[-1] if traffic else None
        out["rss_mb_max"] = max(everything) if everything else None
        out["rss_samples"] = self.sampler.rss
        out["thread_samples"] = self.sampler.threads
        out["phases"] = self.phases
        out["acknowledged_writes"] = self.acknowledged
        out["lost_writes"] = out["verify"]["lost"]
        out["other_errors"] = self.other_errors
        if out["lost_writes"]:
            self.problems.append(f"{out['lost_writes']} acknowledged writes lost")
        out["problems"] = self.problems
        return out

    def levels(self):
        args = self.args
        results = []
        self.log(f"traffic: levels {args.levels}, {args.seconds:g} s each, mix "
                 f"search/upsert/delete {'/'.join(f'{100 * m:.0f}' for m in args.mix)}, "
                 f"deadline {args.deadline:g} s")
        print_header()
        for concurrency in args.levels:
            self.phase(f"level-{concurrency}")
            summary, _ = self.traffic(concurrency, args.seconds, f"L{concurrency}")
            results.append(summary)
            print_row(summary)
            if summary["client_bound"]:
                self.log(f"  note: client-bound? the clients used {summary['client_cpu_cores']} "
                         f"of {os.cpu_count()} cores, the busiest process "
                         f"{summary['client_max_process_cpu']:.0%} of one (GIL); this level "
                         "measures the Python client as much as the server")
            if len(results) >= 3 and self.stop_rule_level is None:
                previous = max(r["qps"] for r in results[-3:-1])
                if summary["qps"] < 1.05 * previous:
                    self.stop_rule_level = concurrency
                    self.log(f"  QPS {summary['qps']:.1f} is not 5% above {previous:.1f}: "
                             f"saturated{'' if args.all_levels else ', stopping'}")
                    if not args.all_levels:
                        break
        return results


# Report ----------------------------------------------------------------------------------------

_COLUMNS = [("conc", "concurrency", 5, "d"), ("procs", "processes", 5, "d"),
            ("qps", "qps", 8, ".1f"), ("srch_qps", "search_qps", 8, ".1f"),
            ("p50_ms", "p50_ms", 8, ".1f"), ("p95_ms", "p95_ms", 8, ".1f"),
            ("p99_ms", "p99_ms", 8, ".1f"), ("errors", "errors", 6, "d"),
            ("RE", "resource_exhausted", 5, "d"), ("DE", "deadline_exceeded", 5, "d"),
            ("other", "other_errors", 5, "d"), ("cli_cpu", "client_cpu_cores", 7, ".2f"),
            ("srv_cpu", "server_cpu_cores", 7, ".2f"), ("busy", "machine_busy_cores", 5, ".2f"),
            ("srv_ms", "server_search_mean_ms", 7, ".1f"), ("rss_mb", "rss_mb_max", 7, ".0f"),
            ("thr", "server_threads_max", 4, "d")]


def print_header():
    print(" ".join(f"{title:>{width}}" for title, _, width, _ in _COLUMNS), flush=True)


def print_row(summary):
    cells = []
    for _, key, width, fmt in _COLUMNS:
        value = summary.get(key)
        cells.append(f"{'-':>{width}}" if value is None else f"{value:>{width}{fmt}}")
    print(" ".join(cells), flush=True)


def print_report(out):
    print()
    print(f"tessera load test: {out['docs']:,} docs, {out['seconds_per_level']:g} s per level, "
          f"{out['nproc']} × {out['cpu_model']}")
    ingest = out.get("ingest", {})
    print(f"ingest: {ingest.get('docs_acknowledged', 0):,} docs in {ingest.get('seconds')} s "
          f"({ingest.get('docs_per_s')} docs/s); settle {out.get('settle', {}).get('seconds')} s")
    print_header()
    for level in out["levels"]:
        print_row(level)
    print("  RE = RESOURCE_EXHAUSTED, DE = DEADLINE_EXCEEDED; cli/srv_cpu, busy = CPU cores used "
          "by the clients, the server, the machine; srv_ms = server-side mean Search time")
    print(f"saturation at {out['saturation_concurrency']} streams ({out['best_qps']:.1f} QPS best)"
          f"{'; stopped early' if out['stopped_early'] else ''}")
    if "saturation" in out:
        s = out["saturation"]
        print(f"saturation run: {s['concurrency']} streams × {s['minutes']:g} min: "
              f"{s['qps']:.1f} QPS, p50/p95/p99 {s['p50_ms']}/{s['p95_ms']}/{s['p99_ms']} ms, "
              f"errors {s['errors_by_code']}, RSS {s['rss_mb_start']} → {s['rss_mb_end']} MB "
              f"(max {s['rss_mb_max']}, slope {s['rss_slope_mb_per_min']} MB/min)")
    print(f"server RSS: start {out['rss_mb_server_start']} MB, traffic start "
          f"{out['rss_mb_start']} MB, end {out['rss_mb_end']} MB, max {out['rss_mb_max']} MB")
    verify = out["verify"]
    print(f"writes: {out['acknowledged_writes']:,} acknowledged, {out['lost_writes']} lost "
          f"({verify['checked_ids']:,} ids checked, {verify['uncertain_ids']:,} uncertain, "
          f"{verify['unreadable']} unreadable); server exit code {out['server']['exit_code']}")
    for problem in out["problems"]:
        print(f"PROBLEM: {problem}")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    run = LoadRun(args)
    out = run.run()
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print_report(out)
    print(f"JSON: {args.json}")
    return 1 if out["problems"] else 0
