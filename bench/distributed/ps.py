"""bench/distributed/ps: one process vs a local parameter-server cluster, same config and data.

    .venv/bin/python -m bench.distributed.ps --out runs/bench_distributed_ps
    .venv/bin/python -m bench.distributed.ps --out runs/bench_distributed_ps --rows 50000 --seeds 0

For each seed: writes the synthetic set (``--rows`` rows, 20% test) once, then runs
``stitchrec train`` (DCN-v2, batch ``--batch-size``, one epoch) as one process and as a cluster
of one chief, ``--workers`` workers and ``--ps`` ps tasks on 127.0.0.1
(``[distribute] strategy = "parameter_server"``, tables over ``--min-shard-bytes`` split over the
ps tasks). Prints test AUC and log loss of both (mean ± std over seeds and the largest per-seed
gap: asynchronous training matches one process only statistically) and training examples/s of
the cluster as a ratio to the single process measured in the same run, with the machine load.
All tasks share one machine's cores and the chief reads every batch (docs/distributed.md), so
the ratio measures overhead, not scaling. Writes ``results.json``.
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
from pipelines.distribute import free_ports
from pipelines.distribute_ps import local_cluster, ps_tf_config


def run_train(
    config: Path, out: Path, seed: int, workers: int, ps: int, timeout: float
) -> dict[str, Any]:
    """``stitchrec train`` in one process (``ps == 0``) or as ps + workers + chief processes;
    the chief's report."""
    overrides = [f"train.seed={seed}"]
    tf_configs: list[str | None] = [None]
    if ps:
        cluster = local_cluster(free_ports(1 + workers + ps), workers, ps)
        tasks = [("ps", i) for i in range(ps)] + [("worker", i) for i in range(workers)]
        tf_configs = [ps_tf_config(cluster, kind, i) for kind, i in [*tasks, ("chief", 0)]]
    else:
        overrides.append("distribute.strategy=none")
    t0 = time.time()
    run_tasks(train_command(config, out, *overrides), tf_configs, out, timeout)
    return report(out, t0, ps=ps, seed=seed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=250_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ps", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--min-shard-bytes", type=int, default=16384)
    ap.add_argument("--timeout", type=float, default=1200.0)
    args = ap.parse_args()
    if args.ps < 1 or args.workers < 1:
        raise SystemExit(f"--ps and --workers must be >= 1, got {args.ps} and {args.workers}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    data = synthetic_data(out / "data", args.rows)
    extra = (
        f'[distribute]\nstrategy = "parameter_server"\nps_min_shard_bytes = {args.min_shard_bytes}'
    )
    config = dcn_v2_config(out / "run.toml", data, args.batch_size, extra=extra)
    load = [os.getloadavg()]
    rows: list[dict[str, Any]] = []
    for seed in args.seeds:
        for ps in (0, args.ps):
            run = out / (f"ps{ps}-s{seed}" if ps else f"single-s{seed}")
            shutil.rmtree(run, ignore_errors=True)  # a fresh run, not a resume of the last one
            r = run_train(config, run, seed, args.workers, ps, args.timeout)
            rows.append(r)
            print(json.dumps(r), flush=True)
    load.append(os.getloadavg())

    def stat(ps: int, key: str) -> tuple[float, float]:
        return mean_std([r[key] for r in rows if r["ps"] == ps])

    single = {r["seed"]: r for r in rows if r["ps"] == 0}
    cluster = {r["seed"]: r for r in rows if r["ps"] == args.ps}
    gaps = [cluster[s]["auc"] - single[s]["auc"] for s in args.seeds]
    ratios = [
        cluster[s]["examples_per_second"] / single[s]["examples_per_second"] for s in args.seeds
    ]
    summary = {
        "rows": args.rows,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "ps": args.ps,
        "min_shard_bytes": args.min_shard_bytes,
        "seeds": args.seeds,
        "auc_single": stat(0, "auc"),
        "auc_cluster": stat(args.ps, "auc"),
        "logloss_single": stat(0, "logloss"),
        "logloss_cluster": stat(args.ps, "logloss"),
        "auc_gaps_cluster_minus_single": gaps,
        "examples_per_second_single": stat(0, "examples_per_second"),
        "examples_per_second_cluster": stat(args.ps, "examples_per_second"),
        "throughput_ratio_cluster_over_single": ratios,
        "cpus": os.cpu_count(),
        "loadavg_before_after": load,
        "runs": rows,
    }
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    name = f"chief+{args.workers}w+{args.ps}ps"
    for key in ("auc", "logloss", "examples_per_second"):
        (m1, s1), (m2, s2) = stat(0, key), stat(args.ps, key)
        print(f"{key:20s} single {m1:.5f} ± {s1:.5f}   {name} {m2:.5f} ± {s2:.5f}")
    print(f"per-seed AUC gaps (cluster - single): {', '.join(f'{g:+.4f}' for g in gaps)}")
    print(f"examples/s {name} / single: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(f"{os.cpu_count()} cpus, load average before {load[0]}, after {load[1]}")
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
