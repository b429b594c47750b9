"""Sections ``multitask`` (per-task test AUC of the multi-task heads against independent
single-task models) and ``export`` (SavedModel bytes and serving latency per candidate of each
multi-task model relative to one single-task model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score

from bench.multitask.common import (
    LATENCY_ROWS,
    export_bytes,
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
from bench.multitask.data import clicked_subset
from bench.multitask.sequences import seq_model

HEADS = ("shared_bottom", "mmoe", "ple", "esmm")
CLICK, BUY = "label", "buy"
TASKS = [
    {"name": "click", "label": CLICK},
    {"name": "buy", "label": BUY, "defined_on": "click"},
]
METRICS = ("click", "ctcvr", "cvr")


def head_model(head: str, args: Any) -> dict[str, Any]:
    """A two-task model over the mean-pooled base: bottom / experts of 64 units, towers of
    32, 4 experts (MMoE; PLE: 4 task-specific experts per task and 1 shared)."""
    return {
        **seq_model("mean", args),
        "tasks": TASKS,
        "multitask": head,
        "num_experts": 4,
        "expert_mlp": [64],
        "tower_mlp": [32],
    }


def train_all(data: dict, work: Path, seed: int, args: Any) -> dict[str, dict]:
    """Every run of one seed: the single-task click model (the ``sequences`` section's mean
    pooling run), the conversion model on clicked rows, and each head."""
    first = train_run("synthetic_mean", data, seq_model("mean", args), work, 0, args)
    shards = first["data"]
    runs = {"click": first}
    if seed:
        runs["click"] = train_run(
            "synthetic_mean", shards, seq_model("mean", args), work, seed, args
        )
    cvr_data = clicked_subset(shards, CLICK, BUY, work / "clicked_rows")
    runs["cvr"] = train_run("synthetic_cvr", cvr_data, seq_model("mean", args), work, seed, args)
    for head in HEADS:
        runs[head] = train_run(
            f"synthetic_{head}", shards, head_model(head, args), work, seed, args
        )
    return runs


def task_scores(runs: dict[str, dict]) -> dict[str, dict[str, np.ndarray]]:
    """{method: {click, ctcvr, cvr scores, labels}} on every test row; the independent pair's
    CTCVR score is pCTR * pCVR."""
    schema_path = runs["click"]["dir"] / "schema.toml"
    test = runs["click"]["data"]["test"]  # the test rows of every run
    click = score_export(runs["click"], schema_path, test, (CLICK, BUY))
    cvr = score_export(runs["cvr"], schema_path, test, ())
    out = {
        "independent": {
            "click": click["score"],
            "ctcvr": click["score"] * cvr["score"],
            "cvr": cvr["score"],
            CLICK: click[CLICK],
            BUY: click[BUY],
        }
    }
    for head in HEADS:
        s = score_export(runs[head], schema_path, test, ())
        out[head] = {
            "click": s["score_click"],
            "ctcvr": s["score_buy"],
            "cvr": s["score_buy_given_click"],
        }
    return out


def _task_rows(m: str, labels: dict, seeds: list[dict]) -> dict[str, Any]:
    """Per-task AUCs and paired intervals of method ``m`` over the seeds."""
    row: dict[str, Any] = {}
    for task in METRICS:
        y, rows = labels[task]
        aucs = [roc_auc_score(y, s[m][task][rows]) for s in seeds]
        row[task] = {"auc": aucs}
        for base in ("independent", "shared_bottom"):
            if base != m:
                pairs = [paired(y, s[base][task][rows], s[m][task][rows])["auc"] for s in seeds]
                row[task][f"vs_{base}"] = summary_of(pairs)
                row[task][f"vs_{base}_text"] = pair_text(pairs)
    return row


def bench_multitask(data: dict, work: Path, args: Any) -> dict[str, Any]:
    """Per-task test AUC of every method over the seeds, paired vs the independent models and
    vs shared-bottom."""
    seeds = []
    for seed in range(args.seeds):
        runs = train_all(data, work, seed, args)
        seeds.append(task_scores(runs))
        print(f"  multitask seed {seed}: trained {sorted(runs)}", flush=True)
    ref = seeds[0]["independent"]
    clicked = ref[CLICK] == 1
    everything = np.ones_like(clicked)
    labels = {
        "click": (ref[CLICK], everything),
        "ctcvr": (ref[BUY], everything),
        "cvr": (ref[BUY][clicked], clicked),
    }
    out: dict[str, Any] = {
        "test_rows": int(clicked.size),
        "clicks": int(clicked.sum()),
        "buys": int(ref[BUY].sum()),
        "methods": {},
    }
    print(
        f"\n== multitask: synthetic (test rows {clicked.size:,}, clicks {int(clicked.sum()):,}"
        f", buys {int(ref[BUY].sum()):,})"
    )
    print("| method | click AUC | CTCVR AUC (buy, all rows) | CVR AUC (buy, clicked rows) |")
    print("|---|---|---|---|")
    for m in ("independent", *HEADS):
        row = _task_rows(m, labels, seeds)
        out["methods"][m] = row
        print(f"| {m} | " + " | ".join(mean_sd(row[t]["auc"]) for t in METRICS) + " |")
    for base in ("independent", "shared_bottom"):
        print(f"\npaired AUC difference vs {base}: mean [widest 95% CI] seeds better/worse")
        print("| method | click | CTCVR | CVR |")
        print("|---|---|---|---|")
        for m in ("independent", *HEADS):
            if m != base:
                row = out["methods"][m]
                print(f"| {m} | " + " | ".join(row[t][f"vs_{base}_text"] for t in METRICS) + " |")
    return out


def bench_export(data: dict, work: Path, args: Any) -> dict[str, Any]:
    """SavedModel bytes and serving latency per candidate of seed 0's models, relative to the
    single-task click model (the independent pair: the two single-task models together)."""
    runs = train_all(data, work, 0, args)
    schema_path = runs["click"]["dir"] / "schema.toml"
    batch = next(test_batches(schema_path, runs["click"]["data"]["test"], LATENCY_ROWS))
    feeds = model_feeds(schema_path, batch)
    names = ("click", "cvr", *HEADS)
    lat = latencies({n: runs[n]["export"] for n in names}, feeds, args.latency_calls)
    size = {n: export_bytes(runs[n]) for n in names}
    lat["independent"] = {k: lat["click"][k] + lat["cvr"][k] for k in ("ms", "per_candidate_us")}
    size["independent"] = size["click"] + size["cvr"]
    params = {n: runs[n]["report"]["parameters"] for n in names}
    params["independent"] = params["click"] + params["cvr"]
    print("\n== export: SavedModel size and serving latency (seed 0, one 512-row batch)")
    print("| model | parameters | SavedModel bytes (x single) | latency/candidate us (x single) |")
    print("|---|---|---|---|")
    out: dict[str, Any] = {"models": {}}
    for n in ("click", "independent", *HEADS):
        r = {
            "parameters": params[n],
            "bytes": size[n],
            "bytes_ratio": size[n] / size["click"],
            "latency_ms": lat[n]["ms"],
            "latency_per_candidate_us": lat[n]["per_candidate_us"],
            "latency_ratio": lat[n]["ms"] / lat["click"]["ms"],
        }
        out["models"][n] = r
        label = "click (single-task)" if n == "click" else n
        print(
            f"| {label} | {params[n]:,} | {size[n]:,} ({r['bytes_ratio']:.2f}) | "
            f"{r['latency_per_candidate_us']:.2f} ({r['latency_ratio']:.2f}) |"
        )
    return out
