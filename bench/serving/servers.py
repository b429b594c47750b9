"""The servers of bench/serving as subprocesses: ``stitchrec serve`` and Triton (PyTriton).

Triton Inference Server 2.51 comes from nvidia-pytriton 0.7.0 in its own venv, made once from
/usr/bin/python3.11 under the bench cache (numpy<2, tensorflow-cpu 2.21), never the project's.
Every server serves Prometheus metrics; ``Proc.metrics_ports`` lists its endpoints (one: with
``--workers N`` the supervising process serves the workers' metrics added up).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

from protos import grpc_service_pb2 as kserve_pb2
from protos import grpc_service_pb2_grpc as kserve_grpc

ROOT = Path(__file__).resolve().parents[2]
TRITON_PYTHON = "/usr/bin/python3.11"
TRITON_REQUIREMENTS = ("nvidia-pytriton==0.7.0", "numpy<2", "tensorflow-cpu>=2.21,<2.22")
MODEL = "ctr"


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A server subprocess stopped with SIGTERM (then SIGKILL after 30 s)."""

    def __init__(self, cmd: list[str], log: Path, environ: dict[str, str] | None = None):
        self.log = log.open("w")
        self.p = subprocess.Popen(
            cmd, cwd=ROOT, env=environ or env(), stdout=subprocess.PIPE, stderr=self.log, text=True
        )
        self.metrics_ports: list[int] = []
        self.kind = "stitchrec"
        self.info: dict = {}
        self.http_port: int | None = None
        self.terminated = False

    def line(self, timeout: float = 300) -> dict:
        result: list[str] = []
        t = threading.Thread(target=lambda: result.append(self.p.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        if not result or not result[0]:
            raise RuntimeError(f"server did not start; see {self.log.name}")
        return json.loads(result[0])

    def terminate(self) -> None:
        """Sends SIGTERM once, without waiting (``stop`` waits)."""
        if self.p.poll() is None and not self.terminated:
            self.p.send_signal(signal.SIGTERM)
            self.terminated = True

    def stop(self) -> int:
        if self.p.poll() is None:
            self.terminate()
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()
        return self.p.returncode


def stop_all(procs: list[Proc]) -> None:
    """Stops servers together: SIGTERM to every one, then waits for each (``Proc.stop``)."""
    for p in procs:
        p.terminate()
    for p in procs:
        p.stop()


def launch_ours(repo: Path, out: Path, tag: str, extra: list[str], workers: int = 1) -> Proc:
    """Starts ``stitchrec serve`` on a free port with metrics on free ports without waiting for
    it (``wait_ours`` waits); several servers load at once this way. No drain period on stop
    (no load balancer reads a bench server's health); ``extra`` may set one."""
    cmd = [
        sys.executable, "-m", "pipelines.cli", "serve", "--repo", str(repo), "--host", "127.0.0.1",
        "--port", "0", "--workers", str(workers), "--log-level", "WARNING",
        "--metrics-port", "0", "--drain-seconds", "0", *extra,
    ]  # fmt: skip
    return Proc(cmd, out / f"server-{tag}.log")


def wait_ours(proc: Proc, workers: int = 1) -> int:
    """Waits until a ``launch_ours`` server serves: its gRPC port. ``proc.info`` is its
    ``{"serving": ...}`` line (``http_port`` among the keys with ``--http-port``)."""
    lines = [proc.line()]
    for _ in range(workers if workers > 1 else 0):
        lines.append(proc.line())  # each worker prints once it serves
    proc.metrics_ports = sorted({int(x["metrics_port"]) for x in lines if x.get("metrics_port")})
    proc.info = lines[0]
    return int(lines[0]["port"])


def start_ours(
    repo: Path, out: Path, tag: str, extra: list[str], workers: int = 1
) -> tuple[Proc, int]:
    """``stitchrec serve`` on a free port with metrics on free ports: (process, gRPC port)."""
    proc = launch_ours(repo, out, tag, extra, workers)
    return proc, wait_ours(proc, workers)


def _wait_kserve_ready(port: int, timeout: float) -> None:
    t0 = time.monotonic()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = kserve_grpc.GRPCInferenceServiceStub(ch)
        while time.monotonic() - t0 < timeout:
            try:
                if stub.ModelReady(kserve_pb2.ModelReadyRequest(name=MODEL), timeout=2).ready:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.5)
    raise RuntimeError(f"Triton not ready on port {port} after {timeout:.0f} s")


def triton_venv(cache: Path) -> Path:
    """The Triton venv (made once): /usr/bin/python3.11 + nvidia-pytriton 0.7.0, numpy<2, TF."""
    venv = cache / "pytriton-venv"
    marker = venv / ".stitchrec-ready"
    if marker.exists():
        return venv / "bin" / "python"
    if not Path(TRITON_PYTHON).exists():
        raise RuntimeError(f"{TRITON_PYTHON} not found (Triton's venv needs Python 3.11)")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([TRITON_PYTHON, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", *TRITON_REQUIREMENTS],
        check=True,
        timeout=1800,
    )
    marker.write_text("\n".join(TRITON_REQUIREMENTS))
    return venv / "bin" / "python"


def start_triton(python: Path, saved: Path, out: Path, tag: str) -> tuple[Proc, int]:
    """Triton serving ``saved`` as ``MODEL``: (process, gRPC port); ``proc.http_port`` is its
    HTTP (KServe v2 REST) port."""
    port, metrics, http = free_port(), free_port(), free_port()
    cmd = [
        str(python), str(ROOT / "bench" / "serving" / "triton_server.py"), "--model", str(saved),
        "--name", MODEL, "--grpc-port", str(port), "--http-port", str(http),
        "--metrics-port", str(metrics), "--max-batch-size", "4096",
        "--max-queue-delay-us", "500",
    ]  # fmt: skip
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = Proc(cmd, out / f"server-triton-{tag}.log", environ=environ)
    proc.metrics_ports, proc.kind, proc.http_port = [metrics], "triton", http
    try:
        _wait_kserve_ready(port, 300)
    except RuntimeError:
        proc.stop()
        raise
    return proc, port
