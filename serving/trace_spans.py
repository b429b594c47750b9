"""The server's span recorder: OpenTelemetry API spans kept as plain records, exported in batches.

``serving.tracing`` makes its spans here instead of through the OpenTelemetry SDK's tracer. A
``RecordedSpan`` implements the API's ``Span`` (so ``opentelemetry.trace.get_current_span``,
``set_span_in_context`` and the W3C propagator work with it) but keeps its attributes in a plain
dict: the server sets only its own attributes, of types it chooses (str, int, float, bool), so
the SDK's per-value checks and locks are not needed. Ending a span appends it to a
``SpanBuffer``; the buffer's thread hands batches to a sink (``serving.otlp_wire.OtlpSender``,
which encodes them as OTLP itself, or any SDK ``SpanExporter`` through ``sdk_sink``).

The buffer holds at most ``max_queue`` spans; a span ended while it is full is dropped and
counted (``SpanBuffer.dropped``, and ``on_lost("full", 1)``), so a collector that is slow or away
never grows the server's memory.
"""

from __future__ import annotations

import collections
import random
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

SAMPLED = TraceFlags(TraceFlags.SAMPLED)
SCOPE = "stitchrec.serving"  # the instrumentation scope's name on every span

Sink = Callable[[Sequence["RecordedSpan"]], bool]  # exports one batch; False: not exported


class SpanSink(Protocol):
    """Where ``serving.tracing`` sends spans (e.g. ``serving.otlp_wire.OtlpSender``)."""

    def __call__(self, spans: Sequence[RecordedSpan]) -> bool:
        """Exports one batch of ended spans; False when they were not exported."""

    def close(self) -> None:
        """Releases what the sink holds (after the last batch)."""


class RecordedSpan(trace.Span):
    """A recording span: name, ids, kind, times (epoch ns), attributes, status and events.

    ``parent``: the parent's ``SpanContext`` (None for a root span); ``buffer``: where ``end``
    puts it. Attribute values are the caller's own (str, int, float or bool), kept unchecked.
    """

    __slots__ = (
        "_buffer",
        "attributes",
        "context",
        "end_time",
        "events",
        "kind",
        "name",
        "parent",
        "start_time",
        "status",
    )

    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict[str, Any] | None,
        start_time: int | None,
        buffer: SpanBuffer,
    ) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.start_time = start_time or time.time_ns()
        self.end_time: int | None = None
        self.attributes: dict[str, Any] = attributes if attributes is not None else {}
        self.status = Status(StatusCode.UNSET)
        self.events: list[tuple[str, int, dict[str, Any]]] = []
        self._buffer = buffer

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return self.end_time is None

    def set_attribute(self, key: str, value: Any) -> None:
        if self.end_time is None:  # an ended span may be in an export already
            self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self.end_time is None:
            self.attributes.update(attributes)

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        """Sets the status, as the SDK does: ``OK`` is final, ``UNSET`` changes nothing."""
        if isinstance(status, StatusCode):
            status = Status(status, description)
        if self.end_time is not None or self.status.status_code is StatusCode.OK:
            return
        if status.status_code is not StatusCode.UNSET:
            self.status = status

    def add_event(
        self, name: str, attributes: Mapping[str, Any] | None = None, timestamp: int | None = None
    ) -> None:
        if self.end_time is None:
            self.events.append((name, timestamp or time.time_ns(), dict(attributes or {})))

    def record_exception(
        self,
        exception: BaseException,
        attributes: Mapping[str, Any] | None = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        """An ``exception`` event with OpenTelemetry's semantic attributes."""
        stack = "".join(
            traceback.format_exception(type(exception), exception, exception.__traceback__)
        )
        event = {
            "exception.type": type(exception).__name__,
            "exception.message": str(exception),
            "exception.stacktrace": stack,
            "exception.escaped": str(escaped),
        }
        self.add_event("exception", {**event, **(attributes or {})}, timestamp)

    def update_name(self, name: str) -> None:
        self.name = name

    def end(self, end_time: int | None = None) -> None:
        """Ends the span (a second ``end`` does nothing) and hands it to the buffer."""
        if self.end_time is not None:
            return
        self.end_time = end_time or time.time_ns()
        self._buffer.put(self)


def start_span(
    buffer: SpanBuffer,
    name: str,
    parent: SpanContext | None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: dict[str, Any] | None = None,
    start_time: int | None = None,
) -> RecordedSpan:
    """A new sampled span: a child of ``parent`` (its trace id and trace state), or the root of
    a new trace (random 128-bit trace id) when ``parent`` is None or invalid."""
    if parent is not None and parent.is_valid:
        trace_id, state = parent.trace_id, parent.trace_state
    else:
        parent, trace_id, state = None, random.getrandbits(128) or 1, None
    context = SpanContext(trace_id, random.getrandbits(64) or 1, False, SAMPLED, state)
    return RecordedSpan(name, context, parent, kind, attributes, start_time, buffer)


class SpanBuffer:
    """Ended spans waiting for export, and the thread that exports them.

    The thread wakes when ``batch`` spans are waiting and hands the sink full batches of
    ``batch`` spans; when ``interval_s`` has passed without a full batch, or on ``flush``, it
    also sends what is left (a smaller batch): each export is a request to the collector, so
    full batches keep their number low. ``max_queue`` bounds the spans held; more are
    dropped and counted in ``dropped``. ``failed`` counts spans of batches the sink did not
    export. ``on_lost(reason, spans)``, when set, is told of each loss (``full`` / ``failed``).
    """

    def __init__(
        self, sink: Sink, max_queue: int = 2048, batch: int = 64, interval_s: float = 5.0
    ) -> None:
        if max_queue < 1 or batch < 1 or interval_s <= 0:
            raise ValueError(
                f"span buffer needs max_queue >= 1, batch >= 1 and interval_s > 0, got "
                f"{max_queue}, {batch}, {interval_s}"
            )
        self._sink = sink
        self._max_queue = max_queue
        self._batch = batch
        self._interval_s = interval_s
        self._spans: collections.deque[RecordedSpan] = collections.deque()
        self._wake = threading.Event()
        self._flushing = False
        self._idle = threading.Condition()
        self._busy = False
        self._stopped = False
        self.dropped = 0
        self.failed = 0
        self.on_lost: Callable[[str, int], None] | None = None
        self._thread = threading.Thread(target=self._run, name="stitchrec-spans", daemon=True)
        self._thread.start()

    def put(self, span: RecordedSpan) -> None:
        """Queues an ended span (drops it when the buffer is full or stopped)."""
        if self._stopped or len(self._spans) >= self._max_queue:
            self.dropped += 1
            self._lost("full", 1)
            return
        self._spans.append(span)
        if len(self._spans) >= self._batch:
            self._wake.set()

    def _lost(self, reason: str, spans: int) -> None:
        if self.on_lost is not None:
            self.on_lost(reason, spans)

    def _run(self) -> None:
        while not self._stopped:
            woken = self._wake.wait(self._interval_s)
            self._wake.clear()
            everything, self._flushing = not woken or self._flushing or self._stopped, False
            self._drain(everything)

    def _drain(self, everything: bool) -> None:
        """Exports the full batches waiting, and with ``everything`` the rest too."""
        with self._idle:
            self._busy = True
        try:
            while len(self._spans) >= (1 if everything else self._batch):
                batch = [self._spans.popleft() for _ in range(min(self._batch, len(self._spans)))]
                try:
                    ok = self._sink(batch)
                except Exception:  # a failed export drops its batch, never the thread
                    ok = False
                if not ok:
                    self.failed += len(batch)
                    self._lost("failed", len(batch))
        finally:
            with self._idle:
                self._busy = False
                self._idle.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Exports the waiting spans now; False when they did not all go out within
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._spans or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._flushing = True
                self._wake.set()
                self._idle.wait(min(left, 0.05))
        return True

    def shutdown(self, timeout_s: float) -> None:
        """Flushes, then stops the thread; spans ended afterwards are dropped."""
        self.flush(timeout_s)
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout_s)


# --------------------------------------------------------------------------------------------
# SDK exporters


def readable(span: RecordedSpan, resource: Resource) -> ReadableSpan:
    """The SDK's ``ReadableSpan`` of a recorded span (for an SDK ``SpanExporter``)."""
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=resource,
        attributes=span.attributes,
        events=[Event(name, attrs, ts) for name, ts, attrs in span.events],
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=InstrumentationScope(SCOPE),
    )


def sdk_sink(exporter: SpanExporter, resource: Resource) -> Sink:
    """A sink that exports through an OpenTelemetry SDK ``SpanExporter``."""

    def export(spans: Sequence[RecordedSpan]) -> bool:
        result = exporter.export([readable(s, resource) for s in spans])
        return result is SpanExportResult.SUCCESS

    return export
