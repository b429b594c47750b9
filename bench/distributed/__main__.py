"""bench/distributed: one process vs a local cluster, same config, same data.

    .venv/bin/python -m bench.distributed --out runs/bench_distributed
    .venv/bin/python -m bench.distributed --out runs/bench_distributed --input split
    .venv/bin/python -m bench.distributed --out runs/bench_distributed_ps --ps 2
    .venv/bin/python -m bench.distributed --out runs/bench_distributed --rows 50000 --seeds 0

For each seed: writes the synthetic set (``--rows`` rows, 20% test) once, then runs
``stitchrec train`` (DCN-v2, batch ``--batch-size``, one epoch) as one process and as a cluster
on 127.0.0.1 (TF_CONFIG per process):

* ``--ps 0`` (the default): ``--workers`` workers, multi_worker_mirrored with
  ``[distribute] input = --input``; with ``split`` the cluster should follow the single-process
  run up to float rounding, with ``shard`` only statistically;
* ``--ps N``: one chief, ``--workers`` workers and N ps tasks, parameter_server, tables over
  ``--min-shard-bytes`` split over the ps tasks; asynchronous, so it matches one process only
  statistically.

Prints test AUC and log loss of both (mean ± std over seeds, and the per-seed gaps) and training
examples/s of the cluster as a ratio to the single process measured in the same run, with the
machine load. On one machine every task shares its cores (docs/distributed.md), so the ratio
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
    cluster_tf_configs,
    dcn_v2_config,
    mean_std,
    report,
    run_tasks,
    synthetic_data,
    train_command,
)


def run_train(
    config: Path, out: Path, seed: int, tf_configs: list[str | None], timeout: float
) -> dict[str, Any]:
    """``stitchrec train`` as one process per TF_CONFIG ([None]: one process, no cluster); the
    chief's report."""
    overrides = [f"train.seed={seed}"]
    if tf_configs == [None]:
        overrides.append("distribute.strategy=none")
    t0 = time.time()
    run_tasks(train_command(config, out, *overrides), tf_configs, out, timeout)
    return report(out, t0, cluster=tf_configs != [None], seed=seed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=250_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ps", type=int, default=0, help="ps tasks (0: multi_worker_mirrored)")
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--input", choices=["shard", "split"], default="shard")
    ap.add_argument("--min-shard-bytes", type=int, default=16384)
    ap.add_argument("--timeout", type=float, default=1200.0)
    args = ap.parse_args()
    if args.ps < 0 or args.workers < 1:
        raise SystemExit(f"--ps must be >= 0 and --workers >= 1, got {args.ps}, {args.workers}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = synthetic_data(out / "data", args.rows)
    if args.ps:
        name = f"chief+{args.workers}w+{args.ps}ps"
        extra = (
            f'[distribute]\nstrategy = "parameter_server"\n'
            f"ps_min_shard_bytes = {args.min_shard_bytes}"
        )
    else:
        name = f"{args.workers} workers ({args.input})"
        extra = f'[distribute]\ninput = "{args.input}"'
    config = dcn_v2_config(out / "run.toml", data, args.batch_size, extra=extra)
    load = [os.getloadavg()]
    rows: list[dict[str, Any]] = []
    for seed in args.seeds:
        for cluster in (False, True):
            run = out / f"{'cluster' if cluster else 'single'}-s{seed}"
            shutil.rmtree(run, ignore_errors=True)  # a finished run folder would resume, not train
            configs = cluster_tf_configs(args.workers, args.ps) if cluster else [None]
            r = run_train(config, run, seed, configs, args.timeout)
            rows.append(r)
            print(json.dumps(r), flush=True)
    load.append(os.getloadavg())

    def stat(cluster: bool, key: str) -> tuple[float, float]:
        return mean_std([r[key] for r in rows if r["cluster"] == cluster])

    single = {r["seed"]: r for r in rows if not r["cluster"]}
    clustered = {r["seed"]: r for r in rows if r["cluster"]}
    gaps = [clustered[s]["auc"] - single[s]["auc"] for s in args.seeds]
    ratios = [
        clustered[s]["examples_per_second"] / single[s]["examples_per_second"] for s in args.seeds
    ]
    summary = {
        "rows": args.rows,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "ps": args.ps,
        "input": None if args.ps else args.input,
        "min_shard_bytes": args.min_shard_bytes if args.ps else None,
        "seeds": args.seeds,
        "auc_single": stat(False, "auc"),
        "auc_cluster": stat(True, "auc"),
        "logloss_single": stat(False, "logloss"),
        "logloss_cluster": stat(True, "logloss"),
        "auc_gaps_cluster_minus_single": gaps,
        "examples_per_second_single": stat(False, "examples_per_second"),
        "examples_per_second_cluster": stat(True, "examples_per_second"),
        "throughput_ratio_cluster_over_single": ratios,
        "cpus": os.cpu_count(),
        "loadavg_before_after": load,
        "runs": rows,
    }
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    for key in ("auc", "logloss", "examples_per_second"):
        (m1, s1), (m2, s2) = stat(False, key), stat(True, key)
        print(f"{key:20s} single {m1:.5f} ± {s1:.5f}   {name} {m2:.5f} ± {s2:.5f}")
    print(f"per-seed AUC gaps (cluster - single): {', '.join(f'{g:+.2e}' for g in gaps)}")
    print(f"examples/s {name} / single: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(f"{os.cpu_count()} cpus, load average before {load[0]}, after {load[1]}")
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
