"""``stitchrec data-service dispatcher|worker``: the tf.data service servers of the TFRecord
training input (``features.tfrecord.service``), each run until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import json
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

from features.tfrecord.address import service_address
from features.tfrecord.service import check_reachable, start_dispatcher, start_worker, worker_port
from pipelines.errors import UsageError, check_output_path
from serving.ports import bind_alone


def _serve_until_signal(server: Any, role: str, address: str) -> int:
    """Prints ``{"data_service": role, "address": ...}`` and waits for SIGTERM or SIGINT;
    ``server`` stops as the process ends."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(json.dumps({"data_service": role, "address": address}), flush=True)
    while not stop.wait(0.5):  # the wait returns to the interpreter, which runs the handlers
        pass
    return 0  # ``server``, held until here, stops as the process ends


def _started(start: Callable[[], Any], role: str, port: int) -> Any:
    """``start()``, a server; a port it cannot listen on is a UsageError naming it. A port
    another process listens on is refused first: tf.data service's gRPC server binds with
    SO_REUSEPORT and would share it, the kernel handing each connection to either."""
    try:
        if port:
            bind_alone(socket.AF_INET, "", port)
        return start()
    except OSError as e:
        raise UsageError(
            f"--port {port}: the tf.data service {role} cannot listen on it ({e.strerror or e}); "
            "choose another, or 0 for any free port"
        ) from None
    except RuntimeError as e:  # "Could not start gRPC server"
        raise UsageError(
            f"--port {port}: the tf.data service {role} could not listen on it ({e}); is the "
            "port in use? Choose another, or 0 for any free port"
        ) from None


def cmd_dispatcher(args: argparse.Namespace) -> int:
    if args.work_dir:
        check_output_path(args.work_dir, "--work-dir")
    server = _started(lambda: start_dispatcher(args.port, args.work_dir), "dispatcher", args.port)
    return _serve_until_signal(server, "dispatcher", server.target)


def cmd_worker(args: argparse.Namespace) -> int:
    try:
        dispatcher = service_address(args.dispatcher)
    except ValueError as e:
        raise UsageError(f"--dispatcher: {e}") from None
    try:  # tf.data service's worker would wait for its dispatcher without end, deaf to SIGINT
        check_reachable(dispatcher)
    except ConnectionError as e:
        raise UsageError(f"--dispatcher: {e}") from None
    server = _started(lambda: start_worker(dispatcher, args.port, args.host), "worker", args.port)
    return _serve_until_signal(server, "worker", f"{args.host}:{worker_port(server)}")
