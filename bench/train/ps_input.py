"""A local parameter-server cluster of ``stitchrec train`` (chief, workers, ps on 127.0.0.1),
sampled from outside while the chief trains: examples/s, and each task's CPU seconds
(user + system) and bytes read (``rchar`` of ``/proc/<pid>/io``, psutil's ``read_chars``) between the
chief's first and last step lines (statistics, the conversion, the functions' tracing before
the first logged step and the test evaluation are outside that window)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from bench.cluster import ROOT, cluster_tf_configs, report, train_command

_PLAN = re.compile(r"training \S+ on [\d,]+ rows: \d+ epoch\(s\) x (\d+) steps")


def _sample(pid: int) -> tuple[float, int]:
    """(CPU seconds, rchar) of process ``pid``."""
    p = psutil.Process(pid)
    cpu = p.cpu_times()
    return cpu.user + cpu.system, p.io_counters().read_chars


def _wait_line(log: Path, pattern: str | re.Pattern, chief: subprocess.Popen, timeout: float):
    """The first match of ``pattern`` in ``log``, waiting for it (the chief must be alive)."""
    t0 = time.time()
    while True:
        text = log.read_text() if log.exists() else ""
        m = re.search(pattern, text)
        if m:
            return m
        if chief.poll() is not None or time.time() - t0 > timeout:
            raise RuntimeError(f"no {pattern!r} in {log}:\n{text[-3000:]}")
        time.sleep(0.02)


def run_ps(config: Path, out: Path, workers: int, ps: int, timeout: float) -> dict[str, Any]:
    """``stitchrec train`` as ``ps`` ps tasks, ``workers`` workers and a chief; the chief's report
    plus the CPU seconds and bytes read of every task over the training window."""
    configs = cluster_tf_configs(workers, ps)
    names = [f"ps-{i}" for i in range(ps)] + [f"worker-{i}" for i in range(workers)] + ["chief"]
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    logs = {n: out.parent / f"{out.name}-{n}.log" for n in names}
    procs: dict[str, subprocess.Popen] = {}
    t0 = time.time()
    try:
        for name, tf_config in zip(names, configs, strict=True):
            procs[name] = subprocess.Popen(
                train_command(config, out), cwd=ROOT, env=dict(env, TF_CONFIG=tf_config),
                stdout=logs[name].open("w"), stderr=subprocess.STDOUT,
            )  # fmt: skip
        chief = procs["chief"]
        steps = int(_wait_line(logs["chief"], _PLAN, chief, timeout).group(1))
        first = int(_wait_line(logs["chief"], rf"step (\d+)/{steps} ", chief, timeout).group(1))
        before = {n: _sample(p.pid) for n, p in procs.items()}
        _wait_line(logs["chief"], rf"step {steps}/{steps} ", chief, timeout)
        after = {n: _sample(p.pid) for n, p in procs.items()}
        codes = {
            n: p.wait(timeout=max(1.0, timeout - (time.time() - t0))) for n, p in procs.items()
        }
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    if set(codes.values()) != {0}:
        raise RuntimeError(f"{out.name}: exit codes {codes}; see {out.parent}/{out.name}-*.log")
    window = {
        n: {"cpu_s": round(after[n][0] - before[n][0], 2), "rchar": after[n][1] - before[n][1]}
        for n in names
    }
    return report(out, t0, workers=workers, ps=ps, window_steps=[first, steps], tasks=window)
