"""serving.tracing's sampling and export batches, without a server: an unsampled call makes no
span, children only under recorded spans, a client's sampled flag is followed, the sample rate is
kept within binomial error, and no export carries more than EXPORT_BATCH_SPANS spans."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from serving import tracing
from serving.calls import start_call

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


class BatchSizes(SpanExporter):
    """Records the size of every export."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.sizes.append(len(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def _call(carrier: dict[str, str] | None = None) -> None:
    """The tracing calls of one call outside the batcher: call span, decode, inference."""
    start_call("grpc", None)
    with tracing.call_span("Rank", carrier):
        tracing.decoded("lin", 1, "serving_default", 3)
        with tracing.span("inference", rows=3):
            pass
        tracing.set_status("OK", error=False)


@pytest.fixture
def installed():
    def install(exporter: SpanExporter, sample_rate: float) -> None:
        tracing.install(exporter, sample_rate=sample_rate)

    yield install
    tracing.shutdown()


def test_an_unsampled_call_makes_no_span_and_no_child(installed):
    spans = InMemorySpanExporter()
    installed(spans, 0.0)
    start_call("grpc", "r")
    with tracing.call_span("Rank", {}) as call:
        assert call is tracing.INVALID_SPAN and not call.is_recording()
        assert tracing.span("inference") is tracing.OFF
        assert tracing.capture() is None and tracing.response_headers() == {}
    _call()
    assert tracing.flush() and spans.get_finished_spans() == ()


def test_the_sample_rate_holds_and_every_sampled_call_has_its_children(installed):
    spans = InMemorySpanExporter()
    rate, calls = 0.3, 2_000
    installed(spans, rate)
    for _ in range(calls):
        _call()
    assert tracing.flush()
    finished = spans.get_finished_spans()
    roots = [s for s in finished if s.name == tracing.CALL_SPAN]
    sigma = math.sqrt(calls * rate * (1 - rate))
    assert abs(len(roots) - calls * rate) < 5 * sigma, len(roots)
    assert all(s.parent is None for s in roots)
    root_ids = {s.context.span_id for s in roots}
    children = [s for s in finished if s.name != tracing.CALL_SPAN]
    # decode and inference under each sampled call, none of them a root of its own
    assert sorted(s.name for s in children) == ["decode"] * len(roots) + ["inference"] * len(roots)
    assert {s.parent.span_id for s in children} == root_ids


@pytest.mark.parametrize(
    ("flags", "rate", "recorded"),
    [("01", 0.0, True), ("00", 1.0, False)],
)
def test_a_client_trace_decides_by_its_sampled_flag(installed, flags, rate, recorded):
    spans = InMemorySpanExporter()
    installed(spans, rate)
    _call({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-{flags}"})
    assert tracing.flush()
    finished = spans.get_finished_spans()
    assert len(finished) == (3 if recorded else 0)
    if recorded:
        (root,) = [s for s in finished if s.name == tracing.CALL_SPAN]
        assert f"{root.context.trace_id:032x}" == CLIENT_TRACE
        assert f"{root.parent.span_id:016x}" == CLIENT_SPAN


def test_a_malformed_traceparent_is_a_root_call_at_the_sample_rate(installed):
    spans = InMemorySpanExporter()
    installed(spans, 0.0)
    _call({"traceparent": "00-not-a-trace-01"})
    assert tracing.flush() and spans.get_finished_spans() == ()


def test_no_export_carries_more_than_the_batch_limit(installed):
    sizes = BatchSizes()
    installed(sizes, 1.0)
    for _ in range(200):  # 600 spans, queued before the flush exports them
        _call()
    assert tracing.flush()
    assert sum(sizes.sizes) == 600
    assert max(sizes.sizes) <= tracing.EXPORT_BATCH_SPANS < 600


def test_an_exception_leaving_a_span_is_recorded_and_marks_it_error(installed):
    spans = InMemorySpanExporter()
    installed(spans, 1.0)
    start_call("grpc", "r")
    with (
        pytest.raises(ValueError, match="boom"),
        tracing.call_span("Rank", {}),
        tracing.span("inference"),  # made once the call span is current
    ):
        raise ValueError("boom")
    assert tracing.flush()
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert set(by_name) == {"inference", tracing.CALL_SPAN}
    for s in by_name.values():
        assert s.status.status_code.name == "ERROR"
        assert s.status.description == "ValueError: boom"
        assert [e.name for e in s.events] == ["exception"]
        assert s.events[0].attributes["exception.type"] == "ValueError"
    assert by_name["inference"].parent.span_id == by_name[tracing.CALL_SPAN].context.span_id
    # the context is restored: no span is current after the blocks
    assert not tracing.trace.get_current_span().is_recording()
