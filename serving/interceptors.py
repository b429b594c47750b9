"""Server interceptors: bearer-token authentication and structured (JSON) access logs."""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc

from serving import tracing
from serving.calls import REQUEST_ID_HEADER

access_log = logging.getLogger("stitchrec.serving.access")

# Health checks stay open so load balancers and Kubernetes probes need no token.
DEFAULT_OPEN_METHODS = ("/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch")


def _same_kind_handler(handler: grpc.RpcMethodHandler, behaviour: Callable) -> Any:
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(behaviour)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(behaviour)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(behaviour)
    return grpc.unary_unary_rpc_method_handler(behaviour)


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls without ``authorization: Bearer <token>`` metadata (UNAUTHENTICATED).

    ``tokens``: the accepted tokens (compared in constant time). ``open_methods``: full method
    names served without a token (default: the health checks).
    """

    def __init__(self, tokens: Iterable[str], open_methods: Iterable[str] = DEFAULT_OPEN_METHODS):
        self._tokens = [t.encode() for t in tokens]
        if not self._tokens or any(not t for t in self._tokens):
            raise ValueError("token auth needs at least one non-empty token")
        self._open = frozenset(open_methods)

    def _allowed(self, metadata: Iterable[tuple[str, Any]]) -> bool:
        for key, value in metadata or ():
            if key == "authorization":
                v = value.encode() if isinstance(value, str) else value
                if v.startswith(b"Bearer "):
                    given = v[len(b"Bearer ") :]
                    return any(hmac.compare_digest(given, t) for t in self._tokens)
        return False

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if (
            handler is None
            or details.method in self._open
            or self._allowed(details.invocation_metadata)
        ):
            return handler

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or wrong token: send metadata 'authorization: Bearer <token>'",
            )

        return _same_kind_handler(handler, deny)


def _request_id(details: grpc.HandlerCallDetails) -> str | bytes | None:
    """The call's ``x-request-id`` metadata (None when it has none)."""
    for key, value in details.invocation_metadata or ():
        if key == REQUEST_ID_HEADER:
            return value
    return None


class AccessLogInterceptor(grpc.aio.ServerInterceptor):
    """Logs one JSON line per unary call: method, peer, status code, milliseconds, the request id
    (the call's, ``serving.calls.current_call``, else the ``x-request-id`` metadata, else
    ``""``) and, when tracing is on, the trace id."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler
        inner = handler.unary_unary
        method = details.method

        async def logged(request: Any, context: grpc.aio.ServicerContext) -> Any:
            t0 = time.perf_counter()
            code = "OK"
            try:
                return await inner(request, context)
            except BaseException:
                c = context.code()
                code = c.name if c is not None else "UNKNOWN"
                raise
            finally:
                line = {
                    "event": "rpc",
                    "method": method,
                    "peer": context.peer(),
                    "code": code,
                    "ms": round(1e3 * (time.perf_counter() - t0), 3),
                    **tracing.log_fields(_request_id(details)),
                }
                access_log.info(json.dumps(line))

        return grpc.unary_unary_rpc_method_handler(
            logged,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
