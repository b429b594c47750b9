"""Learning-rate schedules against hand-computed values; make_schedule's errors."""

from __future__ import annotations

import pytest
import tensorflow as tf  # tests/conftest.py sets TF_USE_LEGACY_KERAS first

from pipelines.config import ConfigError
from pipelines.run.schedules import (
    LR_SCHEDULES,
    ConstantSchedule,
    OneCycleSchedule,
    StepSchedule,
    WarmupCosineSchedule,
    make_schedule,
)


def _values(schedule, steps):
    return [float(schedule(tf.constant(s, tf.int64))) for s in steps]


def test_constant():
    assert _values(ConstantSchedule(0.1), [0, 1, 1000]) == pytest.approx([0.1] * 3, rel=1e-6)


def test_step_drops_by_gamma_every_step_size():
    s = StepSchedule(0.1, step_size=10, gamma=0.5)
    assert _values(s, [0, 9, 10, 19, 25, 30]) == pytest.approx(
        [0.1, 0.1, 0.05, 0.05, 0.025, 0.0125], rel=1e-6
    )


def test_cosine_with_linear_warmup():
    s = WarmupCosineSchedule(1.0, total_steps=110, warmup_steps=10, min_lr=0.1)
    # warm-up: (step + 1) / 10; then 0.1 + 0.9 (1 + cos(pi p)) / 2, p = (step - 10) / 100
    got = _values(s, [0, 4, 9, 10, 35, 60, 110, 200])
    want = [0.1, 0.5, 1.0, 1.0, 0.8681980515, 0.55, 0.1, 0.1]
    assert got == pytest.approx(want, rel=1e-5, abs=1e-7)


def test_cosine_without_warmup_starts_at_base():
    s = WarmupCosineSchedule(2.0, total_steps=100)
    assert _values(s, [0, 50, 100]) == pytest.approx([2.0, 1.0, 0.0], abs=1e-6)


def test_one_cycle_cosine():
    # initial 1 / 10, final 0.1 / 100; peak at step 0.21 * 100 - 1 = 20, end at step 99
    s = OneCycleSchedule(1.0, 100, pct_start=0.21, div_factor=10, final_div_factor=100)
    got = _values(s, [0, 5, 10, 20, 40, 99, 150])
    want = [0.1, 0.2318019485, 0.55, 1.0, 0.8501710162, 0.001, 0.001]
    assert got == pytest.approx(want, rel=1e-5, abs=1e-7)


def test_one_cycle_linear():
    s = OneCycleSchedule(
        1.0, 100, pct_start=0.21, div_factor=10, final_div_factor=100, anneal="linear"
    )
    got = _values(s, [0, 5, 10, 20, 40, 99])
    want = [0.1, 0.325, 0.55, 1.0, 0.7470886076, 0.001]
    assert got == pytest.approx(want, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize(
    "schedule",
    [
        ConstantSchedule(0.1),
        StepSchedule(0.1, 7, 0.3),
        WarmupCosineSchedule(0.5, 90, 9, 0.01),
        OneCycleSchedule(0.4, 50, 0.25, 5.0, 20.0, "linear"),
    ],
)
def test_get_config_rebuilds_the_same_schedule(schedule):
    again = type(schedule).from_config(schedule.get_config())
    assert again.get_config() == schedule.get_config()
    steps = [0, 3, 8, 20, 49, 60]
    assert _values(again, steps) == _values(schedule, steps)


def test_keras_optimizer_follows_the_schedule():
    opt = tf.keras.optimizers.SGD(StepSchedule(0.1, step_size=2, gamma=0.5))
    v = tf.Variable(1.0)
    used = []
    for _ in range(5):  # gradient 1: each update subtracts the schedule at opt.iterations
        before = float(v)
        opt.apply_gradients([(tf.constant(1.0), v)])
        used.append(before - float(v))
    assert used == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025], rel=1e-5)
    assert int(opt.iterations) == 5


def test_make_schedule_builds_each_name():
    assert isinstance(make_schedule("constant", 0.1, 10), ConstantSchedule)
    step = make_schedule("step", 0.1, 10, step_size=3, gamma=0.5)
    assert step.get_config() == {"base_lr": 0.1, "step_size": 3, "gamma": 0.5}
    cos = make_schedule("cosine", 0.2, 100, warmup_steps=5)
    assert cos.get_config() == {
        "base_lr": 0.2,
        "total_steps": 100,
        "warmup_steps": 5,
        "min_lr": 0.0,
    }
    one = make_schedule("one_cycle", 0.3, 100)
    assert one.get_config()["max_lr"] == 0.3 and one.get_config()["pct_start"] == 0.3
    assert set(LR_SCHEDULES) == {"constant", "step", "cosine", "one_cycle", "autolrs"}


@pytest.mark.parametrize(
    ("name", "options", "words"),
    [
        ("linear", {}, ["'linear'", "constant", "cosine", "one_cycle", "step"]),
        ("autolrs", {}, ["'autolrs'", "pipelines.run.autolrs"]),
        ("step", {}, ["step_size"]),
        ("step", {"step_size": 0}, ["step_size = 0", "integer > 0"]),
        ("step", {"step_size": 2.5}, ["step_size = 2.5", "integer"]),
        ("step", {"step_size": 3, "gamma": -1}, ["gamma = -1", "> 0"]),
        ("cosine", {"warmup": 5}, ["'warmup'", "= 5", "min_lr", "warmup_steps"]),
        ("cosine", {"warmup_steps": -1}, ["warmup_steps = -1", ">= 0"]),
        ("cosine", {"min_lr": 0.5}, ["min_lr = 0.5", "learning_rate = 0.1"]),
        ("one_cycle", {"pct_start": 1.0}, ["pct_start = 1.0", "(0, 1)"]),
        ("one_cycle", {"anneal": "exp"}, ["anneal = 'exp'", "cos", "linear"]),
        ("one_cycle", {"div_factor": 0}, ["div_factor = 0"]),
        ("constant", {"gamma": 0.1}, ["'gamma'", "accepted: none"]),
    ],
)
def test_make_schedule_errors_name_key_value_and_accepted(name, options, words):
    with pytest.raises(ConfigError) as e:
        make_schedule(name, 0.1, 100, **options)
    for w in words:
        assert w in str(e.value)


def test_make_schedule_checks_rate_and_steps():
    with pytest.raises(ConfigError, match=r"\[train\] learning_rate = 0"):
        make_schedule("constant", 0, 100)
    with pytest.raises(ConfigError, match=r"\[train\] total_steps = 0"):
        make_schedule("cosine", 0.1, 0)
