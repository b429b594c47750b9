"""Point metrics of one model on logged clicks, as plain vectorised numpy functions.

Shapes: ``labels`` and ``scores`` are ``[n]`` (labels 0/1, scores click probabilities in
[0, 1]); ``groups`` is ``[n]`` of any hashable dtype (user or request id); ``weights`` is an
optional ``[n]`` of non-negative row weights (bootstrap counts).

* AUC (Mann-Whitney): ``sum_{i pos, j neg} w_i w_j ([s_i > s_j] + [s_i = s_j] / 2) / (W+ W-)``,
  computed from one sort: for each positive, the weight of negatives ranked below it plus half of
  those tied with it.
* logloss: ``-sum w (y log p + (1 - y) log(1 - p)) / sum w``, p clipped to ``[eps, 1 - eps]``.
* calibration: ``ratio = sum w p / sum w y`` (predicted / observed clicks; 1 is calibrated);
  ``ECE = sum_b |sum_{i in b} w_i (p_i - y_i)| / sum w`` over equal-width probability bins
  (Naeini et al., AAAI 2015); the reliability curve is (mean p, mean y, rows) per bin.
* GAUC (Zhou et al., "Deep Interest Network", KDD 2018): per-group AUC averaged with weights =
  the group's impressions, over groups that have both a click and a non-click.
* NDCG@k (Järvelin & Kekäläinen 2002) with binary gains: per group, rank by score (descending;
  ties broken by row order), ``DCG@k = sum_{r < k} y_(r) / log2(r + 2)``, divided by the ideal
  DCG; recall@k = clicks in the top k / clicks in the group. Both are averaged over groups with
  at least one click (groups without clicks are counted and reported, not scored).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

EPS = 1e-7


def _show(x: object) -> str:
    """repr of a value, numpy scalars as plain Python values."""
    return repr(x.item() if isinstance(x, np.generic) else x)


class MetricInputError(ValueError):
    """Labels or scores that no metric can be computed on (the message says which and where)."""


def check_labels_scores(
    labels: np.ndarray, scores: np.ndarray, what: str = "scores"
) -> tuple[np.ndarray, np.ndarray]:
    """Validated float64 copies: same length, labels in {0, 1}, scores finite and in [0, 1]."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise MetricInputError(
            f"{what}: {s.size} scores for {y.size} labelled rows; expected one score per row"
        )
    if y.size == 0:
        raise MetricInputError(f"{what}: no rows")
    bad = np.flatnonzero((y != 0) & (y != 1))
    if bad.size:
        raise MetricInputError(
            f"labels must be 0 or 1: {bad.size} rows are not, first at row {int(bad[0])} "
            f"(value {_show(y[bad[0]])})"
        )
    nan = np.flatnonzero(~np.isfinite(s))
    if nan.size:
        raise MetricInputError(
            f"{what}: {nan.size} scores are NaN or infinite, first at row {int(nan[0])}; "
            f"expected finite click probabilities"
        )
    out = np.flatnonzero((s < 0) | (s > 1))
    if out.size:
        raise MetricInputError(
            f"{what}: {out.size} scores lie outside [0, 1], first at row {int(out[0])} "
            f"(value {_show(s[out[0]])}); expected click probabilities"
        )
    return y, s


def _weights(w: np.ndarray | None, n: int) -> np.ndarray:
    if w is None:
        return np.ones(n)
    w = np.asarray(w, dtype=np.float64).ravel()
    if w.size != n or np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ValueError(f"weights must be {n} finite non-negative numbers")
    return w


def tie_bounds(sorted_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each position of an ascending array, the [start, end) of its run of equal values."""
    n = sorted_scores.size
    change = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [n]])
    run = np.repeat(np.arange(starts.size), ends - starts)
    return starts[run], ends[run]


def auc(labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Weighted ROC AUC (ties count one half); NaN when a class has zero weight."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    w = _weights(weights, y.size)
    order = np.argsort(s, kind="mergesort")
    ss, ys, ws = s[order], y[order], w[order]
    start, end = tie_bounds(ss)
    neg = ws * (1 - ys)
    cum = np.concatenate([[0.0], np.cumsum(neg)])
    pos = ys == 1
    below = cum[start[pos]]
    tied = cum[end[pos]] - below
    w_pos = ws[pos].sum()
    w_neg = neg.sum()
    if w_pos == 0 or w_neg == 0:
        return float("nan")
    return float(np.dot(ws[pos], below + 0.5 * tied) / (w_pos * w_neg))


def logloss(
    labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None, eps: float = EPS
) -> float:
    y = np.asarray(labels, dtype=np.float64).ravel()
    w = _weights(weights, y.size)
    return float(np.dot(w, row_logloss(y, scores, eps)) / w.sum())


def row_logloss(labels: np.ndarray, scores: np.ndarray, eps: float = EPS) -> np.ndarray:
    """``[n]`` per-row log loss ``-(y log p + (1 - y) log(1 - p))``, p clipped to [eps, 1-eps]."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.clip(np.asarray(scores, dtype=np.float64).ravel(), eps, 1 - eps)
    return -(y * np.log(p) + (1 - y) * np.log1p(-p))


def bin_index(scores: np.ndarray, bins: int) -> np.ndarray:
    """Equal-width bin of each probability: ``min(floor(p * bins), bins - 1)``."""
    return np.minimum((np.asarray(scores, dtype=np.float64) * bins).astype(np.int64), bins - 1)


@dataclass(frozen=True)
class Calibration:
    ratio: float  # sum p / sum y (inf when there are no clicks)
    ece: float
    bins: list[dict[str, float]]  # lo, hi, rows, mean_score, mean_label (None when empty)

    def to_dict(self) -> dict[str, object]:
        return {"ratio": self.ratio, "ece": self.ece, "bins": self.bins}


def calibration(
    labels: np.ndarray, scores: np.ndarray, bins: int = 10, weights: np.ndarray | None = None
) -> Calibration:
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.asarray(scores, dtype=np.float64).ravel()
    w = _weights(weights, y.size)
    b = bin_index(p, bins)
    rows = np.bincount(b, weights=w, minlength=bins)
    sp = np.bincount(b, weights=w * p, minlength=bins)
    sy = np.bincount(b, weights=w * y, minlength=bins)
    total = w.sum()
    clicks = float(np.dot(w, y))
    curve = []
    for i in range(bins):
        curve.append(
            {
                "lo": i / bins,
                "hi": (i + 1) / bins,
                "rows": float(rows[i]),
                "mean_score": float(sp[i] / rows[i]) if rows[i] else None,
                "mean_label": float(sy[i] / rows[i]) if rows[i] else None,
            }
        )
    ratio = float(np.dot(w, p) / clicks) if clicks else float("inf")
    return Calibration(ratio=ratio, ece=float(np.abs(sp - sy).sum() / total), bins=curve)


# --------------------------------------------------------------------------------------------
# grouped metrics


def group_index(groups: np.ndarray) -> tuple[np.ndarray, int]:
    """(``[n]`` dense group index 0..G-1, G) of any array of group keys."""
    codes, uniq = factorize(groups)
    return codes, int(uniq.size)


def factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``[n]`` int64 codes, sorted unique values) of any 1-D array (hash-based, fast for
    strings)."""
    import pandas as pd

    codes, uniq = pd.factorize(np.asarray(values).ravel(), sort=True)
    if (codes < 0).any():
        raise ValueError("group / slice values must not be missing (NaN or None)")
    return codes.astype(np.int64), np.asarray(uniq)


@dataclass(frozen=True)
class GroupValues:
    """One value per group and whether the group is scored (``valid``), plus its weight."""

    values: np.ndarray  # [G]
    weights: np.ndarray  # [G] (impressions for GAUC, 1 for NDCG / recall)
    valid: np.ndarray  # [G] bool

    def mean(self, group_weights: np.ndarray | None = None) -> float:
        w = self.weights * self.valid
        if group_weights is not None:
            w = w * group_weights
        total = w.sum()
        return float(np.dot(w, np.where(self.valid, self.values, 0.0)) / total) if total else np.nan


def per_group_auc(
    gidx: np.ndarray, n_groups: int, labels: np.ndarray, scores: np.ndarray
) -> GroupValues:
    """AUC within each group (mid-ranks of (group, score) runs); valid when both classes occur."""
    y = np.asarray(labels, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    order = np.lexsort((s, gidx))
    g, ss, ys = gidx[order], s[order], y[order]
    n = y.size
    change = np.flatnonzero((np.diff(g) != 0) | (np.diff(ss) != 0)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [n]])
    midpos = (starts + ends - 1) / 2.0  # mean 0-based position of each tie run
    pos_mid = np.repeat(midpos, ends - starts)
    size = np.bincount(g, minlength=n_groups)
    gstart = np.concatenate([[0], np.cumsum(size)[:-1]])
    rank = pos_mid - gstart[g] + 1.0  # 1-based mid-rank within the group
    n_pos = np.bincount(g, weights=ys, minlength=n_groups)
    n_neg = size - n_pos
    r_pos = np.bincount(g, weights=rank * ys, minlength=n_groups)
    valid = (n_pos > 0) & (n_neg > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.where(valid, (r_pos - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg), 0.0)
    return GroupValues(values=values, weights=size.astype(np.float64), valid=valid)


def _ranked_in_group(gidx: np.ndarray, scores: np.ndarray, n_groups: int):
    n = gidx.size
    order = np.lexsort((np.arange(n), -np.asarray(scores, dtype=np.float64), gidx))
    g = gidx[order]
    size = np.bincount(g, minlength=n_groups)
    gstart = np.concatenate([[0], np.cumsum(size)[:-1]])
    rank = np.arange(n) - gstart[g]  # 0-based rank within the group, best first
    return order, g, rank


def per_group_topk(
    gidx: np.ndarray, n_groups: int, labels: np.ndarray, scores: np.ndarray, ks: Sequence[int]
) -> dict[str, GroupValues]:
    """``ndcg@k`` and ``recall@k`` per group for every k, from one sort; valid when the group
    has a click."""
    y = np.asarray(labels, dtype=np.float64)
    order, g, rank = _ranked_in_group(gidx, scores, n_groups)
    ys = y[order]
    n_pos = np.bincount(g, weights=ys, minlength=n_groups)
    valid = n_pos > 0
    out = {}
    for k in ks:
        top = rank < k
        gt, yt = g[top], ys[top]
        dcg = np.bincount(gt, weights=yt / np.log2(rank[top] + 2.0), minlength=n_groups)
        hits = np.bincount(gt, weights=yt, minlength=n_groups)
        ideal_table = np.concatenate([[0.0], np.cumsum(1.0 / np.log2(np.arange(k) + 2.0))])
        idcg = ideal_table[np.minimum(n_pos.astype(np.int64), k)]
        with np.errstate(invalid="ignore", divide="ignore"):
            ndcg = np.where(valid, dcg / np.where(valid, idcg, 1.0), 0.0)
            recall = np.where(valid, hits / np.where(valid, n_pos, 1.0), 0.0)
        out[f"ndcg@{k}"] = GroupValues(values=ndcg, weights=np.ones(n_groups), valid=valid)
        out[f"recall@{k}"] = GroupValues(values=recall, weights=np.ones(n_groups), valid=valid)
    return out


def per_group_ndcg(
    gidx: np.ndarray, n_groups: int, labels: np.ndarray, scores: np.ndarray, k: int
) -> GroupValues:
    """NDCG@k per group with binary gains; valid when the group has a click."""
    return per_group_topk(gidx, n_groups, labels, scores, [k])[f"ndcg@{k}"]


def per_group_recall(
    gidx: np.ndarray, n_groups: int, labels: np.ndarray, scores: np.ndarray, k: int
) -> GroupValues:
    """Recall@k per group: clicks ranked in the top k / clicks; valid when the group has a click."""
    return per_group_topk(gidx, n_groups, labels, scores, [k])[f"recall@{k}"]


def gauc(groups: np.ndarray, labels: np.ndarray, scores: np.ndarray) -> float:
    gidx, n_groups = group_index(groups)
    return per_group_auc(gidx, n_groups, labels, scores).mean()


def ndcg_at_k(groups: np.ndarray, labels: np.ndarray, scores: np.ndarray, k: int) -> float:
    gidx, n_groups = group_index(groups)
    return per_group_ndcg(gidx, n_groups, labels, scores, k).mean()


def recall_at_k(groups: np.ndarray, labels: np.ndarray, scores: np.ndarray, k: int) -> float:
    gidx, n_groups = group_index(groups)
    return per_group_recall(gidx, n_groups, labels, scores, k).mean()


def reliability(labels: np.ndarray, scores: np.ndarray, bins: int = 10) -> list[dict[str, float]]:
    """Reliability curve with equal-count bins of the score (readable at low click rates):
    per bin the rows, mean score and observed click rate."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.asarray(scores, dtype=np.float64).ravel()
    order = np.argsort(p, kind="mergesort")
    out = []
    for part in np.array_split(order, min(bins, p.size)):
        if part.size:
            out.append(
                {
                    "rows": int(part.size),
                    "mean_score": float(p[part].mean()),
                    "mean_label": float(y[part].mean()),
                }
            )
    return out
