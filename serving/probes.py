"""Health probes answered by a process of their own, from the server's heartbeat.

A server's own health endpoints share its event loop and its interpreter lock: while the loop
receives a very large request, or under overload, a Kubernetes probe with a 1 s timeout can
fail on a server that is working, and the kubelet restarts it. ``stitchrec serve --probe-port
P`` adds a probe listener that cannot be held up that way:

* the server's event loop writes a **heartbeat** every ``BEAT_S`` seconds (``Heartbeat``: the
  time of the beat on the system's monotonic clock and whether the server is ready, 9 bytes in
  a memory-mapped file): a beat is written only when the loop runs, so its age is how long the
  loop has been held up;
* a **probe process** (``python -m serving.probes``; the standard library only, no TensorFlow)
  answers plain HTTP on port P from the heartbeat files: ``GET /v2/health/live`` is 200 while
  every heartbeat is younger than ``LIVE_AFTER_S``, and ``GET /v2/health/ready`` is 200 while
  every heartbeat is younger than ``READY_AFTER_S`` and says ready (the KServe JSON of the
  server's own endpoints: ``{"live": true}``, ``{"ready": false}``; else 503).

So a probe is answered in about a millisecond whatever the server is doing; a server whose
loop stops for good (a deadlock, a call that never returns) is not live after ``LIVE_AFTER_S``
seconds and is restarted, and one held up for more than ``READY_AFTER_S`` seconds, or not ready
(no model loaded, or stopping), gets no traffic until it is. With ``--workers N`` the
supervisor runs the probe process over its N workers' heartbeats: live and ready when all are.
The probe process exits when its standard input closes (the server or supervisor stopped or
died).
"""

from __future__ import annotations

import argparse
import json
import mmap
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

#: seconds between two beats of a server's event loop
BEAT_S = 0.1
#: a heartbeat older than this: the server is not live (restarted by a liveness probe)
LIVE_AFTER_S = 10.0
#: a heartbeat older than this: the server is not ready (no traffic until it beats again)
READY_AFTER_S = 2.0

_BEAT = struct.Struct("<d?")  # monotonic seconds, ready


class Heartbeat:
    """The heartbeat file at ``path`` (created), written by ``beat``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.write_bytes(_BEAT.pack(0.0, False))
        with open(self.path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), _BEAT.size)

    def beat(self, ready: bool) -> None:
        """Records a beat now, and whether the server is ready."""
        self._map[:] = _BEAT.pack(time.monotonic(), ready)

    def close(self) -> None:
        self._map.close()


def read_beat(path: str | Path) -> tuple[float, bool]:
    """(the age in seconds of the last beat in ``path``, its ready flag); ``(inf, False)``
    for a file without a beat. Two equal reads in a row: never a half-written beat."""
    try:
        with open(path, "rb") as f:
            last = f.read(_BEAT.size)
            while True:
                f.seek(0)
                now = f.read(_BEAT.size)
                if now == last:
                    break
                last = now
    except OSError:
        return float("inf"), False
    if len(last) != _BEAT.size:
        return float("inf"), False
    t, ready = _BEAT.unpack(last)
    return (time.monotonic() - t if t > 0 else float("inf")), ready


def health(paths: list[str]) -> tuple[bool, bool]:
    """(live, ready) over the heartbeat files ``paths``."""
    beats = [read_beat(p) for p in paths]
    live = all(age <= LIVE_AFTER_S for age, _ in beats)
    ready = all(age <= READY_AFTER_S and up for age, up in beats)
    return live, ready


def _handler(paths: list[str]) -> type[BaseHTTPRequestHandler]:
    class Probe(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a kubelet or load balancer reuses it
        disable_nagle_algorithm = True  # headers and body leave at once, no delayed-ACK wait

        def do_GET(self) -> None:
            live, ready = health(paths)
            if self.path == "/v2/health/live":
                self._answer(200 if live else 503, {"live": live})
            elif self.path == "/v2/health/ready":
                self._answer(200 if ready else 503, {"ready": ready})
            else:
                self._answer(404, {"error": f"no probe at {self.path}"})

        def _answer(self, status: int, body: dict) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a probe a second would flood the server's log

    return Probe


def serve(host: str, port: int, paths: list[str], remove: str | None = None) -> None:
    """Serves the probes on ``host:port`` (0: any free port), printing ``{"port": N}`` as the
    first line of standard output; returns when standard input closes (the parent stopped it
    or died), then removes the folder ``remove`` (the heartbeats' own) if given."""
    server = ThreadingHTTPServer((host, port), _handler(paths))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    sys.stdin.buffer.read()  # until the parent closes it (or dies)
    server.shutdown()
    server.server_close()
    if remove is not None:
        shutil.rmtree(remove, ignore_errors=True)


class ProbeProcess:
    """The probe process over the heartbeat files ``paths``, on ``host:port`` (0: a free
    port, then ``port`` is the one it bound). With ``remove`` (a folder: the heartbeats'),
    the process removes that folder when it ends, which it does when its parent stops it or
    dies, so a parent killed by SIGKILL leaves no folder behind."""

    def __init__(
        self, host: str, port: int, paths: list[str | Path], remove: str | Path | None = None
    ):
        argv = [sys.executable, "-m", "serving.probes", "--host", host, "--port", str(port)]
        for path in paths:
            argv += ["--heartbeat", str(path)]
        if remove is not None:
            argv += ["--remove-on-exit", str(remove)]
        self.process = subprocess.Popen(  # as the workers of --workers: the installed package
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        line = self.process.stdout.readline()
        try:
            self.port = int(json.loads(line)["port"])
        except (ValueError, KeyError, TypeError):
            self.stop()
            raise OSError(
                f"the probe listener did not start on {host}:{port} (is the port in use?)"
            ) from None

    def stop(self, timeout: float = 10.0) -> None:
        """Closes the process's input and waits for it (killed after ``timeout``)."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m serving.probes", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--heartbeat", action="append", required=True, help="a heartbeat file")
    p.add_argument("--remove-on-exit", help="a folder to remove when the process ends")
    args = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a stop is the parent's: it closes our input
    serve(args.host, args.port, args.heartbeat, args.remove_on_exit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
