"""ranking.metrics: AUC and logloss against scikit-learn and by hand, grouped metrics (GAUC,
NDCG@k, recall@k) and calibration against plain-loop references, bad-input messages, and the
one-class policy (scalar metrics raise OneClassError; per-group and batched forms skip or NaN)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from ranking import metrics as M


@pytest.mark.parametrize("seed", range(5))
def test_auc_and_logloss_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 5000).astype(float)
    p = np.clip(rng.beta(2, 3, 5000) + 0.1 * y, 0, 1)
    p[:500] = np.round(p[:500], 1)  # ties
    assert M.auc(y, p) == pytest.approx(roc_auc_score(y, p), abs=1e-9)
    assert M.logloss(y, p) == pytest.approx(log_loss(y, np.clip(p, 1e-7, 1 - 1e-7)), abs=1e-9)


def test_auc_by_hand():
    # positives 0.8, 0.4; negatives 0.4, 0.1: pairs (0.8>0.4) (0.8>0.1) (0.4=0.4 -> 1/2) (0.4>0.1)
    assert M.auc([1, 1, 0, 0], [0.8, 0.4, 0.4, 0.1]) == pytest.approx(3.5 / 4)


@pytest.mark.parametrize(
    ("y", "p", "match"),
    [
        ([1, 1], [0.2, 0.3], "both classes"),
        ([1, 2], [0.2, 0.3], "0 or 1"),
        ([1, 0], [0.2], "rows"),
        ([1, 0], [np.nan, 0.3], "non-finite"),
        ([], [], "empty"),
    ],
)
def test_auc_errors(y, p, match):
    with pytest.raises(ValueError, match=match):
        M.auc(y, p)


def test_logloss_rejects_out_of_range_probabilities():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        M.logloss([1, 0], [1.2, 0.3])


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


# --------------------------------------------------------------------------------------------
# the one-class policy


@pytest.mark.parametrize(("y", "w"), [([1, 1, 1], None), ([0, 0, 0], None), ([1, 0, 1], [1, 0, 1])])
def test_auc_of_one_class_raises_one_class_error(y, w):
    with pytest.raises(M.OneClassError, match="AUC needs both classes") as err:
        M.auc(y, [0.2, 0.5, 0.7], w)
    assert isinstance(err.value, M.MetricInputError) and isinstance(err.value, ValueError)
    if w is not None:
        assert "weighing 2 and 0" in str(err.value)


def test_one_class_error_names_the_counts():
    with pytest.raises(M.OneClassError, match="got 0 positives and 3 negatives"):
        M.auc([0, 0, 0], [0.1, 0.2, 0.3])


def test_both_classes():
    assert M.both_classes([0, 1, 0])
    assert not M.both_classes([1, 1])
    assert not M.both_classes([0, 0])
    assert not M.both_classes([])


def test_gauc_skips_one_class_groups_and_raises_when_none_is_left():
    # group a: both classes (AUC 1); b: only clicks; c: only non-clicks -> only a is scored
    g = np.array(["a", "a", "b", "b", "c"])
    y = np.array([1, 0, 1, 1, 0])
    s = np.array([0.9, 0.1, 0.2, 0.3, 0.8])
    assert M.gauc(g, y, s) == pytest.approx(1.0)
    gidx, n_groups = M.group_index(g)
    gv = M.per_group_auc(gidx, n_groups, y, s)
    assert gv.valid.tolist() == [True, False, False]
    with pytest.raises(M.OneClassError, match="GAUC needs a group with both classes"):
        M.gauc(g[2:], y[2:], s[2:])
    assert math.isnan(M.per_group_auc(gidx[2:] - 1, 2, y[2:], s[2:]).mean())


def test_topk_metrics_without_clicks_raise():
    g, y, s = np.array([0, 0, 1]), np.zeros(3), np.array([0.1, 0.2, 0.3])
    with pytest.raises(M.OneClassError, match="ndcg@2 needs a group with a click"):
        M.ndcg_at_k(g, y, s, 2)
    with pytest.raises(M.OneClassError, match="recall@2 needs a group with a click"):
        M.recall_at_k(g, y, s, 2)


def test_batched_auc_is_nan_for_one_class_weight_rows_only():
    y = np.array([1, 0, 1, 0])
    s = np.array([0.8, 0.4, 0.4, 0.1])
    order = M.ScoreOrder.of(y, s)
    w = np.array([[1, 1, 1, 1], [1, 0, 1, 0], [2, 1, 0, 3]], dtype=float)  # row 1: no negatives
    got = order.auc(w[:, order.take])
    assert got[0] == pytest.approx(M.auc(y, s))
    assert math.isnan(got[1])
    assert got[2] == pytest.approx(M.auc(y, s, w[2]))
    assert got[2] == pytest.approx(roc_auc_score(y, s, sample_weight=w[2]))


def test_logloss_and_calibration_are_defined_for_one_class():
    y, p = np.ones(4), np.array([0.9, 0.8, 0.6, 0.99])
    assert M.logloss(y, p) == pytest.approx(-np.log(p).mean())
    assert M.calibration(np.zeros(4), p).ratio == float("inf")


def test_grouped_auc_by_hand_with_ties():
    # group 0: clicks 0.5, 0.2; non-clicks 0.5, 0.1 -> (1/2 + 1 + 0 + 1) / 4; group 1: 1 / 1
    g = np.array([0, 0, 0, 0, 1, 1])
    y = np.array([1, 1, 0, 0, 1, 0])
    s = np.array([0.5, 0.2, 0.5, 0.1, 0.3, 0.2])
    gv = M.per_group_auc(g, 2, y, s)
    assert gv.values.tolist() == [pytest.approx(2.5 / 4), pytest.approx(1.0)]
    assert gv.weights.tolist() == [4.0, 2.0]
    assert M.gauc(g, y, s) == pytest.approx((4 * 2.5 / 4 + 2 * 1.0) / 6)
