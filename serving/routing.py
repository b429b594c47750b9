"""Which version answers a request: an explicit version, a label, or the traffic split.

``choose(state, model, version, label, key)`` decides, the same for every protocol:

1. a request naming a version gets it (arm ``""``);
2. else a request naming a label gets the label's version (arm: the label); a label the model's
   ``traffic.toml`` does not have is NOT_FOUND, one naming a version that is not live is
   UNAVAILABLE naming that version;
3. else, when ``traffic.toml`` has a ``[split]``, the split key's value picks the arm (sticky:
   the same key always lands in the same arm while the weights stay the same)::

       bucket = int.from_bytes(blake2b(key, digest_size=8).digest(), "big") % 10000
       arm    = first label (file order) with bucket < 10000 * cumsum(weights) / sum(weights)

   the key as bytes: strings UTF-8, integers in decimal (so ``42`` and ``"42"`` agree); a call
   without a key value is bucketed by its request id. The arm's version not live: UNAVAILABLE;
4. else the highest live version (version None, arm ``""``).

The chosen arm is set on the current call (``serving.calls.current_call().arm``), so the
observers (prediction log, shadow traffic) see it, and counted in
``stitchrec_arm_requests_total{model, arm}``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any, Protocol

import grpc
import numpy as np

from serving.calls import current_call
from serving.inference import ServingError
from serving.model_version import ModelNotFound
from serving.repository import ModelRepository
from serving.traffic import Split, TrafficConfig, TrafficTable

BUCKETS = 10_000
# the response metadata (gRPC) / headers (HTTP) naming the arm and the version that answered
ARM_HEADER = "x-stitchrec-arm"
VERSION_HEADER = "x-stitchrec-version"


class RoutingState(Protocol):
    """What ``choose`` reads of the server state (``serving.rpc.ServerState``)."""

    repo: ModelRepository
    traffic: TrafficTable
    metrics: Any


@dataclasses.dataclass(frozen=True)
class Route:
    """The version a request goes to (None: the highest live one) and its arm (``""``: none)."""

    version: int | None
    arm: str


def key_bytes(value: Any) -> bytes:
    """A split key value as the bytes hashed: bytes as they are, strings UTF-8, integers in
    decimal, floats by ``repr`` (integral floats as integers)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool | int):
        return str(int(value)).encode()
    return repr(value).encode()


def bucket(key: bytes) -> int:
    """The key's bucket in ``[0, BUCKETS)``: blake2b (8 bytes, big-endian) modulo BUCKETS."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % BUCKETS


def arm_of(split: Split, key: bytes) -> str:
    """The label ``key`` lands on under ``split`` (cumulative weights over the buckets)."""
    b = bucket(key)
    total = sum(w for _, w in split.weights)
    acc = 0.0
    for label, weight in split.weights:
        acc += weight
        if b < BUCKETS * acc / total:
            return label
    # not reached: the last cumulative share is exactly BUCKETS (the same sum, same order)
    return next(label for label, weight in reversed(split.weights) if weight > 0)


def _live_version(state: RoutingState, model: str, version: int, why: str) -> int:
    live = state.repo.live_versions(model)
    if version not in live:
        raise ServingError(
            grpc.StatusCode.UNAVAILABLE,
            f"model {model!r} {why} names version {version}, which is not ready; ready "
            f"versions: {live}",
        )
    return version


def _config(state: RoutingState, model: str) -> TrafficConfig | None:
    if model not in state.repo.model_names():
        state.repo.get(model)  # NOT_FOUND naming the models served
    return state.traffic.config(model)


def labelled(state: RoutingState, model: str, label: str) -> int:
    """The version ``label`` names, live or not (NOT_FOUND: the model has no such label)."""
    config = _config(state, model)
    labels = config.labels if config is not None else {}
    if label not in labels:
        shown = label if len(label) <= 64 else label[:64] + "..."
        raise ModelNotFound(
            f"model {model!r} has no version label {shown!r}; labels: "
            f"{sorted(labels) or 'none (no traffic.toml labels)'}"
        )
    return labels[label]


def label_version(state: RoutingState, model: str, label: str) -> int:
    """The live version ``label`` names (NOT_FOUND: no such label; UNAVAILABLE: not live)."""
    return _live_version(state, model, labelled(state, model, label), f"label {label!r}")


def split_source(state: RoutingState, model: str) -> Split | None:
    """The model's split (its key says where a caller reads the key value), or None."""
    if model not in state.repo.model_names():
        return None
    config = state.traffic.config(model)
    return None if config is None else config.split


def choose(
    state: RoutingState,
    model: str,
    version: int | None,
    label: str | None,
    key: bytes | str | int | float | None,
) -> Route:
    """The route of a request for ``model`` naming ``version`` and/or ``label`` (None or
    empty: not named), with the split key's value ``key`` (None: none; the request id is
    used). Sets the current call's arm; counts the arm."""
    if version:
        route = Route(version, "")
    elif label:
        route = Route(label_version(state, model, label), label)
    else:
        config = _config(state, model)
        if config is None or config.split is None:
            route = Route(None, "")
        else:
            info = current_call()
            if key is None:
                raw = info.request_id.encode() if info is not None else b""
            else:
                raw = key_bytes(key)
            arm = arm_of(config.split, raw)
            route = Route(_live_version(state, model, config.labels[arm], f"arm {arm!r}"), arm)
    info = current_call()
    if info is not None:
        info.arm = route.arm
    if route.arm:
        state.metrics.record_arm(model, route.arm)
    return route


def route(
    state: RoutingState,
    model: str,
    version: int | None,
    label: str | None,
    header: Callable[[str], Any],
    feature: Callable[[str], Any],
) -> Route:
    """``choose`` with the split key read where the model's split says: ``header(name)`` (the
    call's metadata or HTTP header) for a ``header:NAME`` key, else ``feature(name)`` (the
    request's first value of that feature; None when it has none). The key is read only when
    the request names neither a version nor a label."""
    key = None
    if not version and not label:
        split = split_source(state, model)
        if split is not None:
            key = header(split.header) if split.header else feature(split.key)
    return choose(state, model, version, label, key)


def first_value(values: np.ndarray | None) -> Any:
    """The first element of a decoded key input (None when there is none)."""
    if values is None:
        return None
    flat = np.asarray(values).reshape(-1)
    return flat[0] if flat.size else None
