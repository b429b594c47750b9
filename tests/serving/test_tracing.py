"""Tracing (serving.tracing) on a real server: a client's traceparent continues into the server's
spans (stitchrec.call with decode, queue_wait, batch, inference), two calls sharing one batch
each get their own batch spans, spans reach a real OTLP/gRPC receiver, tracing off costs little
and the access log carries the request and trace ids."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pipelines import serve
from pipelines.cli import build_parser
from pipelines.errors import UsageError
from protos import ranking_service_pb2_grpc as rank_grpc
from serving import tracing
from serving.calls import start_call
from serving.client import make_request
from serving.config import BatchingConfig, OtlpSettings, ServerOptions, check_otlp_endpoint
from serving.testing import ServerThread, write_linear_model

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
REQUEST = make_request("lin", {"user": "u1"}, {"item": [3, 4, 5], "price": [1.0, 2.0, 0.5]})


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_linear_model(root / "lin" / "1", bias=0.0)
    write_linear_model(root / "cascade" / "1", bias=0.0, rank_signature=True)
    return root


@pytest.fixture(scope="module")
def server(repo):
    # a 50 ms batching window: two calls sent together share one batch
    opts = ServerOptions(access_log=True, batching=BatchingConfig(max_queue_delay_us=50_000))
    with ServerThread(repo, opts) as s:
        yield s


@pytest.fixture
def exporter():
    spans = InMemorySpanExporter()
    tracing.install(spans)
    yield spans
    tracing.shutdown()


def _rank(server, metadata=()):
    stub = rank_grpc.RankingServiceStub(grpc.insecure_channel(server.target))
    return stub.Rank.with_call(REQUEST, timeout=10, metadata=metadata)


def _rank_together(server, traces: list[str]) -> None:
    """One Rank call per client trace id, sent at once (they share a batch)."""
    with concurrent.futures.ThreadPoolExecutor(len(traces)) as pool:
        calls = [
            pool.submit(_rank, server, [("traceparent", f"00-{t}-{CLIENT_SPAN}-01")])
            for t in traces
        ]
        for c in calls:
            assert len(c.result()[0].scores) == 3


def _access_lines(caplog, request_id: str) -> list[dict]:
    """The access-log lines of the calls with ``request_id``. The server writes the line of a
    call that ends in an error after the status has left (``context.abort`` sends it), so the
    line of another test's failed call to the module's server may arrive during this test:
    lines are matched by request id, not counted."""
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name.endswith(".access")]
    return [x for x in lines if x["request_id"] == request_id]


def _by_name(spans, trace_id: int) -> dict[str, list]:
    out: dict[str, list] = {}
    for s in spans:
        if s.context.trace_id == trace_id:
            out.setdefault(s.name, []).append(s)
    return out


def test_client_trace_continues_into_call_span_and_children(server, exporter, caplog):
    caplog.set_level(logging.INFO, logger="stitchrec.serving.access")
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    resp, call = _rank(server, [("traceparent", traceparent), ("x-request-id", "req-7")])
    assert len(resp.scores) == 3
    sent = dict(call.initial_metadata())["traceparent"]
    assert sent.startswith(f"00-{CLIENT_TRACE}-") and sent.endswith("-01")
    assert tracing.flush()
    spans = _by_name(exporter.get_finished_spans(), int(CLIENT_TRACE, 16))
    assert sorted(spans) == ["batch", "decode", "inference", "queue_wait", "stitchrec.call"]
    root = spans["stitchrec.call"][0]
    assert root.parent.span_id == int(CLIENT_SPAN, 16) and root.parent.is_remote
    assert sent.split("-")[2] == f"{root.context.span_id:016x}"  # the answer names this span
    assert dict(root.attributes) == {
        "rpc.system": "grpc",
        "rpc.method": "Rank",
        "stitchrec.request_id": "req-7",
        "stitchrec.model": "lin",
        "stitchrec.version": 1,
        "stitchrec.signature": "serving_default",
        "stitchrec.rows": 3,
        "stitchrec.status_code": "OK",
    }
    assert root.resource.attributes["service.name"] == "stitchrec"
    decode, wait, batch, model = (
        spans[n][0] for n in ("decode", "queue_wait", "batch", "inference")
    )
    for child in (decode, wait, batch):
        assert child.parent.span_id == root.context.span_id
    assert model.parent.span_id == batch.context.span_id
    # in order inside the call: decoded, queued (the batching window), batched, answered
    assert root.start_time <= decode.start_time <= decode.end_time <= wait.start_time + 1000
    assert wait.end_time <= batch.start_time + 1000 and batch.end_time <= root.end_time
    assert batch.start_time <= model.start_time <= model.end_time <= batch.end_time
    assert 40e6 <= wait.end_time - wait.start_time < 5e9  # waited out the 50 ms window
    assert dict(batch.attributes) == {
        "stitchrec.batch.rows": 3,
        "stitchrec.batch.requests": 1,
        "rows": 3,
    }
    lines = _access_lines(caplog, "req-7")
    assert [(x["trace_id"], x["code"]) for x in lines] == [(CLIENT_TRACE, "OK")]


def test_two_calls_in_one_batch_get_batch_spans_under_their_own_call(server, exporter):
    traces = ["1" * 32, "2" * 32]
    _rank_together(server, traces)
    assert tracing.flush()
    finished = exporter.get_finished_spans()
    for t in traces:
        spans = _by_name(finished, int(t, 16))
        root, batch = spans["stitchrec.call"][0], spans["batch"][0]
        assert batch.parent.span_id == root.context.span_id
        assert spans["queue_wait"][0].parent.span_id == root.context.span_id
        assert batch.attributes["stitchrec.batch.requests"] == 2
        assert batch.attributes["stitchrec.batch.rows"] == 6
        assert batch.attributes["rows"] == 3


def test_a_signature_outside_the_batcher_has_decode_and_inference(server, exporter):
    stub = rank_grpc.RankingServiceStub(grpc.insecure_channel(server.target))
    req = make_request("cascade", {"user": "u1"}, {"item": [1, 3], "price": [0.0, 1.0]})
    stub.Rank(req, timeout=10, metadata=[("traceparent", f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")])
    assert tracing.flush()
    spans = _by_name(exporter.get_finished_spans(), int(CLIENT_TRACE, 16))
    assert sorted(spans) == ["decode", "inference", "stitchrec.call"]
    root = spans["stitchrec.call"][0]
    assert root.attributes["stitchrec.signature"] == "rank_request"
    assert spans["inference"][0].parent.span_id == root.context.span_id


@pytest.fixture
def call_exporter():
    spans = InMemorySpanExporter()
    tracing.install(spans, detail="call")
    yield spans
    tracing.shutdown()


def test_call_detail_is_one_span_per_call_with_the_stages_as_attributes(server, call_exporter):
    traces = ["3" * 32, "4" * 32]
    _rank_together(server, traces)
    assert tracing.flush()
    finished = call_exporter.get_finished_spans()
    assert len(finished) == 2 and {s.name for s in finished} == {"stitchrec.call"}
    for t in traces:
        (root,) = _by_name(finished, int(t, 16))["stitchrec.call"]
        a = dict(root.attributes)
        assert a["stitchrec.model"] == "lin" and a["stitchrec.status_code"] == "OK"
        assert a["stitchrec.batch.requests"] == 2 and a["stitchrec.batch.rows"] == 6
        call_ms = (root.end_time - root.start_time) / 1e6
        assert 0 <= a["stitchrec.decode_ms"] < call_ms
        assert a["stitchrec.queue_wait_ms"] >= 40  # waited out the 50 ms window
        assert 0 < a["stitchrec.inference_ms"] <= a["stitchrec.batch_ms"]
        stages = a["stitchrec.queue_wait_ms"] + a["stitchrec.batch_ms"]
        assert stages <= call_ms


def test_call_detail_times_a_signature_outside_the_batcher(server, call_exporter):
    stub = rank_grpc.RankingServiceStub(grpc.insecure_channel(server.target))
    req = make_request("cascade", {"user": "u1"}, {"item": [1, 3], "price": [0.0, 1.0]})
    stub.Rank(req, timeout=10, metadata=[("traceparent", f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")])
    assert tracing.flush()
    (root,) = call_exporter.get_finished_spans()
    assert root.attributes["stitchrec.signature"] == "rank_request"
    assert root.attributes["stitchrec.inference_ms"] > 0
    assert "stitchrec.queue_wait_ms" not in root.attributes


def test_an_unknown_trace_detail_is_refused():
    with pytest.raises(ValueError, match=r"trace detail must be one of \('stages', 'call'\)"):
        tracing.install(InMemorySpanExporter(), detail="spans")
    assert not tracing.enabled()
    with pytest.raises(ValueError, match="trace_detail must be one of"):
        ServerOptions(trace_detail="all")


def test_an_error_call_span_is_marked_error(server, exporter):
    stub = rank_grpc.RankingServiceStub(grpc.insecure_channel(server.target))
    with pytest.raises(grpc.RpcError) as e:
        stub.Rank(make_request("nope", {"user": "u1"}, {"item": [1], "price": [0.0]}), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    trailers = dict(e.value.trailing_metadata())
    assert trailers["traceparent"].startswith("00-")
    assert tracing.flush()
    (root,) = [s for s in exporter.get_finished_spans() if s.name == "stitchrec.call"]
    assert root.attributes["stitchrec.status_code"] == "NOT_FOUND"
    assert root.status.status_code.name == "ERROR"
    assert f"{root.context.trace_id:032x}" == trailers["traceparent"].split("-")[1]


def test_tracing_off_no_spans_no_header_and_access_log_has_request_id(server, caplog):
    spans = InMemorySpanExporter()
    tracing.install(spans)
    tracing.shutdown()  # installed, then off: nothing may reach the exporter
    assert not tracing.enabled()
    caplog.set_level(logging.INFO, logger="stitchrec.serving.access")
    resp, call = _rank(server, [("x-request-id", "off-1")])
    assert len(resp.scores) == 3
    assert "traceparent" not in dict(call.initial_metadata())
    assert spans.get_finished_spans() == ()
    (line,) = _access_lines(caplog, "off-1")
    assert "trace_id" not in line


def test_sample_rate_zero_records_nothing_without_a_client_trace(server, caplog):
    spans = InMemorySpanExporter()
    tracing.install(spans, sample_rate=0.0)
    caplog.set_level(logging.INFO, logger="stitchrec.serving.access")
    try:
        resp, call = _rank(server, [("x-request-id", "unsampled")])
        assert len(resp.scores) == 3 and "traceparent" not in dict(call.initial_metadata())
        assert tracing.flush() and spans.get_finished_spans() == ()
    finally:
        tracing.shutdown()
    (line,) = _access_lines(caplog, "unsampled")
    assert "trace_id" not in line


def test_disabled_path_costs_a_few_microseconds():
    """The tracing calls one inference call makes, with tracing off."""
    assert not tracing.enabled()
    metadata = (("traceparent", f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"), ("x-request-id", "r"))
    start_call("grpc", "r")
    n = 20_000
    t0 = time.process_time()  # CPU time: other processes on the machine do not count
    for _ in range(n):
        with tracing.call_span("Rank", tracing.grpc_carrier(metadata)):
            tracing.decoded("lin", 1, "serving_default", 3)
            tracing.capture()
            tracing.set_status("OK", error=False)
            tracing.response_headers()
        tracing.log_fields()
    per_call_us = 1e6 * (time.process_time() - t0) / n
    assert per_call_us < 20, per_call_us  # 2 to 3 us on a loaded 2-core machine


class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self):
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []

    def Export(self, request, context):
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@contextlib.contextmanager
def _collector(receiver, options=()) -> Iterator[str]:
    """A real OTLP/gRPC collector on 127.0.0.1 serving ``receiver``; yields its endpoint."""
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2), options=list(options))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def test_spans_reach_an_otlp_grpc_receiver_by_the_server_stop(repo):
    receiver = _Receiver()
    with _collector(receiver) as endpoint:
        with ServerThread(repo, ServerOptions(otlp_endpoint=endpoint)) as s:
            assert tracing.enabled()
            _rank(s, [("x-request-id", "otlp-1")])
        assert not tracing.enabled()  # the stop flushed and removed it
    names, services = set(), set()
    for req in receiver.requests:
        for rs in req.resource_spans:
            services |= {
                a.value.string_value for a in rs.resource.attributes if a.key == "service.name"
            }
            for ss in rs.scope_spans:
                names |= {sp.name for sp in ss.spans}
    assert names == {"stitchrec.call", "decode", "queue_wait", "batch", "inference"}
    assert services == {"stitchrec"}


def _lost(server: ServerThread) -> float | None:
    """The server's count of spans its exports failed to deliver."""
    registry = server.server.metrics.registry
    return registry.get_sample_value("stitchrec_trace_spans_lost_total", {"reason": "failed"})


class _Refusing(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self):
        self.calls = 0

    def Export(self, request, context):
        self.calls += 1
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused")


def test_spans_a_collector_refuses_are_counted_and_the_calls_still_answer(repo):
    receiver = _Refusing()
    with (
        _collector(receiver) as endpoint,
        ServerThread(repo, ServerOptions(otlp_endpoint=endpoint)) as s,
    ):
        for _ in range(3):
            assert len(_rank(s)[0].scores) == 3
        assert tracing.flush()
        lost = _lost(s)
    assert receiver.calls >= 1
    assert lost == 15  # five spans a call, none exported


@pytest.mark.parametrize("endpoint", ["localhost", "127.0.0.1:0", "host:99999", "ftp://h:1", ""])
def test_bad_otlp_endpoint_is_refused_naming_it(endpoint):
    with pytest.raises(ValueError, match=r"otlp endpoint .*expected HOST:PORT"):
        check_otlp_endpoint(endpoint)
    check_otlp_endpoint("collector.local:4317")
    check_otlp_endpoint("https://[::1]:4317")
    with pytest.raises(ValueError, match=r"trace_sample_rate must be a number in \[0, 1\]"):
        ServerOptions(trace_sample_rate=1.5)


def test_trace_flags_reach_the_options_and_the_workers():
    argv = ["serve", "--repo", "models", "--otlp-endpoint", "127.0.0.1:4317", "--workers", "2"]
    args = build_parser().parse_args(
        [*argv, "--trace-sample-rate", "0.5", "--trace-detail", "call"]
    )
    opts = serve._options(args)
    assert (opts.otlp_endpoint, opts.trace_sample_rate, opts.trace_detail) == (
        "127.0.0.1:4317",
        0.5,
        "call",
    )
    worker = serve._worker_argv(args, 8500)
    assert worker[worker.index("--trace-detail") + 1] == "call"
    assert serve._options(build_parser().parse_args(argv)).trace_detail == "stages"


def test_otlp_variables_reach_the_options(monkeypatch, tmp_path):
    pem = tmp_path / "roots.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-ignored=1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "X-Api-Key=a%2Cb%3D, team = rec ")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "GZIP")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", str(pem))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")
    argv = ["serve", "--repo", "models", "--otlp-endpoint", "https://127.0.0.1:4317"]
    opts = serve._options(build_parser().parse_args(argv))
    assert opts.otlp.headers == (("x-api-key", "a,b="), ("team", "rec"))
    assert opts.otlp.gzip and opts.otlp.certificate == str(pem)
    assert opts.otlp.timeout_s == 2.5  # milliseconds, as the OTLP exporter specification says
    # without an endpoint the variables are not read
    plain = serve._options(build_parser().parse_args(["serve", "--repo", "models"]))
    assert plain.otlp == OtlpSettings()


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "br", "OTEL_EXPORTER_OTLP_COMPRESSION='br': expected"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "key", "OTEL_EXPORTER_OTLP_HEADERS: entry 1 is not"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "a=1,Bad Name=2", "otlp header 'bad name'"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/no/such.pem", "otlp certificate '/no/such.pem'"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "10s",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT='10s': exp",
        ),
        (
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            "0",
            "OTEL_EXPORTER_OTLP_TIMEOUT='0': expected milliseconds",
        ),
    ],
)
def test_a_bad_otlp_variable_is_one_error_line(monkeypatch, variable, value, message):
    monkeypatch.setenv(variable, value)
    argv = ["serve", "--repo", "models", "--otlp-endpoint", "127.0.0.1:4317"]
    with pytest.raises(UsageError, match=re.escape(message)):
        serve._options(build_parser().parse_args(argv))


class _Headers(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self):
        self.metadata: list[dict[str, str]] = []
        self.spans = 0

    def Export(self, request, context):
        self.metadata.append(dict(context.invocation_metadata()))
        self.spans += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.mark.parametrize("gzip", [False, True])
def test_the_exporter_sends_the_headers_and_compresses_when_asked(repo, gzip):
    # a collector that accepts uncompressed messages only: gzip-compressed exports are refused
    receiver = _Headers()
    identity_only = [("grpc.compression_enabled_algorithms_bitset", 1)]
    settings = OtlpSettings(headers=(("x-api-key", "secret"),), gzip=gzip)
    with (
        _collector(receiver, identity_only) as endpoint,
        ServerThread(repo, ServerOptions(otlp_endpoint=endpoint, otlp=settings)) as s,
    ):
        _rank(s)
        assert tracing.flush()
        lost = _lost(s)
    if gzip:
        assert receiver.spans == 0 and lost == 5
    else:
        assert receiver.spans == 5 and not lost
        assert [m.get("x-api-key") for m in receiver.metadata] == ["secret"]
