"""Orchestration of an offline A/B comparison.

``compare_scores`` compares two score vectors on the same labelled rows (point metrics, per-slice
metrics, one paired bootstrap pass for every metric of every scope); ``run_ab`` reads the logs
and both score sources, adds off-policy estimates when the logs carry propensities, and writes
``ab.json`` and ``ab.html``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipelines.evaluation import bootstrap, offpolicy, sources
from ranking import metrics

MODELS = ("control", "treatment")


def unbootstrapped(control: float, treatment: float) -> dict[str, Any]:
    """A metric's comparison without resamples: the two values and their delta, no interval
    (verdict ``undefined`` when the delta is not finite, else ``not bootstrapped``)."""
    delta = treatment - control
    return {
        "control": control,
        "treatment": treatment,
        "delta": delta,
        "ci_low": None,
        "ci_high": None,
        "p_value": None,
        "verdict": "undefined" if not math.isfinite(delta) else "not bootstrapped",
        "resamples": 0,
    }


def _slice_codes(
    values: np.ndarray, max_values: int, numeric_bins: int
) -> tuple[np.ndarray, list[str], str]:
    """(``[n]`` slice code, slice labels, how the slices were formed) of one field's values."""
    v = np.asarray(values)
    if v.dtype.kind == "f":
        uniq = np.unique(v)
        if uniq.size > max_values:
            edges = np.unique(np.quantile(v, np.linspace(0, 1, numeric_bins + 1)))
            codes = np.clip(np.searchsorted(edges, v, side="right") - 1, 0, edges.size - 2)
            labels = [
                f"[{edges[i]:.4g}, {edges[i + 1]:.4g}{']' if i == edges.size - 2 else ')'}"
                for i in range(edges.size - 1)
            ]
            return codes, labels, f"{edges.size - 1} quantile bins"
    codes, uniq = metrics.factorize(v)
    counts = np.bincount(codes, minlength=uniq.size)
    labels = [str(u) for u in uniq]
    if uniq.size <= max_values:
        return codes, labels, "one slice per value"
    keep = np.argsort(-counts, kind="stable")[: max_values - 1]
    remap = np.full(uniq.size, max_values - 1)
    remap[keep] = np.arange(keep.size)
    labels = [labels[k] for k in keep] + [f"(other: {uniq.size - keep.size} values)"]
    return (
        remap[codes],
        labels,
        f"the {keep.size} most frequent of {uniq.size} values, the rest pooled in '(other)'",
    )


def _finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def clean_json(obj: Any) -> Any:
    """NaN / inf -> None, numpy scalars -> Python, recursively (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): clean_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean_json(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return _finite(obj)
    return obj


@dataclass
class _Scope:
    """One set of rows (all, or one slice) and its metrics' kernels and point values."""

    name: str
    points: dict[str, dict[str, float]] = field(default_factory=lambda: {m: {} for m in MODELS})
    metrics: list[str] = field(default_factory=list)


def _grouped(
    cell: np.ndarray, n_cells: int, y: np.ndarray, s: np.ndarray, ks: Sequence[int]
) -> dict[str, metrics.GroupValues]:
    out = {"gauc": metrics.per_group_auc(cell, n_cells, y, s)}
    out.update(metrics.per_group_topk(cell, n_cells, y, s, ks))
    return out


@dataclass
class _Builder:
    """The rows, both models' scores and the bootstrap kernels collected scope by scope."""

    y: np.ndarray
    scores: dict[str, np.ndarray]
    bins: int
    resamples: int
    kernels: dict[tuple[str, str, str], bootstrap.Kernel] = field(default_factory=dict)

    def add_rows(self, scope: _Scope, rows: np.ndarray | None, both_classes: bool) -> None:
        """Row metrics (AUC, logloss, calibration, mean score) of ``rows`` (None: all)."""
        yy = self.y if rows is None else self.y[rows]
        for m in MODELS:
            s = self.scores[m] if rows is None else self.scores[m][rows]
            cal = metrics.calibration(yy, s, self.bins)
            scope.points[m].update(
                {
                    "auc": metrics.auc(yy, s) if both_classes else float("nan"),
                    "logloss": metrics.logloss(yy, s),
                    "ece": cal.ece,
                    "calibration_ratio": cal.ratio,
                    "mean_score": float(s.mean()),
                }
            )
            scope.points[m]["_calibration"] = cal.to_dict()  # type: ignore[assignment]
            if self.resamples:
                self.kernels[(scope.name, "*rows", m)] = bootstrap.RowKernel(
                    self.y, self.scores[m], self.bins, rows, auc=both_classes
                )
        scope.metrics += ["auc", "logloss", "ece", "calibration_ratio", "mean_score"]

    def add_groups(
        self,
        scope: _Scope,
        per_model: dict[str, dict[str, metrics.GroupValues]],
        sel: np.ndarray | None,
        cell_group: np.ndarray | None,
    ) -> dict[str, int]:
        """Group metrics (GAUC, NDCG@k, recall@k) of the cells ``sel`` (None: all); returns
        how many groups each metric scored."""
        counts = {}
        for m in MODELS:
            for name, gv in per_model[m].items():
                if sel is not None:
                    gv = metrics.GroupValues(gv.values[sel], gv.weights[sel], gv.valid[sel])
                scope.points[m][name] = gv.mean()
                counts[name] = int(gv.valid.sum())
                if self.resamples:
                    cg = None if cell_group is None else cell_group[sel]
                    self.kernels[(scope.name, name, m)] = bootstrap.GroupKernel(gv, cg)
        scope.metrics += list(per_model["control"])
        return counts


def _slice_flags(rows: int, positives: int, min_slice_rows: int) -> list[str]:
    flags = []
    if rows < min_slice_rows:
        flags.append(f"too few rows ({rows} < {min_slice_rows})")
    if positives == 0 or positives == rows:
        flags.append(f"single class ({'all clicks' if positives else 'no clicks'}): AUC undefined")
    return flags


def _slice_scopes(
    b: _Builder,
    fname: str,
    values: np.ndarray,
    group: tuple[np.ndarray, int] | None,
    ks: Sequence[int],
    min_slice_rows: int,
    max_slice_values: int,
    numeric_slice_bins: int,
) -> tuple[str, list[tuple[_Scope, dict[str, Any]]]]:
    """How one slice field was cut, and a scope with its row info per slice."""
    n = b.y.size
    if len(values) != n:
        raise ValueError(f"slice field {fname!r} has {len(values)} values for {n} rows")
    codes, labels_, how = _slice_codes(values, max_slice_values, numeric_slice_bins)
    cell_group = cell_code = per_model_cells = None
    if group is not None:
        pair = group[0] * len(labels_) + codes
        uniq_pairs, cells = np.unique(pair, return_inverse=True)
        cells = cells.ravel()
        cell_group = uniq_pairs // len(labels_)
        cell_code = uniq_pairs % len(labels_)
        per_model_cells = {
            m: _grouped(cells, uniq_pairs.size, b.y, b.scores[m], ks) for m in MODELS
        }
    items = []
    for code, lab in enumerate(labels_):
        rows = np.flatnonzero(codes == code)
        pos = int(b.y[rows].sum())
        scope = _Scope(f"slice:{fname}={lab}")
        if rows.size:
            b.add_rows(scope, rows, 0 < pos < rows.size)
            if per_model_cells is not None:
                b.add_groups(scope, per_model_cells, cell_code == code, cell_group)
        flags = _slice_flags(rows.size, pos, min_slice_rows)
        items.append(
            (scope, {"value": lab, "rows": int(rows.size), "positives": pos, "flags": flags})
        )
    return how, items


def _overall_scope(
    b: _Builder, group: tuple[np.ndarray, int] | None, ks: Sequence[int]
) -> tuple[_Scope, dict[str, Any]]:
    """The scope of all rows, and the group counts (empty without groups)."""
    overall = _Scope("overall")
    b.add_rows(overall, None, metrics.both_classes(b.y))
    if group is None:
        return overall, {}
    per_model = {m: _grouped(group[0], group[1], b.y, b.scores[m], ks) for m in MODELS}
    counts = b.add_groups(overall, per_model, None, None)
    return overall, {"groups": group[1], "scored_groups": counts}


def _overall_result(
    b: _Builder, overall: _Scope, boot: Mapping[tuple[str, str, str], np.ndarray], level: float
) -> dict[str, Any]:
    return {
        "metrics": _diffs(overall, boot, level),
        "calibration": {m: overall.points[m]["_calibration"] for m in MODELS},
        "reliability": {m: metrics.reliability(b.y, b.scores[m], b.bins) for m in MODELS},
    }


def _bootstrap_values(
    b: _Builder,
    group: tuple[np.ndarray, int] | None,
    seed: int,
    unit: str,
    workers: int | None,
) -> dict[tuple[str, str, str], np.ndarray]:
    """Every kernel's resampled values by (scope, metric, model), none without resamples; a
    kernel of several metrics (the row kernels) is spread into one entry per metric."""
    boot: dict[tuple[str, str, str], np.ndarray] = {}
    if not b.resamples:
        return boot
    gidx, n_groups = group if group is not None else (None, 0)
    res = bootstrap.Resampler(b.y.size, b.resamples, seed, gidx, n_groups, unit)
    for key, val in bootstrap.run(b.kernels, res, workers).items():
        if isinstance(val, dict):
            for sub, v in val.items():
                boot[(key[0], sub, key[2])] = v
        else:
            boot[key] = val
    return boot


def _diffs(
    scope: _Scope, boot: Mapping[tuple[str, str, str], np.ndarray], level: float
) -> dict[str, Any]:
    """Control, treatment, delta and (when bootstrapped) its interval and verdict per metric."""
    out = {}
    for name in scope.metrics:
        c, t = scope.points["control"][name], scope.points["treatment"][name]
        bc = boot.get((scope.name, name, "control"))
        bt = boot.get((scope.name, name, "treatment"))
        if bc is None or bt is None:
            out[name] = unbootstrapped(c, t)
        else:
            out[name] = bootstrap.difference(name, c, t, bc, bt, level).to_dict()
    return out


def _slice_results(
    how: str,
    items: list[tuple[_Scope, dict[str, Any]]],
    boot: Mapping[tuple[str, str, str], np.ndarray],
    level: float,
) -> dict[str, Any]:
    entries = []
    for scope, info in items:
        info = dict(info)
        info["metrics"] = _diffs(scope, boot, level) if info["rows"] else {}
        entries.append(info)
    return {"how": how, "flagged": sum(1 for e in entries if e["flags"]), "slices": entries}


def _check_inputs(
    labels: np.ndarray,
    control: np.ndarray,
    treatment: np.ndarray,
    groups: np.ndarray | None,
    ks: Sequence[int],
) -> tuple[np.ndarray, dict[str, np.ndarray], tuple[np.ndarray, int] | None]:
    """(labels, scores by model, (group index, number of groups) or None), checked."""
    y, sc = metrics.check_labels_scores(labels, control, "control scores")
    _, st = metrics.check_labels_scores(labels, treatment, "treatment scores")
    if any(k < 1 for k in ks):
        raise ValueError(f"k for NDCG@k / recall@k must be >= 1, got {list(ks)}")
    if groups is None:
        return y, {"control": sc, "treatment": st}, None
    if len(groups) != y.size:
        raise ValueError(f"group field has {len(groups)} values for {y.size} rows")
    return y, {"control": sc, "treatment": st}, metrics.group_index(groups)


def compare_scores(
    labels: np.ndarray,
    control: np.ndarray,
    treatment: np.ndarray,
    *,
    groups: np.ndarray | None = None,
    slices: Mapping[str, np.ndarray] | None = None,
    ks: Sequence[int] = (5, 10),
    resamples: int = 1000,
    seed: int = 0,
    unit: str = "rows",
    bins: int = 10,
    min_slice_rows: int = 100,
    max_slice_values: int = 20,
    numeric_slice_bins: int = 4,
    level: float = 0.95,
    workers: int | None = 1,
) -> dict[str, Any]:
    """Paired comparison of two models' scores on the same rows (every number of the report).

    Args:
      labels: ``[n]`` 0/1 clicks. control, treatment: ``[n]`` click probabilities.
      groups: ``[n]`` user or request ids (enables GAUC, NDCG@k, recall@k).
      slices: ``{field: [n] values}``; every value (or quantile bin of a numeric field) is a
        slice. Slices with fewer than ``min_slice_rows`` rows or a single class are flagged.
      resamples: bootstrap resamples B (0: point estimates only).
      workers: threads for the bootstrap kernels (None: one per CPU, at most 8).
    """
    t0 = time.perf_counter()
    y, scores, group = _check_inputs(labels, control, treatment, groups, ks)
    b = _Builder(y, scores, bins, resamples)
    overall, group_info = _overall_scope(b, group, ks)
    cut = (min_slice_rows, max_slice_values, numeric_slice_bins)
    sliced = {f: _slice_scopes(b, f, v, group, ks, *cut) for f, v in (slices or {}).items()}
    t_points = time.perf_counter() - t0
    boot = _bootstrap_values(b, group, seed, unit, workers)
    t_boot = time.perf_counter() - t0 - t_points
    return {
        "rows": y.size,
        "positives": int(y.sum()),
        "settings": {
            "resamples": resamples,
            "seed": seed,
            "unit": unit,
            "level": level,
            "calibration_bins": bins,
            "k": list(ks),
            "min_slice_rows": min_slice_rows,
        },
        "overall": _overall_result(b, overall, boot, level),
        "groups": group_info or None,
        "slices": {
            f: _slice_results(how, items, boot, level) for f, (how, items) in sliced.items()
        },
        "timing_s": {"points": t_points, "bootstrap": t_boot},
    }


def verdict(result: Mapping[str, Any], primary: str) -> dict[str, Any]:
    m = result["overall"]["metrics"]
    if primary not in m:
        raise ValueError(f"primary metric {primary!r} was not computed; computed: {sorted(m)}")
    d = m[primary]
    return {"primary_metric": primary, "verdict": d["verdict"], **{k: d[k] for k in d}}


# --------------------------------------------------------------------------------------------
# off-policy


def off_policy(
    logs: sources.Logs,
    policies: Mapping[str, sources.ScoreSource],
    *,
    action: str,
    propensity: str,
    temperature: float = 1.0,
    reward_folds: int = 2,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    log: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """IPS / SNIPS / DM / DR estimates (with CIs) of each policy, and treatment - control."""
    bl = offpolicy.bandit_logs(logs, action, propensity)
    build = offpolicy.candidate_builder(logs, bl)
    rm = None
    if reward_folds:
        log(f"off-policy: {bl.actions.size} candidate actions; fitting the reward model")
        rm = offpolicy.fit_reward_model(logs, bl, build, reward_folds, seed)
    rows, skipped = _policy_rows(logs, policies, (bl, build, rm), action, temperature, log)
    kernels: dict[tuple[str, str], bootstrap.Kernel] = {
        ("logged", "observed"): bootstrap.RatioKernel(bl.reward)
    }
    for name, pr in rows.items():
        for est, k in pr.kernels().items():
            kernels[(name, est)] = k
    boot = bootstrap.run(kernels, bootstrap.Resampler(logs.n, resamples, seed + 1))
    out: dict[str, Any] = {
        "action": action,
        "propensity": propensity,
        "candidates": int(bl.actions.size),
        "policy": f"softmax over candidates of logit(score) / {temperature}"
        if temperature
        else "greedy (argmax score)",
        "reward_model": rm.description if rm else "none (--reward-folds 0): no DM / DR",
        "logged": {
            "observed_ctr": float(bl.reward.mean()),
            "ci": bootstrap.interval(boot[("logged", "observed")], level),
        },
        "policies": {name: _estimates(name, pr, boot, level) for name, pr in rows.items()},
        "skipped": skipped,
    }
    if "control" in rows and "treatment" in rows:
        out["difference"] = _difference(rows, boot, level)
    return out


def _policy_rows(
    logs: sources.Logs,
    policies: Mapping[str, sources.ScoreSource],
    fitted: tuple[Any, Any, Any],
    action: str,
    temperature: float,
    log: Callable[[str], None],
) -> tuple[dict[str, offpolicy.PolicyRows], dict[str, str]]:
    """Each policy's per-row weights and rewards from its candidate scores (``fitted``: the
    bandit logs, their candidate builder and the reward model or None); the policies whose
    scores cannot be read are skipped, with the reason."""
    bl, build, rm = fitted
    rows: dict[str, offpolicy.PolicyRows] = {}
    skipped: dict[str, str] = {}
    for name, src in policies.items():
        try:
            cand = src.candidate_scores(logs, action, bl.actions, build)
        except sources.SourceError as e:
            skipped[name] = str(e)
            continue
        metrics.check_labels_scores(np.zeros(cand.size), cand.ravel(), f"{name} candidate scores")
        pi = offpolicy.policy(cand, temperature)
        rows[name] = offpolicy.policy_rows(pi, bl, None if rm is None else rm.q)
        log(f"off-policy: scored {cand.size:,} (row, candidate) pairs for {name}")
    return rows, skipped


def _estimates(
    name: str, pr: offpolicy.PolicyRows, boot: dict[Any, Any], level: float
) -> dict[str, Any]:
    """A policy's estimates, each with its bootstrap interval, and its weight diagnostics."""
    point = pr.point()
    return {
        "estimates": {
            est: {"value": point[est], "ci": bootstrap.interval(boot[(name, est)], level)}
            for est in offpolicy.ESTIMATORS
        },
        "diagnostics": pr.diagnostics(),
    }


def _difference(
    rows: dict[str, offpolicy.PolicyRows], boot: dict[Any, Any], level: float
) -> dict[str, Any]:
    """Treatment - control of every estimator, with its paired bootstrap interval."""
    return {
        est: bootstrap.difference(
            est,
            rows["control"].point()[est],
            rows["treatment"].point()[est],
            boot[("control", est)],
            boot[("treatment", est)],
            level,
        ).to_dict()
        for est in offpolicy.ESTIMATORS
    }
