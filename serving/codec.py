"""Wire tensors <-> numpy arrays for the three protocols.

- StitchRec ``Feature`` (``bytes_list`` / ``int64_list`` / ``float_list``) -> a 1-D array;
- TF Serving ``TensorProto`` <-> an array (``tf.make_ndarray`` / ``tf.make_tensor_proto``);
- KServe v2 tensors: typed ``contents`` or ``raw_input_contents`` -> an array of the tensor's
  shape, and an array -> a ``datatype`` name plus raw little-endian bytes (BYTES: each element a
  4-byte little-endian length then its bytes).

Sizes are checked against ``serving.config.Limits`` on what the request declares (element
counts, string lengths, the bytes a broadcast would add) before any array is allocated, so a
small request cannot make the server allocate much more than its own size. Malformed or too
large input raises ``ServingError`` (INVALID_ARGUMENT) naming where it was and the limit.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import tensorflow as tf

from protos import grpc_service_pb2 as kserve_pb2
from protos import ranking_service_pb2 as rank_pb2
from serving.config import Limits
from serving.inference import invalid

# TensorProto dtypes a request may use: enum value -> bytes per element (0: strings)
_TF_DTYPES = {
    tf.dtypes.as_dtype(d).as_datatype_enum: (0 if d == tf.string else tf.dtypes.as_dtype(d).size)
    for d in (
        tf.string,
        tf.int64,
        tf.int32,
        tf.int16,
        tf.int8,
        tf.uint8,
        tf.uint16,
        tf.uint32,
        tf.uint64,
        tf.float32,
        tf.float64,
        tf.float16,
        tf.bool,
    )
}
_TF_NAME = {e: tf.dtypes.as_dtype(e).name for e in _TF_DTYPES}
_TF_NAMES = sorted(_TF_NAME.values())

# --------------------------------------------------------------------------------------------
# StitchRec RankingService


def check_strings(values: Any, where: str, limits: Limits) -> None:
    """INVALID_ARGUMENT when one of ``values`` (bytes) is longer than ``limits.max_string_bytes``."""
    if not len(values):
        return
    longest = max(map(len, values))
    if longest > limits.max_string_bytes:
        raise invalid(
            f"{where}: a string value has {longest} bytes; the server accepts at most "
            f"{limits.max_string_bytes} bytes per value"
        )


def check_count(count: int, where: str, limit: int, what: str = "values") -> None:
    if count > limit:
        raise invalid(f"{where}: {count} {what}; the server accepts at most {limit}")


def feature_to_numpy(
    name: str, feature: rank_pb2.Feature, where: str, limits: Limits | None = None
) -> np.ndarray:
    """One ``Feature`` message -> a 1-D numpy array (object for strings)."""
    limits = limits or Limits()
    kind = feature.WhichOneof("kind")
    here = f"{where}: feature {name!r}"
    if kind is None:
        raise invalid(f"{here} has no values (set bytes_list, int64_list or float_list)")
    values = getattr(feature, kind).value
    check_count(len(values), here, limits.max_request_rows)
    if kind == "bytes_list":
        check_strings(values, here, limits)
        return np.array(list(values), dtype=object)
    if kind == "int64_list":
        return np.array(values, dtype=np.int64)
    return np.array(values, dtype=np.float32)


def features_to_numpy(
    features: Any, where: str, limits: Limits | None = None
) -> dict[str, np.ndarray]:
    """A ``map<string, Feature>`` -> ``{name: array}``."""
    return {k: feature_to_numpy(k, f, where, limits) for k, f in features.items()}


def element_count(shape: list[int], where: str, limit: int) -> int:
    """The element count of a declared ``shape``, refused (INVALID_ARGUMENT) when a dimension
    is negative or the count exceeds ``limit`` (exact integer arithmetic: no overflow)."""
    count = 1
    for d in shape:
        if d < 0:
            raise invalid(f"{where}: shape {shape[:8]} has a negative dimension")
    for d in shape:
        count *= d
        if count > limit:
            raise invalid(
                f"{where}: shape {shape[:8]} declares more than {limit} elements; the server "
                f"accepts at most {limit} per input"
            )
    return count


# --------------------------------------------------------------------------------------------
# TF Serving TensorProto


def _check_tensor_proto(tp: Any, where: str, limits: Limits) -> None:
    """What ``tf.make_ndarray`` would allocate for ``tp``, checked before it runs: a known
    dtype and shape, at most ``max_tensor_elements`` elements, ``tensor_content`` of exactly the
    declared size, strings within ``max_string_bytes``, and a fill (fewer values than elements
    repeat the last one) adding at most ``max_broadcast_bytes``."""
    if tp.dtype not in _TF_DTYPES:
        raise invalid(f"{where}: dtype {tp.dtype} is not supported; expected one of {_TF_NAMES}")
    if tp.tensor_shape.unknown_rank:
        raise invalid(f"{where}: the tensor_shape has an unknown rank")
    shape = [d.size for d in tp.tensor_shape.dim]
    count = element_count(shape, where, limits.max_tensor_elements)
    size = _TF_DTYPES[tp.dtype]
    if tp.tensor_content:
        if size == 0 or len(tp.tensor_content) != count * size:
            raise invalid(
                f"{where}: tensor_content has {len(tp.tensor_content)} bytes; shape {shape} of "
                f"{_TF_NAME[tp.dtype]} needs {count * size}"
            )
        return
    if size:
        return  # numeric values: at most count elements of at most 8 bytes
    values = tp.string_val
    check_count(len(values), where, max(count, 1), "string values for the shape's elements")
    check_strings(values, where, limits)
    added = (count - len(values)) * (len(values[-1]) if len(values) else 0)
    if added > limits.max_broadcast_bytes:
        raise invalid(
            f"{where}: {len(values)} string values fill shape {shape}, repeating the last one "
            f"to {added} more bytes; the server accepts at most {limits.max_broadcast_bytes}"
        )


def tensor_protos_to_numpy(
    inputs: Any, where: str, limits: Limits | None = None
) -> dict[str, np.ndarray]:
    """A ``map<string, TensorProto>`` -> ``{name: array}``."""
    limits = limits or Limits()
    out = {}
    for k, tp in inputs.items():
        here = f"{where}: input {k!r}"
        _check_tensor_proto(tp, here, limits)
        try:
            out[k] = tf.make_ndarray(tp)
        except Exception as e:
            raise invalid(f"{here} is not a valid TensorProto: {e}") from None
    return out


def numpy_to_tensor_proto(array: np.ndarray) -> Any:
    """An array -> a ``TensorProto``."""
    return tf.make_tensor_proto(array)


# --------------------------------------------------------------------------------------------
# KServe v2

KSERVE_DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def kserve_datatype(dtype: tf.DType | np.dtype) -> str:
    """The KServe datatype name of a TensorFlow or numpy dtype (strings: ``BYTES``)."""
    d = tf.as_dtype(dtype)
    if d == tf.string:
        return "BYTES"
    for k, v in KSERVE_DTYPES.items():
        if v == np.dtype(d.as_numpy_dtype):
            return k
    raise ValueError(f"no KServe datatype for {d}")


def decode_bytes(raw: bytes, count: int, where: str, limits: Limits | None = None) -> np.ndarray:
    """KServe raw BYTES: each element is a 4-byte little-endian length then that many bytes.

    Elements of one length (ids, hashes: the common case) are read with numpy in one pass;
    others element by element.
    """
    limits = limits or Limits()
    if count and len(raw) >= 4:
        (first,) = struct.unpack_from("<I", raw, 0)
        if len(raw) == count * (4 + first):
            rows = np.frombuffer(raw, dtype=np.uint8).reshape(count, 4 + first)
            lengths = rows[:, :4].copy().view("<u4").reshape(count)
            if (lengths == first).all():
                if first > limits.max_string_bytes:
                    check_strings([raw[4 : 4 + first]], where, limits)
                step = 4 + first
                return _object_array([raw[i + 4 : i + step] for i in range(0, len(raw), step)])
    out = []
    pos = 0
    for i in range(count):
        if pos + 4 > len(raw):
            raise invalid(f"{where}: raw BYTES content ends at element {i} of {count}")
        (n,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise invalid(f"{where}: raw BYTES element {i} runs past the end of the content")
        if n > limits.max_string_bytes:
            check_strings([raw[pos : pos + n]], f"{where} element {i}", limits)
        out.append(raw[pos : pos + n])
        pos += n
    if pos != len(raw):
        raise invalid(f"{where}: {len(raw) - pos} bytes of raw content left after {count} elements")
    return _object_array(out)


def _object_array(values: list[bytes]) -> np.ndarray:
    """A 1-D object array of ``values`` (numpy would make 2-D arrays of equal-length tuples)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def encode_bytes(values: np.ndarray) -> bytes:
    """An array of bytes (or anything ``str`` can print) -> KServe raw BYTES content."""
    parts = []
    for v in values.reshape(-1):
        b = v if isinstance(v, bytes) else str(v).encode()
        parts.append(struct.pack("<I", len(b)) + b)
    return b"".join(parts)


def _decode_raw(
    raw: bytes, dt: str, shape: list[int], count: int, where: str, limits: Limits
) -> np.ndarray:
    if dt == "BYTES":
        return decode_bytes(raw, count, where, limits)
    dtype = KSERVE_DTYPES[dt].newbyteorder("<")
    if len(raw) != count * dtype.itemsize:
        raise invalid(
            f"{where}: raw content has {len(raw)} bytes; shape {shape} of {dt} needs "
            f"{count * dtype.itemsize}"
        )
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="))


def _decode_contents(
    tensor: Any, dt: str, shape: list[int], count: int, where: str, limits: Limits
) -> np.ndarray:
    field = _CONTENTS_FIELD.get(dt)
    if field is None:
        raise invalid(f"{where}: datatype {dt} must be sent in raw_input_contents")
    values = getattr(tensor.contents, field)
    if len(values) != count:
        raise invalid(f"{where}: {len(values)} values for shape {shape} ({count} elements)")
    if dt == "BYTES":
        check_strings(values, where, limits)
        return _object_array(list(values))
    return np.array(values, dtype=KSERVE_DTYPES[dt])


def kserve_input_to_numpy(
    tensor: kserve_pb2.ModelInferRequest.InferInputTensor,
    raw: bytes | None,
    where: str,
    limits: Limits | None = None,
) -> np.ndarray:
    """One KServe input (typed contents or raw bytes) -> a numpy array of its shape."""
    limits = limits or Limits()
    where = f"{where} input {tensor.name!r}"
    shape = list(tensor.shape)
    count = element_count(shape, where, limits.max_tensor_elements)
    dt = tensor.datatype
    if dt != "BYTES" and dt not in KSERVE_DTYPES:
        raise invalid(
            f"{where}: unsupported datatype {dt!r}; expected one of {['BYTES', *KSERVE_DTYPES]}"
        )
    if raw is not None:
        arr = _decode_raw(raw, dt, shape, count, where, limits)
    else:
        arr = _decode_contents(tensor, dt, shape, count, where, limits)
    return arr.reshape(shape)


def kserve_inputs_to_numpy(
    request: kserve_pb2.ModelInferRequest, where: str, limits: Limits | None = None
) -> dict:
    """Every input of a ``ModelInferRequest`` -> ``{name: array}`` (raw contents, one per input,
    or typed contents)."""
    raws = list(request.raw_input_contents)
    if raws and len(raws) != len(request.inputs):
        raise invalid(
            f"{where}: {len(raws)} raw_input_contents for {len(request.inputs)} inputs; "
            f"send one per input or none"
        )
    features = {}
    for i, t in enumerate(request.inputs):
        if t.name in features:
            raise invalid(f"{where}: input {t.name!r} appears twice")
        features[t.name] = kserve_input_to_numpy(t, raws[i] if raws else None, where, limits)
    return features


def numpy_to_kserve_raw(array: np.ndarray) -> bytes:
    """An output array -> its raw content (BYTES encoding for objects, little-endian else)."""
    if array.dtype == np.object_:
        return encode_bytes(array)
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
