"""Request building and response conversion for both clients (`Client`, `AsyncClient`): numpy and
Python values → the protocol's messages, and messages → numpy arrays, dicts and the result types
of `tessera.types`. One function per RPC builds its request (`*_request`) and one converts its
response; the clients only add the transport (a blocking or an asyncio gRPC channel). A feature
added here reaches both clients.

Token matrices travel as packed little-endian fp32 or fp16 bytes with their shape (n_tokens × dim,
row-major).
"""

import contextlib
import os
import time
from typing import (Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    TypeVar, Union)

import grpc
import numpy as np

from tessera._proto.tessera.v1 import admin_pb2, common_pb2, ingest_pb2, query_pb2
from tessera.types import (DocumentResult, Group, Hit, RetryPolicy, ScrollPage, SearchResult,
                           TesseraError, TokenMatch)

# What callers may pass: a dtype as a name ("fp16"), a numpy dtype or a DType number; a document
# as a dict, a tuple or a Document message; a filter as [(field, op, value)] (with (field,
# "exists"/"missing") and nested {"any_of"/"none_of": [filters]} among them), a dict or a Filter.
DTypeLike = Union[str, int, np.dtype, type, None]
Document = Union[Mapping[str, Any], Tuple[Any, ...], List[Any], ingest_pb2.Document]
FilterLike = Union[Sequence[Any], Tuple[Any, ...], Mapping[str, Any], common_pb2.Filter, None]
# search/scroll with_attributes: False, True (all fields), a field name or a list of field names.
AttributesLike = Union[bool, str, Sequence[str]]
_T = TypeVar("_T")


_DTYPE_NAMES = {
    "fp16": common_pb2.DTYPE_FLOAT16, "float16": common_pb2.DTYPE_FLOAT16,
    "half": common_pb2.DTYPE_FLOAT16,
    "fp32": common_pb2.DTYPE_FLOAT32, "float32": common_pb2.DTYPE_FLOAT32,
    "float": common_pb2.DTYPE_FLOAT32,
}
_WIRE_NUMPY: Dict[int, "np.dtype[Any]"] = {common_pb2.DTYPE_FLOAT32: np.dtype("<f4"),
                                           common_pb2.DTYPE_FLOAT16: np.dtype("<f2")}
_DTYPE_LABEL: Dict[int, str] = {common_pb2.DTYPE_FLOAT32: "fp32", common_pb2.DTYPE_FLOAT16: "fp16"}

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
_FUSIONS = {"rrf": query_pb2.FUSION_RRF, "score": query_pb2.FUSION_SCORE}
# A sparse vector: (indices, values) (sequences or arrays of equal length), {index: weight}, or a
# SparseVector message.
SparseLike = Union[Tuple[Any, Any], Mapping[int, float], common_pb2.SparseVector, None]
_FILTER_KEYS = frozenset(("all_of", "any_of", "none_of"))


def _lookup(table: Mapping[Any, _T], key: Any, what: str) -> _T:
    normalized = key.lower() if isinstance(key, str) else key
    if normalized not in table:
        names = sorted(k for k in table if isinstance(k, str))
        raise ValueError(f"{what} {key!r}, expected one of {names}")
    return table[normalized]


def _wire_dtype(dtype: DTypeLike) -> Any:
    """A dtype given as a name ("fp16"), a numpy dtype or a DType number → DType number (an
    int; `Any` to mypy, for which a DType is its own type)."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return dtype
    if isinstance(dtype, str):
        return _lookup(_DTYPE_NAMES, dtype, "dtype")
    numpy_dtype: "np.dtype[Any]" = np.dtype(dtype)  # type: ignore[arg-type]
    if numpy_dtype == np.float16:
        return common_pb2.DTYPE_FLOAT16
    if numpy_dtype == np.float32:
        return common_pb2.DTYPE_FLOAT32
    raise ValueError(f"dtype {dtype!r}, expected fp16 or fp32")


def encode_matrix(array: Any, dtype: DTypeLike = None) -> common_pb2.Matrix:
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


def _id_is_bytes(message_type: Any, field: str = "id") -> bool:
    return message_type.DESCRIPTOR.fields_by_name[field].type == \
        message_type.DESCRIPTOR.fields_by_name[field].TYPE_BYTES


# Document ids are UTF-8 strings; should the protocol carry them as `bytes` (so that the server,
# not the protobuf runtime, judges their encoding), str ids are encoded here and decoded back.
_IDS_AS_BYTES = _id_is_bytes(ingest_pb2.Document)


def _wire_id(doc_id: Union[str, bytes]) -> Any:
    if _IDS_AS_BYTES and isinstance(doc_id, str):
        return doc_id.encode("utf-8")
    return doc_id


def _python_id(doc_id: Union[str, bytes]) -> str:
    if isinstance(doc_id, bytes):
        return doc_id.decode("utf-8", "backslashreplace")
    return doc_id


def _short_repr(value: Any, limit: int = 60) -> str:
    """repr(value) for a message, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _attribute_value(value: Any,
                     where: str = "attribute value") -> common_pb2.AttributeValue:
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


def _python_value(value: common_pb2.AttributeValue) -> Union[int, float, str, None]:
    which = value.WhichOneof("value")
    return getattr(value, which) if which else None


def _patch_grid(layout: Any, where: str = "layout") -> Optional[common_pb2.PatchGrid]:
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


_DOCUMENT_FORMS = ("a dict {'id', 'tokens', 'layout'?, 'attributes'?, 'sparse'?}, a tuple "
                   "(id, tokens[, layout[, attributes]]) or a tessera.pb Document")


def encode_sparse(vector: SparseLike, where: str = "sparse vector") -> common_pb2.SparseVector:
    """(indices, values), {index: weight} or a SparseVector → SparseVector. Indices are term ids
    (unsigned 32-bit integers, unique, any order: the server sorts them), values their weights
    (finite, ≥ 0; the server checks). A malformed vector raises TypeError or ValueError naming
    `where`."""
    if isinstance(vector, common_pb2.SparseVector):
        return vector
    if isinstance(vector, Mapping):
        indices, values = list(vector.keys()), list(vector.values())
    elif isinstance(vector, (tuple, list)) and len(vector) == 2:
        indices, values = vector
    else:
        raise TypeError(f"{where} is {type(vector).__name__} ({_short_repr(vector)}); expected "
                        "(indices, values) or {index: weight}")
    try:
        index_array = np.asarray(indices)
        value_array = np.asarray(values, dtype=np.float32)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{where}: {error}; expected integer indices and float values") from None
    if index_array.ndim != 1 or value_array.ndim != 1:
        raise ValueError(f"{where}: indices of shape {index_array.shape} and values of shape "
                         f"{value_array.shape}; expected two 1-D sequences")
    if len(index_array) != len(value_array):
        raise ValueError(f"{where}: {len(index_array)} indices but {len(value_array)} values; "
                         "expected one value per index")
    if len(index_array) and (index_array.dtype.kind not in "iu" or index_array.min() < 0 or
                             index_array.max() > 0xFFFFFFFF):
        raise ValueError(f"{where}: indices must be integers in [0, 2^32), got "
                         f"{_short_repr(index_array.tolist())}")
    return common_pb2.SparseVector(indices=index_array.astype(np.uint64).tolist(),
                                   values=value_array.tolist())


def _document_label(index: Optional[int], doc_id: Any = None) -> str:
    """"document 3 ('a')" for messages: the document's position in the caller's sequence (when
    known) and its id (when it is one)."""
    label = "document" if index is None else f"document {index}"
    if isinstance(doc_id, (str, bytes)):
        label += f" ({_short_repr(doc_id)})"
    return label


def _document_parts(doc: Any, index: Optional[int] = None) -> Tuple[
        Union[str, bytes], np.ndarray, Optional[common_pb2.PatchGrid],
        Dict[str, common_pb2.AttributeValue]]:
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
    encoded: Dict[str, common_pb2.AttributeValue] = {}
    for field, value in (attributes or {}).items():
        if not isinstance(field, str):
            raise TypeError(f"{label}: attribute name {_short_repr(field)} is "
                            f"{type(field).__name__}; expected str")
        encoded[field] = _attribute_value(value, f"{label}: attribute {field!r}")
    if isinstance(doc, Mapping) and doc.get("sparse") is not None:
        encode_sparse(doc["sparse"], f"{label}: 'sparse'")
    return doc_id, values, grid, encoded


def _encode_document(doc: Document, dtype: DTypeLike = None,
                     index: Optional[int] = None) -> ingest_pb2.Document:
    if isinstance(doc, ingest_pb2.Document):
        return doc
    doc_id, tokens, grid, attributes = _document_parts(doc, index)
    message = ingest_pb2.Document(id=_wire_id(doc_id), tokens=encode_matrix(tokens, dtype))
    if grid is not None:
        message.layout.CopyFrom(grid)
    for field, value in attributes.items():
        message.attributes[field].CopyFrom(value)
    if isinstance(doc, Mapping) and doc.get("sparse") is not None:
        message.sparse.CopyFrom(encode_sparse(doc["sparse"]))
    return message


def encode_document(doc: Document, dtype: DTypeLike = None) -> ingest_pb2.Document:
    """A document given as a dict {id, tokens, layout?, attributes?}, a tuple
    (id, tokens[, layout[, attributes]]) or a `Document` message → `Document`. id: str; tokens:
    n_tokens × dim float array; layout: (rows, cols[, prefix, suffix]) or a dict; attributes:
    {field: int | float | str}. A missing or mistyped field raises TypeError, a bad shape or
    layout ValueError, naming the document and the field."""
    return _encode_document(doc, dtype)


def _encode_filter_into(conditions: Any, result: common_pb2.Filter) -> None:
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
    items: Iterable[Any]
    if isinstance(conditions, Mapping):
        items = [(field, "==", value) for field, value in conditions.items()]
    elif isinstance(conditions, tuple) and conditions and isinstance(conditions[0], str):
        items = [conditions]
    else:
        items = conditions
    for condition in items:
        if isinstance(condition, Mapping):  # a nested any_of / none_of beside the conditions
            _encode_filter_into(condition, result)
            continue
        if not isinstance(condition, tuple) or len(condition) not in (2, 3):
            raise TypeError(f"filter condition: expected (field, op, value), (field, 'exists') "
                            f"or (field, 'missing'), got {_short_repr(condition)}")
        field, op = condition[0], condition[1]
        op_number = _lookup(_OPS, op, "filter op")
        values: List[Any]
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


def encode_filter(conditions: FilterLike) -> Optional[common_pb2.Filter]:
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


def _set_with_attributes(request: Any, with_attributes: AttributesLike) -> None:
    """with_attributes: False, True (all fields), a field name or a list of field names."""
    if with_attributes is True:
        request.with_attributes = True
    elif with_attributes:
        fields = [with_attributes] if isinstance(with_attributes, str) else with_attributes
        request.with_attributes = True
        request.attribute_fields.extend(fields)


def _enum_label(enum_type: Any, number: int) -> Union[str, int]:
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


def _is_repeated(field: Any) -> bool:
    # protobuf ≥ 5.28 has FieldDescriptor.is_repeated and 7.x removed `label`; Debian's 3.21 has
    # only `label`.
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def message_to_dict(message: Any) -> Dict[str, Any]:
    """A message → dict with every field (unset sub-messages are None, enums are short lower-case
    labels, 64-bit integers stay ints)."""
    out: Dict[str, Any] = {}
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


def _field_value(field: Any, value: Any) -> Any:
    if field.message_type is not None:
        if field.message_type.full_name == "tessera.v1.AttributeValue":
            return _python_value(value)
        return message_to_dict(value)
    if field.enum_type is not None:
        return _enum_label(field.enum_type, value)
    return value




# ---------------------------------------------------------------------------------------------
# Per-RPC requests and responses. The clients' methods are these plus the call itself; their
# docstrings (in client.py) document the arguments.

def create_collection_request(
        name: str, dim: int, pool_factor: Optional[int] = None, method: str = "ward",
        dtype: DTypeLike = "fp16", spatial: Union[str, Mapping[str, Any], None] = None,
        candidates: Union[str, Mapping[str, Any], None] = None,
        attributes: Optional[Mapping[str, Any]] = None, num_shards: int = 1,
        protected_tokens: int = 0, renormalize: bool = False, min_vectors: int = 0,
        max_merge_height: Optional[float] = None,
        replicas: int = 1,
        sparse: Union[bool, Mapping[str, Any]] = False) -> admin_pb2.CreateCollectionRequest:
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
        settings = dict({"mode": spatial} if isinstance(spatial, str) else spatial)
        settings["mode"] = _lookup(_SPATIAL_MODES, settings.get("mode", "tiles"), "spatial mode")
        schema.spatial.CopyFrom(admin_pb2.SpatialPooling(**settings))
    if candidates is not None:
        settings = dict({"factory": candidates} if isinstance(candidates, str) else candidates)
        if "kind" in settings:
            settings["kind"] = _lookup(_CANDIDATE_KINDS, settings["kind"], "candidate kind")
        schema.candidates.CopyFrom(admin_pb2.CandidateVectors(**settings))
    for field, kind in (attributes or {}).items():
        schema.attributes[field] = _lookup(_ATTRIBUTE_TYPES, kind, f"attribute '{field}' type")
    if sparse:
        settings = {} if sparse is True else dict(sparse)
        unknown = set(settings) - {"idf", "k1", "b"}
        if unknown:
            raise TypeError(f"sparse: unknown settings {sorted(unknown)}, expected idf, k1, b")
        schema.sparse.modifier = (admin_pb2.SparseField.MODIFIER_IDF if settings.get("idf", True)
                                  else admin_pb2.SparseField.MODIFIER_NONE)
        if settings.get("k1") is not None:
            schema.sparse.k1 = settings["k1"]
        if settings.get("b") is not None:
            schema.sparse.b = settings["b"]
    return admin_pb2.CreateCollectionRequest(schema=schema, replicas=replicas)


def create_collection_result(response: admin_pb2.CreateCollectionResponse) -> Dict[str, Any]:
    return message_to_dict(response.schema)


def drop_collection_request(name: str) -> admin_pb2.DropCollectionRequest:
    return admin_pb2.DropCollectionRequest(name=name)


def list_collections_request() -> admin_pb2.ListCollectionsRequest:
    return admin_pb2.ListCollectionsRequest()


def list_collections_result(response: admin_pb2.ListCollectionsResponse) -> List[str]:
    return list(response.names)


def collection_info_request(name: str) -> admin_pb2.GetCollectionRequest:
    return admin_pb2.GetCollectionRequest(name=name)


def collection_info_result(response: admin_pb2.GetCollectionResponse) -> Dict[str, Any]:
    return {"schema": message_to_dict(response.schema),
            "stats": message_to_dict(response.stats),
            "shards": [{"shard": s.shard,
                        "replicas": [{"node_id": r.node_id, "address": r.address,
                                      "state": r.state} for r in s.replicas]}
                       for s in response.shards]}


def flush_request(name: str) -> admin_pb2.FlushRequest:
    return admin_pb2.FlushRequest(name=name)


def upsert_request(collection: str, batch: Iterable[Document], dtype: DTypeLike = None,
                   first_index: int = 0) -> ingest_pb2.UpsertRequest:
    """One Upsert message of `batch`, whose first document is number `first_index` of the
    caller's sequence (for error messages)."""
    documents = [_encode_document(doc, dtype, first_index + i) for i, doc in enumerate(batch)]
    return ingest_pb2.UpsertRequest(collection=collection, documents=documents)


def upsert_results(response: ingest_pb2.UpsertResponse) -> List[DocumentResult]:
    return [DocumentResult(_python_id(r.id), r.code, r.message, r.version, r.num_vectors)
            for r in response.results]


def check_documents(docs: Sequence[Document]) -> None:
    """Raises the TypeError/ValueError of the first document that does not encode, before
    anything is sent."""
    for index, doc in enumerate(docs):
        if not isinstance(doc, ingest_pb2.Document):
            _document_parts(doc, index)


def delete_request(collection: str, ids: Union[str, Sequence[str], None] = None,
                   filter: FilterLike = None) -> ingest_pb2.DeleteRequest:
    """By ids, or (filter, not empty) every document matching it; not both."""
    if filter is not None:
        if ids is not None:
            raise TypeError("delete: give ids or filter, not both")
        request = ingest_pb2.DeleteRequest(collection=collection)
        encoded_filter = encode_filter(filter)
        if encoded_filter is not None:
            request.filter.CopyFrom(encoded_filter)
        return request
    if ids is None:
        raise TypeError("delete: give ids or filter")
    if isinstance(ids, str):
        ids = [ids]
    return ingest_pb2.DeleteRequest(collection=collection, ids=[_wire_id(i) for i in ids])


def delete_result(response: ingest_pb2.DeleteResponse,
                  by_filter: bool = False) -> Union[List[bool], int]:
    """By ids: per id, whether it existed; by filter: how many documents were deleted."""
    return response.deleted if by_filter else list(response.existed)


def get_request(collection: str, id: str) -> ingest_pb2.GetRequest:
    return ingest_pb2.GetRequest(collection=collection, id=_wire_id(id))


def get_result(response: ingest_pb2.GetResponse) -> Dict[str, Any]:
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
        "sparse": (np.array(response.sparse.indices, dtype=np.uint32),
                   np.array(response.sparse.values, dtype=np.float32))
        if response.HasField("sparse") else None,
    }


def search_request(collection: str, query: Any, k: int = 10, num_candidates: int = 0,
                   filter: FilterLike = None, exhaustive: bool = False, explain: bool = False,
                   per_token_candidates: int = 0, dtype: DTypeLike = None, nprobe: int = 0,
                   allow_partial_results: bool = False, with_attributes: AttributesLike = False,
                   group_by: Optional[str] = None, group_size: Optional[int] = None,
                   groups: Optional[int] = None, sparse_query: SparseLike = None,
                   fusion: Optional[str] = None, dense_weight: Optional[float] = None,
                   sparse_weight: Optional[float] = None, rrf_k: Optional[float] = None,
                   fusion_candidates: int = 0,
                   rerank: bool = False) -> query_pb2.SearchRequest:
    if query is None and sparse_query is None:
        raise TypeError("search: query is None and no sparse_query; expected a query matrix, a "
                        "sparse_query or both")
    request = query_pb2.SearchRequest(
        collection=collection, k=k,
        num_candidates=num_candidates, per_token_candidates=per_token_candidates,
        nprobe=nprobe, exhaustive=exhaustive, explain=explain,
        allow_partial_results=allow_partial_results)
    if query is not None:
        request.query.CopyFrom(encode_matrix(query, dtype))
    if sparse_query is not None:
        request.sparse_query.CopyFrom(encode_sparse(sparse_query, "sparse_query"))
        if fusion is not None:
            request.fusion = _lookup(_FUSIONS, fusion, "fusion")
        if dense_weight is not None:
            request.dense_weight = dense_weight
        if sparse_weight is not None:
            request.sparse_weight = sparse_weight
        if rrf_k is not None:
            request.rrf_k = rrf_k
        request.fusion_candidates = fusion_candidates
        request.rerank = rerank
    elif (fusion is not None or dense_weight is not None or sparse_weight is not None or
          rrf_k is not None or fusion_candidates or rerank):
        raise TypeError("search: fusion, dense_weight, sparse_weight, rrf_k, fusion_candidates "
                        "and rerank need a sparse_query")
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


def _hit(h: query_pb2.Hit) -> Hit:
    return Hit(_python_id(h.id), h.score, h.version,
               [TokenMatch(m.query_token, m.document_vector, m.similarity,
                           list(m.covered_tokens)) for m in h.explanation],
               {k: _python_value(v) for k, v in h.attributes.items()},
               h.dense_score if h.HasField("dense_score") else None,
               h.sparse_score if h.HasField("sparse_score") else None)


def search_result(response: query_pb2.SearchResponse) -> SearchResult:
    timings = {"candidates_ms": response.timings.candidates_ms,
               "fetch_ms": response.timings.fetch_ms,
               "rerank_ms": response.timings.rerank_ms,
               "total_ms": response.timings.total_ms}
    if response.timings.fanout_ms:
        timings["fanout_ms"] = response.timings.fanout_ms
    result = SearchResult([_hit(h) for h in response.hits], timings, response.documents_scored,
                          response.exhaustive, response.missing_shards)
    result.groups = [Group(_python_value(g.value), [_hit(h) for h in g.hits])
                     for g in response.groups]
    return result


_SEARCH_OPTIONS = dict(k=10, num_candidates=0, filter=None, exhaustive=False, explain=False,
                       per_token_candidates=0, dtype=None, nprobe=0,
                       allow_partial_results=False, with_attributes=False, group_by=None,
                       group_size=None, groups=None, sparse_query=None, fusion=None,
                       dense_weight=None, sparse_weight=None, rrf_k=None, fusion_candidates=0,
                       rerank=False)


def search_batch_request(collection: str, queries: Iterable[Any],
                         options: Mapping[str, Any]) -> query_pb2.SearchBatchRequest:
    """`options` as `search`'s keyword arguments, the same for every query."""
    unknown = set(options) - set(_SEARCH_OPTIONS)
    if unknown:
        raise TypeError(f"unknown search options {sorted(unknown)}")
    settings: Dict[str, Any] = {**_SEARCH_OPTIONS, **options}
    return query_pb2.SearchBatchRequest(searches=[
        search_request(collection, query, **settings) for query in queries])


def search_batch_result(response: query_pb2.SearchBatchResponse) -> List[SearchResult]:
    return [search_result(r) for r in response.responses]


def count_request(collection: str, filter: FilterLike = None) -> query_pb2.CountRequest:
    request = query_pb2.CountRequest(collection=collection)
    encoded_filter = encode_filter(filter)
    if encoded_filter is not None:
        request.filter.CopyFrom(encoded_filter)
    return request


def count_result(response: query_pb2.CountResponse) -> int:
    return response.count


def scroll_request(collection: str, filter: FilterLike = None, after: Optional[str] = None,
                   limit: int = 100,
                   with_attributes: AttributesLike = False) -> query_pb2.ScrollRequest:
    request = query_pb2.ScrollRequest(collection=collection, limit=limit,
                                      after=_wire_id(after) if after else b"")
    encoded_filter = encode_filter(filter)
    if encoded_filter is not None:
        request.filter.CopyFrom(encoded_filter)
    _set_with_attributes(request, with_attributes)
    return request


def scroll_result(response: query_pb2.ScrollResponse) -> ScrollPage:
    documents = [{"id": _python_id(d.id), "version": d.version,
                  "attributes": {k: _python_value(v) for k, v in d.attributes.items()}}
                 for d in response.documents]
    return ScrollPage(documents,
                      _python_id(response.next_after) if response.next_after else None)


# grpc.health.v1 is not among the generated stubs: its two tiny messages are encoded here.
HEALTH_METHOD = "/grpc.health.v1.Health/Check"


def health_request(service: str = "") -> bytes:
    name = service.encode()
    return b"\x0a" + _varint(len(name)) + name if name else b""


def health_result(response: bytes) -> str:
    """"SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN"."""
    status = response[1] if len(response) >= 2 and response[0] == 0x08 else 0
    return {1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}.get(status, "UNKNOWN")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


# ---------------------------------------------------------------------------------------------
# Channel settings.

PemLike = Union[bytes, str, "os.PathLike[str]", None]


def _read_pem(value: PemLike) -> Optional[bytes]:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    with open(value, "rb") as f:
        return f.read()


def call_metadata(api_key: Optional[str]) -> Tuple[Tuple[str, str], ...]:
    """The metadata of every call: `authorization: Bearer KEY` when there is a key."""
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()


def channel_options(tls_server_name: Optional[str],
                    options: Sequence[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
    # The server enforces its own message size limit; the client sets none.
    result: List[Tuple[str, Any]] = [("grpc.max_send_message_length", -1),
                                     ("grpc.max_receive_message_length", -1)]
    if tls_server_name:
        result.append(("grpc.ssl_target_name_override", tls_server_name))
    result.extend(options)
    return result


def channel_credentials(tls_root_cert: PemLike, tls_client_cert: PemLike,
                        tls_client_key: PemLike) -> Optional[grpc.ChannelCredentials]:
    """TLS credentials when a root or client certificate is given, None for plaintext."""
    if tls_root_cert is None and tls_client_cert is None:
        return None
    return grpc.ssl_channel_credentials(root_certificates=_read_pem(tls_root_cert),
                                        private_key=_read_pem(tls_client_key),
                                        certificate_chain=_read_pem(tls_client_cert))


def error_of(error: Exception, failure: List[BaseException]) -> BaseException:
    """What a stream that failed with `error` raises: the exception that ended its request
    stream early (a document that does not encode, a failing iterator), or the TesseraError of
    the RPC's status."""
    if failure:
        return failure[0]
    if isinstance(error, grpc.RpcError):
        return TesseraError.from_rpc_error(error)
    return error


@contextlib.contextmanager
def tessera_errors() -> Iterator[None]:
    """Raises a gRPC error of the block as TesseraError (for the calls a client does not make
    through its `_call`: the streams, which are sent once)."""
    try:
        yield
    except grpc.RpcError as error:
        raise TesseraError.from_rpc_error(error) from None


def retry_delay(policy: Optional[RetryPolicy], error: grpc.RpcError, retry: int,
                deadline: Optional[float]) -> Optional[float]:
    """Seconds to wait before retrying a call that failed with `error` (its `retry`-th retry),
    or None to raise it: no policy, a code the policy does not retry, the attempts used up, or
    no time left before `deadline` (time.monotonic())."""
    if policy is None or not policy.retries(error.code() if hasattr(error, "code") else None):
        return None
    delay = policy.delay(retry)
    if delay is None or (deadline is not None and time.monotonic() + delay >= deadline):
        return None
    return delay
