"""h2load (nghttp2) as the throughput driver of bench/serving, and the servers' own counters.

h2load is a C HTTP/2 load generator: it drives a gRPC method with one pre-serialized request as
the body of every stream (a data file holding one gRPC frame: a 0 byte, the 4-byte big-endian
length, the message). It counts HTTP 200 as success even when the gRPC status in the trailers
is an error, so each cell also reads the server's Prometheus counters before and after
(StitchRec: ``stitchrec_requests_total{method,code}``; Triton:
``nv_inference_request_success`` / ``nv_inference_request_failure``) and reports OK and error
answers from them.

``ensure_h2load()`` finds ``h2load`` on PATH; when it is missing and the bench runs as root it
installs Debian's ``nghttp2-client`` with apt-get; otherwise it says how to install it and the
bench falls back to the Python load generator.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import urllib.request
from collections import Counter
from pathlib import Path

_FINISHED = re.compile(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s")
_REQUESTS = re.compile(
    r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
    r"(\d+) errored, (\d+) timeout"
)
_STATUS = re.compile(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx")
_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} ([0-9.eE+-]+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def ensure_h2load(log=print) -> str | None:
    """The path of h2load, installing nghttp2-client when missing and running as root; None
    (after saying why) when it cannot be had."""
    found = shutil.which("h2load")
    if found:
        return found
    if os.geteuid() != 0:
        log("h2load not found and not root: install it with `apt-get install nghttp2-client`; "
            "the bench uses the Python load generator for throughput instead")  # fmt: skip
        return None
    log("h2load not found: apt-get install -y -qq nghttp2-client")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "nghttp2-client"],
    ):
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            log(f"{' '.join(cmd)} failed ({p.stderr.strip()[-300:]}); using the Python generator")
            return None
    return shutil.which("h2load")


def write_frame(message: bytes, path: Path) -> Path:
    """One uncompressed gRPC length-prefixed message, the body h2load sends on every stream."""
    path.write_bytes(b"\x00" + struct.pack(">I", len(message)) + message)
    return path


def parse(text: str) -> dict:
    """req/s and request counts from h2load's summary."""
    fin = _FINISHED.search(text)
    req = _REQUESTS.search(text)
    if not fin or not req:
        raise RuntimeError(f"h2load printed no summary:\n{text[-1500:]}")
    secs = float(fin.group(1)) / (1000.0 if fin.group(2) == "ms" else 1.0)
    _total, _started, done, ok, failed, errored, timeout = (int(g) for g in req.groups())
    out = {
        "qps": float(fin.group(3)),
        "h2_seconds": secs,
        "h2_done": done,
        "h2_succeeded": ok,
        "h2_failed": failed,
        "h2_errored": errored,
        "h2_timeout": timeout,
    }
    st = _STATUS.search(text)
    if st:
        out["http_2xx"] = int(st.group(1))
        out["http_non_2xx"] = sum(int(g) for g in st.groups()[1:])
    return out


def run(
    port: int,
    method: str,
    frame: Path,
    seconds: float,
    warmup: float,
    connections: int,
    streams: int,
    threads: int = 1,
    h2load: str = "h2load",
) -> dict:
    """One timed h2load run of ``method`` (``-D seconds`` after ``--warm-up-time warmup``)."""
    cmd = [
        h2load, "-D", f"{int(seconds * 1000)}ms", "--warm-up-time", f"{int(warmup * 1000)}ms",
        "-c", str(connections), "-m", str(streams), "-t", str(threads),
        "-H", "content-type: application/grpc", "-H", "te: trailers", "-d", str(frame),
        f"http://127.0.0.1:{port}{method}",
    ]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + warmup + 120)
    if p.returncode != 0:
        raise RuntimeError(f"h2load failed ({p.returncode}): {(p.stdout + p.stderr)[-1500:]}")
    out = parse(p.stdout)
    out["concurrency"] = connections * streams
    return out


def run_h1(
    url: str,
    body: Path,
    seconds: float,
    warmup: float,
    connections: int,
    headers: dict[str, str],
    h2load: str = "h2load",
) -> dict:
    """One timed HTTP/1.1 h2load run (``--h1``): ``connections`` kept-alive connections, one
    request in flight on each, every request POSTing the file ``body``."""
    cmd = [
        h2load, "--h1", "-D", f"{int(seconds * 1000)}ms",
        "--warm-up-time", f"{int(warmup * 1000)}ms", "-c", str(connections), "-m", "1",
        "-t", "1", "-d", str(body),
        *[a for k, v in headers.items() for a in ("-H", f"{k}: {v}")], url,
    ]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + warmup + 120)
    if p.returncode != 0:
        raise RuntimeError(f"h2load failed ({p.returncode}): {(p.stdout + p.stderr)[-1500:]}")
    out = parse(p.stdout)
    out["concurrency"] = connections
    return out


def scrape(metrics_port: int) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text endpoint: (name, labels, value)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out.append((m.group(1), dict(_LABEL.findall(m.group(2))), float(m.group(3))))
    return out


def answer_counts(metrics_port: int, kind: str) -> Counter:
    """Answers so far by gRPC code (StitchRec, ``kind="stitchrec"``, every inference method) or
    by success/failure (Triton, ``kind="triton"``)."""
    counts: Counter = Counter()
    for name, labels, value in scrape(metrics_port):
        if kind == "stitchrec" and name == "stitchrec_requests_total":
            if labels.get("method") in ("Rank", "ModelInfer", "Predict"):
                counts[labels.get("code", "?")] += int(value)
        elif kind == "triton" and name == "nv_inference_request_success":
            counts["OK"] += int(value)
        elif kind == "triton" and name == "nv_inference_request_failure":
            counts["FAILED"] += int(value)
    return counts


def diff(after: Counter, before: Counter) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after if after[k] - before[k]}
