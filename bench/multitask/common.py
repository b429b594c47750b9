"""Runs, exports, test scores, serving latency and paired intervals of bench.multitask."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from bench.training.lr_baseline import REPO, converted
from features.dataset import field_tf_dtype, iter_batches, list_parquet
from features.schema import load_schema
from pipelines.config import config_from_dict
from pipelines.evaluation.compare import compare_scores
from pipelines.export import export_run, saved_model_bytes
from pipelines.train import train

LATENCY_ROWS = 512


def train_run(name: str, data: dict, model: dict, work: Path, seed: int, args: Any) -> dict:
    """Trains (or, when ``work/<name>_seed<seed>`` holds a finished run, reads back) one run
    and exports it; returns its report, folder, export folder and shard config."""
    out = work / f"{name}_seed{seed}"
    if (out / "train_report.json").exists():
        report = json.loads((out / "train_report.json").read_text())
    else:
        tc = {
            "seed": seed,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "log_every": 10**6,
            "checkpoint_every": 10**6,
        }
        if not args.train_defaults:
            tc["weight_average"] = "none"  # Adam at 1e-3, as docs/multitask.md measured
        cfg = config_from_dict(
            {"output_dir": str(out), "data": data, "model": model, "train": tc}, base_dir=REPO
        )
        report = train(cfg, lambda _line: None)
    export = out / "bench_export"
    if not (export / "saved_model.pb").exists():
        export_run(out, export)
    return {"report": report, "dir": out, "export": export, "data": converted(out, data)}


def test_batches(schema_path: Path, files: list[str], batch_size: int = 4096):
    """Batches (numpy columns, labels included) of every test row, in file order."""
    schema = load_schema(schema_path)
    yield from iter_batches(schema, list_parquet(files), batch_size=batch_size, shuffle=False)


def model_feeds(schema_path: Path, batch: dict) -> dict[str, tf.Tensor]:
    """The serving signature's inputs of one batch."""
    schema = load_schema(schema_path)
    return {f.name: tf.constant(batch[f.name], field_tf_dtype(f)) for f in schema.model_inputs}


def score_export(run: dict, schema_path: Path, files: list[str], keep: tuple[str, ...]) -> dict:
    """Every ``score*`` output of the run's export on every row of ``files``, plus the
    columns ``keep`` (labels, user ids) of those rows, as numpy arrays in file order."""
    sig = tf.saved_model.load(str(run["export"])).signatures["serving_default"]
    parts: dict[str, list[np.ndarray]] = {}
    for batch in test_batches(schema_path, files):
        outs = sig(**model_feeds(schema_path, batch))
        for k, v in outs.items():
            if k.startswith("score"):
                parts.setdefault(k, []).append(v.numpy().reshape(-1))
        for k in keep:
            parts.setdefault(k, []).append(np.asarray(batch[k]))
    return {k: np.concatenate(v) for k, v in parts.items()}


def latencies(exports: dict[str, Path], feeds: dict[str, tf.Tensor], calls: int) -> dict:
    """Median milliseconds of ``calls`` calls of each export's ``serving_default`` on one
    batch, the models interleaved in rounds of 5 calls (load drift hits every model alike);
    ``per_candidate_us``: the median over the batch rows, in microseconds."""
    sigs = {
        k: tf.saved_model.load(str(p)).signatures["serving_default"] for k, p in exports.items()
    }
    times: dict[str, list[float]] = {k: [] for k in sigs}
    for sig in sigs.values():
        for _ in range(3):
            sig(**feeds)
    rows = int(next(iter(feeds.values())).shape[0])
    for _ in range(max(1, calls // 5)):
        for k, sig in sigs.items():
            for _ in range(5):
                t0 = time.perf_counter()
                sig(**feeds)
                times[k].append((time.perf_counter() - t0) * 1e3)
    out = {}
    for k, t in times.items():
        ms = statistics.median(t)
        out[k] = {"ms": ms, "per_candidate_us": ms * 1e3 / rows}
    return out


def export_bytes(run: dict) -> int:
    return saved_model_bytes(run["export"])["total"]


def paired(
    labels: np.ndarray,
    control: np.ndarray,
    treatment: np.ndarray,
    groups: np.ndarray | None = None,
) -> dict[str, dict]:
    """Paired bootstrap (1,000 resamples of the rows) of treatment - control: ``auc`` and,
    with ``groups``, ``gauc``; each {delta, ci_low, ci_high, verdict}."""
    r = compare_scores(
        labels, control, treatment, groups=groups, ks=(), resamples=1000, seed=0, workers=2
    )
    m = r["overall"]["metrics"]
    keys = ("auc", "gauc") if groups is not None else ("auc",)
    return {k: {x: m[k][x] for x in ("delta", "ci_low", "ci_high", "verdict")} for k in keys}


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.4f} ± {sd:.4f}"


def pair_text(pairs: list[dict]) -> str:
    """Mean difference, the widest 95% interval over the seeds, seeds better / worse."""
    if not pairs:
        return "-"
    better = sum(p["verdict"] == "better" for p in pairs)
    worse = sum(p["verdict"] == "worse" for p in pairs)
    lo = min(p["ci_low"] for p in pairs)
    hi = max(p["ci_high"] for p in pairs)
    delta = statistics.fmean(p["delta"] for p in pairs)
    return f"{delta:+.4f} [{lo:+.4f}, {hi:+.4f}] {better}/{worse}"


def summary_of(pairs: list[dict]) -> dict[str, Any]:
    return {
        "deltas": [p["delta"] for p in pairs],
        "ci": [[p["ci_low"], p["ci_high"]] for p in pairs],
        "verdicts": [p["verdict"] for p in pairs],
    }
