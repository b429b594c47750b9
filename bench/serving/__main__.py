"""bench/serving: load test of the gRPC server beside Triton Inference Server, on 127.0.0.1.

    .venv/bin/python -m bench.serving --out runs/bench-serving            # full (~5 minutes)
    .venv/bin/python -m bench.serving --quick --out runs/bench-serving-quick

One model for everything: DCN-v2 trained for one epoch on a synthetic click log (Criteo layout
cut to 4 numeric + 8 categorical fields, seed 0) and exported by ``pipelines.export``. Requests
carry one user (C1, C2) and N = 1 or 100 candidates (the other 10 fields), drawn from the test
split. For each server and N, a closed-loop load generator in its own process
(``bench.serving.loadgen``: grpc.aio, ``--concurrency`` streams over 16 connections, raw
pre-serialized requests) measures requests/s, p50 and p99 latency and failed requests:

- ``no-batching``: our server, each request a model call (2 at a time), RankingService;
- ``batching``: our server with the dynamic batcher (500 us window), RankingService;
- ``batching-kserve``: the same server through KServe v2 ModelInfer (the user tiled to N rows);
- ``multiprocess``: 2 server processes on one port (SO_REUSEPORT), batching, RankingService;
- ``triton``: Triton Inference Server 2.51 (nvidia-pytriton 0.7.0, its own venv made from
  /usr/bin/python3.11 under ``--cache``), a Python callable running the same SavedModel with
  Triton's dynamic batcher (500 us window, max batch 4096), through KServe v2 ModelInfer with
  the same request bytes as ``batching-kserve``.

Then a hot swap under load: the batching server polls its repository every 0.2 s while a
version 2 is copied in and later removed (rollback to 1); the generator counts failed requests
and the versions that answered.

``--report results.json`` prints the table of an earlier run's results again.

Each cell is measured ``--repeats`` times (default 3; 5 s after 1 s of warm-up each; ``--quick``:
once, 2 s) and reported as mean ± sample std. Ratios are of the means against Triton at the same
N (requests/s and p99). Writes ``results.json`` (every run, the aggregates, the load average
beside each run) under ``--out``. The load generator shares the machine's cores with the
server, as it does Triton's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from bench.serving.loadgen import write_requests

ROOT = Path(__file__).resolve().parents[2]
TRITON_PYTHON = "/usr/bin/python3.11"
TRITON_REQUIREMENTS = ("nvidia-pytriton==0.7.0", "numpy<2", "tensorflow-cpu>=2.21,<2.22")
USER_FIELDS = ("C1", "C2")
MODEL = "ctr"
RANK_METHOD = "/stitchrec.serving.RankingService/Rank"
KSERVE_METHOD = "/inference.GRPCInferenceService/ModelInfer"


@dataclasses.dataclass(frozen=True)
class Plan:
    seconds: float
    warmup: float
    concurrency: int
    sizes: tuple[int, ...]
    swap_seconds: float
    repeats: int = 1


# --------------------------------------------------------------------------------------------
# the model and the requests


def build_model(cache: Path, rows: int) -> Path:
    """Trains and exports the bench model once (cached); returns the SavedModel folder."""
    from features import synthetic, synthetic_config
    from pipelines.config import DataConfig, PipelineConfig, TrainConfig
    from pipelines.export import export_run
    from pipelines.train import train
    from ranking.config import ModelConfig

    model_dir = cache / f"model-{rows}"
    saved = model_dir / "export"
    if (saved / "saved_model.pb").exists():
        return saved
    data_dir = model_dir / "data"
    cfg = synthetic_config.SyntheticConfig(
        rows=rows,
        num_numeric=4,
        num_categorical=8,
        vocab_sizes=(1000, 500, 50, 20, 10, 30, 80, 5),
        n_pairs=1,
        n_triples=1,
        n_single=2,
        seed=0,
    )
    if not (data_dir / "ground_truth.json").exists():
        synthetic.write_dataset(cfg, data_dir)
    pc = PipelineConfig(
        output_dir=str(model_dir / "run"),
        data=DataConfig(
            schema=str(data_dir / "schema.toml"),
            train=(str(data_dir / "train"),),
            test=(str(data_dir / "test"),),
        ),
        model=ModelConfig(type="dcn_v2", embedding_dim=8, mlp=(64, 32), cross_layers=2),
        train=TrainConfig(batch_size=512, epochs=1, learning_rate=2e-3, log_every=10**6),
    )
    report = train(pc, log=lambda _: None)
    export_run(model_dir / "run", saved)
    (model_dir / "train.json").write_text(json.dumps(report["test"]))
    return saved


def _test_rows(cache: Path, rows: int, n: int) -> dict[str, np.ndarray]:
    data_dir = cache / f"model-{rows}" / "data" / "test"
    table = pq.read_table(data_dir).slice(0, n)
    if table.num_rows < n:
        raise ValueError(f"{data_dir}: {table.num_rows} test rows; the requests need {n}")
    return {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}


def _inputs(saved: Path) -> dict[str, str]:
    """The model's inputs and their kind (string|int64|float32) from assets.extra."""
    import tomllib

    fields = tomllib.loads((saved / "assets.extra" / "schema.toml").read_text())["fields"]
    meta = json.loads((saved / "assets.extra" / "stitchrec.json").read_text())
    kinds = {}
    for f in fields:
        if f["name"] not in meta["inputs"]:
            continue
        if f.get("kind") == "numeric":
            kinds[f["name"]] = "float32"
        elif f.get("dtype") == "int64":
            kinds[f["name"]] = "int64"
        else:
            kinds[f["name"]] = "string"
    return kinds


def _column(values: np.ndarray, kind: str) -> np.ndarray:
    if kind == "string":
        return np.array([b"" if v is None else str(v).encode() for v in values], dtype=object)
    if kind == "int64":
        return np.nan_to_num(values.astype(np.float64)).astype(np.int64)
    return np.nan_to_num(values.astype(np.float64)).astype(np.float32)


def make_requests(saved: Path, cache: Path, rows: int, n: int, count: int, out: Path) -> dict:
    """``count`` RankRequests and the equivalent KServe ModelInferRequests of N candidates."""
    from protos import grpc_service_pb2 as kserve_pb2
    from serving.client import make_request
    from serving.codec import encode_bytes

    kinds = _inputs(saved)
    data = _test_rows(cache, rows, count * n + count)
    cols = {k: _column(data[k], kind) for k, kind in kinds.items()}
    rank, kserve = [], []
    dtypes = {"string": "BYTES", "int64": "INT64", "float32": "FP32"}
    for r in range(count):
        sl = slice(count + r * n, count + (r + 1) * n)
        user = {k: cols[k][r : r + 1] for k in USER_FIELDS}
        cands = {k: cols[k][sl] for k in kinds if k not in USER_FIELDS}
        rank.append(make_request(MODEL, user, cands).SerializeToString())
        req = kserve_pb2.ModelInferRequest(model_name=MODEL)
        for k in sorted(kinds):
            v = np.repeat(user[k], n) if k in user else cands[k]
            req.inputs.add(name=k, datatype=dtypes[kinds[k]], shape=[n, 1])
            if kinds[k] == "string":
                req.raw_input_contents.append(encode_bytes(v))
            else:
                req.raw_input_contents.append(v.astype(v.dtype.newbyteorder("<")).tobytes())
        req.outputs.add(name="score")
        kserve.append(req.SerializeToString())
    paths = {"rank": out / f"rank-{n}.bin", "kserve": out / f"kserve-{n}.bin"}
    write_requests(str(paths["rank"]), rank)
    write_requests(str(paths["kserve"]), kserve)
    return {"paths": paths, "rank_bytes": len(rank[0]), "kserve_bytes": len(kserve[0])}


# --------------------------------------------------------------------------------------------
# servers


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A server subprocess stopped with SIGTERM (then SIGKILL after 30 s)."""

    def __init__(self, cmd: list[str], log: Path, env: dict[str, str] | None = None):
        self.log = log.open("w")
        self.p = subprocess.Popen(
            cmd, cwd=ROOT, env=env or _env(), stdout=subprocess.PIPE, stderr=self.log, text=True
        )

    def line(self, timeout: float = 300) -> dict:
        result: list[str] = []
        t = threading.Thread(target=lambda: result.append(self.p.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        if not result or not result[0]:
            raise RuntimeError(f"server did not start; see {self.log.name}")
        return json.loads(result[0])

    def stop(self) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()
        return self.p.returncode


def start_ours(
    repo: Path, out: Path, tag: str, extra: list[str], workers: int = 1
) -> tuple[Proc, int]:
    cmd = [
        sys.executable, "-m", "pipelines.cli", "serve", "--repo", str(repo), "--host", "127.0.0.1",
        "--port", "0", "--workers", str(workers), "--log-level", "WARNING", *extra,
    ]  # fmt: skip
    proc = Proc(cmd, out / f"server-{tag}.log")
    first = proc.line()
    for _ in range(workers if workers > 1 else 0):
        proc.line()  # each worker prints once it serves
    return proc, int(first["port"])


def _wait_kserve_ready(port: int, timeout: float) -> None:
    import grpc

    from protos import grpc_service_pb2 as kserve_pb2
    from protos import grpc_service_pb2_grpc as kserve_grpc

    t0 = time.monotonic()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = kserve_grpc.GRPCInferenceServiceStub(ch)
        while time.monotonic() - t0 < timeout:
            try:
                if stub.ModelReady(kserve_pb2.ModelReadyRequest(name=MODEL), timeout=2).ready:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.5)
    raise RuntimeError(f"Triton not ready on port {port} after {timeout:.0f} s")


def triton_venv(cache: Path) -> Path:
    """The Triton venv (made once): /usr/bin/python3.11 + nvidia-pytriton 0.7.0, numpy<2, TF."""
    venv = cache / "pytriton-venv"
    marker = venv / ".stitchrec-ready"
    if marker.exists():
        return venv / "bin" / "python"
    if not Path(TRITON_PYTHON).exists():
        raise RuntimeError(f"{TRITON_PYTHON} not found (Triton's venv needs Python 3.11)")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([TRITON_PYTHON, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", *TRITON_REQUIREMENTS],
        check=True,
        timeout=1800,
    )
    marker.write_text("\n".join(TRITON_REQUIREMENTS))
    return venv / "bin" / "python"


def start_triton(python: Path, saved: Path, out: Path) -> tuple[Proc, int]:
    port = _free_port()
    cmd = [
        str(python), str(ROOT / "bench" / "serving" / "triton_server.py"), "--model", str(saved),
        "--name", MODEL, "--grpc-port", str(port), "--http-port", str(_free_port()),
        "--metrics-port", str(_free_port()), "--max-batch-size", "4096",
        "--max-queue-delay-us", "500",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = Proc(cmd, out / "server-triton.log", env=env)
    _wait_kserve_ready(port, 300)
    return proc, port


# --------------------------------------------------------------------------------------------
# load


def load(port: int, method: str, requests: Path, plan: Plan, seconds: float | None = None,
         rank_versions: bool = False) -> dict:  # fmt: skip
    cmd = [
        sys.executable, "-m", "bench.serving.loadgen", "--target", f"127.0.0.1:{port}",
        "--method", method, "--requests", str(requests), "--concurrency", str(plan.concurrency),
        "--channels", "16", "--warmup", str(plan.warmup), "--seconds", str(seconds or plan.seconds),
    ]  # fmt: skip
    if rank_versions:
        cmd.append("--rank-versions")
    p = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"load generator failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def uptime() -> str:
    """The 1, 5 and 15 minute load averages (other processes on the machine inflate times)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


SCENARIOS: dict[str, dict[str, Any]] = {
    "no-batching": {"extra": ["--no-batching", "--batch-concurrency", "2"], "protocol": "rank"},
    "batching": {"extra": ["--max-queue-delay-us", "500"], "protocol": "rank"},
    "batching-kserve": {"extra": ["--max-queue-delay-us", "500"], "protocol": "kserve"},
    "multiprocess": {"extra": ["--max-queue-delay-us", "500"], "protocol": "rank", "workers": 2},
}


def _cells(plan: Plan) -> list[tuple[int, int]]:
    """(repeat, candidates) in the order measured: the sizes alternate within each repeat."""
    return [(rep, n) for rep in range(plan.repeats) for n in plan.sizes]


def run_ours(name: str, repo: Path, reqs: dict, plan: Plan, out: Path) -> list[dict]:
    spec = SCENARIOS[name]
    extra = [*spec["extra"], "--poll-seconds", "0", "--max-batch-size", "4096"]
    proc, port = start_ours(repo, out, name, extra, spec.get("workers", 1))
    rows = []
    try:
        for rep, n in _cells(plan):
            method = RANK_METHOD if spec["protocol"] == "rank" else KSERVE_METHOD
            r = load(port, method, reqs[n]["paths"][spec["protocol"]], plan)
            r.update(server=name, candidates=n, repeat=rep, load=uptime())
            rows.append(r)
            print(_fmt(r), flush=True)
    finally:
        proc.stop()
    return rows


def run_triton(saved: Path, cache: Path, reqs: dict, plan: Plan, out: Path) -> list[dict]:
    python = triton_venv(cache)
    proc, port = start_triton(python, saved, out)
    rows = []
    try:
        for rep, n in _cells(plan):
            r = load(port, KSERVE_METHOD, reqs[n]["paths"]["kserve"], plan)
            r.update(server="triton", candidates=n, repeat=rep, load=uptime())
            rows.append(r)
            print(_fmt(r), flush=True)
    finally:
        proc.stop()
    return rows


def run_hot_swap(saved: Path, reqs: dict, plan: Plan, out: Path) -> dict:
    """Batching server polling every 0.2 s; version 2 copied in at 1/3, removed at 2/3."""
    repo = out / "swap-repo"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(saved, repo / MODEL / "1")
    proc, port = start_ours(repo, out, "hot-swap", ["--poll-seconds", "0.2"])
    n = plan.sizes[-1]
    events = []

    def swap() -> None:
        time.sleep(plan.warmup + plan.swap_seconds / 3)
        shutil.copytree(saved, repo / MODEL / ".v2")
        (repo / MODEL / ".v2").rename(repo / MODEL / "2")
        events.append(("version 2 copied in", time.time()))
        time.sleep(plan.swap_seconds / 3)
        shutil.rmtree(repo / MODEL / "2")
        events.append(("version 2 removed (rollback to 1)", time.time()))

    t = threading.Thread(target=swap, daemon=True)
    t.start()
    try:
        r = load(port, RANK_METHOD, reqs[n]["paths"]["rank"], plan, plan.swap_seconds, True)
    finally:
        t.join()
        proc.stop()
    r.update(server="hot-swap", candidates=n, events=[e for e, _ in events], load=uptime())
    print(_fmt(r), f"versions {r['versions']}", flush=True)
    return r


def _fmt(r: dict) -> str:
    return (
        f"{r['server']:>16}  N={r['candidates']:<4} {r['qps']:>9.1f} req/s  p50 {r['p50_ms']:7.2f} ms"
        f"  p99 {r['p99_ms']:7.2f} ms  failed {r['failures']}  (load {r['load']})"
    )


def aggregate(rows: list[dict]) -> list[dict]:
    """Repeats of one (server, candidates) cell -> mean and sample std of req/s, p50 and p99."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["server"], r["candidates"]), []).append(r)
    out = []
    for (server, n), rs in groups.items():
        agg: dict[str, Any] = {"server": server, "candidates": n, "repeats": len(rs)}
        for k in ("qps", "p50_ms", "p99_ms"):
            v = np.array([r[k] for r in rs], dtype=np.float64)
            agg[k] = float(v.mean())
            agg[k + "_std"] = float(v.std(ddof=1)) if len(v) > 1 else 0.0
        agg["failures"] = sum(r["failures"] for r in rs)
        out.append(agg)
    return out


def _pm(mean: float, std: float, digits: int) -> str:
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if std else f"{mean:.{digits}f}"


def table(aggregated: list[dict]) -> str:
    """Markdown table of ``aggregate`` rows; ratios are of means against Triton's at equal N."""
    triton = {r["candidates"]: r for r in aggregated if r["server"] == "triton"}
    lines = [
        "| server | candidates | runs | req/s | p50 ms | p99 ms | failed | req/s vs Triton | p99 vs Triton |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in aggregated:
        t = triton.get(r["candidates"])
        q = f"{r['qps'] / t['qps']:.2f}x" if t and t["qps"] else "-"
        p = f"{r['p99_ms'] / t['p99_ms']:.2f}x" if t and t["p99_ms"] else "-"
        lines.append(
            f"| {r['server']} | {r['candidates']} | {r['repeats']} | "
            f"{_pm(r['qps'], r['qps_std'], 0)} | {_pm(r['p50_ms'], r['p50_ms_std'], 1)} | "
            f"{_pm(r['p99_ms'], r['p99_ms_std'], 1)} | {r['failures']} | {q} | {p} |"
        )
    return "\n".join(lines)


def report(results: Path) -> int:
    """Prints the table of the runs in ``results`` (a results.json), then their aggregates as
    one JSON line."""
    rows = json.loads(results.read_text())["rows"]
    aggregated = aggregate(rows)
    print(table(aggregated))
    print(json.dumps({"aggregated": aggregated}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="gRPC serving load test beside Triton")
    p.add_argument("--out", default="runs/bench-serving")
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "stitchrec-bench-serving"))
    p.add_argument("--quick", action="store_true", help="2 s per cell, once: checks it works")
    p.add_argument("--seconds", type=float, default=None, help="measured seconds per cell")
    p.add_argument("--repeats", type=int, default=None, help="runs of each cell (default 3)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--rows", type=int, default=20_000, help="synthetic rows to train on")
    p.add_argument("--servers", default="no-batching,batching,batching-kserve,multiprocess,triton")
    p.add_argument("--skip-hot-swap", action="store_true")
    p.add_argument(
        "--report",
        metavar="RESULTS",
        help="print the table of a results.json's runs (and their aggregates as JSON); no load",
    )
    args = p.parse_args(argv)
    if args.report:
        return report(Path(args.report))
    plan = Plan(
        seconds=args.seconds or (2.0 if args.quick else 5.0),
        warmup=1.0,
        concurrency=args.concurrency,
        sizes=(1, 100),
        swap_seconds=6.0 if args.quick else 15.0,
        repeats=args.repeats or (1 if args.quick else 3),
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    saved = build_model(cache, args.rows)
    repo = out / "repo"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(saved, repo / MODEL / "1")
    reqs = {n: make_requests(saved, cache, args.rows, n, 32, out) for n in plan.sizes}
    print(f"model {saved}; requests: " + ", ".join(
        f"N={n}: {r['rank_bytes']} B (Rank), {r['kserve_bytes']} B (KServe)" for n, r in reqs.items()
    ), flush=True)  # fmt: skip
    rows: list[dict] = []
    notes: list[str] = []
    for name in args.servers.split(","):
        if name == "triton":
            try:
                rows += run_triton(saved, cache, reqs, plan, out)
            except (RuntimeError, subprocess.SubprocessError, OSError) as e:
                notes.append(f"triton skipped: {e}")
                print(notes[-1], flush=True)
        elif name in SCENARIOS:
            rows += run_ours(name, repo, reqs, plan, out)
        else:
            raise ValueError(f"--servers: unknown server {name!r}; known: {[*SCENARIOS, 'triton']}")
    swap = None if args.skip_hot_swap else run_hot_swap(saved, reqs, plan, out)
    result = {
        "plan": dataclasses.asdict(plan),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "model": json.loads((cache / f"model-{args.rows}" / "train.json").read_text())
        if (cache / f"model-{args.rows}" / "train.json").exists()
        else {},
        "request_bytes": {
            n: {k: r[k] for k in ("rank_bytes", "kserve_bytes")} for n, r in reqs.items()
        },
        "rows": rows,
        "aggregated": aggregate(rows),
        "hot_swap": swap,
        "notes": notes,
        "seconds": round(time.time() - t0, 1),
    }
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print()
    print(table(aggregate(rows)))
    if swap:
        print(
            f"\nhot swap under load: {swap['requests']} requests, {swap['failures']} failed, "
            f"answers by version {swap['versions']}"
        )
    print(f"\nwrote {out / 'results.json'} in {result['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
