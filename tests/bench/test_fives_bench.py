"""bench/fives helpers on hand-checkable inputs: ground-truth scoring, the MI baseline, random
crosses and the hashed cross columns the downstream models read."""

from __future__ import annotations

import numpy as np

from bench.fives.__main__ import (
    feature_columns,
    index_values,
    mi_pairs,
    planted_scores,
    random_crosses,
    relative_gains,
)
from features.crosses.artifact import Cross


def test_planted_scores_count_exact_field_sets_only():
    truth = {"pairs": [{"fields": ["a", "b"]}], "triples": [{"fields": ["c", "d", "e"]}]}
    crosses = [
        Cross(("b", "a"), 0.9),
        Cross(("c", "d"), 0.8),  # a sub-pair of the triple: not the planted cross
        Cross(("x", "y"), 0.7),
        Cross(("c", "d", "e"), 0.6),
        Cross(("d", "e"), 0.5),
    ]
    s = planted_scores(crosses, truth)
    assert s["top_n"] == 4 and s["recall"] == 1.0 and s["precision"] == 0.5
    assert s["ranks"] == {"axb": 1, "cxdxe": 4} and s["all_in_top"]
    s = planted_scores(crosses[:3], truth)
    assert s["recall_pairs"] == 1.0 and s["recall_triples"] == 0.0 and not s["all_in_top"]


def test_mi_pairs_finds_a_pure_xor_pair():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2, (4000, 4))
    y = ((x[:, 1] ^ x[:, 3]) == 1).astype(float)  # no single field says anything about y
    assert mi_pairs(x, y, [2, 2, 2, 2], 1) == [[1, 3]]


def test_random_crosses_keep_orders_and_avoid_exclusions():
    got = random_crosses(5, [2, 3, 2], seed=0, exclude={frozenset([0, 1])})
    assert [len(c) for c in got] == [2, 3, 2]
    assert len({frozenset(c) for c in got}) == 3 and frozenset([0, 1]) not in map(frozenset, got)


def test_cross_columns_index_seen_tuples_and_send_the_rest_to_zero():
    train = np.array([5, 5, 7, 9, 9, 9])
    a, b, n = index_values(train, np.array([9, 5, 7, 1]), min_count=2)
    assert n == 3 and a.tolist() == [1, 1, 0, 2, 2, 2] and b.tolist() == [2, 1, 0, 0]
    x_tr = np.array([[0, 1], [0, 1], [1, 1], [1, 0]])
    tr, te, card = feature_columns(x_tr, np.array([[0, 1], [1, 0]]), [2, 2], [[0, 1]])
    assert card == [3, 3, 2]  # two fields (values 0 and 1 plus "other"), one cross
    assert tr[2].tolist() == [1, 1, 0, 0] and te[2].tolist() == [1, 0]


def test_relative_gains_are_against_plain_lr():
    entries = [
        {
            "downstream": {
                "none": {"lr_auc": 0.8, "xgb_auc": 0.84},
                "fives": {"lr_auc": 0.808, "xgb_auc": 0.8},
            }
        }
    ]
    g = relative_gains(entries)
    assert abs(g["fives+lr"]["gain_pct"]["mean"] - 1.0) < 1e-9
    assert abs(g["none+xgb"]["gain_pct"]["mean"] - 5.0) < 1e-9
