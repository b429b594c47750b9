"""Offline metrics as plain numpy functions.

* ``auc``: area under the ROC curve = P(score of a random positive > score of a random negative),
  ties counted one half, computed from mid-ranks (Mann-Whitney U):
  ``AUC = (sum of positive ranks - P (P + 1) / 2) / (P N)``.
* ``logloss``: ``-mean(y log p + (1 - y) log(1 - p))`` with p clipped to ``[eps, 1 - eps]``.
"""

from __future__ import annotations

import numpy as np


def _check(labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(labels, dtype=np.float64).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise ValueError(f"labels has {y.size} rows but scores has {s.size}")
    if y.size == 0:
        raise ValueError("labels and scores are empty")
    if not np.all((y == 0) | (y == 1)):
        bad = y[(y != 0) & (y != 1)][:5]
        raise ValueError(f"labels must be 0 or 1, found {bad.tolist()}")
    if not np.all(np.isfinite(s)):
        raise ValueError(f"scores hold {int(np.sum(~np.isfinite(s)))} non-finite values")
    return y, s


def _midranks(s: np.ndarray) -> np.ndarray:
    """1-based ranks of ``s`` with ties given their average rank."""
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    boundaries = np.flatnonzero(np.diff(sorted_s)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [s.size]])
    avg = (starts + ends + 1) / 2.0  # mean of ranks start+1 .. end
    ranks = np.empty(s.size, dtype=np.float64)
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC; raises if only one class is present."""
    y, s = _check(labels, scores)
    n_pos = float(y.sum())
    n_neg = float(y.size - n_pos)
    if n_pos == 0 or n_neg == 0:
        raise ValueError(
            f"AUC needs both classes; got {int(n_pos)} positives, {int(n_neg)} negatives"
        )
    ranks = _midranks(s)
    return float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def logloss(labels: np.ndarray, probabilities: np.ndarray, eps: float = 1e-7) -> float:
    y, p = _check(labels, probabilities)
    if np.any((p < 0) | (p > 1)):
        raise ValueError("probabilities must lie in [0, 1]")
    p = np.clip(p, eps, 1 - eps)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))
