"""The bench's figures from the arms' runs: next-day AUCs scored by the exports, paired
intervals (``pipelines.evaluation.compare.compare_scores`` through ``bench.multitask.common``),
training seconds, vocabulary sizes (and, for the eviction arm, their ratio to the values active
in the eviction horizon) and export bytes; and their markdown tables."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from sklearn.metrics import roc_auc_score

from bench.continuous.arms import ARMS, DayRun
from bench.continuous.windows import Windows
from bench.multitask.common import mean_sd, pair_text, paired, score_export
from features.vocab_state import VocabState

#: (name, treatment, control) of the paired next-day AUC differences.
PAIRS = (
    ("continuous - sliding", "continuous", "sliding"),
    ("continuous_evict - sliding", "continuous_evict", "sliding"),
    ("continuous_evict - continuous", "continuous_evict", "continuous"),
    ("continuous - frozen", "continuous", "frozen"),
)
TRAINED = ("sliding", "continuous", "continuous_evict")


def horizon_active(run_dir: Path, evict_after: int) -> dict[str, int]:
    """Per vocabulary field, how many values a run's vocabulary state saw in the eviction
    horizon: its last ``evict_after + 1`` windows (``last_seen >= window - evict_after``). Read
    from a run that never evicts, whose state holds every value it has counted."""
    state = VocabState.load(run_dir / "stats")
    first = state.window - evict_after
    return {
        name: int(pc.sum(pc.greater_equal(t.column("last_seen"), first)).as_py() or 0)
        for name, t in state.tables.items()
    }


def seed_figures(
    windows: Windows, runs: dict[str, dict[int, DayRun]], evict_after: int
) -> dict[str, Any]:
    """One seed's figures per day ``d >= 1``: each arm's AUC on day ``d + 1``'s test rows,
    the paired differences, seconds, vocabulary sizes, the values active in the eviction
    horizon (``horizon_active`` of the ``continuous`` arm) and export bytes."""
    days = sorted(d for d in runs["continuous"] if d >= 1)
    out: dict[str, Any] = {"auc": {a: [] for a in ARMS}, "pairs": {p[0]: [] for p in PAIRS}}
    for d in days:
        test, scores = [str(windows.test[d + 1])], {}
        for arm in ARMS:
            got = score_export(
                {"export": runs[arm][d].export}, windows.schema, test, (windows.label,)
            )
            scores[arm], labels = got["score"], got[windows.label]
            out["auc"][arm].append(float(roc_auc_score(labels, scores[arm])))
        for name, treatment, control in PAIRS:
            out["pairs"][name].append(paired(labels, scores[control], scores[treatment])["auc"])
    out["days"], out["item"] = days, windows.item
    out["oracle_auc"] = [windows.oracle_auc[d + 1] for d in days]
    out["train_seconds"] = {a: [runs[a][d].report["train_seconds"] for d in days] for a in TRAINED}
    out["wall_seconds"] = {a: [round(runs[a][d].wall_seconds, 2) for d in days] for a in TRAINED}
    out["steps"] = {a: [runs[a][d].report["steps_this_run"] for d in days] for a in TRAINED}
    out["vocab"] = {a: [runs[a][d].vocab for d in days] for a in TRAINED}
    out["active"] = [horizon_active(runs["continuous"][d].dir, evict_after) for d in days]
    out["export_bytes"] = {a: [runs[a][d].export_bytes for d in days] for a in ARMS}
    return out


def _mean(values: list[float]) -> float:
    return statistics.fmean(values)


def print_tables(name: str, seeds: list[dict[str, Any]]) -> None:
    """Markdown tables of one dataset over its seeds (mean ± sd, or mean; a paired cell is
    "mean delta [widest 95% interval] seeds better/worse")."""
    days = seeds[0]["days"]
    n = len(seeds)
    print(f"\n== {name}: next-day test AUC, {n} seed(s) (day d's model on day d+1's test rows)")
    print("| day | oracle | " + " | ".join(ARMS) + " |")
    print("|---" * (len(ARMS) + 2) + "|")
    for i, d in enumerate(days):
        oracle = [s["oracle_auc"][i] for s in seeds if s["oracle_auc"][i] is not None]
        cells = [f"{_mean(oracle):.4f}" if oracle else "-"]
        cells += [mean_sd([s["auc"][a][i] for s in seeds]) for a in ARMS]
        print(f"| {d} | " + " | ".join(cells) + " |")
    print(f"\n== {name}: paired next-day AUC differences (95% bootstrap, 1,000 resamples)")
    print("| day | " + " | ".join(p[0] for p in PAIRS) + " |")
    print("|---" * (len(PAIRS) + 1) + "|")
    for i, d in enumerate(days):
        cells = [pair_text([s["pairs"][p[0]][i] for s in seeds]) for p in PAIRS]
        print(f"| {d} | " + " | ".join(cells) + " |")
    print(f"\n== {name}: training seconds per day (training loop; whole train call; steps)")
    print("| day | " + " | ".join(TRAINED) + " | continuous / sliding: loop s, steps |")
    print("|---" * (len(TRAINED) + 2) + "|")
    for i, d in enumerate(days):
        mean = {
            (k, a): _mean([s[k][a][i] for s in seeds])
            for k in ("train_seconds", "wall_seconds", "steps")
            for a in TRAINED
        }
        cells = [
            f"{mean['train_seconds', a]:.1f} ({mean['wall_seconds', a]:.1f}; "
            f"{mean['steps', a]:,.0f})"
            for a in TRAINED
        ]
        ratio = [mean[k, "continuous"] / mean[k, "sliding"] for k in ("train_seconds", "steps")]
        cells.append(f"{ratio[0]:.0%}, {ratio[1]:.0%}")
        print(f"| {d} | " + " | ".join(cells) + " |")
    print(f"\n== {name}: vocabulary size per day (item field / all vocabulary fields)")
    print("| day | " + " | ".join(TRAINED) + " |")
    print("|---" * (len(TRAINED) + 1) + "|")
    for i, d in enumerate(days):
        cells = []
        for a in TRAINED:
            item = _mean([s["vocab"][a][i][s["item"]] for s in seeds])
            total = _mean([sum(s["vocab"][a][i].values()) for s in seeds])
            cells.append(f"{item:,.0f} / {total:,.0f}")
        print(f"| {d} | " + " | ".join(cells) + " |")
    _print_horizon(name, seeds)
    print(f"\n== {name}: export bytes per day (MB)")
    print("| day | " + " | ".join(ARMS) + " |")
    print("|---" * (len(ARMS) + 1) + "|")
    for i, d in enumerate(days):
        cells = [f"{_mean([s['export_bytes'][a][i] for s in seeds]) / 1e6:.2f}" for a in ARMS]
        print(f"| {d} | " + " | ".join(cells) + " |")


def _print_horizon(name: str, seeds: list[dict[str, Any]]) -> None:
    """The eviction arm's vocabulary sizes against the values active in its horizon."""
    print(f"\n== {name}: continuous_evict vocabulary / values active in the eviction horizon")
    print("| day | item field | all vocabulary fields |")
    print("|---|---|---|")
    for i, d in enumerate(seeds[0]["days"]):
        cells = []
        for pick in (lambda v, s: v[s["item"]], lambda v, _s: sum(v.values())):
            size = _mean([pick(s["vocab"]["continuous_evict"][i], s) for s in seeds])
            active = _mean([pick(s["active"][i], s) for s in seeds])
            cells.append(f"{size:,.0f} / {active:,.0f} = {size / active:.2f}x")
        print(f"| {d} | " + " | ".join(cells) + " |")
