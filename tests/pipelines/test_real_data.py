"""Training on the real datasets in ../shared/data with the configs the project ships."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import OneHotEncoder

from pipelines.config import load_config
from pipelines.train import train

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _config(name: str, shared_data: Path, out: Path, *overrides: str):
    raw = {
        "movielens": [shared_data / "movielens-latest-small" / "ratings.csv"],
        "open_bandit": [
            shared_data / "open-bandit-small" / "random" / "all" / "all.csv",
            shared_data / "open-bandit-small" / "bts" / "all" / "all.csv",
        ],
    }[name]
    raw_list = "[" + ", ".join(f'"{p}"' for p in raw) + "]"
    return load_config(
        CONFIGS / f"{name}.toml",
        [f"output_dir={out}", f"data.raw={raw_list}", "data.validation_fraction=0.0", *overrides],
    )


@pytest.mark.slow
def test_movielens_dcn_v2_beats_one_hot_logistic_regression(shared_data, tmp_path):
    cfg = _config("movielens", shared_data, tmp_path / "ml")
    report = train(cfg, log=lambda _: None)
    assert report["train_rows"] + report["test_rows"] == 100_836
    dcn_auc = report["test"]["auc"]

    # the reference: scikit-learn LR on one-hot userId and movieId, on the same split
    train_df = pd.read_parquet(tmp_path / "ml" / "data" / "train")
    test_df = pd.read_parquet(tmp_path / "ml" / "data" / "test")
    cols = ["userId", "movieId"]
    enc = OneHotEncoder(handle_unknown="ignore").fit(train_df[cols])
    lr = LogisticRegression(max_iter=2000).fit(enc.transform(train_df[cols]), train_df["label"])
    lr_auc = roc_auc_score(test_df["label"], lr.predict_proba(enc.transform(test_df[cols]))[:, 1])
    assert lr_auc == pytest.approx(0.787, abs=0.01)
    # measured: DCN-v2 0.7951 / 0.7929 / 0.7951 (seeds 0-2) vs this LR 0.7904 on split_seed 0
    assert dcn_auc > lr_auc + 0.003, (dcn_auc, lr_auc)


@pytest.mark.slow
def test_open_bandit_trains_calibrated(shared_data, tmp_path):
    cfg = _config("open_bandit", shared_data, tmp_path / "obd")
    report = train(cfg, log=lambda _: None)
    assert report["train_rows"] + report["test_rows"] == 20_000
    test_df = pd.read_parquet(tmp_path / "obd" / "data" / "test")
    train_df = pd.read_parquet(tmp_path / "obd" / "data" / "train")
    # ~80 clicks in all: too few for a stable AUC, but the model must stay calibrated: its log
    # loss is within 5% of always predicting the training click rate
    p = train_df["click"].mean()
    y = test_df["click"].to_numpy()
    base = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    assert report["test"]["logloss"] < 1.05 * base
    assert 0.0 <= report["test"]["auc"] <= 1.0
