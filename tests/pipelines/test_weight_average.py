"""``[train] weight_average = "ema"``: the moving average of the weights (hand-computed), its
swap in and out, and in ``stitchrec train``: validation, the best checkpoint and the test read the
average, the regular checkpoint keeps the trained weights and the average, and a run stopped
mid-way resumes to the uninterrupted run's weights bit for bit."""

from __future__ import annotations

import json
import shutil
import types

import numpy as np
import pytest
import tensorflow as tf  # tests/conftest.py sets TF_USE_LEGACY_KERAS first

from pipelines.config import ConfigError, TrainConfig, load_config
from pipelines.run.averaging import WeightAverage
from pipelines.run.model import BEST_DIR, load_trained_model, restore_run_model
from pipelines.run.paths import RunPaths
from pipelines.run.scoring import evaluate_model, make_scorer
from pipelines.train import _check_needs_validation, train
from tests.testdata import write_run_config, write_tiny_dataset

MODEL = {"type": "dcn_v2", "embedding_dim": 4, "mlp": [8], "cross_layers": 1}
TRAIN = {
    "batch_size": 128,
    "epochs": 3,
    "learning_rate": 0.05,
    "log_every": 1000,
    "deterministic": True,
    "patience": 10,
    "weight_average": "ema",
    "ema_decay": 0.9,
}


def _dense(w: float) -> tf.keras.Model:
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, use_bias=False)])
    model.build((None, 1))
    model.layers[0].kernel.assign([[w]])
    return model


def test_update_follows_the_warm_up_rule():
    model = _dense(1.0)
    average = WeightAverage(model, decay=0.5)
    kernel = model.layers[0].kernel
    expected = 1.0
    for n, w in enumerate([3.0, -2.0, 5.0, 7.0]):
        kernel.assign([[w]])
        average.update()
        d = min(0.5, (1 + n) / (10 + n))  # 0.1, 0.1818.., 0.25, 0.3077..: then 0.5 from n = 8
        expected = d * expected + (1 - d) * w
        np.testing.assert_allclose(average.averages[0].numpy(), [[expected]], rtol=1e-6)
    assert int(average.updates) == 4
    assert average.describe() == {"method": "ema", "decay": 0.5, "updates": 4}


def test_swapped_holds_the_average_inside_and_the_trained_weights_after():
    model = _dense(2.0)
    average = WeightAverage(model, decay=0.9)
    average.averages[0].assign([[-4.0]])
    with average.swapped():
        assert float(model.layers[0].kernel[0, 0]) == -4.0
    assert float(model.layers[0].kernel[0, 0]) == 2.0
    assert float(average.averages[0][0, 0]) == -4.0


@pytest.mark.parametrize("decay", [0.0, 1.0, 1.5])
def test_a_decay_outside_0_1_is_refused(decay):
    with pytest.raises(ValueError, match=f"decay must be in \\(0, 1\\), got {decay}"):
        WeightAverage(_dense(1.0), decay)


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"weight_average": "swa"}, "weight_average 'swa' is not one of ['none', 'ema']"),
        ({"weight_average": "ema", "ema_decay": 1.0}, "ema_decay must be in (0, 1), got 1.0"),
        (
            {"weight_average": "ema", "ensemble": "auto"},
            "weight_average = 'ema' with ensemble = 'auto'",
        ),
    ],
)
def test_config_errors_name_the_key(kw, words):
    with pytest.raises(ConfigError) as e:
        TrainConfig(**kw)
    assert words in str(e.value)


def _run(active: bool, validation: list[str]) -> types.SimpleNamespace:
    cfg = types.SimpleNamespace(train=TrainConfig(weight_average="ema"))
    dist = types.SimpleNamespace(active=active)
    return types.SimpleNamespace(cfg=cfg, dist=dist, validation_files=validation)


def test_under_a_distribution_strategy_is_a_config_error():
    with pytest.raises(ConfigError, match="weight_average = 'ema': not available under a distr"):
        _check_needs_validation(_run(True, ["v.parquet"]))


def test_without_a_validation_split_is_a_config_error():
    with pytest.raises(ConfigError, match="weight_average = 'ema' needs a validation split"):
        _check_needs_validation(_run(False, []))
    _check_needs_validation(_run(False, ["v.parquet"]))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("weight_average")
    data = write_tiny_dataset(root, rows=3000, train_rows=2400)
    report = train(load_config(write_run_config(root / "c.toml", data, root / "run", MODEL, TRAIN)))
    return {"root": root, "data": data, "dir": root / "run", "report": report}


def _averages(prefix: str) -> list[np.ndarray]:
    reader = tf.train.load_checkpoint(prefix)
    key = "weight_average/averages/{}/.ATTRIBUTES/VARIABLE_VALUE"
    count = sum(1 for name, _ in tf.train.list_variables(prefix) if name.startswith(key[:24]))
    return [reader.get_tensor(key.format(i)) for i in range(count)]


def test_the_best_checkpoint_holds_the_average_and_the_regular_one_both(run):
    report, paths = run["report"], RunPaths(run["dir"])
    assert report["weight_average"] == {"method": "ema", "decay": 0.9, "updates": report["steps"]}
    best_step = report["selected"]["step"]
    schema = load_trained_model(run["dir"])[1]
    best = restore_run_model(paths, report["selected"]["checkpoint"], schema)
    regular_prefix = str(paths.checkpoints / f"ckpt-{best_step}")
    trained = restore_run_model(paths, regular_prefix, schema)
    averages = _averages(regular_prefix)
    assert len(averages) == len(best.trainable_variables) > 0
    for b, a in zip(best.trainable_variables, averages, strict=True):
        np.testing.assert_array_equal(b.numpy(), a)
    assert any(
        not np.array_equal(b.numpy(), t.numpy())
        for b, t in zip(best.trainable_variables, trained.trainable_variables, strict=True)
    )


def test_validation_and_test_scores_read_the_average(run):
    report = run["report"]
    model, schema, _ = load_trained_model(run["dir"])
    scorer = make_scorer(model, schema)
    best = next(e for e in report["epochs"] if e["step"] == report["selected"]["step"])
    validation = sorted((run["dir"] / "data" / "validation").glob("*.parquet"))
    assert evaluate_model(scorer, schema, validation)["auc"] == pytest.approx(best["auc"], abs=1e-6)
    test = [p for p in map(str, report["test_files"])]
    assert evaluate_model(scorer, schema, test)["auc"] == pytest.approx(
        report["test"]["auc"], abs=1e-6
    )


class _Stop(Exception):
    pass


def test_a_stopped_run_resumes_to_the_same_average(run):
    """Stopped at the second validation line (before that step's checkpoint), the run resumes
    from the first epoch's checkpoint, the average included, and ends where the uninterrupted
    run ended, bit for bit."""
    path = write_run_config(
        run["root"] / "r.toml", run["data"], run["root"] / "resumed", MODEL, TRAIN
    )

    def stop_at_second_validation(line: str) -> None:
        if line.startswith("epoch 2 step") and "validation auc" in line:
            raise _Stop(line)

    with pytest.raises(_Stop):
        train(load_config(path), log=stop_at_second_validation)
    lines: list[str] = []
    report = train(load_config(path), log=lines.append)
    assert any(line.startswith("resumed from") for line in lines)
    assert report["selected"]["step"] == run["report"]["selected"]["step"]
    assert report["test"]["auc"] == run["report"]["test"]["auc"]
    resumed = load_trained_model(run["root"] / "resumed")[0]
    original = load_trained_model(run["dir"])[0]
    for a, b in zip(resumed.trainable_variables, original.trainable_variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    last = report["checkpoint"]
    assert last.endswith(f"ckpt-{report['steps']}")
    resumed_averages, averages = _averages(last), _averages(run["report"]["checkpoint"])
    assert len(resumed_averages) == len(averages) == len(original.trainable_variables)
    for a, b in zip(resumed_averages, averages, strict=True):
        np.testing.assert_array_equal(a, b)
    assert (
        json.loads((run["root"] / "resumed" / "train_report.json").read_text())["steps"]
        == (run["report"]["steps"])
    )


def test_a_best_checkpoint_lost_by_a_kill_is_saved_again_with_the_average(run):
    """A run killed between its regular and its best checkpoint (here: the best one removed)
    saves the best one again at the resume: from the average the regular checkpoint holds."""
    one_epoch = {**TRAIN, "epochs": 1}  # one evaluation: the best step is the last one
    path = write_run_config(
        run["root"] / "k.toml", run["data"], run["root"] / "k", MODEL, one_epoch
    )
    first = train(load_config(path), log=lambda _: None)
    paths = RunPaths(run["root"] / "k")
    shutil.rmtree(paths.checkpoints / BEST_DIR)
    again = train(load_config(path), log=lambda _: None)
    assert again["selected"]["step"] == first["selected"]["step"] == first["steps"]
    best = load_trained_model(paths.root)[0]
    averages = _averages(str(paths.checkpoints / f"ckpt-{first['steps']}"))
    for b, a in zip(best.trainable_variables, averages, strict=True):
        np.testing.assert_array_equal(b.numpy(), a)
    assert again["test"]["auc"] == first["test"]["auc"]
