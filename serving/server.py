"""The serving process: a grpc.aio server over a model repository.

``create_server(address, repo, options)`` loads the repository (every selected version loaded and
warmed), starts the services (RankingService, TF Serving PredictionService and ModelService,
KServe v2 GRPCInferenceService, grpc.health.v1, reflection) and returns ``(server, port)``;
``await server.stop(grace)`` turns health to NOT_SERVING, stops accepting calls, lets in-flight
calls finish (up to ``grace`` seconds), then drains the batchers and unloads the models.

Several processes can serve one port (``SO_REUSEPORT``; the kernel spreads connections over
them): ``stitchrec serve --workers N`` starts N such processes (see ``pipelines/serve.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from tensorflow_serving.apis import (
    model_service_pb2,
    prediction_service_pb2,
)

from protos import grpc_service_pb2 as kserve_pb2
from protos import ranking_service_pb2 as rank_pb2
from serving.config import ServerOptions
from serving.interceptors import AccessLogInterceptor, TokenAuthInterceptor
from serving.kserve import KServeServicer
from serving.metrics import Metrics
from serving.ranking_service import RankingServicer
from serving.repository import ModelRepository
from serving.rpc import ServerState, add_service
from serving.tf_serving import ModelServicer, PredictionServicer

log = logging.getLogger("stitchrec.serving.server")

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
        health_servicer: health.aio.HealthServicer,
        port: int,
        metrics_port: int | None,
    ):
        self.grpc_server = grpc_server
        self.state = state
        self.repository = state.repo
        self.metrics = state.metrics
        self.health = health_servicer
        self.port = port
        self.metrics_port = metrics_port
        self._stopped = False

    async def stop(self, grace: float | None = 10.0) -> None:
        """Graceful stop: NOT_SERVING, refuse new calls, finish in-flight ones, unload."""
        if self._stopped:
            return
        self._stopped = True
        t0 = time.monotonic()
        self.state.shutting_down = True
        await self.health.enter_graceful_shutdown()
        await self.repository.stop_polling()
        # no new call joins the queued ones: dispatch them now rather than after the window
        self.repository.flush()
        await self.grpc_server.stop(grace)
        await self.repository.close()
        self.state.close()
        self.metrics.stop_http()
        log.info(json.dumps({"event": "stopped", "seconds": round(time.monotonic() - t0, 3)}))

    async def wait_for_termination(self) -> None:
        await self.grpc_server.wait_for_termination()


def _read(path: str) -> bytes:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"TLS file {path!r} does not exist")
    return p.read_bytes()


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
    return grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", options.max_message_bytes),
            ("grpc.max_send_message_length", options.max_message_bytes),
            ("grpc.so_reuseport", 1 if options.reuse_port else 0),
        ],
    )


def _add_services(server: grpc.aio.Server, state: ServerState) -> health.aio.HealthServicer:
    """Registers every service plus grpc.health.v1 and reflection; returns the health servicer."""
    servicers = (
        RankingServicer(state),
        PredictionServicer(state),
        ModelServicer(state),
        KServeServicer(state),
    )
    for servicer, service in zip(servicers, SERVICES, strict=True):
        add_service(server, servicer, service)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health_name, reflection.SERVICE_NAME), server
    )
    return health_servicer


def _bind(server: grpc.aio.Server, address: str, options: ServerOptions) -> int:
    """Binds ``address`` (TLS when ``options`` has a certificate and key); returns the port."""
    try:
        if options.tls_cert is not None and options.tls_key is not None:
            creds = grpc.ssl_server_credentials(
                [(_read(options.tls_key), _read(options.tls_cert))],
                root_certificates=_read(options.tls_client_ca) if options.tls_client_ca else None,
                require_client_auth=options.tls_client_ca is not None,
            )
            port = server.add_secure_port(address, creds)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as e:  # grpc raises when the port is taken
        raise ValueError(f"cannot bind the gRPC address {address!r}: {e}") from None
    if port == 0:
        raise ValueError(f"cannot bind the gRPC address {address!r} (in use or invalid)")
    return port


def _health_sync(
    state: ServerState, health_servicer: health.aio.HealthServicer
) -> Callable[[], Awaitable[None]]:
    """A coroutine function setting every service SERVING while every model has a ready
    version (and the server is not stopping), NOT_SERVING otherwise."""

    async def sync_health() -> None:
        ok = state.repo.ready() and not state.shutting_down
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ok
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *SERVICE_NAMES):
            await health_servicer.set(name, status)

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
    metrics = Metrics()
    repository = _repository(repo, options, metrics)
    server = _grpc_server(options)
    state = ServerState(repository, metrics, options.limits)
    health_servicer = _add_services(server, state)
    port = _bind(server, address, options)
    sync_health = _health_sync(state, health_servicer)
    repository.after_poll = sync_health
    await sync_health()  # NOT_SERVING until the first load
    await server.start()  # live (ServerLive) while the models load; ready after
    try:
        await repository.start()
    except BaseException:
        await server.stop(None)
        raise
    metrics_port = None
    if options.metrics_port is not None:
        metrics_port = metrics.serve_http(options.metrics_port, options.metrics_host)
    await sync_health()
    log.info(
        json.dumps(
            {
                "event": "serving",
                "address": address,
                "port": port,
                "metrics_port": metrics_port,
                "models": {n: repository.live_versions(n) for n in repository.model_names()},
                "devices": repository.devices,
                "tls": options.tls_cert is not None,
                "auth": bool(options.tokens),
            }
        )
    )
    return ServingServer(server, state, health_servicer, port, metrics_port), port


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
    """Runs until SIGTERM or SIGINT, then stops gracefully; prints the port once serving."""
    import signal

    server, port = await create_server(address, repo, options)
    print(
        json.dumps({"serving": address, "port": port, "metrics_port": server.metrics_port}),
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace)
    return 0
