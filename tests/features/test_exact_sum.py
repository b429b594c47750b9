"""``ExactSum``: the correctly rounded sum of its terms in any order and grouping."""

from __future__ import annotations

import math
import pickle

import numpy as np

from features.exact_sum import ExactSum


def _sum(terms) -> ExactSum:
    s = ExactSum()
    for t in terms:
        s.add(t)
    return s


def test_any_order_and_grouping_gives_the_correctly_rounded_sum():
    rng = np.random.default_rng(0)
    # ill-conditioned: large terms that cancel and small ones that plain float sums lose
    terms = [float(v) for v in rng.normal(size=200) * 10.0 ** rng.integers(-8, 17, size=200)]
    terms += [-t for t in terms[:100]]
    want = math.fsum(terms)
    assert sum(terms) != want  # the plain left-to-right float sum rounds differently
    for seed in range(5):
        order = np.random.default_rng(seed).permutation(len(terms))
        cuts = sorted(np.random.default_rng(seed + 10).choice(len(terms), 6, replace=False))
        parts = [_sum(terms[i] for i in chunk) for chunk in np.split(order, cuts)]
        total = parts.pop()
        while parts:  # merged from the back: another grouping every seed
            total.merge(parts.pop())
        assert total.value == want
    assert len(_sum(terms).partials) < 40


def test_by_hand_and_empty():
    assert ExactSum().value == 0.0
    assert _sum([0.1, 0.2, 0.3]).value == 0.6  # (0.1 + 0.2) + 0.3 is 0.6000000000000001
    assert _sum([1e16, 1.0, -1e16, 1.0]).value == 2.0
    assert _sum([2.5]).value == 2.5


def test_non_finite_terms_decide_as_ieee_addition_would():
    assert _sum([1.0, math.inf, 5.0]).value == math.inf
    assert _sum([-math.inf, 1e300]).value == -math.inf
    assert math.isnan(_sum([math.inf, -math.inf]).value)
    assert math.isnan(_sum([1.0, math.nan]).value)
    assert _sum([1e308, 1e308]).value == math.inf  # overflow, as float addition


def test_a_sum_survives_pickling():
    s = _sum([0.1, 0.2, 1e20])
    assert pickle.loads(pickle.dumps(s)).value == s.value
