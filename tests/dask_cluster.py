"""A real Dask distributed cluster on 127.0.0.1 for the tests: a scheduler and workers started as
processes (``python -m distributed.cli.dask_scheduler`` / ``dask_worker``, each worker under a
nanny that starts it again when it dies), as a user starts one on machines of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from distributed import Client, get_worker

ROOT = Path(__file__).resolve().parents[1]
BLOCK_BYTES = 64 << 20  # block_of's result
STOP_WAIT_S = 5.0


@dataclass
class DaskCluster:
    """A running cluster: its scheduler's address and its processes."""

    address: str
    processes: list[subprocess.Popen] = field(default_factory=list)

    def worker_pids(self) -> list[int]:
        """The process ids of the worker processes (not their nannies)."""
        with Client(self.address, timeout="10s") as client:
            return sorted(client.run(os.getpid).values())

    def stop(self) -> None:
        """SIGTERM to every process, SIGKILL to those still running 5 s later (a nanny that
        is starting a worker again does not stop on SIGTERM)."""
        for p in reversed(self.processes):
            p.terminate()
        deadline = time.monotonic() + STOP_WAIT_S
        for p in self.processes:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def start_cluster(folder: Path, workers: int = 2, allowed_failures: int = 3) -> DaskCluster:
    """Starts a scheduler and ``workers`` single-threaded workers; returns once every worker
    has joined. ``allowed_failures``: deaths of a task's workers before the task fails."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": str(allowed_failures),
        "DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON__MALLOC_TRIM_THRESHOLD_": "None",
    }
    scheduler_file = folder / "scheduler.json"
    py = sys.executable
    cluster = DaskCluster("")
    log = (folder / "cluster.log").open("wb")
    cluster.processes.append(
        subprocess.Popen(
            [
                *(py, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1"),
                *("--port", "0", "--dashboard-address", "127.0.0.1:0"),
                *("--scheduler-file", str(scheduler_file)),
            ],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    )
    cluster.address = _address(scheduler_file)
    for _ in range(workers):
        cluster.processes.append(
            subprocess.Popen(
                [
                    *(py, "-m", "distributed.cli.dask_worker", cluster.address),
                    *("--host", "127.0.0.1", "--nthreads", "1", "--nworkers", "1"),
                    "--no-dashboard",
                ],
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    with Client(cluster.address, timeout="30s") as client:
        client.wait_for_workers(workers, timeout=120)
    return cluster


def _address(scheduler_file: Path, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads(scheduler_file.read_text())["address"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            time.sleep(0.1)
    raise TimeoutError(f"the Dask scheduler wrote no {scheduler_file} in {timeout:g}s")


EXIT_AFTER_S = 1.0


def exit_process(_: object) -> None:
    """A task that kills the worker process running it (a crash no retry gets past), after
    ``EXIT_AFTER_S``: a worker registers with the scheduler (and gets tasks) just before its
    nanny has finished starting it, and a nanny whose worker dies in that gap gives up instead
    of starting it again, leaving the cluster without workers."""
    time.sleep(EXIT_AFTER_S)
    os._exit(1)


def logged_task(i: int, log: str) -> tuple[str, list[int]]:
    """A task of ``map_reduce`` that takes 0.1 s; its result carries ``log`` to the merges."""
    time.sleep(0.1)
    return log, [i]


def logged_merge(a: tuple[str, list[int]], b: tuple[str, list[int]]) -> tuple[str, list[int]]:
    """A merge of ``logged_task`` results that appends to their log how many results the
    worker running it holds in memory."""
    with open(a[0], "a") as f:
        f.write(f"{len(get_worker().data)}\n")
    return a[0], a[1] + b[1]


def ranges_merge(a: tuple[str, list[int]], b: tuple[str, list[int]]) -> tuple[str, list[int]]:
    """A merge of ``logged_task`` results that appends to their log the first and last items
    of each side: ``a_first a_last b_first b_last``."""
    with open(a[0], "a") as f:
        f.write(f"{a[1][0]} {a[1][-1]} {b[1][0]} {b[1][-1]}\n")
    return a[0], a[1] + b[1]


def block_of(i: int) -> bytes:
    """A task whose result is ``BLOCK_BYTES`` bytes: a transfer of a tenth of a second or more."""
    return bytes([i % 256]) * BLOCK_BYTES


def join_blocks(a: bytes, b: bytes) -> bytes:
    return a + b
