"""``[train] lr_schedule``: learning-rate schedules of the optimizer's step (docs/schedules.md).

Every schedule is a ``tf.keras.optimizers.schedules.LearningRateSchedule`` of the optimizer's
``iterations`` (the global step, checkpointed with the optimizer, so a resumed run continues
the schedule where it stopped), with a complete ``get_config``:

* ``constant``: ``base_lr`` at every step.
* ``step``: ``base_lr * gamma ** floor(step / step_size)``.
* ``cosine``: linear warm-up to ``base_lr`` over ``warmup_steps`` steps
  (``base_lr * (step + 1) / warmup_steps``), then half a cosine from ``base_lr`` down to
  ``min_lr`` at ``total_steps``, ``min_lr`` after.
* ``one_cycle``: Smith's one-cycle policy in its two-phase shape: from
  ``base_lr / div_factor`` up to ``base_lr`` (the peak) over the first ``pct_start`` of
  ``total_steps``, then down to ``base_lr / div_factor / final_div_factor`` at the last step,
  each phase a half cosine (``anneal = "cos"``) or a straight line (``anneal = "linear"``).
* ``cyclic``: cycles of ``cycle_steps`` steps, each from ``base_lr`` down to ``min_lr`` (a half
  cosine or a straight line, ``anneal``), then back up at once: the cyclic schedule of
  snapshot ensembles, whose low points (``CyclicSchedule.low_points``) are where a training
  loop collects its members (``pipelines.run.ensemble``, docs/ensembles.md).

``make_schedule(name, base_lr, total_steps, **options)`` builds one from the config's name and
options, naming the key, the value and the accepted ones in a ``ConfigError``. ``autolrs`` is
not a function of the step: ``pipelines.run.autolrs`` searches the learning rate while training.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from pipelines.config import ConfigError

LearningRateSchedule = tf.keras.optimizers.schedules.LearningRateSchedule


def _step(step: Any) -> tf.Tensor:
    return tf.cast(step, tf.float32)


class ConstantSchedule(LearningRateSchedule):
    """``base_lr`` at every step."""

    def __init__(self, base_lr: float) -> None:
        super().__init__()
        self.base_lr = float(base_lr)

    def __call__(self, step: Any) -> tf.Tensor:
        return tf.fill(tf.shape(_step(step)), tf.constant(self.base_lr, tf.float32))

    def get_config(self) -> dict[str, Any]:
        return {"base_lr": self.base_lr}


class StepSchedule(LearningRateSchedule):
    """``base_lr * gamma ** floor(step / step_size)``: a drop by ``gamma`` every
    ``step_size`` steps."""

    def __init__(self, base_lr: float, step_size: int, gamma: float = 0.1) -> None:
        super().__init__()
        self.base_lr, self.step_size, self.gamma = float(base_lr), int(step_size), float(gamma)

    def __call__(self, step: Any) -> tf.Tensor:
        drops = tf.floor(_step(step) / float(self.step_size))
        return self.base_lr * tf.pow(self.gamma, drops)

    def get_config(self) -> dict[str, Any]:
        return {"base_lr": self.base_lr, "step_size": self.step_size, "gamma": self.gamma}


class WarmupCosineSchedule(LearningRateSchedule):
    """Linear warm-up then cosine decay.

    Steps ``0 .. warmup_steps - 1``: ``base_lr * (step + 1) / warmup_steps`` (the last warm-up
    step is at ``base_lr``). Then, with ``p = (step - warmup_steps) / (total_steps -
    warmup_steps)`` clipped to [0, 1]: ``min_lr + (base_lr - min_lr) * (1 + cos(pi p)) / 2``.
    """

    def __init__(
        self, base_lr: float, total_steps: int, warmup_steps: int = 0, min_lr: float = 0.0
    ) -> None:
        super().__init__()
        self.base_lr, self.total_steps = float(base_lr), int(total_steps)
        self.warmup_steps, self.min_lr = int(warmup_steps), float(min_lr)

    def __call__(self, step: Any) -> tf.Tensor:
        t = _step(step)
        decay_steps = float(max(self.total_steps - self.warmup_steps, 1))
        p = tf.clip_by_value((t - self.warmup_steps) / decay_steps, 0.0, 1.0)
        cosine = self.min_lr + (self.base_lr - self.min_lr) * 0.5 * (1.0 + tf.cos(math.pi * p))
        if self.warmup_steps == 0:
            return cosine
        warm = self.base_lr * (t + 1.0) / float(self.warmup_steps)
        return tf.where(t < self.warmup_steps, warm, cosine)

    def get_config(self) -> dict[str, Any]:
        return {
            "base_lr": self.base_lr,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "min_lr": self.min_lr,
        }


class OneCycleSchedule(LearningRateSchedule):
    """Smith's one-cycle policy, two-phase shape.

    ``initial = max_lr / div_factor``, ``final = initial / final_div_factor``; the peak is at
    step ``u = pct_start * total_steps - 1``, the end at step ``total_steps - 1``. Phase 1
    (``step <= u``) goes from ``initial`` to ``max_lr`` with ``p = step / u``; phase 2 from
    ``max_lr`` to ``final`` with ``p = (step - u) / (total_steps - 1 - u)``, ``p`` clipped to
    [0, 1]. ``anneal = "cos"``: ``end + (start - end) * (1 + cos(pi p)) / 2``; ``"linear"``:
    ``start + (end - start) * p``.
    """

    def __init__(
        self,
        max_lr: float,
        total_steps: int,
        pct_start: float = 0.3,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        anneal: str = "cos",
    ) -> None:
        super().__init__()
        self.max_lr, self.total_steps = float(max_lr), int(total_steps)
        self.pct_start, self.div_factor = float(pct_start), float(div_factor)
        self.final_div_factor, self.anneal = float(final_div_factor), str(anneal)

    def _anneal(self, start: float, end: float, p: tf.Tensor) -> tf.Tensor:
        if self.anneal == "linear":
            return start + (end - start) * p
        return end + (start - end) * 0.5 * (1.0 + tf.cos(math.pi * p))

    def __call__(self, step: Any) -> tf.Tensor:
        t = _step(step)
        initial = self.max_lr / self.div_factor
        final = initial / self.final_div_factor
        up_end = max(self.pct_start * self.total_steps - 1.0, 1e-9)
        down_len = max(self.total_steps - 1.0 - up_end, 1e-9)
        up = self._anneal(initial, self.max_lr, tf.clip_by_value(t / up_end, 0.0, 1.0))
        p_down = tf.clip_by_value((t - up_end) / down_len, 0.0, 1.0)
        down = self._anneal(self.max_lr, final, p_down)
        return tf.where(t <= up_end, up, down)

    def get_config(self) -> dict[str, Any]:
        return {
            "max_lr": self.max_lr,
            "total_steps": self.total_steps,
            "pct_start": self.pct_start,
            "div_factor": self.div_factor,
            "final_div_factor": self.final_div_factor,
            "anneal": self.anneal,
        }


class CyclicSchedule(LearningRateSchedule):
    """Restarting decays: cycles of ``cycle_steps`` steps, each from ``max_lr`` to ``min_lr``.

    With ``c = step mod cycle_steps`` and ``p = c / (cycle_steps - 1)``: ``anneal = "cos"``
    gives ``min_lr + (max_lr - min_lr) * (1 + cos(pi p)) / 2``, ``anneal = "linear"`` gives
    ``max_lr - (max_lr - min_lr) * p`` (a sawtooth). Step ``k * cycle_steps`` is back at
    ``max_lr``; the last step of each cycle, ``k * cycle_steps - 1``, is at ``min_lr``: a low
    point. ``is_low_point(step)`` tells one; after the update made at a low point (the
    optimizer's ``iterations`` then being ``k * cycle_steps``) the model is at the bottom of
    cycle ``k``, where a snapshot ensemble takes a member.
    """

    def __init__(
        self, max_lr: float, cycle_steps: int, min_lr: float = 0.0, anneal: str = "cos"
    ) -> None:
        super().__init__()
        if int(cycle_steps) < 2:
            raise ValueError(f"CyclicSchedule: cycle_steps = {cycle_steps!r}: expected >= 2")
        self.max_lr, self.cycle_steps = float(max_lr), int(cycle_steps)
        self.min_lr, self.anneal = float(min_lr), str(anneal)

    def __call__(self, step: Any) -> tf.Tensor:
        c = tf.math.floormod(_step(step), float(self.cycle_steps))
        p = c / float(self.cycle_steps - 1)
        span = self.max_lr - self.min_lr
        if self.anneal == "linear":
            return self.max_lr - span * p
        return self.min_lr + span * 0.5 * (1.0 + tf.cos(math.pi * p))

    def is_low_point(self, step: int) -> bool:
        """True when the update made at ``step`` (the optimizer's ``iterations`` before it)
        uses ``min_lr``: the last step of a cycle."""
        return int(step) % self.cycle_steps == self.cycle_steps - 1

    def low_points(self, total_steps: int) -> list[int]:
        """The low-point steps of a run of ``total_steps`` updates (steps ``0 ..
        total_steps - 1``): one per complete cycle."""
        return list(range(self.cycle_steps - 1, int(total_steps), self.cycle_steps))

    def get_config(self) -> dict[str, Any]:
        return {
            "max_lr": self.max_lr,
            "cycle_steps": self.cycle_steps,
            "min_lr": self.min_lr,
            "anneal": self.anneal,
        }


#: ``[train] lr_schedule`` names of ``make_schedule`` and the options each accepts, with
#: their defaults.
SCHEDULE_OPTIONS: dict[str, dict[str, Any]] = {
    "constant": {},
    "step": {"step_size": None, "gamma": 0.1},
    "cosine": {"warmup_steps": 0, "min_lr": 0.0},
    "one_cycle": {"pct_start": 0.3, "div_factor": 25.0, "final_div_factor": 1e4, "anneal": "cos"},
    "cyclic": {"cycle_steps": None, "min_lr": 0.0, "anneal": "cos"},
}

#: Every ``[train] lr_schedule`` name: the step schedules and the AutoLRS search.
LR_SCHEDULES = (*SCHEDULE_OPTIONS, "autolrs")


def _positive(
    key: str, value: Any, *, integer: bool = False, zero: bool = False, option: bool = True
) -> None:
    kind = int if integer else (int, float)
    ok = isinstance(value, kind) and not isinstance(value, bool)
    ok = ok and (value >= 0 if zero else value > 0) and math.isfinite(value)
    if not ok:
        what = "an integer" if integer else "a number"
        bound = ">= 0" if zero else "> 0"
        where = "[train] lr_schedule option" if option else "[train]"
        raise ConfigError(f"{where} {key} = {value!r}: expected {what} {bound}")


def _check_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` over the defaults of schedule ``name``, each checked."""
    accepted = SCHEDULE_OPTIONS[name]
    for key in options:
        if key not in accepted:
            raise ConfigError(
                f"[train] lr_schedule = {name!r} has no option {key!r} (= {options[key]!r}); "
                f"accepted: {sorted(accepted) or 'none'}"
            )
    opts = {**accepted, **options}
    if name == "step":
        if opts["step_size"] is None:
            raise ConfigError("[train] lr_schedule = 'step' needs the option step_size")
        _positive("step_size", opts["step_size"], integer=True)
        _positive("gamma", opts["gamma"])
    elif name == "cosine":
        _positive("warmup_steps", opts["warmup_steps"], integer=True, zero=True)
        _positive("min_lr", opts["min_lr"], zero=True)
    elif name == "one_cycle":
        pct = opts["pct_start"]
        if not (isinstance(pct, (int, float)) and 0 < pct < 1):
            raise ConfigError(
                f"[train] lr_schedule option pct_start = {pct!r}: expected a number in (0, 1)"
            )
        _positive("div_factor", opts["div_factor"])
        _positive("final_div_factor", opts["final_div_factor"])
    elif name == "cyclic":
        _check_cyclic(opts)
    if "anneal" in opts and opts["anneal"] not in ("cos", "linear"):
        raise ConfigError(
            f"[train] lr_schedule option anneal = {opts['anneal']!r}: expected one of "
            "['cos', 'linear']"
        )
    return opts


def _check_cyclic(opts: dict[str, Any]) -> None:
    steps = opts["cycle_steps"]
    if steps is None:
        raise ConfigError("[train] lr_schedule = 'cyclic' needs the option cycle_steps")
    if not (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 2):
        raise ConfigError(
            f"[train] lr_schedule option cycle_steps = {steps!r}: expected an integer >= 2"
        )
    _positive("min_lr", opts["min_lr"], zero=True)


def make_schedule(
    name: str, base_lr: float, total_steps: int, **options: Any
) -> LearningRateSchedule:
    """The schedule ``[train] lr_schedule = name`` names, peaking at ``base_lr``
    (``[train] learning_rate``) over a run of ``total_steps`` optimizer steps.

    Raises:
      ConfigError: ``name`` is not a step schedule (``autolrs`` included: it is
        ``pipelines.run.autolrs.AutoLRS``), an option is unknown or out of range, or
        ``base_lr`` / ``total_steps`` is not positive.
    """
    if name not in SCHEDULE_OPTIONS:
        hint = " (autolrs is a search, made by pipelines.run.autolrs)" if name == "autolrs" else ""
        raise ConfigError(
            f"[train] lr_schedule = {name!r} is not a step schedule{hint}; expected one of "
            f"{sorted(SCHEDULE_OPTIONS)}"
        )
    _positive("learning_rate", base_lr, option=False)
    _positive("total_steps", total_steps, integer=True, option=False)
    opts = _check_options(name, options)
    if name == "constant":
        return ConstantSchedule(base_lr)
    if name == "step":
        return StepSchedule(base_lr, opts["step_size"], opts["gamma"])
    if name == "cosine":
        if opts["min_lr"] > base_lr:
            raise ConfigError(
                f"[train] lr_schedule option min_lr = {opts['min_lr']!r}: expected at most "
                f"learning_rate = {base_lr!r}"
            )
        return WarmupCosineSchedule(base_lr, total_steps, opts["warmup_steps"], opts["min_lr"])
    if name == "cyclic":
        return _make_cyclic(base_lr, total_steps, opts)
    return OneCycleSchedule(base_lr, total_steps, **opts)


def _make_cyclic(base_lr: float, total_steps: int, opts: dict[str, Any]) -> CyclicSchedule:
    if opts["min_lr"] > base_lr:
        raise ConfigError(
            f"[train] lr_schedule option min_lr = {opts['min_lr']!r}: expected at most "
            f"learning_rate = {base_lr!r}"
        )
    if opts["cycle_steps"] > total_steps:
        raise ConfigError(
            f"[train] lr_schedule option cycle_steps = {opts['cycle_steps']!r}: expected at "
            f"most total_steps = {total_steps!r} (the run would reach no low point)"
        )
    return CyclicSchedule(base_lr, opts["cycle_steps"], opts["min_lr"], opts["anneal"])


_SCHEDULE_CLASSES = {
    cls.__name__: cls
    for cls in (
        ConstantSchedule,
        StepSchedule,
        WarmupCosineSchedule,
        OneCycleSchedule,
        CyclicSchedule,
    )
}


def check_lr_schedule(name: str, options: Mapping[str, Any]) -> None:
    """Raises ConfigError when ``[train] lr_schedule`` is not one of ``LR_SCHEDULES`` or a step
    schedule's option is unknown or out of range (AutoLRS checks its own when it is made)."""
    if name not in LR_SCHEDULES:
        raise ConfigError(
            f"[train] lr_schedule = {name!r} is not a schedule; expected one of "
            f"{list(LR_SCHEDULES)}"
        )
    if name in SCHEDULE_OPTIONS:
        _check_options(name, options)


def run_learning_rate(
    name: str, base_lr: float, total_steps: int, options: Mapping[str, Any]
) -> float | LearningRateSchedule:
    """The learning rate ``make_optimizer`` gets for ``[train] lr_schedule = name``: the plain
    ``base_lr`` for ``constant`` and for ``autolrs`` (whose controller sets it stage by stage),
    else the schedule of the optimizer's step over a run of ``total_steps`` steps."""
    check_lr_schedule(name, options)
    if name in ("constant", "autolrs"):
        return base_lr
    return make_schedule(name, base_lr, total_steps, **options)


def learning_rate_of(optimizer: tf.keras.optimizers.Optimizer) -> float | LearningRateSchedule:
    """``optimizer``'s learning rate as ``make_optimizer`` takes it (a fresh optimizer made with
    it follows the same schedule): a copy of its schedule, else its constant value."""
    lr = optimizer.get_config()["learning_rate"]
    if isinstance(lr, dict):
        return tf.keras.optimizers.schedules.deserialize(lr, custom_objects=_SCHEDULE_CLASSES)
    return float(lr)
