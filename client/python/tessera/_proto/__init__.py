"""Protobuf and gRPC stubs generated from proto/tessera/v1/*.proto by generate_stubs.sh.

The generated files live in tessera/_proto/tessera/v1/ (gitignored in the source tree, shipped in
wheels). When the package is imported from a source checkout whose stubs are missing or older than
the protos, they are generated here on first import.
"""

import os
import subprocess

_HERE = os.path.dirname(os.path.abspath(__file__))
_SCRIPT = os.path.join(_HERE, "..", "..", "generate_stubs.sh")
_PROTO_DIR = os.path.join(_HERE, "..", "..", "..", "..", "proto", "tessera", "v1")
_GENERATED = os.path.join(_HERE, "tessera", "v1")


def _stale():
    if not os.path.isfile(os.path.join(_GENERATED, "query_pb2_grpc.py")):
        return True
    if not os.path.isdir(_PROTO_DIR):
        return False
    newest_proto = max((os.path.getmtime(os.path.join(_PROTO_DIR, f))
                        for f in os.listdir(_PROTO_DIR) if f.endswith(".proto")), default=0)
    oldest_stub = min(os.path.getmtime(os.path.join(_GENERATED, f))
                      for f in os.listdir(_GENERATED) if f.endswith(".py"))
    return newest_proto > oldest_stub


if os.path.isfile(_SCRIPT) and _stale():
    subprocess.run(["bash", _SCRIPT], check=False)

try:
    from tessera._proto.tessera.v1 import common_pb2  # noqa: F401
    from tessera._proto.tessera.v1 import admin_pb2, admin_pb2_grpc  # noqa: F401
    from tessera._proto.tessera.v1 import ingest_pb2, ingest_pb2_grpc  # noqa: F401
    from tessera._proto.tessera.v1 import query_pb2, query_pb2_grpc  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the installation
    raise ImportError(
        "tessera: generated protobuf stubs are missing; run client/python/generate_stubs.sh "
        "(needs Debian's protobuf-compiler and protobuf-compiler-grpc)") from error
