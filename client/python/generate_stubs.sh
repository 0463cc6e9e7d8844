#!/usr/bin/env bash
# Generates the Python protobuf and gRPC stubs of proto/tessera/v1/*.proto into
# tessera/_proto/tessera/v1/ (gitignored), with the messages' type stubs (.pyi, for mypy). Uses
# Debian's protoc and grpc_python_plugin (packages protobuf-compiler, protobuf-compiler-grpc); no
# grpcio-tools needed.
#   client/python/generate_stubs.sh [PROTO_ROOT]   (default: the repository's proto/)
# The generated modules import each other as `tessera.v1.*`, which would collide with this
# package's own name, so the imports are rewritten to `tessera._proto.tessera.v1.*`.
# Safe to run concurrently: files are generated in a temporary directory and moved into place.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PROTO_ROOT="${1:-$HERE/../../proto}"
OUT="$HERE/tessera/_proto"
PROTOC="${PROTOC:-protoc}"
PLUGIN="${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin || echo /usr/bin/grpc_python_plugin)}"

if [ ! -d "$PROTO_ROOT/tessera/v1" ]; then
  if [ -f "$OUT/tessera/v1/query_pb2.py" ]; then exit 0; fi  # an sdist with stubs already in it
  echo "generate_stubs.sh: no $PROTO_ROOT/tessera/v1 and no generated stubs" >&2
  exit 1
fi
if [ ! -x "$PLUGIN" ]; then
  echo "generate_stubs.sh: grpc_python_plugin not found (apt-get install protobuf-compiler-grpc)" >&2
  exit 1
fi

TMP="$(mktemp -d "$OUT/.gen.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
"$PROTOC" -I "$PROTO_ROOT" --python_out="$TMP" --pyi_out="$TMP" --grpc_python_out="$TMP" \
  --plugin=protoc-gen-grpc_python="$PLUGIN" "$PROTO_ROOT"/tessera/v1/*.proto
sed -i -e 's/^from tessera\.v1 import/from tessera._proto.tessera.v1 import/' \
  -e 's/^import tessera\.v1\./import tessera._proto.tessera.v1./' "$TMP"/tessera/v1/*.py \
  "$TMP"/tessera/v1/*.pyi
touch "$TMP/tessera/__init__.py" "$TMP/tessera/v1/__init__.py"

mkdir -p "$OUT/tessera/v1"
[ -f "$OUT/tessera/__init__.py" ] || mv -f "$TMP/tessera/__init__.py" "$OUT/tessera/"
for f in "$TMP"/tessera/v1/*.py "$TMP"/tessera/v1/*.pyi; do
  name="$(basename "$f")"
  if cmp -s "$f" "$OUT/tessera/v1/$name"; then touch "$OUT/tessera/v1/$name"; else mv -f "$f" "$OUT/tessera/v1/$name"; fi
done
