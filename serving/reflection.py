"""gRPC server reflection, both ``grpc.reflection.v1`` and ``grpc.reflection.v1alpha``.

grpcio-reflection ships the v1alpha service only. The v1 protocol is the same messages under
the package ``grpc.reflection.v1``: its file descriptor is derived from the v1alpha one (renamed,
added to the default descriptor pool so v1 clients can also reflect on the reflection service),
and its method is served by the same servicer, the messages being identical on the wire.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_pb2

V1_FILE = "grpc/reflection/v1/reflection.proto"
V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE_NAME = f"{V1_PACKAGE}.ServerReflection"
V1ALPHA_SERVICE_NAME = reflection.SERVICE_NAME
METHOD = "ServerReflectionInfo"


def _rename(type_name: str) -> str:
    old = f".{v1alpha_pb2.DESCRIPTOR.package}."
    return f".{V1_PACKAGE}." + type_name[len(old) :] if type_name.startswith(old) else type_name


def _rename_messages(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
    for m in messages:
        for f in m.field:
            if f.HasField("type_name"):
                f.type_name = _rename(f.type_name)
        _rename_messages(m.nested_type)


def add_v1_descriptor(pool: descriptor_pool.DescriptorPool | None = None) -> None:
    """Adds ``grpc/reflection/v1/reflection.proto`` to ``pool`` (the default) unless present."""
    pool = pool or descriptor_pool.Default()
    try:
        pool.FindFileByName(V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    v1alpha_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = V1_FILE
    proto.package = V1_PACKAGE
    proto.ClearField("options")
    _rename_messages(proto.message_type)
    for service in proto.service:
        for method in service.method:
            method.input_type = _rename(method.input_type)
            method.output_type = _rename(method.output_type)
    pool.AddSerializedFile(proto.SerializeToString())


def enable_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serves reflection v1 and v1alpha on ``server`` for ``service_names`` (plus themselves)."""
    add_v1_descriptor()
    names = (*service_names, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    servicer = reflection.aio.ReflectionServicer(names)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=v1alpha_pb2.ServerReflectionRequest.FromString,
        response_serializer=v1alpha_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1_SERVICE_NAME, {METHOD: handler}),)
    )
