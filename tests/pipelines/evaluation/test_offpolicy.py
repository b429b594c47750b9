"""Off-policy estimates: formulas by hand, a synthetic bandit with a known policy value, and the
Open Bandit Dataset check (the uniform-random policy estimated from the Bernoulli-TS logs vs the
click rate observed in the random logs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.evaluation import compare, offpolicy, sources

BANDIT_SCHEMA = """
name = "bandit"
[source]
format = "parquet"
[[fields]]
name = "user"
kind = "categorical"
[[fields]]
name = "item"
kind = "categorical"
[[fields]]
name = "click"
kind = "label"
[[fields]]
name = "propensity"
kind = "meta"
dtype = "float32"
"""


def test_estimators_by_hand():
    # 2 rows, 2 actions. Row 0 logged a0 (pb 0.5, click), row 1 logged a1 (pb 0.25, no click).
    bl = offpolicy.BanditLogs(
        actions=np.array(["a0", "a1"]),
        action_idx=np.array([0, 1]),
        propensity=np.array([0.5, 0.25]),
        reward=np.array([1.0, 0.0]),
        action="item",
        item_columns=[],
    )
    pi = np.array([[0.8, 0.2], [0.5, 0.5]])
    q = np.array([[0.6, 0.1], [0.2, 0.3]])
    pr = offpolicy.policy_rows(pi, bl, q)
    w = np.array([0.8 / 0.5, 0.5 / 0.25])
    pt = pr.point()
    assert pt["ips"] == pytest.approx((w[0] * 1 + 0) / 2)
    assert pt["snips"] == pytest.approx(w[0] / w.sum())
    dm = np.array([0.8 * 0.6 + 0.2 * 0.1, 0.5 * 0.2 + 0.5 * 0.3])
    assert pt["dm"] == pytest.approx(dm.mean())
    assert pt["dr"] == pytest.approx((dm + w * (np.array([1, 0]) - np.array([0.6, 0.3]))).mean())


def test_policy_softmax_and_greedy():
    s = np.array([[0.1, 0.5, 0.5], [0.9, 0.2, 0.1]])
    g = offpolicy.policy(s, 0)
    np.testing.assert_allclose(g, [[0, 0.5, 0.5], [1, 0, 0]])
    p = offpolicy.policy(s, 1.0)
    odds = s / (1 - s)
    np.testing.assert_allclose(p, odds / odds.sum(axis=1, keepdims=True))


def _bandit(tmp: Path, n: int = 6000, seed: int = 0):
    """Users u0..u3, items i0..i4; click rate known; logging policy favours low items."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 4, n)
    pb_table = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
    items = rng.choice(5, size=n, p=pb_table)
    ctr = 0.05 + 0.08 * ((users[:, None] + np.arange(5)[None, :]) % 4 == 0)  # [n, 5]
    click = (rng.random(n) < ctr[np.arange(n), items]).astype(np.float32)
    table = pa.table(
        {
            "user": [f"u{u}" for u in users],
            "item": [f"i{i}" for i in items],
            "click": click,
            "propensity": pb_table[items].astype(np.float32),
        }
    )
    (tmp / "schema.toml").write_text(BANDIT_SCHEMA)
    pq.write_table(table, tmp / "logs.parquet")
    # a target policy's scores for every (row, candidate): knows the good pairs
    good = ctr > 0.1
    score = np.where(good, 0.3, 0.02)
    cand = pa.table(
        {
            "row_id": np.repeat(np.arange(n), 5),
            "item": np.tile([f"i{i}" for i in range(5)], n),
            "score": score.ravel(),
        }
    )
    pq.write_table(cand, tmp / "target.parquet")
    pi = offpolicy.policy(score, 1.0)
    return float((pi * ctr).sum(axis=1).mean())


def test_estimates_cover_the_known_value_of_a_target_policy(tmp_path):
    truth = _bandit(tmp_path)
    logs = sources.load_logs([str(tmp_path / "logs.parquet")], str(tmp_path / "schema.toml"))
    target = sources.open_source(str(tmp_path / "target.parquet"), action="item")
    r = compare.off_policy(
        logs,
        {"target": target, "uniform": sources.UniformSource()},
        action="item",
        propensity="propensity",
        resamples=400,
    )
    est = r["policies"]["target"]["estimates"]
    for name in ("ips", "snips", "dr"):
        lo, hi = est[name]["ci"]
        assert lo <= truth <= hi, (name, lo, truth, hi)
    # the target policy is far better than uniform (0.05 + 0.08 / 4 = 0.07)
    assert est["dr"]["value"] > r["policies"]["uniform"]["estimates"]["dr"]["value"] + 0.02
    assert r["policies"]["target"]["diagnostics"]["mean_weight"] == pytest.approx(1, abs=0.1)


def test_bad_propensities_are_named(tmp_path):
    _bandit(tmp_path, n=200)
    t = pq.read_table(tmp_path / "logs.parquet")
    prop = t.column("propensity").to_numpy().copy()
    prop[7] = 0.0
    t = t.set_column(3, "propensity", pa.array(prop))
    pq.write_table(t, tmp_path / "logs.parquet")
    logs = sources.load_logs([str(tmp_path / "logs.parquet")], str(tmp_path / "schema.toml"))
    # a user error (SourceError: one `error:` line from the command line), not a bug
    with pytest.raises(sources.SourceError, match=r"propensity field 'propensity'.*first at row 7"):
        offpolicy.bandit_logs(logs, "item", "propensity")
    with pytest.raises(sources.SourceError, match=r"need field 'pscore' in the logs"):
        offpolicy.bandit_logs(logs, "item", "pscore")


def test_open_bandit_uniform_policy_matches_observed_random_ctr(shared_data):
    """OBD practice (Saito et al. 2021): estimate the Random policy's value from the Bernoulli-TS
    logs, compare with the on-policy click rate of the Random logs. On the random logs
    themselves every weight is 1, so IPS and SNIPS equal the observed CTR exactly."""
    d = shared_data / "open-bandit-small"
    rand = sources.load_logs([str(d / "random/all/all.csv")], "open_bandit")
    bts = sources.load_logs([str(d / "bts/all/all.csv")], "open_bandit")
    uniform = {"uniform": sources.UniformSource()}
    kw = dict(action="item_id", propensity="propensity_score", reward_folds=0, resamples=1000)
    own = compare.off_policy(rand, uniform, **kw)
    ctr = float(rand.labels.mean())
    for name in ("ips", "snips"):
        assert own["policies"]["uniform"]["estimates"][name]["value"] == pytest.approx(
            ctr, rel=1e-6
        )
    off = compare.off_policy(bts, uniform, **kw)
    for name in ("ips", "snips"):
        lo, hi = off["policies"]["uniform"]["estimates"][name]["ci"]
        assert lo <= ctr <= hi, (name, lo, ctr, hi)
