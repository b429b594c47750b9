"""Point metrics against scikit-learn (AUC, logloss) and plain-loop references (GAUC, NDCG@k,
recall@k, calibration) on random data, plus bad-input messages."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from pipelines.evaluation import metrics as M


def _data(seed: int, n: int = 3000, groups: int = 150):
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    y = (rng.random(n) < 0.2 + 0.1 * (g % 3 == 0)).astype(float)
    s = np.clip(rng.beta(2, 5, n) + 0.15 * y, 0, 1)
    s[: n // 5] = np.round(s[: n // 5], 2)  # ties
    return g, y, s


@pytest.mark.parametrize("seed", range(4))
def test_auc_and_logloss_match_sklearn_weighted_and_unweighted(seed):
    _, y, s = _data(seed)
    w = np.random.default_rng(seed + 100).integers(0, 4, y.size).astype(float)
    assert M.auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-9)
    assert M.auc(y, s, w) == pytest.approx(roc_auc_score(y, s, sample_weight=w), abs=1e-9)
    sc = np.clip(s, M.EPS, 1 - M.EPS)
    assert M.logloss(y, s) == pytest.approx(log_loss(y, sc), abs=1e-9)
    assert M.logloss(y, s, w) == pytest.approx(log_loss(y, sc, sample_weight=w), abs=1e-9)


def _loop_auc(y, s):
    pos = [si for si, yi in zip(s, y, strict=True) if yi == 1]
    neg = [si for si, yi in zip(s, y, strict=True) if yi == 0]
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def _loop_grouped(g, y, s, k):
    """(GAUC, NDCG@k, recall@k) with Python loops: the definitions in the module docstring."""
    num = den = 0.0
    ndcgs, recalls = [], []
    for key in sorted(set(g.tolist())):
        idx = [i for i in range(len(g)) if g[i] == key]
        ys = [y[i] for i in idx]
        ss = [s[i] for i in idx]
        if 0 < sum(ys) < len(ys):
            num += len(idx) * _loop_auc(ys, ss)
            den += len(idx)
        if sum(ys) > 0:
            ranked = sorted(range(len(idx)), key=lambda j: (-ss[j], j))  # ties: row order
            dcg = sum(ys[j] / math.log2(r + 2) for r, j in enumerate(ranked[:k]))
            ideal = sum(1 / math.log2(r + 2) for r in range(min(k, int(sum(ys)))))
            ndcgs.append(dcg / ideal)
            recalls.append(sum(ys[j] for j in ranked[:k]) / sum(ys))
    return num / den, sum(ndcgs) / len(ndcgs), sum(recalls) / len(recalls)


@pytest.mark.parametrize(("seed", "k"), [(0, 5), (1, 10), (2, 1), (3, 3)])
def test_grouped_metrics_match_plain_loops(seed, k):
    g, y, s = _data(seed, n=1200, groups=60)
    gauc, ndcg, recall = _loop_grouped(g, y, s, k)
    assert M.gauc(g, y, s) == pytest.approx(gauc, abs=1e-9)
    assert M.ndcg_at_k(g, y, s, k) == pytest.approx(ndcg, abs=1e-9)
    assert M.recall_at_k(g, y, s, k) == pytest.approx(recall, abs=1e-9)


def test_grouped_metrics_by_hand():
    # user a: scores 0.9 (click) 0.5 (no) 0.1 (click) -> AUC 1/2; NDCG@2 = 1 / (1 + 1/log2 3)
    # user b: one row, no click -> not scored by any of them
    g = np.array(["a", "a", "a", "b"])
    y = np.array([1, 0, 1, 0])
    s = np.array([0.9, 0.5, 0.1, 0.3])
    assert M.gauc(g, y, s) == pytest.approx(0.5)
    assert M.ndcg_at_k(g, y, s, 2) == pytest.approx(1 / (1 + 1 / math.log2(3)))
    assert M.recall_at_k(g, y, s, 2) == pytest.approx(0.5)
    assert M.recall_at_k(g, y, s, 3) == pytest.approx(1.0)


def test_calibration_by_hand():
    y = np.array([0, 0, 1, 1])
    p = np.array([0.05, 0.15, 0.85, 0.95])
    cal = M.calibration(y, p, bins=2)
    # bin [0, .5): mean p 0.1 vs 0 clicks; bin [.5, 1]: mean p 0.9 vs 1 -> ECE = (0.2 + 0.2) / 4
    assert cal.ece == pytest.approx(0.1)
    assert cal.ratio == pytest.approx(2.0 / 2.0)
    assert [b["rows"] for b in cal.bins] == [2, 2]
    assert cal.bins[1]["mean_score"] == pytest.approx(0.9)


@pytest.mark.parametrize("seed", range(3))
def test_calibration_matches_loop(seed):
    _, y, s = _data(seed)
    bins = 10
    ece = 0.0
    for b in range(bins):
        idx = [i for i in range(y.size) if min(int(s[i] * bins), bins - 1) == b]
        if idx:
            ece += abs(sum(s[i] - y[i] for i in idx)) / y.size
    cal = M.calibration(y, s, bins)
    assert cal.ece == pytest.approx(ece, abs=1e-9)
    assert cal.ratio == pytest.approx(s.sum() / y.sum(), abs=1e-9)


@pytest.mark.parametrize(
    ("y", "s", "match"),
    [
        ([0, 1, 2], [0.1, 0.2, 0.3], r"labels must be 0 or 1: 1 rows are not, first at row 2"),
        ([0, 1], [0.1, np.nan], r"1 scores are NaN or infinite, first at row 1"),
        ([0, 1], [0.1, 1.5], r"outside \[0, 1\], first at row 1"),
        ([0, 1, 1], [0.1, 0.2], r"2 scores for 3 labelled rows"),
    ],
)
def test_bad_input_messages(y, s, match):
    with pytest.raises(M.MetricInputError, match=match):
        M.check_labels_scores(y, s, "control scores")
