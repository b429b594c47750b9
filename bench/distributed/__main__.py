"""bench/distributed: one process vs a local multi-worker cluster, same config, same data.

    .venv/bin/python -m bench.distributed --out runs/bench_distributed
    .venv/bin/python -m bench.distributed --out runs/bench_distributed --rows 50000 --seeds 0

For each seed: writes the synthetic set (``--rows`` rows, 20% test) once, then runs
``stitchrec train`` (DCN-v2, batch ``--batch-size``, one epoch) as one process and as
``--workers`` worker processes on 127.0.0.1 (TF_CONFIG per process, multi_worker_mirrored,
``[distribute] input = --input``). Prints test AUC and log loss of both (mean ± std over seeds,
and the largest per-seed gap: with ``--input split`` the mirrored cluster should follow the
single-process run up to float rounding; with ``shard`` only statistically) and training
examples/s of the cluster as a ratio to the single process measured in the same run, with the
machine load. On one machine the workers share its cores (docs/distributed.md), so the ratio
measures overhead, not scaling. Writes ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from bench.cluster import (
    dcn_v2_config,
    mean_std,
    report,
    run_tasks,
    synthetic_data,
    train_command,
)
from pipelines.distribute import free_ports, worker_tf_config


def run_train(config: Path, out: Path, seed: int, workers: int, timeout: float) -> dict[str, Any]:
    """``stitchrec train`` as ``workers`` processes (1: no TF_CONFIG); the chief's report."""
    ports = free_ports(workers)
    tf_configs = [worker_tf_config(ports, i) if workers > 1 else None for i in range(workers)]
    t0 = time.time()
    run_tasks(train_command(config, out, f"train.seed={seed}"), tf_configs, out, timeout)
    return report(out, t0, workers=workers, seed=seed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=250_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--input", choices=["shard", "split"], default="shard")
    ap.add_argument("--timeout", type=float, default=1200.0)
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    data = synthetic_data(out / "data", args.rows)
    extra = f'[distribute]\ninput = "{args.input}"'
    config = dcn_v2_config(out / "run.toml", data, args.batch_size, extra=extra)
    load = [os.getloadavg()]
    rows: list[dict[str, Any]] = []
    for seed in args.seeds:
        for workers in (1, args.workers):
            run = out / f"w{workers}-s{seed}"
            shutil.rmtree(run, ignore_errors=True)  # a finished run folder would resume, not train
            r = run_train(config, run, seed, workers, args.timeout)
            rows.append(r)
            print(json.dumps(r), flush=True)
    load.append(os.getloadavg())

    def stat(workers: int, key: str) -> tuple[float, float]:
        return mean_std([r[key] for r in rows if r["workers"] == workers])

    single = {r["seed"]: r for r in rows if r["workers"] == 1}
    cluster = {r["seed"]: r for r in rows if r["workers"] == args.workers}
    gaps = [abs(cluster[s]["auc"] - single[s]["auc"]) for s in args.seeds]
    ratios = [
        cluster[s]["examples_per_second"] / single[s]["examples_per_second"] for s in args.seeds
    ]
    summary = {
        "rows": args.rows,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "input": args.input,
        "seeds": args.seeds,
        "auc_single": stat(1, "auc"),
        "auc_cluster": stat(args.workers, "auc"),
        "logloss_single": stat(1, "logloss"),
        "logloss_cluster": stat(args.workers, "logloss"),
        "max_auc_gap": max(gaps),
        "examples_per_second_single": stat(1, "examples_per_second"),
        "examples_per_second_cluster": stat(args.workers, "examples_per_second"),
        "throughput_ratio_cluster_over_single": ratios,
        "cpus": os.cpu_count(),
        "loadavg_before_after": load,
        "runs": rows,
    }
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    for key in ("auc", "logloss", "examples_per_second"):
        (m1, s1), (m2, s2) = stat(1, key), stat(args.workers, key)
        print(f"{key:20s} single {m1:.5f} ± {s1:.5f}   {args.workers} workers {m2:.5f} ± {s2:.5f}")
    print(f"largest per-seed AUC gap {max(gaps):.2e}")
    print(f"examples/s {args.workers} workers / single: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(f"{os.cpu_count()} cpus, load average before {load[0]}, after {load[1]}")
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
