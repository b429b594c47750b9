"""The bench's arms over daily windows, each a chain of training runs (``pipelines.train``).

For day ``d`` (the model trained through day ``d`` is tested on day ``d + 1``):

- ``frozen``: the run of day 0, never trained again;
- ``sliding``: a run from scratch on the last ``--window`` days' training shards
  (``[data] train`` lists them);
- ``continuous``: ``[train] continue_from`` the previous day's run, trained on day ``d`` only,
  its vocabularies under the default ``[vocab]`` (nothing evicted);
- ``continuous_evict``: the same with ``[vocab] evict_after = --evict-after`` and the item
  field's ``max_vocab`` (``--item-max-vocab``; 0: the size of day 0's item vocabulary).

Every run has the same ``[model]`` and the config defaults' validation split and early
stopping, and is exported; a run folder holding a finished run is read back, not trained again.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from bench.continuous.windows import Windows, capped_schema
from bench.training.lr_baseline import REPO
from features.stats import DatasetStats
from features.synthetic_days_config import day_name
from pipelines.config import config_from_dict
from pipelines.export import export_run, saved_model_bytes
from pipelines.train import train

ARMS = ("frozen", "sliding", "continuous", "continuous_evict")
WALL_FILE = "bench_wall.json"


@dataclasses.dataclass
class DayRun:
    """One finished, exported run: its folder, export, report, the seconds of the whole
    ``train`` call, its vocabulary sizes per field and its export's bytes."""

    dir: Path
    export: Path
    report: dict[str, Any]
    wall_seconds: float
    vocab: dict[str, int]
    export_bytes: int


def model_config(args: Any) -> dict[str, Any]:
    """The ``[model]`` of every arm."""
    return {"type": "dnn", "embedding_dim": args.embedding_dim, "mlp": [64, 32]}


def train_day(
    out: Path,
    data: dict[str, Any],
    seed: int,
    args: Any,
    continue_from: Path | None = None,
    vocab: dict[str, Any] | None = None,
) -> DayRun:
    """Trains (or reads back) the run ``out`` of ``data`` and exports it."""
    if (out / "train_report.json").exists():
        report = json.loads((out / "train_report.json").read_text())
        wall = json.loads((out / WALL_FILE).read_text())["seconds"]
    else:
        tc: dict[str, Any] = {
            "seed": seed,
            "log_every": 10**6,
            "checkpoint_every": 10**6,
            "weight_average": "none",  # Adam at 1e-3, as docs/continuous.md measured
        }
        if continue_from is not None:
            tc["continue_from"] = str(continue_from)
            tc["continue_epochs"] = args.continue_epochs
        raw = {"output_dir": str(out), "data": data, "model": model_config(args), "train": tc}
        if vocab:
            raw["vocab"] = vocab
        t0 = time.perf_counter()
        report = train(config_from_dict(raw, base_dir=REPO), lambda _line: None)
        wall = time.perf_counter() - t0
        (out / WALL_FILE).write_text(json.dumps({"seconds": wall}))
    export = out / "bench_export"
    if not (export / "saved_model.pb").exists():
        export_run(out, export)
    stats = DatasetStats.load(out / "stats")
    sizes = {n: fs.vocab_size for n, fs in stats.fields.items() if fs.vocab_size}
    nbytes = saved_model_bytes(export)["total"]
    return DayRun(out, export, report, wall, sizes, nbytes)


def _data(schema: Path, train: list[Path], test: Path) -> dict[str, Any]:
    return {"schema": str(schema), "train": [str(t) for t in train], "test": [str(test)]}


def run_arms(windows: Windows, seed: int, work: Path, args: Any) -> dict[str, dict[int, DayRun]]:
    """Every arm's run of each day ``0 .. days - 2`` for one seed (day 0: the shared run)."""
    root = work / windows.name / f"seed{seed}"
    day0 = train_day(
        root / "day0", _data(windows.schema, windows.train[:1], windows.test[1]), seed, args
    )
    cap = args.item_max_vocab or day0.vocab[windows.item]
    capped = capped_schema(windows, windows.item, cap, root / "schema_capped.toml")
    runs: dict[str, dict[int, DayRun]] = {arm: {0: day0} for arm in ARMS}
    evict = {"evict_after": args.evict_after}
    for d in range(1, windows.days - 1):
        test, name = windows.test[d + 1], day_name(d)
        first = max(0, d - args.window + 1)
        runs["frozen"][d] = day0
        runs["sliding"][d] = train_day(
            root / "sliding" / name,
            _data(windows.schema, windows.train[first : d + 1], test),
            seed,
            args,
        )
        for arm, schema, vocab in (
            ("continuous", windows.schema, None),
            ("continuous_evict", capped, evict),
        ):
            runs[arm][d] = train_day(
                root / arm / name,
                _data(schema, [windows.train[d]], test),
                seed,
                args,
                continue_from=runs[arm][d - 1].dir,
                vocab=vocab,
            )
        aucs = ", ".join(f"{a} {runs[a][d].report['test']['auc']:.4f}" for a in ARMS[1:])
        print(f"  {windows.name} seed {seed} day {d}: next-day test AUC {aucs}", flush=True)
    return runs
