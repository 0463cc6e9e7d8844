#!/usr/bin/env bash
# Builds the wheel of client/python (python3 -m build --no-isolation: Debian's python3-build and
# python3-setuptools, nothing downloaded) and installs it into a fresh virtual environment, so that
# tests can import the package a user installs rather than the source tree.
#   client/python/build_wheel.sh OUT_DIR
# leaves OUT_DIR/dist/tessera_client-*.whl and OUT_DIR/venv (with --system-site-packages: numpy,
# grpcio and protobuf come from Debian's python3-* packages; pip checks the wheel's dependencies
# against them with --no-index). The build runs in a copy of client/python under OUT_DIR, leaving
# no build/ or *.egg-info in the source tree.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="$(mkdir -p "$1" && cd "$1" && pwd)"
PYTHON="${PYTHON:-/usr/bin/python3}"

bash "$HERE/generate_stubs.sh"  # the copy has no proto/: setup.py then uses these stubs
rm -rf "$OUT/src" "$OUT/dist" "$OUT/venv"
mkdir -p "$OUT/src"
cp -r "$HERE/pyproject.toml" "$HERE/setup.py" "$HERE/README.md" "$HERE/generate_stubs.sh" \
  "$HERE/tessera" "$OUT/src/"
find "$OUT/src" \( -name __pycache__ -o -name '.gen.*' \) -prune -exec rm -rf {} +
"$PYTHON" -m build --no-isolation --wheel --outdir "$OUT/dist" "$OUT/src" >"$OUT/build.log" 2>&1 ||
  { cat "$OUT/build.log" >&2; exit 1; }
WHEEL="$(ls "$OUT"/dist/tessera_client-*.whl)"
"$PYTHON" -m venv --system-site-packages "$OUT/venv"
"$OUT/venv/bin/python" -m pip install --quiet --no-index --disable-pip-version-check "$WHEEL"

# The wheel ships the typing marker, the messages' stubs and every module.
"$PYTHON" - "$WHEEL" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
for needed in ("tessera/py.typed", "tessera/aio.py", "tessera/pylate.py", "tessera/_convert.py",
               "tessera/_proto/tessera/v1/query_pb2.py", "tessera/_proto/tessera/v1/query_pb2.pyi",
               "tessera/_proto/tessera/v1/query_pb2_grpc.py"):
    if needed not in names:
        sys.exit(f"{sys.argv[1]}: no {needed}")
PY
cd "$OUT" && "$OUT/venv/bin/python" -c "
import os, tessera
where = os.path.realpath(tessera.__file__)
assert where.startswith(os.path.realpath('$OUT/venv')), where
print('installed', tessera.__version__, 'from', os.path.basename('$WHEEL'), 'in $OUT/venv')"
