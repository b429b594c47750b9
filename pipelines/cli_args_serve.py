"""The flags of ``stitchrec serve`` (``pipelines.cli_args`` describes how a command's flags and
handler are declared)."""

from __future__ import annotations

import argparse

from pipelines.cli_args import Subparsers
from pipelines.cli_types import (
    int_list,
    message_mb,
    non_negative,
    non_negative_int,
    port,
)

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def serve(sub: Subparsers) -> None:
    p = sub.add_parser("serve", help="serve a model repository over gRPC (and HTTP)")
    p.add_argument("--repo", required=True, help="model repository: <repo>/<name>/<version>/")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")
    p.add_argument("--port", type=port, default=8500, help="gRPC port")
    p.add_argument("--metrics-port", type=port, default=None, help="Prometheus /metrics port")
    p.add_argument("--metrics-host", default=None, help="default: --host")
    p.add_argument("--workers", type=int, default=1, help="server processes on one port")
    p.add_argument(
        "--http-port",
        type=port,
        default=None,
        help="HTTP port (TF Serving REST, KServe v2 REST, /v1/rank); default: no HTTP",
    )
    p.add_argument("--http-host", default=None, help="HTTP address; default: --host")
    p.add_argument(
        "--probe-port",
        type=port,
        default=None,
        help="health probes (GET /v2/health/live and /ready) answered by a process of their own "
        "from the server's heartbeat, never held up by a busy server; default: none",
    )
    p.add_argument("--probe-host", default=None, help="probe address; default: --host")
    p.add_argument("--heartbeat-file", default=None, help=argparse.SUPPRESS)  # a worker's
    p.add_argument(
        "--version-policy",
        action="append",
        default=[],
        metavar="[NAME=]POLICY",
        help="latest (default), latest:N, all or specific:V1,V2; NAME= for one model",
    )
    p.add_argument(
        "--poll-seconds", type=non_negative, default=5.0, help="0: load once, no polling"
    )
    _batching_flags(p)
    p.add_argument(
        "--max-request-rows", type=int, default=100_000, help="examples one request may hold"
    )
    p.add_argument(
        "--max-tensor-elements",
        type=int,
        default=1_000_000,
        help="elements one input tensor may declare (TF Serving and KServe shapes)",
    )
    p.add_argument("--max-string-kb", type=int, default=1024, help="largest string value, in KiB")
    p.add_argument(
        "--max-broadcast-mb",
        type=int,
        default=32,
        help="MiB a rank request's user features may take once repeated over its candidates",
    )
    p.add_argument(
        "--max-message-mb",
        type=message_mb,
        default=64.0,
        help="largest gRPC message, in MiB (at most 2047: gRPC's limit)",
    )
    p.add_argument("--token", action="append", default=[], help="accepted bearer token")
    p.add_argument("--tls-cert", help="PEM certificate chain: serve TLS (with --tls-key)")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    p.add_argument("--tls-client-ca", help="PEM CA bundle: require client certificates it signed")
    p.add_argument(
        "--grace-seconds",
        type=non_negative,
        default=10.0,
        help="on SIGTERM, seconds in-flight calls get to finish",
    )
    _admission_flags(p)
    _prediction_log_flags(p)
    p.add_argument("--access-log", action="store_true", help="one JSON log line per call")
    _tracing_flags(p)
    p.add_argument(
        "--no-heap-freeze",
        action="store_true",
        help="do not freeze the heap after model-version changes (docs/serving.md)",
    )
    p.add_argument(
        "--no-fusion",
        action="store_true",
        help="serve exports made with `stitchrec export --fuse` unfused",
    )
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default="INFO", help="logs")
    p.add_argument(
        "--intra-op-threads", type=non_negative_int, default=0, help="TensorFlow; 0: default"
    )
    p.add_argument(
        "--inter-op-threads", type=non_negative_int, default=0, help="TensorFlow; 0: default"
    )
    p.set_defaults(handler="pipelines.serve:cmd_serve")


def _admission_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-inflight",
        type=int,
        default=256,
        help="inference calls handled at once; more: RESOURCE_EXHAUSTED at once",
    )
    p.add_argument(
        "--max-queued-rows",
        type=int,
        default=65536,
        help="examples waiting in one model version's batch queue; more: RESOURCE_EXHAUSTED",
    )
    p.add_argument(
        "--retry-after-ms",
        type=int,
        default=100,
        help="retry hint sent with RESOURCE_EXHAUSTED (retry-after-ms, grpc-retry-pushback-ms)",
    )
    p.add_argument(
        "--drain-seconds",
        type=non_negative,
        default=5.0,
        help="on SIGTERM, seconds health reports NOT_SERVING while calls are still served",
    )


def _tracing_flags(p: argparse.ArgumentParser) -> None:
    """``serve``'s OpenTelemetry tracing flags."""
    p.add_argument(
        "--otlp-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="export OpenTelemetry spans of every inference call to this OTLP/gRPC collector "
        "(default: tracing off); headers, gzip, TLS roots and the export timeout (ms) from "
        "OTEL_EXPORTER_OTLP_[TRACES_]HEADERS, _COMPRESSION, _CERTIFICATE and _TIMEOUT",
    )
    p.add_argument(
        "--trace-sample-rate",
        type=float,
        default=1.0,
        metavar="R",
        help="share of traces recorded (0 to 1) for calls that do not continue a client's trace",
    )
    p.add_argument(
        "--trace-detail",
        choices=("stages", "call"),
        default="stages",
        help="stages: a span per stage of a call (decode, queue_wait, batch, inference); call: "
        "one span per call with the stages' milliseconds as attributes (cheaper)",
    )


def _prediction_log_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-dir",
        default=None,
        metavar="DIR",
        help="write a prediction log (Parquet, DIR/<model>/part-*.parquet) of the scored calls",
    )
    p.add_argument(
        "--log-rate",
        action="append",
        default=[],
        metavar="[MODEL=]R",
        help="share of calls logged, in [0, 1] (default 1); MODEL= for one model (repeatable)",
    )
    p.add_argument(
        "--log-flush-seconds",
        type=float,
        default=5.0,
        help="seconds between prediction log files (a SIGKILL loses at most these)",
    )
    p.add_argument(
        "--log-compression",
        choices=("snappy", "zstd", "none"),
        default="snappy",
        help="the prediction log files' Parquet compression: snappy (default), zstd (smaller "
        "files, more CPU) or none (the least CPU, larger files)",
    )


def _batching_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-batch-size", type=int, default=4096, help="examples per batch")
    p.add_argument(
        "--max-queue-delay-us",
        type=int,
        default=500,
        help="microseconds the oldest queued request waits for others to join it",
    )
    p.add_argument(
        "--preferred-batch-sizes",
        type=int_list,
        default=(),
        metavar="N,N,...",
        help="batch sizes (examples) dispatched at once when the queue reaches them",
    )
    p.add_argument("--max-queue-size", type=int, default=2048, help="requests waiting")
    p.add_argument("--batch-concurrency", type=int, default=1, help="batches at once per device")
    p.add_argument("--no-batching", action="store_true", help="run each request alone")
