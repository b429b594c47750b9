"""A Python client of the RankingService (sync and asyncio).

    client = RankingClient("127.0.0.1:8500")
    result = client.rank(
        "ctr",
        user={"user": "u1"},
        candidates={"item": [1, 2, 3], "price": [9.5, 3.0, 1.25]},
        top_k=2,
    )
    result.scores, result.indices, result.version

``version_label="canary"`` asks for the version a label of the model's ``traffic.toml`` names.

Values: ``str``/``bytes`` -> strings, ``int`` -> int64, ``float`` -> float32 (numpy arrays of
those dtypes too). TF Serving and Triton clients work unchanged against the same server.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from protos import ranking_service_pb2 as rank_pb2
from protos import ranking_service_pb2_grpc as rank_grpc


@dataclasses.dataclass
class RankResult:
    """Scores of the returned candidates (best first with top_k) and their request indices."""

    model_name: str
    version: int
    scores: np.ndarray  # [k] float32
    indices: np.ndarray  # [k] int32
    #: a multi-task model's score of each task at ``indices`` (empty for one task)
    tasks: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    #: the traffic arm that answered (response metadata ``x-stitchrec-arm``; "": none)
    arm: str = ""


def to_feature(name: str, values: Any) -> rank_pb2.Feature:
    """A scalar or 1-D sequence -> a ``Feature`` message (type from the values)."""
    arr = np.asarray(values)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(
            f"feature {name!r}: expected a scalar or a 1-D sequence, got shape {arr.shape}"
        )
    f = rank_pb2.Feature()
    if arr.dtype.kind in "SUO":
        f.bytes_list.value.extend(v if isinstance(v, bytes) else str(v).encode() for v in arr)
    elif arr.dtype.kind in "iu":
        f.int64_list.value.extend(arr.astype(np.int64).tolist())
    elif arr.dtype.kind == "f":
        f.float_list.value.extend(arr.astype(np.float32).tolist())
    else:
        raise ValueError(f"feature {name!r}: unsupported dtype {arr.dtype}")
    return f


def make_request(
    model: str,
    user: Mapping[str, Any],
    candidates: Mapping[str, Sequence[Any] | np.ndarray],
    *,
    version: int = 0,
    top_k: int = 0,
    output: str = "",
    version_label: str = "",
) -> rank_pb2.RankRequest:
    """The ``RankRequest`` for ``model`` (``version`` 0 and ``version_label`` empty: the
    server's traffic split, else its newest ready version)."""
    req = rank_pb2.RankRequest(
        model_name=model,
        model_version=version,
        top_k=top_k,
        output=output,
        version_label=version_label,
    )
    for k, v in user.items():
        req.user_features[k].CopyFrom(to_feature(k, v))
    for k, v in candidates.items():
        req.candidate_features[k].CopyFrom(to_feature(k, v))
    return req


ARM_HEADER = "x-stitchrec-arm"


def _arm(metadata: Any) -> str:
    for key, value in metadata or ():
        if key == ARM_HEADER:
            return value if isinstance(value, str) else value.decode()
    return ""


def _result(resp: rank_pb2.RankResponse, metadata: Any = ()) -> RankResult:
    return RankResult(
        resp.model_name,
        resp.model_version,
        np.array(resp.scores, dtype=np.float32),
        np.array(resp.indices, dtype=np.int32),
        {
            task: np.array(values.value, dtype=np.float32)
            for task, values in resp.task_scores.items()
        },
        _arm(metadata),
    )


def _metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    return (("authorization", f"Bearer {token}"),) if token else None


def _credentials(root_cert: bytes | None) -> grpc.ChannelCredentials | None:
    return grpc.ssl_channel_credentials(root_certificates=root_cert) if root_cert else None


class RankingClient:
    """Blocking client. ``token``: bearer token; ``root_cert``: PEM CA bytes for TLS."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        root_cert: bytes | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
        options: Sequence[tuple[str, Any]] = (),
    ):
        opts = [("grpc.max_receive_message_length", max_message_bytes), *options]
        creds = _credentials(root_cert)
        self.channel = (
            grpc.secure_channel(target, creds, opts)
            if creds
            else grpc.insecure_channel(target, opts)
        )
        self.stub = rank_grpc.RankingServiceStub(self.channel)
        self._metadata = _metadata(token)

    def rank(
        self,
        model: str,
        user: Mapping[str, Any],
        candidates: Mapping[str, Any],
        *,
        version: int = 0,
        top_k: int = 0,
        output: str = "",
        timeout: float | None = 10.0,
        version_label: str = "",
    ) -> RankResult:
        req = make_request(
            model,
            user,
            candidates,
            version=version,
            top_k=top_k,
            output=output,
            version_label=version_label,
        )
        resp, call = self.stub.Rank.with_call(req, timeout=timeout, metadata=self._metadata)
        return _result(resp, call.initial_metadata())

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> RankingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRankingClient:
    """The same on grpc.aio (create inside a running event loop)."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        root_cert: bytes | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
    ):
        opts = [("grpc.max_receive_message_length", max_message_bytes)]
        creds = _credentials(root_cert)
        self.channel = (
            grpc.aio.secure_channel(target, creds, opts)
            if creds
            else grpc.aio.insecure_channel(target, opts)
        )
        self.stub = rank_grpc.RankingServiceStub(self.channel)
        self._metadata = _metadata(token)

    async def rank(
        self,
        model: str,
        user: Mapping[str, Any],
        candidates: Mapping[str, Any],
        *,
        version: int = 0,
        top_k: int = 0,
        output: str = "",
        timeout: float | None = 10.0,
        version_label: str = "",
    ) -> RankResult:
        req = make_request(
            model,
            user,
            candidates,
            version=version,
            top_k=top_k,
            output=output,
            version_label=version_label,
        )
        call = self.stub.Rank(req, timeout=timeout, metadata=self._metadata)
        resp = await call
        return _result(resp, await call.initial_metadata())

    async def close(self) -> None:
        await self.channel.close()
