"""The serving process: a grpc.aio server over a model repository.

``create_server(address, repo, options)`` loads the repository (every selected version loaded and
warmed), starts the services (RankingService, TF Serving PredictionService and ModelService,
KServe v2 GRPCInferenceService, grpc.health.v1 per service and per model, reflection v1 and
v1alpha) and returns ``(server, port)``. Admission control (``serving.admission``) bounds the
inference calls in flight and answers overload at once.

Each model's optional ``traffic.toml`` (``serving.traffic``) gives version labels, a sticky
traffic split (``serving.routing``) and shadow traffic (``serving.shadow``, an observer
registered here, its background task stopped before the models are unloaded).

``await server.stop(grace)`` drains: every health status turns NOT_SERVING (KServe ServerReady
false) and health Watch streams end; for the drain period (``ServerOptions.drain_s``) calls are
still served, so load balancers move traffic away; then new calls are answered UNAVAILABLE, the
batchers dispatch their queues at once and the calls in flight are answered (up to ``grace``
seconds); then the gRPC and HTTP servers stop and the models are unloaded.

With ``ServerOptions.http_port`` the same process and event loop also serve HTTP
(``serving.http``: TF Serving REST, KServe v2 REST, ``/v1/rank``); ``/v2/health/ready`` answers
503 from the start of a stop.

With ``ServerOptions.otlp_endpoint`` the server installs tracing (``serving.tracing``: spans of
every inference call exported over OTLP/gRPC) at the start and flushes it at the end of a stop.

Several processes can serve one port (``SO_REUSEPORT``; the kernel spreads connections over
them): ``stitchrec serve --workers N`` starts N such processes (see ``pipelines/serve.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorflow_serving.apis import (
    model_service_pb2,
    prediction_service_pb2,
)

from protos import grpc_service_pb2 as kserve_pb2
from protos import ranking_service_pb2 as rank_pb2
from serving import admission, tracing
from serving.config import BindError, ServerOptions
from serving.health import NOT_SERVING, SERVING, HealthServicer
from serving.heartbeats import ServerProbes
from serving.http.app import start_http
from serving.interceptors import AccessLogInterceptor, TokenAuthInterceptor
from serving.kserve import KServeServicer, server_ready
from serving.metrics import Metrics
from serving.ports import bind_alone
from serving.prediction_log import PredictionLogger
from serving.ranking_service import RankingServicer
from serving.reflection import enable_reflection
from serving.repository import ModelRepository
from serving.rpc import ServerState, add_service
from serving.shadow import ShadowTraffic
from serving.tf_serving import ModelServicer, PredictionServicer

log = logging.getLogger("stitchrec.serving.server")

REFUSING_S = 0.25  # on stop, the least time new calls are answered UNAVAILABLE before gRPC stops

SERVICES = (
    rank_pb2.DESCRIPTOR.services_by_name["RankingService"],
    prediction_service_pb2.DESCRIPTOR.services_by_name["PredictionService"],
    model_service_pb2.DESCRIPTOR.services_by_name["ModelService"],
    kserve_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"],
)
SERVICE_NAMES = tuple(s.full_name for s in SERVICES)


class ServingServer:
    """A running server: the grpc.aio server, its repository, metrics and health."""

    def __init__(
        self,
        grpc_server: grpc.aio.Server,
        state: ServerState,
        health_servicer: HealthServicer,
        port: int,
        metrics_port: int | None,
        drain_s: float = 0.0,
        traced: bool = False,
        prediction_log: PredictionLogger | None = None,
        http_runner: web.AppRunner | None = None,
        http_port: int | None = None,
        probes: ServerProbes | None = None,
    ):
        self.grpc_server = grpc_server
        self.state = state
        self.repository = state.repo
        self.metrics = state.metrics
        self.health = health_servicer
        self.port = port
        self.metrics_port = metrics_port
        self.drain_s = drain_s
        self.traced = traced  # this server installed tracing: stop() flushes and removes it
        self.prediction_log = prediction_log
        self.http_runner = http_runner
        self.http_port = http_port  # None: no HTTP
        self.probes = probes
        self.probe_port = probes.port if probes is not None else None  # None: no probe port
        self._stopped = False

    async def stop(self, grace: float | None = 10.0, drain: float | None = None) -> None:
        """Graceful stop: NOT_SERVING (Watch streams end), ``drain`` seconds still serving
        (default ``drain_s``), then UNAVAILABLE to new calls while the queued and in-flight
        ones are answered (up to ``grace`` seconds; None: none waited for), then unload."""
        if self._stopped:
            return
        self._stopped = True
        drain = self.drain_s if drain is None else drain
        t0 = time.monotonic()
        self.state.shutting_down = True
        self.health.shut_down()
        log.info(json.dumps({"event": "draining", "seconds": drain}))
        await self.repository.stop_polling()
        await asyncio.sleep(max(0.0, drain - (time.monotonic() - t0)))
        self.state.admission.refuse()
        # no new call joins the queued ones: dispatch them now rather than after the window
        self.repository.flush()
        t1 = time.monotonic()
        answered = await self.state.admission.wait_idle(0.0 if grace is None else grace)
        if self.state.shadow is not None:
            await self.state.shadow.stop()  # before the versions it scores on are unloaded
        left = None if grace is None else max(0.0, grace - (time.monotonic() - t1))
        if left is not None:
            # new calls keep getting UNAVAILABLE from the handlers a moment: gRPC's own stop
            # cancels the calls it has received but not yet handed to a handler
            await asyncio.sleep(min(left, max(0.0, REFUSING_S - (time.monotonic() - t1))))
            left = max(0.0, grace - (time.monotonic() - t1))
        # what is left in flight (non-inference calls, or past the grace) gets the rest
        await self.grpc_server.stop(left if answered or left is None else 0.0)
        if self.http_runner is not None:
            await self.http_runner.cleanup()
        if self.prediction_log is not None:  # every answered call is buffered: write them
            await asyncio.to_thread(self.prediction_log.close)
        await self.repository.close()
        self.state.close()
        self.metrics.stop_http()
        if self.traced:
            # the last spans go out to the collector (blocking up to its export timeout)
            await asyncio.get_running_loop().run_in_executor(None, tracing.shutdown)
        if self.probes is not None:  # not ready (then gone) until the process exits
            await self.probes.stop()
        log.info(
            json.dumps(
                {
                    "event": "stopped",
                    "seconds": round(time.monotonic() - t0, 3),
                    "in_flight_left": self.state.admission.inflight,
                }
            )
        )

    async def wait_for_termination(self) -> None:
        await self.grpc_server.wait_for_termination()


def _repository(
    repo: str | Path | ModelRepository, options: ServerOptions, metrics: Metrics
) -> ModelRepository:
    """``repo`` itself, or a repository over the folder ``repo`` configured from ``options``."""
    if isinstance(repo, ModelRepository):
        return repo
    return ModelRepository(
        repo,
        policy=options.policy,
        policies=dict(options.policies),
        batching=options.batching,
        poll_interval_s=options.poll_interval_s,
        warmup_sizes=options.warmup_sizes,
        devices=list(options.devices) if options.devices else None,
        fusion=options.fusion,
        freeze=options.freeze_heap,
        on_batch=metrics.record_batch,
        on_change=metrics.record_state,
    )


def _grpc_server(options: ServerOptions) -> grpc.aio.Server:
    """The grpc.aio server with the auth and access-log interceptors ``options`` asks for."""
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if options.tokens:
        interceptors.append(TokenAuthInterceptor(options.tokens))
    if options.access_log:
        interceptors.append(AccessLogInterceptor())
    max_rpcs, limits = admission.grpc_limits(options.max_inflight)
    return grpc.aio.server(
        interceptors=interceptors,
        maximum_concurrent_rpcs=max_rpcs,
        options=[
            ("grpc.max_receive_message_length", options.max_message_bytes),
            ("grpc.max_send_message_length", options.max_message_bytes),
            ("grpc.so_reuseport", 1 if options.reuse_port else 0),
            *limits,
        ],
    )


def _add_services(server: grpc.aio.Server, state: ServerState) -> HealthServicer:
    """Registers every service plus grpc.health.v1 and reflection; returns the health servicer."""
    servicers = (
        RankingServicer(state),
        PredictionServicer(state),
        ModelServicer(state),
        KServeServicer(state),
    )
    for servicer, service in zip(servicers, SERVICES, strict=True):
        add_service(server, servicer, service)
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
    enable_reflection((*SERVICE_NAMES, health_name), server)
    return health_servicer


def bound_address(address: str, port: int) -> str:
    """``address`` (``host:port``) with the port it was bound to (port 0 asks for any)."""
    return f"{address.rpartition(':')[0]}:{port}"


def _bind(server: grpc.aio.Server, address: str, options: ServerOptions) -> int:
    """Binds ``address`` (TLS when ``options`` has a certificate and key); returns the port."""
    options.check_tls_files()
    try:
        if options.tls_cert is not None and options.tls_key is not None:
            creds = grpc.ssl_server_credentials(
                [(Path(options.tls_key).read_bytes(), Path(options.tls_cert).read_bytes())],
                root_certificates=(
                    Path(options.tls_client_ca).read_bytes() if options.tls_client_ca else None
                ),
                require_client_auth=options.tls_client_ca is not None,
            )
            port = server.add_secure_port(address, creds)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as e:  # grpc raises when the port is taken
        reason = _bind_reason(address, e)
        raise BindError(f"cannot bind the gRPC address {address!r}: {reason}") from None
    if port == 0:
        reason = _bind_reason(address, "in use or invalid")
        raise BindError(f"cannot bind the gRPC address {address!r}: {reason}")
    return port


def _bind_reason(address: str, fallback: object) -> str:
    """Why ``address`` (``host:port``) cannot be bound, as the operating system says it (e.g.
    "Address already in use": gRPC's own error names no reason), else ``fallback``."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        bind_alone(socket.AF_INET6 if ":" in host else socket.AF_INET, host, int(port))
    except (OSError, ValueError) as e:
        return getattr(e, "strerror", None) or str(e)
    return str(fallback)


def _health_sync(
    state: ServerState, health_servicer: HealthServicer
) -> Callable[[], Awaitable[None]]:
    """A coroutine function (run after each repository poll) re-reading the changed
    ``traffic.toml`` files and setting the server and every service SERVING while it is ready
    (``serving.kserve.server_ready``: at least one model, every model with a ready version), each
    model SERVING while it has one, each ready ``<model>/<version>`` SERVING (NOT_SERVING
    everywhere once the server stops)."""

    async def sync_health() -> None:
        repo = state.repo
        state.traffic.refresh(repo.model_names())
        up = not state.shutting_down
        overall = SERVING if server_ready(state) else NOT_SERVING
        statuses = dict.fromkeys(("", *SERVICE_NAMES), overall)
        for name in repo.model_names():
            statuses[name] = SERVING if up and repo.ready(name) else NOT_SERVING
            for v in repo.live_versions(name):
                statuses[f"{name}/{v}"] = SERVING if up else NOT_SERVING
        health_servicer.update(statuses)

    return sync_health


async def create_server(
    address: str,
    repo: str | Path | ModelRepository,
    options: ServerOptions | None = None,
) -> tuple[ServingServer, int]:
    """Loads the repository, binds ``address`` (``host:port``, port 0: any) and starts serving.

    Returns the running server and the bound port.
    """
    options = options or ServerOptions()
    traced = options.otlp_endpoint is not None
    if traced:
        tracing.install(
            tracing.otlp_exporter(options.otlp_endpoint, options.otlp),
            options.trace_sample_rate,
            options.trace_detail,
        )
    try:
        return await _start(address, repo, options, traced)
    except BaseException:
        if traced:
            tracing.shutdown()
        raise


def _prediction_logger(options: ServerOptions, metrics: Metrics) -> PredictionLogger | None:
    """The prediction log ``options`` ask for (``log_dir``), else None."""
    if options.log_dir is None:
        return None
    return PredictionLogger(
        options.log_dir,
        dict(options.log_rates),
        options.log_default_rate,
        flush_s=options.log_flush_s,
        metrics=metrics,
        compression=options.log_compression,
    )


def _log_serving(
    address: str,
    port: int,
    options: ServerOptions,
    repository: ModelRepository,
    metrics_port: int | None,
    http_port: int | None,
    probes: ServerProbes | None,
) -> None:
    """The ``serving`` log event: the address and port bound, the other ports, the models."""
    log.info(
        json.dumps(
            {
                "event": "serving",
                "address": bound_address(address, port),
                "port": port,
                "metrics_port": metrics_port,
                "http_port": http_port,
                "probe_port": probes.port if probes is not None else None,
                "models": {n: repository.live_versions(n) for n in repository.model_names()},
                "devices": repository.devices,
                "tls": options.tls_cert is not None,
                "auth": bool(options.tokens),
                "otlp_endpoint": options.otlp_endpoint,
                "prediction_log": options.log_dir,
            }
        )
    )


async def _start(
    address: str, repo: str | Path | ModelRepository, options: ServerOptions, traced: bool
) -> tuple[ServingServer, int]:
    """``create_server`` once tracing is set up (``traced``: installed by this server)."""
    metrics = Metrics()
    if traced:
        tracing.count_lost(metrics.record_lost_spans)
    repository = _repository(repo, options, metrics)
    server = _grpc_server(options)
    gate = admission.Admission(options.max_inflight, metrics, options.retry_after_ms)
    state = ServerState(repository, metrics, options.limits, gate)
    state.shadow = ShadowTraffic(state)
    state.observers.add(state.shadow)
    health_servicer = _add_services(server, state)
    port = _bind(server, address, options)
    prediction_log = _prediction_logger(options, metrics)
    if prediction_log is not None:
        state.observers.add(prediction_log)
    sync_health = _health_sync(state, health_servicer)
    repository.after_poll = sync_health
    await sync_health()  # NOT_SERVING until the first load
    await server.start()  # live (ServerLive) while the models load; ready after
    http_runner, http_port = None, None
    probes = None
    if options.probe_port is not None or options.heartbeat_file is not None:
        probes = ServerProbes(state, options)
    try:
        if probes is not None:  # live while the models load, ready after
            await probes.start()
        if options.http_port is not None:
            http_runner, http_port = await start_http(state, options)
        await repository.start()
    except BaseException:
        if probes is not None:
            await probes.stop()
        if http_runner is not None:
            await http_runner.cleanup()
        await server.stop(None)
        if prediction_log is not None:
            prediction_log.close()
        raise
    state.shadow.start()
    metrics_port = None
    if options.metrics_port is not None:
        metrics_port = metrics.serve_http(options.metrics_port, options.metrics_host)
    await sync_health()
    _log_serving(address, port, options, repository, metrics_port, http_port, probes)
    serving = ServingServer(
        server,
        state,
        health_servicer,
        port,
        metrics_port,
        options.drain_s,
        traced,
        prediction_log=prediction_log,
        http_runner=http_runner,
        http_port=http_port,
        probes=probes,
    )
    return serving, port


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger and the message (itself JSON if it is)."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        try:
            body = json.loads(msg)
            if not isinstance(body, dict):
                body = {"msg": msg}
        except ValueError:
            body = {"msg": msg}
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            **body,
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure_logging(level: str = "INFO") -> None:
    """Structured logs: JSON lines on stderr for the ``stitchrec`` loggers."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("stitchrec")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


async def serve_forever(
    address: str, repo: str | Path, options: ServerOptions, grace: float = 10.0
) -> int:
    """Runs until SIGTERM or SIGINT, then stops gracefully (``ServingServer.stop``: the drain
    period of ``options.drain_s``, then up to ``grace`` seconds for the calls in flight); prints
    the port once serving."""
    import signal

    server, port = await create_server(address, repo, options)
    print(
        json.dumps(
            {
                "serving": bound_address(address, port),
                "port": port,
                "metrics_port": server.metrics_port,
                "http_port": server.http_port,
                "probe_port": server.probe_port,
            }
        ),
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace)
    return 0
