"""What every gRPC service shares: the server state and the ``rpc`` handler wrapper.

Inference services are registered with ``add_service``, which hands the wrapper the request's
wire bytes: ``rpc`` parses them (on a worker thread when they are large, so that a big request
never holds the event loop that health checks and other calls need), answers a message that
does not parse with INVALID_ARGUMENT, maps exceptions to gRPC status codes through
``serving.inference.status_of`` (messages cut to ``Limits.max_message_chars``) and records one
metrics sample per call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import message as pb_message
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor

from serving import inference, routing, tracing
from serving.admission import INFERENCE_METHODS, Admission
from serving.calls import REQUEST_ID_HEADER, CallObservers, current_call, start_call
from serving.inference import Limits, invalid
from serving.metrics import Metrics
from serving.repository import ModelRepository
from serving.routing import Route
from serving.shadow import ShadowTraffic
from serving.traffic import TrafficTable

log = logging.getLogger("stitchrec.serving")

T = TypeVar("T")

# requests up to this many bytes are parsed and decoded on the event loop: their checks bound
# the work to milliseconds, and a thread hop would cost more than it saves
INLINE_BYTES = 64 * 1024

# the wire size of the request the running handler serves (set by ``rpc``)
_request_bytes: contextvars.ContextVar[int] = contextvars.ContextVar("request_bytes", default=0)


def set_request_bytes(size: int) -> None:
    """Records the wire size of the request the running task serves: ``ServerState.offload``
    decodes requests of more than ``INLINE_BYTES`` on a worker thread (the HTTP handlers call
    it with the body's size; ``rpc`` with the message's)."""
    _request_bytes.set(size)


def codec_threads() -> int:
    """Worker threads that decode and check requests: one per core, 2 to 8."""
    return max(2, min(8, os.cpu_count() or 2))


class ServerState:
    """What the services share: the repository, limits, metrics, admission control, the
    shutdown flag (True from the start of a stop: readiness reports false), the worker
    threads that decode requests (``offload``), the call observers, the models' traffic
    configs (``traffic``, ``serving.traffic``) and the shadow traffic (``shadow``, set by
    ``create_server``)."""

    def __init__(
        self,
        repo: ModelRepository,
        metrics: Metrics,
        limits: Limits,
        admission: Admission | None = None,
        threads: int | None = None,
    ):
        self.repo = repo
        self.metrics = metrics
        self.limits = limits
        self.admission = admission or Admission(256, metrics)
        self.shutting_down = False
        self.observers = CallObservers()
        self.traffic = TrafficTable(repo.root, on_error=metrics.record_traffic_error)
        self.shadow: ShadowTraffic | None = None
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads or codec_threads(), thread_name_prefix="stitchrec-decode"
        )

    async def offload(self, fn: Callable[[], T]) -> T:
        """Runs ``fn`` on a decode worker thread, the event loop free meanwhile; for a request
        of at most ``INLINE_BYTES`` on the wire, at once on the loop."""
        if _request_bytes.get() <= INLINE_BYTES:
            return fn()
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn)

    async def parse(self, request_type: type[pb_message.Message], raw: bytes) -> Any:
        """The request message in ``raw`` (INVALID_ARGUMENT when it does not parse)."""
        name = request_type.DESCRIPTOR.name
        try:
            if len(raw) <= INLINE_BYTES:
                return request_type.FromString(raw)
            return await self.offload(lambda: request_type.FromString(raw))
        except pb_message.DecodeError as e:
            raise invalid(f"the request is not a valid {name} message: {e}") from None

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def clip(message: str, most: int) -> str:
    """``message`` cut to at most about ``most`` characters, saying how much was cut."""
    if len(message) <= most:
        return message
    return f"{message[:most]}... ({len(message) - most} more characters)"


def rpc(method: str, request_type: type[pb_message.Message] | None = None) -> Callable:
    """Wraps a handler: admission control (``serving.admission``), exceptions -> gRPC status
    with a message (and a retry hint when overloaded), metrics per call; for an inference method
    (``INFERENCE_METHODS``) the call span ``stitchrec.call`` (``serving.tracing``), continuing
    the client's ``traceparent`` and answering its own in the initial (or, for an error, the
    trailing) metadata when tracing is on.

    With ``request_type`` the handler is registered (``add_service``) to receive wire bytes;
    the wrapper parses them into ``request_type`` (after admission) before calling it.
    """
    traced = method in INFERENCE_METHODS

    def deco(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(fn)
        async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            t0 = time.perf_counter()
            state: ServerState = self.state

            def record(code: str) -> None:
                state.metrics.record_rpc(method, code, time.perf_counter() - t0)

            metadata = context.invocation_metadata()
            start_call("grpc", _metadata_value(metadata, REQUEST_ID_HEADER))
            carrier = tracing.grpc_carrier(metadata) if traced else None
            failure = None
            with tracing.call_span(method, carrier) if traced else tracing.OFF:
                try:
                    with state.admission.admit(method):
                        if request_type is not None and isinstance(request, bytes):
                            set_request_bytes(len(request))
                            request = await state.parse(request_type, request)
                        response = await fn(self, request, context)
                except asyncio.CancelledError:
                    tracing.set_status("CANCELLED", error=True)
                    record("CANCELLED")
                    raise
                except Exception as e:
                    failure = _failure(state, method, e)
                    tracing.set_status(failure[0].name, error=True)
                else:
                    tracing.set_status("OK", error=False)
                headers = tuple(tracing.response_headers().items())
            if failure is not None:
                status, message, trailers = failure
                # counted before the status goes out: a client that sees the error and then
                # scrapes /metrics finds it counted
                record(status.name)
                await context.abort(status, message, trailing_metadata=(*trailers, *headers))
            headers = (*route_headers(), *headers)
            if headers:
                await context.send_initial_metadata(headers)
            record("OK")
            return response

        wrapper.request_type = request_type  # type: ignore[attr-defined]
        return wrapper

    return deco


def _failure(
    state: ServerState, method: str, exc: Exception
) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """The status, message (cut to ``Limits.max_message_chars``) and trailing metadata that
    answer ``exc``; an INTERNAL error is logged with its traceback."""
    status, message, trailers = state.admission.answer(method, exc)
    if status == grpc.StatusCode.INTERNAL:
        log.exception(json.dumps({"event": "internal_error", "method": method}))
    return status, clip(message, state.limits.max_message_chars), tuple(trailers or ())


def _metadata_value(metadata: Any, key: str) -> str | bytes | None:
    """The first value of invocation metadata ``key`` (None when the call has none)."""
    for k, v in metadata or ():
        if k == key:
            return v
    return None


def route(
    state: ServerState,
    context: grpc.aio.ServicerContext,
    model: str,
    version: int | None,
    label: str | None,
    feature: Callable[[str], Any],
) -> Route:
    """``serving.routing.route`` for a gRPC call: a ``header:NAME`` split key from the call's
    metadata, a feature key from ``feature(name)``."""
    metadata = context.invocation_metadata()
    return routing.route(
        state, model, version, label, lambda h: _metadata_value(metadata, h), feature
    )


def record_answer_version(version: int) -> None:
    """Records the version that answered the current call: the ``rpc`` wrapper then answers
    with initial metadata naming the call's arm and that version."""
    info = current_call()
    if info is not None:
        info.version = version


def route_headers() -> tuple[tuple[str, str], ...]:
    """The arm and version metadata of the current call (none before ``record_answer_version``)."""
    info = current_call()
    if info is None or info.version is None:
        return ()
    return ((routing.ARM_HEADER, info.arm), (routing.VERSION_HEADER, str(info.version)))


def _serialize(message: pb_message.Message) -> bytes:
    return message.SerializeToString()


def add_service(server: grpc.aio.Server, servicer: Any, service: ServiceDescriptor) -> None:
    """Registers every unary method of ``service`` on ``server``, served by ``servicer``'s
    method of the same name. Methods wrapped by ``rpc(..., request_type)`` get the wire bytes
    (parsed by the wrapper); the others the parsed request."""
    handlers = {}
    for m in service.methods:
        fn = getattr(servicer, m.name)
        parses = getattr(fn, "request_type", None) is not None
        handlers[m.name] = grpc.unary_unary_rpc_method_handler(
            fn,
            request_deserializer=None
            if parses
            else message_factory.GetMessageClass(m.input_type).FromString,
            response_serializer=_serialize,
        )
    generic = grpc.method_handlers_generic_handler(service.full_name, handlers)
    server.add_generic_rpc_handlers((generic,))
    server.add_registered_method_handlers(service.full_name, handlers)


def deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The call's deadline as ``serving.inference`` takes it."""
    return inference.deadline_from(context.time_remaining())


def check_outputs(wanted: list[str], outputs: dict, where: str, what: str) -> None:
    """Raises INVALID_ARGUMENT when ``wanted`` names an output the model does not have."""
    unknown = sorted(set(wanted) - set(outputs))
    if unknown:
        raise invalid(f"{where}: {what} {inference.name_list(unknown)}; outputs: {sorted(outputs)}")
