"""bench/serving/front_door: the HTTP front door, its logs, tracing and shadow traffic, measured.

    .venv/bin/python -m bench.serving.front_door --out runs/bench-front-door            # full
    .venv/bin/python -m bench.serving.front_door --quick --out runs/bench-front-door-quick

All in one run, on the bench model (``--model``: ``bench``, DCN-v2 12 fields, or ``linear``),
one user and N = 1 and 100 candidates per request; every figure is a ratio against a baseline
measured in the same run, with the load average beside every cell:

1. ``protocols``: one ``stitchrec serve --http-port 0`` (dynamic batcher, 500 us window):
   gRPC Rank, HTTP ``/v1/rank/{m}`` JSON, KServe v2 REST ``/infer`` JSON and binary, TF Serving
   REST ``:predict`` columnar. Each cell twice: throughput (h2load, HTTP/2 for gRPC and
   ``--h1`` for HTTP, answers counted by the server's own metrics) and latency (the recording
   closed-loop clients ``bench.serving.loadgen`` and ``bench.serving.http_loadgen``: OK req/s,
   p50, p99). Ratios against gRPC Rank at the same N.
2. ``triton``: Triton Inference Server (nvidia-pytriton 0.7.0 in its own venv under
   ``--cache``) on the same SavedModel, its HTTP KServe v2 ``/v2/models/{m}/infer`` JSON, against
   ours at the same N (``--no-triton`` skips it).
3. ``overheads``: gRPC Rank at the largest N against five servers loaded at once: ``base``,
   ``log-10%`` (``--log-dir D --log-rate 0.1``), ``trace-1.0``, ``trace-1.0-call`` (the same
   with ``--trace-detail call``) and ``trace-0.1`` (``--otlp-endpoint`` to an OTLP/gRPC
   receiver in this process, ``bench.serving.otlp_sink``, that counts the spans;
   ``--trace-sample-rate``). Repeats interleave the servers (order
   reversed every other repeat); each variant's p99 and req/s are divided by the base's of the
   same repeat.
4. ``shadow``: versions 2 (the model) and 1 (``http_bodies.build_slow_model``: the same scores
   after extra dense layers) served with ``--version-policy all``; one server has
   ``traffic.toml`` ``[shadow] version = 1, fraction = 1.0``, the other none. The primary's
   p99 and req/s with shadow / without, interleaved; shadow calls scored and dropped from
   ``stitchrec_shadow_total``.

``--sections`` (default ``protocols,overheads,shadow``) picks what runs; Triton runs with the
protocols. ``--variants`` (default all four) picks the overheads measured against ``base``.
``--repeats`` (default 3; ``--quick``: 1) runs of every protocols / Triton cell and
``--paired-repeats`` (default 6; ``--quick``: 1) of every overheads / shadow cell, each of
``--seconds`` (default 3; ``--quick``: 1) after ``--warmup`` (default 1; ``--quick``: 0.5).
The overheads' and shadow's cells keep ``--concurrency`` streams busy (closed loop: at
saturation) unless ``--rate R`` sends them R requests/s (open loop, ``bench.serving.loadgen
--rate``: p99 at a fixed load below saturation). Writes ``results.json`` under ``--out`` and prints the
tables (``--report results.json`` prints an earlier run's). The clients share the machine's
cores with the servers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from bench.serving import drive, h2load, http_bodies, models
from bench.serving import front_door_cells as cells
from bench.serving.drive import Plan, uptime
from bench.serving.front_door_report import aggregate, show
from bench.serving.otlp_sink import OtlpSink
from bench.serving.servers import (
    MODEL,
    Proc,
    launch_ours,
    start_triton,
    stop_all,
    triton_venv,
    wait_ours,
)

RANK = "/stitchrec.serving.RankingService/Rank"
BATCHING = ["--max-queue-delay-us", "500", "--max-batch-size", "4096"]
HTTP_PATHS = {
    "rank": f"/v1/rank/{MODEL}",
    "v2-json": f"/v2/models/{MODEL}/infer",
    "v2-binary": f"/v2/models/{MODEL}/infer",
    "tfs": f"/v1/models/{MODEL}:predict",
}


@dataclasses.dataclass
class Bench:
    saved: Path
    out: Path
    plan: Plan
    h2: str
    reqs: dict[int, dict]
    frames: dict[int, Path]
    bodies: dict[int, dict]
    first: dict[tuple[str, int], Path]
    paired_repeats: int = 1
    rate: float | None = None  # open-loop requests/s of the overheads' and shadow's cells


def prepare(args: argparse.Namespace, plan: Plan, out: Path, cache: Path, h2: str) -> Bench:
    if args.model == "bench":
        saved, test = models.build_bench_model(cache, args.rows)
    else:
        saved, test = models.build_linear_model(cache)
    folder = out / "requests"
    folder.mkdir(parents=True, exist_ok=True)
    reqs = {n: models.make_requests(saved, test, n, 32, folder) for n in plan.sizes}
    frames = {n: drive.first_frame(r["paths"]["rank"], folder / f"rank-{n}.frame")
              for n, r in reqs.items()}  # fmt: skip
    bodies = {n: http_bodies.make_bodies(saved, test, n, 32, folder) for n in plan.sizes}
    first = {
        (form, n): cells.first_body(b["paths"][form], folder / f"http-{form}-{n}.body")
        for n, b in bodies.items()
        for form in http_bodies.FORMS
    }
    paired = args.paired_repeats or (1 if args.quick else 6)
    return Bench(saved, out, plan, h2, reqs, frames, bodies, first, paired, args.rate)


def repo_with(b: Bench, name: str, versions: dict[int, Path], traffic: str | None = None) -> Path:
    repo = b.out / name
    shutil.rmtree(repo, ignore_errors=True)
    for v, src in versions.items():
        shutil.copytree(src, repo / MODEL / str(v))
    if traffic is not None:
        (repo / MODEL / "traffic.toml").write_text(traffic)
    return repo


def launch(b: Bench, servers: dict[str, tuple[Path, list[str]]]) -> dict[str, tuple[Proc, int]]:
    """Starts every server at once, then waits for each: {name: (process, gRPC port)}."""
    procs = {name: launch_ours(repo, b.out, name, [*BATCHING, "--poll-seconds", "0", *extra])
             for name, (repo, extra) in servers.items()}  # fmt: skip
    try:
        return {name: (p, wait_ours(p)) for name, p in procs.items()}
    except RuntimeError:
        stop_all(list(procs.values()))
        raise


def http_pair(b: Bench, proc: Proc, port: int, path: str, form: str, n: int) -> list[dict]:
    """Throughput (h2load --h1) and latency (http_loadgen) of one HTTP form at N."""
    url = f"http://127.0.0.1:{port}{path}"
    hdr = {http_bodies.HEADER_LENGTH: str(b.bodies[n]["header_length"])} if form == "v2-binary" \
        else {}  # fmt: skip
    return [
        cells.http_throughput(proc, url, b.first[form, n], hdr, b.plan, b.h2),
        cells.http_latency(url, b.bodies[n]["paths"][form], hdr, b.plan),
    ]


def grpc_pair(b: Bench, proc: Proc, port: int, n: int) -> list[dict]:
    reqs = b.reqs[n]["paths"]["rank"]
    return [
        drive.throughput(proc, port, RANK, reqs, b.frames[n], b.plan, b.h2),
        drive.loadgen(port, RANK, reqs, b.plan),
    ]


def tag(rows: list[dict], **keys: object) -> list[dict]:
    for r in rows:
        r.update(keys)
        print(
            f"{r['section']:>9} {r['server']:>9} {r['protocol']:>9} N={r['candidates']:<4} "
            f"{r['driver']:>7} {r['qps']:9.1f} req/s"
            + (f"  p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms" if "p50_ms" in r else "")
            + f"  failed {r['failures']}  (load {r['load']})",
            flush=True,
        )
    return rows


def run_protocols(b: Bench, proc: Proc, port: int) -> list[dict]:
    http_port = int(proc.info["http_port"])
    rows: list[dict] = []
    for rep in range(b.plan.repeats):
        for n in b.plan.sizes:
            rows += tag(grpc_pair(b, proc, port, n), section="protocols", server="stitchrec",
                        protocol="grpc", candidates=n, repeat=rep)  # fmt: skip
            for form, path in HTTP_PATHS.items():
                rows += tag(http_pair(b, proc, http_port, path, form, n), section="protocols",
                            server="stitchrec", protocol=form, candidates=n, repeat=rep)  # fmt: skip
    return rows


def run_triton(b: Bench, cache: Path) -> list[dict]:
    proc, _ = start_triton(triton_venv(cache), b.saved, b.out, "front-door")
    rows: list[dict] = []
    try:
        for rep in range(b.plan.repeats):
            for n in b.plan.sizes:
                pair = http_pair(b, proc, proc.http_port, HTTP_PATHS["v2-json"], "triton", n)
                rows += tag(pair, section="triton", server="triton", protocol="v2-json",
                            candidates=n, repeat=rep)  # fmt: skip
    finally:
        proc.stop()
    return rows


def interleaved(b: Bench, servers: dict[str, tuple[Proc, int]], section: str,
                after: dict | None = None) -> list[dict]:  # fmt: skip
    """Rank at the largest N on each server in turn, the order reversed every other repeat;
    ``after[name](row)`` adds a server's counters to its row."""
    n = b.plan.sizes[-1]
    reqs = b.reqs[n]["paths"]["rank"]
    rows: list[dict] = []
    names = list(servers)
    for rep in range(b.paired_repeats):
        for name in names if rep % 2 == 0 else names[::-1]:
            port = servers[name][1]
            hook = (after or {}).get(name)
            before = hook(None) if hook else None
            r = drive.loadgen(
                port, RANK, reqs, b.plan, rank_versions=section == "shadow", rate=b.rate
            )
            if hook:
                r.update(hook(before))
            rows += tag([r], section=section, server=name, protocol="grpc", candidates=n,
                        repeat=rep)  # fmt: skip
    return rows


OVERHEADS = ("base", "log-10%", "trace-1.0", "trace-1.0-call", "trace-0.1")
SHADOW = ("no-shadow", "shadow")


def server_specs(b: Bench, sink: OtlpSink, slow: Path) -> dict[str, tuple[Path, list[str]]]:
    """Every server of the run (the protocols', the overheads' and the shadow's):
    {name: (repository, extra flags)}."""
    plain = repo_with(b, "repo", {1: b.saved})
    versions = {1: slow, 2: b.saved}
    traffic = "[shadow]\nversion = 1\nfraction = 1.0\nqueue = 64\n"
    trace = ["--otlp-endpoint", sink.endpoint, "--trace-sample-rate"]
    return {
        "protocols": (plain, ["--http-port", "0"]),
        "base": (plain, []),
        "log-10%": (plain, ["--log-dir", str(b.out / "prediction-log"), "--log-rate", "0.1"]),
        "trace-1.0": (plain, [*trace, "1.0"]),
        "trace-1.0-call": (plain, [*trace, "1.0", "--trace-detail", "call"]),
        "trace-0.1": (plain, [*trace, "0.1"]),
        "no-shadow": (repo_with(b, "repo-no-shadow", versions), ["--version-policy", "all"]),
        "shadow": (repo_with(b, "repo-shadow", versions, traffic), ["--version-policy", "all"]),
    }


def run_overheads(
    b: Bench, servers: dict[str, tuple[Proc, int]], sink: OtlpSink, variants: tuple[str, ...]
) -> list[dict]:
    def spans(before: dict | None) -> dict:
        now = sink.counts()
        return now if before is None else {"spans": now["spans"] - before["spans"]}

    names = ("base", *variants)
    hooks = {k: spans for k in names if "trace" in k}
    return interleaved(b, {k: servers[k] for k in names}, "overheads", hooks)


def run_shadow(b: Bench, servers: dict[str, tuple[Proc, int]]) -> list[dict]:
    def shadow_counts(before: dict | None) -> dict:
        now = dict(cells.counter(servers["shadow"][0], "stitchrec_shadow_total", "outcome"))
        if before is None:
            return now
        return {"shadow": {k: v - before.get(k, 0) for k, v in now.items()}}

    return interleaved(b, {k: servers[k] for k in SHADOW}, "shadow", {"shadow": shadow_counts})


def log_rows(folder: Path) -> int:
    """Rows of the prediction log files under ``folder`` (after the server flushed them)."""
    return sum(pq.ParquetFile(p).metadata.num_rows for p in sorted(folder.rglob("*.parquet")))


def run_all(b: Bench, args: argparse.Namespace, cache: Path, notes: list[str]) -> tuple:
    """Every section: (rows, extra figures). Our servers all load at once first; Triton runs
    alone after the protocols."""
    slow = http_bodies.build_slow_model(
        b.saved, cache / f"slow-{b.saved.parent.name}-{args.slow_matmuls}", args.slow_matmuls
    )
    shutil.rmtree(b.out / "prediction-log", ignore_errors=True)
    sink = OtlpSink()
    wanted = {"protocols": ("protocols",), "overheads": ("base", *args.variants), "shadow": SHADOW}
    names = {n for s in args.sections for n in wanted[s]}
    try:
        specs = server_specs(b, sink, slow)
        servers = launch(b, {k: v for k, v in specs.items() if k in names})
    except RuntimeError:
        sink.stop()
        raise
    try:
        rows = run_protocols(b, *servers["protocols"]) if "protocols" in args.sections else []
        if "protocols" not in args.sections:
            notes.append("triton: skipped (no protocols section)")
        elif args.no_triton:
            notes.append("triton: skipped (--no-triton)")
        else:
            try:
                rows += run_triton(b, cache)
            except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:
                notes.append(f"triton: not measured: {e}")
                print(notes[-1], flush=True)
        if "overheads" in args.sections:
            rows += run_overheads(b, servers, sink, args.variants)
        if "shadow" in args.sections:
            rows += run_shadow(b, servers)
    finally:
        stop_all([proc for proc, _ in servers.values()])
        time.sleep(1.0)  # the exporters' last batches
        extra = {"spans_received": sink.counts(), "log_rows": log_rows(b.out / "prediction-log"),
                 "slow_matmuls": args.slow_matmuls, "shadow_version": 1, "primary_version": 2,
                 "paired_rate": b.rate}  # fmt: skip
        sink.stop()
    return rows, extra


def request_bytes(b: Bench, n: int) -> dict:
    sizes = {k: v for k, v in b.reqs[n].items() if k != "paths"}
    return {**sizes, **{k: v for k, v in b.bodies[n].items() if k != "paths"}}


SECTIONS = ("protocols", "overheads", "shadow")


def _sections(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(SECTIONS)}, got {text!r}")
    return names


def _variants(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = sorted(set(names) - set(OVERHEADS[1:]))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected some of {','.join(OVERHEADS[1:])}, got {text!r}"
        )
    return names


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="the HTTP front door's load test")
    p.add_argument("--out", default="runs/bench-front-door")
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "stitchrec-bench-serving"),
                   help="models and Triton's venv, made once (outside the repository)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="1 s per cell, once: checks it works")
    p.add_argument("--seconds", type=float, default=None, help="measured seconds per cell")
    p.add_argument("--warmup", type=float, default=None, help="warm-up seconds per cell")
    p.add_argument("--repeats", type=int, default=None, help="runs of each cell (default 3)")
    p.add_argument("--paired-repeats", type=int, default=None,
                   help="interleaved runs of the overheads' and shadow's servers (default 6)")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rate", type=float, default=None,
                   help="open-loop req/s of the overheads' and shadow's cells (default: closed)")  # fmt: skip
    p.add_argument("--sizes", default="1,100", help="candidates per request, comma-separated")
    p.add_argument("--model", choices=("bench", "linear"), default="bench")
    p.add_argument("--rows", type=int, default=20_000, help="synthetic rows of the bench model")
    p.add_argument("--slow-matmuls", type=int, default=24, help="extra layers of the shadow")
    p.add_argument("--no-triton", action="store_true", help="skip Triton")
    p.add_argument("--sections", type=_sections, default=SECTIONS,
                   help=f"comma-separated, of {','.join(SECTIONS)} (default: all)")  # fmt: skip
    p.add_argument("--variants", type=_variants, default=OVERHEADS[1:],
                   help="comma-separated overheads measured against base, of "
                   f"{','.join(OVERHEADS[1:]).replace('%', '%%')} (default: all)")  # fmt: skip
    p.add_argument("--report", metavar="RESULTS", help="print a results.json's tables; no load")
    args = p.parse_args(argv)
    if args.rate is not None and not args.rate > 0:
        p.error(f"--rate must be > 0 requests per second, got {args.rate:g}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.report:
        show(json.loads(Path(args.report).read_text()))
        return 0
    plan = Plan(
        seconds=args.seconds or (1.0 if args.quick else 3.0),
        warmup=args.warmup if args.warmup is not None else (0.5 if args.quick else 1.0),
        concurrency=args.concurrency,
        sizes=tuple(int(s) for s in args.sizes.split(",")),
        swap_seconds=0.0,
        repeats=args.repeats or (1 if args.quick else 3),
    )
    out, cache = Path(args.out), Path(args.cache)
    out.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    h2 = h2load.ensure_h2load()
    if h2 is None:
        print("error: h2load is needed (apt-get install nghttp2-client)", file=sys.stderr)
        return 2
    t0, load0 = time.time(), uptime()
    print(f"front door bench: {args.model} model, load average {load0}", flush=True)
    b = prepare(args, plan, out, cache, h2)
    notes: list[str] = []
    rows, extra = run_all(b, args, cache, notes)
    result = {
        "plan": dataclasses.asdict(plan),
        "model": args.model,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "load_start": load0,
        "load_end": uptime(),
        "request_bytes": {n: request_bytes(b, n) for n in plan.sizes},
        "rows": rows,
        "aggregated": aggregate(rows),
        "extra": extra,
        "notes": notes,
        "seconds": round(time.time() - t0, 1),
    }
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    show(result)
    print(f"wrote {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
