"""JSON bodies and JSON tensors <-> numpy arrays, with the request limits checked first.

A JSON tensor is a (nested) list of leaves: numbers, ``true``/``false``, strings (UTF-8 bytes
for the model) or ``{"b64": "<base64>"}`` (bytes). ``json_array`` walks it once, checking that
it is rectangular, at most ``Limits.max_tensor_elements`` elements (counted before any array is
made), strings within ``Limits.max_string_bytes`` and no mix of strings and numbers; then makes
one array: bytes -> object array, booleans -> bool, integers -> int64, numbers with a fraction
-> float64 (``for_dtype`` float: integers too).

Output arrays go back as lists (``tolist``); bytes as UTF-8 text when they decode, else (and for
every value when ``b64`` is set) as ``{"b64": "..."}``.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import numpy as np

from serving.codec import check_count, check_strings
from serving.config import Limits
from serving.inference import invalid

MAX_RANK = 32  # dimensions of one JSON tensor
_INT64 = (-(2**63), 2**63 - 1)


def parse_json(body: bytes, where: str) -> Any:
    """The JSON document in ``body`` (INVALID_ARGUMENT naming the position when it is not)."""
    if not body:
        raise invalid(f"{where}: the request body is empty; expected a JSON object")
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise invalid(f"{where}: the request body is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise invalid(f"{where}: the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise invalid(f"{where}: the JSON document is nested too deeply") from None


def json_object(doc: Any, where: str) -> dict:
    if not isinstance(doc, dict):
        raise invalid(f"{where}: expected a JSON object, got {type_name(doc)}")
    return doc


def type_name(value: Any) -> str:
    """The JSON name of a decoded value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _b64(value: dict, where: str) -> bytes:
    if set(value) != {"b64"} or not isinstance(value["b64"], str):
        raise invalid(f'{where}: an object value must be {{"b64": "<base64 text>"}}')
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"{where}: the b64 value is not valid base64") from None


def _flatten(value: Any, where: str, limit: int) -> tuple[list[Any], list[int]]:
    """The leaves of a nested list, row-major, and its shape (rectangular, at most ``limit``
    leaves, at most ``MAX_RANK`` dimensions)."""
    shape: list[int] = []
    leaves: list[Any] = []
    rank: int | None = None
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, list):
            if rank is not None and depth >= rank:
                raise invalid(f"{where}: the array is ragged (a list where a value is expected)")
            if depth == len(shape):
                if depth >= MAX_RANK:
                    raise invalid(f"{where}: the array has more than {MAX_RANK} dimensions")
                shape.append(len(v))
            elif shape[depth] != len(v):
                raise invalid(
                    f"{where}: the array is ragged: lists of {shape[depth]} and {len(v)} values "
                    f"at depth {depth}"
                )
            stack.extend((x, depth + 1) for x in reversed(v))
            continue
        if rank is None:
            rank = depth
            if depth < len(shape) or any(d == 0 for d in shape):
                raise invalid(f"{where}: the array is ragged (a value where a list is expected)")
        elif depth != rank:
            raise invalid(f"{where}: the array is ragged (a value where a list is expected)")
        leaves.append(v)
        check_count(len(leaves), where, limit)
    return leaves, shape


def _leaf_kind(v: Any, where: str) -> str:
    if isinstance(v, bool):
        return "b"
    if isinstance(v, int):
        if not _INT64[0] <= v <= _INT64[1]:
            raise invalid(f"{where}: the integer {v} does not fit in 64 bits")
        return "i"
    if isinstance(v, float):
        return "f"
    if isinstance(v, str | dict):
        return "s"
    raise invalid(f"{where}: {type_name(v)} is not a tensor value")


def json_array(
    value: Any, where: str, limits: Limits, for_dtype: np.dtype | None = None
) -> np.ndarray:
    """A JSON tensor (a leaf, or nested lists of leaves) -> a numpy array of its shape."""
    leaves, shape = _flatten(value, where, limits.max_tensor_elements)
    kinds = {_leaf_kind(v, where) for v in leaves}
    if "s" in kinds:
        if len(kinds) > 1:
            raise invalid(f"{where}: the array mixes strings and numbers")
        values = [v.encode() if isinstance(v, str) else _b64(v, where) for v in leaves]
        check_strings(values, where, limits)
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out.reshape(shape)
    wants_float = for_dtype is not None and np.dtype(for_dtype).kind == "f"
    if kinds == {"b"}:
        dtype: Any = np.bool_
    elif "f" in kinds or (wants_float and kinds):
        dtype = np.float64
    else:
        dtype = np.int64
    return np.array(leaves, dtype=dtype).reshape(shape)


def bytes_value(v: Any, b64: bool = False) -> Any:
    """One output string: UTF-8 text, else (or with ``b64``) ``{"b64": ...}``."""
    if not isinstance(v, bytes):
        return str(v)
    if not b64:
        try:
            return v.decode()
        except UnicodeDecodeError:
            pass
    return {"b64": base64.b64encode(v).decode()}


def to_json(array: np.ndarray, b64: bool = False) -> Any:
    """An output array -> nested lists (strings: see ``bytes_value``)."""
    if array.dtype == np.object_ or array.dtype.kind in "SU":
        flat = [bytes_value(v, b64) for v in array.reshape(-1)]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(array.shape).tolist()
    return array.tolist()
