"""bench/serving/quantize: one trained run exported fp32, fp16 and int8 (``export --quantize``).

    .venv/bin/python -m bench.serving.quantize --dataset synthetic --rows 200000
    .venv/bin/python -m bench.serving.quantize --dataset movielens --data-root ../shared/data

Trains one DCN-v2 run (``--dim`` wide embeddings, one epoch; a finished run in ``--work`` is
read back), exports its selected checkpoint three times from the same model object, and for
each export prints:

* ``table B``: bytes of the embedding tables the SavedModel holds (the ``quantization`` record
  of ``stitchrec.json``; tables under ``--min-rows`` rows stay fp32 in every export);
* ``variables B``: the SavedModel's ``variables/`` bytes on disk;
* ``RSS MB``: VmRSS of a fresh process after it loaded the SavedModel and scored one batch of
  1,024 test rows, and ``+RSS MB`` that minus the VmRSS the same process had before the load
  (medians over ``--repeats`` processes);
* ``+load MB``: what a fresh process gains by the load alone, before any call, and ``graph
  MB`` the same load without restoring the variables (the loaded functions' share; medians);
* the test AUC and log loss (``pipelines.evaluate`` on the run's test split) and their deltas.

Ratios are fp32 / quantized (bytes) and quantized - fp32 (quality), all in the same run.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from bench.rss import load_rss_kb, serving_rss_kb
from embeddings.quantize import quantized_form
from features import synthetic, synthetic_config
from features.dataset import list_parquet
from pipelines.config import DataConfig, PipelineConfig, TrainConfig
from pipelines.evaluate import evaluate
from pipelines.export import export_saved_model, saved_model_bytes
from pipelines.run.model import load_trained_model
from pipelines.run.paths import ASSETS_EXTRA, RunPaths
from pipelines.train import train
from ranking.config import ModelConfig

ROOT = Path(__file__).resolve().parents[2]
MODES = ("fp32", "fp16", "int8")


def rss_mb(model_dir: Path, test_dir: Path, repeats: int) -> tuple[float, float]:
    """Medians over ``repeats`` fresh serving processes of (VmRSS, VmRSS minus that before the
    load), in MB."""
    found = []
    for _ in range(repeats):
        base, rss = serving_rss_kb(model_dir, test_dir)
        found.append((rss / 1024, (rss - base) / 1024))
    return statistics.median(f[0] for f in found), statistics.median(f[1] for f in found)


def load_mb(model_dir: Path, repeats: int) -> tuple[float, float]:
    """Medians over ``repeats`` fresh processes of the VmRSS gained by loading ``model_dir``
    with its variables and without them, in MB."""
    full = [load_rss_kb(model_dir) / 1024 for _ in range(repeats)]
    graph = [load_rss_kb(model_dir, variables=False) / 1024 for _ in range(repeats)]
    return statistics.median(full), statistics.median(graph)


def data_config(args: argparse.Namespace, work: Path) -> DataConfig:
    if args.dataset == "movielens":
        ratings = Path(args.data_root) / "movielens-latest-small" / "ratings.csv"
        return DataConfig(schema="movielens", raw=(str(ratings),), test_fraction=0.2)
    out = work / "synthetic-data"
    if not (out / "ground_truth.json").exists():
        cfg = synthetic_config.SyntheticConfig(rows=args.rows, n_single=8, seed=0)
        synthetic.write_dataset(cfg, out, test_fraction=0.2)
    return DataConfig(
        schema=str(out / "schema.toml"), train=(str(out / "train"),), test=(str(out / "test"),)
    )


def trained_run(args: argparse.Namespace, work: Path) -> Path:
    """The run folder, trained unless a finished run is there."""
    run = work / f"run-{args.dataset}-d{args.dim}"
    if RunPaths(run).report.exists():
        return run
    model = ModelConfig(type="dcn_v2", embedding_dim=args.dim, mlp=(128, 64), cross_layers=2)
    tc = TrainConfig(batch_size=1024, epochs=args.epochs, learning_rate=2e-3, log_every=10**6)
    cfg = PipelineConfig(output_dir=str(run), data=data_config(args, work), model=model, train=tc)
    train(cfg, log=lambda _: None)
    return run


def test_files(run: Path, work: Path) -> Path:
    """The run's test split: its converted shards (raw data), else the synthetic test folder."""
    converted = RunPaths(run).data / "test"
    return converted if converted.exists() else work / "synthetic-data" / "test"


def measure(run: Path, test: Path, min_rows: int, repeats: int) -> list[dict[str, Any]]:
    model, schema, _ = load_trained_model(run)
    rows = []
    for mode in MODES:
        out = run / "bench-quantize" / mode
        quantize = None if mode == "fp32" else mode
        export_saved_model(model, schema, out, quantize=quantize, quantize_min_rows=min_rows)
        meta = json.loads((out / ASSETS_EXTRA / "stitchrec.json").read_text())
        if quantize is None:  # the same tables, as they stay in fp32
            record = quantized_form(model.embedding, "int8", min_rows)[1]
            table = record["bytes_fp32"]
        else:
            table = meta["quantization"]["bytes"]
        rss, added = rss_mb(out, test, repeats)
        loaded, graph = load_mb(out, repeats)
        quality = evaluate(out, list_parquet([test]))
        rows.append(
            {
                "mode": mode,
                "table_bytes": table,
                "variables_bytes": saved_model_bytes(out)["variables"],
                "rss_mb": round(rss, 1),
                "rss_added_mb": round(added, 1),
                "load_mb": round(loaded, 1),
                "graph_mb": round(graph, 1),
                "auc": quality["auc"],
                "logloss": quality["logloss"],
                "rows": quality["rows"],
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    base = rows[0]
    print(
        f"{'mode':5s} {'table B':>11s} {'x':>6s} {'variables B':>12s} {'x':>6s} "
        f"{'RSS MB':>7s} {'+RSS MB':>8s} {'x':>6s} {'+load MB':>9s} {'graph MB':>9s} "
        f"{'AUC':>8s} {'dAUC':>9s} "
        f"{'logloss':>8s} {'dlogloss':>9s}"
    )
    for r in rows:
        print(
            f"{r['mode']:5s} {r['table_bytes']:>11,d} "
            f"{base['table_bytes'] / r['table_bytes']:>6.2f} {r['variables_bytes']:>12,d} "
            f"{base['variables_bytes'] / r['variables_bytes']:>6.2f} {r['rss_mb']:>7.1f} "
            f"{r['rss_added_mb']:>8.1f} {base['rss_added_mb'] / r['rss_added_mb']:>6.2f} "
            f"{r['load_mb']:>9.1f} {r['graph_mb']:>9.1f} "
            f"{r['auc']:>8.5f} {r['auc'] - base['auc']:>+9.6f} {r['logloss']:>8.5f} "
            f"{r['logloss'] - base['logloss']:>+9.6f}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", choices=("synthetic", "movielens"), default="synthetic")
    p.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--rows", type=int, default=200_000, help="synthetic rows")
    p.add_argument("--dim", type=int, default=32, help="embedding dimension")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--min-rows", type=int, default=1024, help="--quantize-min-rows")
    p.add_argument("--repeats", type=int, default=3, help="serving processes per export (RSS)")
    p.add_argument("--work", default="", help="run folder (default: a temporary folder)")
    args = p.parse_args(argv)
    print(f"machine: {platform.node()} {platform.machine()}, dataset {args.dataset}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        run = trained_run(args, work)
        rows = measure(run, test_files(run, work), args.min_rows, args.repeats)
        print(f"run {run}, test rows {rows[0]['rows']:,}, --quantize-min-rows {args.min_rows}")
        print_table(rows)
        (work / f"quantize-{args.dataset}.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
