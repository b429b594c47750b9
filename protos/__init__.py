"""Protocol buffer definitions of the serving API.

- ``ranking_service.proto``: StitchRec's ``RankingService`` (one user plus N candidates).
- ``grpc_service.proto``: the KServe v2 / Open Inference Protocol ``GRPCInferenceService``.

The Python modules (``*_pb2.py``, ``*_pb2_grpc.py``) are generated with grpcio-tools the first
time this package is imported (and again whenever a ``.proto`` file is newer than its modules);
import them as ``from protos import ranking_service_pb2``. TF Serving's messages and stubs come
from the ``tensorflow-serving-api`` package.

The KServe messages live in the proto package ``inference`` as the specification requires, the
same as in ``tritonclient``: one Python process cannot import both (duplicate symbols in the
protobuf descriptor pool), so a client process uses one or the other.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

_HERE = Path(__file__).resolve().parent
PROTO_FILES = ("ranking_service.proto", "grpc_service.proto")


def _outputs(proto: str) -> list[Path]:
    stem = proto.removesuffix(".proto")
    return [_HERE / f"{stem}_pb2.py", _HERE / f"{stem}_pb2_grpc.py"]


def _stale() -> list[str]:
    stale = []
    for proto in PROTO_FILES:
        src = (_HERE / proto).stat().st_mtime
        outs = _outputs(proto)
        if not all(p.exists() for p in outs) or min(p.stat().st_mtime for p in outs) < src:
            stale.append(proto)
    return stale


def generate(force: bool = False) -> list[str]:
    """(Re)generates the Python modules of the ``.proto`` files; returns those it generated.

    Safe to call from several processes at once (a file lock serialises the generation).
    """
    if not force and not _stale():
        return []
    from grpc_tools import protoc  # grpcio-tools: only needed when generating

    with open(_HERE / ".generate.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        todo = list(PROTO_FILES) if force else _stale()
        for proto in todo:
            # Generated with the repository root as include path, so the modules import each
            # other as ``from protos import ...``.
            args = [
                "grpc_tools.protoc",
                f"-I{_HERE.parent}",
                f"--python_out={_HERE.parent}",
                f"--grpc_python_out={_HERE.parent}",
                f"protos/{proto}",
            ]
            if protoc.main(args) != 0:
                raise RuntimeError(f"protoc failed on {_HERE / proto}")
        return todo


if not os.environ.get("STITCHREC_NO_PROTO_GEN"):
    generate()
