"""Requests and results of the snapshot RPCs, shared by `Client` and `AsyncClient`.

A snapshot id names its collection ("papers@20261206T030455Z-1f0c9a2b"). An archive (what
`download_snapshot` writes) is the single-stream format of index/include/tessera/snapshot.h; a
restore verifies every file's CRC-32 before the new collection opens.
"""

import contextlib
import os
from typing import Any, BinaryIO, Dict, Iterator, List

from tessera import _convert
from tessera._proto.tessera.v1 import admin_pb2

CHUNK_BYTES = 1 << 20


def info_dict(info: Any) -> Dict[str, Any]:
    """A SnapshotInfo → {id, collection, created_unix_micros, num_shards, files, bytes,
    cut_seconds (how long the collection's writes waited for the snapshot's cut)}."""
    return {
        "id": info.id,
        "collection": info.collection,
        "created_unix_micros": info.created_unix_micros,
        "num_shards": info.num_shards,
        "files": info.files,
        "bytes": info.bytes,
        "cut_seconds": info.cut_seconds,
    }


def create_request(collection: str) -> Any:
    return admin_pb2.CreateSnapshotRequest(collection=collection)


def list_request(collection: str) -> Any:
    return admin_pb2.ListSnapshotsRequest(collection=collection)


def list_result(response: Any) -> List[Dict[str, Any]]:
    return [info_dict(info) for info in response.snapshots]


def delete_request(snapshot_id: str) -> Any:
    return admin_pb2.DeleteSnapshotRequest(id=snapshot_id)


def download_request(snapshot_id: str) -> Any:
    return admin_pb2.DownloadSnapshotRequest(id=snapshot_id)


class Download:
    """An archive being written by `download_snapshot`, a DownloadSnapshot chunk at a time."""

    def __init__(self, out: BinaryIO):
        self._out = out
        self.written = 0  # bytes

    def write(self, chunk: Any) -> None:
        self._out.write(chunk.data)
        self.written += len(chunk.data)


@contextlib.contextmanager
def download_to(path: str) -> Iterator[Download]:
    """The archive's file at `path`, removed again when the block fails (a gRPC error raised as
    TesseraError)."""
    try:
        with _convert.tessera_errors(), open(path, "wb") as out:
            yield Download(out)
    except BaseException:
        _remove_quietly(path)
        raise


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def restore_by_id_requests(snapshot_id: str, new_name: str) -> Iterator[Any]:
    yield admin_pb2.RestoreSnapshotRequest(new_collection=new_name, snapshot_id=snapshot_id)


def restore_from_file_requests(path: str, new_name: str) -> Iterator[Any]:
    """The archive at `path`, a chunk per message; the first names the new collection."""
    with open(path, "rb") as archive:
        first = True
        while True:
            data = archive.read(CHUNK_BYTES)
            if not data and not first:
                return
            if first:
                yield admin_pb2.RestoreSnapshotRequest(new_collection=new_name, data=data)
                first = False
            else:
                yield admin_pb2.RestoreSnapshotRequest(data=data)
            if not data:
                return
