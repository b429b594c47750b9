"""bench/compiler/served: a fused export served by the real gRPC server, against the same
export unfused: compilations and latency over requests of random batch sizes.

    .venv/bin/python -m bench.compiler.served --out runs/bench-compiler-served

DCN-v2 with full embeddings (``--method``: ``amtl``, ``bh``; ``bench/compiler/workload.py``, untrained: speed does not depend
on the weights) exported by ``stitchrec export``'s code five times: plain (``unfused``), with
``assets.extra/fusion.json`` (``fused``: what ``stitchrec export --fuse`` writes: planned XLA
clusters, batches padded to 8, 16, ..., 512, compiled at load), with the embedding block
as a generated op (``kernels``: ``stitchrec export --fuse-kernels``), with a fusion.json asking
for generated loop ops (``generated``: ``--fuse --fuse-realization generated``: the plan's
elementwise groups as generated C++ ops in the frozen signature, the rest TensorFlow ops, no
padding) and both
(``kernels_generated``: ``--fuse-kernels --fuse --fuse-realization generated``). Each copy is
served by ``serving.create_server`` on 127.0.0.1 port 0 (dynamic batching off, so every
request runs at its own size) and gets ``--requests`` (200) TF-Serving ``Predict`` requests of
raw features, batch sizes uniform in 1..``--max-batch`` (512) from the process's seed, one after
the other from one client. Latency: the client's round trip. Compilations: XLA executables
built while the server loads (plan, clusters, warm-up of every bucket) and during the requests
(profiler trace, ``compiler_opt.buckets.count_compilations``). Every response is checked
against the unfused one. ``--processes`` fresh processes (seeds 0, 1, 2, ...); figures are the
median [min-max] over them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("unfused", "fused", "kernels", "generated", "kernels_generated")
#: variant -> the realization its fusion.json asks for
REALIZATION = {"fused": "xla_clusters", "generated": "generated", "kernels_generated": "generated"}
#: variants exported with the embedding block as the generated op (--fuse-kernels)
KERNEL_EXPORTS = ("kernels", "kernels_generated")


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One process: both variants over the same seeded request sequence."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from bench.compiler import workload
    from compiler_opt.buckets import count_compilations
    from compiler_opt.fused_signature import FusionSpec, write_spec
    from pipelines.export import export_saved_model
    from serving.config import BatchingConfig, ServerOptions
    from serving.testing import ServerThread

    work = Path(args.work)
    data = workload.write_data(work, args.rows)
    w = workload.build(data, args.method, (args.max_batch,), seed=args.seed)
    repos = {v: work / f"repo-{args.seed}-{v}" for v in VARIANTS}
    for v, repo in repos.items():
        if repo.exists():
            shutil.rmtree(repo)
        export_saved_model(w.model, w.schema, repo / "ctr" / "1", kernels=v in KERNEL_EXPORTS)
        if v in REALIZATION:
            write_spec(repo / "ctr" / "1", FusionSpec(realization=REALIZATION[v]))
    raw = {k: np.asarray(t) for k, t in w.batches[args.max_batch].items() if k != w.label}
    rng = np.random.default_rng(args.seed)
    sizes = rng.integers(1, args.max_batch + 1, args.requests)
    requests = []
    for n in sizes:
        rows = rng.integers(0, args.max_batch, n)
        req = predict_pb2.PredictRequest()
        req.model_spec.name = "ctr"
        for k, v in raw.items():
            req.inputs[k].CopyFrom(tf.make_tensor_proto(v[rows]))
        requests.append(req)
    options = ServerOptions(batching=BatchingConfig(enabled=False), warmup_sizes=(1,))
    out: dict[str, Any] = {"seed": args.seed, "distinct_sizes": len(set(sizes.tolist()))}
    scores: dict[str, list[np.ndarray]] = {}
    for v in VARIANTS:
        # The fused server counts its own warm-up's compilations (one profiler per process).
        t0 = time.perf_counter()
        if v in REALIZATION:  # the server counts its warm-up's compilations itself
            server = ServerThread(repos[v], options)
        else:
            with count_compilations() as at_load:
                server = ServerThread(repos[v], options)
        load_s = time.perf_counter() - t0
        try:
            mv = server.server.repository.get("ctr")
            stub = prediction_service_pb2_grpc.PredictionServiceStub(
                grpc.insecure_channel(server.target)
            )
            stub.Predict(requests[0], timeout=60)  # connection set up, untimed
            lat, got = [], []
            with count_compilations() as during:
                for req in requests:
                    t = time.perf_counter()
                    resp = stub.Predict(req, timeout=60)
                    lat.append(time.perf_counter() - t)
                    got.append(tf.make_ndarray(resp.outputs["score"]))
            scores[v] = got
            out[v] = {
                "load_s": round(load_s, 2),
                "compilations_at_load": (
                    mv.fused[0].compilations_at_load if mv.fused else at_load.count
                ),
                "compilations_in_requests": during.count,
                "clusters": mv.fused[0].clusters if mv.fused else 0,
                "generated_loops": mv.fused[0].loops if mv.fused else 0,
                "tabulated_masks": (
                    mv.fused[0].describe().get("tabulated_masks", 0) if mv.fused else 0
                ),
                "choice": mv.fused[0].describe()["choice"] if mv.fused else "",
                "timings_ms": mv.fused[0].describe()["timings_ms"] if mv.fused else {},
                "p50_ms": float(np.percentile(lat, 50) * 1e3),
                "p99_ms": float(np.percentile(lat, 99) * 1e3),
                "mean_ms": float(np.mean(lat) * 1e3),
            }
        finally:
            server.stop()
    for v in VARIANTS[1:]:
        out[v]["max_abs_diff"] = float(
            max(np.max(np.abs(a - b)) for a, b in zip(scores[v], scores["unfused"], strict=True))
        )
    return out


def _spread(values: list[float], fmt: str = ".2f") -> str:
    return (
        f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"
        if values
        else "-"
    )


def summarize(procs: list[dict[str, Any]]) -> str:
    lines = [
        "| variant | compilations at load / in requests | p50 ms | p99 ms | load s |",
        "|---|---|---|---|---|",
    ]
    for v in VARIANTS:
        rows = [p[v] for p in procs]
        comp = "/".join(
            _spread([r[k] for r in rows], ".0f")
            for k in ("compilations_at_load", "compilations_in_requests")
        )
        lines.append(
            f"| {v} | {comp} | {_spread([r['p50_ms'] for r in rows])} | "
            f"{_spread([r['p99_ms'] for r in rows])} | {_spread([r['load_s'] for r in rows], '.1f')} |"
        )
    for v in VARIANTS[1:]:
        ratio = [p["unfused"]["p99_ms"] / p[v]["p99_ms"] for p in procs]
        diff = max(p[v]["max_abs_diff"] for p in procs)
        lines.append(f"\np99 unfused / {v}: {_spread(ratio)}; largest |{v} - unfused| {diff:.2e}")
    lines.append(f"distinct batch sizes per process: {[p['distinct_sizes'] for p in procs]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="runs/bench-compiler-served")
    p.add_argument("--work", default=None)
    p.add_argument("--rows", type=int, default=50_000, help="synthetic rows (vocabularies)")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--max-batch", type=int, default=512)
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--method", default="full", choices=["full", "amtl", "bh"])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_served_"))
    procs = []
    for seed in range(args.processes):
        cmd = [sys.executable, "-m", "bench.compiler.served", "--child", "--seed", str(seed)]
        cmd += ["--work", str(work), "--rows", str(args.rows), "--requests", str(args.requests)]
        cmd += ["--max-batch", str(args.max_batch), "--method", args.method]
        env = {**os.environ, "STITCHREC_CACHE": str(work / "cache")}
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        if res.returncode:
            sys.stderr.write(res.stderr[-4000:])
            return res.returncode
        procs.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(json.dumps(procs[-1]), flush=True)
    load = os.getloadavg()
    text = summarize(procs)
    print(text)
    (out / "results.json").write_text(
        json.dumps({"processes": procs, "loadavg": load, "args": vars(args)}, indent=1) + "\n"
    )
    (out / "summary.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
