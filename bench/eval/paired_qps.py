"""The default search's QPS of two or more eval configurations, measured in alternated rounds on
one server, so that their ratio holds on a machine whose speed drifts.

    "$(scripts/eval-env)" bench/eval/paired_qps.py --data ../shared/data/cranfield \
        [--configs cascade,codes-4] [--rounds 4] [--seconds 4] [--server PATH] [--json FILE]

A single scripts/eval run measures each configuration once, minutes apart: on a shared VM whose
speed moves 1.5-2x within an hour, that swung the compact/exact QPS ratio of one set by +-0.3
between runs. Here every configuration's collection (run_eval.py's settings) is created and
ingested first, then each round searches every judged query with the default options (k = 10)
for --seconds per configuration, configurations in turn. Prints and (--json) writes each round's
QPS, P50 and stage means, and each configuration's QPS over the first one's per round.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "e2e"))  # the e2e tests' server launcher
sys.path.insert(0, os.path.dirname(HERE))  # bench/machine.py

import e2e_util  # noqa: E402  (also puts client/python on the path)
import embed  # noqa: E402
import machine  # noqa: E402
import run_eval  # noqa: E402

WARMUP_QUERIES = 20


def search_round(client, name, queries, seconds):
    """Every query in turn until `seconds` have passed: QPS, P50 ms and stage means."""
    latencies, stages = [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for query in queries:
            start = time.perf_counter()
            result = client.search(name, query, k=10)
            latencies.append((time.perf_counter() - start) * 1000.0)
            stages.append(result.timings)
    values = np.asarray(latencies)
    return {"qps": float(len(values) / (values.sum() / 1000.0)),
            "p50_ms": float(np.percentile(values, 50)),
            "queries": len(values),
            "stage_ms": {key: float(np.mean([s[key] for s in stages])) for key in stages[0]}}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a folder in BEIR layout")
    parser.add_argument("--configs", default="cascade,codes-4",
                        help="run_eval.py configuration names; ratios are to the first")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0, help="per configuration per round")
    parser.add_argument("--server", help="tessera-server binary (default build/bin)")
    parser.add_argument("--json", help="write the rounds here")
    args = parser.parse_args()
    known = {config.name: config for config in run_eval.tessera_configs()}
    names = args.configs.split(",")
    unknown = [name for name in names if name not in known]
    if unknown or len(names) < 2:
        parser.error(f"--configs: expected two or more of {', '.join(known)}, got {args.configs}")
    if args.rounds < 1 or args.seconds <= 0:
        parser.error(f"--rounds {args.rounds} / --seconds {args.seconds}: expected ≥ 1 and > 0")

    dataset = embed.load_dataset(args.data)
    queries = [dataset.queries.matrix(i) for i in range(len(dataset.queries))]
    e2e_util.SERVER_BINARY = args.server or os.path.join(REPO_ROOT, "build", "bin",
                                                         "tessera-server")
    rounds = []
    with e2e_util.Server(threads=os.cpu_count()).running() as server, server.client() as client:
        for name in names:
            run_eval.load_collection(client, dataset, known[name])
            for query in queries[:WARMUP_QUERIES]:
                client.search(name, query, k=10)
        for r in range(args.rounds):
            measured = {name: search_round(client, name, queries, args.seconds)
                        for name in names}
            first = measured[names[0]]["qps"]
            for name in names:
                measured[name]["vs_first"] = measured[name]["qps"] / first
                stage = measured[name]["stage_ms"]
                print(f"round {r}  {name:<14} {measured[name]['qps']:7.1f} QPS  "
                      f"P50 {measured[name]['p50_ms']:5.2f} ms  "
                      f"{measured[name]['vs_first']:.2f}x {names[0]}  stages "
                      + " / ".join(f"{stage[key]:.3f}" for key in
                                   ("candidates_ms", "fetch_ms", "rerank_ms")),
                      flush=True)
            rounds.append(measured)
    for name in names[1:]:
        ratios = [measured[name]["vs_first"] for measured in rounds]
        print(f"{name} / {names[0]} QPS per round: {min(ratios):.2f}-{max(ratios):.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(dataset=dataset.name, configs=names, rounds=rounds,
                           seconds_per_round=args.seconds, cpu_model=machine.cpu_model(),
                           date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())), f, indent=1)


if __name__ == "__main__":
    main()
