"""Wire tensors <-> numpy arrays for the three protocols.

- StitchRec ``Feature`` (``bytes_list`` / ``int64_list`` / ``float_list``) -> a 1-D array;
- TF Serving ``TensorProto`` <-> an array (``tf.make_ndarray`` / ``tf.make_tensor_proto``);
- KServe v2 tensors: typed ``contents`` or ``raw_input_contents`` -> an array of the tensor's
  shape, and an array -> a ``datatype`` name plus raw little-endian bytes (BYTES: each element a
  4-byte little-endian length then its bytes).

Malformed input raises ``ServingError`` (INVALID_ARGUMENT) naming where it was.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import tensorflow as tf

from protos import grpc_service_pb2 as kserve_pb2
from protos import ranking_service_pb2 as rank_pb2
from serving.inference import invalid

# --------------------------------------------------------------------------------------------
# StitchRec RankingService


def feature_to_numpy(name: str, feature: rank_pb2.Feature, where: str) -> np.ndarray:
    """One ``Feature`` message -> a 1-D numpy array (object for strings)."""
    kind = feature.WhichOneof("kind")
    if kind == "bytes_list":
        return np.array(list(feature.bytes_list.value), dtype=object)
    if kind == "int64_list":
        return np.array(feature.int64_list.value, dtype=np.int64)
    if kind == "float_list":
        return np.array(feature.float_list.value, dtype=np.float32)
    raise invalid(
        f"{where}: feature {name!r} has no values (set bytes_list, int64_list or float_list)"
    )


def features_to_numpy(features: Any, where: str) -> dict[str, np.ndarray]:
    """A ``map<string, Feature>`` -> ``{name: array}``."""
    return {k: feature_to_numpy(k, f, where) for k, f in features.items()}


# --------------------------------------------------------------------------------------------
# TF Serving TensorProto


def tensor_protos_to_numpy(inputs: Any, where: str) -> dict[str, np.ndarray]:
    """A ``map<string, TensorProto>`` -> ``{name: array}``."""
    out = {}
    for k, tp in inputs.items():
        try:
            out[k] = tf.make_ndarray(tp)
        except Exception as e:
            raise invalid(f"{where}: input {k!r} is not a valid TensorProto: {e}") from None
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


def decode_bytes(raw: bytes, count: int, where: str) -> np.ndarray:
    """KServe raw BYTES: each element is a 4-byte little-endian length then that many bytes."""
    out = []
    pos = 0
    for i in range(count):
        if pos + 4 > len(raw):
            raise invalid(f"{where}: raw BYTES content ends at element {i} of {count}")
        (n,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise invalid(f"{where}: raw BYTES element {i} runs past the end of the content")
        out.append(raw[pos : pos + n])
        pos += n
    if pos != len(raw):
        raise invalid(f"{where}: {len(raw) - pos} bytes of raw content left after {count} elements")
    return np.array(out, dtype=object)


def encode_bytes(values: np.ndarray) -> bytes:
    """An array of bytes (or anything ``str`` can print) -> KServe raw BYTES content."""
    parts = []
    for v in values.reshape(-1):
        b = v if isinstance(v, bytes) else str(v).encode()
        parts.append(struct.pack("<I", len(b)) + b)
    return b"".join(parts)


def _decode_raw(raw: bytes, dt: str, shape: list[int], count: int, where: str) -> np.ndarray:
    if dt == "BYTES":
        return decode_bytes(raw, count, where)
    dtype = KSERVE_DTYPES[dt].newbyteorder("<")
    if len(raw) != count * dtype.itemsize:
        raise invalid(
            f"{where}: raw content has {len(raw)} bytes; shape {shape} of {dt} needs "
            f"{count * dtype.itemsize}"
        )
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="))


def _decode_contents(tensor: Any, dt: str, shape: list[int], count: int, where: str) -> np.ndarray:
    field = _CONTENTS_FIELD.get(dt)
    if field is None:
        raise invalid(f"{where}: datatype {dt} must be sent in raw_input_contents")
    values = getattr(tensor.contents, field)
    if len(values) != count:
        raise invalid(f"{where}: {len(values)} values for shape {shape} ({count} elements)")
    if dt == "BYTES":
        return np.array(list(values), dtype=object)
    return np.array(values, dtype=KSERVE_DTYPES[dt])


def kserve_input_to_numpy(
    tensor: kserve_pb2.ModelInferRequest.InferInputTensor, raw: bytes | None, where: str
) -> np.ndarray:
    """One KServe input (typed contents or raw bytes) -> a numpy array of its shape."""
    where = f"{where} input {tensor.name!r}"
    shape = list(tensor.shape)
    if any(d < 0 for d in shape):
        raise invalid(f"{where}: shape {shape} has a negative dimension")
    count = int(np.prod(shape)) if shape else 1
    dt = tensor.datatype
    if dt != "BYTES" and dt not in KSERVE_DTYPES:
        raise invalid(
            f"{where}: unsupported datatype {dt!r}; expected one of {['BYTES', *KSERVE_DTYPES]}"
        )
    if raw is not None:
        arr = _decode_raw(raw, dt, shape, count, where)
    else:
        arr = _decode_contents(tensor, dt, shape, count, where)
    return arr.reshape(shape)


def kserve_inputs_to_numpy(request: kserve_pb2.ModelInferRequest, where: str) -> dict:
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
        features[t.name] = kserve_input_to_numpy(t, raws[i] if raws else None, where)
    return features


def numpy_to_kserve_raw(array: np.ndarray) -> bytes:
    """An output array -> its raw content (BYTES encoding for objects, little-endian else)."""
    if array.dtype == np.object_:
        return encode_bytes(array)
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
