"""The gRPC services: StitchRec's RankingService, TF Serving's PredictionService and
ModelService, and KServe v2's GRPCInferenceService. Each turns its wire tensors into numpy
arrays and calls ``serving.inference``; errors become gRPC status codes there.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np
import tensorflow as tf
from google.protobuf import any_pb2
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from protos import grpc_service_pb2 as kserve_pb2
from protos import grpc_service_pb2_grpc as kserve_grpc
from protos import ranking_service_pb2 as rank_pb2
from protos import ranking_service_pb2_grpc as rank_grpc
from serving import inference
from serving.inference import Limits, ServingError, invalid
from serving.metrics import Metrics
from serving.repository import ModelNotFound, ModelRepository, ModelVersion

log = logging.getLogger("stitchrec.serving")

SERVER_NAME = "stitchrec"
SERVER_VERSION = "0.1.0"


class ServerState:
    """What the services share: the repository, limits, metrics and the shutdown flag."""

    def __init__(self, repo: ModelRepository, metrics: Metrics, limits: Limits):
        self.repo = repo
        self.metrics = metrics
        self.limits = limits
        self.shutting_down = False


def rpc(method: str) -> Callable:
    """Wraps a handler: exceptions -> gRPC status with a message, metrics per call."""

    def deco(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(fn)
        async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            t0 = time.perf_counter()

            def record(code: str) -> None:
                self.state.metrics.record_rpc(method, code, time.perf_counter() - t0)

            try:
                response = await fn(self, request, context)
            except asyncio.CancelledError:
                record("CANCELLED")
                raise
            except Exception as e:
                status, message = inference.status_of(e)
                if status == grpc.StatusCode.INTERNAL:
                    log.exception(json.dumps({"event": "internal_error", "method": method}))
                # counted before the status goes out: a client that sees the error and then
                # scrapes /metrics finds it counted
                record(status.name)
                await context.abort(status, message)
            record("OK")
            return response

        return wrapper

    return deco


def _version_arg(text: str, where: str) -> int | None:
    if not text:
        return None
    try:
        v = int(text)
    except ValueError:
        raise invalid(f"{where}: model version {text!r} is not an integer") from None
    if v < 1:
        raise invalid(f"{where}: model version must be >= 1, got {v}")
    return v


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


class RankingServicer(rank_grpc.RankingServiceServicer):
    def __init__(self, state: ServerState):
        self.state = state

    @rpc("Rank")
    async def Rank(self, request: rank_pb2.RankRequest, context: grpc.aio.ServicerContext) -> Any:
        where = "RankRequest"
        if not request.model_name:
            raise invalid(f"{where}: model_name is empty")
        if request.model_version < 0:
            raise invalid(f"{where}: model_version must be >= 0, got {request.model_version}")
        user = {
            k: feature_to_numpy(k, f, f"{where}.user_features")
            for k, f in request.user_features.items()
        }
        cands = {
            k: feature_to_numpy(k, f, f"{where}.candidate_features")
            for k, f in request.candidate_features.items()
        }
        result = await inference.rank(
            self.state.repo,
            request.model_name,
            request.model_version or None,
            user,
            cands,
            k=request.top_k,
            output=request.output,
            deadline=inference.deadline_from(context.time_remaining()),
            limits=self.state.limits,
            strings_checked=True,
        )
        return rank_pb2.RankResponse(
            model_name=request.model_name,
            model_version=result.version,
            scores=result.scores.tolist(),
            indices=result.indices.tolist(),
        )


# --------------------------------------------------------------------------------------------
# TF Serving PredictionService + ModelService


def _signature_defs(mv: ModelVersion) -> dict[str, meta_graph_pb2.SignatureDef]:
    cached = getattr(mv, "_signature_defs", None)
    if cached is None:
        sm = saved_model_pb2.SavedModel()
        sm.ParseFromString((mv.path / "saved_model.pb").read_bytes())
        cached = dict(sm.meta_graphs[0].signature_def)
        mv._signature_defs = cached  # type: ignore[attr-defined]
    return cached


def _tf_spec(request_spec: Any, where: str) -> tuple[str, int | None]:
    if not request_spec.name:
        raise invalid(f"{where}: model_spec.name is empty")
    if request_spec.version_label:
        raise invalid(
            f"{where}: version labels are not supported (got {request_spec.version_label!r}); "
            f"use model_spec.version"
        )
    version = request_spec.version.value if request_spec.HasField("version") else None
    if version is not None and version < 1:
        raise invalid(f"{where}: model_spec.version must be >= 1, got {version}")
    return request_spec.name, version


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, state: ServerState):
        self.state = state

    @rpc("Predict")
    async def Predict(self, request: predict_pb2.PredictRequest, context: Any) -> Any:
        where = "PredictRequest"
        name, version = _tf_spec(request.model_spec, where)
        features = {}
        for k, tp in request.inputs.items():
            try:
                features[k] = tf.make_ndarray(tp)
            except Exception as e:
                raise invalid(f"{where}: input {k!r} is not a valid TensorProto: {e}") from None
        mv, outputs = await inference.predict(
            self.state.repo,
            name,
            version,
            features,
            signature=request.model_spec.signature_name,
            deadline=inference.deadline_from(context.time_remaining()),
            limits=self.state.limits,
            strings_checked=True,
        )
        wanted = list(request.output_filter) or sorted(outputs)
        unknown = sorted(set(wanted) - set(outputs))
        if unknown:
            raise invalid(
                f"{where}: output_filter names unknown output(s) {unknown}; outputs: {sorted(outputs)}"
            )
        resp = predict_pb2.PredictResponse()
        resp.model_spec.name = name
        resp.model_spec.version.value = mv.version
        resp.model_spec.signature_name = request.model_spec.signature_name or "serving_default"
        for k in wanted:
            resp.outputs[k].CopyFrom(tf.make_tensor_proto(outputs[k]))
        return resp

    @rpc("GetModelMetadata")
    async def GetModelMetadata(
        self, request: get_model_metadata_pb2.GetModelMetadataRequest, context: Any
    ) -> Any:
        where = "GetModelMetadataRequest"
        name, version = _tf_spec(request.model_spec, where)
        fields = list(request.metadata_field)
        if fields != ["signature_def"]:
            raise invalid(f"{where}: metadata_field must be ['signature_def'], got {fields}")
        mv = self.state.repo.get(name, version)
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        for k, v in _signature_defs(mv).items():
            if not k.startswith("__"):
                sig_map.signature_def[k].CopyFrom(v)
        resp = get_model_metadata_pb2.GetModelMetadataResponse()
        resp.model_spec.name = name
        resp.model_spec.version.value = mv.version
        packed = any_pb2.Any()
        packed.Pack(sig_map)
        resp.metadata["signature_def"].CopyFrom(packed)
        return resp


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, state: ServerState):
        self.state = state

    @rpc("GetModelStatus")
    async def GetModelStatus(
        self, request: get_model_status_pb2.GetModelStatusRequest, context: Any
    ) -> Any:
        where = "GetModelStatusRequest"
        name, version = _tf_spec(request.model_spec, where)
        statuses = self.state.repo.status(name)
        if version is not None:
            if version not in statuses:
                raise ModelNotFound(
                    f"model {name!r} has no version {version}; known versions: {sorted(statuses)}"
                )
            statuses = {version: statuses[version]}
        State = get_model_status_pb2.ModelVersionStatus.State
        resp = get_model_status_pb2.GetModelStatusResponse()
        for v, st in sorted(statuses.items(), reverse=True):
            item = resp.model_version_status.add(version=v, state=State.Value(st.state))
            if st.error:
                item.status.error_code = 13  # tensorflow.error.INTERNAL
                item.status.error_message = st.error
        return resp


# --------------------------------------------------------------------------------------------
# KServe v2 / Open Inference Protocol

_KSERVE_DTYPES = {
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
    d = tf.as_dtype(dtype)
    if d == tf.string:
        return "BYTES"
    for k, v in _KSERVE_DTYPES.items():
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
    parts = []
    for v in values.reshape(-1):
        b = v if isinstance(v, bytes) else str(v).encode()
        parts.append(struct.pack("<I", len(b)) + b)
    return b"".join(parts)


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
    if dt != "BYTES" and dt not in _KSERVE_DTYPES:
        raise invalid(
            f"{where}: unsupported datatype {dt!r}; expected one of {['BYTES', *_KSERVE_DTYPES]}"
        )
    if raw is not None:
        if dt == "BYTES":
            arr = decode_bytes(raw, count, where)
        else:
            dtype = _KSERVE_DTYPES[dt].newbyteorder("<")
            if len(raw) != count * dtype.itemsize:
                raise invalid(
                    f"{where}: raw content has {len(raw)} bytes; shape {shape} of {dt} needs "
                    f"{count * dtype.itemsize}"
                )
            arr = np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="))
    else:
        field = _CONTENTS_FIELD.get(dt)
        if field is None:
            raise invalid(f"{where}: datatype {dt} must be sent in raw_input_contents")
        values = getattr(tensor.contents, field)
        if len(values) != count:
            raise invalid(f"{where}: {len(values)} values for shape {shape} ({count} elements)")
        if dt == "BYTES":
            arr = np.array(list(values), dtype=object)
        else:
            arr = np.array(values, dtype=_KSERVE_DTYPES[dt])
    return arr.reshape(shape)


class KServeServicer(kserve_grpc.GRPCInferenceServiceServicer):
    def __init__(self, state: ServerState):
        self.state = state

    @rpc("ServerLive")
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return kserve_pb2.ServerLiveResponse(live=True)

    @rpc("ServerReady")
    async def ServerReady(self, request: Any, context: Any) -> Any:
        ready = self.state.repo.ready() and not self.state.shutting_down
        return kserve_pb2.ServerReadyResponse(ready=ready)

    @rpc("ModelReady")
    async def ModelReady(self, request: Any, context: Any) -> Any:
        version = _version_arg(request.version, "ModelReadyRequest")
        if request.name not in self.state.repo.model_names():
            raise ModelNotFound(f"unknown model {request.name!r}")
        ready = self.state.repo.ready(request.name, version) and not self.state.shutting_down
        return kserve_pb2.ModelReadyResponse(ready=ready)

    @rpc("ServerMetadata")
    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return kserve_pb2.ServerMetadataResponse(name=SERVER_NAME, version=SERVER_VERSION)

    @rpc("ModelMetadata")
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        version = _version_arg(request.version, "ModelMetadataRequest")
        mv = self.state.repo.get(request.name, version)
        resp = kserve_pb2.ModelMetadataResponse(
            name=request.name,
            versions=[str(v) for v in self.state.repo.live_versions(request.name)],
            platform="tensorflow_savedmodel",
        )
        for name, spec in sorted(mv.inputs.items()):
            resp.inputs.add(name=name, datatype=kserve_datatype(spec.tf_dtype), shape=[-1])
        for name, spec in sorted(mv.outputs.items()):
            dims = [-1 if d is None else d for d in spec.shape.as_list()]
            resp.outputs.add(name=name, datatype=kserve_datatype(spec.dtype), shape=dims)
        return resp

    @rpc("ModelInfer")
    async def ModelInfer(self, request: kserve_pb2.ModelInferRequest, context: Any) -> Any:
        where = "ModelInferRequest"
        if not request.model_name:
            raise invalid(f"{where}: model_name is empty")
        version = _version_arg(request.model_version, where)
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
        mv, outputs = await inference.predict(
            self.state.repo,
            request.model_name,
            version,
            features,
            deadline=inference.deadline_from(context.time_remaining()),
            limits=self.state.limits,
            strings_checked=True,
        )
        wanted = [o.name for o in request.outputs] or sorted(outputs)
        unknown = sorted(set(wanted) - set(outputs))
        if unknown:
            raise invalid(f"{where}: unknown output(s) {unknown}; outputs: {sorted(outputs)}")
        resp = kserve_pb2.ModelInferResponse(
            model_name=request.model_name, model_version=str(mv.version), id=request.id
        )
        for k in wanted:
            arr = outputs[k]
            resp.outputs.add(name=k, datatype=kserve_datatype(arr.dtype), shape=list(arr.shape))
            if arr.dtype == np.object_:
                resp.raw_output_contents.append(encode_bytes(arr))
            else:
                resp.raw_output_contents.append(
                    np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()
                )
        return resp


__all__ = [
    "KServeServicer",
    "ModelServicer",
    "PredictionServicer",
    "RankingServicer",
    "ServerState",
    "ServingError",
]
