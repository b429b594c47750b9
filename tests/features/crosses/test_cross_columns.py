"""features.crosses.cross_columns on hand-checkable inputs: the mutual-information pair ranking
and the cross columns that models outside the ranking stack read."""

from __future__ import annotations

import numpy as np

from features.crosses.cross_columns import feature_columns, index_values, mi_pairs


def test_mi_pairs_finds_a_pure_xor_pair():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2, (4000, 4))
    y = ((x[:, 1] ^ x[:, 3]) == 1).astype(float)  # no single field says anything about y
    assert mi_pairs(x, y, [2, 2, 2, 2], 1) == [[1, 3]]


def test_cross_columns_index_seen_tuples_and_send_the_rest_to_zero():
    train = np.array([5, 5, 7, 9, 9, 9])
    a, b, n = index_values(train, np.array([9, 5, 7, 1]), min_count=2)
    assert n == 3 and a.tolist() == [1, 1, 0, 2, 2, 2] and b.tolist() == [2, 1, 0, 0]
    x_tr = np.array([[0, 1], [0, 1], [1, 1], [1, 0]])
    tr, te, card = feature_columns(x_tr, np.array([[0, 1], [1, 0]]), [2, 2], [[0, 1]])
    assert card == [3, 3, 2]  # two fields (values 0 and 1 plus "other"), one cross
    assert tr[2].tolist() == [1, 1, 0, 0] and te[2].tolist() == [1, 0]
