"""What tracing (serving.tracing) costs one inference call, without a server or a model.

    .venv/bin/python -m bench.serving.tracing_cost [--calls N]

Times the tracing calls one call makes (``call_span`` with a client ``traceparent``,
``decoded``, ``capture``, ``record_batch``, ``set_status``, ``response_headers``,
``log_fields``) in three states: off (no tracer provider, the default), on with every trace
recorded (5 spans per call, exported to OpenTelemetry's in-memory exporter), and on with a sample
rate of 0 and no client trace (nothing recorded). Prints one JSON line of CPU microseconds per
call (the best of 5 repeats) and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import timeit

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from serving import tracing
from serving.calls import start_call

CLIENT = (("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),)


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20_000, help="calls per repeat when off")
    args = p.parse_args(argv)
    start_call("grpc", "bench")  # the call's request id, made before tracing starts
    tracing.shutdown()
    out = {"off_us": per_call_us(CLIENT, args.calls)}
    spans = InMemorySpanExporter()
    tracing.install(spans)
    out["sampled_us"] = per_call_us(CLIENT, max(1, args.calls // 20))
    tracing.install(spans, sample_rate=0.0)
    out["not_sampled_us"] = per_call_us((), max(1, args.calls // 20))
    tracing.shutdown()
    print(json.dumps({k: round(v, 2) for k, v in out.items()} | {"load": os.getloadavg()[0]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
