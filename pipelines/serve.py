"""``stitchrec serve --repo DIR``: the gRPC (and HTTP) inference server (see ``serving/``).

    stitchrec serve --repo models/ [--host H] [--port P] [--metrics-port M] [--workers N]
                    [--http-port P [--http-host H]]
                    [--version-policy [NAME=]latest|latest:N|all|specific:V,..]...
                    [--poll-seconds S] [--max-batch-size B] [--max-queue-delay-us U]
                    [--preferred-batch-sizes 256,1024] [--max-queue-size Q] [--no-batching]
                    [--token T]... [--tls-cert F --tls-key F [--tls-client-ca F]]
                    [--max-message-mb M] [--grace-seconds G] [--access-log] [--log-level L]
                    [--no-fusion] [--max-inflight N] [--max-queued-rows R]
                    [--retry-after-ms MS] [--drain-seconds D]

With ``--workers N > 1`` the command reserves the port (and the HTTP port), starts N server
processes that bind them with SO_REUSEPORT (worker i serves metrics on ``--metrics-port + i``),
forwards SIGTERM/SIGINT to them and waits. The flags are defined in ``pipelines.cli_args``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys

from pipelines.errors import UsageError
from serving.config import BatchingConfig, Limits, ServerOptions, VersionPolicy


def _options(args: argparse.Namespace) -> ServerOptions:
    """The server's options from the flags; a flag value they reject is a ``UsageError``."""
    try:
        return _checked_options(args)
    except ValueError as e:  # the option classes check each value and name it
        raise UsageError(str(e)) from None


def _checked_options(args: argparse.Namespace) -> ServerOptions:
    policy = "latest"
    per_model: list[tuple[str, str]] = []
    for text in args.version_policy:
        name, eq, pol = text.rpartition("=")
        VersionPolicy.parse(pol)  # raises ValueError with the expected forms
        if eq:
            per_model.append((name, pol))
        else:
            policy = pol
    tokens = list(args.token)
    env_token = os.environ.get("STITCHREC_SERVE_TOKEN")
    if env_token:
        tokens.append(env_token)
    return ServerOptions(
        batching=BatchingConfig(
            enabled=not args.no_batching,
            max_batch_size=args.max_batch_size,
            max_queue_delay_us=args.max_queue_delay_us,
            preferred_batch_sizes=args.preferred_batch_sizes,
            max_queue_size=args.max_queue_size,
            concurrency=args.batch_concurrency,
            max_queued_rows=args.max_queued_rows,
        ),
        limits=Limits(
            max_request_rows=args.max_request_rows,
            max_tensor_elements=args.max_tensor_elements,
            max_string_bytes=args.max_string_kb * 1024,
            max_broadcast_bytes=args.max_broadcast_mb * 1024 * 1024,
        ),
        policy=policy,
        policies=tuple(per_model),
        poll_interval_s=args.poll_seconds,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host or args.host,
        max_message_bytes=int(args.max_message_mb * 1024 * 1024),
        tokens=tuple(tokens),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        access_log=args.access_log,
        fusion=not args.no_fusion,
        max_inflight=args.max_inflight,
        retry_after_ms=args.retry_after_ms,
        drain_s=args.drain_seconds,
        http_port=args.http_port,
        http_host=args.http_host or args.host,
        reuse_port=args.workers > 1 or os.environ.get("STITCHREC_WORKER_INDEX") is not None,
    )


def _reserve_port(host: str, port: int) -> socket.socket:
    """Binds (without listening) with SO_REUSEPORT, so workers can bind the same port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((host, port))
    return s


def _run_workers(args: argparse.Namespace) -> int:
    reserved = _reserve_port(args.host, args.port)
    port = reserved.getsockname()[1]
    http = None
    if args.http_port is not None:
        http = _reserve_port(args.http_host or args.host, args.http_port)
        args.http_port = http.getsockname()[1]
    procs = []
    for i in range(args.workers):
        cmd = [sys.executable, "-m", "pipelines.cli", *_worker_argv(args, port, i)]
        env = {**os.environ, "STITCHREC_WORKER_INDEX": str(i)}
        procs.append(subprocess.Popen(cmd, env=env))
    line = {"serving": args.host, "port": port, "http_port": args.http_port}
    print(json.dumps({**line, "workers": args.workers}), flush=True)

    def forward(signum: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [p.wait() for p in procs]
    reserved.close()
    if http is not None:
        http.close()
    return max(codes, default=0)


def _worker_argv(args: argparse.Namespace, port: int, index: int) -> list[str]:
    """The ``serve`` command line of worker ``index``: the same flags, one worker, one port."""
    out = ["serve", "--repo", args.repo, "--host", args.host, "--port", str(port)]
    if args.metrics_port is not None:
        out += ["--metrics-port", str(args.metrics_port + index if args.metrics_port else 0)]
    if args.metrics_host:
        out += ["--metrics-host", args.metrics_host]
    for pol in args.version_policy:
        out += ["--version-policy", pol]
    for tok in args.token:
        out += ["--token", tok]
    if args.preferred_batch_sizes:
        out += ["--preferred-batch-sizes", ",".join(map(str, args.preferred_batch_sizes))]
    for flag in (
        "poll_seconds",
        "max_batch_size",
        "max_queue_delay_us",
        "max_queue_size",
        "batch_concurrency",
        "max_request_rows",
        "max_tensor_elements",
        "max_string_kb",
        "max_broadcast_mb",
        "max_message_mb",
        "grace_seconds",
        "max_inflight",
        "max_queued_rows",
        "retry_after_ms",
        "drain_seconds",
        "log_level",
        "intra_op_threads",
        "inter_op_threads",
        "tls_cert",
        "tls_key",
        "tls_client_ca",
        "http_port",
        "http_host",
    ):
        value = getattr(args, flag)
        if value is not None:
            out += ["--" + flag.replace("_", "-"), str(value)]
    for flag in ("no_batching", "access_log", "no_fusion"):
        if getattr(args, flag):
            out.append("--" + flag.replace("_", "-"))
    return out


def cmd_serve(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    options = _options(args)  # validate before starting anything
    if args.workers > 1:
        return _run_workers(args)
    return _serve(args, options)


def _serve(args: argparse.Namespace, options: ServerOptions) -> int:
    """One server process: the only one, or a worker of ``--workers N``."""
    # TensorFlow and the server load here, not at the top: the supervisor of `--workers N`
    # (``_run_workers``) only starts and signals the workers and stays a small process.
    import tensorflow as tf

    from serving.server import configure_logging, serve_forever

    configure_logging(args.log_level)
    if args.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    if args.inter_op_threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    address = f"[{args.host}]:{args.port}" if ":" in args.host else f"{args.host}:{args.port}"
    return asyncio.run(serve_forever(address, args.repo, options, grace=args.grace_seconds))
