"""Validation-driven training: the validation split, early stopping, the best checkpoint (what
export loads), the test set scored once, and the selection state and history across resumes."""

from __future__ import annotations

import dataclasses
import json
import signal
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from features import convert
from features.schema import load_schema
from features.stats import DatasetStats
from pipelines.config import ConfigError, load_config
from pipelines.run.data import prepare_data
from pipelines.run.model import load_trained_model
from pipelines.run.paths import RunPaths
from pipelines.run.scoring import make_scorer, predict
from pipelines.run.selection import HISTORY_FILE
from pipelines.train import train
from ranking import metrics
from tests.pipelines.test_train import _checkpoint_step, _cli, _config, _train_cli
from tests.testdata import TINY_SCHEMA, make_tiny_table, write_tiny_dataset


def _prices(files: list[Path]) -> set[tuple]:
    """The rows of ``files`` as (price, age, user, item) tuples (unique per row here)."""
    out = set()
    for f in files:
        t = pq.read_table(f).to_pydict()
        out |= set(zip(t["price"], t["age"], t["user"], t["item"], strict=True))
    return out


def test_validation_split_is_disjoint_from_train_and_test(tiny_data):
    cfg = load_config(_config(tiny_data, tiny_data["root"] / "run", data_extra=""))
    assert cfg.data.validation_fraction == 0.1  # the default
    paths = RunPaths(Path(cfg.output_dir))
    _, train_files, val_files, test_files = prepare_data(cfg, paths, lambda _: None)
    assert {f.parent.name for f in train_files} == {"train"}
    assert [f.parent for f in val_files] == [paths.data / "validation"]
    train_rows, val_rows, test_rows = (_prices(f) for f in (train_files, val_files, test_files))
    assert train_rows.isdisjoint(val_rows) and train_rows.isdisjoint(test_rows)
    assert val_rows.isdisjoint(test_rows)
    given = _prices(sorted(Path(tiny_data["train"]).glob("*.parquet")))
    assert len(given) == 4000 and train_rows | val_rows == given
    assert 300 < len(val_rows) < 500  # ~10% of the training rows

    # the statistics are the training rows' only
    train(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=1)), print)
    assert DatasetStats.load(paths.stats).rows == len(train_rows)


def test_raw_split_validation_is_a_fraction_of_the_training_rows(tmp_path):
    schema = load_schema_text(tmp_path)
    t = make_tiny_table(20_000, seed=3)
    pq.write_table(t, tmp_path / "all.parquet")
    out = convert.convert(
        schema, tmp_path / "all.parquet", tmp_path / "out", test_fraction=0.2,
        validation_fraction=0.25, seed=5,
    )  # fmt: skip
    rows = {k: _prices(v) for k, v in out.items()}
    assert sum(len(v) for v in rows.values()) == 20_000
    assert rows["train"].isdisjoint(rows["validation"]) and rows["test"].isdisjoint(
        rows["validation"]
    )
    assert rows["train"].isdisjoint(rows["test"])
    assert abs(len(rows["test"]) - 4000) < 200
    assert abs(len(rows["validation"]) - 4000) < 200  # 0.25 of the 16,000 training rows
    # the test split is the one without validation: adding validation never moves a test row
    plain = convert.convert(
        schema, tmp_path / "all.parquet", tmp_path / "p", test_fraction=0.2, seed=5
    )
    assert _prices(plain["test"]) == rows["test"]


def load_schema_text(root: Path):
    (root / "schema.toml").write_text(TINY_SCHEMA)
    return load_schema(root / "schema.toml")


def test_explicit_validation_files_and_config_errors(tiny_data, tmp_path):
    val = tmp_path / "val"
    val.mkdir()
    pq.write_table(make_tiny_table(300, seed=9), val / "v.parquet")
    extra = f'validation = ["{val}"]'
    cfg = load_config(_config(tiny_data, tiny_data["root"] / "explicit", data_extra=extra))
    data = prepare_data(cfg, RunPaths(Path(cfg.output_dir)), lambda _: None)
    assert data.validation == [val / "v.parquet"] and len(_prices(data.train)) == 4000
    with pytest.raises(ConfigError, match="validation_fraction must be in"):
        load_config(_config(tiny_data, tmp_path / "bad", data_extra="validation_fraction = 1.0"))
    with pytest.raises(ConfigError, match="select_metric"):
        load_config(_config(tiny_data, tmp_path / "bad", select_metric="ndcg"))
    with pytest.raises(ConfigError, match="patience must be >= 1"):
        load_config(_config(tiny_data, tmp_path / "bad", patience=0))
    no_val = load_config(_config(tiny_data, tmp_path / "noval", early_stopping=True))
    with pytest.raises(ConfigError, match="early_stopping = true needs a validation split"):
        train(no_val, lambda _: None)


def _scores(model, schema, files):
    return predict(make_scorer(model, schema), schema, files)[1]


def test_early_stopping_keeps_and_exports_the_best_checkpoint(tiny_data):
    config = _config(
        tiny_data,
        tiny_data["root"] / "es",
        epochs=10,
        data_extra="",
        patience=1,
        learning_rate=0.05,
    )
    cfg = load_config(config)
    lines: list[str] = []
    report = train(cfg, log=lines.append)
    sel, history = report["selection"], report["epochs"]
    assert sel["early_stopping"] and sel["stopped_early"]
    steps_per_epoch = -(-report["train_rows"] // 256)
    assert report["steps"] < 10 * steps_per_epoch  # fewer epochs ran than were asked
    assert len(history) < 10 and history[-1]["step"] == report["steps"]
    best = max(history, key=lambda e: e["auc"])
    assert sel["best"] == {"auc": best["auc"], "step": best["step"], "epoch": best["epoch"]}
    assert sel["evaluations_since_best"] == 1
    assert report["selected"]["step"] == best["step"]
    assert (
        report["selected"]["reason"]
        == f"best validation auc = {best['auc']:.4f} at step {best['step']}"
    )
    # the test set is scored once, on the selected checkpoint; the history is validation only
    assert sum(line.startswith("test auc") for line in lines) == 1
    assert f"on the checkpoint of step {best['step']}" in next(
        line for line in lines if line.startswith("test auc")
    )
    assert all(set(e) == {"epoch", "step", "rows", "auc", "logloss", "best"} for e in history)
    assert all(e["rows"] == report["validation_rows"] for e in history)

    # export loads the best checkpoint: its scores are the best checkpoint's, not the last's
    paths = RunPaths(Path(cfg.output_dir))
    model, schema, ckpt = load_trained_model(cfg.output_dir)
    assert (
        ckpt
        == report["selected"]["checkpoint"]
        == str(paths.checkpoints / "best" / f"ckpt-{best['step']}")
    )
    test_files = sorted(Path(tiny_data["test"]).glob("*.parquet"))
    exported = _scores(model, schema, test_files)
    last = tf.train.latest_checkpoint(str(paths.checkpoints))
    assert last.endswith(f"ckpt-{report['steps']}") and last != ckpt
    tf.train.Checkpoint(model=model).restore(last).expect_partial()
    assert not np.allclose(_scores(model, schema, test_files), exported)
    tf.train.Checkpoint(model=model).restore(ckpt).expect_partial()
    np.testing.assert_array_equal(_scores(model, schema, test_files), exported)
    y = pq.read_table(test_files[0]).column("label").to_numpy()
    assert metrics.auc(y, exported) == pytest.approx(report["test"]["auc"], abs=1e-9)


def test_history_is_kept_across_resumes(tiny_data):
    config = _config(
        tiny_data,
        tiny_data["root"] / "hist",
        epochs=2,
        data_extra="",
        early_stopping=False,
        eval_every=10,
    )
    cfg = load_config(config)
    first = train(cfg, lambda _: None)
    spe = -(-first["train_rows"] // 256)
    steps_first = sorted({10, 20, spe, 2 * spe} - {0})
    assert [e["step"] for e in first["epochs"]] == steps_first
    more = train(
        dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=3)), lambda _: None
    )
    steps = [e["step"] for e in more["epochs"]]
    assert steps[: len(steps_first)] == steps_first and steps[-1] == 3 * spe
    assert [e["epoch"] for e in more["epochs"]][-1] == 3
    lines = (Path(cfg.output_dir) / HISTORY_FILE).read_text().splitlines()
    assert [json.loads(line) for line in lines] == more["epochs"]
    assert not more["selection"]["stopped_early"] and more["selection"]["early_stopping"] is False


@pytest.mark.slow
def test_sigkill_then_resume_keeps_the_early_stopping_state(tmp_path):
    data = write_tiny_dataset(tmp_path, rows=44_000, train_rows=40_000, seed=1)
    opts = {"batch": 64, "epochs": 3, "ckpt": 35, "data_extra": "", "eval_every": 60, "patience": 2}
    killed = tmp_path / "killed"
    proc = _cli(_config(data, killed, **opts))
    history = killed / HISTORY_FILE
    deadline = time.time() + 240
    while not history.exists() or len(history.read_text().splitlines()) < 2:
        if proc.poll() is not None:
            pytest.fail(f"training ended before it could be killed:\n{proc.stdout.read()}")
        if time.time() > deadline:
            proc.kill()
            pytest.fail("no second validation evaluation within 240 s")
        time.sleep(0.02)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    saved = _checkpoint_step(killed)
    resumed = _train_cli(_config(data, killed, **opts))
    assert "resumed from" in resumed
    straight = tmp_path / "straight"  # in this process: the CLI is the killed run's
    train(load_config(_config(data, straight, **opts)), lambda _: None)
    a, b = (json.loads((r / "train_report.json").read_text()) for r in (killed, straight))
    assert a["selection"] == b["selection"] and a["selected"]["step"] == b["selected"]["step"]
    assert a["steps"] == b["steps"] and a["selection"]["stopped_early"]
    assert saved < a["steps"] and f"at step {saved} " in resumed  # killed before it stopped
    assert a["steps_this_run"] == a["steps"] - saved
    assert [(e["step"], e["best"]) for e in a["epochs"]] == [
        (e["step"], e["best"]) for e in b["epochs"]
    ]
    np.testing.assert_allclose(
        [e["auc"] for e in a["epochs"]], [e["auc"] for e in b["epochs"]], atol=1e-6
    )
    assert a["test"]["auc"] == pytest.approx(b["test"]["auc"], abs=1e-6)
    print(a["selection"], a["steps"], len(a["epochs"]))
