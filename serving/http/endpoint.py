"""What every HTTP handler shares: the ``endpoint`` wrapper and bounded body reading.

``endpoint(method)`` wraps a handler ``async (request) -> web.Response`` like ``serving.rpc.rpc``
wraps a gRPC one: the call starts (``serving.calls.start_call("http", X-Request-Id)``), admission
control takes it (``method`` names the gRPC call it matches: ``Predict``, ``ModelInfer`` and
``Rank`` hold an in-flight slot and get the call span of ``serving.tracing``, continuing a
``traceparent`` header and answering their own; the probes are answered while the server
stops), exceptions
become ``{"error": ...}`` with the HTTP status of their gRPC code (``serving.http.errors``), and
the metrics count it as ``http.<method>``. Every answer carries ``X-Request-Id``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from serving import tracing
from serving.admission import INFERENCE_METHODS
from serving.calls import current_call, start_call
from serving.config import ServerOptions
from serving.http.errors import HttpError, error_response, http_status
from serving.http.jsonio import parse_json
from serving.rpc import INLINE_BYTES, ServerState, clip, set_request_bytes

log = logging.getLogger("stitchrec.serving.http")
access_log = logging.getLogger("stitchrec.serving.access")

STATE = web.AppKey("state", ServerState)
OPTIONS = web.AppKey("options", ServerOptions)
REQUEST_ID = "X-Request-Id"
ARM_HEADER = "X-StitchRec-Arm"
VERSION_HEADER = "X-StitchRec-Version"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def state_of(request: web.Request) -> ServerState:
    return request.app[STATE]


def endpoint(method: str) -> Callable[[Handler], Handler]:
    """Wraps an HTTP handler (see the module docstring); ``method``: the gRPC method name."""

    traced = method in INFERENCE_METHODS

    def deco(fn: Handler) -> Handler:
        @functools.wraps(fn)
        async def wrapper(request: web.Request) -> web.StreamResponse:
            state = state_of(request)
            t0 = time.perf_counter()
            info = start_call("http", request.headers.get(REQUEST_ID))
            code = "OK"
            span = tracing.call_span(f"http.{method}", request.headers, "http") if traced else None
            with span or tracing.OFF:
                try:
                    with state.admission.admit(method):
                        resp = await fn(request)
                except asyncio.CancelledError:
                    tracing.set_status("CANCELLED", error=True)
                    _record(state, method, "CANCELLED", t0)
                    raise
                except HttpError as e:
                    code = e.code
                    resp = error_response(e.status, e.message)
                except Exception as e:
                    code, resp = _error_answer(state, method, e)
                tracing.set_status(str(resp.status), error=resp.status >= 400)
                resp.headers.update(tracing.response_headers())
            resp.headers[REQUEST_ID] = info.request_id
            _record(state, method, code, t0)
            if request.app[OPTIONS].access_log:
                _access_line(request, resp.status, t0)
            return resp

        return wrapper

    return deco


def _error_answer(state: ServerState, method: str, exc: Exception) -> tuple[str, web.Response]:
    """The gRPC code name and the JSON error answer of ``exc`` (a retry hint when overloaded);
    an INTERNAL error is logged with its traceback."""
    status, message, hints = state.admission.answer(f"http.{method}", exc)
    if status == grpc.StatusCode.INTERNAL:
        log.exception(json.dumps({"event": "internal_error", "method": method}))
    retry = int(dict(hints)["retry-after-ms"]) if hints else None
    message = clip(message, state.limits.max_message_chars)
    return status.name, error_response(http_status(status), message, retry)


def _record(state: ServerState, method: str, code: str, t0: float) -> None:
    state.metrics.record_rpc(f"http.{method}", code, time.perf_counter() - t0)


def _access_line(request: web.Request, status: int, t0: float) -> None:
    access_log.info(
        json.dumps(
            {
                "event": "http",
                "method": request.method,
                "path": request.path,
                "status": status,
                "ms": round(1e3 * (time.perf_counter() - t0), 3),
                "peer": request.remote or "",
                **tracing.log_fields(request.headers.get(REQUEST_ID)),
            }
        )
    )


def answer_headers(resp: web.StreamResponse, version: int) -> web.StreamResponse:
    """Adds ``X-StitchRec-Version`` (the version that scored) and ``X-StitchRec-Arm`` (the
    traffic arm, when one was chosen) to an inference answer."""
    resp.headers[VERSION_HEADER] = str(version)
    info = current_call()
    if info is not None and info.arm:
        resp.headers[ARM_HEADER] = info.arm
    return resp


#: the Content-Encoding values a request body may have
BODY_ENCODINGS = ("identity", "gzip", "deflate")


async def read_body(request: web.Request) -> bytes:
    """The request body (chunked or not; uncompressed, gzip or deflate, else 415), at most
    ``max_message_bytes`` (else 413; a body that does not decode is 400); records its size, so
    that ``ServerState.offload`` decodes a large one on a worker thread."""
    limit = request.app[OPTIONS].max_message_bytes
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(request.content_length, limit)
    encoding = request.headers.get("Content-Encoding", "").strip().lower() or "identity"
    if encoding not in BODY_ENCODINGS:
        raise HttpError(
            415,
            f"Content-Encoding {encoding!r} is not supported; expected one of "
            f"{list(BODY_ENCODINGS)}",
        )
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(None, limit) from None
    except RequestPayloadError as e:  # e.g. a body that is not the gzip its header names
        raise HttpError(
            400, f"the request body could not be decoded as {encoding}: {clip(str(e), 200)}"
        ) from None
    set_request_bytes(len(body))
    return body


def _too_large(size: int | None, limit: int) -> HttpError:
    got = f"{size} bytes" if size is not None else "more bytes"
    return HttpError(413, f"the request body has {got}; the server accepts at most {limit} bytes")


async def json_body(request: web.Request, where: str) -> Any:
    """The body's JSON document (parsed on a worker thread when larger than INLINE_BYTES)."""
    body = await read_body(request)
    if len(body) <= INLINE_BYTES:
        return parse_json(body, where)
    return await state_of(request).offload(lambda: parse_json(body, where))


async def dumps(request: web.Request, body: Any) -> bytes:
    """``body`` as JSON bytes (on a worker thread for a large request)."""

    def dump() -> bytes:
        return json.dumps(body, separators=(",", ":")).encode()

    return await state_of(request).offload(dump)
