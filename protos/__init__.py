"""Protocol buffer definitions of the serving API.

- ``ranking_service.proto``: StitchRec's ``RankingService`` (one user plus N candidates).
- ``grpc_service.proto``: the KServe v2 / Open Inference Protocol ``GRPCInferenceService``.

The Python modules generated from them (``*_pb2.py``, ``*_pb2_grpc.py``) are committed beside the
``.proto`` files; import them as ``from protos import ranking_service_pb2``. Importing this
package reads and writes nothing. After editing a ``.proto`` file, regenerate the modules with
grpcio-tools (a dev dependency) from the repository root::

    make protos
    # or: python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. protos/*.proto

``tests/protos/test_stubs.py`` regenerates them into a temporary folder and checks they equal the
committed ones. TF Serving's messages and stubs come from the ``tensorflow-serving-api`` package.

The KServe messages live in the proto package ``inference`` as the specification requires, the
same as in ``tritonclient``: one Python process cannot import both (duplicate symbols in the
protobuf descriptor pool), so a client process uses one or the other.
"""

PROTO_FILES = ("ranking_service.proto", "grpc_service.proto")
