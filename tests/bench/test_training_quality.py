"""bench.training.quality: paired_over_seeds (the paired bootstrap of the mean over seeds of test
AUC) against AUCs computed by hand, the report's rows, the baselines' cache, and the ensemble
recipe's cycle options."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
from sklearn.metrics import roc_auc_score

from bench.training.lr_baseline import converted
from bench.training.quality import (
    cached_baselines,
    method_config,
    paired,
    paired_over_seeds,
    report,
)
from features.synthetic import write_dataset
from features.synthetic_config import SyntheticConfig
from pipelines.train import train


def _scores(rng: np.random.Generator, labels: np.ndarray, signal: float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(signal * (2 * labels - 1) + rng.normal(size=labels.size))))


def _synthetic(tmp_path) -> dict:
    """``[data]`` of 3,000 synthetic rows (a fifth of them test) written under ``tmp_path/d``."""
    write_dataset(SyntheticConfig(rows=3000, n_single=8, seed=0), tmp_path / "d", test_fraction=0.2)
    return {
        "schema": str(tmp_path / "d" / "schema.toml"),
        "train": [str(tmp_path / "d" / "train")],
        "test": [str(tmp_path / "d" / "test")],
    }


def test_the_delta_is_the_mean_of_the_seeds_deltas_and_the_interval_holds_it():
    rng = np.random.default_rng(0)
    y = (rng.random(3000) < 0.3).astype(np.float64)
    controls = [_scores(rng, y, 0.5) for _ in range(3)]
    treatments = [_scores(rng, y, 0.8) for _ in range(3)]
    r = paired_over_seeds(y, controls, treatments)
    by_hand = np.mean(
        [
            roc_auc_score(y, t) - roc_auc_score(y, c)
            for c, t in zip(controls, treatments, strict=True)
        ]
    )
    assert abs(r["delta"] - by_hand) < 1e-9
    assert r["ci_low"] < r["delta"] < r["ci_high"] and r["verdict"] == "better"
    # the mean's interval is narrower than any one seed's: three seeds' noise averaged
    widths = [p["ci_high"] - p["ci_low"] for p in map(paired, [y] * 3, controls, treatments)]
    assert r["ci_high"] - r["ci_low"] < min(widths)


def test_equal_arms_give_zero_and_one_seed_matches_the_seeds_own_pair():
    rng = np.random.default_rng(1)
    y = (rng.random(2000) < 0.4).astype(np.float64)
    s = _scores(rng, y, 0.5)
    same = paired_over_seeds(y, [s, s[::-1]], [s, s[::-1]])
    assert same["delta"] == 0.0 and same["ci_low"] == same["ci_high"] == 0.0
    t = _scores(rng, y, 0.6)
    one, own = paired_over_seeds(y, [s], [t]), paired(y, s, t)
    assert abs(one["delta"] - own["delta"]) < 1e-12
    assert abs(one["ci_low"] - own["ci_low"]) < 0.01 and abs(one["ci_high"] - own["ci_high"]) < 0.01


def test_the_report_gives_each_recipe_of_several_seeds_its_mean_over_seeds_against_sk_lr(capsys):
    rng = np.random.default_rng(2)
    y = (rng.random(2000) < 0.3).astype(np.float64)
    lr = _scores(rng, y, 0.5)
    runs = [
        {"scores": s, "test_auc": roc_auc_score(y, s), "steps": 10, "seconds": 1.0}
        for s in (_scores(rng, y, 0.9) for _ in range(3))
    ]
    result = {
        "name": "toy",
        "baselines": {"labels": y, "sk_lr": (0.6, "C=1", lr)},
        "rows": {"dcn": runs, "dcn x seeds": [dict(runs[0], test_auc=None)]},
        "latency": None,
    }
    summary = report(result)
    over = summary["rows"]["dcn"]["over_seeds"]
    by_hand = np.mean([r["test_auc"] - roc_auc_score(y, lr) for r in runs])
    assert abs(over["delta"] - by_hand) < 1e-9 and over["ci_low"] > 0
    assert "over_seeds" not in summary["rows"]["dcn x seeds"]  # one run: no mean over seeds
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| dcn |"))
    assert f"{over['delta']:+.4f} [{over['ci_low']:+.4f}, {over['ci_high']:+.4f}]" in line


def test_the_ensemble_recipe_takes_shorter_cycles_and_a_top_rate(tmp_path):
    data = _synthetic(tmp_path)
    train_rows = sum(
        pq.ParquetFile(f).metadata.num_rows for f in (tmp_path / "d" / "train").glob("*.parquet")
    )
    cfg = method_config("dcn_ensemble", data, tmp_path / "run", 0, 0, 4, 0.003)
    assert cfg.train.lr_schedule == "cyclic" and cfg.train.learning_rate == 0.003
    assert cfg.train.lr_schedule_options == {"cycle_steps": -(-train_rows // 256) // 4}
    default = method_config("dcn_ensemble", data, tmp_path / "run", 0, 0)
    assert default.train.lr_schedule != "cyclic" and default.train.learning_rate == 1e-3


def test_the_baselines_are_read_back_for_the_same_shards_and_grids_only(tmp_path):
    data = _synthetic(tmp_path)
    run = tmp_path / "lr_seed0"
    train(method_config("lr", data, run, 0, 0), lambda _line: None)
    shards, cache = converted(run, data), tmp_path / "baselines.npz"
    first = cached_baselines(cache, run, shards, xgb=False)
    assert cache.exists() and first["sk_lr"][1].startswith("C=")
    # a cache written for these shards and grids is what the next call returns
    with np.load(cache) as f:
        arrays = dict(f)
    arrays["sk_lr_scores"] = arrays["sk_lr_scores"] * 0.5
    np.savez(cache, **arrays)
    again = cached_baselines(cache, run, shards, xgb=False)
    np.testing.assert_array_equal(again["sk_lr"][2], first["sk_lr"][2] * 0.5)
    np.testing.assert_array_equal(again["labels"], first["labels"])
    assert again["sk_lr"][:2] == first["sk_lr"][:2] and "xgboost" not in again
    # other grids (xgboost asked for) are another key: fitted again, the cache replaced
    other = cached_baselines(cache, run, shards, xgb=True)
    np.testing.assert_allclose(other["sk_lr"][2], first["sk_lr"][2])
    assert "xgboost" in other and "xgboost" in cached_baselines(cache, run, shards, xgb=True)
