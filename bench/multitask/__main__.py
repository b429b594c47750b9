"""Behaviour sequences, multi-task heads and the M6-T expert layer, with paired intervals.

Sections (``--sections``, default all), each over ``--seeds`` seeds (mean ± standard deviation;
every paired interval is ``pipelines.evaluation.compare.compare_scores``, the engine of
``stitchrec ab``: 1,000 bootstrap resamples of the test rows, 95%; a table cell "d [lo, hi] b/w"
is the mean difference over the seeds, the widest interval of any seed, and how many seeds'
intervals lie above / below 0). Every method of a dataset is scored on the same test rows: the
first run converts the data and every other run reads its shards.

- ``sequences``: single-task dnn with ``sequence_pooling`` din vs mean vs none on the synthetic
  log (``features.synthetic`` with sequences and conversion, ``--rows`` rows) and on MovieLens
  with each rating's 20 previous movies (``features.history``, schema movielens_history; skipped
  with a message without ``--data-root``/movielens-latest-small): test AUC, GAUC by user
  (MovieLens only: the synthetic rows carry no user), training examples/s and serving latency
  per candidate (median of timed calls of the exported ``serving_default`` on one 512-row test
  batch, every model in the same process, interleaved) relative to mean pooling.
- ``multitask``: the synthetic log's click and conversion-after-click. ``independent`` is a
  single-task click model plus a conversion model trained on the clicked rows only (its
  CTCVR score is pCTR * pCVR); ``shared_bottom``, ``mmoe``, ``ple`` and ``esmm`` are two-task
  models. Per task: click AUC (all rows), CTCVR AUC (buy on all rows, joint score
  ``score_buy``), CVR AUC (buy on the clicked rows, conditional score
  ``score_buy_given_click``), paired vs ``independent`` and vs ``shared_bottom``.
- ``moe``: single-task dnn with ``expert_layer = "moe"`` (8 experts): top-1, top-2 and 2
  prototypes of 4 experts (top-1 each) at equal activated FLOPs per example; test AUC,
  examples/s and the fraction of routed assignments dropped past expert capacity.
- ``export``: SavedModel bytes (``pipelines.export.saved_model_bytes``) and serving latency per
  candidate of seed 0's multi-task models relative to the single-task click model.

Every model: embedding_dim ``--embedding-dim``, ``--epochs`` epochs, batch ``--batch-size``;
a run folder of ``--work`` holding a finished run is read back, not trained again.

    python -m bench.multitask --seeds 3 --rows 30000 --data-root ../shared/data
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.multitask.data import movielens, synthetic
from bench.multitask.moe import bench_moe
from bench.multitask.multitask import bench_export, bench_multitask
from bench.multitask.sequences import BASELINE, DEFAULT_POOLINGS, POOLINGS, bench_sequences
from bench.training.lr_baseline import bench_parser, run_bench

SECTIONS = ("sequences", "multitask", "moe", "export")


def parse(argv: list[str] | None) -> Any:
    p = bench_parser(__doc__, "synthetic,movielens", 30_000)
    p.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated sections")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--embedding-dim", type=int, default=8)
    p.add_argument(
        "--poolings",
        default=",".join(DEFAULT_POOLINGS),
        help=f"sequences: some of {','.join(POOLINGS)}, with mean (din_paper: DIN's activation "
        "unit on the raw vectors, sequence_options normalize = false)",
    )
    p.add_argument(
        "--din-hidden",
        type=int,
        nargs="*",
        default=[],
        help="din: the activation unit's hidden sizes (default: the model's)",
    )
    p.add_argument(
        "--train-defaults",
        action="store_true",
        help="train with the config defaults' weight average and Adam at 3e-3 "
        "(default: Adam at 1e-3 without it, as docs/multitask.md measured)",
    )
    p.add_argument("--latency-calls", type=int, default=50, help="timed calls per model")
    p.add_argument("--json", default="", help="write the results here")
    args = p.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        p.error(f"--sections: unknown {unknown}; expected some of {list(SECTIONS)}")
    args.poolings = [x.strip() for x in args.poolings.split(",") if x.strip()]
    if BASELINE not in args.poolings or sorted(set(args.poolings) - set(POOLINGS)):
        p.error(f"--poolings: some of {list(POOLINGS)} including {BASELINE!r}, got {args.poolings}")
    args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if sorted(set(args.datasets) - {"synthetic", "movielens"}):
        p.error(f"--datasets: expected synthetic and/or movielens, got {args.datasets}")
    return args


def run_sections(args: Any, work: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    needs_syn = set(args.sections) != {"sequences"} or "synthetic" in args.datasets
    syn = synthetic(work, args.rows) if needs_syn else {}
    if "sequences" in args.sections:
        results["sequences"] = {}
        for name in args.datasets:
            data = syn if name == "synthetic" else movielens(work, Path(args.data_root))
            if data is not None:
                results["sequences"][name] = bench_sequences(name, data, work, args)
    if "multitask" in args.sections:
        results["multitask"] = bench_multitask(syn, work, args)
    if "moe" in args.sections:
        results["moe"] = bench_moe(syn, work, args)
    if "export" in args.sections:
        results["export"] = bench_export(syn, work, args)
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    settings = (
        f"seeds 0..{args.seeds - 1}, epochs {args.epochs}, batch {args.batch_size}, "
        f"synthetic rows {args.rows:,}, sections {args.sections}"
    )
    return run_bench(args, settings, lambda work: run_sections(args, work))


if __name__ == "__main__":
    main()
