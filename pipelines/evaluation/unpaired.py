"""Unpaired comparison of two populations: each model scored on its own rows.

A prediction log split by traffic arm holds, for each arm, the scores it gave the requests it
served: two disjoint sets of rows. Their metrics cannot be paired row by row, so the bootstrap
is the two-sample one (Efron & Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 8.3):
each resample draws the control rows ``W_c[b] ~ Multinomial(n_c, 1/n_c)`` and, independently,
the treatment rows ``W_t[b] ~ Multinomial(n_t, 1/n_t)``; the difference
``d_b = metric(treatment, W_t[b]) - metric(control, W_c[b])`` then gives the interval, p-value
and verdict as in the paired case (``bootstrap.difference``). The interval covers the
difference between the two populations, which mixes the models' quality with any difference
between the requests each arm received; replaying both models on the same logged rows (a
SavedModel per side) is the paired comparison of the models themselves.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from pipelines.evaluation import bootstrap
from pipelines.evaluation.compare import MODELS, unbootstrapped
from ranking import metrics

NOTE = (
    "unpaired comparison of two populations: each arm's logged scores on the requests that arm "
    "served (two-sample bootstrap); the difference mixes the models with the requests each arm "
    "received. Replay both models on the same rows for a paired comparison."
)


class TwoSampleResampler(bootstrap.Resampler):
    """Resamples of ``[c, n_control + n_treatment]`` counts: the first ``n_control`` columns a
    multinomial draw of the control rows, the rest an independent one of the treatment rows."""

    def __init__(
        self,
        n_control: int,
        n_treatment: int,
        n_resamples: int,
        seed: int,
        chunk_elements: int = 1 << 22,
    ) -> None:
        super().__init__(n_control + n_treatment, n_resamples, seed, chunk_elements=chunk_elements)
        self.n_control = n_control

    def chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        rng = np.random.default_rng([self.seed, 20260418])
        done = 0
        while done < self.n_resamples:
            c = min(self.chunk, self.n_resamples - done)
            wc = self._counts(rng, c, self.n_control)
            wt = self._counts(rng, c, self.n_rows - self.n_control)
            done += c
            yield np.concatenate([wc, wt], axis=1), None


def _points(y: np.ndarray, s: np.ndarray, bins: int) -> dict[str, Any]:
    cal = metrics.calibration(y, s, bins)
    return {
        "auc": metrics.auc(y, s) if metrics.both_classes(y) else float("nan"),
        "logloss": metrics.logloss(y, s),
        "ece": cal.ece,
        "calibration_ratio": cal.ratio,
        "mean_score": float(s.mean()),
        "_calibration": cal.to_dict(),
    }


def compare_populations(
    labels: dict[str, np.ndarray],
    scores: dict[str, np.ndarray],
    *,
    resamples: int = 1000,
    seed: int = 0,
    bins: int = 10,
    level: float = 0.95,
    workers: int | None = 1,
) -> dict[str, Any]:
    """Row metrics (AUC, logloss, ECE, calibration ratio, mean score) of each model on its own
    rows and their differences with two-sample bootstrap intervals; the result has the keys
    of ``compare.compare_scores`` (no groups or slices) plus ``populations``.

    Args:
      labels, scores: ``{"control": [n_c], "treatment": [n_t]}`` 0/1 clicks and probabilities.
    """
    t0 = time.perf_counter()
    y, s = {}, {}
    for m in MODELS:
        y[m], s[m] = metrics.check_labels_scores(labels[m], scores[m], f"{m} scores")
    points = {m: _points(y[m], s[m], bins) for m in MODELS}
    t_points = time.perf_counter() - t0
    names = ["auc", "logloss", "ece", "calibration_ratio", "mean_score"]
    out: dict[str, Any] = {}
    if resamples:
        n_c, n_t = y["control"].size, y["treatment"].size
        yy = np.concatenate([y["control"], y["treatment"]])
        rows = {"control": np.arange(n_c), "treatment": np.arange(n_c, n_c + n_t)}
        kernels = {}
        for m in MODELS:
            full = np.zeros(n_c + n_t)
            full[rows[m]] = s[m]
            kernels[m] = bootstrap.RowKernel(
                yy, full, bins, rows[m], auc=metrics.both_classes(y[m])
            )
        boot = bootstrap.run(kernels, TwoSampleResampler(n_c, n_t, resamples, seed), workers)
        for name in names:
            c, t = points["control"][name], points["treatment"][name]
            bc, bt = boot["control"][name], boot["treatment"][name]
            d = bootstrap.difference(name, c, t, bc, bt, level)
            out[name] = d.to_dict()
    else:
        for name in names:
            c, t = points["control"][name], points["treatment"][name]
            out[name] = unbootstrapped(c, t)
    return {
        "rows": int(sum(v.size for v in y.values())),
        "positives": int(sum(v.sum() for v in y.values())),
        "populations": {m: {"rows": int(y[m].size), "positives": int(y[m].sum())} for m in MODELS},
        "settings": {
            "resamples": resamples,
            "seed": seed,
            "unit": "rows",
            "pairing": "unpaired",
            "level": level,
            "calibration_bins": bins,
            "k": [],
            "min_slice_rows": 0,
        },
        "comparison": {"pairing": "unpaired", "note": NOTE},
        "overall": {
            "metrics": out,
            "calibration": {m: points[m]["_calibration"] for m in MODELS},
            "reliability": {m: metrics.reliability(y[m], s[m], bins) for m in MODELS},
        },
        "groups": None,
        "slices": {},
        "timing_s": {"points": t_points, "bootstrap": time.perf_counter() - t0 - t_points},
    }
