"""Distribution shift between a reference (training) and a current (served) sample: PSI,
Jensen-Shannon divergence and the binning both are computed over.

Both measures compare two histograms over the same bins, given as counts or proportions
``[bins]`` (each normalized to sum 1 first):

* Population Stability Index, with ``t`` the reference and ``s`` the current proportions::

      PSI = sum_i (s_i - t_i) * ln(s_i / t_i)

  An empty bin would make the log infinite, so proportions below ``epsilon`` (default
  ``PSI_EPSILON = 1e-4``) are raised to ``epsilon`` before the sum (without renormalizing).
  Rule of thumb (Siddiqi, *Credit Risk Scorecards*, 2006): < 0.1 stable, 0.1-0.2 worth
  watching, > 0.2 a significant shift. PSI is the symmetric KL divergence
  ``KL(s||t) + KL(t||s)`` (natural log).
* Jensen-Shannon divergence in bits (Lin, *Divergence measures based on the Shannon entropy*,
  1991), with ``m = (t + s) / 2``::

      JS = KL(t||m) / 2 + KL(s||m) / 2,   KL(p||q) = sum_i p_i * log2(p_i / q_i)

  Terms with ``p_i = 0`` are 0, so no epsilon is needed; 0 for equal histograms, 1 for
  histograms with no bin in common.

Numeric values are binned by boundaries ``b_1 < ... < b_k`` into ``k + 1`` bins, bin ``j``
holding ``b_j <= x < b_{j+1}`` (``b_0 = -inf``, ``b_{k+1} = +inf``): ``np.searchsorted(b, x,
side="right")``, as ``features.stats`` boundaries bucketize.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: The proportion an empty PSI bin is raised to (0.01%).
PSI_EPSILON = 1e-4
#: PSI above this is a significant shift (the common rule of thumb).
PSI_FLAG = 0.2
#: PSI above this (and not above ``PSI_FLAG``) is worth watching.
PSI_WATCH = 0.1


def proportions(counts: Sequence[float] | np.ndarray) -> np.ndarray:
    """``counts / sum(counts)`` as float64 ``[bins]``; all zeros stay zeros.

    >>> proportions([1, 3]).tolist()
    [0.25, 0.75]

    Raises ValueError for a negative or non-finite count or an empty list.
    """
    c = np.asarray(counts, dtype=np.float64).reshape(-1)
    if c.size == 0:
        raise ValueError("expected at least one bin, got none")
    if not np.all(np.isfinite(c)) or np.any(c < 0):
        raise ValueError(f"counts must be finite and >= 0, got {c.tolist()}")
    total = c.sum()
    return c / total if total > 0 else c


def _pair(reference: Sequence[float], current: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    t, s = proportions(reference), proportions(current)
    if t.shape != s.shape:
        raise ValueError(f"histograms differ in bins: {t.size} reference, {s.size} current")
    return t, s


def psi(
    reference: Sequence[float] | np.ndarray,
    current: Sequence[float] | np.ndarray,
    epsilon: float = PSI_EPSILON,
) -> float:
    """Population Stability Index of ``current`` against ``reference`` (counts or proportions
    over the same bins), proportions raised to at least ``epsilon``.

    Example: reference ``[0.5, 0.5]``, current ``[0.25, 0.75]``:
    ``(0.25 - 0.5) ln(0.5) + (0.75 - 0.5) ln(1.5) = 0.1733 + 0.1014 = 0.2747``.

    >>> round(psi([0.5, 0.5], [0.25, 0.75]), 4)
    0.2747
    """
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    t, s = _pair(reference, current)
    t, s = np.maximum(t, epsilon), np.maximum(s, epsilon)
    return float(np.sum((s - t) * np.log(s / t)))


def _kl2(p: np.ndarray, q: np.ndarray) -> float:
    """``sum p_i log2(p_i / q_i)`` over ``p_i > 0`` (``q_i > 0`` there for ``q`` a mixture)."""
    nz = p > 0
    return float(np.sum(p[nz] * np.log2(p[nz] / q[nz])))


def js_divergence(
    reference: Sequence[float] | np.ndarray, current: Sequence[float] | np.ndarray
) -> float:
    """Jensen-Shannon divergence (base 2, in [0, 1]) of two histograms over the same bins.

    Example: ``[1, 0]`` against ``[0.5, 0.5]``: ``m = [0.75, 0.25]``,
    ``KL(t||m) = log2(4/3) = 0.4150``, ``KL(s||m) = 0.5 log2(2/3) + 0.5 log2(2) = 0.2075``,
    JS = (0.4150 + 0.2075) / 2 = 0.3113.

    >>> round(js_divergence([1, 0], [0.5, 0.5]), 4)
    0.3113
    """
    t, s = _pair(reference, current)
    if t.sum() == 0 or s.sum() == 0:
        return 0.0
    m = (t + s) / 2
    return min(max((_kl2(t, m) + _kl2(s, m)) / 2, 0.0), 1.0)


def bin_numeric(values: np.ndarray, boundaries: Sequence[float]) -> np.ndarray:
    """Counts ``[len(boundaries) + 1]`` of ``values`` in the bins the sorted ``boundaries`` cut
    (bin j: ``b_j <= x < b_{j+1}``); NaNs are left out.

    >>> bin_numeric(np.array([0.0, 1.0, 1.5, 5.0]), [1.0, 2.0]).tolist()
    [1, 2, 1]
    """
    b = np.asarray(boundaries, dtype=np.float64)
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    x = x[~np.isnan(x)]
    idx = np.searchsorted(b, x, side="right")
    return np.bincount(idx, minlength=b.size + 1).astype(np.int64)


def quantile_boundaries(values: np.ndarray, bins: int = 10) -> list[float]:
    """The distinct inner quantiles ``q_{1/bins}, ..., q_{(bins-1)/bins}`` of ``values`` (NaNs
    left out): the boundaries of ``bins`` equal-mass bins (fewer where values tie).

    >>> quantile_boundaries(np.arange(1.0, 101.0), 4)
    [25.75, 50.5, 75.25]
    """
    if bins < 2:
        raise ValueError(f"bins must be >= 2, got {bins}")
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return []
    qs = np.linspace(0.0, 1.0, bins + 1)[1:-1]
    return [float(v) for v in np.unique(np.quantile(x, qs))]


def mean_std(values: np.ndarray) -> tuple[float, float]:
    """Mean and (population) standard deviation of ``values`` without NaNs; (nan, nan) when
    there are none."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return float("nan"), float("nan")
    return float(x.mean()), float(x.std())


def status(value: float, flag: float = PSI_FLAG, watch: float = PSI_WATCH) -> str:
    """``"flagged"`` above ``flag``, ``"watch"`` above ``watch``, else ``"ok"``.

    >>> [status(v) for v in (0.05, 0.15, 0.3)]
    ['ok', 'watch', 'flagged']
    """
    if value > flag:
        return "flagged"
    if value > watch:
        return "watch"
    return "ok"
