"""Ranking metrics of click models, as plain vectorised numpy functions.

Shapes: ``labels`` and ``scores`` are ``[n]`` (labels 0/1; scores any finite numbers for AUC,
click probabilities in [0, 1] for logloss and calibration); ``groups`` is ``[n]`` of any hashable
dtype (user or request id); ``weights`` is an optional ``[n]`` of non-negative row weights
(e.g. bootstrap counts).

* AUC (Mann-Whitney): ``sum_{i pos, j neg} w_i w_j ([s_i > s_j] + [s_i = s_j] / 2) / (W+ W-)``
  with ``W+``, ``W-`` the total weights of the clicks and non-clicks. Computed from one sort
  (``ScoreOrder``): in ascending score order the running weight of non-clicks gives, for each
  click, the weight of non-clicks ranked below it plus half of those tied with it. Unweighted,
  this is ``(sum of the clicks' mid-ranks - P (P + 1) / 2) / (P N)``.
* logloss: ``-sum w (y log p + (1 - y) log(1 - p)) / sum w``, p clipped to ``[eps, 1 - eps]``.
* calibration: ``ratio = sum w p / sum w y`` (predicted / observed clicks; 1 is calibrated);
  ``ECE = sum_b |sum_{i in b} w_i (p_i - y_i)| / sum w`` over equal-width probability bins
  (Naeini et al., AAAI 2015); the reliability curve is (mean p, mean y, rows) per bin.
* GAUC (Zhou et al., "Deep Interest Network", KDD 2018): per-group AUC averaged with weights =
  the group's impressions, over groups that have both a click and a non-click.
* NDCG@k (Järvelin & Kekäläinen 2002) with binary gains: per group, rank by score (descending;
  ties broken by row order), ``DCG@k = sum_{r < k} y_(r) / log2(r + 2)``, divided by the ideal
  DCG; recall@k = clicks in the top k / clicks in the group. Both are averaged over groups with
  at least one click.

One-class policy. AUC is undefined when the labels hold one class (no click, or no non-click);
so are GAUC when no group holds both, and NDCG@k / recall@k when no group has a click.

* The scalar functions (``auc``, ``gauc``, ``ndcg_at_k``, ``recall_at_k``) raise
  ``OneClassError`` (a ``MetricInputError``, itself a ``ValueError``) naming the counts: an
  evaluation set without both classes is a data problem the caller should see (training's
  per-epoch test AUC, ``stitchrec evaluate``). Callers that expect it (a slice of logs) check
  ``both_classes`` first and record NaN themselves.
* The per-group building blocks (``per_group_auc``, ``per_group_topk``) mark groups that cannot
  be scored as not ``valid``; the grouped averages skip them (``GroupValues.mean`` returns NaN
  when none is valid).
* The batched form ``ScoreOrder.auc`` (one AUC per row of a ``[c, n]`` weight matrix, used by
  the paired bootstrap) returns NaN for a weight row whose clicks or non-clicks weigh zero, so
  one degenerate resample does not stop the others; interval code drops the NaNs.
* logloss, calibration and ECE are defined for one class (calibration ratio: inf without clicks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

EPS = 1e-7


class MetricInputError(ValueError):
    """Labels or scores that no metric can be computed on (the message says which and where)."""


class OneClassError(MetricInputError):
    """The labels (of every group, for grouped metrics) lack a class the metric needs."""


def _show(x: object) -> str:
    """repr of a value, numpy scalars as plain Python values."""
    return repr(x.item() if isinstance(x, np.generic) else x)


def check_labels_scores(
    labels: np.ndarray, scores: np.ndarray, what: str = "scores", probabilities: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Validated ``[n]`` float64 copies: same length, not empty, labels in {0, 1}, scores finite
    (and in [0, 1] when ``probabilities``). Raises ``MetricInputError`` naming the first bad
    row."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise MetricInputError(
            f"{what}: {s.size} scores for {y.size} labelled rows; expected one score per row"
        )
    if y.size == 0:
        raise MetricInputError(f"{what}: no rows (labels and scores are empty)")
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
            f"expected finite values (non-finite scores cannot be ranked)"
        )
    if probabilities:
        out = np.flatnonzero((s < 0) | (s > 1))
        if out.size:
            raise MetricInputError(
                f"{what}: {out.size} scores lie outside [0, 1], first at row {int(out[0])} "
                f"(value {_show(s[out[0]])}); expected click probabilities"
            )
    return y, s


def _weights(w: np.ndarray | None, n: int) -> np.ndarray:
    """``[n]`` float64 row weights (ones when ``w`` is None)."""
    if w is None:
        return np.ones(n)
    w = np.asarray(w, dtype=np.float64).ravel()
    if w.size != n or np.any(w < 0) or not np.all(np.isfinite(w)):
        raise MetricInputError(
            f"weights: expected {n} finite non-negative numbers, got {w.size} values"
        )
    return w


def tie_bounds(sorted_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each position of an ascending ``[n]`` array, the ``[start, end)`` of its run of equal
    values (two ``[n]`` int arrays)."""
    n = sorted_scores.size
    change = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [n]])
    run = np.repeat(np.arange(starts.size), ends - starts)
    return starts[run], ends[run]


def both_classes(labels: np.ndarray) -> bool:
    """Whether ``labels`` hold at least one click and one non-click."""
    y = np.asarray(labels)
    return bool(y.size) and 0 < float(y.sum()) < y.size


# --------------------------------------------------------------------------------------------
# AUC


@dataclass(frozen=True)
class ScoreOrder:
    """One ascending sort of ``scores`` (on ``rows``, default all) from which the AUC of any row
    weights follows in O(n), without another sort.

    ``take`` is ``[m]``: the rows in ascending score order; for the ``P`` clicks (positions
    ``pos`` in that order) ``before`` / ``has_before`` locate the last position before the
    click's run of tied scores and ``last`` the run's last position.
    """

    take: np.ndarray  # [m] int
    is_neg: np.ndarray  # [m] 1.0 where the sorted row is a non-click
    pos: np.ndarray  # [P] int
    before: np.ndarray  # [P] int (0 when the run starts the order)
    has_before: np.ndarray  # [P] 1.0 when some row precedes the run
    last: np.ndarray  # [P] int

    @classmethod
    def of(
        cls, labels: np.ndarray, scores: np.ndarray, rows: np.ndarray | None = None
    ) -> ScoreOrder:
        y = np.asarray(labels, dtype=np.float64)
        s = np.asarray(scores, dtype=np.float64)
        idx = np.arange(y.size) if rows is None else np.asarray(rows)
        take = idx[np.argsort(s[idx], kind="mergesort")]
        ys = y[take]
        start, end = tie_bounds(s[take])
        pos = np.flatnonzero(ys == 1)
        return cls(
            take=take,
            is_neg=(ys == 0).astype(np.float64),
            pos=pos,
            before=np.maximum(start[pos] - 1, 0),
            has_before=(start[pos] > 0).astype(np.float64),
            last=end[pos] - 1,
        )

    def auc(self, w: np.ndarray, overwrite: bool = False) -> np.ndarray:
        """``[c]`` AUC of each row of ``w`` (``[c, m]`` weights in ``take`` order); NaN where the
        clicks or the non-clicks weigh zero. ``overwrite`` lets it reuse ``w``'s memory.

        ``cum = cumsum(w * is_neg)`` (inclusive) gives for each click ``below = cum[before]``
        and ``below + tied = cum[last]``, so ``AUC = sum_pos w (2 below + tied) / (2 W+ W-)``.
        """
        wp = np.take(w, self.pos, axis=1)
        neg = np.multiply(w, self.is_neg, out=w if overwrite else None)
        cum = np.cumsum(neg, axis=1, out=neg)
        twice = np.take(cum, self.before, axis=1) * self.has_before
        twice += np.take(cum, self.last, axis=1)
        num = np.einsum("ij,ij->i", wp, twice)
        den = 2.0 * wp.sum(axis=1) * cum[:, -1]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def auc(labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Weighted ROC AUC of ``[n]`` scores (ties count one half).

    Raises:
      OneClassError: the clicks or the non-clicks are absent (or weigh zero).
      MetricInputError: mismatched lengths, no rows, labels not 0/1, non-finite scores.
    """
    y, s = check_labels_scores(labels, scores, probabilities=False)
    w = _weights(weights, y.size)
    w_pos, w_neg = float(np.dot(w, y)), float(np.dot(w, 1 - y))
    if w_pos == 0 or w_neg == 0:
        n_pos = int(y.sum())
        raise OneClassError(
            f"AUC needs both classes; got {n_pos} positives and {y.size - n_pos} negatives"
            + ("" if weights is None else f" weighing {w_pos:g} and {w_neg:g}")
        )
    order = ScoreOrder.of(y, s)
    return float(order.auc(w[order.take][None, :], overwrite=True)[0])


# --------------------------------------------------------------------------------------------
# logloss and calibration


def row_logloss(labels: np.ndarray, scores: np.ndarray, eps: float = EPS) -> np.ndarray:
    """``[n]`` per-row log loss ``-(y log p + (1 - y) log(1 - p))``, p clipped to [eps, 1-eps]."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.clip(np.asarray(scores, dtype=np.float64).ravel(), eps, 1 - eps)
    return -(y * np.log(p) + (1 - y) * np.log1p(-p))


def logloss(
    labels: np.ndarray,
    probabilities: np.ndarray,
    weights: np.ndarray | None = None,
    eps: float = EPS,
) -> float:
    """Weighted mean log loss of ``[n]`` click probabilities (defined for one class).

    Raises:
      MetricInputError: bad labels, or probabilities outside [0, 1] or not finite.
    """
    y, p = check_labels_scores(labels, probabilities, "probabilities")
    w = _weights(weights, y.size)
    return float(np.dot(w, row_logloss(y, p, eps)) / w.sum())


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
    """Calibration ratio, ECE and the equal-width reliability bins of ``[n]`` probabilities."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.asarray(scores, dtype=np.float64).ravel()
    w = _weights(weights, y.size)
    b = bin_index(p, bins)
    rows = np.bincount(b, weights=w, minlength=bins)
    sp = np.bincount(b, weights=w * p, minlength=bins)
    sy = np.bincount(b, weights=w * y, minlength=bins)
    clicks = float(np.dot(w, y))
    curve = [
        {
            "lo": i / bins,
            "hi": (i + 1) / bins,
            "rows": float(rows[i]),
            "mean_score": float(sp[i] / rows[i]) if rows[i] else None,
            "mean_label": float(sy[i] / rows[i]) if rows[i] else None,
        }
        for i in range(bins)
    ]
    ratio = float(np.dot(w, p) / clicks) if clicks else float("inf")
    return Calibration(ratio=ratio, ece=float(np.abs(sp - sy).sum() / w.sum()), bins=curve)


def reliability(labels: np.ndarray, scores: np.ndarray, bins: int = 10) -> list[dict[str, float]]:
    """Reliability curve with equal-count bins of the score (readable at low click rates):
    per bin the rows, mean score and observed click rate."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.asarray(scores, dtype=np.float64).ravel()
    order = np.argsort(p, kind="mergesort")
    return [
        {
            "rows": int(part.size),
            "mean_score": float(p[part].mean()),
            "mean_label": float(y[part].mean()),
        }
        for part in np.array_split(order, min(bins, p.size))
        if part.size
    ]


# --------------------------------------------------------------------------------------------
# grouped metrics


def factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``[n]`` int64 codes, sorted unique values) of any 1-D array (hash-based, fast for
    strings)."""
    codes, uniq = pd.factorize(np.asarray(values).ravel(), sort=True)
    if (codes < 0).any():
        raise MetricInputError("group / slice values must not be missing (NaN or None)")
    return codes.astype(np.int64), np.asarray(uniq)


def group_index(groups: np.ndarray) -> tuple[np.ndarray, int]:
    """(``[n]`` dense group index 0..G-1, G) of any array of group keys."""
    codes, uniq = factorize(groups)
    return codes, int(uniq.size)


@dataclass(frozen=True)
class GroupValues:
    """One value per group and whether the group is scored (``valid``), plus its weight."""

    values: np.ndarray  # [G]
    weights: np.ndarray  # [G] (impressions for GAUC, 1 for NDCG / recall)
    valid: np.ndarray  # [G] bool

    def mean(self, group_weights: np.ndarray | None = None) -> float:
        """Weighted mean over the valid groups; NaN when none is valid."""
        w = self.weights * self.valid
        if group_weights is not None:
            w = w * group_weights
        total = w.sum()
        return float(np.dot(w, np.where(self.valid, self.values, 0.0)) / total) if total else np.nan


def per_group_auc(
    gidx: np.ndarray, n_groups: int, labels: np.ndarray, scores: np.ndarray
) -> GroupValues:
    """AUC within each group (``gidx`` ``[n]`` in 0..G-1); valid when both classes occur.

    The ``ScoreOrder`` count on groups: one sort by (group, score) keeps every group's rows
    contiguous and in score order; each click's non-clicks below it (and tied with it) are
    counted from its group's start, ``AUC_g = sum_pos (2 below + tied) / (2 P_g N_g)``.
    """
    y = np.asarray(labels, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    order = np.lexsort((s, gidx))
    g, ss, ys = gidx[order], s[order], y[order]
    n = y.size
    change = np.flatnonzero((np.diff(g) != 0) | (np.diff(ss) != 0)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [n]])
    run = np.repeat(np.arange(starts.size), ends - starts)
    cum = np.concatenate([[0.0], np.cumsum(1 - ys)])  # exclusive: non-clicks before position i
    size = np.bincount(g, minlength=n_groups)
    gstart = np.concatenate([[0], np.cumsum(size)[:-1]])
    pos = ys == 1
    base = cum[gstart[g[pos]]]
    twice = (cum[starts[run[pos]]] - base) + (cum[ends[run[pos]]] - base)  # 2 below + tied
    n_pos = np.bincount(g, weights=ys, minlength=n_groups)
    n_neg = size - n_pos
    num = np.bincount(g[pos], weights=twice, minlength=n_groups)
    valid = (n_pos > 0) & (n_neg > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.where(valid, num / (2.0 * n_pos * n_neg), 0.0)
    return GroupValues(values=values, weights=size.astype(np.float64), valid=valid)


def _ranked_in_group(
    gidx: np.ndarray, scores: np.ndarray, n_groups: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, group of each ranked row, its 0-based rank within the group, best first)."""
    n = gidx.size
    order = np.lexsort((np.arange(n), -np.asarray(scores, dtype=np.float64), gidx))
    g = gidx[order]
    size = np.bincount(g, minlength=n_groups)
    gstart = np.concatenate([[0], np.cumsum(size)[:-1]])
    return order, g, np.arange(n) - gstart[g]


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


def _scored_mean(gv: GroupValues, what: str, needs: str) -> float:
    if not gv.valid.any():
        raise OneClassError(f"{what} needs a group with {needs}; none of {gv.valid.size} has")
    return gv.mean()


def gauc(groups: np.ndarray, labels: np.ndarray, scores: np.ndarray) -> float:
    """Impression-weighted mean AUC over the groups holding both classes (others skipped).

    Raises:
      OneClassError: no group holds both a click and a non-click.
    """
    gidx, n_groups = group_index(groups)
    gv = per_group_auc(gidx, n_groups, labels, scores)
    return _scored_mean(gv, "GAUC", "both classes")


def ndcg_at_k(groups: np.ndarray, labels: np.ndarray, scores: np.ndarray, k: int) -> float:
    """Mean NDCG@k over the groups with a click. Raises ``OneClassError`` when none has one."""
    gidx, n_groups = group_index(groups)
    gv = per_group_topk(gidx, n_groups, labels, scores, [k])[f"ndcg@{k}"]
    return _scored_mean(gv, f"ndcg@{k}", "a click")


def recall_at_k(groups: np.ndarray, labels: np.ndarray, scores: np.ndarray, k: int) -> float:
    """Mean recall@k over the groups with a click. Raises ``OneClassError`` when none has one."""
    gidx, n_groups = group_index(groups)
    gv = per_group_topk(gidx, n_groups, labels, scores, [k])[f"recall@{k}"]
    return _scored_mean(gv, f"recall@{k}", "a click")
