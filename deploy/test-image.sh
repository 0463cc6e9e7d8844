#!/usr/bin/env bash
# End-to-end check of the container image (slow; not part of CI):
#   build (deploy/build-image.sh) → run with podman (published ports, a named volume for /data)
#   → wait for the HEALTHCHECK → create a collection, ingest generated documents, search and
#   check the results → restart → data and results still there → SIGTERM → exit code 0.
# Prints PASS or FAIL (exit status 0 or 1) and the time of each phase.
#
#   deploy/test-image.sh [--skip-build]
#
# The client is the image's own `tessera` CLI (podman exec, talking to the server over the
# container's loopback) when the image has it; otherwise, or with TESSERA_TEST_CLIENT=python, a
# small Python gRPC client on this machine (Debian's python3-grpcio, python3-numpy, stubs
# generated with protoc + grpc_python_plugin into a temporary directory) through the published
# port. The Python client always does the final checks through the published port.
#
# Needs, on this machine: podman (build-image.sh installs it) and scripts/setup's python3-numpy,
# python3-grpcio, protobuf-compiler, protobuf-compiler-grpc.
# Environment: TESSERA_IMAGE (default localhost/tessera:latest), TESSERA_TEST_DOCS (300),
# TESSERA_TEST_DIM (64), TESSERA_TEST_CLIENT (auto | cli | python), KEEP=1 keeps the container,
# volume and temporary files for inspection.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
IMAGE="${TESSERA_IMAGE:-localhost/tessera:latest}"
DOCS="${TESSERA_TEST_DOCS:-300}"
DIM="${TESSERA_TEST_DIM:-64}"
CLIENT="${TESSERA_TEST_CLIENT:-auto}"
NAME="tessera-test-$$"
VOLUME="tessera-test-data-$$"
COLLECTION="smoke"
SKIP_BUILD=0
for arg in "$@"; do
  case "$arg" in
    --skip-build) SKIP_BUILD=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "test-image.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

TMP="$(mktemp -d /tmp/tessera-image-test.XXXXXX)"
chmod 0755 "$TMP"
T0=$SECONDS
PHASE_START=$SECONDS
TIMINGS=()
PODMAN=(podman)
RUN_OPTS=()

log() { echo "test-image: $*" >&2; }
phase_done() { TIMINGS+=("$1: $((SECONDS - PHASE_START))s"); PHASE_START=$SECONDS; }
cleanup() {
  if [ "${KEEP:-0}" = 1 ]; then
    log "KEEP=1: container $NAME, volume $VOLUME and $TMP kept"
    return
  fi
  "${PODMAN[@]}" rm -f -t 0 "$NAME" >/dev/null 2>&1
  "${PODMAN[@]}" volume rm -f "$VOLUME" >/dev/null 2>&1
  rm -rf "$TMP"
}
trap cleanup EXIT
fail() {
  log "FAILED: $*"
  if "${PODMAN[@]}" container exists "$NAME" 2>/dev/null; then
    log "last server log lines:"
    "${PODMAN[@]}" logs --tail 30 "$NAME" 2>&1 | sed 's/^/  | /' >&2
  fi
  for t in "${TIMINGS[@]}"; do log "  $t"; done
  echo "FAIL"
  exit 1
}

if [ "$(id -u)" -ne 0 ]; then fail "run as root (rootful podman)"; fi

# -- 1. image ---------------------------------------------------------------------------------
if [ "$SKIP_BUILD" -eq 0 ]; then
  "$ROOT/deploy/build-image.sh" || fail "image build (deploy/build-image.sh)"
fi
podman image exists "$IMAGE" || fail "no image $IMAGE"
log "image $IMAGE: $(podman image inspect --format '{{.Size}}' "$IMAGE" | numfmt --to=iec --suffix=B)"
phase_done "build"

# -- 2. how this host runs containers -----------------------------------------------------------
# Some hosts (sandboxes, VMs with a hybrid cgroup v1/v2 hierarchy, no CAP_SYS_RESOURCE) refuse
# podman's defaults: crun rejects hybrid cgroups, and the default RLIMIT_NOFILE/NPROC may exceed
# the hard limits the runtime may set. Find the first combination that starts a container.
hard_nofile="$(ulimit -Hn)"
[ "$hard_nofile" = unlimited ] && hard_nofile=1048576
limits=(--ulimit "nofile=$hard_nofile:$hard_nofile" --ulimit "nproc=32768:32768")
probe() {  # probe GLOBAL_OPTS... -- RUN_OPTS...
  local global=() run=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do global+=("$1"); shift; done
  shift
  run=("$@")
  if podman "${global[@]}" run --rm --entrypoint /bin/true "${run[@]}" "$IMAGE" >/dev/null 2>&1; then
    PODMAN=(podman "${global[@]}"); RUN_OPTS=("${run[@]}"); return 0
  fi
  return 1
}
if ! { probe -- || probe -- "${limits[@]}" ||
       { command -v runc >/dev/null && { probe --runtime runc -- ||
                                         probe --runtime runc -- "${limits[@]}"; }; }; }; then
  log "podman cannot start a container with its defaults; installing runc and retrying"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runc >/dev/null 2>&1
  probe --runtime runc -- || probe --runtime runc -- "${limits[@]}" ||
    fail "podman cannot start a container here (tried crun/runc, default/host ulimits)"
fi
log "podman options: ${PODMAN[*]:1} run ${RUN_OPTS[*]}"

http_get() {  # URL → body on stdout; fails on a non-2xx status (no curl needed)
  /usr/bin/python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())' "$1" 2>/dev/null
}
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
GRPC_PORT="$(free_port)"
METRICS_PORT="$(free_port)"
while [ "$METRICS_PORT" = "$GRPC_PORT" ]; do METRICS_PORT="$(free_port)"; done
phase_done "probe"

# -- 3. test data and the Python client ----------------------------------------------------------
mkdir -p "$TMP/stubs" "$TMP/in"
chmod 0777 "$TMP/in"  # the CLI (uid 10001 in the container) keeps its ingest journal next to the .npz
protoc -I "$ROOT/proto" --python_out="$TMP/stubs" --grpc_python_out="$TMP/stubs" \
  --plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin "$ROOT"/proto/tessera/v1/*.proto \
  || fail "protoc could not generate the Python stubs (apt-get install protobuf-compiler protobuf-compiler-grpc)"
touch "$TMP/stubs/tessera/__init__.py" "$TMP/stubs/tessera/v1/__init__.py"

cat >"$TMP/check.py" <<'PY'
"""The test's data generator, Python gRPC client and result checks."""
import json
import sys
import time

import numpy as np


def stubs():
    import grpc
    from tessera.v1 import admin_pb2, admin_pb2_grpc, common_pb2, ingest_pb2, ingest_pb2_grpc
    from tessera.v1 import query_pb2, query_pb2_grpc
    return grpc, admin_pb2, admin_pb2_grpc, common_pb2, ingest_pb2, ingest_pb2_grpc, query_pb2, query_pb2_grpc


def unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def generate(directory, docs, dim):
    """docs.npz (one array per document, key = id), queries q<i>.npy made from a document's own
    tokens plus noise, and expected.json: query file → the document it came from."""
    rng = np.random.default_rng(20240601)
    arrays = {f"doc{i:05d}": unit(rng.standard_normal((int(rng.integers(16, 48)), dim)))
              for i in range(docs)}
    np.savez(f"{directory}/docs.npz", **arrays)
    expected = {}
    for q, i in enumerate(rng.choice(docs, size=12, replace=False)):
        tokens = arrays[f"doc{i:05d}"]
        pick = rng.choice(len(tokens), size=min(8, len(tokens)), replace=False)
        query = unit(tokens[pick] + 0.05 * rng.standard_normal((len(pick), dim)))
        np.save(f"{directory}/q{q}.npy", query)
        expected[f"q{q}.npy"] = f"doc{i:05d}"
    json.dump(expected, open(f"{directory}/expected.json", "w"), indent=1)


class Client:
    def __init__(self, address):
        (self.grpc, self.admin_pb2, admin_grpc, self.common_pb2, self.ingest_pb2, ingest_grpc,
         self.query_pb2, query_grpc) = stubs()
        self.channel = self.grpc.insecure_channel(address, options=[
            ("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)])
        self.grpc.channel_ready_future(self.channel).result(timeout=30)
        self.admin = admin_grpc.AdminServiceStub(self.channel)
        self.ingest_stub = ingest_grpc.IngestServiceStub(self.channel)
        self.query = query_grpc.QueryServiceStub(self.channel)

    def matrix(self, array):
        array = np.ascontiguousarray(array, dtype="<f4")
        return self.common_pb2.Matrix(rows=array.shape[0], cols=array.shape[1],
                                      dtype=self.common_pb2.DTYPE_FLOAT32, data=array.tobytes())

    def create(self, name, dim):
        schema = self.admin_pb2.CollectionSchema(
            name=name, dim=dim, hierarchical=self.admin_pb2.HierarchicalPooling(pool_factor=2))
        self.admin.CreateCollection(self.admin_pb2.CreateCollectionRequest(schema=schema), timeout=30)

    def ingest(self, name, npz, batch=50):
        data = np.load(npz)
        ids = sorted(data.files)
        requests = (self.ingest_pb2.UpsertRequest(collection=name, documents=[
            self.ingest_pb2.Document(id=i.encode(), tokens=self.matrix(data[i]))
            for i in ids[start:start + batch]]) for start in range(0, len(ids), batch))
        stored = 0
        for response in self.ingest_stub.Upsert(requests, timeout=300):
            for result in response.results:
                if result.code != 0:
                    raise SystemExit(f"document {result.id!r} rejected: {result.code} {result.message}")
                stored += 1
        if stored != len(ids):
            raise SystemExit(f"{stored} of {len(ids)} documents acknowledged")
        return stored

    def search(self, name, query, k=10, exhaustive=False):
        response = self.query.Search(self.query_pb2.SearchRequest(
            collection=name, query=self.matrix(query), k=k, exhaustive=exhaustive), timeout=60)
        return {"results": [{"id": h.id.decode(), "score": h.score} for h in response.hits],
                "timings_ms": {"total_ms": response.timings.total_ms}}

    def documents(self, name):
        response = self.admin.GetCollection(self.admin_pb2.GetCollectionRequest(name=name), timeout=30)
        return int(response.stats.documents)


def find_key(value, key):
    """The first value of `key` anywhere in parsed JSON (the CLI's stats layout may nest it)."""
    if isinstance(value, dict):
        if key in value:
            return value[key]
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            found = find_key(item, key)
            if found is not None:
                return found
    return None


def check_search(directory, results_by_query, k):
    """Every query's top hit is the document it was made from; k results, best first."""
    expected = json.load(open(f"{directory}/expected.json"))
    problems = []
    for query, doc in expected.items():
        hits = results_by_query[query]["results"]
        scores = [h["score"] for h in hits]
        if len(hits) != k:
            problems.append(f"{query}: {len(hits)} results, expected {k}")
        if not hits or hits[0]["id"] != doc:
            problems.append(f"{query}: top hit {hits[0]['id'] if hits else None}, expected {doc}")
        if scores != sorted(scores, reverse=True):
            problems.append(f"{query}: scores not in descending order")
    return problems


def main():
    command, directory = sys.argv[1], sys.argv[2]
    if command == "generate":
        generate(directory, int(sys.argv[3]), int(sys.argv[4]))
        return
    if command == "check-cli":  # search results and stats the CLI printed as JSON
        expected = json.load(open(f"{directory}/expected.json"))
        results = {q: json.load(open(f"{directory}/cli-{q}.json")) for q in expected}
        problems = check_search(directory, results, int(sys.argv[3]))
        documents = find_key(json.load(open(f"{directory}/cli-stats.json")), "documents")
        if documents is None or int(documents) != int(sys.argv[4]):
            problems.append(f"CLI stats: documents {documents}, expected {sys.argv[4]}")
        json.dump(results, open(f"{directory}/results-cli.json", "w"))
        if problems:
            raise SystemExit("; ".join(problems))
        print(f"CLI: {len(results)} searches correct, stats says {documents} documents")
        return
    address, name = sys.argv[3], sys.argv[4]
    client = Client(address)
    if command == "create":
        client.create(name, int(sys.argv[5]))
    elif command == "ingest":
        start = time.monotonic()
        stored = client.ingest(name, f"{directory}/docs.npz")
        print(f"ingested {stored} documents in {time.monotonic() - start:.2f}s")
    elif command == "verify":  # documents, searches; saves results under the given label
        docs, k, label = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
        problems = []
        if client.documents(name) != docs:
            problems.append(f"collection has {client.documents(name)} documents, expected {docs}")
        expected = json.load(open(f"{directory}/expected.json"))
        results = {q: client.search(name, np.load(f"{directory}/{q}"), k) for q in expected}
        problems += check_search(directory, results, k)
        exhaustive = {q: client.search(name, np.load(f"{directory}/{q}"), k, exhaustive=True)
                      for q in expected}
        for q in expected:  # the cascade with N ≥ collection size equals exhaustive MaxSim
            if [h["id"] for h in exhaustive[q]["results"]][:1] != [h["id"] for h in results[q]["results"]][:1]:
                problems.append(f"{q}: cascade and exhaustive disagree on the top hit")
        json.dump(results, open(f"{directory}/results-{label}.json", "w"))
        if len(sys.argv) > 8:  # compare with an earlier run: same ids, same scores
            before = json.load(open(f"{directory}/results-{sys.argv[8]}.json"))
            for q in expected:
                a = [(h["id"], round(h["score"], 4)) for h in before[q]["results"]]
                b = [(h["id"], round(h["score"], 4)) for h in results[q]["results"]]
                if a != b:
                    problems.append(f"{q}: results differ from {sys.argv[8]}")
        if problems:
            raise SystemExit("; ".join(problems))
        median = float(np.median([r["timings_ms"]["total_ms"] for r in results.values()]))
        print(f"{docs} documents, {len(results)} searches correct (median server time {median:.2f} ms)")


if __name__ == "__main__":
    main()
PY
py() { PYTHONPATH="$TMP/stubs" /usr/bin/python3 "$TMP/check.py" "$@"; }
py generate "$TMP/in" "$DOCS" "$DIM" || fail "generating test data (python3-numpy?)"
phase_done "data"

# -- 4. run, health -----------------------------------------------------------------------------
start_container() {
  # Without systemd, podman reports that it cannot schedule the HEALTHCHECK timer: harmless here,
  # wait_healthy runs the check itself.
  "${PODMAN[@]}" start "$NAME" >/dev/null 2>"$TMP/podman-start.log" || {
    cat "$TMP/podman-start.log" >&2; return 1; }
}
wait_healthy() {  # the image's own HEALTHCHECK, then /healthz through the published port
  local deadline=$((SECONDS + 90)) state
  while [ $SECONDS -lt $deadline ]; do
    state="$("${PODMAN[@]}" inspect --format '{{.State.Status}}' "$NAME" 2>/dev/null)"
    if [ "$state" = exited ]; then log "container exited"; return 1; fi
    if "${PODMAN[@]}" healthcheck run "$NAME" >/dev/null 2>&1 &&
       http_get "http://127.0.0.1:$METRICS_PORT/healthz" >/dev/null; then
      return 0
    fi
    sleep 0.5
  done
  log "not healthy after 90s"
  return 1
}
stop_with_sigterm() {  # SIGTERM, wait; the exit code must be 0
  "${PODMAN[@]}" kill --signal TERM "$NAME" >/dev/null || return 1
  local code
  code="$(timeout 60 "${PODMAN[@]}" wait "$NAME")" || { log "did not exit within 60s of SIGTERM"; return 1; }
  if [ "$code" != 0 ]; then log "exit code $code after SIGTERM"; return 1; fi
  "${PODMAN[@]}" logs --tail 3 "$NAME" 2>&1 | sed 's/^/  | /' >&2
  return 0
}

"${PODMAN[@]}" volume create "$VOLUME" >/dev/null || fail "podman volume create"
"${PODMAN[@]}" create --name "$NAME" "${RUN_OPTS[@]}" \
  -p "127.0.0.1:$GRPC_PORT:50051" -p "127.0.0.1:$METRICS_PORT:9464" \
  -v "$VOLUME:/data" -v "$TMP/in:/in" \
  "$IMAGE" --insecure >/dev/null || fail "podman create"  # ports published on loopback only
start_container || fail "podman start"
wait_healthy || fail "health check after the first start"
log "healthy; grpc on 127.0.0.1:$GRPC_PORT, metrics on 127.0.0.1:$METRICS_PORT"
user="$("${PODMAN[@]}" exec "$NAME" id -un)"
[ "$user" = tessera ] || fail "server runs as '$user', expected tessera"
phase_done "start"

# -- 5. create, ingest, search ------------------------------------------------------------------
if [ "$CLIENT" = auto ]; then
  if "${PODMAN[@]}" exec "$NAME" sh -c 'command -v tessera' >/dev/null 2>&1; then CLIENT=cli; else CLIENT=python; fi
fi
log "client: $CLIENT"
K=10
if [ "$CLIENT" = cli ]; then
  cli() { "${PODMAN[@]}" exec "$NAME" tessera --addr 127.0.0.1:50051 "$@"; }
  cli collections create "$COLLECTION" --dim "$DIM" || fail "tessera collections create"
  cli ingest "$COLLECTION" /in/docs.npz </dev/null 2>&1 | tail -n 3 >&2
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail "tessera ingest"
  for q in $(/usr/bin/python3 -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))))' "$TMP/in/expected.json"); do
    cli search "$COLLECTION" --query "/in/$q" --k "$K" --json >"$TMP/in/cli-$q.json" ||
      fail "tessera search --query $q"
  done
  cli stats "$COLLECTION" --json >"$TMP/in/cli-stats.json" || fail "tessera stats"
  py check-cli "$TMP/in" "$K" "$DOCS" || fail "CLI search results"
else
  py create "$TMP/in" "127.0.0.1:$GRPC_PORT" "$COLLECTION" "$DIM" || fail "CreateCollection"
  py ingest "$TMP/in" "127.0.0.1:$GRPC_PORT" "$COLLECTION" || fail "Upsert"
fi
py verify "$TMP/in" "127.0.0.1:$GRPC_PORT" "$COLLECTION" "$DOCS" "$K" first ||
  fail "search results through the published port"
http_get "http://127.0.0.1:$METRICS_PORT/metrics" | grep -q "tessera_documents{collection=\"$COLLECTION\"} $DOCS" ||
  fail "/metrics has no tessera_documents{collection=\"$COLLECTION\"} $DOCS"
phase_done "ingest+search ($CLIENT)"

# -- 6. restart: SIGTERM (exit 0), start, same data ----------------------------------------------
stop_with_sigterm || fail "first stop"
start_container || fail "restart"
wait_healthy || fail "health check after the restart"
py verify "$TMP/in" "127.0.0.1:$GRPC_PORT" "$COLLECTION" "$DOCS" "$K" restarted first ||
  fail "data or results changed across the restart"
phase_done "restart"

# -- 7. final SIGTERM ---------------------------------------------------------------------------
stop_with_sigterm || fail "final stop"
phase_done "stop"

for t in "${TIMINGS[@]}"; do log "  $t"; done
log "total $((SECONDS - T0))s"
echo "PASS"
