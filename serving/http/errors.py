"""HTTP answers for errors: the JSON body ``{"error": "..."}`` of TF Serving's REST API and
KServe v2, with the HTTP status TF Serving gives each gRPC status code.

==================  ====  ==================  ====
gRPC code           HTTP  gRPC code           HTTP
==================  ====  ==================  ====
INVALID_ARGUMENT    400   RESOURCE_EXHAUSTED  429 (with ``Retry-After``)
FAILED_PRECONDITION 400   UNAVAILABLE         503
OUT_OF_RANGE        400   DEADLINE_EXCEEDED   504
NOT_FOUND           404   UNIMPLEMENTED       501
UNAUTHENTICATED     401   CANCELLED           499
PERMISSION_DENIED   403   other (INTERNAL)    500
==================  ====  ==================  ====

A body larger than ``ServerOptions.max_message_bytes`` is 413; a Content-Encoding other than
gzip or deflate is 415.
"""

from __future__ import annotations

import json
import math

import grpc
from aiohttp import web

HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.CANCELLED: 499,
}
#: the gRPC code name counted in the metrics for an HTTP status answered without one
CODE_OF_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    413: "RESOURCE_EXHAUSTED",
    415: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    503: "UNAVAILABLE",
}


class HttpError(Exception):
    """An error answered with an HTTP status (and the gRPC code name the metrics count)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = CODE_OF_STATUS.get(status, "INTERNAL")


def http_status(code: grpc.StatusCode) -> int:
    """The HTTP status answered for a gRPC status code."""
    return HTTP_STATUS.get(code, 500)


def json_response(body: object, status: int = 200, headers: dict | None = None) -> web.Response:
    """``body`` as a JSON response (NaN and infinities written as TF Serving writes them)."""
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def error_response(status: int, message: str, retry_after_ms: int | None = None) -> web.Response:
    """``{"error": message}`` with ``status``; a retry hint adds ``Retry-After`` (whole
    seconds, at least 1) and ``Retry-After-Ms``."""
    headers = {}
    if retry_after_ms is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_ms / 1000)))
        headers["Retry-After-Ms"] = str(retry_after_ms)
    return json_response({"error": message}, status, headers)
