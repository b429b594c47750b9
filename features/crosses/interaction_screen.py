"""An exhaustive screen for pure field interactions: a weighted ANOVA test per field set.

FIVES (``features.crosses.fives_search``) builds an order-k cross on an active order-(k-1)
edge, so it assumes heredity: a useful triple has a useful sub-pair. A *pure* triple, whose sub-pairs and fields
carry no signal on their own, gives that search nothing to start from (docs/fives.md). This
module tests every field set of a given order directly, by counting, and so finds pure
interactions whatever their sub-crosses do.

For a field set ``S = (a, b, c)`` over encoded rows (each field capped to its ``L - 1`` most
frequent values plus one shared "other" value), with ``n`` rows, centred labels ``y - mean(y)``
and label variance ``s2``:

1. cell counts ``w[i, j, k]`` and label means ``m[i, j, k]`` (two ``bincount`` calls);
2. the pure interaction: ``r = m`` centred along every axis in turn by its ``w``-weighted mean
   (the weighted ANOVA projection; with independent fields it removes every main effect and
   every lower-order interaction, including sub-pair effects);
3. ``SS = sum(w * r^2)``. With no interaction of this order, ``SS / s2`` is approximately
   chi-square with ``df = prod(L_f - 1)`` degrees of freedom (``L_f``: values of field ``f``
   seen in the rows), so

       z = (SS / s2 - df) / sqrt(2 df)          (the test; N(0, 1) under no interaction)
       effect = (SS / s2 - df) / n              (the bias-corrected share of label variance
                                                 the pure interaction explains, eta^2)

A field set is significant when ``z`` exceeds the normal quantile of ``alpha / tests``
(Bonferroni over every field set screened). ``effect`` is comparable across orders, so it can
rank pairs and triples in one list. ``held_out_effects`` measures it again, cross-fitted between
the screen's rows and held-out rows (no selection bias, and no ``df`` to get right).

Cost: one pass of two ``bincount`` calls per field set: 9,139 triples of 39 fields over 640k
rows take about 50 s on one core (bench/fives). Tables stay at ``max_cells`` cells, so each
field keeps ``floor(max_cells^(1/order))`` values (16 for triples at the default 4,096).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from features.tasks import TaskRunner, balanced_groups, runner_or_local

Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class ScreenedCross:
    """One field set's test: ``z`` (N(0, 1) without interaction) and ``effect`` (eta^2)."""

    fields: tuple[str, ...]
    z: float
    effect: float
    df: int


@dataclasses.dataclass(frozen=True)
class ValueCaps:
    """Per field, a map from encoded id to capped id (the ``L - 1`` most frequent keep theirs)."""

    maps: tuple[np.ndarray, ...]
    levels: int

    def apply(self, ids: np.ndarray) -> np.ndarray:
        """``ids`` [rows, F] (non-negative ints) -> capped ids [rows, F] in ``[0, levels)``."""
        out = np.empty(ids.shape, np.int64)
        for f, m in enumerate(self.maps):
            col = ids[:, f]
            known = col < m.size
            out[:, f] = np.where(known, m[np.minimum(col, m.size - 1)], self.levels - 1)
        return out


def fit_caps(ids: np.ndarray, levels: int) -> ValueCaps:
    """Keeps each column's ``levels - 1`` most frequent ids; the others share id ``levels - 1``."""
    if levels < 2:
        raise ValueError(f"interaction screen: levels must be >= 2, got {levels}")
    maps = []
    for f in range(ids.shape[1]):
        counts = np.bincount(ids[:, f])
        top = np.argsort(-counts, kind="stable")[: levels - 1]
        top = top[counts[top] > 0]
        m = np.full(counts.size, levels - 1, np.int64)
        m[top] = np.arange(top.size)
        maps.append(m)
    return ValueCaps(tuple(maps), levels)


def levels_for(order: int, max_cells: int) -> int:
    """Values kept per field so that a table of ``order`` fields has at most ``max_cells``."""
    levels = round(max_cells ** (1.0 / order))
    while levels > 2 and levels**order > max_cells:
        levels -= 1
    while (levels + 1) ** order <= max_cells:
        levels += 1
    return max(2, levels)


def pure_residual(counts: np.ndarray, sums: np.ndarray) -> np.ndarray:
    """The top-order interaction part ``r`` of the cell means ``sums / counts`` (same shape).

    The weighted ANOVA projection: centred along every axis in turn by its ``counts``-weighted
    mean. Cells without rows are 0 in the result.
    """
    w = np.asarray(counts, np.float64)
    r = np.divide(sums, w, out=np.zeros_like(w), where=w > 0)
    for ax in range(w.ndim):
        wa = w.sum(axis=ax, keepdims=True)
        mean = np.divide(
            (w * r).sum(axis=ax, keepdims=True), wa, out=np.zeros_like(wa), where=wa > 0
        )
        r = r - mean
    return np.where(w > 0, r, 0.0)


def pure_interaction_ss(counts: np.ndarray, sums: np.ndarray) -> tuple[float, int]:
    """``(SS, df)`` of the top-order interaction of a table of cell ``counts`` and label ``sums``.

    ``counts`` and ``sums`` have the same shape, one axis per field (labels centred). Levels
    without rows are dropped before the projection.
    """
    w = np.asarray(counts, np.float64)
    keep = []
    for ax in range(w.ndim):
        other = tuple(i for i in range(w.ndim) if i != ax)
        keep.append(np.flatnonzero(w.sum(axis=other) > 0))
    df = int(np.prod([max(k.size - 1, 0) for k in keep]))
    if df == 0:
        return 0.0, 0
    w = w[np.ix_(*keep)]
    r = pure_residual(w, np.asarray(sums, np.float64)[np.ix_(*keep)])
    return float(np.sum(w * r * r)), df


def _stats(ss: float, df: int, var: float, n: int) -> tuple[float, float]:
    if df == 0 or var <= 0 or n == 0:
        return 0.0, 0.0
    excess = ss / var - df
    return excess / math.sqrt(2.0 * df), excess / n


def critical_z(alpha: float, tests: int) -> float:
    """The one-sided normal quantile of ``alpha / tests`` (Bonferroni)."""
    from scipy.stats import norm  # here: the screen's counting needs numpy only

    return float(norm.isf(alpha / max(tests, 1)))


def screen(
    ids: np.ndarray,
    y: np.ndarray,
    fields: Sequence[str],
    order: int = 3,
    max_cells: int = 4096,
    log: Log | None = None,
    runner: TaskRunner | None = None,
) -> tuple[list[ScreenedCross], ValueCaps]:
    """Tests every set of ``order`` fields of ``ids`` [rows, F] against labels ``y`` [rows].

    The field sets are tested as tasks on ``runner`` (default: this process), each a run of
    consecutive ``order - 1``-field prefixes with every last field after them; every task reads
    the capped rows, so each set's test is the one a single process computes. Returns the field
    sets sorted by ``z`` (highest first; ties in set order) and the value caps it fitted (to
    measure the same tables on other rows with ``held_out_effects``).
    """
    if ids.ndim != 2 or ids.shape[1] != len(fields):
        raise ValueError(
            f"interaction screen: ids must be [rows, {len(fields)}] for fields {list(fields)}, "
            f"got shape {ids.shape}"
        )
    if len(y) != len(ids):
        raise ValueError(f"interaction screen: {len(y)} labels for {len(ids)} rows")
    if not 2 <= order <= len(fields):
        raise ValueError(
            f"interaction screen: order must be in [2, {len(fields)} fields], got {order}"
        )
    t0 = time.time()
    levels = levels_for(order, max_cells)
    caps = fit_caps(ids, levels)
    x = caps.apply(ids)
    dtype = np.uint8 if levels <= 256 else np.uint16 if levels <= 65536 else np.int64
    rows = _CappedRows(
        np.asfortranarray(x.astype(dtype)),
        np.asarray(y, np.float64) - float(np.mean(y)),
        levels,
        order,
        float(np.var(y)),
        tuple(fields),
    )
    n, F = len(y), len(fields)
    prefixes = list(itertools.combinations(range(F), order - 1))
    ranges = balanced_groups([F - 1 - p[-1] for p in prefixes], _SCREEN_TASKS)
    parts = runner_or_local(runner).map(
        screen_prefixes, ranges, shared=rows, label="interaction screen"
    )
    out = [c for part in parts for c in part]
    out.sort(key=lambda c: -c.z)
    if log is not None:
        log(
            f"interaction screen: {len(out):,} sets of {order} fields over {n:,} rows, "
            f"{levels} values per field ({time.time() - t0:.1f}s)"
        )
    return out, caps


#: tasks the field sets of one screen are cut into (whatever runs them: the sets' tests do
#: not depend on the cut)
_SCREEN_TASKS = 16


@dataclasses.dataclass(frozen=True)
class _CappedRows:
    """What every task of a screen reads: capped ids ``x`` [rows, F] (column-major, the
    smallest integer type), centred labels ``yc``, and the test's constants."""

    x: np.ndarray
    yc: np.ndarray
    levels: int
    order: int
    var: float
    fields: tuple[str, ...]


def screen_prefixes(prefix_range: tuple[int, int], rows: _CappedRows) -> list[ScreenedCross]:
    """The tests of the field sets whose ``order - 1`` first fields are the prefixes
    ``[lo, hi)`` (in ``itertools.combinations`` order). A task function."""
    levels, order, x = rows.levels, rows.order, rows.x
    n, F = x.shape
    cells = levels**order
    shape = (levels,) * order
    prefixes = itertools.islice(itertools.combinations(range(F), order - 1), *prefix_range)
    out: list[ScreenedCross] = []
    for prefix in prefixes:
        code = np.zeros(n, np.int64)
        for f in prefix:
            code = code * levels + x[:, f]
        code = code * levels
        for last in range(prefix[-1] + 1, F):
            key = code + x[:, last]
            counts = np.bincount(key, minlength=cells).reshape(shape)
            sums = np.bincount(key, weights=rows.yc, minlength=cells).reshape(shape)
            ss, df = pure_interaction_ss(counts, sums)
            z, effect = _stats(ss, df, rows.var, n)
            names = tuple(rows.fields[i] for i in (*prefix, last))
            out.append(ScreenedCross(names, z, effect, df))
    return out


def _table(
    x: np.ndarray, yc: np.ndarray, cols: Sequence[int], levels: int
) -> tuple[np.ndarray, np.ndarray]:
    key = np.zeros(len(x), np.int64)
    for c in cols:
        key = key * levels + x[:, c]
    shape = (levels,) * len(cols)
    counts = np.bincount(key, minlength=levels ** len(cols)).reshape(shape).astype(np.float64)
    sums = np.bincount(key, weights=yc, minlength=levels ** len(cols)).reshape(shape)
    return counts, sums


def held_out_effects(
    train: tuple[np.ndarray, np.ndarray],
    held_out: tuple[np.ndarray, np.ndarray],
    fields: Sequence[str],
    field_sets: Sequence[Sequence[str]],
    caps: dict[int, ValueCaps],
) -> list[float]:
    """Each field set's pure-interaction effect on held-out rows, cross-fitted.

    ``train`` and ``held_out`` are ``(ids [rows, F], labels [rows])``; ``caps`` keyed by order.
    With ``r_t`` and ``r_h`` the pure residual tables (``pure_residual``) of the two row sets
    and ``w_h`` the held-out cell counts::

        effect = sum(w_h * r_t * r_h) / (n_h * var(y_h))

    The two sets' noise is independent, so this estimates the same share of variance as the
    screen's ``effect`` with no degrees-of-freedom correction: a pattern that does not recur
    on new rows scores about 0 (or below), whatever the table's sparsity or the fields'
    dependence (where ``df`` would be wrong). Cells empty in either set count 0.
    """
    col = {name: i for i, name in enumerate(fields)}
    (x_t, y_t), (x_h, y_h) = train, held_out
    yc_t = np.asarray(y_t, np.float64) - float(np.mean(y_t))
    yc_h = np.asarray(y_h, np.float64) - float(np.mean(y_h))
    var, n = float(np.var(y_h)), len(y_h)
    capped = {order: (c.apply(x_t), c.apply(x_h)) for order, c in caps.items()}
    out = []
    for fs in field_sets:
        order = len(fs)
        if order not in caps:
            raise ValueError(f"interaction screen: no value caps for order {order} ({list(fs)})")
        cols, levels = [col[f] for f in fs], caps[order].levels
        r_t = pure_residual(*_table(capped[order][0], yc_t, cols, levels))
        w_h, s_h = _table(capped[order][1], yc_h, cols, levels)
        r_h = pure_residual(w_h, s_h)
        out.append(float(np.sum(w_h * r_t * r_h)) / (n * var) if n and var > 0 else 0.0)
    return out
