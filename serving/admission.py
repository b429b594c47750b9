"""Admission control: overload is answered at once with a status, never by a growing queue.

- At most ``max_inflight`` inference calls (``INFERENCE_METHODS``) are handled at once; one more
  is answered RESOURCE_EXHAUSTED before its request is decoded.
- The batcher refuses what it cannot take (``serving.batching``): a full queue (requests or
  examples) is RESOURCE_EXHAUSTED; a deadline nearer than the expected wait in the queue is
  DEADLINE_EXCEEDED at once (retrying it cannot help: its time is spent).
- Every RESOURCE_EXHAUSTED answer carries a retry hint in its trailing metadata:
  ``retry-after-ms`` and ``grpc-retry-pushback-ms`` (honoured by gRPC retry policies).
- When the server stops, after its drain period (``serving.server``), calls other than the
  probes (``PROBE_METHODS``; grpc.health.v1 and reflection do not pass through here) are answered
  UNAVAILABLE, which clients retry on another server.
- gRPC's own limits are a backstop (``grpc_limits``): calls past ``maximum_concurrent_rpcs`` are
  answered RESOURCE_EXHAUSTED by gRPC itself, without the hint.

Each refusal is counted in ``stitchrec_rejected_total{method, reason}``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import grpc

from serving import inference
from serving.batching import QueueFull, WouldMissDeadline
from serving.metrics import Metrics

INFERENCE_METHODS = frozenset({"Rank", "Predict", "ModelInfer"})
PROBE_METHODS = frozenset({"ServerLive", "ServerReady", "ModelReady"})
RETRY_AFTER_KEY = "retry-after-ms"
PUSHBACK_KEY = "grpc-retry-pushback-ms"
# calls beyond max_inflight that gRPC still hands to the server: health checks and Watch
# streams, reflection, metadata calls, and inference calls being refused
GRPC_HEADROOM = 128

PENDING_CALLS = 100_000  # calls gRPC holds for the event loop before it cancels them

Metadata = tuple[tuple[str, str], ...]


class Rejected(Exception):
    """A call refused by admission: its status code, the refusal reason and a message."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message


def grpc_limits(max_inflight: int) -> tuple[int, list[tuple[str, int]]]:
    """gRPC's ``maximum_concurrent_rpcs`` for a server admitting ``max_inflight`` inference
    calls (calls past it: RESOURCE_EXHAUSTED from gRPC), and the channel options bounding the
    calls of one connection at twice that (``grpc.max_concurrent_streams``; a client with more
    waits for a stream on its side, a stream opened past it is refused: UNAVAILABLE). Calls
    that gRPC has received but the event loop has not yet taken wait for it (up to their
    deadline) instead of being cancelled after a second, as gRPC does past 1,000 such calls."""
    limit = 2 * max_inflight + GRPC_HEADROOM
    return limit, [
        ("grpc.max_concurrent_streams", 2 * limit),
        ("grpc.server.max_pending_requests", PENDING_CALLS),
        ("grpc.server.max_pending_requests_hard_limit", PENDING_CALLS),
    ]


class Admission:
    """Counts the inference calls in flight and decides whether a new call is taken."""

    def __init__(self, max_inflight: int, metrics: Metrics, retry_after_ms: int = 100):
        self.max_inflight = max_inflight
        self.metrics = metrics
        self.retry_after_ms = retry_after_ms
        self.inflight = 0
        self.refusing = False
        self._idle = asyncio.Event()
        self._idle.set()

    def refuse(self) -> None:
        """From now on every call but the probes is answered UNAVAILABLE (the server stops)."""
        self.refusing = True

    @contextlib.contextmanager
    def admit(self, method: str) -> Iterator[None]:
        """Holds one in-flight slot for an inference call; raises ``Rejected`` when full."""
        if self.refusing and method not in PROBE_METHODS:
            raise Rejected(
                grpc.StatusCode.UNAVAILABLE,
                "stopping",
                "the server is stopping; retry on another server",
            )
        if method not in INFERENCE_METHODS:
            yield
            return
        if self.inflight >= self.max_inflight:
            raise Rejected(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "inflight",
                f"the server is overloaded ({self.inflight} calls in flight, max_inflight="
                f"{self.max_inflight}); retry after {self.retry_after_ms} ms",
            )
        self.inflight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()

    async def wait_idle(self, timeout: float | None) -> bool:
        """Waits until no inference call is in flight (up to ``timeout`` s); True if none is."""
        if timeout is not None and timeout <= 0:
            return self.inflight == 0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        return self.inflight == 0

    def answer(self, method: str, exc: BaseException) -> tuple[grpc.StatusCode, str, Metadata]:
        """The status, message and trailing metadata answered for ``exc``; counts refusals."""
        if isinstance(exc, Rejected):
            code, reason, message = exc.code, exc.reason, exc.message
        else:
            code, message = inference.status_of(exc)
            overload = isinstance(exc, (QueueFull, WouldMissDeadline))
            reason = exc.reason if overload else None
        if reason is not None:
            self.metrics.record_rejection(method, reason)
        if code != grpc.StatusCode.RESOURCE_EXHAUSTED or reason is None:
            return code, message, ()
        hint = str(self.retry_after_ms)
        return code, message, ((RETRY_AFTER_KEY, hint), (PUSHBACK_KEY, hint))
