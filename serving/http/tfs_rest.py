"""TF Serving's REST API: ``/v1/models/{m}[/versions/{v}|/labels/{l}][:predict|/metadata]``.

- ``POST ...:predict`` with ``{"signature_name": "...", "instances": [...]}`` (row form: each
  instance an object of named inputs, or a bare value when the signature has one input) answers
  ``{"predictions": [...]}`` (one value per row for one output, else one object per row); with
  ``{"inputs": {...}}`` (columnar form: each input's values, or a bare value when the signature
  has one input) it answers ``{"outputs": {...}}`` (a bare value for one output). Bytes are
  ``{"b64": "..."}``; outputs whose name ends in ``_bytes`` are always sent so.
- ``GET /v1/models/{m}[/versions/{v}]``: ``{"model_version_status": [{"version", "state",
  "status": {"error_code", "error_message"}}]}``, highest version first.
- ``GET /v1/models/{m}[/versions/{v}]/metadata``: ``{"model_spec", "metadata": {"signature_def":
  SignatureDefMap JSON}}``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from aiohttp import web
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2

from serving import inference
from serving.http.endpoint import answer_headers, dumps, endpoint, json_body, state_of
from serving.http.errors import HttpError, json_response
from serving.http.jsonio import json_array, json_object, to_json, type_name
from serving.http.versions import feature_key, resolve_version, route_version
from serving.inference import Target, check_names, invalid
from serving.model_version import ModelNotFound

BYTES_SUFFIX = "_bytes"


@dataclasses.dataclass(frozen=True)
class ModelPath:
    """What a ``/v1/models/...`` path names: model, version or label, and what is asked."""

    model: str
    version: int | None = None
    label: str | None = None
    verb: str = ""  # "predict", "classify", ... after ':'
    metadata: bool = False


MODEL_PATH = web.RequestKey("model_path", ModelPath)


def parse_path(tail: str) -> ModelPath:
    """``lin``, ``lin/versions/2:predict``, ``lin/labels/canary/metadata`` -> a ``ModelPath``
    (404 for a path TF Serving does not have)."""
    path, verb = tail, ""
    last = tail.rsplit("/", 1)[-1]
    if ":" in last:
        path, _, verb = tail.rpartition(":")
    parts = path.split("/")
    metadata = parts[-1] == "metadata" and len(parts) in (2, 4)
    if metadata:
        parts = parts[:-1]
    if not parts[0] or len(parts) not in (1, 3) or (len(parts) == 3 and not parts[2]):
        raise HttpError(404, f"no such path: /v1/models/{tail}")
    out = ModelPath(parts[0], verb=verb, metadata=metadata)
    if len(parts) == 3:
        if parts[1] == "versions":
            v = parts[2]
            if not (v.isascii() and v.isdigit()) or int(v) < 1:
                raise HttpError(400, f"/v1/models/{parts[0]}: version {v[:32]!r} is not >= 1")
            return dataclasses.replace(out, version=int(v))
        if parts[1] == "labels":
            return dataclasses.replace(out, label=parts[2])
        raise HttpError(404, f"no such path: /v1/models/{tail}")
    return out


async def dispatch(request: web.Request) -> web.StreamResponse:
    """Routes ``/v1/models/{tail}`` to the handler its verb and HTTP method name."""
    try:
        spec = parse_path(request.match_info["tail"])
    except HttpError as e:
        return await _refuse(e)(request)
    request[MODEL_PATH] = spec
    if spec.verb:
        if spec.metadata:
            return await _refuse(HttpError(404, f"no such path: {request.path}"))(request)
        if request.method != "POST":
            return await _refuse(HttpError(405, f"{request.path} takes POST"))(request)
        if spec.verb != "predict":
            return await _refuse(
                HttpError(501, f"{spec.verb!r} is not served; this server serves :predict")
            )(request)
        return await predict(request)
    if request.method != "GET":
        return await _refuse(HttpError(405, f"{request.path} takes GET"))(request)
    return await (metadata(request) if spec.metadata else status(request))


def _refuse(error: HttpError) -> Any:
    @endpoint("BadPath")
    async def refuse(request: web.Request) -> web.Response:
        raise error

    return refuse


def _inputs_of(doc: dict, target: Target, where: str) -> tuple[dict[str, Any], bool]:
    """``{input: JSON values}`` of a predict body, and whether it is in row form."""
    forms = [k for k in ("instances", "inputs") if k in doc]
    extra = sorted(set(doc) - {"instances", "inputs", "signature_name"})
    if extra:
        raise invalid(f"{where}: unknown key(s) {extra}; expected instances or inputs")
    if len(forms) != 1:
        raise invalid(
            f"{where}: the body needs exactly one of 'instances' (row form) or "
            f"'inputs' (columnar form)"
        )
    only = next(iter(target.specs)) if len(target.specs) == 1 else None
    if forms[0] == "inputs":
        value = doc["inputs"]
        if isinstance(value, dict) and set(value) != {"b64"}:
            return value, False
        if only is None:
            raise invalid(
                f"{where}: 'inputs' must be an object of named inputs; the signature "
                f"takes {sorted(target.specs)}"
            )
        return {only: value}, False
    rows = doc["instances"]
    if not isinstance(rows, list) or not rows:
        raise invalid(f"{where}: 'instances' must be a non-empty array, got {type_name(rows)}")
    named = [isinstance(r, dict) and set(r) != {"b64"} for r in rows]
    if all(named):
        names = set(rows[0])
        for i, r in enumerate(rows):
            if set(r) != names:
                raise invalid(
                    f"{where}: instance {i} has inputs {inference.name_list(r)}; "
                    f"instance 0 has {inference.name_list(names)}"
                )
        return {n: [r[n] for r in rows] for n in names}, True
    if any(named) or only is None:
        raise invalid(
            f"{where}: each instance must be an object of named inputs; the "
            f"signature takes {sorted(target.specs)}"
        )
    return {only: rows}, True


@endpoint("Predict")
async def predict(request: web.Request) -> web.Response:
    state = state_of(request)
    spec: ModelPath = request[MODEL_PATH]
    where = f"/v1/models/{spec.model}:predict"
    version = resolve_version(state, spec.model, spec.version, spec.label)
    state.repo.get(spec.model, version)  # an unknown model is 404 before the body is read
    doc = json_object(await json_body(request, where), where)
    signature = doc.get("signature_name", "")
    if not isinstance(signature, str):
        raise invalid(f"{where}: signature_name must be a string, got {type_name(signature)}")
    target = inference.resolve(state.repo, spec.model, version, signature)
    values, rows_form = _inputs_of(doc, target, where)
    limits = state.limits

    def key_of(name: str) -> Any:
        spec_of = target.specs.get(name)
        dtype = spec_of.dtype if spec_of is not None else None
        return feature_key(values, name, lambda v: json_array(v, "split key", limits, dtype))

    chosen = route_version(state, request, spec.model, spec.version, spec.label, key_of)
    if chosen is not None and chosen != target.mv.version:
        target = inference.resolve(state.repo, spec.model, chosen, signature)
    check_names(target.specs, values, target.where)

    def decode() -> tuple[dict, int]:
        arrays = {
            n: json_array(v, f"{target.where}: input {n!r}", limits, target.specs[n].dtype)
            for n, v in values.items()
        }
        return inference.check_inputs(target, arrays, limits, strings_checked=True)

    outputs = await inference.run(target, decode, None, state.offload, state.observers)
    body = _rows(outputs, target.where) if rows_form else _columns(outputs)
    resp = web.Response(body=await dumps(request, body), content_type="application/json")
    return answer_headers(resp, target.mv.version)


def _value(name: str, array: np.ndarray) -> Any:
    return to_json(array, b64=name.endswith(BYTES_SUFFIX))


def _rows(outputs: dict[str, np.ndarray], where: str) -> dict:
    sizes = {n: (a.shape[0] if a.ndim else None) for n, a in outputs.items()}
    if len(set(sizes.values())) != 1 or None in sizes.values():
        raise invalid(
            f"{where}: the outputs differ in batch size ({sizes}); ask for the "
            f"columnar form ('inputs')"
        )
    columns = {n: _value(n, a) for n, a in sorted(outputs.items())}
    if len(columns) == 1:
        return {"predictions": next(iter(columns.values()))}
    rows = next(iter(sizes.values()))
    return {"predictions": [{n: c[i] for n, c in columns.items()} for i in range(rows)]}


def _columns(outputs: dict[str, np.ndarray]) -> dict:
    columns = {n: _value(n, a) for n, a in sorted(outputs.items())}
    if len(columns) == 1:
        return {"outputs": next(iter(columns.values()))}
    return {"outputs": columns}


@endpoint("GetModelStatus")
async def status(request: web.Request) -> web.Response:
    state = state_of(request)
    spec: ModelPath = request[MODEL_PATH]
    version = resolve_version(state, spec.model, spec.version, spec.label)
    statuses = state.repo.status(spec.model)
    if version is not None:
        if version not in statuses:
            raise ModelNotFound(
                f"model {spec.model!r} has no version {version}; known versions: {sorted(statuses)}"
            )
        statuses = {version: statuses[version]}
    items = [
        {
            "version": str(v),
            "state": st.state.value,
            "status": {"error_code": "INTERNAL" if st.error else "OK", "error_message": st.error},
        }
        for v, st in sorted(statuses.items(), reverse=True)
    ]
    return json_response({"model_version_status": items})


@endpoint("GetModelMetadata")
async def metadata(request: web.Request) -> web.Response:
    state = state_of(request)
    spec: ModelPath = request[MODEL_PATH]
    version = resolve_version(state, spec.model, spec.version, spec.label)
    mv = state.repo.get(spec.model, version)
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    for k, v in mv.signature_defs.items():
        if not k.startswith("__"):
            sig_map.signature_def[k].CopyFrom(v)
    body = {
        "model_spec": {"name": spec.model, "signature_name": "", "version": str(mv.version)},
        "metadata": {
            "signature_def": json_format.MessageToDict(sig_map, preserving_proto_field_name=True)
        },
    }
    return json_response(body)
