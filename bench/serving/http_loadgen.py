"""A closed-loop HTTP/1.1 load generator (aiohttp), run as its own process.

    python -m bench.serving.http_loadgen --url http://127.0.0.1:8080/v1/rank/ctr \\
        --bodies bodies.bin [-H "Inference-Header-Content-Length: 1128"] --concurrency 64 \\
        --connections 16 --warmup 1 --seconds 5

``--bodies``: a file of request bodies (each preceded by a 4-byte little-endian length,
``bench.serving.loadgen.write_requests``) POSTed round robin as raw bytes with
``Content-Type: application/json`` (or ``--content-type``) and the ``-H`` headers.
``concurrency`` workers each send a request, read the whole answer, and send the next one, over
at most ``--connections`` kept-alive connections. Prints one JSON object in the shape of
``bench.serving.loadgen``'s: requests/s of HTTP 200 answers, their p50/p90/p99/max latency (ms)
in the measured window (requests started after ``--warmup`` and before its end), and
``by_code`` (``OK`` for 200, ``HTTP_<status>`` for other answers, ``ERROR_<exception>`` for
calls that got none). It imports no TensorFlow and no project code, so it loads StitchRec and
Triton alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter

import aiohttp

from bench.serving.loadgen import read_requests, summarize


def _headers(pairs: list[str], content_type: str) -> dict[str, str]:
    out = {"Content-Type": content_type}
    for pair in pairs:
        name, sep, value = pair.partition(":")
        if not sep:
            raise SystemExit(f"error: -H {pair!r}: expected 'Name: value'")
        out[name.strip()] = value.strip()
    return out


async def run(args: argparse.Namespace) -> dict:
    bodies = read_requests(args.bodies)
    headers = _headers(args.header, args.content_type)
    connector = aiohttp.TCPConnector(limit=args.connections)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    start = time.perf_counter()
    measure_from = start + args.warmup
    end = measure_from + args.seconds
    latencies: list[float] = []
    failures: Counter = Counter()
    failure_latencies: dict[str, list[float]] = {}

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker(i: int) -> None:
            k = i
            while True:
                t0 = time.perf_counter()
                if t0 >= end:
                    return
                body = bodies[k % len(bodies)]
                k += 1
                try:
                    async with session.post(args.url, data=body, headers=headers) as resp:
                        await resp.read()
                        code = "OK" if resp.status == 200 else f"HTTP_{resp.status}"
                except (TimeoutError, aiohttp.ClientError) as e:
                    code = f"ERROR_{type(e).__name__}"
                t1 = time.perf_counter()
                if t0 < measure_from:
                    continue
                if code == "OK":
                    latencies.append(t1 - t0)
                else:
                    failures[code] += 1
                    failure_latencies.setdefault(code, []).append(t1 - t0)

        await asyncio.gather(*[worker(i) for i in range(args.concurrency)])
    out = summarize(latencies, args.seconds, failures, failure_latencies)
    out["concurrency"] = args.concurrency
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--bodies", required=True, help="file of length-prefixed request bodies")
    p.add_argument("-H", "--header", action="append", default=[], help="'Name: value'")
    p.add_argument("--content-type", default="application/json")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--timeout", type=float, default=10.0)
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(run(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
