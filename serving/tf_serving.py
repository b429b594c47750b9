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

from serving import inference
from serving.codec import numpy_to_tensor_proto, tensor_protos_to_numpy
from serving.inference import check_names, invalid
from serving.model_version import ModelNotFound
from serving.rpc import ServerState, check_outputs, deadline, rpc

TF_INTERNAL = 13  # tensorflow.error.INTERNAL


def model_spec(request_spec: Any, where: str) -> tuple[str, int | None]:
    """A request's ``model_spec`` -> (name, version or None); version labels are refused."""
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

    @rpc("Predict", predict_pb2.PredictRequest)
    async def Predict(self, request: predict_pb2.PredictRequest, context: Any) -> Any:
        where = "PredictRequest"
        name, version = model_spec(request.model_spec, where)
        target = inference.resolve(
            self.state.repo, name, version, request.model_spec.signature_name
        )
        check_names(target.specs, request.inputs.keys(), target.where)
        limits = self.state.limits

        def decode() -> tuple[dict, int]:
            features = tensor_protos_to_numpy(request.inputs, where, limits)
            return inference.check_inputs(target, features, limits, strings_checked=True)

        mv = target.mv
        outputs = await inference.run(
            target, decode, deadline(context), self.state.offload, self.state.observers
        )
        wanted = list(request.output_filter) or sorted(outputs)
        check_outputs(wanted, outputs, where, "output_filter names unknown output(s)")
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
        name, version = model_spec(request.model_spec, where)
        fields = list(request.metadata_field)
        if fields != ["signature_def"]:
            raise invalid(f"{where}: metadata_field must be ['signature_def'], got {fields}")
        mv = self.state.repo.get(name, version)
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
        name, version = model_spec(request.model_spec, where)
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
            item = resp.model_version_status.add(version=v, state=State.Value(st.state.value))
            if st.error:
                item.status.error_code = TF_INTERNAL
                item.status.error_message = st.error
        return resp
