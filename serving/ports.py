"""Binding a TCP port before a server takes it: ``bind_alone`` finds out whether any process
holds the port (a gRPC server binds with SO_REUSEPORT, which lets a second server share its port
without an error), ``bind_shared`` reserves it for processes that share it on purpose."""

from __future__ import annotations

import errno
import socket


def bind_alone(family: int, host: str, port: int) -> int:
    """Binds ``(host, port)`` without SO_REUSEPORT and releases it; returns the port (a free
    one for 0). Raises OSError where a process listens on the port or holds it bound, with
    SO_REUSEPORT or not; SO_REUSEADDR lets it pass a port with only closed connections of an
    earlier server (TIME_WAIT)."""
    with bound(family, host, port, (socket.SO_REUSEADDR,)) as alone:
        return alone.getsockname()[1]


def bind_shared(family: int, host: str, port: int) -> socket.socket:
    """A socket bound to ``(host, port)`` with SO_REUSEPORT. Closed connections (TIME_WAIT) of
    an earlier server without SO_REUSEPORT (``serve`` without ``--workers``) block that bind;
    then it is bound with SO_REUSEADDR as well, as the workers' listeners are."""
    try:
        return bound(family, host, port, (socket.SO_REUSEPORT,))
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
    return bound(family, host, port, (socket.SO_REUSEPORT, socket.SO_REUSEADDR))


def bound(family: int, host: str, port: int, options: tuple[int, ...]) -> socket.socket:
    """A socket with the SOL_SOCKET ``options`` set, bound to ``(host, port)``."""
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        for option in options:
            s.setsockopt(socket.SOL_SOCKET, option, 1)
        s.bind((host, port))
    except OSError:
        s.close()
        raise
    return s
