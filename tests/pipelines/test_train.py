"""End to end: train from a config, resume after SIGKILL, export, score in a fresh process."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from pipelines.config import ConfigError, load_config
from pipelines.export import export_run
from pipelines.run.model import load_trained_model
from pipelines.run.paths import RunPaths
from pipelines.run.scoring import make_scorer, predict
from pipelines.train import train
from tests.shared_runs import SharedRun, copy_run, shared_run
from tests.testdata import NO_VALIDATION, run_config_text, write_tiny_dataset


def _config(data, out, batch=256, epochs=2, ckpt=5, data_extra=NO_VALIDATION, **train_extra):
    """A DCN-v2 run config over ``data`` writing to ``out`` (the file: ``out`` + ``.toml``);
    by default without a validation split (every training row trains), ``data_extra`` and
    ``train_extra`` add [data] and [train] keys."""
    path = Path(out).parent / f"{Path(out).name}.toml"
    path.write_text(_config_text(data, out, batch, epochs, ckpt, data_extra, **train_extra))
    return path


def _config_text(data, out, batch, epochs, ckpt, data_extra, **train_extra) -> str:
    model = {"type": "dcn_v2", "embedding_dim": 4, "mlp": [32, 16], "cross_layers": 2}
    train = {
        "batch_size": batch,
        "epochs": epochs,
        "learning_rate": 0.01,
        "checkpoint_every": ckpt,
        "log_every": 20,
        "deterministic": True,
        **train_extra,
    }
    return run_config_text(data, out, model, train, data_extra=data_extra)


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory, shared_tiny_data) -> SharedRun:
    """One epoch (16 steps) of ``_config`` on the tiny set, shared: tests copy it to change it."""
    text = _config_text(shared_tiny_data, "run", 256, 1, 5, NO_VALIDATION)
    return shared_run(tmp_path_factory, text)


def test_train_writes_run_and_learns(tiny_data):
    cfg = load_config(_config(tiny_data, tiny_data["root"] / "run"))
    lines: list[str] = []
    report = train(cfg, log=lines.append)
    paths = RunPaths(Path(cfg.output_dir))
    assert report["steps"] == 2 * 16  # 4,000 rows / 256 -> 16 steps per epoch
    assert report["test"]["auc"] > 0.62
    assert json.loads(paths.report.read_text())["steps"] == 32
    for p in (paths.model_json, paths.stats / "stats.json", paths.schema, paths.config):
        assert p.exists(), p
    assert any(paths.tensorboard.glob("events.out.tfevents.*"))
    assert any("step 20/32" in line for line in lines)
    # no validation split: the last checkpoint is scored, and the report says so
    assert report["selection"] is None and report["validation_rows"] == 0
    assert report["selected"]["step"] == 32 and "no validation" in report["selected"]["reason"]
    assert sum(line.startswith("test auc") for line in lines) == 1
    assert report["test_tasks"] is None  # one task: its metrics are `test`
    assert tf.train.latest_checkpoint(str(paths.checkpoints)).endswith("ckpt-32")
    # a second call resumes at the end: nothing more to train
    again = train(cfg, log=lines.append)
    assert again["steps_this_run"] == 0 and again["steps"] == 32
    # [train] may change (one more epoch); [model] or [data] may not
    more = train(
        dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=3)), lines.append
    )
    assert more["steps"] == 48 and more["steps_this_run"] == 16
    other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, type="dnn"))
    with pytest.raises(ConfigError, match=r"holds a run whose \[model\] differ"):
        train(other, log=lines.append)


def _weights(run: Path) -> list[np.ndarray]:
    model, _, _ = load_trained_model(run)
    return [w.numpy() for w in model.weights]


def _cli_args(config: Path) -> list[str]:
    return [sys.executable, "-m", "pipelines.cli", "train", "--config", str(config)]


def _cli(config: Path) -> subprocess.Popen:
    """A training process in the background, its output unbuffered."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        _cli_args(config), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def _train_cli(config: Path) -> str:
    """Trains to the end in a subprocess; returns its output."""
    return subprocess.run(_cli_args(config), capture_output=True, text=True, check=True).stdout


def _checkpoint_step(run: Path) -> int:
    latest = tf.train.latest_checkpoint(str(run / "checkpoints"))
    return int(latest.rsplit("-", 1)[1]) if latest else 0


@pytest.mark.slow
def test_sigkill_then_resume_loses_no_checkpointed_step(tmp_path):
    # 8,000 rows / 64 = 125 steps per epoch, 2 epochs: long enough to kill mid-run.
    data = write_tiny_dataset(tmp_path, rows=9_000, train_rows=8_000, seed=1)
    total = 2 * 125
    killed_run = tmp_path / "killed"
    proc = _cli(_config(data, killed_run, batch=64, epochs=2, ckpt=25))
    deadline = time.time() + 240
    while _checkpoint_step(killed_run) < 50:
        if proc.poll() is not None:
            pytest.fail(f"training ended before it could be killed:\n{proc.stdout.read()}")
        if time.time() > deadline:
            proc.kill()
            pytest.fail("no checkpoint at step >= 50 within 240 s")
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    saved = _checkpoint_step(killed_run)
    assert 50 <= saved < total

    resumed = _train_cli(_config(data, killed_run, batch=64, epochs=2, ckpt=25))
    assert "resumed from" in resumed and f"at step {saved} " in resumed
    report = json.loads((killed_run / "train_report.json").read_text())
    assert report["steps"] == total
    assert report["steps_this_run"] == total - saved

    straight_run = tmp_path / "straight"  # in this process: the CLI is the killed run's
    train(load_config(_config(data, straight_run, batch=64, epochs=2, ckpt=25)), lambda _: None)
    # same data order and deterministic ops: the resumed run ends where the straight one does
    for a, b in zip(_weights(killed_run), _weights(straight_run), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_export_scores_identically_in_a_fresh_process(one_epoch, shared_tiny_data, tmp_path):
    config = copy_run(one_epoch, tmp_path)
    run = config.parent / "run"
    out = export_run(run)
    assert out == run / "export" / "1"
    assert export_run(run).name == "2"
    assert json.loads((out / "assets.extra" / "stats.json").read_text())["rows"] == 4000

    model, schema, _ = load_trained_model(run)
    files = sorted(Path(shared_tiny_data["test"]).glob("*.parquet"))
    _, expected = predict(make_scorer(model, schema), schema, files)

    # one fresh process scores the export, then shows it with saved_model_cli's entry point
    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np, pyarrow.parquet as pq, tensorflow as tf
        from tensorflow.python.tools.saved_model_cli import main
        fn = tf.saved_model.load({str(out)!r}).signatures["serving_default"]
        t = pq.read_table({str(files[0])!r})
        feats = {{
            "user": tf.constant(t.column("user").to_pylist()),
            "item": tf.constant(t.column("item").to_numpy(), tf.int64),
            "tags": tf.constant(t.column("tags").to_pylist()),
            "price": tf.constant(t.column("price").to_numpy(), tf.float32),
            "age": tf.constant(t.column("age").to_numpy(), tf.float32),
        }}
        np.save({str(tmp_path / "scores.npy")!r}, fn(**feats)["score"].numpy())
        sys.argv = ["saved_model_cli", "show", "--all", "--dir", {str(out)!r}]
        sys.exit(main())
        """
    )
    shown = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True
    ).stdout
    np.testing.assert_allclose(np.load(tmp_path / "scores.npy"), expected, atol=1e-6)
    assert "signature_def['serving_default']" in shown
    for name in ("user", "item", "tags", "price", "age", "score"):
        assert f"['{name}']" in shown
    assert "DT_STRING" in shown and "DT_INT64" in shown


def test_evaluate_reads_parquet_shards_and_raw_csv_alike(one_epoch, shared_tiny_data, tmp_path):
    from pipelines.evaluate import evaluate

    run = copy_run(one_epoch, tmp_path / "copy").parent / "run"
    out = export_run(run)
    from_parquet = evaluate(out, [shared_tiny_data["test"]])
    assert from_parquet["rows"] == 1000
    assert from_parquet["auc"] == pytest.approx(one_epoch.report["test"]["auc"], abs=1e-6)

    df = pq.read_table(shared_tiny_data["test"]).to_pandas()
    df.insert(0, "extra_column", "ignored")
    df.to_csv(tmp_path / "test.csv", index=False)
    csv_schema = (
        (shared_tiny_data["root"] / "schema.toml")
        .read_text()
        .replace('format = "parquet"', 'format = "csv"')
    )
    (tmp_path / "csv_schema.toml").write_text(csv_schema)
    from_csv = evaluate(out, [tmp_path / "test.csv"], schema=tmp_path / "csv_schema.toml")
    assert from_csv["rows"] == 1000
    assert from_csv["auc"] == pytest.approx(from_parquet["auc"], abs=1e-6)
    assert from_csv["logloss"] == pytest.approx(from_parquet["logloss"], abs=1e-6)


@pytest.mark.parametrize("input_format", ["parquet", "tfrecord"])
def test_dropout_run_resumed_from_a_checkpoint_is_bitwise_the_uninterrupted_run(
    tiny_data, input_format
):
    """Dropout masks come from the step, not from a random state the checkpoint lacks, and
    either input skips exactly the trained batches of the epoch: a run stopped at step 11 and
    resumed (fresh objects, the checkpoint restored) ends bitwise where the straight run ends."""
    root = tiny_data["root"]

    def cfg(out, **extra):
        data_extra = f'{NO_VALIDATION}\ninput_format = "{input_format}"'
        path = _config(tiny_data, root / out, data_extra=data_extra, **extra)
        path.write_text(
            path.read_text().replace("cross_layers = 2", "cross_layers = 2\ndropout = 0.3")
        )
        return load_config(path)

    quiet = lambda _: None  # noqa: E731
    assert train(cfg("stopped", max_steps=11), quiet)["steps"] == 11
    resumed = train(cfg("stopped"), quiet)
    assert resumed["steps"] == 32 and resumed["steps_this_run"] == 21
    train(cfg("straight"), quiet)
    for a, b in zip(_weights(root / "stopped"), _weights(root / "straight"), strict=True):
        np.testing.assert_array_equal(a, b)
    tfrecord = (root / "stopped" / "data" / "tfrecord" / "train").is_dir()
    assert tfrecord == (input_format == "tfrecord")


def test_resume_with_another_batch_size_is_refused(one_epoch, shared_tiny_data, tmp_path):
    assert one_epoch.report["steps"] == 16
    run = copy_run(one_epoch, tmp_path).parent / "run"
    # 16 steps of 512 rows would be 2 epochs: the run must not end "done" after one
    other = load_config(_config(shared_tiny_data, run, batch=512, epochs=2))
    with pytest.raises(ConfigError, match=r"batch_size = 512: .* batch_size = 256"):
        train(other, log=lambda _: None)
    cfg = load_config(_config(shared_tiny_data, run, batch=256, epochs=2))
    again = train(cfg, lambda _: None)
    assert again["steps"] == 32 and again["steps_this_run"] == 16


def test_unfinished_checkpoint_folders_are_removed_at_start_up(tiny_data):
    run = tiny_data["root"] / "run"
    cfg = load_config(_config(tiny_data, run, epochs=1, data_extra=""))  # a best/ folder too
    train(cfg, log=lambda _: None)
    ckpts = run / "checkpoints"
    stale = [ckpts / "ckpt-17_temp", ckpts / "best" / "ckpt-9_temp", ckpts / "ckpt-3_temp_0a1f"]
    for folder in stale:
        folder.mkdir()
        (folder / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"x")
    kept = ckpts / "notes_temp"  # not a folder tf.train.Checkpoint writes
    kept.mkdir()
    lines: list[str] = []
    train(cfg, log=lines.append)
    assert not any(folder.exists() for folder in stale) and kept.exists()
    assert sum("unfinished save" in line for line in lines) == 3
