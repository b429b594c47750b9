"""KServe v2 (Open Inference Protocol) over HTTP/REST, with the binary tensor data extension.

- ``GET /v2/health/live`` and ``/v2/health/ready``: ``{"live": true}`` / ``{"ready": bool}``;
  ready (``serving.kserve.server_ready``) answers 503 while the repository holds no model,
  until every model has a ready version, and from the start of a stop.
- ``GET /v2``: server metadata; ``GET /v2/models/{m}[/versions/{v}]``: model metadata;
  ``GET .../ready``: 200 ``{"name", "ready": true}``, 503 when not ready, 404 for no such model.
- ``POST .../infer``: ``{"id", "parameters", "inputs": [{"name", "shape", "datatype", "data"}],
  "outputs": [{"name", "parameters": {"binary_data": bool}}]}``; answers ``{"model_name",
  "model_version", "id", "outputs": [{"name", "shape", "datatype", "data"}]}``.

Binary tensor data: with header ``Inference-Header-Content-Length: N`` the first N bytes of the
body are the JSON header and the rest the inputs that say ``"parameters": {"binary_data_size":
n}``, in their order (BYTES: each element a 4-byte little-endian length then its bytes; other
types: little-endian values). An output asked with ``binary_data`` (or every output, with the
request's ``parameters.binary_data_output``) comes back the same way, after the JSON header, with
``parameters.binary_data_size`` and the header ``Inference-Header-Content-Length``.

Declared shapes are checked against ``Limits.max_tensor_elements`` and the binary sizes against
the body before anything is decoded.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import numpy as np
from aiohttp import web

from serving import inference
from serving.codec import (
    KSERVE_DTYPES,
    decode_bytes,
    element_count,
    kserve_datatype,
    numpy_to_kserve_raw,
)
from serving.config import Limits
from serving.http.endpoint import answer_headers, dumps, endpoint, read_body, state_of
from serving.http.errors import json_response
from serving.http.jsonio import json_array, json_object, parse_json, to_json, type_name
from serving.http.versions import feature_key, resolve_version, route_version
from serving.inference import check_names, invalid
from serving.kserve import SERVER_NAME, SERVER_VERSION, server_ready
from serving.model_version import ModelNotFound
from serving.rpc import INLINE_BYTES, check_outputs

HEADER_LENGTH = "Inference-Header-Content-Length"
EXTENSIONS = ["binary_tensor_data"]
DATATYPES = ["BYTES", *KSERVE_DTYPES]


def _named(request: web.Request) -> tuple[str, int | None, str | None]:
    """The model, version and label a path names (a version that is not all digits is a
    label)."""
    model = request.match_info["model"]
    text = request.match_info.get("version", "")
    if not text:
        return model, None, None
    if text.isascii() and text.isdigit():
        if int(text) < 1:
            raise invalid(f"/v2/models/{model}: model version must be >= 1, got {text}")
        return model, int(text), None
    return model, None, text


def _version(request: web.Request) -> tuple[str, int | None]:
    """The model and version a path names (a label: the version it names)."""
    model, version, label = _named(request)
    return model, resolve_version(state_of(request), model, version, label)


@endpoint("ServerLive")
async def live(request: web.Request) -> web.Response:
    return json_response({"live": True})


@endpoint("ServerReady")
async def ready(request: web.Request) -> web.Response:
    up = server_ready(state_of(request))
    return json_response({"ready": up}, 200 if up else 503)


@endpoint("ServerMetadata")
async def server_metadata(request: web.Request) -> web.Response:
    return json_response({"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS})


@endpoint("ModelReady")
async def model_ready(request: web.Request) -> web.Response:
    state = state_of(request)
    model, version = _version(request)
    if model not in state.repo.model_names():
        raise ModelNotFound(f"unknown model {model!r}")
    up = state.repo.ready(model, version) and not state.shutting_down
    return json_response({"name": model, "ready": up}, 200 if up else 503)


@endpoint("ModelMetadata")
async def model_metadata(request: web.Request) -> web.Response:
    state = state_of(request)
    model, version = _version(request)
    mv = state.repo.get(model, version)
    body = {
        "name": model,
        "versions": [str(v) for v in state.repo.live_versions(model)],
        "platform": "tensorflow_savedmodel",
        "inputs": [
            {"name": n, "datatype": kserve_datatype(s.tf_dtype), "shape": [-1]}
            for n, s in sorted(mv.inputs.items())
        ],
        "outputs": [
            {
                "name": n,
                "datatype": kserve_datatype(s.dtype),
                "shape": [-1 if d is None else d for d in s.shape.as_list()],
            }
            for n, s in sorted(mv.outputs.items())
        ],
    }
    return json_response(body)


@dataclasses.dataclass
class _Input:
    name: str
    shape: list[int]
    datatype: str
    count: int
    data: Any = None
    raw: bytes | None = None


def _split(body: bytes, header: str | None, where: str) -> tuple[bytes, bytes]:
    """(JSON header, binary data) of an infer body."""
    if header is None:
        return body, b""
    if not (header.isascii() and header.isdigit()) or int(header) > len(body):
        raise invalid(
            f"{where}: {HEADER_LENGTH} is {header[:32]!r}; expected the JSON header's "
            f"size in bytes, at most the body's {len(body)}"
        )
    n = int(header)
    return body[:n], body[n:]


def _parameters(item: dict, where: str) -> dict:
    params = item.get("parameters", {})
    if not isinstance(params, dict):
        raise invalid(f"{where}: parameters must be an object, got {type_name(params)}")
    return params


def _shape(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in value
    ):
        raise invalid(f"{where}: shape must be an array of integers, got {type_name(value)}")
    return value


def _inputs(doc: dict, binary: bytes, where: str, limits: Limits) -> list[_Input]:
    """The request's inputs with their declared sizes checked (nothing decoded yet)."""
    items = doc.get("inputs")
    if not isinstance(items, list) or not items:
        raise invalid(f"{where}: 'inputs' must be a non-empty array, got {type_name(items)}")
    out: list[_Input] = []
    pos = 0
    for i, item in enumerate(items):
        here = f"{where} input {i}"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise invalid(f"{here}: expected an object with a string 'name'")
        here = f"{where} input {item['name'][:64]!r}"
        dt = item.get("datatype")
        if dt not in DATATYPES:
            raise invalid(
                f"{here}: unsupported datatype {str(dt)[:32]!r}; expected one of {DATATYPES}"
            )
        shape = _shape(item.get("shape"), here)
        count = element_count(shape, here, limits.max_tensor_elements)
        params = _parameters(item, here)
        if any(k.startswith("shared_memory") for k in params):
            raise invalid(f"{here}: shared memory inputs are not supported")
        size = params.get("binary_data_size")
        entry = _Input(item["name"], shape, dt, count)
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise invalid(f"{here}: binary_data_size must be an integer >= 0")
            if pos + size > len(binary):
                raise invalid(
                    f"{here}: binary_data_size {size} runs past the binary data "
                    f"({len(binary)} bytes after the JSON header)"
                )
            entry.raw = binary[pos : pos + size]
            pos += size
        elif "data" not in item:
            raise invalid(f"{here}: no 'data' and no parameters.binary_data_size")
        else:
            entry.data = item["data"]
        out.append(entry)
    if pos != len(binary):
        raise invalid(f"{where}: {len(binary) - pos} bytes of binary data left after the inputs")
    counts = collections.Counter(t.name for t in out)
    twice = sorted(n for n, c in counts.items() if c > 1)
    if twice:
        raise invalid(f"{where}: input(s) {twice} appear more than once")
    return out


# the array kinds JSON data may decode to for a datatype (BYTES, or the numpy kind)
_KINDS = {"BYTES": "O", "b": "b", "f": "fiu", "i": "iu", "u": "iu"}
_WORDS = {"O": "strings", "b": "booleans", "f": "numbers", "i": "integers", "u": "integers"}


def _decode(t: _Input, where: str, limits: Limits) -> np.ndarray:
    here = f"{where} input {t.name!r}"
    if t.raw is not None:
        if t.datatype == "BYTES":
            return decode_bytes(t.raw, t.count, here, limits).reshape(t.shape)
        dtype = KSERVE_DTYPES[t.datatype].newbyteorder("<")
        if len(t.raw) != t.count * dtype.itemsize:
            raise invalid(
                f"{here}: binary data has {len(t.raw)} bytes; shape {t.shape} of "
                f"{t.datatype} needs {t.count * dtype.itemsize}"
            )
        return np.frombuffer(t.raw, dtype=dtype).astype(dtype.newbyteorder("="))
    want = None if t.datatype == "BYTES" else KSERVE_DTYPES[t.datatype]
    arr = json_array(t.data, here, limits, want).reshape(-1)
    if arr.size != t.count:
        raise invalid(f"{here}: {arr.size} values for shape {t.shape} ({t.count} elements)")
    if arr.size and arr.dtype.kind not in _KINDS[t.datatype if want is None else want.kind]:
        raise invalid(
            f"{here}: the data are {_WORDS[arr.dtype.kind]}; datatype {t.datatype} needs "
            f"{_WORDS[_KINDS[t.datatype if want is None else want.kind][0]]}"
        )
    if want is not None and want.kind in "iu" and arr.size:
        info = np.iinfo(want)
        if arr.min() < info.min or arr.max() > info.max:
            raise invalid(f"{here}: a value is out of the range of {t.datatype}")
    if want is not None:
        arr = arr.astype(want)
    return arr.reshape(t.shape)


def _wanted(doc: dict, outputs: dict[str, np.ndarray], where: str) -> list[tuple[str, bool]]:
    """(output name, binary) for each output to send."""
    binary_all = bool(_parameters(doc, where).get("binary_data_output", False))
    asked = doc.get("outputs")
    if asked is None:
        return [(n, binary_all) for n in sorted(outputs)]
    if not isinstance(asked, list) or not all(
        isinstance(o, dict) and isinstance(o.get("name"), str) for o in asked
    ):
        raise invalid(f"{where}: 'outputs' must be an array of objects with a string 'name'")
    names = [o["name"] for o in asked]
    check_outputs(names, outputs, where, "unknown output(s)")
    return [(o["name"], bool(_parameters(o, where).get("binary_data", binary_all))) for o in asked]


@endpoint("ModelInfer")
async def infer(request: web.Request) -> web.Response:
    state = state_of(request)
    model, version = _version(request)
    where = f"/v2/models/{model}/infer"
    target = inference.resolve(state.repo, model, version)
    body = await read_body(request)
    head, binary = _split(body, request.headers.get(HEADER_LENGTH), where)
    limits = state.limits
    if len(head) <= INLINE_BYTES:
        doc = json_object(parse_json(head, where), where)
    else:
        doc = json_object(await state.offload(lambda: parse_json(head, where)), where)
    tensors = _inputs(doc, binary, where, limits)
    by_name = {t.name: t for t in tensors}
    _, named, label = _named(request)
    chosen = route_version(
        state,
        request,
        model,
        named,
        label,
        lambda f: feature_key(by_name, f, lambda t: _decode(t, where, limits)),
    )
    if chosen is not None and chosen != target.mv.version:
        target = inference.resolve(state.repo, model, chosen)
    check_names(target.specs, [t.name for t in tensors], target.where)

    def decode() -> tuple[dict, int]:
        arrays = {t.name: _decode(t, where, limits) for t in tensors}
        return inference.check_inputs(target, arrays, limits, strings_checked=True)

    outputs = await inference.run(target, decode, None, state.offload, state.observers)
    resp = await _answer(request, doc, outputs, model, target.mv.version, where)
    return answer_headers(resp, target.mv.version)


async def _answer(
    request: web.Request, doc: dict, outputs: dict, model: str, version: int, where: str
) -> web.Response:
    wanted = _wanted(doc, outputs, where)
    blobs: list[bytes] = []
    items = []
    for name, binary in wanted:
        arr = outputs[name]
        item: dict[str, Any] = {
            "name": name,
            "datatype": kserve_datatype(arr.dtype),
            "shape": list(arr.shape),
        }
        if binary:
            blob = numpy_to_kserve_raw(arr)
            blobs.append(blob)
            item["parameters"] = {"binary_data_size": len(blob)}
        else:
            item["data"] = to_json(arr.reshape(-1))
        items.append(item)
    out: dict[str, Any] = {"model_name": model, "model_version": str(version)}
    if isinstance(doc.get("id"), str):
        out["id"] = doc["id"]
    out["outputs"] = items
    head = await dumps(request, out)
    if not blobs:
        return web.Response(body=head, content_type="application/json")
    return web.Response(
        body=head + b"".join(blobs),
        content_type="application/octet-stream",
        headers={HEADER_LENGTH: str(len(head))},
    )
