"""``stitchrec demo`` (what ``make run`` runs): the whole pipeline on the embedded synthetic data.

generate -> statistics -> train (model selection on a validation split of the training rows) ->
export the selected checkpoint as a SavedModel -> load it back and evaluate on the test split ->
a short report. The report sets the test AUC beside the oracle AUC of the generator's true
click probabilities, the ceiling any model can reach on this data.

The output folder holds ``data/`` (the synthetic rows, reused by a later demo of the same row
count), ``run_<model>/`` (the training run, its SavedModel in ``export/1``) and
``demo_report.json``. The demo writes only into a new or empty folder or an earlier demo's (a
folder holding nothing else); a demo that fails removes the folder it created (in an earlier
demo's folder: its run and report), and its report is written last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from features import synthetic, synthetic_config
from pipelines.config import DataConfig, PipelineConfig, TrainConfig
from pipelines.errors import UsageError, check_output_path
from pipelines.evaluate import evaluate
from pipelines.export import export_run, saved_model_bytes
from pipelines.files import write_json_atomic
from pipelines.run.paths import Log, RunPaths
from pipelines.train import train
from ranking.config import ModelConfig

#: The fewest rows a demo generates. The demo's splits are 20% test rows and 10% of the rest
#: validation rows; at a click rate near 25% a split of n rows holds one class only with
#: probability about 0.75**n, so 1,000 rows (about 80 validation and 200 test rows) leave every
#: split with both classes, which the validation and test AUC need.
MIN_ROWS = 1000
REPORT = "demo_report.json"
DATA = "data"
RUN_PREFIX = "run_"


def check_rows(rows: int) -> None:
    """Raises UsageError for fewer than ``MIN_ROWS`` rows."""
    if rows < MIN_ROWS:
        raise UsageError(
            f"demo --rows {rows}: expected at least {MIN_ROWS:,} rows (fewer leave the "
            "validation or test split without clicks or without non-clicks, and their AUC "
            "cannot be computed)"
        )


def check_demo_folder(out: Path, flag: str = "--output") -> None:
    """Raises UsageError unless ``out`` is new, an empty folder, or a folder holding only what a
    demo writes (``data/``, ``run_<model>/``, ``demo_report.json``; hidden names aside)."""
    check_output_path(out, flag)
    if not out.is_dir():
        return
    other = sorted(
        p.name
        for p in out.iterdir()
        if not p.name.startswith(".")
        and not (p.is_dir() and (p.name == DATA or p.name.startswith(RUN_PREFIX)))
        and not (p.is_file() and p.name == REPORT)
    )
    if other:
        shown = ", ".join(repr(n) for n in other[:3]) + (", ..." if len(other) > 3 else "")
        raise UsageError(
            f"demo {flag} {str(out)!r} holds files that are not a `stitchrec demo` output "
            f"({shown}): expected a new or empty folder, or an earlier demo output (only "
            f"{DATA}/, {RUN_PREFIX}<model>/ and {REPORT})"
        )


@contextlib.contextmanager
def _removed_on_failure(*paths: Path) -> Iterator[None]:
    """Deletes ``paths`` (folders or files) when the block raises, then re-raises."""
    try:
        yield
    except BaseException:
        for p in paths:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        raise


def _generate(rows: int, seed: int, data: Path) -> None:
    """The synthetic rows into ``data``, written into a hidden folder beside it and renamed, so
    ``data`` is either the earlier rows or the new ones, whole."""
    tmp = data.with_name(f".{data.name}.demo-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        synthetic.write_dataset(synthetic_config.SyntheticConfig(rows=rows, seed=seed), tmp)
        if data.exists():
            shutil.rmtree(data)
        tmp.rename(data)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_demo(
    rows: int = 2_000_000,
    output: str | Path = "runs/demo",
    model: str = "dcn_v2",
    epochs: int = 1,
    seed: int = 0,
    log: Log = print,
) -> dict:
    """Runs the demo under ``output``; returns the summary it also writes to demo_report.json.

    Raises UsageError, before anything is written, for fewer than ``MIN_ROWS`` rows or an
    ``output`` that is not new, empty or an earlier demo's (``check_demo_folder``). When a step
    fails, what this call wrote is removed: the whole folder when it was new; in an earlier
    demo's folder the run of ``model`` and the report (its data, whole, stays for the next
    demo)."""
    check_rows(rows)
    out = Path(output).resolve()
    check_demo_folder(Path(output))
    created = [out] if not out.exists() else []
    run_dir = out / f"{RUN_PREFIX}{model}"
    with _removed_on_failure(*created):
        out.mkdir(parents=True, exist_ok=True)
        (out / REPORT).unlink(missing_ok=True)  # written last: it describes the run below
        if run_dir.exists():  # the demo shows a whole run; `stitchrec train` resumes one
            shutil.rmtree(run_dir)
        with _removed_on_failure(run_dir):
            return _run_demo(rows, out, run_dir, model, epochs, seed, log)


def _run_demo(
    rows: int, out: Path, run_dir: Path, model: str, epochs: int, seed: int, log: Log
) -> dict:
    """``run_demo`` into the checked folder ``out``."""
    data = out / DATA
    t0 = time.time()
    truth_file = data / "ground_truth.json"
    truth = json.loads(truth_file.read_text()) if truth_file.exists() else {}
    if truth.get("rows") == rows and truth.get("seed") == seed:
        log(f"[1/5] reusing the {rows:,} synthetic rows in {data}")
    else:
        log(f"[1/5] generating {rows:,} synthetic rows into {data}")
        _generate(rows, seed, data)
        truth = json.loads(truth_file.read_text())
    t_data = time.time() - t0

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
    write_json_atomic(out / REPORT, summary)
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
