"""Multi-worker training: TF_CONFIG parsing, batch slicing, and a real 2-worker local cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from pipelines.cli import main
from pipelines.config import ConfigError, DistributeConfig, load_config
from pipelines.distribute import (
    free_ports,
    parse_tf_config,
    require_single_process,
    resolve_strategy,
    slice_batch,
    slice_bounds,
    worker_tf_config,
)
from pipelines.run.paths import RunPaths
from tests.shared_runs import shared_run
from tests.testdata import NO_VALIDATION, run_config_text

ROOT = Path(__file__).resolve().parents[2]

# The 2-worker run sees the same global batches as one process and sums the two halves'
# gradients, which is the gradient of the batch mean: the runs differ only by float rounding
# (summation order in the all-reduce and in oneDNN kernels), which Adam carries along 32 steps.
# Measured on this data: identical test AUC and log loss to 6 decimals. 0.002 leaves room for
# other CPUs' rounding while failing a cluster whose workers train on the wrong rows: both
# workers taking the first half of every batch moved the test AUC by 0.0078.
AUC_TOLERANCE = 0.002
LOGLOSS_TOLERANCE = 0.002
# Sharded input trains on other batches than one process (each worker shuffles its own half and
# an epoch drops the last partial batches), so the runs agree only statistically. Measured on
# this data, seeds 0-4: sharded minus single-process test AUC -0.019, -0.006, -0.004, +0.002,
# +0.005, while single-process runs alone range over 0.021 between seeds (1,000 test rows).
SHARDED_AUC_TOLERANCE = 0.03


def test_parse_tf_config():
    assert parse_tf_config(None) is None and parse_tf_config("") is None
    assert parse_tf_config('{"cluster": {}}') is None
    spec = parse_tf_config(worker_tf_config([1, 2], 1))
    assert (spec.workers, spec.task_type, spec.task_index, spec.is_chief) == (2, "worker", 1, False)
    assert parse_tf_config(worker_tf_config([1, 2], 0)).is_chief
    chief = parse_tf_config(
        json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker"}})
    )
    assert chief.workers == 2 and not chief.is_chief
    for bad, words in (
        ("{not json", "not valid JSON"),
        ('{"cluster": {"worker": ["a:1"]}}', "needs a task"),
        ('{"cluster": {"worker": "a:1"}, "task": {"type": "worker"}}', "lists of"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}', "not in"),
        ('{"cluster": {"boss": ["a:1"]}, "task": {"type": "boss"}}', "unknown task types"),
    ):
        with pytest.raises(ConfigError, match=words):
            parse_tf_config(bad)


def test_resolve_strategy():
    two = parse_tf_config(worker_tf_config([1, 2], 0))
    one = parse_tf_config(worker_tf_config([1], 0))
    ps = parse_tf_config(
        json.dumps({"cluster": {"worker": ["a:1"], "ps": ["b:1"]}, "task": {"type": "ps"}})
    )
    assert resolve_strategy(None, None) == "none"
    assert resolve_strategy(None, one) == "none"
    assert resolve_strategy(None, two) == "multi_worker_mirrored"
    assert resolve_strategy(DistributeConfig("none"), two) == "none"
    with pytest.raises(ConfigError, match="needs TF_CONFIG"):
        resolve_strategy(DistributeConfig("multi_worker_mirrored"), None)
    with pytest.raises(ConfigError, match="exactly one chief"):  # PS: pipelines/distribute_ps.py
        resolve_strategy(None, ps)
    with pytest.raises(ConfigError, match="not one of"):
        DistributeConfig("horovod")


def test_require_single_process(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    require_single_process(None, "[preranking]")
    monkeypatch.setenv("TF_CONFIG", worker_tf_config([1, 2], 0))
    require_single_process(DistributeConfig("none"), "[preranking]")
    with pytest.raises(ConfigError, match=r"\[preranking\] trains in one process only"):
        require_single_process(None, "[preranking]")


def test_distribute_section_in_config(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(
        'output_dir = "r"\n[data]\nschema = "s.toml"\ntrain = "t"\n[distribute]\nstrategy = "none"\n'
    )
    cfg = load_config(p)
    assert cfg.distribute == DistributeConfig("none")
    assert "[distribute]" in cfg.to_toml()
    assert load_config(p, ["distribute.strategy=auto"]).distribute.strategy == "auto"
    p.write_text(
        'output_dir = "r"\n[data]\nschema = "s.toml"\ntrain = "t"\n[distribute]\nworkers = 2\n'
    )
    with pytest.raises(ConfigError, match=r"\[distribute\]: unknown keys \['workers'\]"):
        load_config(p)


@pytest.mark.parametrize("rows", [0, 1, 2, 7, 256])
def test_slices_cover_the_batch(rows):
    """The W slices are disjoint, in order and together the batch (checked row by row)."""
    for parts in (1, 2, 3):
        x = np.arange(rows, dtype=np.float32)
        got = []
        for i in range(parts):
            part, n = slice_batch({"label": tf.constant(x)}, "label", i, parts)
            assert int(n) == rows
            got.append(part["label"].numpy())
            lo, hi = (int(v) for v in slice_bounds(tf.constant(rows, tf.int64), i, parts))
            assert hi - lo <= -(-rows // parts) if rows else hi == lo == 0
        np.testing.assert_array_equal(np.concatenate(got), x)


def test_bad_tf_config_is_one_error_line(shared_tiny_data, tmp_path, monkeypatch, capsys):
    # in this process: the other CLI tests run `stitchrec train` as a real process
    config = _run_config(shared_tiny_data, tmp_path / "bad")
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1"]}')
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: TF_CONFIG is not valid JSON") and err.count("\n") == 1, err


def _run_config(data: dict[str, Path], out: Path, input_: str = "split") -> Path:
    """The run config of the cluster tests, as ``out`` + ``.toml``."""
    path = out.parent / f"{out.name}.toml"
    path.write_text(_run_config_text(data, out, input_))
    return path


def _run_config_text(data: dict[str, Path], out: Path | str, input_: str = "split") -> str:
    model = {"type": "dcn_v2", "embedding_dim": 4, "mlp": [32, 16], "cross_layers": 2}
    train_cfg = {
        "batch_size": 256,
        "epochs": 2,
        "learning_rate": 0.01,
        "checkpoint_every": 10,
        "log_every": 2,
    }
    extra = f'[distribute]\ninput = "{input_}"\n'
    return run_config_text(data, out, model, train_cfg, extra, NO_VALIDATION)


@pytest.fixture(scope="module")
def single(tmp_path_factory, shared_tiny_data) -> dict:
    """The report of single-process training of the cluster tests' config (input "split")."""
    return shared_run(tmp_path_factory, _run_config_text(shared_tiny_data, "run")).report


def _run_cluster(
    config: Path, root: Path, name: str, *args: str, kill_worker_after: str | None = None
) -> tuple[list[int], list[str]]:
    """Runs ``stitchrec train --config config *args`` as 2 worker processes on 127.0.0.1 and
    returns their exit codes and logs (killed after 120 s). With ``kill_worker_after``, worker 1
    is killed (SIGKILL) as soon as the chief's log holds that text."""
    ports = free_ports(2)
    env_base = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env_base["PYTHONPATH"] = str(ROOT)
    env_base["TF_CPP_MIN_LOG_LEVEL"] = "2"
    procs: list[subprocess.Popen] = []
    logs = [root / f"{name}-worker-{i}.log" for i in range(2)]
    t0 = time.time()
    try:
        for i in range(2):
            scratch = root / f"{name}-tmp-{i}"  # where a worker's temporary folder goes
            scratch.mkdir()
            env = dict(env_base, TF_CONFIG=worker_tf_config(ports, i), TMPDIR=str(scratch))
            cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", str(config), *args]
            procs.append(
                subprocess.Popen(
                    cmd, cwd=ROOT, env=env, stdout=logs[i].open("w"), stderr=subprocess.STDOUT
                )
            )
        if kill_worker_after is not None:
            while kill_worker_after not in logs[0].read_text() and procs[0].poll() is None:
                if time.time() - t0 > 120:
                    break
                time.sleep(0.05)
            procs[1].kill()
        codes = [p.wait(timeout=max(5.0, 120 - (time.time() - t0))) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    texts = [p.read_text() for p in logs]
    assert "this is worker:0 (chief)" in texts[0], texts[0][-3000:]
    return codes, texts


def _check_ok(codes: list[int], texts: list[str], root: Path, name: str) -> None:
    assert codes == [0, 0], "\n---\n".join(t[-3000:] for t in texts)
    assert "this is worker:1" in texts[1]
    # the non-chief worker removed its temporary folder
    assert not list((root / f"{name}-tmp-1").glob("stitchrec-*"))


def test_killed_worker_resumes_from_the_last_checkpoint_and_matches_single_process(
    shared_tiny_data, tmp_path, single
):
    """A real 2-worker cluster loses worker 1 (SIGKILL) mid-run: the chief stops at once with
    exit status 3 naming the last checkpoint; started again, both workers restore it, train the
    remaining steps and end where single-process training ends: no checkpointed step is lost."""
    root, out = tmp_path, tmp_path / "cluster"
    config = _run_config(shared_tiny_data, out)
    codes, texts = _run_cluster(config, root, "first", kill_worker_after="step 12/32")
    assert codes[0] == 3, texts[0][-3000:]
    paths = RunPaths(out)
    latest = tf.train.latest_checkpoint(str(paths.checkpoints))
    resumed_at = int(latest.rsplit("-", 1)[1])
    assert resumed_at >= 10  # checkpoint_every 10: ckpt-10 was written before step 12's line
    assert "lost a task of the cluster" in texts[0] and f"last checkpoint is {latest}" in texts[0]
    assert "train_report.json" not in os.listdir(out)

    codes, texts = _run_cluster(config, root, "second")
    _check_ok(codes, texts, root, "second")
    epoch, batch = divmod(resumed_at, 16)
    for text in texts:  # both restore the chief's checkpoint
        assert f"ckpt-{resumed_at} at step {resumed_at} (epoch {epoch + 1}, batch {batch})" in text

    report = json.loads(paths.report.read_text())
    # 4,000 rows / 256 -> 16 global steps per epoch, 2 epochs
    assert (report["steps"], report["steps_this_run"]) == (32, 32 - resumed_at)
    assert tf.train.latest_checkpoint(str(paths.checkpoints)).endswith("ckpt-32")
    # the non-chief worker wrote nothing into the run folder
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["checkpoints", "config.toml", "model.json", "schema.toml", "stats", "tensorboard",
         "train_report.json"]
    )  # fmt: skip

    assert single["steps"] == 32
    gap = abs(report["test"]["auc"] - single["test"]["auc"])
    print(
        f"2-worker auc {report['test']['auc']:.6f}, single {single['test']['auc']:.6f}, "
        f"gap {gap:.6f}"
    )
    assert single["test"]["auc"] > 0.62  # it learned (the tiny set's planted effects)
    assert gap <= AUC_TOLERANCE
    assert abs(report["test"]["logloss"] - single["test"]["logloss"]) <= LOGLOSS_TOLERANCE


def test_sharded_input_trains_each_worker_on_its_own_rows(shared_tiny_data, tmp_path, single):
    """``input = "shard"``: each worker reads its half of every epoch (2,000 rows) in local
    batches of 128, so an epoch is 15 global steps of 256 rows (3,840 rows, whole batches only),
    and the model learns what single-process training learns (different batches: not equal)."""
    root, out = tmp_path, tmp_path / "sharded"
    config = _run_config(shared_tiny_data, out, input_="shard")
    codes, texts = _run_cluster(config, root, "sharded")
    _check_ok(codes, texts, root, "sharded")
    report = json.loads(RunPaths(out).report.read_text())
    assert report["steps"] == 30
    assert "step 30/30" in texts[0] and "step 30/30" in texts[1]
    gap = abs(report["test"]["auc"] - single["test"]["auc"])
    print(f"sharded auc {report['test']['auc']:.6f}, single {single['test']['auc']:.6f}")
    assert report["test"]["auc"] > 0.62
    assert gap <= SHARDED_AUC_TOLERANCE
