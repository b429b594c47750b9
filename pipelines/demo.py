"""``stitchrec demo`` (what ``make run`` runs): the whole pipeline on the embedded synthetic data.

generate -> statistics -> train (model selection on a validation split of the training rows) ->
export the selected checkpoint as a SavedModel -> load it back and evaluate on the test split ->
a short report. The report sets the test AUC beside the oracle AUC of the generator's true
click probabilities, the ceiling any model can reach on this data.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from features import synthetic, synthetic_config
from pipelines.config import DataConfig, PipelineConfig, TrainConfig
from pipelines.evaluate import evaluate
from pipelines.export import export_run, saved_model_bytes
from pipelines.run.paths import Log, RunPaths
from pipelines.train import train
from ranking.config import ModelConfig


def run_demo(
    rows: int = 2_000_000,
    output: str | Path = "runs/demo",
    model: str = "dcn_v2",
    epochs: int = 1,
    seed: int = 0,
    log: Log = print,
) -> dict:
    """Runs the demo under ``output``; returns the summary it also writes to demo_report.json."""
    out = Path(output).resolve()
    data = out / "data"
    t0 = time.time()
    truth_file = data / "ground_truth.json"
    truth = json.loads(truth_file.read_text()) if truth_file.exists() else {}
    if truth.get("rows") == rows and truth.get("seed") == seed:
        log(f"[1/5] reusing the {rows:,} synthetic rows in {data}")
    else:
        log(f"[1/5] generating {rows:,} synthetic rows into {data}")
        synthetic.write_dataset(synthetic_config.SyntheticConfig(rows=rows, seed=seed), data)
        truth = json.loads(truth_file.read_text())
    t_data = time.time() - t0

    run_dir = out / f"run_{model}"
    if run_dir.exists():  # the demo shows a whole run; `stitchrec train` is the one that resumes
        shutil.rmtree(run_dir)
    cfg = PipelineConfig(
        output_dir=str(run_dir),
        data=DataConfig(
            schema=str(data / "schema.toml"),
            train=(str(data / "train"),),
            test=(str(data / "test"),),
        ),
        model=ModelConfig(type=model, embedding_dim=16, mlp=(256, 128), cross_layers=2),
        train=TrainConfig(
            batch_size=1024, epochs=epochs, learning_rate=1e-3, seed=seed, log_every=50
        ),
    )
    log("[2/5] statistics and [3/5] training")
    t1 = time.time()
    report = train(cfg, log=log)
    t_train = time.time() - t1

    log("[4/5] exporting the SavedModel")
    export_dir = export_run(cfg.output_dir, RunPaths(Path(cfg.output_dir)).exports / "1")
    size = saved_model_bytes(export_dir)

    log("[5/5] evaluating the exported SavedModel (the selected checkpoint) on the test split")
    ev = evaluate(export_dir, [data / "test"])
    summary = {
        # "train": the rows of the training input, "validation" of them held out for selection
        "rows": {
            "train": report["train_rows"] + report["validation_rows"],
            "validation": report["validation_rows"],
            "test": report["test_rows"],
        },
        "selected": report["selected"],
        "model": model,
        "parameters": report["parameters"],
        "train_seconds": report["train_seconds"],
        "examples_per_second": report["examples_per_second"],
        "stats_train_eval_seconds": round(t_train, 1),
        "data_seconds": round(t_data, 1),
        "test_auc": round(ev["auc"], 4),
        "test_logloss": round(ev["logloss"], 4),
        "oracle_auc": truth.get("observed", {}).get("oracle_auc"),
        "saved_model_bytes": size["total"],
        "saved_model_variable_bytes": size["variables"],
        "artifacts": {
            "data": str(data),
            "run": cfg.output_dir,
            "saved_model": str(export_dir),
            "tensorboard": str(RunPaths(Path(cfg.output_dir)).tensorboard),
        },
        "total_seconds": round(time.time() - t0, 1),
    }
    (out / "demo_report.json").write_text(json.dumps(summary, indent=1))
    for line in _report(summary):
        log(line)
    return summary


def _report(summary: dict) -> list[str]:
    """The demo report's lines, from the summary ``run_demo`` returns."""
    oracle = summary["oracle_auc"]
    art = summary["artifacts"]
    return [
        "",
        "StitchRec demo report",
        f"  rows            train {summary['rows']['train']:,} "
        f"(validation {summary['rows']['validation']:,} of them) / test {summary['rows']['test']:,}",
        f"  selected        step {summary['selected']['step']} (epoch {summary['selected']['epoch']}): "
        f"{summary['selected']['reason']}",
        f"  model           {summary['model']}, {summary['parameters']:,} parameters",
        f"  train time      {summary['train_seconds']} s, {summary['examples_per_second']:,} examples/s "
        f"(data generation {summary['data_seconds']} s)",
        f"  test AUC        {summary['test_auc']:.4f} (selected checkpoint)"
        + (f"   (oracle AUC of the true click probabilities: {oracle:.4f})" if oracle else ""),
        f"  test logloss    {summary['test_logloss']:.4f}",
        f"  SavedModel      {summary['saved_model_bytes']:,} bytes "
        f"({summary['saved_model_variable_bytes']:,} in variables)",
        f"  artifacts       {art['saved_model']}",
        f"                  run: {art['run']}  (tensorboard --logdir {art['tensorboard']})",
        f"  total           {summary['total_seconds']} s",
    ]


def cmd_demo(args: argparse.Namespace) -> int:
    """``stitchrec demo`` (flags in ``pipelines.cli_args``)."""
    run_demo(
        rows=args.rows,
        output=args.output,
        model=args.model,
        epochs=args.epochs,
        log=lambda msg: print(msg, flush=True),
    )
    return 0
