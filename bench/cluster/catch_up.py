"""Catch-up of a returning replica, measured: N documents (default 20,000) in 3 shards x 2
replicas, one shard node SIGKILLed, 30 documents written while it is down (its replicas go stale),
the node restarted on its data dir. Prints how long until every replica serves again and the
router's catch-up log lines (bytes copied, how long the source refused writes to the replica).

    /usr/bin/python3 bench/cluster/catch_up.py [--docs N]
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "client", "python")]
import run_cluster as rc  # noqa: E402


def main():
    docs = sys.argv[sys.argv.index("--docs") + 1] if "--docs" in sys.argv else "20000"
    bench = rc.Bench(rc.parse_args(["--json", os.devnull, "--docs", docs]))
    bench.start()
    try:
        bench.ingest(bench.router, "router", 2)
        with bench.router.client() as client:
            bench.nodes[1].kill()
            rng = rc.np.random.default_rng(0)
            late = [{"id": f"late-{i}",
                     "tokens": rng.standard_normal((32, 128)).astype(rc.np.float32)}
                    for i in range(30)]
            print("writes while the node is down acknowledged:",
                  all(r.ok for r in client.upsert(rc.COLLECTION, late)))
            bench.nodes[1].start()
            restarted = time.monotonic()
            while True:
                info = client.collection_info(rc.COLLECTION)
                states = [r["state"] for s in info["shards"] for r in s["replicas"]]
                if all(state == "serving" for state in states):
                    break
                time.sleep(0.1)
            print(f"every replica serving {time.monotonic() - restarted:.2f} s after the restart; "
                  f"{info['stats']['documents']} documents")
        for line in bench.router.log().splitlines():
            if "caught up" in line or "catch-up" in line:
                print(line)
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
