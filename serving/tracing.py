"""OpenTelemetry tracing of inference calls (gRPC and HTTP), off unless a server installs it.

Spans of one call::

    stitchrec.call          root (SERVER kind): the whole call, one per gRPC or HTTP call
    ├── decode              from the call's start until its inputs are parsed, decoded, checked
    ├── queue_wait          time in the dynamic batcher's queue before its batch starts
    └── batch               the batch the call joined (``stitchrec.batch.rows``, ``.requests``)
        └── inference       the model call of that batch

A call whose signature runs outside the batcher has ``decode`` and ``inference`` only. Batches
run on the batcher's own task: each queued request carries its trace context (``capture``), and
``record_batch`` writes one ``queue_wait`` / ``batch`` / ``inference`` trio per request of the
batch, parented to that request's ``stitchrec.call``.

Detail ``call`` (``install(..., detail="call")``, ``stitchrec serve --trace-detail call``) records
the same stages on the one ``stitchrec.call`` span instead, as attributes in milliseconds:
``stitchrec.decode_ms``, ``stitchrec.queue_wait_ms``, ``stitchrec.batch_ms`` and
``stitchrec.inference_ms`` (with ``stitchrec.batch.rows`` and ``stitchrec.batch.requests``). A
span costs the server its creation, processing and export; one span per call instead of five is
the cheaper form for servers that trace every call.

Propagation is W3C trace context: ``traceparent`` / ``tracestate`` read from gRPC invocation
metadata or HTTP headers (``call_span``'s ``carrier``), so a client's trace continues on the
server; ``response_headers`` gives the ``traceparent`` of the server's call span for the answer.

Off by default: nothing is installed and every function here returns at once (``call_span``
and ``span`` hand out the API's no-op span, ``INVALID_SPAN``). ``install`` (called by
``create_server`` for ``ServerOptions.otlp_endpoint``) turns tracing on for the process;
``shutdown`` flushes and turns it off. Spans are OpenTelemetry API spans made by
``serving.trace_spans`` (resource ``service.name=stitchrec``), not by the SDK's tracer: they
keep the server's own attributes in a plain dict, and ``serving.otlp_wire`` encodes them as
OTLP without the SDK's objects, which costs a recorded call 2.9x to 4x less CPU (``python -m
bench.serving.tracing_cost``). Any SDK ``SpanExporter`` still works (``install`` hands it the
SDK's ``ReadableSpan`` objects).

Sampling: a call that continues a client's trace (a valid ``traceparent``) follows the client's
sampled flag; any other call is recorded with probability ``sample_rate``, drawn before any span
is made, so an unsampled call costs a random draw (about a microsecond). Child spans (``span``)
are made only under a recorded span. Ended spans wait in a bounded buffer
(``MAX_QUEUED_SPANS``; more are dropped and counted) and are exported at most
``EXPORT_BATCH_SPANS`` at a time from the buffer's thread. Each export request costs a gRPC
call on both ends, so batches are large; encoding holds the interpreter lock that the server's
event loop needs, so a batch is encoded 64 spans at a time with the lock released in between
(``serving.otlp_wire.encode_request``), and sending it releases the lock.

Tracing is one per process (a second ``install`` replaces the first), and a process can install
and shut it down more than once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from serving.calls import current_call
from serving.config import TRACE_DETAILS as DETAILS
from serving.config import OtlpSettings
from serving.otlp_wire import OtlpSender
from serving.trace_spans import RecordedSpan, SpanBuffer, SpanSink, sdk_sink, start_span

SERVICE_NAME = "stitchrec"
CALL_SPAN = "stitchrec.call"
TRACE_HEADERS = ("traceparent", "tracestate")
EXPORT_TIMEOUT_S = 5.0  # how long flush() and the stop wait for the exporter
EXPORT_BATCH_SPANS = 256  # spans per export request (docstring)
MAX_QUEUED_SPANS = 2048  # ended spans held for export; more are dropped and counted
EXPORT_INTERVAL_S = 5.0  # the longest a span waits for its export while fewer than a batch wait

_propagator = TraceContextTextMapPropagator()


@dataclasses.dataclass
class _State:
    buffer: SpanBuffer | None = None
    close: Callable[[], object] | None = None  # the exporter's shutdown
    detail: str = "stages"
    sample_rate: float = 1.0


_state = _State()


class _Off:
    """The context manager handed out while tracing is off: yields the no-op span."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return INVALID_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


OFF = _Off()  # the no-op context manager (``with OFF as span``: span is INVALID_SPAN)


# --------------------------------------------------------------------------------------------
# setup


def resource() -> Resource:
    """The resource of the server's spans: ``service.name=stitchrec`` and the SDK's
    ``telemetry.sdk.*`` attributes."""
    return Resource.create({"service.name": SERVICE_NAME})


def install(
    exporter: SpanExporter | SpanSink, sample_rate: float = 1.0, detail: str = "stages"
) -> SpanBuffer:
    """Turns tracing on: spans recorded by ``serving.trace_spans`` and exported in batches.

    ``exporter``: a ``SpanSink`` such as the ``OtlpSender`` of ``otlp_exporter``, or any
    OpenTelemetry SDK ``SpanExporter`` (handed the SDK's ``ReadableSpan`` objects).
    ``sample_rate``: the share of root traces recorded (a call that continues a client's trace
    follows the client's sampled flag). ``detail``: ``stages`` (a span per stage) or ``call``
    (one span per call, the stages as its attributes; module docstring). Replaces (and shuts
    down) what was installed before.
    """
    if not 0.0 <= sample_rate <= 1.0:
        raise ValueError(f"trace sample rate must be in [0, 1], got {sample_rate}")
    if detail not in DETAILS:
        raise ValueError(f"trace detail must be one of {DETAILS}, got {detail!r}")
    shutdown()
    if isinstance(exporter, SpanExporter):
        sink, close = sdk_sink(exporter, resource()), exporter.shutdown
    else:
        sink, close = exporter, exporter.close
    buffer = SpanBuffer(sink, MAX_QUEUED_SPANS, EXPORT_BATCH_SPANS, EXPORT_INTERVAL_S)
    _state.buffer, _state.close = buffer, close
    _state.detail = detail
    _state.sample_rate = sample_rate
    return buffer


def otlp_exporter(endpoint: str, settings: OtlpSettings | None = None) -> OtlpSender:
    """The OTLP/gRPC span exporter to a collector at ``endpoint``: ``HOST:PORT`` or
    ``http://HOST:PORT`` (plaintext), ``https://HOST:PORT`` (TLS); ``settings``: its headers,
    compression, TLS roots and export timeout."""
    return OtlpSender(endpoint, resource(), settings)


def count_lost(on_lost: Callable[[str, int], None]) -> None:
    """Tells ``on_lost(reason, spans)`` of spans that will never be exported: ``full`` (the
    buffer held ``MAX_QUEUED_SPANS``), ``failed`` (the exporter did not take them)."""
    if _state.buffer is not None:
        _state.buffer.on_lost = on_lost


def enabled() -> bool:
    """Whether tracing is installed."""
    return _state.buffer is not None


def flush(timeout_s: float = EXPORT_TIMEOUT_S) -> bool:
    """Exports the finished spans now; False when they did not all go out in time."""
    if _state.buffer is None:
        return True
    return _state.buffer.flush(timeout_s)


def shutdown() -> None:
    """Flushes the spans and turns tracing off (blocks up to the export timeout)."""
    buffer, close = _state.buffer, _state.close
    _state.buffer = _state.close = None
    if buffer is not None:
        buffer.shutdown(EXPORT_TIMEOUT_S)
    if close is not None:
        close()


# --------------------------------------------------------------------------------------------
# the call span


def call_span(
    method: str, carrier: Mapping[str, Any] | None = None, protocol: str = "grpc"
) -> contextlib.AbstractContextManager[Span]:
    """The root span ``stitchrec.call`` of one call, current while the ``with`` block runs.

    ``method``: what was called (gRPC: ``Rank``, ``Predict``, ``ModelInfer``; HTTP: e.g.
    ``POST /v1/models/{m}:predict``). ``carrier``: the request's headers or invocation metadata,
    read for ``traceparent`` / ``tracestate`` (a ``get(key)`` mapping; lower-case keys unless it
    is case-insensitive like aiohttp's headers). Call ``serving.calls.start_call`` first: the
    span takes its request id and, when the call is sampled, sets ``CallInfo.trace_id``. An
    exception leaving the block marks the span ERROR; ``set_status`` records the answered code.
    A call that is not sampled (module docstring) gets ``OFF``: no span at all.
    """
    buffer = _state.buffer
    if buffer is None:
        return OFF
    parent = None
    if carrier and carrier.get("traceparent"):
        client = trace.get_current_span(_propagator.extract(carrier)).get_span_context()
        if client.is_valid:  # else a malformed traceparent: a root call
            if not client.trace_flags.sampled:
                return OFF
            parent = client
    if parent is None and random.random() >= _state.sample_rate:
        return OFF
    info = current_call()
    attributes: dict[str, Any] = {"rpc.system": protocol, "rpc.method": method}
    if info is not None:
        attributes["stitchrec.request_id"] = info.request_id
    span = start_span(buffer, CALL_SPAN, parent, SpanKind.SERVER, attributes)
    if info is not None:
        info.trace_id = trace.format_trace_id(span.context.trace_id)
    return _Current(span)


class _Current:
    """``span`` current while the ``with`` block runs, then ended; an exception leaving the
    block is recorded on it and marks it ERROR (as the SDK's ``start_as_current_span`` does)."""

    __slots__ = ("span", "token")

    def __init__(self, span: RecordedSpan) -> None:
        self.span = span
        self.token: object = None

    def __enter__(self) -> Span:
        self.token = otel_context.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: Any) -> None:
        span = self.span
        if e is not None:
            span.record_exception(e, escaped=True)
            span.set_status(Status(StatusCode.ERROR, f"{type(e).__name__}: {e}"))
        otel_context.detach(self.token)
        span.end()


def grpc_carrier(metadata: Any) -> dict[str, str]:
    """The trace headers of gRPC invocation metadata (``(key, value)`` pairs) as a carrier."""
    if _state.buffer is None or not metadata:
        return {}
    return {k: v for k, v in metadata if k in TRACE_HEADERS and isinstance(v, str)}


def set_status(code: str, error: bool) -> None:
    """Records the answered status on the current call span: ``stitchrec.status_code`` (a gRPC
    code name like ``OK``, or an HTTP status like ``200``); ``error`` marks the span ERROR."""
    if _state.buffer is None:
        return
    span = trace.get_current_span()
    span.set_attribute("stitchrec.status_code", code)
    if error:
        span.set_status(Status(StatusCode.ERROR, code))


def response_headers() -> dict[str, str]:
    """``{"traceparent": ...}`` of the current call span for the response ({} when off or not
    sampled)."""
    if _state.buffer is None:
        return {}
    out: dict[str, str] = {}
    if trace.get_current_span().get_span_context().trace_flags.sampled:
        _propagator.inject(out)
        out.pop("tracestate", None)
    return out


def log_fields(request_id_fallback: str | bytes | None = None) -> dict[str, str]:
    """The access log's ids of the current call: ``request_id`` (``current_call()``'s, else
    ``request_id_fallback``, else ``""``) and ``trace_id`` when tracing is on and the call was
    sampled."""
    info = current_call()
    if info is not None:
        rid = info.request_id
    elif isinstance(request_id_fallback, bytes):
        rid = request_id_fallback.decode("ascii", errors="replace")
    else:
        rid = request_id_fallback or ""
    out = {"request_id": rid}
    if _state.buffer is not None and info is not None and info.trace_id:
        out["trace_id"] = info.trace_id
    return out


# --------------------------------------------------------------------------------------------
# child spans


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Span]:
    """A child span of the current span (e.g. ``inference``), current while the block runs;
    with detail ``call``, the block's time as the current span's ``stitchrec.<name>_ms``.
    ``OFF`` unless the current span is recorded."""
    buffer = _state.buffer
    if buffer is None:
        return OFF
    current = trace.get_current_span()
    if not current.is_recording():
        return OFF
    if _state.detail == "call":
        return _timed(name)
    return _Current(start_span(buffer, name, current.get_span_context(), attributes=attributes))


@contextlib.contextmanager
def _timed(name: str) -> Iterator[Span]:
    current = trace.get_current_span()
    started = time.perf_counter()
    try:
        yield current
    finally:
        if current.is_recording():
            current.set_attribute(f"stitchrec.{name}_ms", (time.perf_counter() - started) * 1e3)


def decoded(model: str, version: int, signature: str, rows: int) -> None:
    """Records the ``decode`` span (from the call span's start until now: parsing, decoding and
    checks) and the call's model, version, signature and rows on the call span (the current
    span)."""
    buffer = _state.buffer
    if buffer is None:
        return
    current = trace.get_current_span()
    if not isinstance(current, RecordedSpan) or not current.is_recording():
        return
    current.set_attributes(
        {
            "stitchrec.model": model,
            "stitchrec.version": version,
            "stitchrec.signature": signature,
            "stitchrec.rows": rows,
        }
    )
    started_ns = current.start_time
    if _state.detail == "call":
        current.set_attribute("stitchrec.decode_ms", (time.time_ns() - started_ns) / 1e6)
        return
    parent = current.context
    start_span(buffer, "decode", parent, attributes={"rows": rows}, start_time=started_ns).end()


def capture() -> otel_context.Context | None:
    """The current trace context when its span is recorded (for a queued request), else None."""
    if _state.buffer is None or not trace.get_current_span().is_recording():
        return None
    return otel_context.get_current()


@dataclasses.dataclass(frozen=True)
class BatchTimes:
    """One batch's times in ``time.monotonic()`` seconds: formed (``start``), the model call's
    start and end (``model_start``, ``model_end``), and done (``end``)."""

    start: float
    model_start: float
    model_end: float
    end: float


def record_batch(
    contexts: Sequence[otel_context.Context | None],
    enqueued: Sequence[float],
    rows: Sequence[int],
    times: BatchTimes,
    error: BaseException | None = None,
) -> None:
    """Writes ``queue_wait``, ``batch`` and ``inference`` spans for each request of a batch that
    has a trace context (``contexts[i]``, from ``capture``; ``enqueued[i]``: its monotonic
    enqueue time). ``error``: the batch failed (its spans are marked ERROR)."""
    buffer = _state.buffer
    if buffer is None or not any(c is not None for c in contexts):
        return
    if _state.detail == "call":
        _batch_attributes(contexts, enqueued, rows, times, error)
        return
    # monotonic seconds -> epoch nanoseconds, the clock spans are stamped with
    offset = time.time_ns() - int(time.monotonic() * 1e9)

    def ns(t: float) -> int:
        return offset + int(t * 1e9)

    total = sum(rows)
    batch_attrs = {"stitchrec.batch.rows": total, "stitchrec.batch.requests": len(rows)}
    for ctx, t_in, r in zip(contexts, enqueued, rows, strict=True):
        call = trace.get_current_span(ctx).get_span_context() if ctx is not None else None
        if call is None or not call.is_valid:
            continue
        start_span(buffer, "queue_wait", call, start_time=ns(t_in)).end(ns(times.start))
        batch = start_span(
            buffer, "batch", call, attributes={**batch_attrs, "rows": r}, start_time=ns(times.start)
        )
        model = start_span(
            buffer,
            "inference",
            batch.context,
            attributes={"stitchrec.batch.rows": total},
            start_time=ns(times.model_start),
        )
        if error is not None:
            for s in (model, batch):
                s.record_exception(error)
                s.set_status(Status(StatusCode.ERROR, type(error).__name__))
        model.end(ns(times.model_end))
        batch.end(ns(times.end))


def _batch_attributes(
    contexts: Sequence[otel_context.Context | None],
    enqueued: Sequence[float],
    rows: Sequence[int],
    times: BatchTimes,
    error: BaseException | None,
) -> None:
    """``record_batch`` for detail ``call``: the stages' milliseconds on each call span."""
    shared = {
        "stitchrec.batch.rows": sum(rows),
        "stitchrec.batch.requests": len(rows),
        "stitchrec.batch_ms": (times.end - times.start) * 1e3,
        "stitchrec.inference_ms": (times.model_end - times.model_start) * 1e3,
    }
    for ctx, t_in in zip(contexts, enqueued, strict=True):
        call = trace.get_current_span(ctx) if ctx is not None else INVALID_SPAN
        if not call.is_recording():
            continue
        call.set_attributes({**shared, "stitchrec.queue_wait_ms": (times.start - t_in) * 1e3})
        if error is not None:
            call.record_exception(error)
