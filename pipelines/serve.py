"""``stitchrec serve --repo DIR``: the gRPC (and HTTP) inference server (see ``serving/``).

    stitchrec serve --repo models/ [--host H] [--port P] [--metrics-port M] [--workers N]
                    [--http-port P [--http-host H]] [--probe-port P [--probe-host H]]
                    [--version-policy [NAME=]latest|latest:N|all|specific:V,..]...
                    [--poll-seconds S] [--max-batch-size B] [--max-queue-delay-us U]
                    [--preferred-batch-sizes 256,1024] [--max-queue-size Q] [--no-batching]
                    [--token T]... [--tls-cert F --tls-key F [--tls-client-ca F]]
                    [--max-message-mb M] [--grace-seconds G] [--access-log] [--log-level L]
                    [--no-fusion] [--no-heap-freeze] [--max-inflight N] [--max-queued-rows R]
                    [--retry-after-ms MS] [--drain-seconds D]
                    [--otlp-endpoint HOST:PORT [--trace-sample-rate R] [--trace-detail D]]
                    [--log-dir DIR [--log-rate [MODEL=]R]... [--log-flush-seconds S]
                     [--log-compression snappy|zstd|none]]

With ``--workers N > 1`` the command reserves the port (and the HTTP port), starts N server
processes that bind them with SO_REUSEPORT, forwards SIGTERM/SIGINT to them and waits; a
worker gets SIGTERM from the kernel if the supervisor dies (``_follow_supervisor``). With
``--metrics-port`` the workers write their metrics to one folder (Prometheus multiprocess mode:
the operator's ``PROMETHEUS_MULTIPROC_DIR``, or a temporary folder removed at exit) and this
process serves one ``/metrics`` adding them up (``serving.metrics.AggregatedMetrics``). With
``--probe-port`` this process runs the probe process (``serving.probes``) over one heartbeat file
per worker: live and ready when every worker is. The flags are defined in
``pipelines.cli_args_serve``.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from pipelines.errors import UsageError, check_output_path
from pipelines.loading import loading_modules
from serving.config import (
    BatchingConfig,
    BindError,
    Limits,
    OtlpSettings,
    ServerOptions,
    VersionPolicy,
    otlp_settings,
)
from serving.metrics import MULTIPROC_ENV, AggregatedMetrics, remove_process_files
from serving.ports import bind_alone, bind_shared
from serving.probes import Heartbeat, ProbeProcess

WAIT_POLL_S = 0.2  # how often the supervisor of `--workers N` looks for exited workers
#: the supervisor's process id, in each worker's environment (``_follow_supervisor``)
SUPERVISOR_ENV = "STITCHREC_SUPERVISOR_PID"
#: "1" in the workers' environment when their metrics folder is the supervisor's temporary one:
#: workers outliving their supervisor remove it (``_leave_no_metrics``)
METRICS_TEMPORARY_ENV = "STITCHREC_METRICS_TEMPORARY"
_PR_SET_PDEATHSIG = 1  # prctl(2)


def _options(args: argparse.Namespace) -> ServerOptions:
    """The server's options from the flags; a flag value they reject is a ``UsageError``."""
    try:
        return _checked_options(args)
    except ValueError as e:  # the option classes check each value and name it
        raise UsageError(str(e)) from None


def _log_rates(texts: list[str]) -> tuple[float, tuple[tuple[str, float], ...]]:
    """(default rate, per-model rates) from the ``--log-rate [MODEL=]R`` flags."""
    default, per_model = 1.0, []
    for text in texts:
        name, eq, value = text.rpartition("=")
        try:
            rate = float(value)
        except ValueError:
            rate = -1.0
        if not 0.0 <= rate <= 1.0 or (eq and not name):
            raise UsageError(
                f"--log-rate {text!r}: expected R or MODEL=R with R a number in [0, 1]"
            )
        if eq:
            per_model.append((name, rate))
        else:
            default = rate
    return default, tuple(per_model)


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
    log_default_rate, log_rates = _log_rates(args.log_rate)
    if any(not t for t in args.token):
        raise UsageError("--token is empty: expected a non-empty bearer token")
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
        otlp_endpoint=args.otlp_endpoint,
        otlp=otlp_settings(os.environ) if args.otlp_endpoint else OtlpSettings(),
        trace_sample_rate=args.trace_sample_rate,
        trace_detail=args.trace_detail,
        freeze_heap=not args.no_heap_freeze,
        log_dir=args.log_dir,
        log_rates=log_rates,
        log_default_rate=log_default_rate,
        log_flush_s=args.log_flush_seconds,
        log_compression=args.log_compression,
        http_port=args.http_port,
        http_host=args.http_host or args.host,
        probe_port=args.probe_port if args.workers == 1 else None,  # else the supervisor's
        probe_host=args.probe_host or args.host,
        heartbeat_file=args.heartbeat_file,
        reuse_port=args.workers > 1 or os.environ.get("STITCHREC_WORKER_INDEX") is not None,
    )


def _reserve_port(host: str, port: int, what: str = "gRPC") -> socket.socket:
    """Binds (without listening) with SO_REUSEPORT, so workers can bind the same port; an
    address in use or not of this machine is a ``UsageError`` naming it (``what``: its
    protocol).

    The kernel lets any process of the same user join a port bound with SO_REUSEPORT, so the
    port is first bound alone (:func:`bind_alone`): a second supervisor, or its workers, on the
    port of a running one fails instead of sharing its connections."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        port = bind_alone(family, host, port)
        return bind_shared(family, host, port)
    except OSError as e:
        address = _address(host, port)
        raise UsageError(f"cannot bind the {what} address {address!r}: {e.strerror or e}") from None


def _address(host: str, port: int) -> str:
    """``host:port``, the host in brackets when it is an IPv6 address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def workers_env(environ: Mapping[str, str], metrics: AggregatedMetrics | None) -> dict[str, str]:
    """The environment the workers start with: this process's, their metrics folder set only
    by ``metrics`` (``MULTIPROC_ENV``; none without ``--metrics-port``), and
    ``METRICS_TEMPORARY_ENV`` only when that folder is the supervisor's temporary one (a value
    inherited from this process's own environment would have workers remove an operator's
    folder)."""
    env = {k: v for k, v in environ.items() if k not in (MULTIPROC_ENV, METRICS_TEMPORARY_ENV)}
    if metrics is not None:
        env[MULTIPROC_ENV] = metrics.folder
        if metrics.owned:
            env[METRICS_TEMPORARY_ENV] = "1"
    return env


def _run_workers(args: argparse.Namespace) -> int:
    reserved = _reserve_port(args.host, args.port)
    port = reserved.getsockname()[1]
    line: dict[str, object] = {
        "serving": _address(args.host, port),
        "port": port,
        "workers": args.workers,
    }
    metrics = None
    http = None
    probes = None
    try:
        if args.http_port is not None:
            http = _reserve_port(args.http_host or args.host, args.http_port, "HTTP")
            args.http_port = http.getsockname()[1]
        line["http_port"] = args.http_port
        if args.probe_port is not None:
            probes = _WorkerProbes(args)
            line["probe_port"] = probes.process.port
        if args.metrics_port is not None:
            metrics, line["metrics_port"] = _aggregated_metrics(args)
            line["metrics_dir"] = metrics.folder
        env = workers_env(os.environ, metrics)
        procs = []
        for i in range(args.workers):
            cmd = [sys.executable, "-m", "pipelines.cli", *_worker_argv(args, port)]
            if probes is not None:
                cmd += ["--heartbeat-file", str(probes.files[i])]
            worker_env = {**env, "STITCHREC_WORKER_INDEX": str(i), SUPERVISOR_ENV: str(os.getpid())}
            procs.append(subprocess.Popen(cmd, env=worker_env))
        print(json.dumps(line), flush=True)

        def forward(signum: int, _frame: object) -> None:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        return _wait_workers(procs, metrics)
    finally:
        reserved.close()
        if http is not None:
            http.close()
        if metrics is not None:
            metrics.close()
        if probes is not None:
            probes.close()


class _WorkerProbes:
    """The supervisor's probe process over one heartbeat file per worker (``files``), in a
    folder of its own removed by ``close`` (or by the probe process, when the supervisor
    dies)."""

    def __init__(self, args: argparse.Namespace):
        self.folder = Path(tempfile.mkdtemp(prefix="stitchrec-heartbeats-"))
        self.files = [self.folder / f"worker-{i}" for i in range(args.workers)]
        for f in self.files:  # no beat yet: neither live nor ready until the worker beats
            Heartbeat(f).close()
        try:
            self.process = ProbeProcess(
                args.probe_host or args.host, args.probe_port, self.files, remove=self.folder
            )
        except OSError as e:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise UsageError(f"--probe-port {args.probe_port}: {e}") from None

    def close(self) -> None:
        self.process.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def _aggregated_metrics(args: argparse.Namespace) -> tuple[AggregatedMetrics, int]:
    """The workers' metric folder and the one ``/metrics`` over it, serving; its port. A folder
    or an address that cannot be used is a ``UsageError``."""
    try:
        metrics = AggregatedMetrics(os.environ.get(MULTIPROC_ENV) or None)
    except (ValueError, OSError) as e:
        raise UsageError(f"--workers metrics folder: {e}") from None
    host = args.metrics_host or args.host
    try:
        return metrics, metrics.serve_http(args.metrics_port, host)
    except OSError as e:
        metrics.close()
        raise UsageError(
            f"--metrics-port {args.metrics_port}: cannot serve on {host}: {e}"
        ) from None


def _wait_workers(procs: list[subprocess.Popen], metrics: AggregatedMetrics | None) -> int:
    """Waits for every worker; the worst exit status (a worker ended by signal N counts as
    128 + N, as a shell reports it). An exited worker's live gauges are dropped from the
    aggregated metrics at once (its counters still count)."""
    codes: dict[int, int] = {}
    while len(codes) < len(procs):
        for p in procs:
            if p.pid not in codes and p.poll() is not None:
                codes[p.pid] = p.returncode if p.returncode >= 0 else 128 - p.returncode
                if metrics is not None:
                    metrics.process_exited(p.pid)
        if len(codes) < len(procs):
            time.sleep(WAIT_POLL_S)
    return max(codes.values(), default=0)


def _worker_argv(args: argparse.Namespace, port: int) -> list[str]:
    """The ``serve`` command line of one worker: the same flags, one worker, one port, no
    metrics endpoint of its own (the supervisor serves the workers' metrics together)."""
    out = ["serve", "--repo", args.repo, "--host", args.host, "--port", str(port)]
    for pol in args.version_policy:
        out += ["--version-policy", pol]
    for tok in args.token:
        out += ["--token", tok]
    for rate in args.log_rate:
        out += ["--log-rate", rate]
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
        "log_dir",
        "log_flush_seconds",
        "log_compression",
        "log_level",
        "intra_op_threads",
        "inter_op_threads",
        "tls_cert",
        "tls_key",
        "tls_client_ca",
        "otlp_endpoint",
        "trace_sample_rate",
        "trace_detail",
        "http_port",
        "http_host",
    ):
        value = getattr(args, flag)
        if value is not None:
            out += ["--" + flag.replace("_", "-"), str(value)]
    for flag in ("no_batching", "access_log", "no_fusion", "no_heap_freeze"):
        if getattr(args, flag):
            out.append("--" + flag.replace("_", "-"))
    return out


def cmd_serve(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    options = _options(args)  # validate before starting anything
    if not Path(args.repo).is_dir():
        raise UsageError(f"model repository {args.repo!r} is not a directory")
    options.check_tls_files()
    if args.log_dir:
        check_output_path(args.log_dir, "--log-dir")
    if args.workers > 1:
        return _run_workers(args)
    return _serve(args, options)


def _serve(args: argparse.Namespace, options: ServerOptions) -> int:
    """One server process: the only one, or a worker of ``--workers N``."""
    supervisor = os.environ.get(SUPERVISOR_ENV)
    if supervisor is not None and not _follow_supervisor(int(supervisor)):
        return 0  # the supervisor of --workers is gone already: nothing to serve for
    # TensorFlow and the server load here, not at the top: the supervisor of `--workers N`
    # (``_run_workers``) only starts and signals the workers and stays a small process.
    with loading_modules():
        import tensorflow as tf

        from serving.server import configure_logging, serve_forever

    configure_logging(args.log_level)
    if args.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    if args.inter_op_threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    address = _address(args.host, args.port)
    try:
        return asyncio.run(serve_forever(address, args.repo, options, grace=args.grace_seconds))
    except BindError as e:  # a port in use or an address not of this machine
        raise UsageError(str(e)) from None
    finally:
        if supervisor is not None:
            _leave_no_metrics(int(supervisor))


def _leave_no_metrics(supervisor: int) -> None:
    """A worker whose supervisor died (SIGKILL: it could not remove its temporary metrics
    folder) removes its own metric files, and the folder when it is the last worker."""
    folder = os.environ.get(MULTIPROC_ENV)
    if folder and os.environ.get(METRICS_TEMPORARY_ENV) == "1" and os.getppid() != supervisor:
        remove_process_files(folder, os.getpid())


def _follow_supervisor(pid: int) -> bool:
    """Asks the kernel to send this worker of ``--workers`` SIGTERM (the graceful stop) when
    its supervisor, process ``pid``, dies, even by SIGKILL (Linux's ``PR_SET_PDEATHSIG``; on
    other systems nothing). False when the supervisor is gone already."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    return os.getppid() == pid
