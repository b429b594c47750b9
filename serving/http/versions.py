"""Which version serves an HTTP call: its version number, its version label, or its traffic
arm (``serving.routing``), the split key read from the call's headers or features."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from aiohttp import web

from serving import routing
from serving.inference import ServingError
from serving.rpc import ServerState


def resolve_version(
    state: ServerState, model: str, version: int | None, label: str | None
) -> int | None:
    """The version a call names by number or by label (None: the highest ready one): a label's
    version must be live (``serving.routing.label_version``: NOT_FOUND for a label the model's
    traffic.toml does not have, UNAVAILABLE for one naming a version that is not ready)."""
    return routing.label_version(state, model, label) if label else version


def route_version(
    state: ServerState,
    request: web.Request,
    model: str,
    version: int | None,
    label: str | None,
    feature: Callable[[str], Any],
) -> int | None:
    """The version an inference call is served by (``serving.routing.route``): its version, its
    label's, or its traffic arm's, the split key read from the HTTP headers (``header:NAME``)
    or ``feature(name)``. Sets the call's arm."""
    return routing.route(state, model, version, label, request.headers.get, feature).version


def feature_key(values: Mapping[str, Any], name: str, decode: Callable[[Any], np.ndarray]) -> Any:
    """The first value of feature ``name`` in a request's ``values`` decoded by ``decode`` (None
    when the request has no such feature or it does not decode: the full decode answers it)."""
    if name not in values:
        return None
    try:
        return routing.first_value(decode(values[name]))
    except ServingError:
        return None
