"""What tracing (serving.tracing) costs one inference call, without a server or a model.

    .venv/bin/python -m bench.serving.tracing_cost [--calls N]

Times the tracing calls one call makes (``call_span`` with a client ``traceparent``,
``decoded``, ``capture``, ``record_batch``, ``set_status``, ``response_headers``,
``log_fields``) in four states: off (no tracer provider, the default); on with every trace
recorded, at detail ``stages`` (5 spans per call) and at detail ``call`` (one span per call);
and on with a sample rate of 0 and no client trace (nothing recorded). Recorded spans go through
the server's span buffer to a sink that encodes them as an OTLP export request
(``serving.otlp_wire.encode_request``, what the server's OTLP exporter sends) and drops the
bytes: the CPU the export costs, without the network. Prints one JSON line of CPU microseconds
per call (the best of 5 repeats), the stages / call ratio and the load average.

``sdk_<detail>_us``: the baseline, the same spans of a recorded call made through the
OpenTelemetry SDK's tracer, batch span processor and encoder (``bench.serving.sdk_tracing``), in
the same process; ``sdk_over_own_<detail>``: its ratio to ``sampled_<detail>_us``.

``encode_us_per_span``: CPU microseconds to encode one recorded ``stitchrec.call`` span (detail
``call``, fourteen attributes) as OTLP, by ``serving.otlp_wire`` (``wire``) and by the
OpenTelemetry SDK's encoder from the SDK's ``ReadableSpan`` (``sdk``), in batches of 64.
``export_us_per_span``: CPU microseconds per span to encode and send the spans over gRPC to a
receiver in another process, in requests of 64 spans and of the server's size, on the
sending and on the receiving side (``receiver_batch_N``).

``export_lock_wait_ms``: the span export runs in the processor's thread of the server's process
and holds the interpreter lock while it encodes a batch; sending it releases the lock. The
spans of ``RECORDED_CALLS`` recorded calls are encoded in batches of the SDK's default size
(512) and of the server's (``serving.tracing.EXPORT_BATCH_SPANS``) by the server's encoder,
each batch followed by a ``time.sleep(0)`` in place of the send, while ``bench.serving.lock_wait`` measures how late a
1 ms sleeper (an idle event loop) wakes: max and p99 (ms) per batch size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import timeit
from collections.abc import Sequence

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from bench.serving.lock_wait import lock_wait_ms
from bench.serving.sdk_tracing import flushed_us, sdk_call_us
from serving import tracing
from serving.calls import start_call
from serving.otlp_wire import ENCODE_CHUNK_SPANS, encode_request, encode_resource
from serving.trace_spans import RecordedSpan, readable

RECORDED_CALLS = 400  # calls per repeat when every call is recorded
CLIENT = (("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),)


SDK_EXPORT_BATCH_SPANS = 512  # BatchSpanProcessor's default max_export_batch_size


class EncodingSink:
    """Encodes each batch of spans as the server's OTLP export request and drops it (or, with
    ``keep``, keeps the spans instead)."""

    def __init__(self, keep: bool = False) -> None:
        self.keep = keep
        self.kept: list[RecordedSpan] = []
        self.spans = 0
        self.bytes = 0
        self._resource = encode_resource(tracing.resource())

    def __call__(self, spans: Sequence[RecordedSpan]) -> bool:
        self.spans += len(spans)
        if self.keep:
            self.kept.extend(spans)
        else:
            self.bytes += len(encode_request(spans, self._resource))
        return True

    def close(self) -> None:
        return None


def one_call(metadata: tuple[tuple[str, str], ...]) -> None:
    """The tracing calls of one gRPC inference call that joins a batch."""
    with tracing.call_span("Rank", tracing.grpc_carrier(metadata)):
        tracing.decoded("lin", 1, "serving_default", 3)
        context = tracing.capture()
        t = time.monotonic()
        tracing.record_batch([context], [t], [3], tracing.BatchTimes(t, t, t, t))
        tracing.set_status("OK", error=False)
        tracing.response_headers()
    tracing.log_fields()


def per_call_us(metadata: tuple[tuple[str, str], ...], calls: int) -> float:
    """CPU microseconds (of the process: the span export thread too) per ``one_call``, the
    best of 5 repeats; CPU time, so that other processes on the machine do not count."""
    runs = timeit.repeat(
        lambda: one_call(metadata), timer=time.process_time, number=calls, repeat=5
    )
    return 1e6 * min(runs) / calls


def recorded_us(metadata: tuple[tuple[str, str], ...], calls: int) -> float:
    """``per_call_us`` with the spans' export in the timed region (``flushed_us``). ``calls`` is
    at most ``RECORDED_CALLS``, so that five spans a call fit the span buffer (2,048 spans) and
    none is dropped uncounted."""
    return flushed_us(lambda: one_call(metadata), tracing.flush, calls)


def export_in_batches(spans: Sequence[RecordedSpan], batch: int, chunk: int | None) -> None:
    """Encodes ``spans`` as OTLP export requests of ``batch`` spans (``chunk`` at a time,
    None: each request in one go), releasing the interpreter lock after each request as a
    network send does."""
    resource = encode_resource(tracing.resource())
    for i in range(0, len(spans), batch):
        encode_request(spans[i : i + batch], resource, chunk)
        time.sleep(0)


def recorded_spans(calls: int, detail: str) -> list[RecordedSpan]:
    """The spans ``calls`` recorded calls make at ``detail``."""
    keeping = EncodingSink(keep=True)
    tracing.install(keeping, detail=detail)
    for _ in range(calls):
        one_call(CLIENT)
    tracing.shutdown()
    return keeping.kept


def encode_us_per_span(spans: Sequence[RecordedSpan]) -> dict[str, float]:
    """CPU microseconds per span to encode ``spans`` in batches of 64, by the server's encoder
    and by the SDK's (from ``ReadableSpan`` objects, made in the timed region)."""
    resource = tracing.resource()
    wire_resource = encode_resource(resource)
    batches = [spans[i : i + 64] for i in range(0, len(spans), 64)]

    def wire() -> None:
        for b in batches:
            encode_request(b, wire_resource)

    def sdk() -> None:
        for b in batches:
            encode_spans([readable(s, resource) for s in b]).SerializeToString()

    return {
        name: 1e6 * min(timeit.repeat(f, timer=time.process_time, number=1, repeat=5)) / len(spans)
        for name, f in (("wire", wire), ("sdk", sdk))
    }


def export_lock_wait(calls: int) -> dict[str, dict[str, float]]:
    """``lock_wait_ms`` while the spans of ``calls`` recorded calls (detail ``stages``) are
    encoded in requests of the SDK's default size and of 64 spans, each in one go, and of the
    server's size in chunks (``serving.otlp_wire.ENCODE_CHUNK_SPANS``)."""
    spans = recorded_spans(calls, "stages")
    server = f"batch_{tracing.EXPORT_BATCH_SPANS}_in_{ENCODE_CHUNK_SPANS}"
    cases = {
        f"batch_{SDK_EXPORT_BATCH_SPANS}": (SDK_EXPORT_BATCH_SPANS, None),
        "batch_64": (64, None),
        server: (tracing.EXPORT_BATCH_SPANS, ENCODE_CHUNK_SPANS),
    }
    return {
        name: lock_wait_ms(lambda b=b, c=c: export_in_batches(spans, b, c))
        for name, (b, c) in cases.items()
    }


RECEIVER = (  # prints its endpoint, then its CPU seconds for every line read
    "import sys, time; from bench.serving.otlp_sink import OtlpSink; s = OtlpSink(); "
    "print(s.endpoint, flush=True)\n"
    "for _ in sys.stdin: print(time.process_time(), flush=True)\n"
    "s.stop()"
)


def export_us_per_span(calls: int) -> dict[str, float]:
    """CPU microseconds per span (``stages`` detail) that the server's exporter spends to encode
    and send its spans to an OTLP/gRPC receiver in another process, in requests of 64 spans and
    of the server's size (``batch_N``), and that the receiver (``bench.serving.otlp_sink``, a
    Python gRPC server) spends to take them (``receiver_batch_N``): each request is a gRPC
    call, whose cost the larger batch shares out. The best of 3 repeats."""
    spans = recorded_spans(calls, "stages")
    receiver = subprocess.Popen(
        [sys.executable, "-c", RECEIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        sender = tracing.otlp_exporter(receiver.stdout.readline().strip())
        sender(spans[:64])  # connects
        out = {}

        def receiver_cpu() -> float:
            receiver.stdin.write("\n")
            receiver.stdin.flush()
            return float(receiver.stdout.readline())

        for batch in (64, tracing.EXPORT_BATCH_SPANS):
            mine, theirs = [], []
            for _ in range(3):
                r0, t0 = receiver_cpu(), time.process_time()
                for i in range(0, len(spans), batch):
                    if not sender(spans[i : i + batch]):
                        raise RuntimeError("the receiver did not take an export")
                mine.append(time.process_time() - t0)
                theirs.append(receiver_cpu() - r0)
            out[f"batch_{batch}"] = round(1e6 * min(mine) / len(spans), 2)
            out[f"receiver_batch_{batch}"] = round(1e6 * min(theirs) / len(spans), 2)
        sender.close()
        return out
    finally:
        receiver.communicate("", timeout=10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20_000, help="calls per repeat when off")
    args = p.parse_args(argv)
    start_call("grpc", "bench")  # the call's request id, made before tracing starts
    tracing.shutdown()
    out = {"off_us": per_call_us(CLIENT, args.calls)}
    recorded = min(RECORDED_CALLS, max(1, args.calls // 20))
    for detail in tracing.DETAILS:
        exporter = EncodingSink()
        tracing.install(exporter, detail=detail)
        out[f"sampled_{detail}_us"] = recorded_us(CLIENT, recorded)
        tracing.shutdown()
        out[f"spans_per_call_{detail}"] = exporter.spans / (5 * recorded)
        out[f"sdk_{detail}_us"] = sdk_call_us(detail, recorded)
        out[f"sdk_over_own_{detail}"] = out[f"sdk_{detail}_us"] / out[f"sampled_{detail}_us"]
    tracing.install(EncodingSink(), sample_rate=0.0)
    out["not_sampled_us"] = per_call_us((), max(1, args.calls // 20))
    tracing.shutdown()
    out["stages_over_call"] = out["sampled_stages_us"] / out["sampled_call_us"]
    waits = export_lock_wait(recorded)
    export = export_us_per_span(recorded)
    encode = encode_us_per_span(recorded_spans(recorded, "call"))
    out = {k: round(v, 2) for k, v in out.items()}
    out["encode_us_per_span"] = {k: round(v, 2) for k, v in encode.items()}
    out["export_us_per_span"] = export
    print(json.dumps(out | {"export_lock_wait_ms": waits, "load": os.getloadavg()[0]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
