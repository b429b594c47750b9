"""The results of bench/preranking: the summary over seeds and the markdown tables of the docs.

``summarize`` gives, per model, the test AUC and recall (mean ± std over seeds), the gap
rank - two-tower with its paired t statistic, and the share of that gap each FSCD budget closes;
``markdown`` renders one results.json as the quality, training and cost tables.
"""

from __future__ import annotations

import statistics
from typing import Any


def mean_std(vals: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(vals),
        "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
        "n": len(vals),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per model: AUC and recall (mean ± std over seeds); for FSCD the share of the gap closed
    per seed and as a ratio of means; ``gap``: rank - two-tower per seed, its paired t statistic
    (mean / (std / sqrt(n))) and whether it is measurable (t >= 3, n >= 3: the gap is clearly
    outside the seed noise; otherwise "gap closed" is not reported as a result)."""
    labels = list(runs[0]["models"])
    out: dict[str, Any] = {}
    for label in labels:
        row = {}
        for key in ("auc", "recall_10_in_50"):
            vals = [r["models"][label][key] for r in runs if key in r["models"][label]]
            if vals:
                row[key] = mean_std(vals)
        out[label] = row
    gaps = [r["models"]["rank"]["auc"] - r["models"]["two_tower"]["auc"] for r in runs]
    gap = mean_std(gaps)
    sem = gap["std"] / len(gaps) ** 0.5 if len(gaps) > 1 else 0.0
    gap["t"] = gap["mean"] / sem if sem > 0 else float("nan")
    gap["measurable"] = bool(len(gaps) >= 3 and gap["mean"] > 0 and gap["t"] >= 3.0)
    gap["per_seed"] = gaps
    out["gap"] = gap
    tt_mean, rank_mean = out["two_tower"]["auc"]["mean"], out["rank"]["auc"]["mean"]
    for label in labels:
        if label.startswith("fscd"):
            closed = [
                (r["models"][label]["auc"] - r["models"]["two_tower"]["auc"]) / g
                if g
                else float("nan")
                for r, g in zip(runs, gaps, strict=True)
            ]
            out[label]["gap_closed"] = {**mean_std(closed), "per_seed": closed}
            out[label]["gap_closed_of_means"] = (out[label]["auc"]["mean"] - tt_mean) / (
                rank_mean - tt_mean
            )
    return out


def markdown(results: dict[str, Any]) -> str:
    """The docs tables of one results.json: quality (mean ± std over seeds), the gap, epochs
    and learning rates chosen, and cost."""
    lines = []
    for name, res in results["datasets"].items():
        seeds = [r["seed"] for r in res["runs"]]
        summary = res["summary"]
        gap = summary.get("gap")
        lines += [
            f"### {name} (seeds {seeds})",
            "",
            f"| model | kept fields (seed {seeds[0]}) | test AUC | gap closed per seed | of means | "
            "recall@10 in top 50 | best epochs (lr) |",
            "|---|---|---|---|---|---|---|",
        ]
        sel = res["runs"][0]["selections"]
        for label, row in summary.items():
            if label == "gap":
                continue
            auc = row["auc"]
            closed = row.get("gap_closed")
            rec = row.get("recall_10_in_50")
            kept = ", ".join(sel[label]["kept"]) if label in sel else "all"
            train = [r.get("training", {}).get(label, {}) for r in res["runs"]]
            epochs = "/".join(str(t.get("best_epoch", "?")) for t in train)
            lr = train[0].get("lr")
            init = train[0].get("init")
            lines.append(
                f"| {label} | {kept} | {auc['mean']:.4f} ± {auc['std']:.4f} | "
                + (f"{closed['mean']:.2f} ± {closed['std']:.2f}" if closed else "")
                + " | "
                + (f"{row['gap_closed_of_means']:.2f}" if closed else "")
                + " | "
                + (f"{rec['mean']:.3f} ± {rec['std']:.3f}" if rec else "(reference)")
                + f" | {epochs}"
                + (f" ({lr:g}{', ' + init if init else ''})" if lr else "")
                + " |"
            )
        if gap:
            lines += [
                "",
                f"Gap rank - two-tower: {gap['mean']:.4f} ± {gap['std']:.4f} over {gap['n']} "
                f"seeds (per seed {', '.join(f'{g:.4f}' for g in gap['per_seed'])}; paired t = "
                f"{gap['t']:.1f}): "
                + (
                    "measurable."
                    if gap["measurable"]
                    else "NOT measurable ("
                    + ("fewer than 3 seeds)." if gap["n"] < 3 else "inside the seed noise).")
                ),
            ]
        fscd1 = [r.get("training", {}).get("fscd-1", {}) for r in res["runs"]]
        if any(fscd1):
            lines.append(
                f"FSCD stage 1 best epochs {'/'.join(str(t.get('best_epoch')) for t in fscd1)}; "
                f"penalty weight {res['runs'][0].get('reg_weight', 0):.3g}; keep probabilities "
                f"(seed {seeds[0]}): "
                + ", ".join(f"{k} {v:.2f}" for k, v in res["runs"][0]["keep_prob"].items())
            )
        cost = res["runs"][0].get("cost")
        if cost:
            lines += [
                "",
                f"load average during the timing: {cost.get('load_average', 'not recorded')}",
                "",
                "| model | FLOPs / candidate | x two-tower | batch 1: us / candidate | x two-tower "
                "| 64 requests: us / candidate | x two-tower |",
                "|---|---|---|---|---|---|---|",
            ]
            for label, c in cost.items():
                if label == "load_average":
                    continue
                lines.append(
                    f"| {label} | {c['flops_per_candidate']:,.0f} | {c['flops_x_two_tower']:.2f} | "
                    f"{c['batch1_us_per_candidate']:.2f} | {c['batch1_x_two_tower']:.2f} | "
                    f"{c['requests64_us_per_candidate']:.2f} | {c['requests64_x_two_tower']:.2f} |"
                )
        lines.append("")
    return "\n".join(lines)
