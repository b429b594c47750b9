"""The logistic-regression baseline: FTRL / Adagrad, their checkpoints, the lr defaults, and the
lr model against scikit-learn's logistic regression on a linear problem."""

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import OneHotEncoder

from pipelines.config import (
    LINEAR_EPOCHS_BOUND,
    LINEAR_TRAIN_DEFAULTS,
    ConfigError,
    linear_train_defaults,
    load_config,
)
from pipelines.run.model import load_trained_model, make_optimizer
from pipelines.train import train
from tests.testdata import NO_VALIDATION, write_run_config, write_split_problem


def _lr_config(data, out, data_extra=NO_VALIDATION, **train_keys):
    train_keys = {"batch_size": 256, "log_every": 1000, "deterministic": True, **train_keys}
    path = data["root"] / f"{Path(out).name}.toml"
    return write_run_config(path, data, out, {"type": "lr"}, train_keys, data_extra=data_extra)


def test_ftrl_and_adagrad_are_made_with_their_settings():
    ftrl = make_optimizer("ftrl", 0.1, l1=0.01, l2=0.02, initial_accumulator=0.5)
    assert type(ftrl).__name__ == "Ftrl"
    cfg = ftrl.get_config()
    assert cfg["learning_rate_power"] == -0.5
    assert cfg["initial_accumulator_value"] == 0.5
    assert cfg["l1_regularization_strength"] == pytest.approx(0.01)
    assert cfg["l2_regularization_strength"] == pytest.approx(0.02)
    adagrad = make_optimizer("adagrad", 0.1)
    assert adagrad.get_config()["initial_accumulator_value"] == pytest.approx(0.1)
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    assert type(make_optimizer("ftrl", schedule)).__name__ == "Ftrl"
    with pytest.raises(ConfigError, match=r"optimizer 'adam': l1=0.1 .* FTRL's"):
        make_optimizer("adam", 0.1, l1=0.1)
    with pytest.raises(ConfigError, match="must be >= 0"):
        make_optimizer("ftrl", 0.1, l2=-1.0)


def test_an_lr_config_without_optimizer_gets_the_linear_defaults(tiny_data):
    # _lr_config sets batch_size = 256 and no validation split: the usual single epoch
    cfg = load_config(_lr_config(tiny_data, tiny_data["root"] / "a"))
    assert cfg.train.optimizer == LINEAR_TRAIN_DEFAULTS["optimizer"] == "auto"
    assert cfg.train.learning_rate == LINEAR_TRAIN_DEFAULTS["learning_rate"] == 0.1
    assert cfg.train.epochs == 1
    stops = write_run_config(
        tiny_data["root"] / "s.toml", tiny_data, tiny_data["root"] / "s", {"type": "lr"}, {}
    )
    assert (load_config(stops).train.batch_size, load_config(stops).train.epochs) == (256, 60)
    keys = {"epochs": 3, "batch_size": 64}
    own = write_run_config(
        tiny_data["root"] / "o.toml", tiny_data, tiny_data["root"] / "o", {"type": "lr"}, keys
    )
    t = load_config(own).train
    assert (t.optimizer, t.batch_size, t.epochs) == ("auto", 64, 3)  # a key the file sets wins
    given = load_config(_lr_config(tiny_data, tiny_data["root"] / "b", optimizer="adam"))
    assert (given.train.optimizer, given.train.learning_rate) == ("adam", 1e-3)
    # a rate given alone is the usual optimizer's (Adam), never reinterpreted for FTRL
    rate = load_config(_lr_config(tiny_data, tiny_data["root"] / "c", learning_rate=0.5))
    assert (rate.train.optimizer, rate.train.learning_rate) == ("adam", 0.5)
    path = write_run_config(
        tiny_data["root"] / "d.toml", tiny_data, tiny_data["root"] / "d", {"type": "dnn"}, {}
    )
    assert load_config(path).train.optimizer == "adam"  # other models keep the usual defaults


def test_linear_train_defaults_bound_epochs_only_where_early_stopping_ends_the_run():
    defaults = {"optimizer": "auto", "learning_rate": 0.1, "batch_size": 256}
    assert defaults == LINEAR_TRAIN_DEFAULTS and LINEAR_EPOCHS_BOUND == 60
    stopping = {**defaults, "epochs": 60}
    assert linear_train_defaults({}, {}, distributed=False) == stopping
    assert linear_train_defaults({}, {"validation": ["v"]}, False) == stopping
    assert linear_train_defaults({}, {"validation_fraction": 0.0}, False) == defaults
    assert linear_train_defaults({"early_stopping": False}, {}, False) == defaults
    assert linear_train_defaults({}, {}, distributed=True) == defaults
    # FTRL named: its rate and batch size still; another optimizer or a rate: nothing
    assert linear_train_defaults({"optimizer": "ftrl"}, {}, False) == stopping
    assert linear_train_defaults({"optimizer": "adagrad"}, {}, False) == {}
    assert linear_train_defaults({"learning_rate": 0.1}, {}, False) == {}


@pytest.mark.parametrize("optimizer", ["ftrl", "adagrad"])
def test_resumed_run_restores_the_optimizer_slots(tiny_data, optimizer):
    # 4,000 rows / 256 -> 16 steps per epoch. Resumed: 1 epoch, then a second from the
    # checkpoint; the weights match the uninterrupted 2 epochs only if the accumulators
    # (Ftrl's accumulator and linear slots, Adagrad's accumulator) came back too.
    root = tiny_data["root"]
    keys = {"optimizer": optimizer, "learning_rate": 0.1, "checkpoint_every": 8}
    straight = train(load_config(_lr_config(tiny_data, root / "straight", epochs=2, **keys)))
    resumed_cfg = load_config(_lr_config(tiny_data, root / "resumed", epochs=1, **keys))
    first = train(resumed_cfg)
    assert first["steps"] == 16
    resumed = train(
        dataclasses.replace(resumed_cfg, train=dataclasses.replace(resumed_cfg.train, epochs=2))
    )
    assert resumed["steps"] == 32 and resumed["steps_this_run"] == 16
    a, _, _ = load_trained_model(root / "straight")
    b, _, _ = load_trained_model(root / "resumed")
    for x, y in zip(a.weights, b.weights, strict=True):
        np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-6, atol=1e-7)
    assert resumed["test"]["auc"] == pytest.approx(straight["test"]["auc"], abs=1e-9)
    # without the slots a fresh optimizer differs: the checkpoint holds them
    reader = tf.train.load_checkpoint(
        str(tf.train.latest_checkpoint(str(root / "resumed" / "checkpoints")))
    )
    slots = [n for n in reader.get_variable_to_shape_map() if "optimizer" in n.lower()]
    assert any("accumulator" in n.lower() for n in slots) or len(slots) > 2, slots


def _linear_problem(root: Path, rows: int = 6000, seed: int = 3) -> dict[str, Path]:
    """Two categorical fields and one numeric feature with a planted linear logit."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 30, rows)
    b = rng.integers(0, 12, rows)
    x = rng.normal(size=rows).astype(np.float32)
    wa, wb = rng.normal(0, 0.8, 30), rng.normal(0, 0.8, 12)
    logit = -0.4 + wa[a] + wb[b] + 0.7 * x
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    table = pa.table(
        {
            "a": pa.array([f"a{v}" for v in a]),
            "b": pa.array([f"b{v}" for v in b]),
            "x": pa.array(x),
            "label": pa.array(label),
        }
    )
    kinds = {"a": "categorical", "b": "categorical", "x": "numeric", "label": "label"}
    return write_split_problem(root, table, kinds, rows * 3 // 4)


def _sklearn_auc(data: dict[str, Path]) -> float:
    tr, te = (pq.read_table(data[k]).to_pandas() for k in ("train", "test"))
    enc = OneHotEncoder(handle_unknown="ignore").fit(tr[["a", "b"]])

    def features(df):
        return np.hstack([enc.transform(df[["a", "b"]]).toarray(), df[["x"]].to_numpy()])

    model = LogisticRegression(C=1.0, max_iter=1000).fit(features(tr), tr["label"])
    return roc_auc_score(te["label"], model.decision_function(features(te)))


def test_lr_with_the_linear_defaults_matches_sklearn_on_a_linear_problem(tmp_path):
    data = _linear_problem(tmp_path)
    cfg = load_config(
        _lr_config(
            data,
            tmp_path / "run",
            data_extra="validation_fraction = 0.1",
            epochs=10,
            optimizer="ftrl",
        )
    )
    assert (cfg.train.optimizer, cfg.train.learning_rate, cfg.train.batch_size) == (
        "ftrl",
        0.1,
        256,
    )
    report = train(cfg, log=lambda _: None)
    assert report["test"]["auc"] == pytest.approx(_sklearn_auc(data), abs=0.01)
