"""bench/serving: load test of the gRPC server beside Triton Inference Server, on 127.0.0.1.

    .venv/bin/python -m bench.serving --out runs/bench-serving            # full
    .venv/bin/python -m bench.serving --quick --out runs/bench-serving-quick

Models (``--models``, see ``bench.serving.models``): ``bench`` (DCN-v2, 12 fields) and ``demo``
(the 39-field DCN-v2 that ``make run`` serves; ``--saved-model DIR`` points at an export, else
``stitchrec demo`` runs once under ``--cache``). Requests carry one user and N = 1 or 100
candidates, in three protocols: RankingService Rank, KServe v2 ModelInfer (the user tiled to N
rows) and TF Serving Predict.

Every (model, server, protocol, N) is measured twice:

- throughput, ``--driver h2load`` (default when h2load is installed): h2load, a C HTTP/2
  client, sends one pre-serialized request on ``--concurrency`` streams over 4 connections;
  h2load counts HTTP 200 with an error status in the trailers as success, so OK and error
  answers come from the server's own Prometheus counters read before and after the cell.
  ``--driver loadgen``: the Python generator measures throughput too;
- latency: the recording Python generator (``bench.serving.loadgen``, grpc.aio,
  ``--concurrency`` streams over 16 connections, the 32 requests round robin) gives OK req/s,
  p50 and p99.

Servers (``--servers``): ``batching`` (ours, dynamic batcher with a 500 us window, every
protocol), ``no-batching`` and ``multiprocess`` (2 workers, SO_REUSEPORT) through Rank, and
``triton``: Triton 2.51 (nvidia-pytriton 0.7.0) running the same SavedModel as a Python
callable with its dynamic batcher (500 us, max batch 4096), through KServe ModelInfer.

Then ``bench.serving.overload`` (bench model, Rank, 100 candidates, or ``--overload-model``)
and a hot swap under load: the batching server polls its repository every 0.2 s while a
version 2 is copied in and later removed; the generator counts failed requests and versions.

Each cell runs ``--repeats`` times (default 3; ``--quick``: once, 1 s) after ``--warmup`` seconds
of warm-up (default 1; ``--quick``: 0.5).
Ratios are of the means against Triton's on the same model, N and driver. Writes
``results.json`` under ``--out``, the load average beside every cell; ``--report results.json``
prints an earlier run's tables again. The drivers share the machine's cores with the server.
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
import threading
import time
from pathlib import Path
from typing import Any

import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from bench.serving import drive, h2load, models, overload
from bench.serving.drive import Plan, uptime
from bench.serving.report import aggregate, fmt, table
from bench.serving.servers import MODEL, Proc, start_ours, start_triton, triton_venv

METHODS = {
    "rank": "/stitchrec.serving.RankingService/Rank",
    "kserve": "/inference.GRPCInferenceService/ModelInfer",
    "predict": "/tensorflow.serving.PredictionService/Predict",
}
SCENARIOS: dict[str, dict[str, Any]] = {
    "no-batching": {"extra": ["--no-batching", "--batch-concurrency", "2"], "protocols": ["rank"]},
    "batching": {"extra": ["--max-queue-delay-us", "500"], "protocols": list(METHODS)},
    "multiprocess": {"extra": ["--max-queue-delay-us", "500"], "protocols": ["rank"], "workers": 2},
}


@dataclasses.dataclass
class Model:
    name: str
    saved: Path
    repo: Path
    reqs: dict[int, dict]
    frames: dict[tuple[str, int], Path]


def prepare(name: str, args: argparse.Namespace, plan: Plan, out: Path, cache: Path) -> Model:
    if name == "bench":
        saved, test = models.build_bench_model(cache, args.rows)
    elif name == "demo":
        saved, test = models.build_demo_model(cache, args.demo_rows, args.saved_model)
    elif name == "linear":
        saved, test = models.build_linear_model(cache)
    else:
        raise ValueError(f"--models: unknown model {name!r}; known: bench, demo, linear")
    folder = out / name
    repo = folder / "repo"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(saved, repo / MODEL / "1")
    reqs = {n: models.make_requests(saved, test, n, 32, folder) for n in plan.sizes}
    frames = {
        (p, n): drive.first_frame(r["paths"][p], folder / f"{p}-{n}.frame")
        for n, r in reqs.items()
        for p in models.PROTOCOLS
    }
    print(f"model {name}: {saved}; request bytes " + ", ".join(
        f"N={n}: " + "/".join(str(r[f"{p}_bytes"]) for p in models.PROTOCOLS)
        for n, r in reqs.items()
    ) + " (Rank/KServe/Predict)", flush=True)  # fmt: skip
    return Model(name, saved, repo, reqs, frames)


def measure(m: Model, server: str, proc: Proc, port: int, protocols: list[str], plan: Plan,
            h2: str | None) -> list[dict]:  # fmt: skip
    rows = []
    for rep in range(plan.repeats):
        for n in plan.sizes:
            for proto in protocols:
                reqs, method = m.reqs[n]["paths"][proto], METHODS[proto]
                cells = [drive.throughput(proc, port, method, reqs, m.frames[proto, n], plan, h2)]
                if h2 is not None:
                    cells.append(drive.loadgen(port, method, reqs, plan))
                for r in cells:
                    r.update(model=m.name, server=server, protocol=proto, candidates=n, repeat=rep)
                    rows.append(r)
                    print(fmt(r), flush=True)
    return rows


def run_server(name: str, m: Model, plan: Plan, out: Path, cache: Path, h2: str | None) -> list:
    if name == "triton":
        proc, port = start_triton(triton_venv(cache), m.saved, out, m.name)
        protocols = ["kserve"]
    elif name in SCENARIOS:
        spec = SCENARIOS[name]
        extra = [*spec["extra"], "--poll-seconds", "0", "--max-batch-size", "4096"]
        proc, port = start_ours(m.repo, out, f"{name}-{m.name}", extra, spec.get("workers", 1))
        protocols = spec["protocols"]
    else:
        raise ValueError(f"--servers: unknown server {name!r}; known: {[*SCENARIOS, 'triton']}")
    try:
        return measure(m, name, proc, port, protocols, plan, h2)
    finally:
        proc.stop()


def run_hot_swap(m: Model, plan: Plan, out: Path) -> dict:
    """Batching server polling every 0.2 s; version 2 copied in at 1/3, removed at 2/3."""
    repo = out / "swap-repo"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(m.saved, repo / MODEL / "1")
    proc, port = start_ours(repo, out, "hot-swap", ["--poll-seconds", "0.2"])
    n = plan.sizes[-1]
    events = []

    def swap() -> None:
        time.sleep(plan.warmup + plan.swap_seconds / 3)
        shutil.copytree(m.saved, repo / MODEL / ".v2")
        (repo / MODEL / ".v2").rename(repo / MODEL / "2")
        events.append("version 2 copied in")
        time.sleep(plan.swap_seconds / 3)
        shutil.rmtree(repo / MODEL / "2")
        events.append("version 2 removed (rollback to 1)")

    t = threading.Thread(target=swap, daemon=True)
    t.start()
    try:
        reqs = m.reqs[n]["paths"]["rank"]
        r = drive.loadgen(port, METHODS["rank"], reqs, plan, seconds=plan.swap_seconds,
                          rank_versions=True)  # fmt: skip
    finally:
        t.join()
        proc.stop()
    r.update(model=m.name, server="hot-swap", protocol="rank", candidates=n, events=events)
    print(fmt(r), f"versions {r['versions']}", flush=True)
    return r


def run_overload(args: argparse.Namespace, prepared: dict[str, Model], plan: Plan, out: Path,
                 h2: str | None) -> dict:  # fmt: skip
    m = prepared[args.overload_model]
    n = plan.sizes[-1]
    sweep = args.overload_sweep or ("4,16" if args.quick else "4,16,64")
    print(f"overload: {m.name} model, Rank, {n} candidates", flush=True)
    over = overload.run(
        m.repo, out, METHODS["rank"], m.reqs[n]["paths"]["rank"], m.frames["rank", n], plan,
        h2, tuple(int(c) for c in sweep.split(",")), (1, 4) if args.quick else (1, 2, 4, 8),
    )  # fmt: skip
    over.update(model=m.name, candidates=n)
    return over


def report(results: Path) -> int:
    """Prints the tables of the runs in ``results`` (a results.json), then their aggregates as
    one JSON line."""
    data = json.loads(results.read_text())
    aggregated = aggregate(data["rows"])
    print(table(aggregated))
    if data.get("overload"):
        print()
        print(overload.table(data["overload"]))
    print(json.dumps({"aggregated": aggregated}), flush=True)
    return 0


def show(result: dict) -> None:
    print()
    print(table(result["aggregated"]))
    if result["overload"]:
        print()
        print(overload.table(result["overload"]))
    swap = result["hot_swap"]
    if swap:
        print(
            f"\nhot swap under load: {swap['requests']} requests, {swap['failures']} failed, "
            f"answers by version {swap['versions']}"
        )
    print(f"\nfinished in {result['seconds']} s")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="gRPC serving load test beside Triton")
    p.add_argument("--out", default="runs/bench-serving")
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "stitchrec-bench-serving"))
    p.add_argument("--quick", action="store_true", help="1 s per cell, once: checks it works")
    p.add_argument("--seconds", type=float, default=None, help="measured seconds per cell")
    p.add_argument("--warmup", type=float, default=None,
                   help="warm-up seconds per cell (default 1; --quick: 0.5)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=None, help="runs of each cell (default 3)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--sizes", default="1,100", help="candidates per request, comma-separated")
    p.add_argument("--driver", choices=("h2load", "loadgen"), default=None,
                   help="throughput driver (default: h2load when installed)")  # fmt: skip
    p.add_argument("--models", default="bench,demo", help="bench, demo, linear (comma-separated)")
    p.add_argument("--saved-model", default=None, help="the demo model's export folder")
    p.add_argument("--demo-rows", type=int, default=2_000_000, help="rows of a demo built here")
    p.add_argument("--rows", type=int, default=20_000, help="synthetic rows of the bench model")
    p.add_argument("--servers", default="batching,triton")
    p.add_argument("--overload-model", default="bench", help="model of the overload test")
    p.add_argument("--overload-sweep", default=None, help="concurrencies (default 4,16,64)")
    p.add_argument("--skip-overload", action="store_true")
    p.add_argument("--skip-hot-swap", action="store_true")
    p.add_argument("--report", metavar="RESULTS", help="print a results.json's tables; no load")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.report:
        return report(Path(args.report))
    plan = Plan(
        seconds=args.seconds or (1.0 if args.quick else 5.0),
        warmup=args.warmup if args.warmup is not None else (0.5 if args.quick else 1.0),
        concurrency=args.concurrency,
        sizes=tuple(int(s) for s in args.sizes.split(",")),
        swap_seconds=4.0 if args.quick else 15.0,
        repeats=args.repeats or (1 if args.quick else 3),
    )
    out, cache = Path(args.out), Path(args.cache)
    out.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    h2 = h2load.ensure_h2load() if args.driver != "loadgen" else None
    if args.driver == "h2load" and h2 is None:
        print("--driver h2load: h2load is not available; throughput from the Python generator")
    print(f"throughput driver: {h2 or 'loadgen'}; load average {uptime()}", flush=True)
    names = args.models.split(",")
    if not args.skip_overload and args.overload_model not in names:
        names.append(args.overload_model)
    prepared = {name: prepare(name, args, plan, out, cache) for name in names}
    rows: list[dict] = []
    notes: list[str] = []
    for name in args.models.split(","):
        for server in args.servers.split(","):
            try:
                rows += run_server(server, prepared[name], plan, out, cache, h2)
            except (RuntimeError, subprocess.SubprocessError, OSError) as e:
                if server != "triton":
                    raise
                notes.append(f"triton skipped on {name}: {e}")
                print(notes[-1], flush=True)
    over = None if args.skip_overload else run_overload(args, prepared, plan, out, h2)
    swap = None if args.skip_hot_swap else run_hot_swap(prepared[names[0]], plan, out)
    result = {
        "plan": dataclasses.asdict(plan),
        "driver": "h2load" if h2 else "loadgen",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "request_bytes": {
            name: {n: {k: v for k, v in r.items() if k != "paths"} for n, r in m.reqs.items()}
            for name, m in prepared.items()
        },
        "rows": rows,
        "aggregated": aggregate(rows),
        "overload": over,
        "hot_swap": swap,
        "notes": notes,
        "seconds": round(time.time() - t0, 1),
    }
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    show(result)
    print(f"wrote {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
