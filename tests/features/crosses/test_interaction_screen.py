"""The exhaustive pure-interaction screen: its ANOVA by hand, its calibration, what it finds."""

import numpy as np
import pytest

from features.crosses import interaction_screen as isc


def _table(effect: np.ndarray, count: float) -> tuple[np.ndarray, np.ndarray]:
    counts = np.full(effect.shape, count)
    return counts, effect * counts


def test_pure_part_of_a_table_by_hand():
    # 2 x 2 x 2, 10 rows per cell, cell means 0.3 * (-1)^(i + j + k): already pure, so
    # SS = 8 cells * 10 rows * 0.3^2 = 7.2 with df = 1
    sign = np.fromfunction(lambda i, j, k: (-1.0) ** (i + j + k), (2, 2, 2))
    ss, df = isc.pure_interaction_ss(*_table(0.3 * sign, 10))
    assert df == 1 and ss == pytest.approx(7.2)
    # main effects and a pair effect add nothing to the top-order part
    i, j, k = np.indices((2, 2, 2))
    lower = 0.5 * i - 0.2 * k + 0.7 * (-1.0) ** (i + j)
    ss2, _ = isc.pure_interaction_ss(*_table(0.3 * sign + lower, 10))
    assert ss2 == pytest.approx(7.2)
    # a table of lower-order effects only has no pure part at all
    assert isc.pure_interaction_ss(*_table(lower, 10))[0] == pytest.approx(0.0, abs=1e-12)


def test_empty_levels_leave_the_degrees_of_freedom():
    counts = np.zeros((3, 2))
    counts[:2, :] = 5  # the third value of the first field never occurs
    sums = np.array([[1.0, -1.0], [-1.0, 1.0], [0.0, 0.0]])
    ss, df = isc.pure_interaction_ss(counts, sums)
    assert df == 1  # (2 - 1) * (2 - 1)
    assert ss == pytest.approx(4 * 5 * 0.2**2)  # cell means +-0.2, already pure
    assert isc.pure_interaction_ss(np.zeros((1, 3)), np.zeros((1, 3))) == (0.0, 0)


def test_levels_and_caps():
    assert [isc.levels_for(o, 4096) for o in (2, 3, 4)] == [64, 16, 8]
    assert isc.levels_for(3, 26) == 2
    ids = np.array([[0, 5], [0, 5], [1, 5], [2, 7], [2, 7], [2, 7]])
    caps = isc.fit_caps(ids, levels=2)  # keep the most frequent id per column, the rest: 1
    assert caps.apply(ids).tolist() == [
        [1, 0],
        [1, 0],
        [1, 0],
        [0, 1],
        [0, 1],
        [0, 1],
    ]
    assert caps.apply(np.array([[9, 99]])).tolist() == [[1, 1]]  # unseen ids: "other"
    with pytest.raises(ValueError, match="levels"):
        isc.fit_caps(ids, 1)


def _data(rows: int, seed: int, triple: float, pair: float) -> tuple[np.ndarray, np.ndarray]:
    """6 independent fields of 4 values; the logit has a pure triple on (0, 2, 4) and a pure
    pair on (1, 3) plus a main effect of field 5."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 4, (rows, 6))
    parity3 = np.where((x[:, 0] + x[:, 2] + x[:, 4]) % 2 == 0, 1.0, -1.0)
    parity2 = np.where((x[:, 1] + x[:, 3]) % 2 == 0, 1.0, -1.0)
    logit = triple * parity3 + pair * parity2 + 0.5 * (x[:, 5] - 1.5)
    y = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return x, y


FIELDS = [f"f{i}" for i in range(6)]


def test_the_screen_finds_a_pure_triple_and_not_the_pair_inside_other_triples():
    x, y = _data(40_000, 0, triple=1.0, pair=1.5)
    tested, _ = isc.screen(x, y, FIELDS, order=3)
    assert len(tested) == 20
    zc = isc.critical_z(0.01, len(tested))
    assert tested[0].fields == ("f0", "f2", "f4") and tested[0].z > 10 * zc
    # the strong pair (f1, f3) sits inside 4 triples; the projection removes it from each
    assert all(c.z < zc for c in tested[1:]), [(c.fields, round(c.z, 1)) for c in tested[:4]]
    pairs, _ = isc.screen(x, y, FIELDS, order=2)
    assert pairs[0].fields == ("f1", "f3")
    assert all(c.z < isc.critical_z(0.01, 15) for c in pairs[1:])  # the triple's sub-pairs


def test_without_interactions_z_is_standard_normal():
    zs = []
    for seed in range(4):
        x, _ = _data(20_000, seed, 0.0, 0.0)
        y = (np.random.default_rng(100 + seed).random(len(x)) < 0.3).astype(np.float32)
        zs += [c.z for c in isc.screen(x, y, FIELDS, order=3)[0]]
    zs = np.array(zs)  # 80 tests; a calibrated test: mean ~0, sd ~1, none past Bonferroni
    assert abs(zs.mean()) < 0.5 and 0.5 < zs.std() < 1.5
    assert zs.max() < isc.critical_z(0.01, len(zs))


def test_effect_is_the_share_of_label_variance_and_held_out_agrees():
    x, y = _data(60_000, 1, triple=1.0, pair=0.0)
    tested, caps = isc.screen(x[:30_000], y[:30_000], FIELDS, order=3)
    # reference: the pure part of P(y | x) is +-d with d = (sigmoid(1) - sigmoid(-1)) / 2 in
    # the mean over field 5's main effect; its variance d^2 over var(y) is the effect
    sig = 1 / (1 + np.exp(-(np.array([1.0, -1.0])[:, None] + 0.5 * (np.arange(4) - 1.5))))
    d = float(np.mean(sig[0] - sig[1]) / 2)
    expected = d**2 / float(np.var(y))
    assert tested[0].effect == pytest.approx(expected, rel=0.15)
    train, held_out = (x[:30_000], y[:30_000]), (x[30_000:], y[30_000:])
    effect, effect_noise = isc.held_out_effects(
        train, held_out, FIELDS, [("f0", "f2", "f4"), ("f1", "f3", "f5")], {3: caps}
    )
    assert effect == pytest.approx(expected, rel=0.15)
    assert abs(effect_noise) < 0.002
    with pytest.raises(ValueError, match="order 2"):
        isc.held_out_effects(train, held_out, FIELDS, [("f0", "f1")], {3: caps})


def test_cross_fitted_effect_is_unbiased_where_the_df_correction_is_not():
    """Dependent, sparse fields without interaction: most cells of the 64 x 64 table are empty,
    so prod(L - 1) overstates the degrees of freedom and the df-corrected effect goes negative;
    the cross-fitted one stays about 0."""
    rng = np.random.default_rng(7)
    rows = 40_000
    a = rng.integers(0, 60, rows)
    b = (a + rng.integers(0, 3, rows)) % 60  # b is nearly a function of a
    x = np.stack([a, b], axis=1)
    y = (rng.random(rows) < 0.2 + 0.004 * a).astype(np.float32)  # a main effect only
    tested, caps = isc.screen(x[:20_000], y[:20_000], ["a", "b"], order=2)
    assert tested[0].effect < -0.003 and tested[0].z < -5  # df overstated: biased low
    (effect,) = isc.held_out_effects(
        (x[:20_000], y[:20_000]), (x[20_000:], y[20_000:]), ["a", "b"], [("a", "b")], {2: caps}
    )
    assert abs(effect) < 0.002


def test_bad_input_is_named():
    x, y = _data(100, 0, 0.0, 0.0)
    with pytest.raises(ValueError, match="ids must be"):
        isc.screen(x, y, FIELDS[:5])
    with pytest.raises(ValueError, match="labels"):
        isc.screen(x, y[:50], FIELDS)
    with pytest.raises(ValueError, match="order"):
        isc.screen(x, y, FIELDS, order=7)


def test_matches_a_plain_loop_over_cells():
    """The screen's SS against a direct two-way ANOVA with unequal cell counts."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 3, (5000, 2))
    y = (rng.random(5000) < 0.2 + 0.1 * (x[:, 0] == x[:, 1])).astype(np.float64)
    tested, _ = isc.screen(x, y, ["a", "b"], order=2)
    yc = y - y.mean()
    n = np.zeros((3, 3))
    s = np.zeros((3, 3))
    for (i, j), v in zip(x, yc, strict=True):
        n[i, j] += 1
        s[i, j] += v
    m = s / n
    r = m.copy()
    for ax in (0, 1):
        r = r - (n * r).sum(ax, keepdims=True) / n.sum(ax, keepdims=True)
    ss = float((n * r * r).sum())
    assert tested[0].z == pytest.approx((ss / y.var() - 4) / np.sqrt(8))
    assert tested[0].fields == ("a", "b")
