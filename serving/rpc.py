"""What every gRPC service shares: the server state and the ``rpc`` handler wrapper (exceptions
-> gRPC status codes through ``serving.inference.status_of``, one metrics record per call)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from serving import inference
from serving.admission import Admission
from serving.inference import Limits, invalid
from serving.metrics import Metrics
from serving.repository import ModelRepository

log = logging.getLogger("stitchrec.serving")


class ServerState:
    """What the services share: the repository, limits, metrics, admission control and the
    shutdown flag (True from the start of a stop: readiness reports false)."""

    def __init__(
        self,
        repo: ModelRepository,
        metrics: Metrics,
        limits: Limits,
        admission: Admission | None = None,
    ):
        self.repo = repo
        self.metrics = metrics
        self.limits = limits
        self.admission = admission or Admission(256, metrics)
        self.shutting_down = False


def rpc(method: str) -> Callable:
    """Wraps a handler: admission control (``serving.admission``), exceptions -> gRPC status
    with a message (and a retry hint when overloaded), metrics per call."""

    def deco(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(fn)
        async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            t0 = time.perf_counter()

            def record(code: str) -> None:
                self.state.metrics.record_rpc(method, code, time.perf_counter() - t0)

            admission = self.state.admission
            try:
                with admission.admit(method):
                    response = await fn(self, request, context)
            except asyncio.CancelledError:
                record("CANCELLED")
                raise
            except Exception as e:
                status, message, trailers = admission.answer(method, e)
                if status == grpc.StatusCode.INTERNAL:
                    log.exception(json.dumps({"event": "internal_error", "method": method}))
                # counted before the status goes out: a client that sees the error and then
                # scrapes /metrics finds it counted
                record(status.name)
                await context.abort(status, message, trailing_metadata=trailers)
            record("OK")
            return response

        return wrapper

    return deco


def deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The call's deadline as ``serving.inference`` takes it."""
    return inference.deadline_from(context.time_remaining())


def check_outputs(wanted: list[str], outputs: dict, where: str, what: str) -> None:
    """Raises INVALID_ARGUMENT when ``wanted`` names an output the model does not have."""
    unknown = sorted(set(wanted) - set(outputs))
    if unknown:
        raise invalid(f"{where}: {what} {unknown}; outputs: {sorted(outputs)}")
