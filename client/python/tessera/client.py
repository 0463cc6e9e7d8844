"""The Python client of a Tessera server: numpy arrays in, numpy arrays out.

`Client` wraps the three public gRPC services of `tessera.v1` (AdminService, IngestService,
QueryService). Token matrices travel as packed little-endian fp32 or fp16 bytes with their shape;
`Client` converts them from and to `np.ndarray` (n_tokens × dim, row-major). Every gRPC error is
raised as `TesseraError`, which carries the status code and the server's message.

A `Client` owns one gRPC channel and is thread-safe (gRPC channels and stubs are).
"""

import dataclasses
import math
import os
import sys
import threading
import time
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from tessera._proto.tessera.v1 import admin_pb2, admin_pb2_grpc
from tessera._proto.tessera.v1 import common_pb2
from tessera._proto.tessera.v1 import ingest_pb2, ingest_pb2_grpc
from tessera._proto.tessera.v1 import query_pb2, query_pb2_grpc

__all__ = [
    "Client", "TesseraError", "DocumentResult", "Hit", "TokenMatch", "SearchResult",
    "IngestSummary", "Group", "ScrollPage",
]

# google.rpc.Code number → grpc.StatusCode.
_STATUS_BY_NUMBER = {status.value[0]: status for status in grpc.StatusCode}


class TesseraError(Exception):
    """A failed call: `code` is a `grpc.StatusCode`, `message` the server's explanation."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "TesseraError":
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code if code is not None else grpc.StatusCode.UNKNOWN, details or "")


@dataclasses.dataclass
class DocumentResult:
    """The outcome of one upserted document; `code` is a google.rpc.Code number (0 = stored)."""
    id: str
    code: int
    message: str
    version: int
    num_vectors: int

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def status(self) -> grpc.StatusCode:
        return _STATUS_BY_NUMBER.get(self.code, grpc.StatusCode.UNKNOWN)


@dataclasses.dataclass
class TokenMatch:
    """For one query token: the best document vector, its similarity and the tokens it pools."""
    query_token: int
    document_vector: int
    similarity: float
    covered_tokens: List[int]


@dataclasses.dataclass
class Hit:
    id: str
    score: float
    version: int
    explanation: List[TokenMatch] = dataclasses.field(default_factory=list)
    # With search(with_attributes=…): the document's attributes (all, or the fields named).
    attributes: Dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Group:
    """One group of a grouped search (search(group_by=FIELD)): the field's value and the best
    hits sharing it, best first."""
    value: Any
    hits: List[Hit]


@dataclasses.dataclass
class ScrollPage:
    """One page of scroll(): documents as {id, version, attributes}, ascending by id, and the
    `after` of the next page (None when this page reached the end)."""
    documents: List[Dict[str, Any]]
    next_after: Optional[str]


class SearchResult(list):
    """The hits of one search, best first, with `timings` (ms per stage), `documents_scored`,
    `exhaustive` and `missing_shards` (from a router, with allow_partial_results: the shards
    that no replica answered for, whose hits are missing)."""

    def __init__(self, hits=(), timings=None, documents_scored=0, exhaustive=False,
                 missing_shards=()):
        super().__init__(hits)
        self.timings: Dict[str, float] = timings or {}
        self.documents_scored: int = documents_scored
        self.exhaustive: bool = exhaustive
        self.missing_shards: List[int] = list(missing_shards)
        # A grouped search (group_by): its groups, best first; the list of hits is then empty.
        self.groups: List[Group] = []

    @property
    def ids(self) -> List[str]:
        return [hit.id for hit in self]

    @property
    def scores(self) -> np.ndarray:
        return np.array([hit.score for hit in self], dtype=np.float32)


@dataclasses.dataclass
class IngestSummary:
    """What `Client.ingest` did: documents sent, stored, and the results of those that failed."""
    documents: int
    stored: int
    failed: List[DocumentResult]
    seconds: float


# ---------------------------------------------------------------------------------------------
# Conversions between numpy / Python values and the protocol's messages.

_DTYPE_NAMES = {
    "fp16": common_pb2.DTYPE_FLOAT16, "float16": common_pb2.DTYPE_FLOAT16,
    "half": common_pb2.DTYPE_FLOAT16,
    "fp32": common_pb2.DTYPE_FLOAT32, "float32": common_pb2.DTYPE_FLOAT32,
    "float": common_pb2.DTYPE_FLOAT32,
}
_WIRE_NUMPY = {common_pb2.DTYPE_FLOAT32: np.dtype("<f4"), common_pb2.DTYPE_FLOAT16: np.dtype("<f2")}
_DTYPE_LABEL = {common_pb2.DTYPE_FLOAT32: "fp32", common_pb2.DTYPE_FLOAT16: "fp16"}

_ATTRIBUTE_TYPES = {
    "int64": common_pb2.ATTRIBUTE_TYPE_INT64, "int": common_pb2.ATTRIBUTE_TYPE_INT64,
    int: common_pb2.ATTRIBUTE_TYPE_INT64,
    "double": common_pb2.ATTRIBUTE_TYPE_DOUBLE, "float": common_pb2.ATTRIBUTE_TYPE_DOUBLE,
    float: common_pb2.ATTRIBUTE_TYPE_DOUBLE,
    "string": common_pb2.ATTRIBUTE_TYPE_STRING, "str": common_pb2.ATTRIBUTE_TYPE_STRING,
    str: common_pb2.ATTRIBUTE_TYPE_STRING,
}

_METHODS = {
    "ward": admin_pb2.HierarchicalPooling.METHOD_WARD,
    "reference": admin_pb2.HierarchicalPooling.METHOD_REFERENCE,
}
_SPATIAL_MODES = {
    "rows": admin_pb2.SpatialPooling.MODE_ROWS,
    "columns": admin_pb2.SpatialPooling.MODE_COLUMNS,
    "tiles": admin_pb2.SpatialPooling.MODE_TILES,
    "row_windows": admin_pb2.SpatialPooling.MODE_ROW_WINDOWS,
    "global": admin_pb2.SpatialPooling.MODE_GLOBAL,
}
_CANDIDATE_KINDS = {
    "pooled": admin_pb2.CandidateVectors.KIND_POOLED,
    "global_mean": admin_pb2.CandidateVectors.KIND_GLOBAL_MEAN,
}
_OPS = {
    "==": common_pb2.Condition.OP_EQ, "=": common_pb2.Condition.OP_EQ,
    "!=": common_pb2.Condition.OP_NE, "<": common_pb2.Condition.OP_LT,
    "<=": common_pb2.Condition.OP_LE, ">": common_pb2.Condition.OP_GT,
    ">=": common_pb2.Condition.OP_GE, "in": common_pb2.Condition.OP_IN,
    "exists": common_pb2.Condition.OP_EXISTS, "missing": common_pb2.Condition.OP_MISSING,
    "prefix": common_pb2.Condition.OP_PREFIX,
}
_NO_VALUE_OPS = (common_pb2.Condition.OP_EXISTS, common_pb2.Condition.OP_MISSING)
_FILTER_KEYS = frozenset(("all_of", "any_of", "none_of"))


def _lookup(table: Mapping, key, what: str):
    normalized = key.lower() if isinstance(key, str) else key
    if normalized not in table:
        names = sorted(k for k in table if isinstance(k, str))
        raise ValueError(f"{what} {key!r}, expected one of {names}")
    return table[normalized]


def _wire_dtype(dtype) -> int:
    """A dtype given as a name ("fp16"), a numpy dtype or a DType number → DType number."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return dtype
    if isinstance(dtype, str):
        return _lookup(_DTYPE_NAMES, dtype, "dtype")
    numpy_dtype = np.dtype(dtype)
    if numpy_dtype == np.float16:
        return common_pb2.DTYPE_FLOAT16
    if numpy_dtype == np.float32:
        return common_pb2.DTYPE_FLOAT32
    raise ValueError(f"dtype {dtype!r}, expected fp16 or fp32")


def encode_matrix(array, dtype=None) -> common_pb2.Matrix:
    """An n × dim array → Matrix. `dtype` (fp16/fp32) picks the wire type; by default float16
    arrays travel as fp16 and everything else as fp32."""
    values = np.asarray(array)
    if values.dtype.kind not in "iuf":
        raise TypeError(f"token matrix of dtype {values.dtype}, expected a float (or integer) "
                        "array, n_tokens × dim")
    if values.ndim != 2:
        raise ValueError(f"token matrix of shape {values.shape}, expected 2-D (n_tokens × dim)")
    if dtype is None:
        wire = common_pb2.DTYPE_FLOAT16 if values.dtype == np.float16 else common_pb2.DTYPE_FLOAT32
    else:
        wire = _wire_dtype(dtype)
    packed = np.ascontiguousarray(values, dtype=_WIRE_NUMPY[wire])
    return common_pb2.Matrix(rows=values.shape[0], cols=values.shape[1], dtype=wire,
                             data=packed.tobytes())


def decode_matrix(matrix: common_pb2.Matrix) -> np.ndarray:
    """Matrix → float32 array of shape rows × cols."""
    if matrix.dtype not in _WIRE_NUMPY:
        raise TesseraError(grpc.StatusCode.INTERNAL, f"matrix dtype {matrix.dtype} is unknown")
    values = np.frombuffer(matrix.data, dtype=_WIRE_NUMPY[matrix.dtype])
    return values.astype(np.float32).reshape(matrix.rows, matrix.cols)


def _id_is_bytes(message_type, field="id") -> bool:
    return message_type.DESCRIPTOR.fields_by_name[field].type == \
        message_type.DESCRIPTOR.fields_by_name[field].TYPE_BYTES


# Document ids are UTF-8 strings; should the protocol carry them as `bytes` (so that the server,
# not the protobuf runtime, judges their encoding), str ids are encoded here and decoded back.
_IDS_AS_BYTES = _id_is_bytes(ingest_pb2.Document)


def _wire_id(doc_id):
    if _IDS_AS_BYTES and isinstance(doc_id, str):
        return doc_id.encode("utf-8")
    return doc_id


def _python_id(doc_id):
    if isinstance(doc_id, bytes):
        return doc_id.decode("utf-8", "backslashreplace")
    return doc_id


def _short_repr(value, limit: int = 60) -> str:
    """repr(value) for a message, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _attribute_value(value, where: str = "attribute value") -> common_pb2.AttributeValue:
    """int (or bool, numpy integer), float (numpy floating) or str → AttributeValue; anything else
    is a TypeError naming `where` (e.g. "document 3 ('a'): attribute 'year'")."""
    if isinstance(value, (bool, int, np.integer)):
        return common_pb2.AttributeValue(int_value=int(value))
    if isinstance(value, (float, np.floating)):
        return common_pb2.AttributeValue(double_value=float(value))
    if isinstance(value, str):
        return common_pb2.AttributeValue(string_value=value)
    raise TypeError(f"{where} is {type(value).__name__} ({_short_repr(value)}); expected int, "
                    "float or str")


def _python_value(value: common_pb2.AttributeValue):
    which = value.WhichOneof("value")
    return getattr(value, which) if which else None


def _patch_grid(layout, where: str = "layout") -> Optional[common_pb2.PatchGrid]:
    """None, a PatchGrid, a dict {rows, cols, prefix[_tokens]?, suffix[_tokens]?} or a sequence
    (rows, cols[, prefix, suffix]) of non-negative ints → PatchGrid; anything else raises a
    TypeError (ValueError for a negative number or a sequence of another length) naming `where`."""
    if layout is None:
        return None
    if isinstance(layout, common_pb2.PatchGrid):
        return layout
    expected = "expected (rows, cols[, prefix, suffix]) or {'rows', 'cols', 'prefix', 'suffix'}"
    if isinstance(layout, Mapping):
        missing = [key for key in ("rows", "cols") if key not in layout]
        if missing:
            raise TypeError(f"{where} {_short_repr(layout)} has no {missing[0]!r}; {expected}")
        parts = [layout["rows"], layout["cols"],
                 layout.get("prefix_tokens", layout.get("prefix", 0)),
                 layout.get("suffix_tokens", layout.get("suffix", 0))]
    elif isinstance(layout, (str, bytes)) or not isinstance(layout, Iterable):
        raise TypeError(f"{where} is {type(layout).__name__} ({_short_repr(layout)}); {expected}")
    else:
        parts = list(layout)
        if not 2 <= len(parts) <= 4:
            raise ValueError(f"{where} {_short_repr(layout)} has {len(parts)} items; {expected}")
        parts += [0] * (4 - len(parts))
    names = ("rows", "cols", "prefix", "suffix")
    for name, value in zip(names, parts):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{where}: {name} is {type(value).__name__} ({_short_repr(value)}); "
                            "expected a non-negative int")
        if value < 0:
            raise ValueError(f"{where}: {name} is {value}; expected a non-negative int")
    return common_pb2.PatchGrid(rows=parts[0], cols=parts[1], prefix_tokens=parts[2],
                                suffix_tokens=parts[3])


def _layout_tuple(grid: common_pb2.PatchGrid) -> Optional[Tuple[int, int, int, int]]:
    if grid.rows == 0 and grid.cols == 0 and grid.prefix_tokens == 0 and grid.suffix_tokens == 0:
        return None
    return (grid.rows, grid.cols, grid.prefix_tokens, grid.suffix_tokens)


_DOCUMENT_FORMS = ("a dict {'id', 'tokens', 'layout'?, 'attributes'?}, a tuple (id, tokens[, "
                   "layout[, attributes]]) or a tessera.pb Document")


def _document_label(index: Optional[int], doc_id=None) -> str:
    """"document 3 ('a')" for messages: the document's position in the caller's sequence (when
    known) and its id (when it is one)."""
    label = "document" if index is None else f"document {index}"
    if isinstance(doc_id, (str, bytes)):
        label += f" ({_short_repr(doc_id)})"
    return label


def _document_parts(doc, index: Optional[int] = None):
    """Checks a document in any form encode_document accepts before anything is sent: returns
    (id, tokens as an ndarray, PatchGrid or None, {field: AttributeValue}). A missing or mistyped
    field raises TypeError, a bad shape or layout ValueError, each naming the document (its index
    in the caller's sequence and its id) and the field."""
    label = _document_label(index)
    if isinstance(doc, Mapping):
        for key in ("id", "tokens"):
            if key not in doc:
                raise TypeError(f"{_document_label(index, doc.get('id'))}: no {key!r} key; a "
                                f"document is {_DOCUMENT_FORMS}")
        doc_id, tokens = doc["id"], doc["tokens"]
        layout, attributes = doc.get("layout"), doc.get("attributes")
    elif isinstance(doc, (tuple, list)):
        if not 2 <= len(doc) <= 4:
            raise ValueError(f"{label}: a tuple of {len(doc)} items; a document tuple is "
                             "(id, tokens[, layout[, attributes]])")
        doc_id, tokens = doc[0], doc[1]
        layout = doc[2] if len(doc) > 2 else None
        attributes = doc[3] if len(doc) > 3 else None
    else:
        raise TypeError(f"{label} is {type(doc).__name__} ({_short_repr(doc)}); a document is "
                        f"{_DOCUMENT_FORMS}")
    if not isinstance(doc_id, (str, bytes)):
        raise TypeError(f"{label}: 'id' is {type(doc_id).__name__} ({_short_repr(doc_id)}); "
                        "expected str")
    label = _document_label(index, doc_id)
    if tokens is None or isinstance(tokens, (str, bytes, Mapping)):
        raise TypeError(f"{label}: 'tokens' is {type(tokens).__name__}; expected a float array, "
                        "n_tokens × dim")
    try:
        values = np.asarray(tokens)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{label}: 'tokens' is not an array ({error}); expected a float array, "
                        "n_tokens × dim") from None
    if values.dtype.kind not in "iuf":
        raise TypeError(f"{label}: 'tokens' has dtype {values.dtype}; expected a float (or "
                        "integer) array, n_tokens × dim")
    if values.ndim != 2:
        raise ValueError(f"{label}: 'tokens' has shape {values.shape}; expected 2-D "
                         "(n_tokens × dim)")
    grid = _patch_grid(layout, f"{label}: 'layout'")
    if attributes is not None and not isinstance(attributes, Mapping):
        raise TypeError(f"{label}: 'attributes' is {type(attributes).__name__} "
                        f"({_short_repr(attributes)}); expected a dict {{field: int | float | str}}")
    encoded = {}
    for field, value in (attributes or {}).items():
        if not isinstance(field, str):
            raise TypeError(f"{label}: attribute name {_short_repr(field)} is "
                            f"{type(field).__name__}; expected str")
        encoded[field] = _attribute_value(value, f"{label}: attribute {field!r}")
    return doc_id, values, grid, encoded


def _encode_document(doc, dtype=None, index: Optional[int] = None) -> ingest_pb2.Document:
    if isinstance(doc, ingest_pb2.Document):
        return doc
    doc_id, tokens, grid, attributes = _document_parts(doc, index)
    message = ingest_pb2.Document(id=_wire_id(doc_id), tokens=encode_matrix(tokens, dtype))
    if grid is not None:
        message.layout.CopyFrom(grid)
    for field, value in attributes.items():
        message.attributes[field].CopyFrom(value)
    return message


def encode_document(doc, dtype=None) -> ingest_pb2.Document:
    """A document given as a dict {id, tokens, layout?, attributes?}, a tuple
    (id, tokens[, layout[, attributes]]) or a `Document` message → `Document`. id: str; tokens:
    n_tokens × dim float array; layout: (rows, cols[, prefix, suffix]) or a dict; attributes:
    {field: int | float | str}. A missing or mistyped field raises TypeError, a bad shape or
    layout ValueError, naming the document and the field."""
    return _encode_document(doc, dtype)


def _encode_filter_into(conditions, result: common_pb2.Filter) -> None:
    if isinstance(conditions, Mapping) and conditions and set(conditions) <= _FILTER_KEYS:
        # {"any_of": [A, B, …], "none_of": [C, …], "all_of": [conditions]}: each alternative is
        # itself a filter.
        if "all_of" in conditions:
            _encode_filter_into(conditions["all_of"], result)
        for key in ("any_of", "none_of"):
            alternatives = conditions.get(key)
            if alternatives is None:
                continue
            if isinstance(alternatives, (str, bytes, Mapping)) or not isinstance(
                    alternatives, Iterable):
                raise TypeError(f"filter {key}: expected a list of filters, got "
                                f"{_short_repr(alternatives)}")
            for alternative in alternatives:
                _encode_filter_into(alternative, getattr(result, key).add())
        return
    if isinstance(conditions, Mapping):
        conditions = [(field, "==", value) for field, value in conditions.items()]
    elif isinstance(conditions, tuple) and conditions and isinstance(conditions[0], str):
        conditions = [conditions]
    for condition in conditions:
        if isinstance(condition, Mapping):  # a nested any_of / none_of beside the conditions
            _encode_filter_into(condition, result)
            continue
        if not isinstance(condition, tuple) or len(condition) not in (2, 3):
            raise TypeError(f"filter condition: expected (field, op, value), (field, 'exists') "
                            f"or (field, 'missing'), got {_short_repr(condition)}")
        field, op = condition[0], condition[1]
        op_number = _lookup(_OPS, op, "filter op")
        if op_number in _NO_VALUE_OPS:
            values = []
        elif len(condition) != 3:
            raise TypeError(f"filter condition on {field!r}: op {op!r} needs a value")
        elif op_number == common_pb2.Condition.OP_IN and not isinstance(condition[2],
                                                                        (str, bytes)):
            values = list(condition[2])
        else:
            values = [condition[2]]
        result.all_of.add(field=field, op=op_number,
                          values=[_attribute_value(v, f"filter value for {field!r}")
                                  for v in values])


def encode_filter(conditions) -> Optional[common_pb2.Filter]:
    """[(field, op, value or values), ...] with op among ==, !=, <, <=, >, >=, in, prefix, and
    (field, "exists") / (field, "missing") (or a dict {field: value} meaning equality) → Filter.
    {"any_of": [A, B, …]} and {"none_of": [A, B, …]}, alone or as items of the list beside the
    conditions, nest: each alternative is itself a filter (a list of conditions or a nested
    any_of / none_of), up to 8 deep. None or empty → no filter."""
    if conditions is None:
        return None
    if isinstance(conditions, common_pb2.Filter):
        return conditions
    result = common_pb2.Filter()
    _encode_filter_into(conditions, result)
    return result


def _set_with_attributes(request, with_attributes) -> None:
    """with_attributes: False, True (all fields) or a list of field names."""
    if with_attributes is True:
        request.with_attributes = True
    elif with_attributes:
        if isinstance(with_attributes, str):
            with_attributes = [with_attributes]
        request.with_attributes = True
        request.attribute_fields.extend(with_attributes)


def _enum_label(enum_type, number: int):
    """DTYPE_FLOAT16 → "fp16", METHOD_WARD → "ward", ATTRIBUTE_TYPE_INT64 → "int64"."""
    if enum_type.full_name == "tessera.v1.DType" and number in _DTYPE_LABEL:
        return _DTYPE_LABEL[number]
    value = enum_type.values_by_number.get(number)
    if value is None:
        return number
    names = [v.name for v in enum_type.values]
    prefix = os.path.commonprefix(names)
    prefix = prefix[:prefix.rfind("_") + 1]
    return value.name[len(prefix):].lower()


def _is_repeated(field) -> bool:
    # protobuf ≥ 5.28 has FieldDescriptor.is_repeated and 7.x removed `label`; Debian's 3.21 has
    # only `label`.
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def message_to_dict(message) -> Dict[str, Any]:
    """A message → dict with every field (unset sub-messages are None, enums are short lower-case
    labels, 64-bit integers stay ints)."""
    out = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {key: _field_value(value_field, item) for key, item in value.items()}
        elif _is_repeated(field):
            out[field.name] = [_field_value(field, item) for item in value]
        elif field.message_type is not None and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _field_value(field, value)
    return out


def _field_value(field, value):
    if field.message_type is not None:
        if field.message_type.full_name == "tessera.v1.AttributeValue":
            return _python_value(value)
        return message_to_dict(value)
    if field.enum_type is not None:
        return _enum_label(field.enum_type, value)
    return value


# ---------------------------------------------------------------------------------------------
# Progress bar for `ingest`.

class _ProgressBar:
    """docs/s and ETA on stderr; tqdm when it is installed, a one-line bar otherwise."""

    def __init__(self, total: Optional[int], description: str, enabled: bool):
        self._total = total
        self._description = description
        self._enabled = enabled
        self._count = 0
        self._failed = 0
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._tqdm = None
        if enabled:
            try:
                import tqdm  # optional
                self._tqdm = tqdm.tqdm(total=total, desc=description, unit="docs", file=sys.stderr)
            except ImportError:
                pass

    def update(self, documents: int, failed: int = 0):
        self._count += documents
        self._failed += failed
        if not self._enabled:
            return
        if self._tqdm is not None:
            self._tqdm.update(documents)
            if self._failed:
                self._tqdm.set_postfix(failed=self._failed)
            return
        now = time.monotonic()
        if now - self._last_draw >= 0.1:
            self._last_draw = now
            self._draw(now)

    def _draw(self, now: float, final: bool = False):
        elapsed = max(now - self._start, 1e-9)
        rate = self._count / elapsed
        failed = f", {self._failed} failed" if self._failed else ""
        if self._total:
            fraction = min(self._count / self._total, 1.0)
            width = 30
            filled = int(round(width * fraction))
            bar = "#" * filled + "-" * (width - filled)
            remaining = (self._total - self._count) / rate if rate > 0 else math.inf
            eta = _format_seconds(elapsed if final else remaining)
            label = "in" if final else "ETA"
            line = (f"\r{self._description} [{bar}] {self._count}/{self._total} "
                    f"{fraction * 100:5.1f}% {rate:8.1f} docs/s {label} {eta}{failed}")
        else:
            line = (f"\r{self._description} {self._count} docs {rate:8.1f} docs/s "
                    f"{_format_seconds(elapsed)}{failed}")
        sys.stderr.write(line)
        sys.stderr.flush()

    def close(self):
        if not self._enabled:
            return
        if self._tqdm is not None:
            self._tqdm.close()
            return
        self._draw(time.monotonic(), final=True)
        sys.stderr.write("\n")
        sys.stderr.flush()


def _format_seconds(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "--:--"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes:02d}:{seconds:02d}"


def _token_bytes(doc) -> int:
    """Token bytes of a document in any form encode_document accepts (0 when unknown, as for a
    malformed document, which the encoder then reports)."""
    if isinstance(doc, ingest_pb2.Document):
        return len(doc.tokens.data)
    try:
        tokens = doc["tokens"] if isinstance(doc, Mapping) else doc[1]
    except (KeyError, IndexError, TypeError):
        return 0
    nbytes = getattr(tokens, "nbytes", 0)
    return nbytes if isinstance(nbytes, int) else 0


def _batched(items: Iterable, size: int, max_bytes: int = 0) -> Iterator[list]:
    """Batches of at most `size` documents and, when max_bytes > 0, at most `max_bytes` of token
    bytes (a larger document goes alone): one Upsert message each, well under the server's
    message limit even for ColPali pages (~0.5 MB each in fp32)."""
    batch, batch_bytes = [], 0
    for item in items:
        item_bytes = _token_bytes(item) if max_bytes > 0 else 0
        if batch and max_bytes > 0 and batch_bytes + item_bytes > max_bytes:
            yield batch
            batch, batch_bytes = [], 0
        batch.append(item)
        batch_bytes += item_bytes
        if len(batch) >= size:
            yield batch
            batch, batch_bytes = [], 0
    if batch:
        yield batch


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _read_pem(value) -> Optional[bytes]:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    with open(value, "rb") as f:
        return f.read()


# ---------------------------------------------------------------------------------------------

class Client:
    """A connection to a Tessera server.

    address: "host:port". api_key: sent as `authorization: Bearer KEY` on every call.
    tls_root_cert: PEM bytes or a file path; turns TLS on (the server's CA). tls_client_cert /
    tls_client_key: PEM bytes or paths, for mutual TLS. timeout: default deadline of every call in
    seconds (None = none); each method takes its own `timeout` too.
    """

    def __init__(self, address: str = "127.0.0.1:50051", api_key: Optional[str] = None,
                 tls_root_cert=None, timeout: Optional[float] = None, tls_client_cert=None,
                 tls_client_key=None, tls_server_name: Optional[str] = None,
                 options: Sequence[Tuple[str, Any]] = ()):
        self.address = address
        self.timeout = timeout
        self.metadata: Tuple[Tuple[str, str], ...] = (
            (("authorization", f"Bearer {api_key}"),) if api_key else ())
        # The server enforces its own message size limit; the client sets none.
        channel_options = [("grpc.max_send_message_length", -1),
                           ("grpc.max_receive_message_length", -1)]
        if tls_server_name:
            channel_options.append(("grpc.ssl_target_name_override", tls_server_name))
        channel_options.extend(options)
        if tls_root_cert is not None or tls_client_cert is not None:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_pem(tls_root_cert),
                private_key=_read_pem(tls_client_key),
                certificate_chain=_read_pem(tls_client_cert))
            self.channel = grpc.secure_channel(address, credentials, options=channel_options)
        else:
            self.channel = grpc.insecure_channel(address, options=channel_options)
        self.admin_stub = admin_pb2_grpc.AdminServiceStub(self.channel)
        self.ingest_stub = ingest_pb2_grpc.IngestServiceStub(self.channel)
        self.query_stub = query_pb2_grpc.QueryServiceStub(self.channel)
        self._health = self.channel.unary_unary("/grpc.health.v1.Health/Check")

    # Lifecycle -----------------------------------------------------------------------------

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _timeout(self, timeout):
        return self.timeout if timeout is None else timeout

    def _call(self, method, request, timeout):
        try:
            return method(request, metadata=self.metadata, timeout=self._timeout(timeout))
        except grpc.RpcError as error:
            raise TesseraError.from_rpc_error(error) from None

    def health(self, service: str = "", timeout: Optional[float] = 5.0) -> str:
        """grpc.health.v1 Check: "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN"."""
        name = service.encode()
        request = b"\x0a" + _varint(len(name)) + name if name else b""
        try:
            response = self._health(request, metadata=self.metadata, timeout=timeout)
        except grpc.RpcError as error:
            raise TesseraError.from_rpc_error(error) from None
        status = response[1] if len(response) >= 2 and response[0] == 0x08 else 0
        return {1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}.get(status, "UNKNOWN")

    # Collections ---------------------------------------------------------------------------

    def create_collection(self, name: str, dim: int, pool_factor: Optional[int] = None,
                          method: str = "ward",
                          dtype="fp16", spatial=None, candidates=None,
                          attributes: Optional[Mapping[str, Any]] = None, num_shards: int = 1,
                          protected_tokens: int = 0, renormalize: bool = False,
                          min_vectors: int = 0, max_merge_height: Optional[float] = None,
                          replicas: int = 1,
                          timeout: Optional[float] = None) -> Dict[str, Any]:
        """Creates a collection and returns its schema with the server's defaults filled in.

        Rerank vectors are pooled hierarchically (pool_factor, None = 2; method "ward" or
        "reference", protected_tokens, renormalize, min_vectors: keep at least min(n,
        min_vectors) vectors per document, 0 = no floor; max_merge_height: no Ward merge above
        this height, so dissimilar tokens stay apart, None = the server's default for the method
        (0.3 for ward), 0 = no limit) unless `spatial` is given: a mode name ("rows",
        "columns", "tiles" (needs tile_rows and tile_cols), "row_windows" (needs window_rows and
        window_stride), "global") or a dict {mode, tile_rows, tile_cols, window_rows,
        window_stride, keep_special_tokens, renormalize}. With both `spatial` and `pool_factor`,
        the spatially pooled vectors are then pooled hierarchically as well. `candidates`: a
        FAISS factory string or a dict {kind: "pooled"|"global_mean", pool_factor, factory,
        residual_bits, centroid_min_vectors, centroid_min_training_vectors, rerank_from_codes}.
        `attributes`: {field: type} with type "int64", "double" or "string" (or int, float, str).
        `replicas`: copies of each shard on distinct shard nodes (a router only; a standalone
        server holds one).
        """
        schema = admin_pb2.CollectionSchema(name=name, dim=dim, dtype=_wire_dtype(dtype),
                                            num_shards=num_shards)
        if spatial is None or pool_factor is not None:
            schema.hierarchical.CopyFrom(admin_pb2.HierarchicalPooling(
                pool_factor=2 if pool_factor is None else pool_factor,
                method=_lookup(_METHODS, method, "pooling method"),
                protected_tokens=protected_tokens, renormalize=renormalize,
                min_vectors=min_vectors))
            if max_merge_height is not None:
                schema.hierarchical.max_merge_height = max_merge_height
        if spatial is not None:
            if isinstance(spatial, str):
                spatial = {"mode": spatial}
            settings = dict(spatial)
            settings["mode"] = _lookup(_SPATIAL_MODES, settings.get("mode", "tiles"),
                                       "spatial mode")
            schema.spatial.CopyFrom(admin_pb2.SpatialPooling(**settings))
        if candidates is not None:
            if isinstance(candidates, str):
                candidates = {"factory": candidates}
            settings = dict(candidates)
            if "kind" in settings:
                settings["kind"] = _lookup(_CANDIDATE_KINDS, settings["kind"], "candidate kind")
            schema.candidates.CopyFrom(admin_pb2.CandidateVectors(**settings))
        for field, kind in (attributes or {}).items():
            schema.attributes[field] = _lookup(_ATTRIBUTE_TYPES, kind, f"attribute '{field}' type")
        response = self._call(self.admin_stub.CreateCollection,
                              admin_pb2.CreateCollectionRequest(schema=schema,
                                                                replicas=replicas), timeout)
        return message_to_dict(response.schema)

    def drop_collection(self, name: str, timeout: Optional[float] = None) -> None:
        self._call(self.admin_stub.DropCollection, admin_pb2.DropCollectionRequest(name=name),
                   timeout)

    def list_collections(self, timeout: Optional[float] = None) -> List[str]:
        response = self._call(self.admin_stub.ListCollections,
                              admin_pb2.ListCollectionsRequest(), timeout)
        return list(response.names)

    def collection_info(self, name: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        """{"schema": {...}, "stats": {documents, original_tokens, rerank_vectors, ...},
        "shards": [{shard, replicas: [{node_id, address, state}]}]} ("shards" empty except
        from a router; a replica's state is "serving", "down" or "stale")."""
        response = self._call(self.admin_stub.GetCollection,
                              admin_pb2.GetCollectionRequest(name=name), timeout)
        return {"schema": message_to_dict(response.schema),
                "stats": message_to_dict(response.stats),
                "shards": [{"shard": s.shard,
                            "replicas": [{"node_id": r.node_id, "address": r.address,
                                          "state": r.state} for r in s.replicas]}
                           for s in response.shards]}

    def flush(self, name: str, timeout: Optional[float] = None) -> None:
        self._call(self.admin_stub.Flush, admin_pb2.FlushRequest(name=name), timeout)

    # Documents -----------------------------------------------------------------------------

    def upsert_stream(self, collection: str, batches: Iterable[Iterable], dtype=None,
                      timeout: Optional[float] = None) -> Iterator[List[DocumentResult]]:
        """One Upsert stream: sends each batch of documents as one request (lazily, as gRPC asks
        for it) and yields, per batch and in order, the per-document results once the server has
        acknowledged it. Closing the generator early cancels the stream."""
        # gRPC pulls the requests on its own thread, where an exception would only end the call
        # with "UNKNOWN: Exception iterating requests!". A document that does not encode (or a
        # failing `batches` iterator) instead ends the request stream there; once the server has
        # answered what was sent, the exception is raised here, as it was.
        failure: List[BaseException] = []

        def requests():
            index = 0
            try:
                for batch in batches:
                    documents = []
                    for doc in batch:
                        documents.append(_encode_document(doc, dtype, index))
                        index += 1
                    yield ingest_pb2.UpsertRequest(collection=collection, documents=documents)
            except Exception as error:  # noqa: BLE001 (handed to the caller's thread)
                failure.append(error)

        call = self.ingest_stub.Upsert(requests(), metadata=self.metadata,
                                       timeout=self._timeout(timeout))
        try:
            for response in call:
                yield [DocumentResult(_python_id(r.id), r.code, r.message, r.version,
                                      r.num_vectors)
                       for r in response.results]
        except grpc.RpcError as error:
            if failure:
                raise failure[0] from None
            raise TesseraError.from_rpc_error(error) from None
        finally:
            call.cancel()  # no-op once the call has finished
        if failure:
            raise failure[0]

    def upsert(self, collection: str, docs: Iterable, batch_size: int = 64, dtype=None,
               timeout: Optional[float] = None,
               batch_bytes: int = 4 << 20) -> List[DocumentResult]:
        """Writes documents over one Upsert stream, at most `batch_size` documents and
        `batch_bytes` of token bytes per request message (a larger document goes alone), and
        returns one result per document (check `.ok`: a rejected document does not fail the
        others).

        A document is a dict {id, tokens, layout?, attributes?} or a tuple (id, tokens[, layout[,
        attributes]]); tokens: n_tokens × dim float32 or float16 (sent as is unless `dtype` says
        "fp16"/"fp32"); layout: (rows, cols[, prefix_tokens, suffix_tokens]) or None; attributes:
        {field: int | float | str}. Raises TesseraError when the stream fails.
        """
        docs = list(docs)
        for index, doc in enumerate(docs):  # every document checked before anything is sent
            if not isinstance(doc, ingest_pb2.Document):
                _document_parts(doc, index)
        batches = list(_batched(docs, batch_size, batch_bytes))
        results: List[DocumentResult] = []
        answered = 0
        for batch_results in self.upsert_stream(collection, batches, dtype, timeout):
            results.extend(batch_results)
            answered += 1
        if answered != len(batches):
            raise TesseraError(grpc.StatusCode.UNKNOWN,
                               f"server acknowledged {answered} of {len(batches)} batches")
        return results

    def ingest(self, collection: str, docs: Iterable, batch_size: int = 64,
               progress: bool = True, total: Optional[int] = None, dtype=None,
               timeout: Optional[float] = None, batch_bytes: int = 4 << 20) -> IngestSummary:
        """Streams any number of documents (a list or a lazy iterable, see `upsert`) in batches
        over one Upsert stream, with a progress bar on stderr (docs/s, ETA when the total is known).
        Returns an IngestSummary; rejected documents are in `.failed`."""
        if total is None and hasattr(docs, "__len__"):
            total = len(docs)
        bar = _ProgressBar(total, f"ingest {collection}", progress)
        start = time.monotonic()
        sent = stored = 0
        failed: List[DocumentResult] = []
        lock = threading.Lock()

        def counted(batches):
            nonlocal sent
            for batch in batches:
                with lock:
                    sent += len(batch)
                yield batch

        try:
            for results in self.upsert_stream(collection, counted(_batched(docs, batch_size, batch_bytes)),
                                              dtype, timeout):
                bad = [r for r in results if not r.ok]
                failed.extend(bad)
                stored += len(results) - len(bad)
                bar.update(len(results), len(bad))
        finally:
            bar.close()
        with lock:
            documents = sent
        if stored + len(failed) != documents:
            raise TesseraError(grpc.StatusCode.UNKNOWN,
                               f"server acknowledged {stored + len(failed)} of {documents} "
                               "documents")
        return IngestSummary(documents, stored, failed, time.monotonic() - start)

    def delete(self, collection: str, ids: Union[str, Sequence[str], None] = None,
               timeout: Optional[float] = None, filter=None):
        """Deletes documents by id, returning per id whether it existed; or, with `filter` (as
        for search, not empty) instead of ids, every document matching it, returning how many.
        Acknowledged (durable) when it returns, either way."""
        if filter is not None:
            if ids is not None:
                raise TypeError("delete: give ids or filter, not both")
            request = ingest_pb2.DeleteRequest(collection=collection)
            request.filter.CopyFrom(encode_filter(filter))
            return self._call(self.ingest_stub.Delete, request, timeout).deleted
        if ids is None:
            raise TypeError("delete: give ids or filter")
        if isinstance(ids, str):
            ids = [ids]
        response = self._call(self.ingest_stub.Delete,
                              ingest_pb2.DeleteRequest(collection=collection,
                                                       ids=[_wire_id(i) for i in ids]),
                              timeout)
        return list(response.existed)

    def get(self, collection: str, id: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        """A stored document: {id, version, num_tokens, layout, attributes, vectors (float32
        n_vectors × dim, decoded from the stored fp16/fp32), dtype, member_offsets, members}.
        NOT_FOUND (as TesseraError) for an unknown id."""
        request = ingest_pb2.GetRequest(collection=collection, id=_wire_id(id))
        response = self._call(self.ingest_stub.Get, request, timeout)
        return {
            "id": _python_id(response.id),
            "version": response.version,
            "num_tokens": response.num_tokens,
            "layout": _layout_tuple(response.layout),
            "attributes": {k: _python_value(v) for k, v in response.attributes.items()},
            "vectors": decode_matrix(response.vectors),
            "dtype": _DTYPE_LABEL.get(response.vectors.dtype, response.vectors.dtype),
            "member_offsets": np.array(response.member_offsets, dtype=np.int64),
            "members": np.array(response.members, dtype=np.int64),
        }

    def count(self, collection: str, filter=None, timeout: Optional[float] = None) -> int:
        """The number of documents matching `filter` (as for search; None: all)."""
        request = query_pb2.CountRequest(collection=collection)
        encoded_filter = encode_filter(filter)
        if encoded_filter is not None:
            request.filter.CopyFrom(encoded_filter)
        return self._call(self.query_stub.Count, request, timeout).count

    def scroll(self, collection: str, filter=None, after: Optional[str] = None,
               limit: int = 100, with_attributes=False,
               timeout: Optional[float] = None) -> ScrollPage:
        """One page of the documents matching `filter`, ascending by id, with ids after `after`
        (the previous page's next_after). with_attributes: True for all attributes, or a list of
        field names."""
        request = query_pb2.ScrollRequest(collection=collection, limit=limit,
                                          after=_wire_id(after) if after else b"")
        encoded_filter = encode_filter(filter)
        if encoded_filter is not None:
            request.filter.CopyFrom(encoded_filter)
        _set_with_attributes(request, with_attributes)
        response = self._call(self.query_stub.Scroll, request, timeout)
        documents = [{"id": _python_id(d.id), "version": d.version,
                      "attributes": {k: _python_value(v) for k, v in d.attributes.items()}}
                     for d in response.documents]
        return ScrollPage(documents, _python_id(response.next_after) if response.next_after
                          else None)

    # Search --------------------------------------------------------------------------------

    def _search_request(self, collection, query, k, num_candidates, filter, exhaustive, explain,
                        per_token_candidates, dtype, nprobe=0, allow_partial_results=False,
                        with_attributes=False, group_by=None, group_size=None,
                        groups=None) -> query_pb2.SearchRequest:
        request = query_pb2.SearchRequest(
            collection=collection, query=encode_matrix(query, dtype), k=k,
            num_candidates=num_candidates, per_token_candidates=per_token_candidates,
            nprobe=nprobe, exhaustive=exhaustive, explain=explain,
            allow_partial_results=allow_partial_results)
        encoded_filter = encode_filter(filter)
        if encoded_filter is not None:
            request.filter.CopyFrom(encoded_filter)
        _set_with_attributes(request, with_attributes)
        if group_by is not None:
            request.group_by = group_by
            request.group_size = 1 if group_size is None else group_size
            request.groups = 0 if groups is None else groups
        elif group_size is not None or groups is not None:
            raise TypeError("search: group_size and groups need group_by")
        return request

    @staticmethod
    def _hit(h: query_pb2.Hit) -> Hit:
        return Hit(_python_id(h.id), h.score, h.version,
                   [TokenMatch(m.query_token, m.document_vector, m.similarity,
                               list(m.covered_tokens)) for m in h.explanation],
                   {k: _python_value(v) for k, v in h.attributes.items()})

    @staticmethod
    def _search_result(response: query_pb2.SearchResponse) -> SearchResult:
        hits = [Client._hit(h) for h in response.hits]
        timings = {"candidates_ms": response.timings.candidates_ms,
                   "fetch_ms": response.timings.fetch_ms,
                   "rerank_ms": response.timings.rerank_ms,
                   "total_ms": response.timings.total_ms}
        if response.timings.fanout_ms:
            timings["fanout_ms"] = response.timings.fanout_ms
        result = SearchResult(hits, timings, response.documents_scored, response.exhaustive,
                              response.missing_shards)
        result.groups = [Group(_python_value(g.value), [Client._hit(h) for h in g.hits])
                         for g in response.groups]
        return result

    def search(self, collection: str, query, k: int = 10, num_candidates: int = 0, filter=None,
               exhaustive: bool = False, explain: bool = False, per_token_candidates: int = 0,
               dtype=None, timeout: Optional[float] = None, nprobe: int = 0,
               allow_partial_results: bool = False, with_attributes=False,
               group_by: Optional[str] = None, group_size: Optional[int] = None,
               groups: Optional[int] = None) -> SearchResult:
        """Top-k documents by MaxSim for a query (n_query_tokens × dim). num_candidates: N
        documents scored exactly (0 = server default); filter: [(field, op, value(s))] with op
        among ==, !=, <, <=, >, >=, in; exhaustive: score every document exactly; explain: per hit
        and query token, the best document vector and the original tokens it covers; nprobe:
        centroids probed per query token when stage 1 is the centroid index (0 = server
        default); allow_partial_results (a router): when a shard has no replica that answers,
        return the other shards' hits with `missing_shards` set instead of raising UNAVAILABLE.
        Filters nest: {"any_of": [A, B]}, {"none_of": [A]} (each alternative a filter), and
        conditions (field, "exists"), (field, "missing"), (field, "prefix", "abc").
        with_attributes: True (all) or a list of fields: each Hit carries `.attributes`.
        group_by=FIELD: the result's `.groups` holds the best `groups` groups (default k) of
        hits sharing FIELD's value, each with its best `group_size` hits (default 1)."""
        request = self._search_request(collection, query, k, num_candidates, filter, exhaustive,
                                       explain, per_token_candidates, dtype, nprobe,
                                       allow_partial_results, with_attributes, group_by,
                                       group_size, groups)
        return self._search_result(self._call(self.query_stub.Search, request, timeout))

    def search_batch(self, collection: str, queries: Sequence, timeout: Optional[float] = None,
                     **options) -> List[SearchResult]:
        """Several queries of one collection in one call; `options` as for `search`."""
        settings = dict(k=10, num_candidates=0, filter=None, exhaustive=False, explain=False,
                        per_token_candidates=0, dtype=None, nprobe=0,
                        allow_partial_results=False, with_attributes=False, group_by=None,
                        group_size=None, groups=None)
        unknown = set(options) - set(settings)
        if unknown:
            raise TypeError(f"unknown search options {sorted(unknown)}")
        settings.update(options)
        request = query_pb2.SearchBatchRequest(searches=[
            self._search_request(collection, query, **settings) for query in queries])
        response = self._call(self.query_stub.SearchBatch, request, timeout)
        return [self._search_result(r) for r in response.responses]
