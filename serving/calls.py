"""The call being served, and the observers told of every scored call.

Each inference call (gRPC or HTTP) starts a ``CallInfo`` (``start_call``): its request id (the
client's ``x-request-id`` when it sends one, else a fresh one), the protocol and, once traffic
routing has chosen one, the arm. It lives in a context variable, so the code that scores the
call reads it without it being passed down.

Once a call is scored, ``serving.inference.run`` hands a ``ScoredCall`` (the call, the model
version, the checked input features and every output) to the server's ``CallObservers``: the
prediction log and shadow traffic are observers. An observer runs on the event loop and must not
block (put the work on a queue); one that raises is logged and the call is answered all the same.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping

import numpy as np

log = logging.getLogger("stitchrec.serving.calls")

REQUEST_ID_HEADER = "x-request-id"
# a client's request id is kept when it is at most this long and printable ASCII; else replaced
MAX_REQUEST_ID_CHARS = 128
_PRINTABLE = re.compile(r"^[\x21-\x7e]+$")


@dataclasses.dataclass
class CallInfo:
    """One inference call: request id, protocol (``grpc`` or ``http``), the traffic arm chosen
    for it (``""``: none), its start time (``time.time()``), when tracing is on its trace id
    (32 hex digits, set by ``serving.tracing.call_span``; ``""``: none) and the version that
    answered it (set by the service once it has an answer; None before)."""

    request_id: str
    protocol: str
    arm: str = ""
    started: float = dataclasses.field(default_factory=time.time)
    trace_id: str = ""
    version: int | None = None


@dataclasses.dataclass(frozen=True)
class ScoredCall:
    """What a scored call hands the observers.

    ``features``: the checked inputs, ``{name: [rows]}`` (raw strings as bytes, numbers as
    numpy); ``outputs``: ``{name: [rows, ...]}``. ``shadow`` is True for a call mirrored to a
    shadow version, whose answer is never returned to the client.
    """

    request_id: str
    timestamp: float
    protocol: str
    model: str
    version: int
    signature: str
    arm: str
    shadow: bool
    features: Mapping[str, np.ndarray]
    outputs: Mapping[str, np.ndarray]


_current: contextvars.ContextVar[CallInfo | None] = contextvars.ContextVar(
    "stitchrec_call", default=None
)


def clean_request_id(value: str | bytes | None) -> str:
    """The client's request id when it is usable (1 to ``MAX_REQUEST_ID_CHARS`` printable ASCII
    characters), else a fresh random one (32 hex digits)."""
    if isinstance(value, bytes):
        value = value.decode("ascii", errors="replace")
    if value and len(value) <= MAX_REQUEST_ID_CHARS and _PRINTABLE.match(value):
        return value
    return uuid.uuid4().hex


def start_call(protocol: str, request_id: str | bytes | None = None) -> CallInfo:
    """Starts the current call (see ``clean_request_id`` for the id) and returns it."""
    info = CallInfo(clean_request_id(request_id), protocol)
    _current.set(info)
    return info


def current_call() -> CallInfo | None:
    """The call being served in this context, or None outside a call."""
    return _current.get()


Observer = Callable[[ScoredCall], None]


class CallObservers:
    """The functions told of every scored call, in the order they were added."""

    def __init__(self) -> None:
        self._observers: list[Observer] = []

    def add(self, observer: Observer) -> None:
        self._observers.append(observer)

    def __bool__(self) -> bool:
        return bool(self._observers)

    def notify(self, call: ScoredCall) -> None:
        """Tells every observer; one that raises is logged and the others still run."""
        for observer in self._observers:
            try:
                observer(call)
            except Exception:
                log.exception(
                    json.dumps(
                        {"event": "observer_error", "observer": getattr(observer, "__name__", "")}
                    )
                )
