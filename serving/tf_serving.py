"""TF Serving's ``PredictionService`` (Predict, GetModelMetadata) and ``ModelService``
(GetModelStatus), with the messages of the ``tensorflow-serving-api`` package."""

from __future__ import annotations

from typing import Any

from google.protobuf import any_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving import inference, routing
from serving.codec import numpy_to_tensor_proto, tensor_protos_to_numpy
from serving.inference import ServingError, check_names, invalid
from serving.model_version import ModelNotFound
from serving.rpc import ServerState, check_outputs, deadline, record_answer_version, route, rpc
from serving.traffic import TrafficError, check_label

TF_INTERNAL = 13  # tensorflow.error.INTERNAL


def model_spec(request_spec: Any, where: str) -> tuple[str, int | None, str | None]:
    """A request's ``model_spec`` -> (name, version or None, version label or None)."""
    if not request_spec.name:
        raise invalid(f"{where}: model_spec.name is empty")
    label = request_spec.version_label or None
    if label is not None:
        try:
            check_label(label, f"{where}: model_spec.version_label")
        except TrafficError as e:
            raise invalid(str(e)) from None
    version = request_spec.version.value if request_spec.HasField("version") else None
    if version is not None and version < 1:
        raise invalid(f"{where}: model_spec.version must be >= 1, got {version}")
    return request_spec.name, version, label


def _spec_version(state: ServerState, name: str, version: int | None, label: str | None) -> Any:
    """The version a metadata or status request names (a label: the version it names)."""
    return routing.label_version(state, name, label) if label else version


def _predict_key(request: predict_pb2.PredictRequest, name: str, limits: Any) -> Any:
    """The split key of a Predict request: the first value of input ``name`` (None if none)."""
    if name not in request.inputs:
        return None
    try:
        decoded = tensor_protos_to_numpy({name: request.inputs[name]}, "split key", limits)
    except ServingError:
        return None  # the full decode answers the bad input
    return routing.first_value(decoded[name])


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, state: ServerState):
        self.state = state

    @rpc("Predict", predict_pb2.PredictRequest)
    async def Predict(self, request: predict_pb2.PredictRequest, context: Any) -> Any:
        where = "PredictRequest"
        name, version, label = model_spec(request.model_spec, where)
        limits = self.state.limits
        chosen = route(
            self.state, context, name, version, label, lambda f: _predict_key(request, f, limits)
        )
        target = inference.resolve(
            self.state.repo, name, chosen.version, request.model_spec.signature_name
        )
        check_names(target.specs, request.inputs.keys(), target.where)

        def decode() -> tuple[dict, int]:
            features = tensor_protos_to_numpy(request.inputs, where, limits)
            return inference.check_inputs(target, features, limits, strings_checked=True)

        mv = target.mv
        outputs = await inference.run(
            target, decode, deadline(context), self.state.offload, self.state.observers
        )
        wanted = list(request.output_filter) or sorted(outputs)
        check_outputs(wanted, outputs, where, "output_filter names unknown output(s)")
        record_answer_version(mv.version)
        resp = predict_pb2.PredictResponse()
        resp.model_spec.name = name
        resp.model_spec.version.value = mv.version
        resp.model_spec.signature_name = request.model_spec.signature_name or "serving_default"
        for k in wanted:
            resp.outputs[k].CopyFrom(numpy_to_tensor_proto(outputs[k]))
        return resp

    @rpc("GetModelMetadata", get_model_metadata_pb2.GetModelMetadataRequest)
    async def GetModelMetadata(
        self, request: get_model_metadata_pb2.GetModelMetadataRequest, context: Any
    ) -> Any:
        where = "GetModelMetadataRequest"
        name, version, label = model_spec(request.model_spec, where)
        fields = list(request.metadata_field)
        if fields != ["signature_def"]:
            raise invalid(f"{where}: metadata_field must be ['signature_def'], got {fields}")
        mv = self.state.repo.get(name, _spec_version(self.state, name, version, label))
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        for k, v in mv.signature_defs.items():
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

    @rpc("GetModelStatus", get_model_status_pb2.GetModelStatusRequest)
    async def GetModelStatus(
        self, request: get_model_status_pb2.GetModelStatusRequest, context: Any
    ) -> Any:
        where = "GetModelStatusRequest"
        name, version, label = model_spec(request.model_spec, where)
        statuses = self.state.repo.status(name)
        if label:
            version = routing.labelled(self.state, name, label)
        if version is not None:
            if version not in statuses:
                raise ModelNotFound(
                    f"model {name!r} has no version {version}; known versions: {sorted(statuses)}"
                )
            statuses = {version: statuses[version]}
        State = get_model_status_pb2.ModelVersionStatus.State
        resp = get_model_status_pb2.GetModelStatusResponse()
        for v, st in sorted(statuses.items(), reverse=True):
            item = resp.model_version_status.add(version=v, state=State.Value(st.state.value))
            if st.error:
                item.status.error_code = TF_INTERNAL
                item.status.error_message = st.error
        return resp
