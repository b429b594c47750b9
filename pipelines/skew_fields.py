"""The skew of one field or of the score: training (reference) and served histograms over the
same bins, their PSI and Jensen-Shannon divergence (``features.drift``), and the flag.

* Categorical, multi-categorical and sequence fields with their own vocabulary: the bins are
  the ``max_bins`` most frequent training values, ``(other)`` (the rest of the vocabulary) and
  ``(oov)`` (values outside the vocabulary, including those under ``min_count``). Training
  counts come from the run's vocabulary counts and OOV count; served values (a multi-valued
  cell split by the field's ``separator``, empty parts dropped) are mapped through the same
  vocabulary. Also the OOV rate (share of values in ``(oov)``) of both and its change.
* Numeric fields, on the value after the field's ``transform`` (as the statistics are): the bins
  and the training histogram of ``NumericReference``; also the mean and standard deviation of
  both and the mean's shift in training standard deviations.
* The score: ``SCORE_BINS`` equal-width bins over [0, 1] of an output against the same output
  of reference logs.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features import drift
from features.schema import FeatureKind, FeatureSpec
from features.stats import FieldStats, transform_numeric
from pipelines.errors import UsageError

#: Equal-mass bins of a numeric field whose statistics have no quantile boundaries.
NUMERIC_BINS = 10
#: Equal-width bins of the score over [0, 1].
SCORE_BINS = 10
OTHER = "(other)"
OOV = "(oov)"


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """A field is flagged when its PSI is above ``psi`` or (categorical) its OOV rate grows by
    more than ``oov`` (absolute, 0.05 = five points); ``watch`` when its PSI is above
    ``watch_psi``. ``epsilon``: the proportion an empty PSI bin is raised to."""

    psi: float = drift.PSI_FLAG
    watch_psi: float = drift.PSI_WATCH
    oov: float = 0.05
    epsilon: float = drift.PSI_EPSILON


@dataclasses.dataclass(frozen=True)
class NumericReference:
    """The bins of a numeric field and its training histogram over them.

    ``how``: ``training_shards`` (the training shards' values binned by the statistics'
    quantile boundaries, or by their own deciles when the statistics have none),
    ``stats_quantiles`` (no shards: the statistics' boundaries, equal mass per bin assumed) or
    ``normal`` (neither: the deciles of a normal distribution with the statistics' mean and std,
    mass 0.1 each)."""

    boundaries: list[float]
    train: np.ndarray
    how: str


def numeric_reference(fs: FieldStats, train_values: np.ndarray | None) -> NumericReference:
    """The bins and training histogram of a numeric field (see ``NumericReference``);
    ``train_values``: its transformed training values when the run's shards were read."""
    if train_values is not None and train_values.size:
        b = list(fs.boundaries) or drift.quantile_boundaries(train_values, NUMERIC_BINS)
        return NumericReference(b, drift.bin_numeric(train_values, b), "training_shards")
    if fs.boundaries:
        b = list(fs.boundaries)
        return NumericReference(b, np.full(len(b) + 1, 1.0 / (len(b) + 1)), "stats_quantiles")
    normal = statistics.NormalDist(fs.mean, fs.std if fs.std > 0 else 1.0)
    b = sorted({normal.inv_cdf(q / NUMERIC_BINS) for q in range(1, NUMERIC_BINS)})
    return NumericReference(b, np.full(len(b) + 1, 1.0 / (len(b) + 1)), "normal")


def _compare(train: np.ndarray, served: np.ndarray, th: Thresholds) -> dict[str, Any]:
    t, s = drift.proportions(train), drift.proportions(served)
    return {
        "psi": drift.psi(t, s, th.epsilon),
        "js": drift.js_divergence(t, s),
        "train": [float(v) for v in t],
        "served": [float(v) for v in s],
    }


def _verdict(out: dict[str, Any], th: Thresholds) -> dict[str, Any]:
    reasons = []
    if out["psi"] > th.psi:
        reasons.append(f"PSI {out['psi']:.3f} > {th.psi:g}")
    change = out.get("oov_change")
    if change is not None and change > th.oov:
        reasons.append(f"OOV rate +{change:.3f} > {th.oov:g}")
    out["flagged"] = bool(reasons)
    out["reasons"] = reasons
    out["status"] = "flagged" if reasons else drift.status(out["psi"], th.psi, th.watch_psi)
    return out


def served_strings(column: pa.ChunkedArray, spec: FeatureSpec) -> tuple[pa.Array, int]:
    """The served values of a vocabulary field as strings (multi-valued cells split) and the
    number of missing cells (null, or empty for a multi-valued field)."""
    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):  # values of a row
        col = pc.binary_join(pc.cast(col, pa.list_(pa.string())), spec.separator)
    if col.type != pa.string():
        try:
            col = pc.cast(col, pa.string())
        except pa.ArrowInvalid:  # bytes that are not UTF-8: decoded with replacement characters
            text = [None if v is None else v.decode("utf-8", "replace") for v in col.to_pylist()]
            col = pa.array(text, pa.string())
    missing = col.null_count
    values = col.drop_null()
    if spec.kind in (FeatureKind.MULTI_CATEGORICAL, FeatureKind.SEQUENCE):
        empty = pc.equal(values, "")
        missing += pc.sum(empty).as_py() or 0
        flat = pc.list_flatten(pc.split_pattern(values.filter(pc.invert(empty)), spec.separator))
        values = flat.filter(pc.not_equal(flat, ""))
    return values, missing


def categorical_skew(
    spec: FeatureSpec, fs: FieldStats, column: pa.ChunkedArray, th: Thresholds, max_bins: int
) -> dict[str, Any]:
    """The skew of a vocabulary field (module docstring); ``fs`` has its vocabulary."""
    vocab, counts = list(fs.vocab), np.asarray(fs.vocab_counts, dtype=np.float64)
    top = min(len(vocab), max_bins)
    train = np.concatenate([counts[:top], [counts[top:].sum(), fs.oov_count]])
    values, missing = served_strings(column, spec)
    idx = pc.index_in(values, value_set=pa.array(vocab, pa.string()))
    known = idx.drop_null().to_numpy(zero_copy_only=False)
    served = np.bincount(np.minimum(known, top), minlength=top + 1).astype(np.float64)
    served = np.concatenate([served, [idx.null_count]])
    labels = [*vocab[:top], OTHER, OOV]
    if top == len(vocab):  # no "(other)": every vocabulary value has its own bin
        train, served, labels = np.delete(train, top), np.delete(served, top), [*labels[:top], OOV]
    out = {"kind": spec.kind.value, "bins": labels} | _compare(train, served, th)
    oov_train = fs.oov_count / fs.count if fs.count else 0.0
    oov_served = idx.null_count / len(values) if len(values) else 0.0
    out |= {
        "oov_rate_train": oov_train,
        "oov_rate_served": oov_served,
        "oov_change": oov_served - oov_train,
        "values_served": len(values),
        "missing_served": int(missing),
        "vocab_size": len(vocab),
    }
    return _verdict(out, th)


def served_numbers(column: pa.ChunkedArray, spec: FeatureSpec) -> np.ndarray:
    """The served values of a numeric field after its ``transform``, nulls as NaN.

    Raises UsageError when the column does not hold numbers."""
    try:
        col = pc.cast(column, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise UsageError(
            f"--data: logged feature {spec.name!r} holds {column.type}; expected numbers for "
            f"the numeric field {spec.name!r} of the run's schema"
        ) from None
    x = pc.fill_null(col, np.nan).to_numpy()
    return transform_numeric(np.asarray(x, dtype=np.float64), spec)


def numeric_skew(
    spec: FeatureSpec,
    fs: FieldStats,
    column: pa.ChunkedArray,
    reference: NumericReference,
    th: Thresholds,
) -> dict[str, Any]:
    """The skew of a numeric field (module docstring) over ``reference``'s bins."""
    x = served_numbers(column, spec)
    served = drift.bin_numeric(x, reference.boundaries)
    mean, std = drift.mean_std(x)
    out = {
        "kind": spec.kind.value,
        "bins": _interval_labels(reference.boundaries),
        "boundaries": list(reference.boundaries),
        "reference": reference.how,
    } | _compare(reference.train, served, th)
    train_std = fs.std if fs.std > 0 else 1.0
    out |= {
        "mean_train": fs.mean,
        "mean_served": mean,
        "std_train": fs.std,
        "std_served": std,
        "mean_shift_std": (mean - fs.mean) / train_std if np.isfinite(mean) else None,
        "values_served": int(np.count_nonzero(~np.isnan(x))),
        "missing_served": int(np.count_nonzero(np.isnan(x))),
    }
    return _verdict(out, th)


def _interval_labels(boundaries: Sequence[float]) -> list[str]:
    """``["< b1", "[b1, b2)", ..., ">= bk"]``; one bin ``"all"`` without boundaries."""
    if not boundaries:
        return ["all"]
    b = [f"{v:.4g}" for v in boundaries]
    return [f"< {b[0]}", *(f"[{lo}, {hi})" for lo, hi in itertools.pairwise(b)), f">= {b[-1]}"]


def score_values(column: pa.ChunkedArray) -> np.ndarray:
    """The scores of an output column: its values, or the first value of a list column (the
    primary task of a multi-task model)."""
    col = column.combine_chunks()
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        col = pc.list_element(col, 0)
    return np.asarray(pc.fill_null(pc.cast(col, pa.float64()), np.nan), dtype=np.float64)


def score_skew(served: np.ndarray, reference: np.ndarray | None, th: Thresholds) -> dict[str, Any]:
    """The score's histogram over ``SCORE_BINS`` equal-width bins of [0, 1] and its mean, and
    against ``reference`` scores (when given) PSI, JS, the mean shift and the flag."""
    b = [i / SCORE_BINS for i in range(1, SCORE_BINS)]
    s = drift.bin_numeric(served, b)
    mean, _ = drift.mean_std(served)
    out: dict[str, Any] = {
        "bins": _interval_labels(b),
        "boundaries": b,
        "mean_served": mean,
        "rows_served": int(s.sum()),
    }
    if reference is None:
        return out | {"served": [float(v) for v in drift.proportions(s)], "flagged": False}
    r = drift.bin_numeric(reference, b)
    ref_mean, _ = drift.mean_std(reference)
    out |= _compare(r, s, th) | {
        "mean_reference": ref_mean,
        "mean_shift": mean - ref_mean,
        "rows_reference": int(r.sum()),
    }
    out["reference"] = out.pop("train")  # the reference logs' histogram
    return _verdict(out, th)
