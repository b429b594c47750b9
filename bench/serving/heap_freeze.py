"""What freezing the heap after model-version changes (``serving.repository.freeze_heap``)
does to a loaded server.

    .venv/bin/python -m bench.serving.heap_freeze [--model bench|linear] [--repeats 3]
        [--seconds 4] [--candidates 100] [--trace-rates 0,0.1] [--json F]

For each trace setting (``0``: tracing off; a rate: ``--otlp-endpoint`` to an OTLP receiver in
this process with ``--trace-sample-rate``), two servers are started one at a time in turn, the
default one (heap frozen) and one with ``--no-heap-freeze``, the order reversed every other
repeat; each takes gRPC Rank calls of ``--candidates`` candidates, 32 in flight, from
``bench.serving.loadgen`` in its own process. Prints, per setting and repeat, the frozen
server's req/s and p99 divided by the unfrozen one's, then their range; ``--json`` writes every
cell.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from bench.serving import drive, models
from bench.serving.drive import Plan, uptime
from bench.serving.otlp_sink import OtlpSink
from bench.serving.servers import MODEL, launch_ours, wait_ours

RANK = "/stitchrec.serving.RankingService/Rank"
BATCHING = ["--max-queue-delay-us", "500", "--max-batch-size", "4096", "--poll-seconds", "0"]
VARIANTS = {"frozen": [], "unfrozen": ["--no-heap-freeze"]}


def cell(repo: Path, out: Path, tag: str, flags: list[str], requests: Path, plan: Plan) -> dict:
    """One server with ``flags`` under load: loadgen's figures."""
    proc = launch_ours(repo, out, tag, [*BATCHING, *flags])
    try:
        return drive.loadgen(wait_ours(proc), RANK, requests, plan)
    finally:
        proc.stop()


def run(args: argparse.Namespace, work: Path) -> list[dict]:
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    if args.model == "bench":
        saved, test = models.build_bench_model(cache, args.rows)
    else:
        saved, test = models.build_linear_model(cache)
    repo = work / "repo"
    shutil.copytree(saved, repo / MODEL / "1")
    requests = models.make_requests(saved, test, args.candidates, 32, work)["paths"]["rank"]
    plan = Plan(args.seconds, args.warmup, 32, (args.candidates,), 0.0)
    sink = OtlpSink()
    rows: list[dict] = []
    try:
        for rate in args.trace_rates:
            trace = ["--otlp-endpoint", sink.endpoint, "--trace-sample-rate", str(rate)]
            for rep in range(args.repeats):
                names = list(VARIANTS) if rep % 2 == 0 else list(VARIANTS)[::-1]
                for name in names:
                    flags = [*VARIANTS[name], *(trace if rate > 0 else [])]
                    r = cell(repo, work, f"{name}-{rate}", flags, requests, plan)
                    rows.append({"variant": name, "trace_rate": rate, "repeat": rep, **r})
                    print(f"trace {rate} repeat {rep} {name}: {r['requests']} calls, "
                          f"p99 {r['p99_ms']:.2f} ms (load {uptime()})", flush=True)  # fmt: skip
    finally:
        sink.stop()
    return rows


def ratios(rows: list[dict]) -> dict[float, list[dict]]:
    """Per trace rate and repeat: frozen / unfrozen req/s (calls in the same seconds) and p99."""
    out: dict[float, list[dict]] = {}
    for r in rows:
        if r["variant"] != "frozen":
            continue
        (base,) = [
            b
            for b in rows
            if b["variant"] == "unfrozen"
            and (b["trace_rate"], b["repeat"]) == (r["trace_rate"], r["repeat"])
        ]
        out.setdefault(r["trace_rate"], []).append(
            {"rps": r["requests"] / base["requests"], "p99": r["p99_ms"] / base["p99_ms"]}
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("bench", "linear"), default="bench")
    p.add_argument("--rows", type=int, default=20_000, help="synthetic rows of the bench model")
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "stitchrec-bench-serving"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--candidates", type=int, default=100)
    p.add_argument("--trace-rates", default="0,0.1", help="comma-separated; 0: tracing off")
    p.add_argument("--json", default="", help="write every cell and the ratios here")
    args = p.parse_args(argv)
    args.trace_rates = [float(x) for x in args.trace_rates.split(",")]
    with tempfile.TemporaryDirectory(prefix="heap-freeze-") as tmp:
        rows = run(args, Path(tmp))
    result = {"rows": rows, "ratios": {str(k): v for k, v in ratios(rows).items()}}
    print("| trace rate | req/s frozen / unfrozen per repeat | p99 frozen / unfrozen per repeat |")
    print("|---|---|---|")
    for rate, cells in ratios(rows).items():
        rps = ", ".join(f"{c['rps']:.3f}" for c in cells)
        p99 = ", ".join(f"{c['p99']:.3f}" for c in cells)
        print(f"| {rate:g} | {rps} | {p99} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
