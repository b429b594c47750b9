"""grpc.health.v1 ``Health`` on grpc.aio: the server, each service and each model.

Service names: ``""`` (the whole server), each gRPC service's full name, each model name
(SERVING while the model has a ready version) and ``<model>/<version>`` for each ready version.
``Check`` of any other name is NOT_FOUND; ``Watch`` of it reports SERVICE_UNKNOWN until the name
appears. ``shut_down()`` (the start of a graceful stop) turns every name NOT_SERVING and ends
every ``Watch`` stream after sending that, so no stream holds the stop; a ``Watch`` opened later
gets NOT_SERVING and ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

Status = health_pb2.HealthCheckResponse.ServingStatus
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
_END = object()


class HealthServicer(health_pb2_grpc.HealthServicer):
    """Statuses by service name, set by the server; Watch streams follow them."""

    def __init__(self) -> None:
        self._status: dict[str, Status] = {"": NOT_SERVING}
        self._watchers: dict[str, set[asyncio.Queue]] = {}
        self.stopping = False

    def status(self, name: str) -> Status | None:
        """The status of ``name``; None: not a known name."""
        return self._status.get(name)

    def update(self, statuses: Mapping[str, Status]) -> None:
        """Replaces every status (a name left out is unknown from now on); notifies watchers."""
        if self.stopping:
            return
        old = self._status
        self._status = dict(statuses)
        for name, queues in self._watchers.items():
            new = self._status.get(name, SERVICE_UNKNOWN)
            if old.get(name, SERVICE_UNKNOWN) != new:
                for q in queues:
                    q.put_nowait(new)

    def shut_down(self) -> None:
        """Every name NOT_SERVING; every Watch stream gets that and then ends."""
        self.stopping = True
        old = self._status
        self._status = dict.fromkeys(old, NOT_SERVING)
        for name, queues in self._watchers.items():
            for q in queues:
                if old.get(name, NOT_SERVING) != NOT_SERVING:
                    q.put_nowait(NOT_SERVING)
                q.put_nowait(_END)

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = self._status.get(request.service)
        if status is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"unknown service or model {request.service!r}"
            )
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: Any
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        name = request.service
        yield health_pb2.HealthCheckResponse(status=self._status.get(name, SERVICE_UNKNOWN))
        if self.stopping:
            return
        q: asyncio.Queue = asyncio.Queue()
        self._watchers.setdefault(name, set()).add(q)
        try:
            while (status := await q.get()) is not _END:
                yield health_pb2.HealthCheckResponse(status=status)
        finally:
            self._watchers[name].discard(q)
            if not self._watchers[name]:
                del self._watchers[name]
