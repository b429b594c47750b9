"""AutoLRS against step schedules tuned by grid search on the validation split.

Every run trains DCN-v2 (the config defaults, batch ``--batch-size``) for a fixed budget of
``--epochs`` epochs with early stopping off, evaluating the validation split every half epoch.
The grid (``GRID``: constant, cosine and step schedules at a few peak rates) runs with seed 0;
the schedule of the highest validation AUC is the grid's choice. Then the chosen schedule and
``lr_schedule = "autolrs"`` (``tau`` = one epoch, its other options at their defaults) run
with ``--seeds`` seeds each. Printed per dataset:

- steps to reach the grid choice's best validation AUC (seed 0's): the first evaluation at or
  above it; for AutoLRS the trained steps plus the search steps spent up to there (None when
  it never gets there), and their ratio;
- test AUC of each run's selected (best validation) checkpoint, at equal trained steps, with
  the paired bootstrap of AutoLRS minus the grid choice per seed and of its mean over the seeds
  (``bench.training.quality.paired_over_seeds``);
- wall time (training and validation, AutoLRS's search included; not the data preparation):
  the whole grid against one AutoLRS run.

    python -m bench.training.autolrs_vs_grid --data-root ../shared/data
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import tensorflow as tf

from bench.training.lr_baseline import REPO, bench_parser, converted, dataset_configs
from bench.training.quality import paired, paired_over_seeds, test_scores
from features.dataset import list_parquet
from features.schema import load_schema
from pipelines.config import config_from_dict
from pipelines.train import train

#: (label, [train] keys) of the grid; ``{total}`` in an option is the run's total steps.
GRID: list[tuple[str, dict[str, Any]]] = [
    ("constant 1e-3", {"learning_rate": 1e-3}),
    ("constant 3e-3", {"learning_rate": 3e-3}),
    ("constant 1e-2", {"learning_rate": 1e-2}),
    ("cosine 3e-3", {"learning_rate": 3e-3, "lr_schedule": "cosine"}),
    ("cosine 1e-2", {"learning_rate": 1e-2, "lr_schedule": "cosine"}),
    ("step 1e-2 /3 x0.3", {"learning_rate": 1e-2, "lr_schedule": "step", "step_frac": 3}),
]


def run(data: dict, out: Path, seed: int, keys: dict[str, Any], args: Any, spe: int) -> dict:
    tc = {
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "seed": seed,
        "early_stopping": False,
        "eval_every": max(spe // 2, 1),
        "log_every": 10**6,
        **{k: v for k, v in keys.items() if k != "step_frac"},
    }
    if "step_frac" in keys:
        tc["lr_schedule_options"] = {
            "step_size": max(spe * args.epochs // keys["step_frac"], 1),
            "gamma": 0.3,
        }
    if keys.get("lr_schedule") == "autolrs":
        tc["lr_schedule_options"] = {"tau": spe}
    cfg = config_from_dict(
        {"output_dir": str(out), "data": data, "model": {"type": "dcn_v2"}, "train": tc},
        base_dir=REPO,
    )
    done = out / "train_report.json"  # a run finished by an earlier call of the bench
    report = json.loads(done.read_text()) if done.exists() else train(cfg, lambda _line: None)
    # training (AutoLRS's search included) and validation time, without the data preparation
    report["wall_seconds"] = report["train_seconds"] + report["eval_seconds"]
    return report


def best_val(report: dict) -> float:
    return max(e["auc"] for e in report["epochs"])


def steps_to(report: dict, target: float) -> int | None:
    """Trained steps (plus AutoLRS's search steps so far) of the first evaluation >= target."""
    stages = (report.get("autolrs") or {}).get("stages", [])
    for e in report["epochs"]:
        if e["auc"] >= target:
            search = sum(s["search_steps"] for s in stages if s["start_step"] < e["step"])
            return e["step"] + search
    return None


def bench_dataset(name: str, args: Any, work: Path) -> dict[str, Any] | None:
    data = dataset_configs(name, Path(args.data_root), work, args.rows)
    if data is None:
        return None
    probe = work / "probe"  # one step: converts the data once and counts the training rows
    spe = math.ceil(run(data, probe, 0, {"max_steps": 1}, args, 1)["train_rows"] / args.batch_size)
    shards = converted(probe, data)
    grid, t_grid = {}, 0.0
    for i, (label, keys) in enumerate(GRID):
        grid[label] = run(shards, work / f"grid{i}", 0, keys, args, spe)
        t_grid += grid[label]["wall_seconds"]
        print(f"  {name} {label}: best validation auc {best_val(grid[label]):.4f}", flush=True)
    choice = max(grid, key=lambda k: best_val(grid[k]))
    target = best_val(grid[choice])
    chosen_keys = dict(GRID)[choice]
    runs: dict[str, list[dict]] = {"grid choice": [grid[choice]], "autolrs": []}
    for seed in range(args.seeds):
        if seed:
            runs["grid choice"].append(run(shards, work / f"c{seed}", seed, chosen_keys, args, spe))
        runs["autolrs"].append(
            run(shards, work / f"a{seed}", seed, {"lr_schedule": "autolrs"}, args, spe)
        )
    pairs = []  # the paired bootstrap of test AUC, autolrs - grid choice, seed by seed
    scores: dict[str, list[np.ndarray]] = {"grid": [], "autolrs": []}
    for seed in range(args.seeds):
        grid_dir = work / (
            "grid" + str([k for k, _ in GRID].index(choice)) if not seed else f"c{seed}"
        )
        test = converted(grid_dir, shards)["test"]
        y = np.concatenate(
            [
                pq.read_table(f).column(load_schema(grid_dir / "schema.toml").label.name).to_numpy()
                for f in list_parquet(test)
            ]
        )
        scores["grid"].append(test_scores(grid_dir, test))
        scores["autolrs"].append(test_scores(work / f"a{seed}", test))
        pairs.append(paired(y, scores["grid"][-1], scores["autolrs"][-1]))
    return {
        "name": name,
        "choice": choice,
        "target": target,
        "runs": runs,
        "grid_s": t_grid,
        "pairs": pairs,
        "over_seeds": paired_over_seeds(y, scores["grid"], scores["autolrs"]),
    }


def report(result: dict[str, Any]) -> dict[str, Any]:
    print(
        f"\n== {result['name']}: grid choice {result['choice']}, best validation auc "
        f"{result['target']:.4f} (seed 0)"
    )
    summary = {"name": result["name"], "choice": result["choice"], "target": result["target"]}
    for label, runs in result["runs"].items():
        reach = [steps_to(r, result["target"]) for r in runs]
        tests = [r["test"]["auc"] for r in runs]
        std = statistics.stdev(tests) if len(tests) > 1 else 0.0
        wall = statistics.fmean(r["wall_seconds"] for r in runs)
        search = [(r.get("autolrs") or {}).get("search_steps", 0) for r in runs]
        print(
            f"{label}: steps to target {reach} (search steps in total {search}), test auc "
            f"{statistics.fmean(tests):.4f} ± {std:.4f} at {runs[0]['steps']} trained steps, "
            f"{wall:.0f} s per run"
        )
        summary[label] = {"reach": reach, "test": tests, "wall": wall, "search": search}
    g, a = summary["grid choice"]["reach"][0], summary["autolrs"]["reach"]
    ratios = [round(g / x, 2) if x else None for x in a]
    print(f"steps ratio grid / autolrs (> 1: autolrs reaches it sooner): {ratios}")
    print(
        f"wall: grid of {len(GRID)} runs {result['grid_s']:.0f} s; one autolrs run "
        f"{summary['autolrs']['wall']:.0f} s"
    )
    summary["ratios"], summary["grid_seconds"] = ratios, result["grid_s"]
    print(
        "test auc, autolrs - grid choice (paired bootstrap, 95% CI): "
        + ", ".join(
            f"{p['delta']:+.4f} [{p['ci_low']:+.4f}, {p['ci_high']:+.4f}]" for p in result["pairs"]
        )
    )
    pooled = result["over_seeds"]
    print(
        f"  mean over the {len(result['pairs'])} seeds: {pooled['delta']:+.4f} "
        f"[{pooled['ci_low']:+.4f}, {pooled['ci_high']:+.4f}] ({pooled['verdict']})"
    )
    summary["paired"] = [
        {k: p[k] for k in ("delta", "ci_low", "ci_high", "verdict")} for p in result["pairs"]
    ]
    summary["over_seeds"] = {k: pooled[k] for k in ("delta", "ci_low", "ci_high", "verdict")}
    return summary


def main(argv: list[str] | None = None) -> None:
    p = bench_parser(__doc__, "movielens,synthetic", 20_000)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    print(f"machine: {platform.node()}, tensorflow {tf.__version__}, epochs {args.epochs}")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.datasets.split(","):
            r = bench_dataset(name.strip(), args, Path(args.work or tmp) / name.strip())
            if r is not None:
                out.append(report(r))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
