"""Paired bootstrap for model comparison (Efron & Tibshirani, "An Introduction to the Bootstrap",
1993, ch. 13 and 16).

Every resample is a vector of multinomial counts ``W[b] ~ Multinomial(n, 1/n)`` (how often each
logged row is drawn, with replacement); both models are scored on the same ``W[b]``, so a
difference ``metric_B(W[b]) - metric_A(W[b])`` sees the same rows for both. When the logs have a
group field (user or request) the unit can be the group instead (cluster bootstrap): rows inherit
their group's count. Grouped metrics (GAUC, NDCG@k, recall@k) always resample groups.

Each metric is a *kernel*: precomputed once (one sort per model and slice), then evaluated on a
chunk of resamples ``W`` (``[c, n]``, float64 holding integer counts, so every sum is exact):

* AUC: in the model's score order, ``cum = cumsum(W * (1 - y))`` gives the weight of negatives
  ranked below each positive; ``AUC_b = sum_pos W (below + tied / 2) / (W+ W-)``. No per-resample
  sort, O(n) per resample.
* ratios of linear forms (logloss, predicted/observed ratio, IPS, SNIPS, DR): ``(W a) / (W c)``.
* ECE: ``sum_bins |W D| / sum W`` with ``D`` the sparse ``[n, bins]`` matrix of ``p - y``.
* grouped metrics: ``(Wg (w v)) / (Wg w)`` over valid groups.

Confidence interval of a difference: the 2.5 and 97.5 percentiles of ``d_b``. Two-sided p-value:
``min(1, 2 min((#{d_b <= 0} + 1) / (B + 1), (#{d_b >= 0} + 1) / (B + 1)))``. Verdict at 95%:
better / worse when the interval excludes 0 (by the metric's direction), else no significant
difference.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from ranking.metrics import GroupValues, ScoreOrder, bin_index, row_logloss

Kernel = Callable[[np.ndarray, np.ndarray | None], Any]

# Direction of each metric: +1 higher is better, -1 lower is better, 0 neither.
DIRECTION = {
    "auc": 1,
    "gauc": 1,
    "logloss": -1,
    "ece": -1,
    "calibration_ratio": 0,
    "mean_score": 0,
    "ips": 1,
    "snips": 1,
    "dm": 1,
    "dr": 1,
}


def direction(metric: str) -> int:
    if metric.startswith(("ndcg@", "recall@")):
        return 1
    return DIRECTION.get(metric, 0)


class Resampler:
    """Draws paired multinomial resamples in chunks of ``[c, n]`` counts.

    Args:
      n_rows: rows in the logs.
      n_resamples: B.
      seed: the resamples are a pure function of (seed, n_rows, n_groups, unit).
      gidx: ``[n]`` dense group index (or None when the logs have no group field).
      unit: ``rows`` or ``groups`` (rows inherit their group's count).
      chunk_elements: about how many counts one chunk holds (memory: 8 bytes each, a few copies).
    """

    def __init__(
        self,
        n_rows: int,
        n_resamples: int,
        seed: int,
        gidx: np.ndarray | None = None,
        n_groups: int = 0,
        unit: str = "rows",
        chunk_elements: int = 1 << 22,
    ) -> None:
        if n_resamples < 1:
            raise ValueError(f"bootstrap resamples must be >= 1, got {n_resamples}")
        if unit not in ("rows", "groups"):
            raise ValueError(f"resampling unit must be 'rows' or 'groups', got {unit!r}")
        if unit == "groups" and gidx is None:
            raise ValueError("resampling by groups needs a group field (--group)")
        self.n_rows, self.n_resamples, self.seed = n_rows, n_resamples, seed
        self.gidx, self.n_groups, self.unit = gidx, n_groups, unit
        width = max(n_rows, n_groups, 1)
        self.chunk = max(1, min(n_resamples, chunk_elements // width))

    @staticmethod
    def _counts(rng: np.random.Generator, c: int, n: int) -> np.ndarray:
        draws = rng.integers(0, n, size=(c, n), dtype=np.int64)
        draws += (np.arange(c, dtype=np.int64) * n)[:, None]
        return np.bincount(draws.ravel(), minlength=c * n).reshape(c, n).astype(np.float64)

    def chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """Yields ``(row counts [c, n], group counts [c, G] or None)`` until B resamples."""
        rng = np.random.default_rng([self.seed, 20260417])
        done = 0
        while done < self.n_resamples:
            c = min(self.chunk, self.n_resamples - done)
            wg = None
            if self.gidx is not None:
                wg = self._counts(rng, c, self.n_groups)
            if self.unit == "groups":
                wr = np.take(wg, self.gidx, axis=1)
            else:
                wr = self._counts(rng, c, self.n_rows)
            done += c
            yield wr, wg


# --------------------------------------------------------------------------------------------
# kernels


class AUCKernel:
    """Weighted AUC of ``scores`` on ``rows`` (default all) for each resample; NaN if one class
    has zero weight in it (``ranking.metrics.ScoreOrder.auc``)."""

    def __init__(self, labels: np.ndarray, scores: np.ndarray, rows: np.ndarray | None = None):
        self.order = ScoreOrder.of(labels, scores, rows)
        self.take = self.order.take

    def __call__(self, wr: np.ndarray, wg: np.ndarray | None = None) -> np.ndarray:
        w = np.take(wr, self.take, axis=1)  # much faster than wr[:, take]
        return self.order.auc(w, overwrite=True)


class RatioKernel:
    """``(W a) / (W c)`` on ``rows`` (``c`` defaults to ones: a weighted mean of ``a``)."""

    def __init__(self, a: np.ndarray, c: np.ndarray | None = None, rows: np.ndarray | None = None):
        self.rows = rows
        sel = slice(None) if rows is None else rows
        self.a = np.asarray(a, dtype=np.float64)[sel]
        self.c = None if c is None else np.asarray(c, dtype=np.float64)[sel]

    def __call__(self, wr: np.ndarray, wg: np.ndarray | None = None) -> np.ndarray:
        w = wr if self.rows is None else np.take(wr, self.rows, axis=1)
        den = w.sum(axis=1) if self.c is None else w @ self.c
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den != 0, (w @ self.a) / np.where(den != 0, den, 1.0), np.nan)


class ECEKernel:
    """Expected calibration error with equal-width bins for each resample."""

    def __init__(
        self, labels: np.ndarray, scores: np.ndarray, bins: int, rows: np.ndarray | None = None
    ):
        self.rows = rows
        sel = slice(None) if rows is None else rows
        y = np.asarray(labels, dtype=np.float64)[sel]
        p = np.asarray(scores, dtype=np.float64)[sel]
        m = y.size
        self.mt = sp.csr_matrix((p - y, (bin_index(p, bins), np.arange(m))), shape=(bins, m))

    def __call__(self, wr: np.ndarray, wg: np.ndarray | None = None) -> np.ndarray:
        w = wr if self.rows is None else np.take(wr, self.rows, axis=1)
        d = np.asarray(self.mt @ w.T)  # [bins, c]
        tot = w.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(tot > 0, np.abs(d).sum(axis=0) / np.where(tot > 0, tot, 1.0), np.nan)


class GroupKernel:
    """Weighted mean of per-group (or per (group, slice) cell) values under group counts."""

    def __init__(self, gv: GroupValues, cell_group: np.ndarray | None = None):
        w = gv.weights * gv.valid
        self.num = w * np.where(gv.valid, gv.values, 0.0)
        self.den = w
        self.cell_group = cell_group

    def __call__(self, wr: np.ndarray, wg: np.ndarray | None) -> np.ndarray:
        if wg is None:
            raise ValueError("grouped metrics need group resamples")
        w = wg if self.cell_group is None else np.take(wg, self.cell_group, axis=1)
        den = w @ self.den
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, (w @ self.num) / np.where(den > 0, den, 1.0), np.nan)


class RowKernel:
    """Every row-level metric of one model on ``rows`` from one gather per resample.

    In the model's score order the equal-width calibration bins are contiguous runs, so after
    gathering the counts into that order once: AUC from the cumulative negative counts, ECE
    from ``reduceat`` over the bin runs, logloss / calibration ratio / mean score from
    matrix-vector products. Returns ``{metric: [c]}`` with the keys of ``row_kernels``.
    """

    def __init__(
        self,
        labels: np.ndarray,
        scores: np.ndarray,
        bins: int,
        rows: np.ndarray | None = None,
        auc: bool = True,
    ):
        self.auc = AUCKernel(labels, scores, rows)
        take = self.auc.take
        y = np.asarray(labels, dtype=np.float64)[take]
        p = np.asarray(scores, dtype=np.float64)[take]
        self.with_auc = auc
        self.ll = row_logloss(y, p)
        self.y, self.p, self.d = y, p, p - y
        b = bin_index(p, bins)
        self.starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]]) if b.size else np.zeros(0, int)

    def __call__(self, wr: np.ndarray, wg: np.ndarray | None = None) -> dict[str, np.ndarray]:
        a = self.auc
        w = np.take(wr, a.take, axis=1)
        tot = w.sum(axis=1)
        py = w @ np.stack([self.ll, self.p, self.y], axis=1)  # [c, 3]
        per_bin = np.add.reduceat(w * self.d, self.starts, axis=1)
        out = {}
        with np.errstate(invalid="ignore", divide="ignore"):
            ok = tot > 0
            safe = np.where(ok, tot, 1.0)
            out["logloss"] = np.where(ok, py[:, 0] / safe, np.nan)
            out["mean_score"] = np.where(ok, py[:, 1] / safe, np.nan)
            out["calibration_ratio"] = np.where(py[:, 2] != 0, py[:, 1] / py[:, 2], np.nan)
            out["ece"] = np.where(ok, np.abs(per_bin).sum(axis=1) / safe, np.nan)
            if self.with_auc:
                out["auc"] = a.order.auc(w, overwrite=True)
        return out


def row_kernels(
    labels: np.ndarray, scores: np.ndarray, bins: int, rows: np.ndarray | None = None
) -> dict[str, Kernel]:
    """The row-level metrics' kernels: auc, logloss, ece, calibration_ratio, mean_score."""
    return {
        "auc": AUCKernel(labels, scores, rows),
        "logloss": RatioKernel(row_logloss(labels, scores), rows=rows),
        "ece": ECEKernel(labels, scores, bins, rows),
        "calibration_ratio": RatioKernel(scores, labels, rows=rows),
        "mean_score": RatioKernel(scores, rows=rows),
    }


def run(
    kernels: dict[Any, Kernel], resampler: Resampler, workers: int | None = None
) -> dict[Any, Any]:
    """``{key: [B] values}`` (or ``{key: {metric: [B]}}`` for kernels returning dicts): every
    kernel evaluated on the same resamples.

    Kernels run on ``workers`` threads (default: the CPU count, at most 8; numpy releases the
    GIL in the heavy loops), and the next chunk of counts is drawn while they run. The values do
    not depend on ``workers``.
    """
    workers = workers or min(os.cpu_count() or 1, 8)
    out: dict[Any, list[Any]] = {k: [] for k in kernels}
    if workers <= 1:
        for wr, wg in resampler.chunks():
            for k, fn in kernels.items():
                out[k].append(fn(wr, wg))
        return {k: _concat(v) for k, v in out.items()}
    chunks = resampler.chunks()
    with ThreadPoolExecutor(workers) as pool:
        nxt = pool.submit(next, chunks, None)
        while True:
            item = nxt.result()
            if item is None:
                break
            wr, wg = item
            nxt = pool.submit(next, chunks, None)
            futures = {k: pool.submit(fn, wr, wg) for k, fn in kernels.items()}
            for k, f in futures.items():
                out[k].append(f.result())
    return {k: _concat(v) for k, v in out.items()}


def _concat(parts: list[Any]) -> Any:
    if parts and isinstance(parts[0], dict):
        return {sub: np.concatenate([p[sub] for p in parts]) for sub in parts[0]}
    return np.concatenate(parts)


# --------------------------------------------------------------------------------------------
# intervals, p-values and verdicts


@dataclass(frozen=True)
class Difference:
    control: float
    treatment: float
    delta: float
    ci_low: float
    ci_high: float
    p_value: float
    verdict: str  # better | worse | higher | lower | no significant difference | undefined
    resamples: int  # resamples where both values were defined

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    v = values[np.isfinite(values)]
    if v.size == 0:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    lo, hi = np.percentile(v, [100 * a, 100 * (1 - a)])
    return float(lo), float(hi)


def p_value(diffs: np.ndarray) -> float:
    """Two-sided bootstrap p-value of ``delta = 0`` (percentile-interval inversion)."""
    d = diffs[np.isfinite(diffs)]
    if d.size == 0:
        return float("nan")
    b = d.size
    le = (np.count_nonzero(d <= 0) + 1) / (b + 1)
    ge = (np.count_nonzero(d >= 0) + 1) / (b + 1)
    return float(min(1.0, 2 * min(le, ge)))


def difference(
    metric: str,
    control: float,
    treatment: float,
    boot_control: np.ndarray,
    boot_treatment: np.ndarray,
    level: float = 0.95,
) -> Difference:
    """The paired comparison of one metric: treatment - control, CI, p-value and verdict."""
    d = boot_treatment - boot_control
    ok = np.isfinite(d)
    lo, hi = interval(d, level)
    delta = treatment - control
    if not np.isfinite(delta) or not ok.any():
        verdict = "undefined"
    elif lo > 0 or hi < 0:
        up = lo > 0
        sign = direction(metric)
        if sign == 0:
            verdict = "higher" if up else "lower"
        else:
            verdict = "better" if up == (sign > 0) else "worse"
    else:
        verdict = "no significant difference"
    return Difference(
        control=float(control),
        treatment=float(treatment),
        delta=float(delta),
        ci_low=lo,
        ci_high=hi,
        p_value=p_value(d),
        verdict=verdict,
        resamples=int(ok.sum()),
    )
