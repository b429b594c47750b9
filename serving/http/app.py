"""The HTTP side of the server: an aiohttp application on the event loop that serves gRPC.

Routes (``serving.http.tfs_rest``, ``serving.http.kserve_http``, ``serving.http.rank_http``):

- TF Serving REST: ``/v1/models/{m}[/versions/{v}|/labels/{l}][:predict|/metadata]``;
- KServe v2 REST: ``/v2/health/live``, ``/v2/health/ready``, ``/v2``,
  ``/v2/models/{m}[/versions/{v}]``, ``.../ready``, ``.../infer``;
- StitchRec ranking: ``/v1/rank/{m}``.

Every call goes through the gRPC side's checks and limits (``serving.inference``), admission
control and metrics (``serving.http.endpoint``); bodies are bounded by
``ServerOptions.max_message_bytes`` (413); errors are ``{"error": "..."}``. With
``ServerOptions.tokens`` every path but ``/v2/health/*`` needs ``Authorization: Bearer
<token>``; with ``tls_cert`` and ``tls_key`` the port serves HTTPS (and with ``tls_client_ca``
requires client certificates). With ``reuse_port`` several processes share the port
(SO_REUSEPORT, ``stitchrec serve --workers N``).
"""

from __future__ import annotations

import hmac
import ssl

from aiohttp import web

from serving.calls import clean_request_id
from serving.config import BindError, ServerOptions
from serving.http import kserve_http, rank_http, tfs_rest
from serving.http.endpoint import OPTIONS, REQUEST_ID, STATE, Handler
from serving.http.errors import error_response
from serving.rpc import ServerState

#: seconds ``runner.cleanup()`` waits for HTTP handlers still running when the server stops
#: (inference calls were already waited for by admission control)
SHUTDOWN_S = 1.0
OPEN_PREFIX = "/v2/health/"


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own errors (no such path, wrong method) as ``{"error": ...}``."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        resp = error_response(e.status, f"{e.reason}: {request.method} {request.path}")
        resp.headers[REQUEST_ID] = clean_request_id(request.headers.get(REQUEST_ID))
        return resp


def _auth(tokens: tuple[str, ...]) -> Handler:
    accepted = [t.encode() for t in tokens]

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith(OPEN_PREFIX):
            given = request.headers.get("Authorization", "").encode()
            ok = given.startswith(b"Bearer ") and any(
                hmac.compare_digest(given[len(b"Bearer ") :], t) for t in accepted
            )
            if not ok:
                resp = error_response(
                    401, "missing or wrong token: send header 'Authorization: Bearer <token>'"
                )
                resp.headers["WWW-Authenticate"] = "Bearer"
                return resp
        return await handler(request)

    return auth


def build_app(state: ServerState, options: ServerOptions) -> web.Application:
    """The aiohttp application serving ``state`` (its repository, limits, admission, metrics
    and observers) over HTTP."""
    middlewares = [_json_errors]
    if options.tokens:
        middlewares.append(_auth(options.tokens))
    app = web.Application(client_max_size=options.max_message_bytes, middlewares=middlewares)
    app[STATE] = state
    app[OPTIONS] = options
    r = app.router
    r.add_route("*", "/v1/models/{tail:.+}", tfs_rest.dispatch)
    r.add_post("/v1/rank/{model}", rank_http.rank)
    r.add_get("/v2/health/live", kserve_http.live)
    r.add_get("/v2/health/ready", kserve_http.ready)
    r.add_get("/v2", kserve_http.server_metadata)
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        r.add_get(base, kserve_http.model_metadata)
        r.add_get(base + "/ready", kserve_http.model_ready)
        r.add_post(base + "/infer", kserve_http.infer)
    return app


def _ssl_context(options: ServerOptions) -> ssl.SSLContext | None:
    if options.tls_cert is None or options.tls_key is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(options.tls_cert, options.tls_key)
    if options.tls_client_ca:
        ctx.load_verify_locations(options.tls_client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


async def start_http(state: ServerState, options: ServerOptions) -> tuple[web.AppRunner, int]:
    """Starts serving ``build_app(state, options)`` on ``options.http_host:http_port`` (port
    0: any free one); returns the runner (``await runner.cleanup()`` stops it) and the port."""
    if options.http_port is None:
        raise ValueError("start_http needs options.http_port (0: any free port)")
    runner = web.AppRunner(
        build_app(state, options),
        handle_signals=False,
        access_log=None,
        shutdown_timeout=SHUTDOWN_S,
    )
    await runner.setup()
    site = web.TCPSite(
        runner,
        options.http_host,
        options.http_port,
        ssl_context=_ssl_context(options),
        reuse_port=True if options.reuse_port else None,
    )
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        address = f"{options.http_host}:{options.http_port}"
        raise BindError(f"cannot bind the HTTP address {address!r}: {e}") from None
    return runner, int(runner.addresses[0][1])
