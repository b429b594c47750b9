"""``[train] lr_schedule`` through real ``stitchrec train`` runs: the step schedules drive the
optimizer (table fusion's fresh optimizer included), AutoLRS searches on the validation split,
is checkpointed and resumes after SIGKILL where the uninterrupted run goes."""

from __future__ import annotations

import json
import math
import signal
import time
import types
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from pipelines.config import ConfigError, load_config
from pipelines.train import _check_needs_validation, train
from tests.pipelines.test_train import _checkpoint_step, _cli, _train_cli, _weights
from tests.testdata import NO_VALIDATION, write_run_config, write_tiny_dataset

LR = 0.01


def _config(data, out, options=None, data_extra=NO_VALIDATION, extra="", **train_extra):
    """A DCN-v2 run over ``data`` (batch 256, 2 epochs, deterministic) with ``[train]`` keys
    ``train_extra`` and ``[train.lr_schedule_options]`` ``options``."""
    model = {"type": "dcn_v2", "embedding_dim": 4, "mlp": [32, 16], "cross_layers": 2}
    train_keys = {
        "batch_size": 256,
        "epochs": 2,
        "learning_rate": LR,
        "checkpoint_every": 10,
        "log_every": 50,
        "deterministic": True,
        **train_extra,
    }
    if options:
        body = "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items())
        extra = f"[train.lr_schedule_options]\n{body}\n{extra}"
    path = data["root"] / f"{Path(out).name}.toml"
    return write_run_config(path, data, out, model, train_keys, extra, data_extra=data_extra)


def _cosine(t: int, total: int, warmup: int, min_lr: float) -> float:
    if t < warmup:
        return LR * (t + 1) / warmup
    p = min(max((t - warmup) / (total - warmup), 0.0), 1.0)
    return min_lr + (LR - min_lr) * (1 + math.cos(math.pi * p)) / 2


def _one_cycle_linear(t: int, total: int, pct: float, div: float, final_div: float) -> float:
    initial, up = LR / div, pct * total - 1
    if t <= up:
        return initial + (LR - initial) * t / up
    p = min((t - up) / (total - 1 - up), 1.0)
    return LR + (initial / final_div - LR) * p


# 4,000 rows / 256 = 16 steps per epoch, 2 epochs: 32 steps; the last step is step 31
SCHEDULES = {
    "constant": ({}, LR),
    "step": ({"step_size": 10, "gamma": 0.5}, LR * 0.5**3),
    "cosine": ({"warmup_steps": 4, "min_lr": 1e-4}, _cosine(31, 32, 4, 1e-4)),
    "one_cycle": (
        {"pct_start": 0.25, "div_factor": 10.0, "final_div_factor": 100.0, "anneal": "linear"},
        _one_cycle_linear(31, 32, 0.25, 10.0, 100.0),
    ),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_each_schedule_drives_the_optimizer(tiny_data, name):
    options, last = SCHEDULES[name]
    run = tiny_data["root"] / name
    report = train(load_config(_config(tiny_data, run, options, lr_schedule=name)), lambda _: 0)
    assert report["steps"] == 32
    lr = report["learning_rate"]
    assert lr["schedule"] == name and lr["options"] == options
    # the rate of the last step, 31 (float32 arithmetic)
    assert lr["last"] == pytest.approx(last, rel=1e-5, abs=1e-9)
    ckpt = tf.train.latest_checkpoint(str(run / "checkpoints"))
    assert tf.train.load_variable(ckpt, "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE") == 32


def test_one_cycle_mid_run_and_resume_continue_the_schedule(tiny_data):
    """Stopped at step 11 by max_steps, the rate is the schedule's at step 10; the resumed run
    follows the schedule of the whole run (total steps from epochs) to its end."""
    options = {"warmup_steps": 4, "min_lr": 1e-4}
    run = tiny_data["root"] / "resumed"
    cfg = _config(tiny_data, run, options, lr_schedule="cosine", max_steps=11)
    first = train(load_config(cfg), lambda _: 0)
    assert first["learning_rate"]["last"] == pytest.approx(_cosine(10, 11, 4, 1e-4), rel=1e-5)
    cfg = _config(tiny_data, run, options, lr_schedule="cosine")
    rest = train(load_config(cfg), lambda _: 0)
    assert rest["steps"] == 32 and rest["steps_this_run"] == 21
    assert rest["learning_rate"]["last"] == pytest.approx(_cosine(31, 32, 4, 1e-4), rel=1e-5)


def test_table_fusion_optimizer_follows_the_schedule(tiny_data):
    options, last = SCHEDULES["step"]
    cfg = _config(tiny_data, tiny_data["root"] / "fused", options, lr_schedule="step")
    cfg.write_text(cfg.read_text() + "\n[fusion]\ntables = true\n")
    lines: list[str] = []
    report = train(load_config(cfg), lines.append)
    assert any("compiler_opt.table_fusion" in line for line in lines)
    assert report["learning_rate"]["last"] == pytest.approx(last, rel=1e-5)


def test_bad_schedule_names_the_key(tiny_data):
    run = tiny_data["root"] / "bad"
    with pytest.raises(
        ConfigError, match=r"lr_schedule = 'warm'.*'one_cycle', 'cyclic', 'autolrs'"
    ):
        train(load_config(_config(tiny_data, run, lr_schedule="warm")), lambda _: 0)
    with pytest.raises(ConfigError, match="has no option 'warmup'"):
        cfg = _config(tiny_data, run, {"warmup": 3}, lr_schedule="cosine")
        train(load_config(cfg), lambda _: 0)


AUTOLRS = {"tau": 10, "tau_prime": 4, "candidates": 3, "val_every": 1}


def test_autolrs_searches_on_the_validation_split(tiny_data):
    # validation_fraction 0.1: 3,6xx training rows / 256 = 15 steps per epoch, 30 in all
    run = tiny_data["root"] / "autolrs"
    cfg = _config(tiny_data, run, AUTOLRS, data_extra="", lr_schedule="autolrs")
    lines: list[str] = []
    report = train(load_config(cfg), lines.append)
    assert report["steps"] == 30 and report["validation_rows"] > 0
    auto = report["autolrs"]
    stages = auto["stages"]
    assert [s["start_step"] for s in stages] == [0, 10, 20]
    for s in stages:
        assert len(s["candidates"]) == 3 and s["search_steps"] == 3 * 4
        assert all(c["forecast"] is not None and len(c["val_loss"]) == 5 for c in s["candidates"])
        assert s["chosen_lr"] in [c["lr"] for c in s["candidates"]]
        assert LR / 100 <= s["chosen_lr"] <= LR * 10
    assert auto["search_steps"] == 36 and auto["learning_rates"] == [s["chosen_lr"] for s in stages]
    # the search's steps are undone: the optimizer counts the run's 30 steps only
    ckpt = tf.train.latest_checkpoint(str(run / "checkpoints"))
    assert tf.train.load_variable(ckpt, "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE") == 30
    assert report["learning_rate"]["last"] == pytest.approx(stages[-1]["chosen_lr"], rel=1e-6)
    assert sum("autolrs stage" in line for line in lines) == 3
    # the controller's state is in the checkpoint
    state = json.loads(tf.train.load_variable(ckpt, "autolrs/state/.ATTRIBUTES/VARIABLE_VALUE"))
    assert state["stage"] == 3 and len(state["history"]) == 3


def test_autolrs_is_refused_without_validation_split_or_under_a_strategy(tiny_data):
    run = tiny_data["root"] / "refused"
    cfg = load_config(_config(tiny_data, run, AUTOLRS, lr_schedule="autolrs"))
    with pytest.raises(ConfigError, match="autolrs' needs a validation split"):
        train(cfg, lambda _: 0)
    fake = types.SimpleNamespace(
        cfg=cfg, dist=types.SimpleNamespace(active=True), validation_files=["v.parquet"]
    )
    with pytest.raises(ConfigError, match="not available under a distribution strategy"):
        _check_needs_validation(fake)


@pytest.mark.slow
def test_autolrs_with_dropout_resumes_after_sigkill_bitwise(tmp_path):
    """Killed mid-run, the resumed run continues the stage it was in (or searches again the one
    it was searching) and ends bitwise where the uninterrupted run ends, dropout included."""
    data = write_tiny_dataset(tmp_path, rows=15_000, train_rows=12_000, seed=1)
    options = {"tau": 60, "tau_prime": 6, "candidates": 3, "val_every": 2}
    keys = {"batch_size": 64, "epochs": 1, "checkpoint_every": 20, "lr_schedule": "autolrs"}

    def config(out: Path) -> Path:
        path = _config(data, out, options, data_extra="validation_fraction = 0.03", **keys)
        text = path.read_text().replace("cross_layers = 2", "cross_layers = 2\ndropout = 0.2")
        path.write_text(text)
        return path

    killed = tmp_path / "killed"
    proc = _cli(config(killed))
    deadline = time.time() + 240
    while _checkpoint_step(killed) < 80:
        if proc.poll() is not None:
            pytest.fail(f"training ended before it could be killed:\n{proc.stdout.read()}")
        if time.time() > deadline:
            proc.kill()
            pytest.fail("no checkpoint at step >= 80 within 240 s")
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = _checkpoint_step(killed)
    resumed = _train_cli(config(killed))
    assert f"at step {saved} " in resumed
    straight = tmp_path / "straight"  # in this process: the CLI is the killed run's
    train(load_config(config(straight)), lambda _: 0)
    a = json.loads((killed / "train_report.json").read_text())
    b = json.loads((straight / "train_report.json").read_text())
    assert a["steps"] == b["steps"] and a["autolrs"]["stages"]
    assert a["autolrs"]["learning_rates"] == b["autolrs"]["learning_rates"]
    assert [s["start_step"] for s in a["autolrs"]["stages"]] == [
        s["start_step"] for s in b["autolrs"]["stages"]
    ]
    for x, y in zip(_weights(killed), _weights(straight), strict=True):
        np.testing.assert_array_equal(x, y)
