"""Drops TensorFlow's start-up noise from the ``stitchrec`` process's standard error.

TensorFlow's C++ layer logs a few lines before its log level takes effect (absl's "before
InitializeLog" banner, cudart's "Could not find cuda drivers" and the cuInit failure of a CPU-only
machine, and, on CPUs where oneDNN is on by default, its "oneDNN custom operations are on" notice,
once per process that loads TensorFlow); ``TF_CPP_MIN_LOG_LEVEL`` (set by the packages) silences everything logged after them.
gRPC's C++ layer logs a port it cannot bind; the command's ``error:`` line says the same with
the reason, so that line is dropped too.
``filtered_stderr`` routes file descriptor 2 through a pipe and copies every line to the real
standard error except those that match ``NOISE``, so a user sees the command's own output and its
``error:`` line, and nothing else is lost. Only the console entry point uses it: code that calls
``pipelines.cli.main`` itself (tests, notebooks) keeps its standard error as it is.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import sys
import threading
from collections.abc import Iterator

NOISE = (
    re.compile(
        rb"^WARNING: All log messages before absl::InitializeLog\(\) is called are written "
    ),
    re.compile(rb"^I\d{4} [\d:. ]+\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers "),
    re.compile(rb"^E\d{4} [\d:. ]+\d+ cuda_platform\.cc:\d+\] failed call to cuInit: "),
    re.compile(rb"^I\d{4} [\d:. ]+\d+ port\.cc:\d+\] oneDNN custom operations are on\. "),
    # gRPC's log of a port it cannot bind: the command's own error line says it, with the reason
    re.compile(rb"^E\d{4} [\d:. ]+\d+ add_port\.cc:\d+\] Failed to add port to server: "),
)


_POLL_S = 0.05  # seconds the copier waits for data before it looks at its stop flag


def is_noise(line: bytes) -> bool:
    """True for a start-up line of TensorFlow's C++ layer that ``filtered_stderr`` drops."""
    return any(p.match(line) for p in NOISE)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _copy(source: int, sink: int, stop: threading.Event) -> None:
    """Copies the pipe's lines to ``sink`` but the noise, until the pipe ends or, once ``stop``
    is set, until nothing more is waiting in it (a child process that inherited the pipe keeps
    it open; what it writes later is not copied)."""
    with os.fdopen(source, "rb", buffering=0) as pipe:
        pending = b""
        while True:
            # ``stop`` read before the wait: once it is set, the block's writes are all in the
            # pipe, so an empty wait means nothing is left (read after the wait, a write between
            # the two would be lost)
            stopping = stop.is_set()
            ready, _, _ = select.select([pipe], [], [], 0 if stopping else _POLL_S)
            if not ready:
                if stopping:
                    break
                continue
            chunk = pipe.read(65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            kept = b"".join(line + b"\n" for line in lines if not is_noise(line))
            if kept:
                _write_all(sink, kept)
        if pending and not is_noise(pending):
            _write_all(sink, pending)


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
    """Within the block, file descriptor 2 (Python's ``sys.stderr`` and C++ logging alike) goes
    through the filter; on exit everything written is flushed to the real standard error."""
    sys.stderr.flush()
    real = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    stop = threading.Event()
    # a daemon: child processes that inherited the pipe must not keep this one alive
    copier = threading.Thread(target=_copy, args=(read_end, real, stop), daemon=True)
    copier.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(real, 2)
        stop.set()  # the block's writes are in the pipe: drained, then the copier ends
        copier.join(timeout=5)
        os.close(real)
