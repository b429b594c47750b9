"""Where a StitchRec server's time goes under load: py-spy samples it while h2load drives it.

    .venv/bin/python -m bench.serving.profile [--model bench|demo|linear] [--protocol rank]
        [--candidates 100] [--seconds 10] [--out runs/bench-serving-profile]

Starts ``stitchrec serve`` (dynamic batcher, 500 us window) on the model, drives one method with
h2load (64 streams over 4 connections) and records the server process with ``py-spy record
--format raw --gil --function`` (only samples of the thread holding the GIL, so the share of
samples to the sampling rate times the duration is how busy the GIL was). Prints the functions with the most samples
at the top of the stack (self) and anywhere on it (inclusive), as shares of all samples, and
writes the collapsed stacks to ``--out``. py-spy comes from PyPI (``pip install py-spy``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from bench.serving import drive, h2load
from bench.serving.__main__ import METHODS, prepare
from bench.serving.servers import start_ours

RATE = 100  # samples/s
GENERIC = ("threading.py", "runpy", "asyncio/", "pipelines/cli.py", "pipelines/serve.py",
           "concurrent/futures")  # fmt: skip


def top(collapsed: str, k: int = 15) -> dict[str, list[tuple[str, float]]]:
    """Self and inclusive shares of the frames of py-spy's collapsed stacks
    (``frame;frame;... count`` lines)."""
    self_c: Counter = Counter()
    incl: Counter = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        total += int(n)
        self_c[frames[-1]] += int(n)
        for f in set(frames[1:]):  # the first frame is the process/thread name
            if not any(g in f for g in GENERIC):
                incl[f] += int(n)
    share = lambda c: [(f, round(v / total, 4)) for f, v in c.most_common(k)]  # noqa: E731
    return {"samples": total, "self": share(self_c), "inclusive": share(incl)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="bench")
    p.add_argument("--protocol", default="rank", choices=list(METHODS))
    p.add_argument("--candidates", type=int, default=100)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--out", default="runs/bench-serving-profile")
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "stitchrec-bench-serving"))
    p.add_argument("--saved-model", default=None)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--demo-rows", type=int, default=2_000_000)
    args = p.parse_args(argv)
    spy, h2 = shutil.which("py-spy"), h2load.ensure_h2load()
    if spy is None or h2 is None:
        print("error: the profile needs py-spy (pip install py-spy) and h2load", file=sys.stderr)
        return 2
    out, cache = Path(args.out), Path(args.cache)
    out.mkdir(parents=True, exist_ok=True)
    plan = drive.Plan(seconds=args.seconds + 2, warmup=1.0, concurrency=64,
                      sizes=(args.candidates,), swap_seconds=0)  # fmt: skip
    m = prepare(args.model, args, plan, out, cache)
    proc, port = start_ours(m.repo, out, "profile", ["--max-queue-delay-us", "500"])
    raw = out / "py-spy.txt"
    try:
        rec = subprocess.Popen([spy, "record", "--pid", str(proc.p.pid), "--duration",
                                str(int(args.seconds)), "--format", "raw", "--output", str(raw),
                                "--nonblocking", "--gil", "--function", "--rate", str(RATE)])  # fmt: skip
        n = args.candidates
        r = drive.throughput(proc, port, METHODS[args.protocol], m.reqs[n]["paths"][args.protocol],
                             m.frames[args.protocol, n], plan, h2)  # fmt: skip
        rec.wait(timeout=args.seconds + 60)
    finally:
        proc.stop()
    print(f"{args.model} {args.protocol} N={n}: {r['qps']:.0f} req/s under py-spy "
          f"(load {r['load']})")  # fmt: skip
    t = top(raw.read_text())
    busy = t["samples"] / (RATE * int(args.seconds))
    print(f"{t['samples']} samples holding the GIL: the GIL was held {busy:.0%} of the time")
    for kind in ("self", "inclusive"):
        print(f"\n{kind}:")
        for f, s in t[kind]:
            print(f"  {s * 100:5.1f}%  {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
