"""One measured cell of bench/serving: a throughput run (h2load, or the Python generator) or a
latency run (the recording Python generator), against one server."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from bench.serving import h2load
from bench.serving.loadgen import read_requests
from bench.serving.servers import ROOT, Proc, env


@dataclasses.dataclass(frozen=True)
class Plan:
    seconds: float
    warmup: float
    concurrency: int
    sizes: tuple[int, ...]
    swap_seconds: float
    repeats: int = 1
    connections: int = 4  # h2load -c; -m is concurrency / connections
    deadline: float = 10.0


def uptime() -> str:
    """The 1, 5 and 15 minute load averages (other processes on the machine inflate times)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def loadgen(port: int, method: str, requests: Path, plan: Plan, *, seconds: float | None = None,
            concurrency: int | None = None, rank_versions: bool = False,
            rate: float | None = None) -> dict:  # fmt: skip
    """The recording generator (its own process): OK req/s, latency per status code. ``rate``:
    open loop at that many requests/s (``concurrency`` then caps the calls in flight)."""
    cmd = [
        sys.executable, "-m", "bench.serving.loadgen", "--target", f"127.0.0.1:{port}",
        "--method", method, "--requests", str(requests),
        "--concurrency", str(concurrency or plan.concurrency), "--channels", "16",
        "--warmup", str(plan.warmup), "--seconds", str(seconds or plan.seconds),
        "--timeout", str(plan.deadline),
    ]  # fmt: skip
    if rank_versions:
        cmd.append("--rank-versions")
    if rate is not None:
        cmd += ["--rate", f"{rate:g}"]
    p = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"load generator failed: {p.stderr[-2000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out.update(driver="loadgen", load=uptime())
    return out


def _answers(proc: Proc) -> Counter:
    total: Counter = Counter()
    for mp in proc.metrics_ports:
        total.update(h2load.answer_counts(mp, proc.kind))
    return total


def throughput(proc: Proc, port: int, method: str, requests: Path, frame: Path, plan: Plan,
               h2load_bin: str | None, concurrency: int | None = None) -> dict:  # fmt: skip
    """req/s from h2load (the first request of ``requests`` on every stream) with the server's
    own answer counts by code; without h2load, the Python generator's figures."""
    c = concurrency or plan.concurrency
    if h2load_bin is None:
        out = loadgen(port, method, requests, plan, concurrency=c)
        out["answers"] = {k: v["count"] for k, v in out["by_code"].items()}
        return out
    before = _answers(proc)
    conns = min(plan.connections, c)
    out = h2load.run(port, method, frame, plan.seconds, plan.warmup, conns, max(1, c // conns),
                     h2load=h2load_bin)  # fmt: skip
    out["answers"] = h2load.diff(_answers(proc), before)
    # h2load resets the streams still open when its time is up: those end CANCELLED
    out["cancelled"] = out["answers"].get("CANCELLED", 0)
    out["failures"] = sum(v for k, v in out["answers"].items() if k not in ("OK", "CANCELLED"))
    out.update(driver="h2load", load=uptime())
    return out


def first_frame(requests: Path, frame: Path) -> Path:
    """The gRPC frame of the first message of a request file."""
    return h2load.write_frame(read_requests(str(requests))[0], frame)
