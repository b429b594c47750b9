"""``[train] ensemble = "auto"`` in ``stitchrec train``: snapshots at the cyclic schedule's low
points, collection ended by saturation, members chosen on validation, the ensemble scored once
on test, exported by ``stitchrec export`` as one SavedModel; a resumed run collects the same."""

from __future__ import annotations

import json
import math
import types

import numpy as np
import pyarrow.parquet as pq
import pytest
import tensorflow as tf  # tests/conftest.py sets TF_USE_LEGACY_KERAS first

from features.dataset import field_tf_dtype
from features.schema import load_schema
from pipelines.cli import main
from pipelines.config import ConfigError, TrainConfig, load_config
from pipelines.export import load_checkpoint_model
from pipelines.run import ensemble as E
from pipelines.run.snapshots import check_ensemble, ensemble_options, run_schedule
from pipelines.train import _check_needs_validation, train
from ranking import metrics
from tests.testdata import write_run_config, write_tiny_dataset

BATCH = 128
SNAPSHOTS = 3
MODEL = {"type": "dcn_v2", "embedding_dim": 4, "mlp": [8], "cross_layers": 1}
TRAIN = {
    "batch_size": BATCH,
    "epochs": 6,
    "learning_rate": 0.05,
    "log_every": 1000,
    "deterministic": True,
    "ensemble": "auto",
}
OPTIONS = f"[train.ensemble_options]\nmax_snapshots = {SNAPSHOTS}\npatience = 5\n"


def _config(root, data, name):
    return write_run_config(root / f"{name}.toml", data, root / name, MODEL, TRAIN, OPTIONS)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ensemble_train")
    data = write_tiny_dataset(root, rows=3000, train_rows=2000)
    lines: list[str] = []
    train(load_config(_config(root, data, "run")), log=lines.append)
    run_dir = root / "run"
    report = json.loads((run_dir / "train_report.json").read_text())
    return {"root": root, "data": data, "dir": run_dir, "report": report, "log": lines}


def test_snapshots_at_each_cycles_low_point_until_saturation(run):
    report = run["report"]
    cycle = math.ceil(report["train_rows"] / BATCH)  # one cycle per epoch by default
    assert report["learning_rate"]["schedule"] == "cyclic"
    assert report["learning_rate"]["options"] == {"cycle_steps": cycle}
    entries = E.read_snapshots(run["dir"])
    assert [e["step"] for e in entries] == [cycle * (k + 1) for k in range(SNAPSHOTS)]
    # max_snapshots ended the collection, and with it the run: 3 of the 6 epochs
    assert report["steps"] == SNAPSHOTS * cycle
    assert report["ensemble"]["collection"]["stopped"] is True
    assert any("snapshots saturated; training ends at step" in line for line in run["log"])
    # early stopping is off by default in an ensemble run (the selection still keeps the best)
    assert report["selection"]["early_stopping"] is False


def test_members_are_chosen_on_validation_and_written_for_export(run):
    report, run_dir = run["report"], run["dir"]
    entries = E.read_snapshots(run_dir)
    chosen = json.loads((run_dir / "snapshots" / "ensemble.json").read_text())
    assert chosen["combine"] == "logits"
    assert chosen["members"] == report["ensemble"]["checkpoints"]
    # the same greedy selection over the snapshots' validation logits, recomputed here
    schema = load_schema(run_dir / "schema.toml")
    val = sorted((run_dir / "data" / "validation").glob("*.parquet"))
    labels = np.concatenate([pq.read_table(f)[schema.label.name].to_numpy() for f in val])
    selection = E.select_members(labels, E.snapshot_logits(run_dir, entries))
    assert [entries[i]["checkpoint"] for i in selection.members] == chosen["members"]
    assert report["ensemble"]["selection"]["members"] == selection.members


def _test_rows(run) -> tuple[dict[str, np.ndarray], np.ndarray]:
    schema = load_schema(run["dir"] / "schema.toml")
    table = pq.read_table(run["data"]["test"] / "part-00000.parquet").to_pydict()
    feats = {}
    for f in schema.model_inputs:
        dtype = field_tf_dtype(f)
        np_dtype = object if dtype == tf.string else dtype.as_numpy_dtype
        feats[f.name] = np.array(table[f.name], np_dtype)
    return feats, np.array(table[schema.label.name], np.float64)


def test_export_serves_the_ensemble_and_its_test_auc_is_the_reported_one(run, capsys):
    out = run["root"] / "exported"
    assert main(["export", "--run", str(run["dir"]), "--output", str(out)]) == 0
    assert "ensemble of" in capsys.readouterr().out
    meta = json.loads((out / "assets.extra" / "stitchrec.json").read_text())
    members = run["report"]["ensemble"]["checkpoints"]
    assert meta["ensemble"] == {"combine": "logits", "members": members}
    feats, labels = _test_rows(run)
    sig = tf.saved_model.load(str(out)).signatures["serving_default"]
    got = sig(**{k: tf.constant(v) for k, v in feats.items()})
    expect = np.mean(
        [load_checkpoint_model(run["dir"], m)(feats, training=False).numpy() for m in members],
        axis=0,
    )
    np.testing.assert_allclose(got["logit"].numpy(), expect, rtol=1e-5, atol=1e-5)
    test = run["report"]["ensemble"]["test"]
    assert test["rows"] == labels.size
    assert metrics.auc(labels, got["score"].numpy()) == pytest.approx(test["auc"], abs=1e-6)


def test_export_single_exports_the_selected_checkpoint(run):
    out = run["root"] / "single"
    assert main(["export", "--run", str(run["dir"]), "--output", str(out), "--single"]) == 0
    meta = json.loads((out / "assets.extra" / "stitchrec.json").read_text())
    assert "ensemble" not in meta
    assert meta["checkpoint"] == run["report"]["selected"]["checkpoint"]


def test_export_with_fused_kernels_of_an_ensemble_is_a_usage_error(run, capsys):
    argv = ["export", "--run", str(run["dir"]), "--fuse-kernels", "--output", "x"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: export --fuse-kernels / --fuse: not available for the ensemble" in err


class _Interrupted(Exception):
    pass


def test_interrupted_run_resumes_to_the_same_snapshots_and_members(run):
    """Stopped right after snapshot 1 is written (before the checkpoint of its step), the run
    resumes from the checkpoint before it, forgets snapshot 1, retakes it and ends with the
    uninterrupted run's snapshots (bitwise: deterministic) and members."""
    cfg = load_config(_config(run["root"], run["data"], "resumed"))

    def stop_at_second_snapshot(line: str) -> None:
        if line.startswith("ensemble: snapshot 1 "):
            raise _Interrupted(line)

    with pytest.raises(_Interrupted):
        train(cfg, log=stop_at_second_snapshot)
    resumed_dir = run["root"] / "resumed"
    assert [e["index"] for e in E.read_snapshots(resumed_dir)] == [0, 1]
    lines: list[str] = []
    train(cfg, log=lines.append)
    assert any("1 snapshot(s) of the killed run kept" in line for line in lines)
    before, after = E.read_snapshots(run["dir"]), E.read_snapshots(resumed_dir)
    assert [e["step"] for e in after] == [e["step"] for e in before]
    np.testing.assert_array_equal(
        E.snapshot_logits(resumed_dir, after), E.snapshot_logits(run["dir"], before)
    )
    chosen = json.loads((resumed_dir / "snapshots" / "ensemble.json").read_text())
    assert chosen["members"] == run["report"]["ensemble"]["checkpoints"]


def _train_config(**kw) -> TrainConfig:
    return TrainConfig(**{"ensemble": "auto", **kw})


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"ensemble": "bagging"}, "[train] ensemble = 'bagging': expected one of"),
        ({"lr_schedule": "cosine"}, "lr_schedule = 'cosine' cannot be used with it"),
        ({"ensemble_options": {"members": 3}}, "has no key 'members'"),
        ({"ensemble_options": {"patience": 0}}, "patience = 0: expected an integer >= 1"),
        ({"ensemble_options": {"patience": "2"}}, "patience = '2': expected int"),
        ({"ensemble_options": {"metric": "mse"}}, "metric = 'mse': expected one of"),
        ({"ensemble_options": {"stop_at_saturation": 1}}, "expected bool"),
        ({"ensemble": "none", "ensemble_options": {"patience": 3}}, "ensemble = 'none'"),
        (
            {"lr_schedule": "cyclic", "lr_schedule_options": {"min_lr": -1.0}},
            "min_lr = -1.0",
        ),
    ],
)
def test_ensemble_config_errors_name_the_key(kw, words):
    with pytest.raises(ConfigError) as e:
        check_ensemble(_train_config(**kw))
    assert words in str(e.value)


def test_run_schedule_cycles_default_to_one_epoch_and_need_two():
    assert run_schedule(_train_config(), 10, 40) == ("cyclic", {"cycle_steps": 10})
    opts = {"cycle_steps": 5, "min_lr": 1e-4}
    tc = _train_config(lr_schedule="cyclic", lr_schedule_options=opts)
    assert run_schedule(tc, 10, 40) == ("cyclic", opts)
    assert run_schedule(TrainConfig(lr_schedule="cosine"), 10, 40) == ("cosine", {})
    with pytest.raises(ConfigError, match="1 cycle\\(s\\) of 10 steps; an ensemble needs"):
        run_schedule(_train_config(), 10, 19)
    assert ensemble_options(_train_config())["combine"] == "logits"


def test_ensemble_run_without_validation_split_is_a_config_error(tmp_path):
    data = write_tiny_dataset(tmp_path, rows=600, train_rows=500)
    path = write_run_config(
        tmp_path / "c.toml",
        data,
        tmp_path / "r",
        MODEL,
        TRAIN,
        data_extra="validation_fraction = 0.0",
    )
    with pytest.raises(ConfigError, match="ensemble = 'auto' needs a validation split"):
        train(load_config(path), log=lambda _: None)


def test_ensemble_under_a_distribution_strategy_is_a_config_error():
    cfg = types.SimpleNamespace(train=_train_config())
    run = types.SimpleNamespace(
        cfg=cfg, dist=types.SimpleNamespace(active=True), validation_files=["v.parquet"]
    )
    with pytest.raises(ConfigError, match="ensemble = 'auto': not available under a distrib"):
        _check_needs_validation(run)
