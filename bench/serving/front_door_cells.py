"""The measured cells of bench.serving.front_door: one load against one server, and the
server's own counters around it.

- ``http_latency``: the recording HTTP generator (``bench.serving.http_loadgen``, its own
  process): OK req/s, p50/p99 and answers by status;
- ``http_throughput``: h2load over HTTP/1.1 (``--h1``, one request in flight per connection);
  the answers by code come from the server's ``stitchrec_requests_total`` (``http.*`` methods)
  or Triton's success/failure counters, read before and after the cell;
- ``counter``: one Prometheus counter summed over label values (``stitchrec_shadow_total`` by
  outcome, ...).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from bench.serving import h2load
from bench.serving.drive import Plan, uptime
from bench.serving.loadgen import read_requests
from bench.serving.servers import ROOT, Proc, env

HTTP_METHODS = ("http.Rank", "http.ModelInfer", "http.Predict")


def http_latency(url: str, bodies: Path, headers: dict[str, str], plan: Plan,
                 seconds: float | None = None) -> dict:  # fmt: skip
    """The recording HTTP generator on ``url``: its summary (``bench.serving.loadgen`` shape)."""
    cmd = [
        sys.executable, "-m", "bench.serving.http_loadgen", "--url", url, "--bodies", str(bodies),
        "--concurrency", str(plan.concurrency), "--connections", str(min(plan.concurrency, 16)),
        "--warmup", str(plan.warmup), "--seconds", str(seconds or plan.seconds),
        "--timeout", str(plan.deadline),
        *[a for k, v in headers.items() for a in ("-H", f"{k}: {v}")],
    ]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"HTTP load generator failed: {p.stderr[-2000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out.update(driver="loadgen", load=uptime())
    return out


def http_answers(proc: Proc) -> Counter:
    """Inference answers so far by code: StitchRec's HTTP methods, or Triton's counters."""
    total: Counter = Counter()
    for port in proc.metrics_ports:
        if proc.kind == "triton":
            total.update(h2load.answer_counts(port, "triton"))
            continue
        for name, labels, value in h2load.scrape(port):
            if name == "stitchrec_requests_total" and labels.get("method") in HTTP_METHODS:
                total[labels.get("code", "?")] += int(value)
    return total


def http_throughput(proc: Proc, url: str, body: Path, headers: dict[str, str], plan: Plan,
                    h2: str) -> dict:  # fmt: skip
    """h2load --h1 with ``plan.concurrency`` connections POSTing ``body``: req/s and the
    server's answers by code (``failures``: answers that are not OK)."""
    before = http_answers(proc)
    out = h2load.run_h1(url, body, plan.seconds, plan.warmup, plan.concurrency,
                        {"Content-Type": "application/json", **headers}, h2load=h2)  # fmt: skip
    out["answers"] = h2load.diff(http_answers(proc), before)
    out["failures"] = sum(v for k, v in out["answers"].items() if k != "OK")
    out.update(driver="h2load", load=uptime())
    return out


def counter(proc: Proc, name: str, label: str) -> Counter:
    """The values of counter ``name`` (its ``_total`` sample) by ``label``, over the server's
    metrics endpoints."""
    total: Counter = Counter()
    for port in proc.metrics_ports:
        for sample, labels, value in h2load.scrape(port):
            if sample == name:
                total[labels.get(label, "?")] += int(value)
    return total


def first_body(bodies: Path, out: Path) -> Path:
    """The first body of a length-prefixed file, alone in ``out`` (h2load's ``-d``)."""
    out.write_bytes(read_requests(str(bodies))[0])
    return out
