"""``[train] lr_schedule = "autolrs"``: the learning rate searched on the fly by Bayesian
optimisation (Jin et al., ICLR 2021, "AutoLRS: Automatic Learning-Rate Schedule by Bayesian
Optimization on the Fly"; docs/schedules.md).

Training runs in stages of ``tau`` steps. At a stage's start the model and optimizer variables
are snapshot; ``candidates`` learning rates are tried one after another, each trained
``tau_prime`` steps from that snapshot on the same batches (the stage's first ``tau_prime``)
while its validation loss is measured; the curve is fit by ``L(t) = a exp(-b t) + c`` and
extrapolated to ``t = tau``, and that forecast is the objective of a Bayesian optimisation over
``log10(lr)`` in ``[lr_min, lr_max]`` (Gaussian process with an RBF kernel, expected
improvement or lower confidence bound over a grid). The snapshot is restored and the
candidate of the lowest forecast trains the stage's ``tau`` steps.

The search's steps are optimizer updates that are undone: they count in the stage reports
(``search_steps``), not in the optimizer's ``iterations`` nor the run's step.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from scipy import optimize, special

from pipelines.config import ConfigError

TrainStepFn = Callable[[Any], Any]
ValLossFn = Callable[[], Any]

#: ``[train.lr_schedule_options]`` of ``autolrs``, with their defaults (``lr_min`` /
#: ``lr_max`` ``None``: ``learning_rate / 100`` and ``learning_rate * 10``).
AUTOLRS_OPTIONS: dict[str, Any] = {
    "tau": 1000,
    "tau_prime": 0,
    "candidates": 10,
    "lr_min": None,
    "lr_max": None,
    "acquisition": "ei",
    "length_scale": 0.0,
    "tau_growth": 1.0,
    "tau_max": 0,
    "val_every": 1,
    "loss_floor": 0.0,
}
ACQUISITIONS = ("ei", "lcb")
_GRID_POINTS = 201
_INITIAL_POINTS = 2  # random candidates before the surrogate proposes
_LENGTH_SCALES = np.logspace(-1.0, 0.0, 21)  # on the [0, 1] log10(lr) axis: 0.1 .. 1
_NOISE = 1e-4  # observation noise variance of the standardised objective


# ---------------------------------------------------------------- loss-curve forecast


def _exp_rss(
    b: float, t: np.ndarray, y: np.ndarray, floor: float | None
) -> tuple[float, float, float]:
    e = np.exp(-b * t)
    design = np.stack([e, np.ones_like(t)], axis=1)
    (a, c), *_ = np.linalg.lstsq(design, y, rcond=None)
    if floor is not None and c < floor:  # the asymptote at the floor, a alone by least squares
        c = floor
        a = float(e @ (y - c) / (e @ e))
    return float(np.sum((a * e + c - y) ** 2)), float(a), float(c)


def fit_exponential(
    t: Sequence[float], y: Sequence[float], floor: float | None = None
) -> tuple[float, float, float]:
    """``(a, b, c)`` of ``y ~ a exp(-b t) + c`` by least squares, ``b > 0`` and (``floor``
    given) ``c >= floor``.

    For a fixed ``b`` the model is linear in ``a`` and ``c`` (solved exactly); ``b`` is the best
    of a log grid over ``[1e-3, 50] / max(t)``, refined by a bounded scalar search.
    """
    t, y = np.asarray(t, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if t.shape != y.shape or t.size < 3:
        raise ValueError(f"fit_exponential needs >= 3 points (t, y) of one length, got {t.size}")
    span = float(np.max(t)) or 1.0
    log_bs = np.linspace(np.log(1e-3 / span), np.log(50.0 / span), 61)
    rss = [_exp_rss(math.exp(lb), t, y, floor)[0] for lb in log_bs]
    i = int(np.argmin(rss))
    lo, hi = log_bs[max(i - 1, 0)], log_bs[min(i + 1, len(log_bs) - 1)]
    best = optimize.minimize_scalar(
        lambda lb: _exp_rss(math.exp(lb), t, y, floor)[0],
        bounds=(lo, hi),
        method="bounded",
        options={"xatol": 1e-10},
    )
    log_b = float(best.x) if best.fun <= rss[i] else float(log_bs[i])
    b = math.exp(log_b)
    _, a, c = _exp_rss(b, t, y, floor)
    return a, b, c


def forecast_loss(
    t: Sequence[float], y: Sequence[float], horizon: float, floor: float | None = None
) -> float:
    """The loss at step ``horizon`` of the exponential fit of the curve ``(t, y)``."""
    a, b, c = fit_exponential(t, y, floor)
    return a * math.exp(-b * horizon) + c


# ---------------------------------------------------------------- Bayesian optimisation


class GaussianProcess:
    """A 1-D Gaussian process: RBF kernel of unit variance on the standardised targets,
    ``length_scale`` fixed (> 0) or (0) maximising the log marginal likelihood over a grid."""

    def __init__(self, length_scale: float = 0.0, noise: float = _NOISE) -> None:
        self.length_scale, self.noise = float(length_scale), float(noise)

    def _factor(self, ls: float) -> tuple[np.ndarray, np.ndarray, float]:
        k = np.exp(-0.5 * ((self.x[:, None] - self.x[None, :]) / ls) ** 2)
        chol = np.linalg.cholesky(k + self.noise * np.eye(len(self.x)))
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, self.z))
        lml = -0.5 * self.z @ alpha - np.sum(np.log(np.diag(chol)))
        return chol, alpha, float(lml)

    def fit(self, x: Sequence[float], y: Sequence[float]) -> GaussianProcess:
        self.x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        self.mean = float(np.mean(y))
        self.scale = float(np.std(y)) or 1.0
        self.z = (y - self.mean) / self.scale
        if self.length_scale > 0:
            self.ls = self.length_scale
        else:
            self.ls = float(max(_LENGTH_SCALES, key=lambda ls: self._factor(ls)[2]))
        self.chol, self.alpha, _ = self._factor(self.ls)
        return self

    def predict(self, x: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation at ``x``, in the targets' units."""
        x = np.asarray(x, dtype=np.float64)
        ks = np.exp(-0.5 * ((x[:, None] - self.x[None, :]) / self.ls) ** 2)
        mu = ks @ self.alpha
        v = np.linalg.solve(self.chol, ks.T)
        var = np.maximum(1.0 - np.sum(v**2, axis=0), 1e-12)
        return self.mean + self.scale * mu, self.scale * np.sqrt(var)


def acquisition_scores(mu: np.ndarray, sd: np.ndarray, best: float, kind: str) -> np.ndarray:
    """Higher is better: expected improvement below ``best`` (``ei``) or minus the lower
    confidence bound ``mu - 2 sd`` (``lcb``), for minimisation."""
    if kind == "lcb":
        return -(mu - 2.0 * sd)
    improvement = best - mu
    z = improvement / sd
    # the standard normal's cdf and density, without scipy.stats (0.4 s to import)
    return improvement * special.ndtr(z) + sd * np.exp(-0.5 * z * z) / np.sqrt(2.0 * np.pi)


class BayesOpt1D:
    """Ask/tell minimisation of a function of ``u`` in [0, 1] on a grid of ``points``: the
    first ``initial`` asks are random (``seed``), later ones maximise the acquisition of a
    Gaussian process fit to the told values; a grid point is asked at most once."""

    def __init__(
        self,
        seed: Any,
        *,
        acquisition: str = "ei",
        length_scale: float = 0.0,
        points: int = _GRID_POINTS,
        initial: int = _INITIAL_POINTS,
    ) -> None:
        self.grid = np.linspace(0.0, 1.0, points)
        self.rng = np.random.default_rng(seed)
        self.acquisition, self.initial = acquisition, initial
        self.gp = GaussianProcess(length_scale)
        self.asked: list[int] = []
        self.values: list[float] = []

    def ask(self) -> float:
        free = np.setdiff1d(np.arange(len(self.grid)), self.asked)
        if len(self.values) < self.initial:
            i = int(self.rng.choice(free))
        else:
            self.gp.fit(self.grid[self.asked], self.values)
            mu, sd = self.gp.predict(self.grid[free])
            scores = acquisition_scores(mu, sd, min(self.values), self.acquisition)
            i = int(free[int(np.argmax(scores))])
        self.asked.append(i)
        return float(self.grid[i])

    def tell(self, value: float) -> None:
        self.values.append(float(value))


def minimize_1d(
    f: Callable[[float], float], low: float, high: float, calls: int, seed: int = 0, **kw: Any
) -> tuple[float, list[float]]:
    """The best ``x`` in ``[low, high]`` after ``calls`` evaluations of ``f``, and all ``x``."""
    bo, xs = BayesOpt1D(seed, **kw), []
    for _ in range(calls):
        xs.append(low + (high - low) * bo.ask())
        bo.tell(f(xs[-1]))
    return xs[int(np.argmin(bo.values))], xs


# ---------------------------------------------------------------- the controller


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


class _Tracked(tf.Module):
    """The controller's state as one JSON string variable, saved by ``tf.train.Checkpoint``."""

    def __init__(self) -> None:
        super().__init__(name="autolrs")
        self.state = tf.Variable("{}", dtype=tf.string, trainable=False, name="state")


class AutoLRS:
    """The AutoLRS controller of ``model`` trained by ``optimizer`` (constant learning rate,
    set by the controller) through ``train_step_fn(batch)`` (one optimizer update; keep the
    loop's metrics out of it), judged by ``val_loss_fn()`` (the mean loss on held-out training
    rows, never the test set).

    ``tau``: steps of a stage; ``tau_prime``: steps of a candidate (0: ``tau // 10``);
    ``lr_range``: ``(lr_min, lr_max)``; ``candidates``: learning rates tried per stage;
    ``seed``: the random first candidates; ``acquisition``: ``ei`` or ``lcb``;
    ``length_scale``: the GP's on the [0, 1] log10(lr) axis (0: marginal likelihood);
    ``tau_growth`` / ``tau_max``: ``tau`` (and ``tau_prime`` with it) multiplied after each
    stage, up to ``tau_max`` (0: no cap); ``val_every``: steps between validation losses;
    ``loss_floor``: the lowest loss the forecast's asymptote ``c`` may take (0: cross-entropy
    and squared errors; ``None``: unbounded, which lets a still-falling curve extrapolate to
    any value).

    State (``state_dict`` / ``load_state_dict``, or ``tracked`` in a ``tf.train.Checkpoint``):
    stages done, the current stage's start, length and learning rate, and every stage's report.
    """

    def __init__(
        self,
        model: tf.keras.Model,
        optimizer: tf.keras.optimizers.Optimizer,
        train_step_fn: TrainStepFn,
        val_loss_fn: ValLossFn,
        *,
        tau: int = 1000,
        tau_prime: int = 0,
        lr_range: tuple[float, float] = (1e-5, 1e-2),
        candidates: int = 10,
        seed: int = 0,
        acquisition: str = "ei",
        length_scale: float = 0.0,
        tau_growth: float = 1.0,
        tau_max: int = 0,
        val_every: int = 1,
        loss_floor: float | None = 0.0,
    ) -> None:
        _check(
            tau, tau_prime, lr_range, candidates, acquisition, length_scale, tau_growth, val_every
        )
        if not (isinstance(tau_max, int) and (tau_max == 0 or tau_max >= tau)):
            raise ConfigError(
                f"[train] lr_schedule option tau_max = {tau_max!r}: expected 0 (no cap) or an "
                f"integer >= tau = {tau}"
            )
        if not (loss_floor is None or isinstance(loss_floor, (int, float))):
            raise ConfigError(
                f"[train] lr_schedule option loss_floor = {loss_floor!r}: expected a number"
            )
        lr_config = optimizer.get_config()["learning_rate"]  # a schedule's: its config dict
        if isinstance(lr_config, dict):
            raise ConfigError(
                "[train] lr_schedule = 'autolrs' needs an optimizer with a constant learning "
                f"rate, got {lr_config!r}"
            )
        self.model, self.optimizer = model, optimizer
        self.train_step_fn, self.val_loss_fn = train_step_fn, val_loss_fn
        self.tau, self.tau_prime, self.lr_range = int(tau), int(tau_prime), tuple(lr_range)
        self.candidates, self.seed, self.acquisition = int(candidates), int(seed), acquisition
        self.length_scale, self.val_every = float(length_scale), int(val_every)
        self.tau_growth, self.tau_max = float(tau_growth), int(tau_max)
        self.loss_floor = None if loss_floor is None else float(loss_floor)
        self.tracked = _Tracked()
        self._raw: bytes | None = None
        self._parsed: dict[str, Any] = {}
        self._set_state({"stage": 0, "stage_start": 0, "stage_tau": 0, "lr": None, "history": []})

    # -- state
    def _current(self) -> dict[str, Any]:
        """The state in ``tracked`` (a checkpoint restore included), parsed once per change."""
        raw = self.tracked.state.numpy()
        if raw != self._raw:
            self._raw, self._parsed = raw, json.loads(raw.decode())
        return self._parsed

    @property
    def state(self) -> dict[str, Any]:
        """A copy of the state."""
        return copy.deepcopy(self._current())

    def _set_state(self, state: Mapping[str, Any]) -> None:
        self.tracked.state.assign(json.dumps(state))

    def state_dict(self) -> dict[str, Any]:
        """The JSON-able state (write it beside the checkpoint it belongs to)."""
        return self.state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores ``state_dict()``'s state and the current stage's learning rate."""
        self._set_state(state)
        if state.get("lr") is not None:
            self.optimizer.learning_rate.assign(state["lr"])

    @property
    def history(self) -> list[dict[str, Any]]:
        """Each stage's report: candidates (lr, validation curve, fit, forecast), chosen lr,
        search steps and seconds."""
        return self.state["history"]

    def stage_lengths(self, stage: int) -> tuple[int, int]:
        """``(tau, tau_prime)`` of stage ``stage`` (0-based)."""
        tau = self.tau * self.tau_growth**stage
        tau = int(min(tau, self.tau_max) if self.tau_max else tau)
        prime = self.tau_prime * tau / self.tau if self.tau_prime else tau // 10
        return tau, max(int(prime), 1)

    def stage_due(self, step: int) -> bool:
        """True when the run at ``step`` has no stage or has trained its stage's ``tau`` steps."""
        s = self._current()
        return s["lr"] is None or step >= s["stage_start"] + s["stage_tau"]

    # -- the search
    def _variables(self) -> list[tf.Variable]:
        seen, out = set(), []
        for v in [*self.model.variables, *self.optimizer.variables]:
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
        return out

    def _candidate(self, lr: float, batches: Sequence[Any], start_loss: float) -> dict:
        self.optimizer.learning_rate.assign(lr)
        t, losses = [0], [start_loss]
        for i, batch in enumerate(batches, 1):
            self.train_step_fn(batch)
            if i % self.val_every == 0 or i == len(batches):
                t.append(i)
                losses.append(float(self.val_loss_fn()))
                if not math.isfinite(losses[-1]):
                    break
        return {"lr": lr, "t": t, "val_loss": losses, "steps": t[-1]}

    def _score(self, cand: dict, tau: int, cap: float) -> float:
        """The candidate's forecast at ``tau`` (recorded), clipped to ``cap`` for the GP."""
        losses = cand["val_loss"]
        forecast, fit = math.inf, None
        if all(math.isfinite(v) for v in losses) and len(losses) >= 3:
            fit = fit_exponential(cand["t"], losses, self.loss_floor)
            forecast = fit[0] * math.exp(-fit[1] * tau) + fit[2]
        cand["val_loss"] = [_finite(v) for v in losses]
        cand["fit"] = list(fit) if fit else None
        cand["forecast"] = _finite(forecast)
        return min(forecast, cap) if math.isfinite(forecast) else cap

    def search(self, batches: Sequence[Any], step: int) -> float:
        """Starts a stage at run step ``step``: tries the candidates on ``batches`` (its first
        ``tau_prime``) from the current weights, restores them, sets and returns the chosen
        learning rate."""
        state = self.state
        stage = state["stage"]
        tau, _ = self.stage_lengths(stage)
        t0 = time.time()
        variables = self._variables()
        snapshot = [tf.identity(v) for v in variables]
        start_loss = float(self.val_loss_fn())
        cap = start_loss + 2.0 * abs(start_loss) + 1e-8  # a diverging candidate's objective
        lo, hi = (math.log10(v) for v in self.lr_range)
        bo = BayesOpt1D(
            [self.seed, stage], acquisition=self.acquisition, length_scale=self.length_scale
        )
        tried, scores = [], []
        for _ in range(self.candidates):
            lr = 10.0 ** (lo + (hi - lo) * bo.ask())
            for v, s in zip(variables, snapshot, strict=True):
                v.assign(s)
            tried.append(self._candidate(lr, batches, start_loss))
            scores.append(self._score(tried[-1], tau, cap))
            bo.tell(scores[-1])
        for v, s in zip(variables, snapshot, strict=True):
            v.assign(s)
        best = tried[int(np.argmin(scores))]["lr"]
        self.optimizer.learning_rate.assign(best)
        report = {
            "stage": stage,
            "start_step": int(step),
            "tau": tau,
            "tau_prime": len(batches),
            "start_val_loss": _finite(start_loss),
            "candidates": tried,
            "chosen_lr": best,
            "search_steps": sum(c["steps"] for c in tried),
            "search_seconds": round(time.time() - t0, 3),
        }
        state.pop("stage_trained", None)  # set by run_stage once the stage is trained
        state.update(stage=stage + 1, stage_start=int(step), stage_tau=tau, lr=best)
        state["history"].append(report)
        self._set_state(state)
        return best

    def begin_stage(self, batches: Iterator[Any], step: int) -> Iterator[Any]:
        """For a loop that trains the stage itself: searches on the first ``tau_prime`` batches
        of ``batches`` and returns an iterator of those batches followed by the rest. Fewer
        than 2 batches left: no search (the learning rate stays), ``stage_due`` stays True."""
        _, prime = self.stage_lengths(self.state["stage"])
        head = list(itertools.islice(batches, prime))
        if len(head) >= 2:
            self.search(head, step)
        return itertools.chain(head, batches)

    def run_stage(self, batches: Iterator[Any] | Sequence[Any]) -> float:
        """One whole stage: the search on the first ``tau_prime`` of ``batches``, then the
        chosen learning rate trained ``tau`` steps from the stage's start weights (fewer when
        ``batches`` runs out; fewer than 2 batches: nothing is trained); returns the stage's
        learning rate. Stages follow each other: a stage starts where the last one ended."""
        before = self.state
        step = before["stage_start"] + before.get("stage_trained", before["stage_tau"])
        it = self.begin_stage(iter(batches), step)
        s = self.state
        if s["stage"] > before["stage"]:  # searched: train the stage
            trained = 0
            for batch in itertools.islice(it, s["stage_tau"]):
                self.train_step_fn(batch)
                trained += 1
            s["stage_trained"] = trained
            self._set_state(s)
        return s["lr"] if s["lr"] is not None else float(self.optimizer.learning_rate.numpy())

    def report(self) -> dict[str, Any]:
        """Stages, the learning rate each chose, and the steps spent searching."""
        h = self.history
        return {
            "stages": len(h),
            "learning_rates": [r["chosen_lr"] for r in h],
            "search_steps": sum(r["search_steps"] for r in h),
            "search_seconds": round(sum(r["search_seconds"] for r in h), 3),
        }


def _check(
    tau: int,
    tau_prime: int,
    lr_range: tuple[float, float],
    candidates: int,
    acquisition: str,
    length_scale: float,
    tau_growth: float,
    val_every: int,
) -> None:
    def bad(key: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(f"[train] lr_schedule option {key} = {value!r}: expected {expected}")

    def integer(value: Any, low: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= low

    if not integer(tau, 2):
        raise bad("tau", tau, "an integer >= 2")
    if not integer(val_every, 1):
        raise bad("val_every", val_every, "an integer >= 1")
    if not (integer(tau_prime, 0) and tau_prime < tau):
        raise bad("tau_prime", tau_prime, f"an integer in [0, tau = {tau}) (0: tau // 10)")
    prime = tau_prime or tau // 10
    if prime <= val_every:  # the fit needs the stage-start loss and >= 2 more
        raise bad(
            "tau_prime",
            tau_prime,
            f"a candidate of more than val_every = {val_every} steps "
            f"(tau_prime or tau // 10 is {prime})",
        )
    lo, hi = lr_range
    if not (0 < lo < hi and math.isfinite(hi)):
        raise bad("lr_min/lr_max", (lo, hi), "0 < lr_min < lr_max")
    if not (integer(candidates, _INITIAL_POINTS + 1)):
        raise bad("candidates", candidates, f"an integer >= {_INITIAL_POINTS + 1}")
    if acquisition not in ACQUISITIONS:
        raise bad("acquisition", acquisition, f"one of {list(ACQUISITIONS)}")
    if not length_scale >= 0:
        raise bad("length_scale", length_scale, "a number >= 0 (0: fit)")
    if not tau_growth >= 1:
        raise bad("tau_growth", tau_growth, "a number >= 1")


def make_autolrs(
    model: tf.keras.Model,
    optimizer: tf.keras.optimizers.Optimizer,
    train_step_fn: TrainStepFn,
    val_loss_fn: ValLossFn,
    *,
    base_lr: float,
    seed: int,
    **options: Any,
) -> AutoLRS:
    """The controller of ``[train.lr_schedule_options]`` (``AUTOLRS_OPTIONS``); ``base_lr``
    (``[train] learning_rate``) centres the default range ``[base_lr / 100, base_lr * 10]``.

    Raises:
      ConfigError: an unknown option, or one out of its range.
    """
    for key in options:
        if key not in AUTOLRS_OPTIONS:
            raise ConfigError(
                f"[train] lr_schedule = 'autolrs' has no option {key!r} (= {options[key]!r}); "
                f"accepted: {sorted(AUTOLRS_OPTIONS)}"
            )
    o = {**AUTOLRS_OPTIONS, **options}
    lr_range = (o.pop("lr_min") or base_lr / 100.0, o.pop("lr_max") or base_lr * 10.0)
    return AutoLRS(model, optimizer, train_step_fn, val_loss_fn, lr_range=lr_range, seed=seed, **o)


def validation_loss_fn(
    model: tf.keras.Model, batches: Sequence[Mapping[str, tf.Tensor]], label: str
) -> ValLossFn:
    """``val_loss_fn`` of a ranking model: the row-weighted mean ``model.task_loss`` of its
    inference logits against ``model.labels_of(features)`` over ``batches`` (a fixed held-out
    slice of the training data); ``label`` (a ``[batch]`` column) counts the rows."""

    @tf.function(autograph=False)
    def batch_loss(features: Mapping[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        rows = tf.cast(tf.shape(features[label])[0], tf.float32)
        logits = model(features, training=False)
        return model.task_loss(model.labels_of(features), logits) * rows, rows

    def val_loss() -> float:
        total, rows = 0.0, 0.0
        for features in batches:
            loss, n = batch_loss(features)
            total, rows = total + float(loss), rows + float(n)
        return total / max(rows, 1.0)

    return val_loss
