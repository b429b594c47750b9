"""Section ``moe``: single-task dnn whose tower is an M6-T mixture-of-experts layer
(``ranking.moe.MoELayer``), top-1 vs top-2 vs expert prototyping at equal activated FLOPs."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from sklearn.metrics import roc_auc_score

from bench.multitask.common import mean_sd, pair_text, paired, score_export, summary_of, train_run
from bench.multitask.sequences import seq_model
from pipelines.run.model import load_trained_model
from ranking.moe import MoELayer

EXPERTS = 8
UNITS = 32


def variants() -> dict[str, dict[str, Any]]:
    """The routing settings: ``top1`` (one expert of 2U units), ``top2`` (two of U) and
    ``prototypes`` (2 groups of 4 experts, top-1 in each: two of U). Every variant routes
    an example through 2U hidden units, so the activated FLOPs match."""
    return {
        "top1": {"moe_top_k": 1, "moe_prototypes": 1, "mlp": [2 * UNITS]},
        "top2": {"moe_top_k": 2, "moe_prototypes": 1, "mlp": [UNITS]},
        "prototypes": {"moe_top_k": 1, "moe_prototypes": 2, "mlp": [UNITS]},
    }


def moe_model(variant: dict[str, Any], args: Any) -> dict[str, Any]:
    return {**seq_model("mean", args), "expert_layer": "moe", "moe_experts": EXPERTS, **variant}


def moe_stats(run: dict) -> dict[str, Any]:
    """The tower's activated FLOPs per example and its routed / dropped counters."""
    model = load_trained_model(run["dir"])[0]
    layer = next(m for m in model.submodules if isinstance(m, MoELayer))
    routed, dropped = int(layer.routed_total.numpy()), int(layer.dropped_total.numpy())
    return {
        "activated_flops": layer.activated_flops_per_example(),
        "input_dim": int(layer.input_dim),
        "routed": routed,
        "dropped": dropped,
        "drop_rate": layer.drop_rate,
    }


def bench_moe(data: dict, work: Path, args: Any) -> dict[str, Any]:
    """Test AUC (paired vs top-1), activated FLOPs, examples/s and drop rate per variant."""
    runs: dict[str, list[dict]] = {v: [] for v in variants()}
    shards = None
    for seed in range(args.seeds):
        for name, v in variants().items():
            run = train_run(
                f"synthetic_moe_{name}", shards or data, moe_model(v, args), work, seed, args
            )
            shards = shards or run["data"]
            runs[name].append(run)
            print(
                f"  moe {name} seed {seed}: test AUC {run['report']['test']['auc']:.4f}", flush=True
            )
    first = runs["top1"][0]
    schema_path, test = first["dir"] / "schema.toml", first["data"]["test"]
    scores = {
        n: [score_export(r, schema_path, test, ("label",)) for r in rs] for n, rs in runs.items()
    }
    y = scores["top1"][0]["label"]
    print(f"\n== moe: synthetic, {EXPERTS} experts, capacity factor 1.25 (test rows {y.size:,})")
    print(
        "| routing | tower units | activated FLOPs/example | test AUC | vs top1: AUC diff "
        "[widest 95% CI] better/worse | examples/s | drop rate |"
    )
    print("|---|---|---|---|---|---|---|")
    out: dict[str, Any] = {"experts": EXPERTS, "methods": {}}
    for name, rs in runs.items():
        stats = [moe_stats(r) for r in rs]
        aucs = [roc_auc_score(y, s["score"]) for s in scores[name]]
        pairs = [
            paired(y, c["score"], s["score"])["auc"]
            for c, s in zip(scores["top1"], scores[name], strict=True)
        ]
        eps = statistics.fmean(r["report"]["examples_per_second"] for r in rs)
        drop = statistics.fmean(s["drop_rate"] for s in stats)
        out["methods"][name] = {
            "auc": aucs,
            "vs_top1": summary_of(pairs),
            "activated_flops": stats[0]["activated_flops"],
            "examples_per_second": eps,
            "drop_rate": [s["drop_rate"] for s in stats],
            "routed": [s["routed"] for s in stats],
            "dropped": [s["dropped"] for s in stats],
        }
        units = variants()[name]["mlp"]
        print(
            f"| {name} | {units} | {stats[0]['activated_flops']:,} | {mean_sd(aucs)} | "
            f"{pair_text(pairs) if name != 'top1' else '-'} | {eps:.0f} | {drop:.4f} |"
        )
    return out
