"""Section ``sequences``: single-task dnn with sequence_pooling din vs mean vs none."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score

from bench.multitask.common import (
    LATENCY_ROWS,
    latencies,
    mean_sd,
    model_feeds,
    pair_text,
    paired,
    score_export,
    summary_of,
    test_batches,
    train_run,
)
from ranking.metrics import gauc

POOLINGS = ("din", "din_paper", "mean", "none")
DEFAULT_POOLINGS = ("din", "mean", "none")
BASELINE = "mean"
# din_paper: DIN with the paper's activation unit, on the raw vectors (normalize = false)
POOLING_MODELS = {"din_paper": ("din", {"normalize": False})}


def base_model(args: Any) -> dict[str, Any]:
    """The ``[model]`` every section starts from."""
    return {"type": "dnn", "embedding_dim": args.embedding_dim, "mlp": [64, 32]}


def seq_model(pooling: str, args: Any) -> dict[str, Any]:
    kind, options = POOLING_MODELS.get(pooling, (pooling, {}))
    options = dict(options)
    if kind == "din" and args.din_hidden:
        options["hidden"] = list(args.din_hidden)
    model = {**base_model(args), "sequence_pooling": kind}
    if options:
        model["sequence_options"] = options
    return model


def train_poolings(dataset: str, data: dict, work: Path, args: Any) -> dict[str, list[dict]]:
    """The runs of every pooling and seed (the first run's shards feed every later run)."""
    runs: dict[str, list[dict]] = {p: [] for p in args.poolings}
    shards = None
    for seed in range(args.seeds):
        for pooling in (BASELINE, *[p for p in args.poolings if p != BASELINE]):
            run = train_run(
                f"{dataset}_{pooling}", shards or data, seq_model(pooling, args), work, seed, args
            )
            shards = shards or run["data"]
            runs[pooling].append(run)
            print(
                f"  {dataset} {pooling} seed {seed}: test AUC {run['report']['test']['auc']:.4f}",
                flush=True,
            )
    return runs


def bench_sequences(dataset: str, data: dict, work: Path, args: Any) -> dict[str, Any]:
    """Test AUC (and GAUC by user where the data has one), paired intervals vs mean pooling,
    training examples/s and serving latency per candidate relative to mean pooling."""
    runs = train_poolings(dataset, data, work, args)
    first = runs[BASELINE][0]
    schema_path = first["dir"] / "schema.toml"
    test = first["data"]["test"]
    label = "label" if dataset == "synthetic" else "click"
    user = None if dataset == "synthetic" else "userId"
    keep = (label,) if user is None else (label, user)
    scores = {p: [score_export(r, schema_path, test, keep) for r in rs] for p, rs in runs.items()}
    y = scores[BASELINE][0][label]
    groups = None if user is None else scores[BASELINE][0][user]
    batch = next(test_batches(schema_path, test, LATENCY_ROWS))
    feeds = model_feeds(schema_path, batch)
    lat = latencies({p: rs[0]["export"] for p, rs in runs.items()}, feeds, args.latency_calls)
    eps = {
        p: statistics.fmean(r["report"]["examples_per_second"] for r in rs)
        for p, rs in runs.items()
    }
    out: dict[str, Any] = {
        "dataset": dataset,
        "test_rows": int(y.size),
        "positives": int(y.sum()),
        "methods": {},
    }
    print(f"\n== sequences: {dataset} (test rows {y.size:,}, positives {int(y.sum()):,})")
    if groups is None:
        print("GAUC: not reported (the synthetic rows carry no user id or interest cluster)")
    print(
        "| pooling | test AUC | vs mean: AUC diff [widest 95% CI] better/worse | GAUC | "
        "vs mean: GAUC diff | vs none: AUC diff | examples/s (x mean) | "
        "latency/candidate us (x mean) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for p in args.poolings:
        s = [x["score"] for x in scores[p]]
        aucs = [roc_auc_score(y, v) for v in s]
        vs_mean = [
            paired(y, c["score"], v, groups) for c, v in zip(scores[BASELINE], s, strict=True)
        ]
        vs_none = [
            paired(y, c["score"], v) for c, v in zip(scores.get("none", []), s, strict=False)
        ]
        row: dict[str, Any] = {
            "auc": aucs,
            "vs_mean_auc": summary_of([v["auc"] for v in vs_mean]),
            "vs_none_auc": summary_of([v["auc"] for v in vs_none]),
            "examples_per_second": eps[p],
            "examples_per_second_ratio": eps[p] / eps[BASELINE],
            "latency_ms": lat[p]["ms"],
            "latency_per_candidate_us": lat[p]["per_candidate_us"],
            "latency_ratio": lat[p]["ms"] / lat[BASELINE]["ms"],
        }
        g_text = gd_text = "-"
        if groups is not None:
            row["gauc"] = [gauc(groups, y, v) for v in s]
            row["vs_mean_gauc"] = summary_of([v["gauc"] for v in vs_mean])
            g_text = mean_sd(row["gauc"])
            gd_text = pair_text([v["gauc"] for v in vs_mean]) if p != BASELINE else "-"
        out["methods"][p] = row
        print(
            f"| {p} | {mean_sd(aucs)} | "
            f"{pair_text([v['auc'] for v in vs_mean]) if p != BASELINE else '-'} | {g_text} | "
            f"{gd_text} | {pair_text([v['auc'] for v in vs_none]) if p != 'none' else '-'} | "
            f"{eps[p]:.0f} ({row['examples_per_second_ratio']:.2f}) | "
            f"{row['latency_per_candidate_us']:.2f} ({row['latency_ratio']:.2f}) |"
        )
    out["latency_batch_rows"] = int(np.asarray(batch[label]).size)
    return out
