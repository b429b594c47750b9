"""The baseline of ``bench.serving.tracing_cost``: one recorded call's spans made through the
OpenTelemetry SDK's tracer, ``BatchSpanProcessor`` and OTLP encoder.

``sdk_call_us(detail, calls)`` makes the spans ``serving.tracing`` makes for one batched call
(``stages``: ``stitchrec.call`` with ``decode``, ``queue_wait``, ``batch`` and ``inference``;
``call``: the one ``stitchrec.call`` span with the stages as attributes), with the same
attributes, the client's ``traceparent`` read and the answer's written, through an SDK
``TracerProvider`` whose processor exports batches of 64 spans to an exporter that encodes them
with the SDK's encoder and drops the bytes. CPU microseconds per call, the best of 5 repeats.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from serving import tracing

CARRIER = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
CALL = {"rpc.system": "grpc", "rpc.method": "Rank", "stitchrec.request_id": "bench"}
DECODED = {
    "stitchrec.model": "lin",
    "stitchrec.version": 1,
    "stitchrec.signature": "serving_default",
    "stitchrec.rows": 3,
}
_propagator = TraceContextTextMapPropagator()


class _Encoding(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        encode_spans(spans).SerializeToString()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def _one_call(tracer: trace.Tracer, detail: str) -> None:
    parent = _propagator.extract(CARRIER)
    with tracer.start_as_current_span(
        tracing.CALL_SPAN, context=parent, kind=SpanKind.SERVER, attributes=dict(CALL)
    ) as call:
        call.set_attributes(DECODED)
        now = time.time_ns()
        batch_attrs = {"stitchrec.batch.rows": 3, "stitchrec.batch.requests": 1}
        if detail == "call":
            call.set_attribute("stitchrec.decode_ms", 0.01)
            call.set_attributes(
                {**batch_attrs, "stitchrec.batch_ms": 0.0, "stitchrec.inference_ms": 0.0}
            )
            call.set_attribute("stitchrec.queue_wait_ms", 0.0)
        else:
            tracer.start_span("decode", start_time=now, attributes={"rows": 3}).end()
            ctx = trace.set_span_in_context(call)
            tracer.start_span("queue_wait", context=ctx, start_time=now).end(now)
            batch = tracer.start_span(
                "batch", context=ctx, start_time=now, attributes={**batch_attrs, "rows": 3}
            )
            tracer.start_span(
                "inference",
                context=trace.set_span_in_context(batch, ctx),
                start_time=now,
                attributes={"stitchrec.batch.rows": 3},
            ).end(now)
            batch.end(now)
        call.set_attribute("stitchrec.status_code", "OK")
        _propagator.inject({})


def flushed_us(call: Callable[[], object], flush: Callable[[], object], calls: int) -> float:
    """CPU microseconds (of the process: the export thread too) per ``call()``, the export in
    the timed region: each of 5 repeats makes ``calls`` calls, then ``flush()``; the best."""
    runs = []
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(calls):
            call()
        flush()
        runs.append(time.process_time() - t0)
    return 1e6 * min(runs) / calls


def sdk_call_us(detail: str, calls: int) -> float:
    """CPU microseconds per recorded call at ``detail`` through the SDK (module docstring)."""
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Encoding(), max_export_batch_size=64))
    tracer = provider.get_tracer("bench")
    try:
        return flushed_us(lambda: _one_call(tracer, detail), provider.force_flush, calls)
    finally:
        provider.shutdown()
