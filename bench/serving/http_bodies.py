"""HTTP request bodies of bench.serving.front_door and its deliberately slow shadow model.

``make_bodies`` writes the examples ``bench.serving.models.make_requests`` sends over gRPC (one
user and N candidates, the user tiled to N rows where a protocol has no user part) as HTTP
bodies, one length-prefixed file (``bench.serving.loadgen.write_requests``) per form:

- ``rank``: StitchRec ``POST /v1/rank/{m}``: ``{"user": {f: v}, "candidates": {f: [N]}}``;
- ``v2-json``: KServe v2 ``POST /v2/models/{m}/infer``, JSON tensors of shape ``[N]``;
- ``v2-binary``: the same with the binary tensor data extension: a JSON header (padded with
  spaces to one length for every body, so one ``Inference-Header-Content-Length`` fits all)
  followed by the little-endian values (BYTES: 4-byte length + bytes per element);
- ``tfs``: TF Serving REST ``POST /v1/models/{m}:predict``, columnar ``{"inputs": {f: [N]}}``
  (strings as ``{"b64": ...}``);
- ``triton``: KServe v2 JSON with shapes ``[N, 1]`` (Triton's batched inputs are ``[-1, 1]``).

``build_slow_model`` wraps a SavedModel's ``serving_default`` in one that also runs ``matmuls``
dense layers ``x <- tanh(x W)`` of width ``dim`` on an ``[N, dim]`` activation (cost per call:
``2 N dim^2 matmuls`` FLOPs) and adds ``0 * mean(x)`` to the score, so the answer stays the
wrapped model's while the work cannot be pruned.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import tensorflow as tf

from bench.serving.loadgen import write_requests
from bench.serving.models import MODEL, _column, _inputs, _rows
from serving.codec import encode_bytes
from serving.version_files import MARKER, atomic_dir

FORMS = ("rank", "v2-json", "v2-binary", "tfs", "triton")
HEADER_LENGTH = "Inference-Header-Content-Length"
_V2_TYPES = {"string": "BYTES", "int64": "INT64", "float32": "FP32"}


def _json_values(v: np.ndarray, kind: str) -> list:
    if kind == "string":
        return [x.decode() for x in v]
    return v.tolist()


def _v2(cols: dict[str, np.ndarray], kinds: dict[str, str], shape: list[int]) -> dict:
    inputs = [
        {"name": k, "shape": shape, "datatype": _V2_TYPES[kinds[k]],
         "data": _json_values(cols[k], kinds[k])}
        for k in sorted(kinds)
    ]  # fmt: skip
    return {"inputs": inputs, "outputs": [{"name": "score"}]}


def _v2_binary(cols: dict[str, np.ndarray], kinds: dict[str, str], n: int) -> tuple[dict, bytes]:
    inputs, blobs = [], []
    for k in sorted(kinds):
        v = cols[k]
        blob = encode_bytes(v) if kinds[k] == "string" else v.astype(v.dtype.newbyteorder("<"))
        blob = blob if isinstance(blob, bytes) else blob.tobytes()
        inputs.append({"name": k, "shape": [n], "datatype": _V2_TYPES[kinds[k]],
                       "parameters": {"binary_data_size": len(blob)}})  # fmt: skip
        blobs.append(blob)
    return {"inputs": inputs, "outputs": [{"name": "score"}]}, b"".join(blobs)


def _tfs(cols: dict[str, np.ndarray], kinds: dict[str, str]) -> dict:
    def col(k: str) -> list:
        if kinds[k] == "string":
            return [{"b64": base64.b64encode(x).decode()} for x in cols[k]]
        return cols[k].tolist()

    return {"inputs": {k: col(k) for k in sorted(kinds)}}


def make_bodies(saved: Path, test_dir: Path | None, n: int, count: int, out: Path) -> dict:
    """``count`` bodies of N candidates in every form: {"paths": {form: file}, "header_length":
    the binary bodies' JSON header length, "<form>_bytes": size of the first}."""
    kinds, user_fields = _inputs(saved)
    data = _rows(test_dir, kinds, count * n + count)
    cols = {k: _column(data[k], kind) for k, kind in kinds.items()}
    bodies: dict[str, list[bytes]] = {f: [] for f in FORMS}
    binary: list[tuple[bytes, bytes]] = []
    for r in range(count):
        sl = slice(count + r * n, count + (r + 1) * n)
        user = {k: cols[k][r : r + 1] for k in user_fields}
        cands = {k: cols[k][sl] for k in kinds if k not in user_fields}
        tiled = {**cands, **{k: np.repeat(v, n) for k, v in user.items()}}
        rank = {
            "user": {k: _json_values(v, kinds[k])[0] for k, v in user.items()},
            "candidates": {k: _json_values(v, kinds[k]) for k, v in cands.items()},
        }
        bodies["rank"].append(json.dumps(rank).encode())
        bodies["v2-json"].append(json.dumps(_v2(tiled, kinds, [n])).encode())
        bodies["triton"].append(json.dumps(_v2(tiled, kinds, [n, 1])).encode())
        bodies["tfs"].append(json.dumps(_tfs(tiled, kinds)).encode())
        head, blob = _v2_binary(tiled, kinds, n)
        binary.append((json.dumps(head).encode(), blob))
    width = max(len(h) for h, _ in binary)
    bodies["v2-binary"] = [h.ljust(width) + b for h, b in binary]
    result: dict = {"paths": {}, "header_length": width}
    for form, bs in bodies.items():
        result["paths"][form] = out / f"http-{form}-{n}.bin"
        write_requests(str(result["paths"][form]), bs)
        result[f"{form}_bytes"] = len(bs[0])
    return result


def build_slow_model(saved: Path, out: Path, matmuls: int = 24, dim: int = 256) -> Path:
    """``saved`` with ``matmuls`` extra ``[N, dim] x [dim, dim]`` layers in its serving
    function (same inputs, same scores), written to ``out`` (``serving.version_files.atomic_dir``:
    marked complete) with the original assets.extra."""
    if (out / "saved_model.pb").exists():
        return out
    inner = tf.saved_model.load(str(saved))
    fn = inner.signatures["serving_default"]
    _, specs = fn.structured_input_signature
    specs = {k: tf.TensorSpec(s.shape, s.dtype, name=k) for k, s in specs.items()}
    module = tf.Module()
    module.inner = inner
    module.w = tf.Variable(
        tf.random.stateless_normal([dim, dim], seed=[0, 1]) / dim**0.5, trainable=False
    )

    @tf.function(input_signature=[specs])
    def serve(features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        outputs = dict(fn(**features))
        n = tf.shape(outputs["score"])[0]
        x = tf.ones(tf.stack([n, dim])) * tf.reshape(outputs["score"], [-1, 1])
        for _ in range(matmuls):
            x = tf.tanh(tf.matmul(x, module.w))
        outputs["score"] = outputs["score"] + 0.0 * tf.reduce_mean(x, axis=1)
        return outputs

    with atomic_dir(out) as tmp:
        tf.saved_model.save(module, str(tmp), signatures={"serving_default": serve})
        shutil.copytree(saved / "assets.extra", tmp / "assets.extra", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(MARKER.name))  # fmt: skip
    return out


__all__ = ["FORMS", "HEADER_LENGTH", "MODEL", "build_slow_model", "make_bodies"]
