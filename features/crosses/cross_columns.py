"""Cross columns for models outside the ranking stack, and an information-based pair ranking.

Rows are encoded field ids (``fives_encoding``: an ``int`` matrix, one column per field, field
``c`` taking values ``0 .. sizes[c] - 1``). A cross of fields ``cols`` is the tuple of their
values, packed into one integer key (``tuple_keys``). ``feature_columns`` turns fields and
crosses into dense column ids (values seen in training, most frequent first, optionally capped;
everything else shares id 0), and ``one_hot`` makes the sparse one-hot matrix that linear models
or gradient-boosted trees read.

``mi_pairs`` ranks field pairs by interaction information with the label, a baseline cross
search that needs no model: a pair scores by what it says about the label beyond its two fields.
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy import sparse


def tuple_keys(ids: np.ndarray, cols: list[int], sizes: list[int]) -> np.ndarray:
    """One ``int64`` key per row for the value tuple of fields ``cols`` (mixed radix by
    ``sizes``): equal keys exactly when the rows have equal values in every field of ``cols``."""
    key = np.zeros(len(ids), np.int64)
    for c in cols:
        key = key * sizes[c] + ids[:, c]
    return key


def index_values(
    train: np.ndarray, test: np.ndarray, min_count: int = 2, cap: int = 0
) -> tuple[np.ndarray, np.ndarray, int]:
    """Column ids of ``train`` and ``test`` values, and the column's cardinality.

    Values seen at least ``min_count`` times in ``train`` get ids ``1 ..`` in value order (with
    ``cap > 0``, only the ``cap`` most frequent of them); every other value, in either split,
    gets id 0. The cardinality counts id 0.
    """
    values, counts = np.unique(train, return_counts=True)
    keep = values[counts >= min_count]
    if cap and keep.size > cap:
        kept_counts = counts[counts >= min_count]
        keep = np.sort(keep[np.argsort(-kept_counts, kind="stable")[:cap]])

    def lookup(x: np.ndarray) -> np.ndarray:
        if keep.size == 0:
            return np.zeros_like(x)
        pos = np.minimum(np.searchsorted(keep, x), keep.size - 1)
        return np.where(keep[pos] == x, pos + 1, 0)

    return lookup(train), lookup(test), keep.size + 1


def feature_columns(
    x_tr: np.ndarray, x_te: np.ndarray, sizes: list[int], crosses: list[list[int]], cap: int = 0
) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
    """Column ids per column (every field, then every cross of ``crosses``): train ids, test ids
    and cardinalities. A field keeps every value seen in training; a cross keeps the value
    tuples seen twice in training. ``cap > 0`` keeps at most that many values per column."""
    tr, te, card = [], [], []
    for c in range(x_tr.shape[1]):
        a, b, n = index_values(x_tr[:, c], x_te[:, c], min_count=1, cap=cap)
        tr.append(a), te.append(b), card.append(n)
    for cols in crosses:
        a, b, n = index_values(
            tuple_keys(x_tr, cols, sizes), tuple_keys(x_te, cols, sizes), cap=cap
        )
        tr.append(a), te.append(b), card.append(n)
    return tr, te, card


def one_hot(cols: list[np.ndarray], card: list[int]) -> sparse.csr_matrix:
    """Column ids (``feature_columns``) -> a CSR one-hot matrix ``[rows, sum(card)]``."""
    offsets = np.cumsum([0, *card[:-1]])
    rows = np.repeat(np.arange(len(cols[0])), len(cols))
    idx = (np.stack(cols, 1) + offsets).ravel()
    return sparse.csr_matrix(
        (np.ones(idx.size, np.float32), (rows, idx)), shape=(len(cols[0]), sum(card))
    )


def mi_pairs(x: np.ndarray, y: np.ndarray, sizes: list[int], n: int) -> list[list[int]]:
    """The ``n`` field pairs of highest interaction information I(y; a,b) - I(y; a) - I(y; b),
    each plug-in mutual information less its Miller-Madow bias (cells - 1) / (2 N) (in nats).

    ``x``: encoded field ids ``[rows, fields]``; ``y``: labels (above 0.5 is a positive);
    ``sizes``: each field's number of values. Returns column-index pairs, best first.
    """
    yb = (y > 0.5).astype(np.int64)

    def mi(key: np.ndarray) -> float:
        _, inv = np.unique(key, return_inverse=True)
        joint = np.bincount(inv * 2 + yb, minlength=2 * (inv.max() + 1)).reshape(-1, 2)
        total = joint.sum()
        px, py = joint.sum(1, keepdims=True) / total, joint.sum(0, keepdims=True) / total
        pxy = joint / total
        nz = pxy > 0
        value = float(np.sum(pxy[nz] * np.log(pxy[nz] / (px @ py)[nz])))
        return value - (joint.shape[0] - 1) / (2 * total)

    single = [mi(x[:, c]) for c in range(x.shape[1])]
    scores = []
    for a, b in itertools.combinations(range(x.shape[1]), 2):
        gain = mi(tuple_keys(x, [a, b], sizes)) - single[a] - single[b]
        scores.append((gain, [a, b]))
    scores.sort(key=lambda t: -t[0])
    return [cols for _, cols in scores[:n]]
