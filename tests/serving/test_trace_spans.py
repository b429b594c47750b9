"""serving.trace_spans: a recorded span follows the OpenTelemetry API's rules (ids, parents,
status, nothing after its end), and the span buffer exports in bounded batches, on time, drops
and counts what does not fit and survives a failing sink."""

from __future__ import annotations

import threading
import time

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from serving.trace_spans import SpanBuffer, start_span


class _Keep:
    def __init__(self, gate: threading.Event | None = None, fail: bool = False):
        self.batches: list[list] = []
        self.gate, self.fail = gate, fail

    def __call__(self, spans):
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail:
            raise ConnectionError("collector away")
        self.batches.append(list(spans))
        return True


@pytest.fixture
def buffers():
    made: list[SpanBuffer] = []

    def make(sink, **kw) -> SpanBuffer:
        b = SpanBuffer(sink, **kw)
        made.append(b)
        return b

    yield make
    for b in made:
        b.shutdown(1.0)


def test_a_child_shares_its_parents_trace_and_a_root_gets_a_new_one(buffers):
    buffer = buffers(_Keep())
    client = SpanContext(7, 9, is_remote=True, trace_flags=TraceFlags(1))
    call = start_span(buffer, "call", client, SpanKind.SERVER)
    child = start_span(buffer, "child", call.get_span_context())
    other = start_span(buffer, "other", None)
    assert call.context.trace_id == child.context.trace_id == 7
    assert call.parent is client and child.parent is call.context
    assert other.parent is None and other.context.trace_id not in (0, 7)
    assert len({call.context.span_id, child.context.span_id, other.context.span_id}) == 3
    assert call.context.trace_flags.sampled and not call.context.is_remote
    # an API span: current through OpenTelemetry's context like any other
    with trace.use_span(call, end_on_exit=False):
        assert trace.get_current_span() is call


def test_status_ok_is_final_and_nothing_changes_after_the_end(buffers):
    keep = _Keep()
    buffer = buffers(keep)
    span = start_span(buffer, "s", None, attributes={"a": 1})
    span.set_status(StatusCode.UNSET)
    assert span.status.status_code is StatusCode.UNSET
    span.set_status(Status(StatusCode.ERROR, "boom"))
    span.set_status(StatusCode.OK)
    span.set_status(StatusCode.ERROR, "later")
    assert span.status.status_code is StatusCode.OK
    span.end(123)
    span.set_attribute("b", 2)
    span.set_attributes({"c": 3})
    span.add_event("late")
    span.end(456)  # a second end is ignored
    assert span.attributes == {"a": 1} and span.events == [] and span.end_time == 123
    assert not span.is_recording()
    assert buffer.flush(5.0)
    assert [s for b in keep.batches for s in b] == [span]


def test_batches_hold_at_most_the_batch_size_and_keep_the_order(buffers):
    keep = _Keep()
    buffer = buffers(keep, batch=4, interval_s=60.0)
    spans = [start_span(buffer, f"s{i}", None) for i in range(10)]
    for s in spans:
        s.end()
    assert buffer.flush(5.0)
    assert [len(b) for b in keep.batches][-1] <= 4 and max(len(b) for b in keep.batches) == 4
    assert [s for b in keep.batches for s in b] == spans


def test_a_full_batch_or_the_interval_starts_an_export_and_a_part_batch_waits(buffers):
    keep = _Keep()
    buffer = buffers(keep, batch=3, interval_s=60.0)
    for i in range(3):
        start_span(buffer, f"s{i}", None).end()
    _wait_for(lambda: len(keep.batches) == 1)  # a full batch woke the thread
    for i in range(2):
        start_span(buffer, f"t{i}", None).end()
    time.sleep(0.2)
    assert len(keep.batches) == 1  # a part batch waits for the interval or a flush
    assert buffer.flush(5.0) and [len(b) for b in keep.batches] == [3, 2]
    timed = _Keep()
    buffer = buffers(timed, batch=100, interval_s=0.05)
    start_span(buffer, "alone", None).end()
    _wait_for(lambda: len(timed.batches) == 1)  # the interval did


def test_a_full_buffer_drops_and_counts_and_a_stuck_sink_fails_the_flush(buffers):
    gate = threading.Event()
    keep = _Keep(gate)
    buffer = buffers(keep, max_queue=5, batch=1, interval_s=60.0)
    start_span(buffer, "first", None).end()
    _wait_for(lambda: len(buffer._spans) == 0)  # the thread holds it, stuck in the sink
    for i in range(8):
        start_span(buffer, f"s{i}", None).end()
    assert buffer.dropped == 3 and len(buffer._spans) == 5
    assert not buffer.flush(0.2)
    gate.set()
    assert buffer.flush(5.0)
    assert sum(len(b) for b in keep.batches) == 6


def test_a_failing_sink_loses_its_batch_not_the_thread(buffers):
    sink = _Keep(fail=True)
    buffer = buffers(sink, batch=2, interval_s=60.0)
    for i in range(4):
        start_span(buffer, f"s{i}", None).end()
    assert buffer.flush(5.0)
    assert buffer.failed == 4
    sink.fail = False
    start_span(buffer, "after", None).end()
    assert buffer.flush(5.0) and [s.name for s in sink.batches[0]] == ["after"]


def test_spans_ended_after_the_shutdown_are_dropped(buffers):
    keep = _Keep()
    buffer = buffers(keep)
    start_span(buffer, "kept", None).end()
    buffer.shutdown(5.0)
    start_span(buffer, "late", None).end()
    assert [s.name for b in keep.batches for s in b] == ["kept"] and buffer.dropped == 1


@pytest.mark.parametrize("kw", [{"max_queue": 0}, {"batch": 0}, {"interval_s": 0.0}])
def test_bad_buffer_settings_are_named(kw):
    with pytest.raises(ValueError, match="span buffer needs"):
        SpanBuffer(_Keep(), **kw)


def _wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
