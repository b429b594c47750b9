"""KServe v2 / Open Inference Protocol ``GRPCInferenceService``: liveness, readiness, metadata
and ModelInfer (typed or raw tensor contents; outputs always raw). ``server_ready`` is the
server's readiness, which ``GET /v2/health/ready`` (``serving.http.kserve_http``) answers too."""

from __future__ import annotations

from typing import Any

from protos import grpc_service_pb2 as kserve_pb2
from protos import grpc_service_pb2_grpc as kserve_grpc
from serving import inference, routing
from serving.codec import (
    kserve_datatype,
    kserve_input_to_numpy,
    kserve_inputs_to_numpy,
    numpy_to_kserve_raw,
)
from serving.inference import ServingError, check_names, invalid
from serving.model_version import ModelNotFound
from serving.rpc import ServerState, check_outputs, deadline, record_answer_version, route, rpc
from serving.traffic import LABEL_PATTERN

SERVER_NAME = "stitchrec"
SERVER_VERSION = "0.1.0"


def version_arg(text: str, where: str) -> tuple[int | None, str | None]:
    """A KServe version string -> ``(version, label)``: ``""``: ``(None, None)`` (the traffic
    split, else the highest live version); ASCII digits: a version number; a label name (a
    letter first, see ``serving.traffic``): a version label of the model's ``traffic.toml``.

    Anything else (``"1_0"``, ``" 1 "``, ``"+1"``) is refused.
    """
    if not text:
        return None, None
    if LABEL_PATTERN.match(text):
        return None, text
    if not (text.isascii() and text.isdigit()):
        shown = text if len(text) <= 32 else text[:32] + "..."
        raise invalid(
            f"{where}: model version {shown!r} is not a positive integer nor a version label "
            f"(a letter, then letters, digits, '_', '-' or '.')"
        )
    v = int(text)
    if v < 1:
        raise invalid(f"{where}: model version must be >= 1, got {v}")
    return v, None


def server_ready(state: ServerState) -> bool:
    """KServe ``ServerReady`` (gRPC) and ``GET /v2/health/ready`` (HTTP): the repository holds
    at least one model, every model has a ready version, and no stop has begun. A server with
    no model to serve is not ready, so readiness probes keep traffic away from it."""
    repo = state.repo
    return bool(repo.model_names()) and repo.ready() and not state.shutting_down


def _infer_key(request: kserve_pb2.ModelInferRequest, name: str, limits: Any) -> Any:
    """The split key of a ModelInfer request: the first value of input ``name`` (None if
    none)."""
    raws = list(request.raw_input_contents)
    for i, t in enumerate(request.inputs):
        if t.name != name:
            continue
        if raws and len(raws) != len(request.inputs):
            return None  # the full decode answers the mismatch
        try:
            values = kserve_input_to_numpy(t, raws[i] if raws else None, "split key", limits)
        except ServingError:
            return None
        return routing.first_value(values)
    return None


class KServeServicer(kserve_grpc.GRPCInferenceServiceServicer):
    def __init__(self, state: ServerState):
        self.state = state

    @rpc("ServerLive", kserve_pb2.ServerLiveRequest)
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return kserve_pb2.ServerLiveResponse(live=True)

    @rpc("ServerReady", kserve_pb2.ServerReadyRequest)
    async def ServerReady(self, request: Any, context: Any) -> Any:
        return kserve_pb2.ServerReadyResponse(ready=server_ready(self.state))

    @rpc("ModelReady", kserve_pb2.ModelReadyRequest)
    async def ModelReady(self, request: Any, context: Any) -> Any:
        version, label = version_arg(request.version, "ModelReadyRequest")
        if request.name not in self.state.repo.model_names():
            raise ModelNotFound(f"unknown model {request.name!r}")
        if label:
            version = routing.labelled(self.state, request.name, label)
        ready = self.state.repo.ready(request.name, version) and not self.state.shutting_down
        return kserve_pb2.ModelReadyResponse(ready=ready)

    @rpc("ServerMetadata", kserve_pb2.ServerMetadataRequest)
    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return kserve_pb2.ServerMetadataResponse(name=SERVER_NAME, version=SERVER_VERSION)

    @rpc("ModelMetadata", kserve_pb2.ModelMetadataRequest)
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        version, label = version_arg(request.version, "ModelMetadataRequest")
        if label:
            version = routing.label_version(self.state, request.name, label)
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

    @rpc("ModelInfer", kserve_pb2.ModelInferRequest)
    async def ModelInfer(self, request: kserve_pb2.ModelInferRequest, context: Any) -> Any:
        where = "ModelInferRequest"
        if not request.model_name:
            raise invalid(f"{where}: model_name is empty")
        version, label = version_arg(request.model_version, where)
        limits = self.state.limits
        chosen = route(
            self.state,
            context,
            request.model_name,
            version,
            label,
            lambda f: _infer_key(request, f, limits),
        )
        target = inference.resolve(self.state.repo, request.model_name, chosen.version)
        check_names(target.specs, [t.name for t in request.inputs], target.where)

        def decode() -> tuple[dict, int]:
            features = kserve_inputs_to_numpy(request, where, limits)
            return inference.check_inputs(target, features, limits, strings_checked=True)

        mv = target.mv
        outputs = await inference.run(
            target, decode, deadline(context), self.state.offload, self.state.observers
        )
        wanted = [o.name for o in request.outputs] or sorted(outputs)
        check_outputs(wanted, outputs, where, "unknown output(s)")
        record_answer_version(mv.version)
        resp = kserve_pb2.ModelInferResponse(
            model_name=request.model_name, model_version=str(mv.version), id=request.id
        )
        for k in wanted:
            arr = outputs[k]
            resp.outputs.add(name=k, datatype=kserve_datatype(arr.dtype), shape=list(arr.shape))
            resp.raw_output_contents.append(numpy_to_kserve_raw(arr))
        return resp
