"""Continuous daily training against a sliding-window retrain and a frozen model.

Per dataset, seed and day ``d >= 1`` of daily windows (``bench.continuous.windows``; the
synthetic days of ``features.synthetic_days``, ``--days`` days of ``--rows`` rows, items and
users churning by ``--item-churn`` / ``--user-churn`` a day, the click model drifting by
``--drift``), the model trained through day ``d`` is scored on day ``d + 1``'s test rows for
four arms (``bench.continuous.arms``):

- ``frozen``: the day-0 model;
- ``sliding``: retrained from scratch on the last ``--window`` days;
- ``continuous``: ``[train] continue_from`` day ``d - 1``'s run, trained on day ``d`` only,
  its vocabularies id-stable (``features.vocab_state``) and never evicting;
- ``continuous_evict``: the same with ``[vocab] evict_after = --evict-after`` and ``max_vocab``
  on the item field (``--item-max-vocab``; 0: day 0's item vocabulary size).

Figures (``bench.continuous.report``): next-day test AUC of each arm (mean ± sd over the seeds,
with the day's oracle AUC, the ceiling of any model); paired next-day AUC differences
(continuous - sliding, continuous_evict - sliding, continuous_evict - continuous, continuous -
frozen), each seed's from ``pipelines.evaluation.compare.compare_scores``, the engine of
``stitchrec ab`` (1,000 bootstrap resamples of the test rows, 95%; a cell "d [lo, hi] b/w" is
the mean difference over the seeds, the widest interval of any seed, and how many seeds'
intervals lie above / below 0); training seconds per day of the trained arms (the training
loop, and in parentheses the whole ``train`` call: data split, statistics, model, loop, test;
then the steps trained), with the continued run's share of the retrain's loop seconds and
steps; vocabulary sizes per day (the item field and the sum over all vocabulary fields); the
eviction arm's vocabulary against the values seen in its horizon; SavedModel bytes per day.
Every arm has the same model (dnn, embedding_dim ``--embedding-dim``, mlp [64, 32]) and the
config defaults' training: Adam 1e-3, batch 256, a 10% validation split and early stopping
(patience 2, at most 20 epochs; continued runs at most ``--continue-epochs``, the ``[train]
continue_epochs`` key, where it is not 0). ``--datasets movielens`` reads MovieLens under
``--data-root`` (``bench.continuous.windows``). Runs live under ``--work`` (a temporary folder by
default); a run folder holding a finished run is read back, not trained again, so seeds run as
separate processes on one ``--work`` (``--first-seed``) are tabled together by a last call
with all the seeds.

    python -m bench.continuous --seeds 3 --days 8 --continue-epochs 1 --json /tmp/continuous.json
    python -m bench.continuous --datasets movielens --days 12 --continue-epochs 1 \
        --item-max-vocab 3000
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.continuous.arms import run_arms
from bench.continuous.report import print_tables, seed_figures
from bench.continuous.windows import WINDOW_SOURCES
from bench.training.lr_baseline import bench_parser, run_bench


def parse(argv: list[str] | None) -> Any:
    p = bench_parser(__doc__, "synthetic", 20_000)
    p.add_argument(
        "--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1"
    )
    p.add_argument("--days", type=int, default=8, help="daily windows (at least 3)")
    p.add_argument("--items", type=int, default=2_000, help="synthetic: active items per day")
    p.add_argument("--users", type=int, default=20_000, help="synthetic: active users per day")
    p.add_argument("--item-churn", type=float, default=0.05)
    p.add_argument("--user-churn", type=float, default=0.02)
    p.add_argument("--drift", type=float, default=0.05)
    p.add_argument("--window", type=int, default=3, help="sliding: days per retrain")
    p.add_argument("--evict-after", type=int, default=2, help="continuous_evict: [vocab] key")
    p.add_argument(
        "--item-max-vocab", type=int, default=0, help="continuous_evict (0: day 0's item vocab)"
    )
    p.add_argument("--embedding-dim", type=int, default=8)
    p.add_argument(
        "--continue-epochs",
        type=int,
        default=0,
        help="the continuous arms' [train] continue_epochs (0: early stopping, at most 20)",
    )
    p.add_argument("--json", default="", help="write the results here")
    args = p.parse_args(argv)
    args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    unknown = sorted(set(args.datasets) - set(WINDOW_SOURCES))
    if unknown:
        p.error(f"--datasets: unknown {unknown}; expected some of {sorted(WINDOW_SOURCES)}")
    if args.days < 3:
        p.error(f"--days {args.days}: expected at least 3 (day 0, a trained day, its next day)")
    if args.continue_epochs < 0:
        p.error(f"--continue-epochs {args.continue_epochs}: expected at least 0")
    for flag in ("seeds", "window", "evict_after"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: expected at least 1")
    return args


def bench_dataset(name: str, work: Path, args: Any) -> list[dict[str, Any]]:
    """Every seed's figures of one dataset."""
    seeds = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        windows = WINDOW_SOURCES[name](work, seed, args)
        runs = run_arms(windows, seed, work, args)
        seeds.append(seed_figures(windows, runs, args.evict_after))
    return seeds


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)

    def body(work: Path) -> dict[str, Any]:
        results: dict[str, Any] = {"settings": dict(vars(args))}
        for name in args.datasets:
            results[name] = bench_dataset(name, work, args)
            print_tables(name, results[name])
        return results

    settings = (
        f"seeds {args.first_seed}..{args.first_seed + args.seeds - 1}, {args.days} days of "
        f"{args.rows:,} rows, window {args.window}, evict_after {args.evict_after}"
    )
    return run_bench(args, settings, body)


if __name__ == "__main__":
    main()
