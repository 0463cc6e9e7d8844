#!/usr/bin/env bash
# The compose cluster (compose.yaml here) end to end on this machine; outside CI (it builds
# images and starts six containers). Root, with podman and podman-compose:
#   deploy/compose/smoke.sh [--skip-build]
#
# 1. Images: localhost/tessera:latest (deploy/build-image.sh, unless --skip-build and it exists),
#    localhost/etcd:3.4 and localhost/prometheus:2.42 from the Containerfiles here (each built
#    once), so that no registry needs to be reachable.
# 2. Host quirks: without CONTAINERS_CONF in the environment, a containers.conf with the host's
#    hard RLIMIT_NOFILE and runc (when installed) — what sandbox VMs with hybrid cgroups need
#    (deploy/README.md, "This host's podman quirks").
# 3. `podman-compose -p tessera-smoke up -d`; waits until the router answers and three shard
#    nodes are registered in etcd.
# 4. Through the router on 127.0.0.1:50051 with build/bin/tessera: creates a collection of
#    3 shards × 2 replicas, ingests 500 documents, searches (the top hit must be the document the
#    query was made from), and checks `stats --json` (500 documents; every shard on two of
#    shard-0..2, serving).
# 5. Prometheus: every target of prometheus.yml up (router, three shard nodes, etcd, itself).
# 6. Failover: SIGKILLs shard-1's container; the same search answers the same (replication 2),
#    50 more documents are acknowledged and shard-1's replicas are not serving; the container is
#    started again, the router logs both replicas caught up, every replica serves and the cluster
#    holds 550 documents.
# 7. `down -v` (containers and the project's volumes), also on failure (KEEP=1 keeps them).
# Prints each phase's seconds; exits 1 with the router's log on the first failed check.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PROJECT=tessera-smoke
COMPOSE_FILE="$ROOT/deploy/compose/compose.yaml"
CLI="$ROOT/build/bin/tessera"
ADDR=127.0.0.1:50051
SKIP_BUILD=0
for arg in "$@"; do
  case "$arg" in
    --skip-build) SKIP_BUILD=1 ;;
    *) echo "smoke.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
TMP="$(mktemp -d)"
START=$SECONDS
PHASE_START=$SECONDS
TIMINGS=()

log() { echo "compose-smoke: $*" >&2; }
phase_done() { TIMINGS+=("$1: $((SECONDS - PHASE_START))s"); PHASE_START=$SECONDS; }
compose() { podman-compose -p "$PROJECT" -f "$COMPOSE_FILE" "$@"; }
container() { echo "${PROJECT}_$1_1"; }  # podman-compose 1.0's container names
cleanup() {
  if [ "${KEEP:-0}" != 1 ]; then compose down -v -t 30 >/dev/null 2>&1 || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
fail() {
  log "FAIL: $*"
  podman ps -a --filter "label=io.podman.compose.project=$PROJECT" \
    --format '{{.Names}} {{.Status}}' 2>&1 | sed 's/^/  | /' >&2
  podman logs --tail 40 "$(container router)" 2>&1 | sed 's/^/  router | /' >&2
  exit 1
}
# Retries "$@" every second for up to $1 seconds (the first argument), quietly.
wait_for() {
  local seconds="$1"; shift
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 1
  done
}
tessera() { "$CLI" --addr "$ADDR" "$@"; }
http_get() {  # URL → body on stdout (no curl needed)
  /usr/bin/python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"
}

[ "$(id -u)" -eq 0 ] || { log "run as root (rootful podman)"; exit 1; }
command -v podman-compose >/dev/null || { log "needs podman-compose (apt-get install podman-compose)"; exit 1; }
[ -x "$CLI" ] || { log "needs $CLI: build first (cmake --build build)"; exit 1; }

# -- 1. images ------------------------------------------------------------------------------------
if [ "$SKIP_BUILD" = 0 ] || ! podman image exists localhost/tessera:latest; then
  "$ROOT/deploy/build-image.sh"
fi
for image in etcd:3.4 prometheus:2.42; do
  podman image exists "localhost/$image" ||
    podman build --isolation chroot --network host -t "localhost/$image" \
      -f "$ROOT/deploy/compose/${image%%:*}.Containerfile" "$ROOT/deploy/compose" >&2
done
export TESSERA_ETCD_IMAGE=localhost/etcd:3.4 TESSERA_PROMETHEUS_IMAGE=localhost/prometheus:2.42
phase_done "images"

# -- 2. host quirks -------------------------------------------------------------------------------
if [ -z "${CONTAINERS_CONF:-}" ]; then
  hard_nofile="$(ulimit -Hn)"
  [ "$hard_nofile" = unlimited ] && hard_nofile=1048576
  {
    printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=32768:32768"]\n' \
      "$hard_nofile" "$hard_nofile"
    if command -v runc >/dev/null; then printf '[engine]\nruntime = "runc"\n'; fi
  } > "$TMP/containers.conf"
  export CONTAINERS_CONF="$TMP/containers.conf"
fi

# -- 3. up ------------------------------------------------------------------------------------------
compose down -v -t 30 >/dev/null 2>&1 || true  # a previous run's leftovers
compose up -d >"$TMP/up.log" 2>&1 || { cat "$TMP/up.log" >&2; fail "podman-compose up"; }
registered() {
  [ "$(podman exec "$(container etcd)" etcdctl get --prefix --keys-only /tessera/nodes/ |
       grep -c .)" = 3 ]
}
wait_for 120 tessera collections list || fail "the router does not answer on $ADDR"
wait_for 60 registered || fail "three shard nodes not registered in etcd"
phase_done "up"

# -- 4. a collection through the router -------------------------------------------------------------
cd "$TMP"
/usr/bin/python3 - <<'PY'
import numpy as np
rng = np.random.default_rng(0)
unit = lambda x: (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
docs = {f"doc{i:04d}": unit(rng.standard_normal((rng.integers(16, 48), 128))) for i in range(500)}
np.savez("docs.npz", **docs)
np.save("q.npy", unit(docs["doc0042"][:8] + 0.05 * rng.standard_normal((8, 128))))
np.savez("more.npz", **{f"new{i:03d}": unit(rng.standard_normal((20, 128))) for i in range(50)})
PY
tessera collections create papers --dim 128 --shards 3 --replicas 2 >/dev/null ||
  fail "collections create"
tessera ingest papers docs.npz --no-progress >/dev/null || fail "ingest docs.npz"
search() { tessera search papers --query q.npy --k 5 --json; }
search > before.json || fail "search"
# stats --json: the document count, and whether every shard has two replicas on distinct nodes
# of shard-0..2, all serving.
check_stats() {  # DOCUMENTS
  tessera stats papers --json > stats.json &&
    /usr/bin/python3 - "$1" <<'PY'
import json, sys
stats = json.load(open("stats.json"))
shards = stats["shards"]
nodes = [[r["node_id"] for r in s["replicas"]] for s in shards]
ok = (stats["documents"] == int(sys.argv[1]) and len(shards) == 3
      and all(len(set(n)) == 2 and set(n) <= {"shard-0", "shard-1", "shard-2"} for n in nodes)
      and all(r["state"] == "serving" for s in shards for r in s["replicas"]))
sys.exit(0 if ok else 1)
PY
}
/usr/bin/python3 -c '
import json, sys
hits = json.load(open(sys.argv[1]))["results"]
sys.exit(0 if hits and hits[0]["id"] == "doc0042" else 1)' before.json ||
  fail "top hit is not doc0042: $(cat before.json)"
check_stats 500 || fail "stats: $(cat stats.json)"
phase_done "collection"

# -- 5. Prometheus ----------------------------------------------------------------------------------
all_up() {
  http_get http://127.0.0.1:9090/api/v1/targets > targets.json &&
    /usr/bin/python3 -c '
import json, sys
targets = json.load(open("targets.json"))["data"]["activeTargets"]
sys.exit(0 if len(targets) == 6 and all(t["health"] == "up" for t in targets) else 1)'
}
wait_for 90 all_up || fail "Prometheus targets not all up: $(cat targets.json 2>/dev/null)"
phase_done "prometheus"

# -- 6. failover ------------------------------------------------------------------------------------
podman kill "$(container shard-1)" >/dev/null || fail "podman kill shard-1"
search > after.json || fail "search with shard-1 down"
/usr/bin/python3 -c '
import json, sys
strip = lambda f: [(h["id"], h["score"]) for h in json.load(open(f))["results"]]
sys.exit(0 if strip("before.json") == strip("after.json") else 1)' ||
  fail "answers changed with shard-1 down: $(cat before.json) vs $(cat after.json)"
tessera ingest papers more.npz --no-progress >/dev/null || fail "ingest with shard-1 down"
# The writes shard-1 missed: its replicas serve no reads until they have caught up.
tessera stats papers --json > stats.json || fail "stats with shard-1 down"
/usr/bin/python3 -c '
import json, sys
states = [r["state"] for s in json.load(open("stats.json"))["shards"] for r in s["replicas"]
          if r["node_id"] == "shard-1"]
sys.exit(0 if len(states) == 2 and "serving" not in states else 1)' ||
  fail "shard-1's replicas should be down or stale: $(cat stats.json)"
podman start "$(container shard-1)" >/dev/null || fail "podman start shard-1"
wait_for 120 check_stats 550 || fail "replicas not all serving after shard-1 came back: $(cat stats.json)"
podman logs "$(container router)" 2>&1 | grep -c "replica caught up" | grep -qx 2 ||
  fail "the router's log should show shard-1's two replicas caught up"
phase_done "failover"

log "passed in $((SECONDS - START))s (${TIMINGS[*]})"
