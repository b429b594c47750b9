"""serving.otlp_wire: its bytes parse as OTLP and equal the OpenTelemetry SDK's encoding of the
same spans; OtlpSender posts them to a real OTLP/gRPC receiver, retries a transient refusal and
gives up on a permanent one."""

from __future__ import annotations

import concurrent.futures
import logging

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from serving import tracing
from serving.config import OtlpSettings
from serving.otlp_wire import OtlpSender, encode_request, encode_resource
from serving.trace_spans import RecordedSpan, SpanBuffer, readable, start_span

Request = trace_service_pb2.ExportTraceServiceRequest


class _Keep:
    def __init__(self):
        self.spans: list[RecordedSpan] = []

    def __call__(self, spans):
        self.spans.extend(spans)
        return True


def _spans() -> list[RecordedSpan]:
    """Spans of every shape the server makes, and attribute values of every type."""
    keep = _Keep()
    buffer = SpanBuffer(keep, interval_s=60.0)
    client = SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "x1"), ("other", "y")]),
    )
    attrs = {
        "rpc.system": "grpc",
        "text": "é" * 100,  # two bytes a character: a length over 127
        "empty": "",
        "small": 3,
        "zero": 0,
        "big": 2**62 + 5,
        "negative": -7,
        "ratio": 0.125,
        "flag": True,
        "off": False,
        "blob": b"\x00\xff",
        "list": [1, 2, 3],
        "words": ["a", "b"],
    }
    call = start_span(buffer, "stitchrec.call", client, SpanKind.SERVER, dict(attrs))
    child = start_span(buffer, "inference", call.context, attributes={"rows": 3})
    try:
        raise ValueError("bad batch")
    except ValueError as e:
        child.record_exception(e)
        child.set_status(Status(StatusCode.ERROR, "ValueError"))
    child.end(child.start_time + 1000)
    call.set_status(StatusCode.OK)
    call.end()
    root = start_span(buffer, "root", None, start_time=1)  # a new trace, no parent
    root.end(2)
    buffer.shutdown(5.0)
    return keep.spans


def test_the_request_equals_the_sdk_encoding_of_the_same_spans():
    spans = _spans()
    assert [s.name for s in spans] == ["inference", "stitchrec.call", "root"]
    resource = tracing.resource()
    ours = Request.FromString(encode_request(spans, encode_resource(resource)))
    sdk = encode_spans([readable(s, resource) for s in spans])
    assert ours == sdk
    # the fields that matter, read back: ids, parent, remote flag, trace state, status, event
    inference, call, root = ours.resource_spans[0].scope_spans[0].spans
    assert call.trace_id.hex() == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert call.parent_span_id.hex() == "00f067aa0ba902b7" and call.flags == 0x300
    assert call.trace_state == "vendor=x1,other=y" and call.kind == 2  # SPAN_KIND_SERVER
    assert inference.parent_span_id == call.span_id and inference.flags == 0x100
    assert inference.status.code == 2 and inference.status.message == "ValueError"
    assert inference.events[0].name == "exception"
    assert inference.end_time_unix_nano - inference.start_time_unix_nano == 1000
    assert call.status.code == 1 and root.parent_span_id == b""
    values = {a.key: a.value for a in call.attributes}
    assert values["text"].string_value == "é" * 100 and values["negative"].int_value == -7
    assert values["big"].int_value == 2**62 + 5 and values["flag"].bool_value
    assert [v.int_value for v in values["list"].array_value.values] == [1, 2, 3]


def test_an_attribute_of_another_type_is_named():
    keep = _Keep()
    buffer = SpanBuffer(keep)
    span = start_span(buffer, "s", None, attributes={"odd": object()})
    with pytest.raises(TypeError, match="span attribute values are"):
        encode_request([span], b"")
    buffer.shutdown(1.0)


class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Answers the first ``refuse`` calls with ``code``, then takes the requests."""

    def __init__(self, refuse: int = 0, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE):
        self.refuse, self.code = refuse, code
        self.calls = 0
        self.requests: list[Request] = []

    def Export(self, request, context):
        self.calls += 1
        if self.calls <= self.refuse:
            context.abort(self.code, "not now")
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def collector():
    servers = []

    def start(receiver: _Receiver) -> str:
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for s in servers:
        s.stop(None)


def test_the_sender_posts_the_spans_and_retries_a_transient_refusal(collector):
    spans = _spans()
    receiver = _Receiver(refuse=2)
    sender = OtlpSender("http://" + collector(receiver), tracing.resource())
    try:
        assert sender(spans)
    finally:
        sender.close()
    assert receiver.calls == 3 and len(receiver.requests) == 1
    got = receiver.requests[0].resource_spans[0]
    assert [s.name for s in got.scope_spans[0].spans] == [s.name for s in spans]
    assert {a.key for a in got.resource.attributes} >= {"service.name", "telemetry.sdk.name"}


def test_the_sender_gives_up_on_a_permanent_refusal_with_one_warning(collector, caplog):
    receiver = _Receiver(refuse=10, code=grpc.StatusCode.INVALID_ARGUMENT)
    sender = OtlpSender(collector(receiver), tracing.resource())
    try:
        with caplog.at_level(logging.WARNING, logger="serving.otlp_wire"):
            assert not sender(_spans())
            assert not sender(_spans())
    finally:
        sender.close()
    assert receiver.calls == 2  # no retries
    warnings = [r.getMessage() for r in caplog.records if r.name == "serving.otlp_wire"]
    assert len(warnings) == 1 and "INVALID_ARGUMENT" in warnings[0]


def test_the_exporter_stops_retrying_at_the_settings_timeout(collector):
    receiver = _Receiver(refuse=1000)
    sender = tracing.otlp_exporter(collector(receiver), OtlpSettings(timeout_s=0.5))
    try:
        assert not sender(_spans())
    finally:
        sender.close()
    # 0.1 s, 0.2 s of backoff fit in 0.5 s, 0.4 s more does not (the default 5 s: about 6 calls)
    assert 2 <= receiver.calls <= 4
    with pytest.raises(ValueError, match=r"otlp timeout 0 s: expected \(0, 3600\] seconds"):
        OtlpSettings(timeout_s=0)


def test_encoding_in_chunks_gives_the_same_bytes():
    spans = _spans()
    resource = encode_resource(tracing.resource())
    whole = encode_request(spans, resource, chunk=None)
    assert encode_request(spans, resource, chunk=2) == whole
    assert encode_request(spans, resource, chunk=1) == whole
    assert encode_request([], resource) == encode_request([], resource, chunk=None)
