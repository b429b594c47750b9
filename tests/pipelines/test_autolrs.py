"""AutoLRS: the exponential forecast, the GP Bayesian optimisation, and the controller on a real
Keras model (weights restored between candidates, a sensible pick, determinism, checkpoints)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import tensorflow as tf  # tests/conftest.py sets TF_USE_LEGACY_KERAS first

from pipelines.config import ConfigError
from pipelines.run.autolrs import (
    AutoLRS,
    GaussianProcess,
    acquisition_scores,
    fit_exponential,
    forecast_loss,
    make_autolrs,
    minimize_1d,
    validation_loss_fn,
)
from pipelines.run.schedules import ConstantSchedule

# ---------------------------------------------------------------- forecast and BO


def test_exponential_fit_recovers_a_b_c():
    t = np.arange(0, 31, dtype=np.float64)
    y = 2.0 * np.exp(-0.15 * t) + 0.5
    a, b, c = fit_exponential(t, y)
    assert (a, b, c) == pytest.approx((2.0, 0.15, 0.5), rel=1e-5)
    assert forecast_loss(t, y, 300) == pytest.approx(2.0 * math.exp(-45) + 0.5, rel=1e-6)


def test_exponential_fit_of_a_noisy_curve():
    rng = np.random.default_rng(0)
    t = np.arange(0, 60, dtype=np.float64)
    y = 1.5 * np.exp(-0.08 * t) + 0.3 + rng.normal(0, 0.005, t.size)
    a, b, c = fit_exponential(t, y)
    assert a == pytest.approx(1.5, rel=0.03)
    assert b == pytest.approx(0.08, rel=0.05)
    assert c == pytest.approx(0.3, abs=0.02)


def test_loss_floor_keeps_a_falling_curve_from_extrapolating_below_it():
    t = np.arange(0, 9, dtype=np.float64)
    y = 18.0 - 1.0 * t  # still falling steadily
    assert forecast_loss(t, y, 40) < -10  # unbounded: the fit is almost the straight line
    a, b, c = fit_exponential(t, y, floor=0.0)
    assert c == 0.0 and a > 0 and b > 0
    assert 0.0 <= forecast_loss(t, y, 40, floor=0.0) < y[-1]


def test_exponential_fit_needs_three_points():
    with pytest.raises(ValueError, match="needs >= 3 points"):
        fit_exponential([0, 1], [1.0, 0.5])


def test_gaussian_process_interpolates_and_is_uncertain_away_from_data():
    x = np.array([0.1, 0.4, 0.9])
    y = np.array([1.0, -0.5, 2.0])
    gp = GaussianProcess(length_scale=0.2).fit(x, y)
    mu, sd = gp.predict(x)
    assert mu == pytest.approx(y, abs=1e-2)
    assert np.all(sd < 0.05)
    _, sd_far = gp.predict(np.array([0.65]))
    assert sd_far[0] > 5 * sd.max()
    fitted = GaussianProcess().fit(x, y)  # length scale by marginal likelihood
    assert 0.1 - 1e-12 <= fitted.ls <= 1.0 + 1e-12


def test_expected_improvement_and_lower_bound_by_hand():
    # EI = (best - mu) Phi(z) + sd phi(z), z = (best - mu) / sd; Phi(0) = 1/2, phi(0) = 0.398942,
    # Phi(1) = 0.841345, phi(1) = 0.241971, Phi(-2) = 0.022750, phi(-2) = 0.053991
    mu, sd = np.array([0.0, 1.0, 1.0, 3.0]), np.array([1.0, 2.0, 0.5, 1.0])
    ei = acquisition_scores(mu, sd, best=1.0, kind="ei")
    by_hand = [
        1.0 * 0.841345 + 0.241971,
        2.0 * 0.398942,
        0.5 * 0.398942,
        -2.0 * 0.022750 + 0.053991,
    ]
    assert ei == pytest.approx(by_hand, abs=2e-6)
    assert acquisition_scores(mu, sd, best=1.0, kind="lcb") == pytest.approx([2.0, 3.0, 0.0, -1.0])


@pytest.mark.parametrize("acquisition", ["ei", "lcb"])
def test_bayes_opt_finds_the_minimiser_in_few_evaluations(acquisition):
    def f(x):
        return (x - 0.3) ** 2 + 0.05 * math.sin(5 * x)

    grid = np.linspace(-1, 2, 30001)
    true_min = grid[np.argmin([f(x) for x in grid])]
    best, xs = minimize_1d(f, -1.0, 2.0, calls=10, seed=3, acquisition=acquisition)
    assert len(xs) == 10
    assert abs(best - true_min) < 0.05
    again, xs_again = minimize_1d(f, -1.0, 2.0, calls=10, seed=3, acquisition=acquisition)
    assert (again, xs_again) == (best, xs)


# ---------------------------------------------------------------- the controller

W_TRUE = np.array([[1.0], [-2.0], [0.5], [3.0]], dtype=np.float32)


def _problem(seed: int = 0):
    """Linear regression by SGD with momentum: too large a learning rate diverges."""
    tf.keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(1024, 4)).astype(np.float32)
    y = x @ W_TRUE + rng.normal(0, 0.1, size=(1024, 1)).astype(np.float32)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.5)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(batch):
        bx, by = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(bx, training=True) - by) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    vx, vy = tf.constant(x[768:]), tf.constant(y[768:])

    @tf.function
    def val_loss():
        return tf.reduce_mean((model(vx, training=False) - vy) ** 2)

    batches = [(tf.constant(x[i : i + 32]), tf.constant(y[i : i + 32])) for i in range(0, 768, 32)]
    return model, optimizer, step, val_loss, batches


def _controller(model, optimizer, step, val_loss, seed=0, **kw):
    opts = dict(tau=40, tau_prime=8, lr_range=(1e-4, 10.0), candidates=6, seed=seed)
    return AutoLRS(model, optimizer, step, val_loss, **{**opts, **kw})


def _values(model, optimizer):
    return [v.numpy().copy() for v in [*model.variables, *optimizer.variables]]


def test_stage_restores_weights_before_each_candidate_and_picks_a_good_lr():
    model, optimizer, step, val_loss, batches = _problem()
    for b in batches[:3]:  # non-trivial optimizer state (momentum, iterations) in the snapshot
        step(b)
    snapshot = _values(model, optimizer)
    before_step = []

    def recording_step(batch):
        before_step.append(_values(model, optimizer))
        return step(batch)

    ctrl = _controller(model, optimizer, recording_step, val_loss)
    start = float(val_loss())
    lr = ctrl.run_stage(iter(batches * 2))
    (report,) = ctrl.history
    cands = report["candidates"]
    assert len(cands) == 6 and report["chosen_lr"] == lr
    starts = np.cumsum([0] + [c["steps"] for c in cands])  # candidates, then the stage
    assert report["search_steps"] == starts[-1] == len(before_step) - 40
    for i in starts:
        for got, want in zip(before_step[i], snapshot, strict=True):
            np.testing.assert_array_equal(got, want)
    assert int(optimizer.iterations) == 3 + 40  # search steps are undone
    forecasts = [c["forecast"] for c in cands]
    assert any(f is None or f > 10 * start for f in forecasts)  # a too-large lr diverged
    chosen = next(c for c in cands if c["lr"] == lr)
    finite = [f for f in forecasts if f is not None]
    assert chosen["forecast"] == min(finite) < max(finite)
    assert 1e-3 < lr < 1.0
    assert float(val_loss()) < 0.1 * start
    assert ctrl.report()["search_steps"] == report["search_steps"]
    assert json.loads(json.dumps(ctrl.state_dict())) == ctrl.state_dict()


def _history(seed):
    model, optimizer, step, val_loss, batches = _problem(0)
    ctrl = _controller(model, optimizer, step, val_loss, seed=seed)
    ctrl.run_stage(iter(batches * 2))
    return [{k: v for k, v in r.items() if k != "search_seconds"} for r in ctrl.history]


def test_same_seed_same_search():
    first = _history(seed=5)
    assert _history(seed=5) == first
    other = _history(seed=6)
    assert [c["lr"] for c in other[0]["candidates"]] != [c["lr"] for c in first[0]["candidates"]]


def test_stages_follow_each_other_and_checkpoint(tmp_path):
    model, optimizer, step, val_loss, batches = _problem()
    ctrl = _controller(model, optimizer, step, val_loss, tau=20, tau_prime=4, candidates=3)
    stream = iter(batches * 3)
    assert ctrl.stage_due(0)
    lrs = [ctrl.run_stage(stream), ctrl.run_stage(stream)]
    assert [r["start_step"] for r in ctrl.history] == [0, 20]
    assert [r["chosen_lr"] for r in ctrl.history] == lrs
    assert int(optimizer.iterations) == 40
    assert not ctrl.stage_due(39) and ctrl.stage_due(40)
    path = tf.train.Checkpoint(model=model, optimizer=optimizer, autolrs=ctrl.tracked).write(
        str(tmp_path / "ckpt")
    )

    model2, optimizer2, step2, val_loss2, _ = _problem(1)
    ctrl2 = _controller(model2, optimizer2, step2, val_loss2, tau=20, tau_prime=4, candidates=3)
    tf.train.Checkpoint(model=model2, optimizer=optimizer2, autolrs=ctrl2.tracked).read(
        path
    ).assert_existing_objects_matched()
    assert ctrl2.state_dict() == ctrl.state_dict()
    assert float(optimizer2.learning_rate) == pytest.approx(lrs[1], rel=1e-6)
    ctrl3 = _controller(*_problem(2)[:4], tau=20, tau_prime=4, candidates=3)
    ctrl3.load_state_dict(json.loads(json.dumps(ctrl.state_dict())))
    assert ctrl3.state_dict() == ctrl.state_dict()
    assert float(ctrl3.optimizer.learning_rate) == pytest.approx(lrs[1], rel=1e-6)


def test_begin_stage_hands_the_batches_back_for_the_loop():
    model, optimizer, step, val_loss, batches = _problem()
    ctrl = _controller(model, optimizer, step, val_loss, tau=20, tau_prime=4, candidates=3)
    it = ctrl.begin_stage(iter(batches[:10]), step=7)
    assert len(list(it)) == 10  # the searched batches first, then the rest
    assert ctrl.history[0]["start_step"] == 7 and ctrl.history[0]["tau_prime"] == 4
    assert not ctrl.stage_due(26) and ctrl.stage_due(27)
    lr = float(optimizer.learning_rate)
    it = ctrl.begin_stage(iter(batches[:1]), step=27)  # too few batches left: no search
    assert len(list(it)) == 1 and len(ctrl.history) == 1
    assert float(optimizer.learning_rate) == lr and ctrl.stage_due(27)


def test_tau_grows_up_to_its_cap():
    ctrl = _controller(*_problem()[:4], tau=40, tau_prime=0, tau_growth=2.0, tau_max=100)
    assert [ctrl.stage_lengths(i) for i in range(4)] == [(40, 4), (80, 8), (100, 10), (100, 10)]
    fixed = _controller(*_problem()[:4], tau=40, tau_prime=8, tau_growth=2.0)
    assert fixed.stage_lengths(1) == (80, 16)


class _Ranker(tf.keras.Model):
    label = "y"

    def __init__(self):
        super().__init__()
        self.dense = tf.keras.layers.Dense(1)

    def call(self, features, training=False):
        return self.dense(features["x"])

    def labels_of(self, features):
        return features[self.label]

    def task_loss(self, labels, logits):
        return tf.reduce_mean(
            tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits[:, 0])
        )


def test_validation_loss_fn_is_the_row_weighted_mean():
    model = _Ranker()
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(6, 2)
    y = np.array([0, 1, 1, 0, 1, 0], dtype=np.float32)
    model({"x": x})
    batches = [{"x": x[:4], "y": y[:4]}, {"x": x[4:], "y": y[4:]}]
    want = float(model.task_loss(y, model({"x": x})))
    assert validation_loss_fn(model, batches, "y")() == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"taus": 10}, ["'taus'", "accepted", "tau_prime"]),
        ({"tau": 1}, ["tau = 1", ">= 2"]),
        ({"tau": 100, "tau_prime": 100}, ["tau_prime = 100", "[0, tau = 100)"]),
        ({"tau": 10}, ["tau_prime = 0", "tau // 10 is 1"]),
        ({"candidates": 2}, ["candidates = 2", ">= 3"]),
        ({"acquisition": "pi"}, ["acquisition = 'pi'", "ei", "lcb"]),
        ({"lr_min": 0.1, "lr_max": 0.01}, ["lr_min/lr_max", "0 < lr_min < lr_max"]),
        ({"tau_growth": 0.5}, ["tau_growth = 0.5", ">= 1"]),
        ({"val_every": 0}, ["val_every = 0", ">= 1"]),
        ({"tau": 100, "tau_max": 50}, ["tau_max = 50", ">= tau = 100"]),
        ({"loss_floor": "zero"}, ["loss_floor = 'zero'", "a number"]),
    ],
)
def test_make_autolrs_errors(options, words):
    model, optimizer, step, val_loss, _ = _problem()
    with pytest.raises(ConfigError) as e:
        make_autolrs(model, optimizer, step, val_loss, base_lr=0.01, seed=0, **options)
    for w in words:
        assert w in str(e.value)


def test_make_autolrs_defaults_and_schedule_optimizer():
    model, optimizer, step, val_loss, _ = _problem()
    ctrl = make_autolrs(model, optimizer, step, val_loss, base_lr=0.01, seed=4)
    assert ctrl.lr_range == (1e-4, 0.1) and ctrl.seed == 4
    assert (ctrl.tau, ctrl.candidates, ctrl.stage_lengths(0)) == (1000, 10, (1000, 100))
    with pytest.raises(ConfigError, match="constant learning rate"):
        AutoLRS(model, tf.keras.optimizers.SGD(ConstantSchedule(0.1)), step, val_loss, tau=20)
