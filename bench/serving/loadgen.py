"""A gRPC load generator (grpc.aio), closed or open loop, run as its own process.

    python -m bench.serving.loadgen --target 127.0.0.1:8500 --method /pkg.Svc/Method \\
        --requests reqs.bin --concurrency 64 --channels 4 --warmup 1 --seconds 5 [--rank-versions]
        [--rate R]

``--requests``: a file of pre-serialized request messages (each preceded by a 4-byte
little-endian length) sent round robin as raw bytes, so the generator spends no time encoding.
``concurrency`` streams each send a request, wait for the answer, and send the next one (closed
loop: the load follows the server's speed). With ``--rate R`` the load is open: request ``i`` is
due ``i / R`` seconds after the start whatever the answers, and its latency counts from that due
time, so a request that waits for a free stream (at most ``concurrency`` in flight) or for the
generator itself is charged the wait (no coordinated omission). Prints
one JSON object: requests/s of OK answers (goodput), their p50/p90/p99/max latency (ms) over
the measured window, failures by status code, ``by_code``: the count, share and p50/p99 latency
of every status code (OK included), and (with ``--rank-versions``) how many answers each model
version gave. ``--timeout`` is the deadline of every call (DEADLINE_EXCEEDED past it).

``--record FILE`` also writes the measured latencies (seconds), the window and the failures as
JSON; ``--summarize FILE`` prints the summary of such a record and sends nothing.
``--list-requests`` prints the messages of ``--requests`` (hex) and sends nothing.

It imports no TensorFlow and no project protos (only with ``--rank-versions``), so it can load
StitchRec and Triton servers alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import time
from collections import Counter

import grpc
import numpy as np


def read_requests(path: str) -> list[bytes]:
    with open(path, "rb") as f:
        data = f.read()
    out = []
    pos = 0
    while pos < len(data):
        (n,) = struct.unpack_from("<I", data, pos)
        out.append(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return out


def write_requests(path: str, messages: list[bytes]) -> None:
    with open(path, "wb") as f:
        for m in messages:
            f.write(struct.pack("<I", len(m)) + m)


def _ms(values: list[float], q: float) -> float:
    return round(float(np.percentile(np.array(values) * 1e3, q)), 3) if values else 0.0


def summarize(
    latencies: list[float],
    seconds: float,
    failures: Counter,
    failure_latencies: dict[str, list[float]] | None = None,
) -> dict:
    """requests/s and latency of the OK answers; counts, shares and (when recorded) p50/p99
    latency of every status code, OK included."""
    lat = np.array(latencies) * 1e3 if latencies else np.zeros(1)
    failure_latencies = failure_latencies or {}
    total = len(latencies) + sum(failures.values())
    by_code = {"OK": {"count": len(latencies), "p50_ms": _ms(latencies, 50),
                      "p99_ms": _ms(latencies, 99)}}  # fmt: skip
    for code, n in failures.items():
        ls = failure_latencies.get(code, [])
        by_code[code] = {"count": n, "p50_ms": _ms(ls, 50), "p99_ms": _ms(ls, 99)}
    for v in by_code.values():
        v["share"] = round(v["count"] / total, 4) if total else 0.0
    return {
        "requests": len(latencies),
        "seconds": round(seconds, 3),
        "qps": round(len(latencies) / seconds, 1) if seconds > 0 else 0.0,
        "p50_ms": round(float(np.percentile(lat, 50)), 3),
        "p90_ms": round(float(np.percentile(lat, 90)), 3),
        "p99_ms": round(float(np.percentile(lat, 99)), 3),
        "max_ms": round(float(lat.max()), 3),
        "failures": sum(failures.values()),
        "failures_by_code": dict(failures),
        "by_code": by_code,
    }


class _Load:
    """One run's calls, clock and tallies."""

    def __init__(self, args: argparse.Namespace, calls: list, decode) -> None:
        self.args, self.calls, self.decode = args, calls, decode
        self.requests = read_requests(args.requests)
        self.start = time.perf_counter()
        self.measure_from = self.start + args.warmup
        self.end = self.measure_from + args.seconds
        self.latencies: list[float] = []
        self.failures: Counter = Counter()
        self.failure_latencies: dict[str, list[float]] = {}
        self.versions: Counter = Counter()

    async def one(self, k: int, t0: float, call) -> None:
        """Request ``k`` (round robin over the messages) on ``call``, timed from ``t0``."""
        try:
            resp = await call(self.requests[k % len(self.requests)], timeout=self.args.timeout)
            t1 = time.perf_counter()
            if self.decode is not None:
                self.versions[self.decode(resp).model_version] += 1
            if t0 >= self.measure_from:
                self.latencies.append(t1 - t0)
        except grpc.aio.AioRpcError as e:
            if t0 >= self.measure_from or self.args.rank_versions:
                code = e.code().name
                self.failures[code] += 1
                self.failure_latencies.setdefault(code, []).append(time.perf_counter() - t0)

    async def closed_loop(self) -> None:
        async def stream(i: int) -> None:
            k, call = i, self.calls[i % len(self.calls)]
            while (t0 := time.perf_counter()) < self.end:
                await self.one(k, t0, call)
                k += 1

        await asyncio.gather(*[stream(i) for i in range(self.args.concurrency)])

    async def open_loop(self) -> None:
        free = asyncio.Semaphore(self.args.concurrency)
        tasks: set[asyncio.Task] = set()

        async def due(k: int, t0: float) -> None:
            async with free:  # the wait for a stream is charged to the request
                await self.one(k, t0, self.calls[k % len(self.calls)])

        k = 0
        while (t0 := self.start + k / self.args.rate) < self.end:
            delay = t0 - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(due(k, t0))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            k += 1
        await asyncio.gather(*tasks)


async def run(args: argparse.Namespace) -> dict:
    opts = [
        ("grpc.max_receive_message_length", 64 << 20),
        ("grpc.max_send_message_length", 64 << 20),
    ]
    # distinct channel args give distinct connections (spread over SO_REUSEPORT workers)
    channels = [
        grpc.aio.insecure_channel(args.target, options=[*opts, ("stitchrec.bench.channel", i)])
        for i in range(args.channels)
    ]
    decode = None
    if args.rank_versions:
        from protos import ranking_service_pb2

        decode = ranking_service_pb2.RankResponse.FromString
    load = _Load(args, [ch.unary_unary(args.method) for ch in channels], decode)
    await (load.closed_loop() if args.rate is None else load.open_loop())
    for ch in channels:
        await ch.close()
    # requests started in the measured window, over the window's length
    if args.record:
        record = {
            "latencies_s": load.latencies,
            "seconds": args.seconds,
            "failures_by_code": dict(load.failures),
            "failure_latencies_s": load.failure_latencies,
        }
        with open(args.record, "w") as f:
            json.dump(record, f)
    out = summarize(load.latencies, args.seconds, load.failures, load.failure_latencies)
    out["concurrency"] = args.concurrency
    if args.rate is not None:
        out["rate"] = args.rate
    if decode is not None:
        out["versions"] = {str(k): v for k, v in sorted(load.versions.items())}
    return out


def summarize_record(path: str) -> dict:
    """The summary of a ``--record`` file."""
    with open(path) as f:
        record = json.load(f)
    return summarize(
        record["latencies_s"],
        record["seconds"],
        Counter(record.get("failures_by_code", {})),
        record.get("failure_latencies_s"),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target")
    p.add_argument("--method", help="full method path, e.g. /pkg.Service/Method")
    p.add_argument("--requests", help="file of length-prefixed request messages")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--channels", type=int, default=4)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--rank-versions", action="store_true")
    p.add_argument("--rate", type=float, help="open loop: requests per second (default: closed)")
    p.add_argument("--record", help="also write the measured latencies and failures (JSON)")
    p.add_argument("--summarize", metavar="RECORD", help="summarise a --record file; no load")
    p.add_argument("--list-requests", action="store_true", help="print --requests (hex); no load")
    args = p.parse_args(argv)
    if args.summarize:
        out = summarize_record(args.summarize)
    elif args.list_requests:
        if not args.requests:
            p.error("--list-requests needs --requests")
        out = {"messages": [m.hex() for m in read_requests(args.requests)]}
    else:
        missing = [f"--{k}" for k in ("target", "method", "requests") if not getattr(args, k)]
        if missing:
            p.error(f"the load needs {', '.join(missing)}")
        if args.rate is not None and not args.rate > 0:
            p.error(f"--rate must be > 0 requests per second, got {args.rate:g}")
        out = asyncio.run(run(args))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
