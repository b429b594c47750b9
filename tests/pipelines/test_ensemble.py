"""Snapshot-ensemble selection (pipelines.run.ensemble) against hand-computed small cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipelines.run import ensemble as E
from ranking.metrics import OneClassError


def _p(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _logloss(labels, logits) -> float:
    """Log loss written out: -mean(y log p + (1 - y) log(1 - p))."""
    pairs = zip(labels, logits, strict=True)
    terms = [y * math.log(_p(x)) + (1 - y) * math.log(1 - _p(x)) for y, x in pairs]
    return -sum(terms) / len(terms)


def test_average_of_logits_and_of_probabilities():
    x = np.array([[1.0, -1.0, 40.0], [3.0, 1.0, -40.0]])
    np.testing.assert_allclose(E.average(x, "logits"), [2.0, 0.0, 0.0])
    mean_p = (_p(1.0) + _p(3.0)) / 2  # 0.8418163527
    want = [math.log(mean_p / (1 - mean_p)), 0.0, 0.0]  # p(-1) + p(1) = 1: the mean is 0.5
    np.testing.assert_allclose(E.average(x, "probabilities"), want, atol=1e-12)
    # probabilities that round to 1 keep a finite logit
    np.testing.assert_allclose(E.average(np.array([[800.0], [800.0]]), "probabilities"), [800.0])
    with pytest.raises(ValueError, match=r"combine = 'median': expected one of"):
        E.average(x, "median")


def test_sigmoid_is_stable():
    np.testing.assert_allclose(E.sigmoid(np.array([0.0, 1.0, -1000.0, 1000.0])), [
        0.5, _p(1.0), 0.0, 1.0
    ])  # fmt: skip


def test_correlation_distance():
    x = np.array(
        [
            [1.0, 2.0, 3.0],
            [2.0, 4.0, 6.0],  # r = 1 with row 0
            [3.0, 2.0, 1.0],  # r = -1
            [1.0, 0.0, 1.0],  # centred (1/3, -2/3, 1/3) . (-1, 0, 1) = 0: r = 0
            [5.0, 5.0, 5.0],  # constant
        ]
    )
    d = E.distance_matrix(x, "correlation")
    assert d[0, 1] == pytest.approx(0.0, abs=1e-12)
    assert d[0, 2] == pytest.approx(2.0)
    assert d[0, 3] == pytest.approx(1.0)
    assert d[4, 0] == 1.0 and d[4, 4] == 0.0
    np.testing.assert_allclose(d, d.T)
    np.testing.assert_array_equal(np.diag(d), 0.0)


def test_disagreement_distance():
    x = np.array([[1.0, -1.0, 2.0, -2.0], [1.0, 1.0, -2.0, -2.0], [3.0, -0.5, 0.1, -9.0]])
    d = E.distance_matrix(x, "disagreement")
    # clicks (logit > 0): TFTF, TTFF, TFTF
    np.testing.assert_allclose(d, [[0, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0]])
    with pytest.raises(ValueError, match=r"distance = 'kl'"):
        E.distance_matrix(x, "kl")


def test_collector_stops_after_patience_stalls():
    y = np.array([1.0, 0.0])
    c = E.SnapshotCollector(y, metric="logloss", min_gain=1e-3, patience=2)
    assert c.add(np.array([0.0, 0.0]))  # ln 2
    assert c.add(np.array([2.0, -2.0]))  # ensemble (1, -1)
    assert c.add(np.array([2.0, -2.0]))  # ensemble (4/3, -4/3)
    assert c.add(np.array([0.0, 0.0]))  # ensemble (1, -1): worse, stall 1
    assert not c.add(np.array([0.0, 0.0]))  # ensemble (0.8, -0.8): stall 2, stop
    ll = [math.log(2), math.log(1 + math.exp(-1))]
    ll += [math.log(1 + math.exp(-4 / 3)), ll[1], math.log(1 + math.exp(-0.8))]
    h = c.history
    assert [e["ensemble"]["logloss"] for e in h] == pytest.approx(ll)
    assert h[0]["gain"] is None
    assert [e["gain"] for e in h[1:]] == pytest.approx([ll[i] - ll[i + 1] for i in range(4)])
    assert [e["stalls"] for e in h] == [0, 0, 0, 1, 2]
    assert h[1]["member"]["logloss"] == pytest.approx(math.log(1 + math.exp(-2)))
    assert c.stopped and c.to_dict()["snapshots"] == h
    with pytest.raises(ValueError, match="stopped after 5 snapshots"):
        c.add(np.array([0.0, 0.0]))


def test_collector_stall_count_resets_and_max_snapshots_stops():
    y = np.array([1.0, 0.0])
    c = E.SnapshotCollector(y, min_gain=1e-3, patience=2)
    for x in ([0.0, 0.0], [0.0, 0.0], [3.0, -3.0], [0.0, 0.0]):  # stall, gain, stall
        assert c.add(np.array(x))
    assert [e["stalls"] for e in c.history] == [0, 1, 0, 1]
    capped = E.SnapshotCollector(y, max_snapshots=2)
    assert capped.add(np.array([1.0, -1.0]))
    assert not capped.add(np.array([2.0, -2.0]))
    auc = E.SnapshotCollector(y, metric="auc", min_gain=0.0, patience=1)
    assert auc.add(np.array([1.0, -1.0]))  # AUC 1
    assert not auc.add(np.array([1.0, -1.0]))  # still 1: a gain of 0 (at most min_gain) stalls


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"metric": "mse"}, "metric = 'mse'"),
        ({"patience": 0}, "patience = 0"),
        ({"max_snapshots": 0}, "max_snapshots = 0"),
        ({"min_gain": math.nan}, "min_gain = nan"),
        ({"combine": "max"}, "combine = 'max'"),
    ],
)
def test_collector_arguments_are_checked(kwargs, words):
    with pytest.raises(ValueError, match=words):
        E.SnapshotCollector(np.array([1.0, 0.0]), **kwargs)


def test_collector_checks_logits_shape():
    c = E.SnapshotCollector(np.array([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match=r"expected shape \[members, 3\]"):
        c.add(np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="finite"):
        c.add(np.array([1.0, np.nan, 0.0]))


Y = np.array([1, 0, 1, 0, 1, 0], np.float64)
X = np.array(
    [
        [-0.4, -0.6, 2.2, -2.2, -1.5, -0.4],
        [-0.2, -1.9, -1.2, -0.8, 1.1, 0.6],
        [1.5, -0.9, -1.7, 1.1, -0.9, -1.9],
    ]
)


def _gain(members: list[int], c: int) -> float:
    before = _logloss(Y, X[members].mean(axis=0))
    return before - _logloss(Y, X[[*members, c]].mean(axis=0))


def test_greedy_selection_by_accuracy_alone():
    singles = [_logloss(Y, row) for row in X]
    assert int(np.argmin(singles)) == 0  # member 0 first
    assert _gain([0], 1) > _gain([0], 2) > 0  # 1 joins
    assert _gain([0, 1], 2) <= 0  # 2 is then not eligible
    s = E.select_members(Y, X, metric="logloss", diversity=0.0)
    assert s.members == [0, 1]
    assert [m["logloss"] for m in s.member_metrics] == pytest.approx(singles)
    assert s.ensemble_metrics["logloss"] == pytest.approx(_logloss(Y, X[[0, 1]].mean(axis=0)))
    assert s.rounds[1]["gain"] == pytest.approx(_gain([0], 1))
    assert s.distances.shape == (3, 3)
    assert E.select_members(Y, X, max_members=1).members == [0]


def test_diversity_ranks_the_eligible_candidates():
    d = E.distance_matrix(X, "correlation")
    # objective gain + 0.5 * distance: member 2 (farther from 0) beats member 1
    assert _gain([0], 2) + 0.5 * d[0, 2] > _gain([0], 1) + 0.5 * d[0, 1]
    assert _gain([0, 2], 1) > 0  # 1 still improves the pair
    s = E.select_members(Y, X, diversity=0.5)
    assert s.members == [0, 2, 1]
    assert s.rounds[1]["distance"] == pytest.approx(d[0, 2])
    assert s.rounds[2]["distance"] == pytest.approx((d[1, 0] + d[1, 2]) / 2)
    assert s.rounds[1]["objective"] == pytest.approx(_gain([0], 2) + 0.5 * d[0, 2])
    out = s.to_dict()
    assert out["members"] == [0, 2, 1] and out["distances"] == d.tolist()
    # a high min_gain gates every candidate, whatever its distance
    assert E.select_members(Y, X, diversity=10.0, min_gain=0.1).members == [0]


def test_selection_by_auc_and_in_probability_space():
    y = np.array([1.0, 0.0, 1.0, 0.0])
    x = np.array([[2.0, -1.0, -1.0, -1.0], [-1.0, -1.0, 2.0, -1.0], [1.0, 1.0, 1.0, 1.0]])
    # alone: AUC (1 + 1 + 0.5 + 0.5) / 4 = 0.75, 0.75 and 0.5; 0 and 1 together rank both
    # clicks first (AUC 1); 0 and 2 keep the tie of rows 1 .. 3 (AUC 0.75: no gain)
    s = E.select_members(y, x, metric="auc", combine="probabilities")
    assert s.members == [0, 1]
    assert [m["auc"] for m in s.member_metrics] == pytest.approx([0.75, 0.75, 0.5])
    assert s.ensemble_metrics["auc"] == pytest.approx(1.0)
    assert s.combine == "probabilities"


def test_selection_arguments_and_one_class():
    with pytest.raises(ValueError, match="diversity = -1"):
        E.select_members(Y, X, diversity=-1)
    with pytest.raises(ValueError, match="max_members = 0"):
        E.select_members(Y, X, max_members=0)
    with pytest.raises(ValueError, match=r"expected shape \[members, 6\]"):
        E.select_members(Y, X[:, :4])
    with pytest.raises(OneClassError):
        E.select_members(np.ones(6), X)


def test_snapshot_manifest_records_replaces_and_truncates(tmp_path):
    assert E.read_snapshots(tmp_path) == []
    assert E.snapshot_prefix(tmp_path, 2) == str(tmp_path / "snapshots" / "snapshot-2")
    E.record_snapshot(tmp_path, 0, 10, np.array([0.5, -0.5]))
    E.record_snapshot(tmp_path, 1, 20, np.array([1.5, -1.5]))
    again = E.record_snapshot(tmp_path, 1, 20, np.array([2.5, -2.5]))  # resumed: taken again
    assert again == {
        "index": 1,
        "step": 20,
        "checkpoint": "snapshots/snapshot-1",
        "val_logits": "snapshots/snapshot-1.val_logits.npy",
    }
    entries = E.read_snapshots(tmp_path)
    assert [e["index"] for e in entries] == [0, 1]
    np.testing.assert_allclose(E.snapshot_logits(tmp_path, entries), [[0.5, -0.5], [2.5, -2.5]])
    assert [e["index"] for e in E.truncate_snapshots(tmp_path, 19)] == [0]
    assert [e["index"] for e in E.read_snapshots(tmp_path)] == [0]
