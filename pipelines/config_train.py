"""``[train]`` of the training config: how a run trains, and the defaults a config file gets
where it leaves keys unset (``pipelines.config`` reads it)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipelines.config_sections import ConfigError

_OPTIMIZERS = ("adam", "adagrad", "ftrl", "sgd", "lbfgs", "auto")
#: ``[train] lbfgs_c``'s default: scikit-learn's ``C`` values the L-BFGS path fits
#: (``pipelines.run.lbfgs``).
LBFGS_C_PATH = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
#: ``[train]`` values a ``type = "lr"`` model gets when its config file sets no
#: ``learning_rate`` and no ``optimizer`` other than ``auto`` or ``ftrl`` (each only where the
#: file does not set it); measured in docs/training.md#the-logistic-regression-baseline.
LINEAR_TRAIN_DEFAULTS = {"optimizer": "auto", "learning_rate": 0.1, "batch_size": 256}
#: ``optimizer = "auto"`` fits exactly (``lbfgs``) up to this many training rows, where the
#: fit's time and memory (about 470 bytes a row for 39 fields) stay small; FTRL above it.
EXACT_FIT_ROWS = 250_000
#: ``[train] epochs`` of those configs when early stopping ends the run (a validation split and
#: ``early_stopping`` not false): an upper bound, not the usual single epoch.
LINEAR_EPOCHS_BOUND = 60
#: ``[train]`` values the config file of any other model type gets where it does not set them,
#: when validation selects its checkpoint (``pipelines.config.averaged_train_defaults``): a
#: moving average of the weights, which lets the learning rate be three times Adam's usual 1e-3;
#: chosen on validation rows, measured in docs/training.md#defaults.
AVERAGED_TRAIN_DEFAULTS = {"weight_average": "ema", "learning_rate": 3e-3}
#: ``[train] epochs`` of any other config file that does not set it, when validation ends the
#: run (early stopping, or an ensemble's saturation): an upper bound, not the single epoch of
#: ``TrainConfig``; measured in docs/training.md#defaults.
EPOCHS_BOUND = 20
_SELECT_METRICS = ("auc", "logloss")
#: ``[train] new_rows``: how a ``continue_from`` run starts the rows of new vocabulary values.
NEW_ROWS = ("oov", "mean", "zeros", "init")
#: ``[train] weight_average``: none, or an exponential moving average of the weights
#: (``pipelines.run.averaging``).
WEIGHT_AVERAGES = ("none", "ema")
#: ``[train] unseen_row``: what an OOV row no training row reaches holds (``pipelines.run.unseen``).
UNSEEN_ROWS = ("mean", "initial")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How to train.

    Attributes:
      batch_size, epochs, learning_rate: as usual. A config file that does not set ``epochs``
        and whose run ends by validation (early stopping or an ensemble's saturation; see
        ``pipelines.config._validation_ends_run``) gets ``EPOCHS_BOUND`` (20) as its upper bound.
      optimizer: ``adam``, ``adagrad``, ``ftrl`` or ``sgd``. ``lbfgs`` (``type = "lr"``
        only, one process): the exact minimizer of the log loss plus scikit-learn's L2 penalty
        for each ``C`` of ``lbfgs_c``, the best chosen on validation (``pipelines.run.lbfgs``);
        ``batch_size``, ``epochs`` and ``learning_rate`` do not apply. ``auto`` (``type =
        "lr"`` only): ``lbfgs`` where the run allows it and has at most ``EXACT_FIT_ROWS``
        training rows, else ``ftrl`` (``pipelines.run.lbfgs.choose_optimizer``; the run's log
        and report say which and why). In a config file with ``type = "lr"`` that sets neither
        ``optimizer`` nor ``learning_rate``, they (and ``batch_size``, ``epochs`` where not set)
        are ``pipelines.config.linear_train_defaults``'s (``auto``; FTRL's at 0.1, batch 256,
        at most 60 epochs with early stopping; docs/training.md).
      seed: model initialization and data order.
      checkpoint_every: steps between checkpoints (and at every epoch end).
      log_every: steps between progress lines and TensorBoard scalars.
      max_steps: stop after this many steps in total (0: no limit).
      shuffle_buffer: rows shuffled together.
      deterministic: ``tf.config.experimental.enable_op_determinism`` (bitwise-repeatable runs).
      warm_start: a finished training run whose weights start this one (same fields and
        architecture; an embedding method may change, e.g. AMTL behind the trained full tables).
      continue_from: a finished training run this one continues by value
        (``pipelines.run.continuation``): its selected checkpoint and optimizer state are
        restored, dense weights copied, embedding rows and their optimizer slots gathered by
        vocabulary value (the vocabularies may differ), the optimizer's step count carried
        over. Not together with ``warm_start``.
      continue_epochs: the ``epochs`` of a ``continue_from`` run (0: ``epochs``), so that one
        config trains a first window to early stopping and continues later windows for a
        smaller budget (``stitchrec daily``; docs/continuous.md measures one epoch).
      new_rows: how a ``continue_from`` run initialises the rows of values the previous run's
        vocabulary lacks: ``oov`` (the previous OOV row), ``mean`` (the mean of the previous
        vocabulary rows), ``zeros``, or ``init`` (the new model's own initial rows).
      eval_every: steps between validation evaluations, besides the one at every epoch end
        (0: at epoch ends only).
      early_stopping: stop once ``patience`` validation evaluations in a row did not improve
        ``select_metric`` by more than ``min_delta`` (None: true when there is a validation
        split). The best checkpoint is kept and scored either way.
      select_metric: ``auc`` (higher is better) or ``logloss`` (lower is better).
      patience: validation evaluations without improvement before stopping (>= 1).
      min_delta: the least change of ``select_metric`` that counts as an improvement (>= 0).
      lr_schedule: how the learning rate moves (``pipelines.run.schedules.LR_SCHEDULES``:
        ``constant``, ``step``, ``cosine``, ``one_cycle``, ``autolrs``; docs/schedules.md);
        ``learning_rate`` is its base.
      lr_schedule_options: the chosen schedule's options (``[train.lr_schedule_options]``).
      ensemble: ``none``, or ``auto``: Auto-Ensemble's snapshots of the run under a cyclic
        learning rate, collected until they saturate, members chosen on validation and exported
        as one SavedModel (``pipelines.run.snapshots``; docs/ensembles.md).
      ensemble_options: the saturation and selection rules (``[train.ensemble_options]``,
        ``pipelines.run.snapshots.ENSEMBLE_OPTIONS``).
      weight_average: ``none``, or ``ema``: an exponential moving average of the weights follows
        the steps; validation, the best checkpoint, the test and the export read the average
        (``pipelines.run.averaging``; docs/training.md). Needs a validation split. A config file
        of any model type but ``lr`` whose run ends by validation gets ``ema``, and then
        ``learning_rate = 3e-3`` where it sets neither ``optimizer`` nor ``learning_rate``
        (``AVERAGED_TRAIN_DEFAULTS``); ``TrainConfig()`` built in code keeps ``none`` and 1e-3.
      ema_decay: the average's long-run decay, in (0, 1); it reaches it after about
        ``10 / (1 - ema_decay)`` steps.
      lbfgs_c: the ``C`` values (scikit-learn's inverse L2 strength; ``l2_wide = 1 / (2 * C *
        rows)``) that ``optimizer = "lbfgs"`` fits, smallest first, each from the previous fit.
      lbfgs_max_iterations: L-BFGS iterations per value of ``lbfgs_c`` at most.
      unseen_row: ``mean``: the OOV row of a ``full`` embedding table that no training row
        reaches holds the count-weighted mean of the field's rows in every checkpoint, so a
        value first seen after training reads the average seen value's vector; ``initial``:
        the row keeps its initialization (``pipelines.run.unseen``; docs/training.md).
    """

    batch_size: int = 256
    epochs: int = 1
    learning_rate: float = 1e-3
    optimizer: str = "adam"
    seed: int = 0
    checkpoint_every: int = 500
    log_every: int = 100
    max_steps: int = 0
    shuffle_buffer: int = 262_144
    deterministic: bool = False
    warm_start: str = ""
    continue_from: str = ""
    continue_epochs: int = 0
    new_rows: str = "oov"
    eval_every: int = 0
    early_stopping: bool | None = None
    select_metric: str = "auc"
    patience: int = 2
    min_delta: float = 0.0
    lr_schedule: str = "constant"
    lr_schedule_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    ensemble: str = "none"
    ensemble_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    weight_average: str = "none"
    ema_decay: float = 0.999
    lbfgs_c: tuple[float, ...] = LBFGS_C_PATH
    lbfgs_max_iterations: int = 1_000
    unseen_row: str = "mean"

    def __post_init__(self) -> None:
        for key in ("batch_size", "epochs", "checkpoint_every", "log_every", "shuffle_buffer"):
            if getattr(self, key) < 1:
                raise ConfigError(f"[train] {key} must be >= 1, got {getattr(self, key)}")
        for key in ("max_steps", "continue_epochs"):
            if getattr(self, key) < 0:
                raise ConfigError(f"[train] {key} must be >= 0, got {getattr(self, key)}")
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"[train] seed must be an integer in [0, 2**32), got {self.seed}")
        if not self.learning_rate > 0:
            raise ConfigError(f"[train] learning_rate must be > 0, got {self.learning_rate}")
        if self.optimizer not in _OPTIMIZERS:
            raise ConfigError(
                f"[train] optimizer {self.optimizer!r} is not one of {list(_OPTIMIZERS)}"
            )
        if self.new_rows not in NEW_ROWS:
            raise ConfigError(f"[train] new_rows {self.new_rows!r} is not one of {list(NEW_ROWS)}")
        if self.continue_from and self.warm_start:
            raise ConfigError(
                f"[train] continue_from = {self.continue_from!r} and warm_start = "
                f"{self.warm_start!r}: set one of them (continue_from copies by value, "
                "warm_start by position)"
            )
        if self.weight_average not in WEIGHT_AVERAGES:
            raise ConfigError(
                f"[train] weight_average {self.weight_average!r} is not one of "
                f"{list(WEIGHT_AVERAGES)}"
            )
        if self.unseen_row not in UNSEEN_ROWS:
            raise ConfigError(
                f"[train] unseen_row {self.unseen_row!r} is not one of {list(UNSEEN_ROWS)}"
            )
        if not 0.0 < self.ema_decay < 1.0:
            raise ConfigError(f"[train] ema_decay must be in (0, 1), got {self.ema_decay}")
        if self.weight_average != "none" and self.ensemble != "none":
            raise ConfigError(
                f"[train] weight_average = {self.weight_average!r} with ensemble = "
                f"{self.ensemble!r}: the ensemble's members are snapshots of the trained "
                "weights; set one of them"
            )
        self._check_selection()
        self._check_lbfgs()

    def _check_lbfgs(self) -> None:
        """``lbfgs_c`` (positive, distinct; kept as floats) and what ``optimizer = "lbfgs"``
        cannot be combined with."""
        path = tuple(self.lbfgs_c)
        if not path or not all(isinstance(c, int | float) and c > 0 for c in path):
            raise ConfigError(f"[train] lbfgs_c must be a list of values > 0, got {list(path)}")
        if len(set(path)) != len(path):
            raise ConfigError(f"[train] lbfgs_c has a value twice: {list(path)}")
        object.__setattr__(self, "lbfgs_c", tuple(float(c) for c in path))
        if self.lbfgs_max_iterations < 1:
            raise ConfigError(
                f"[train] lbfgs_max_iterations must be >= 1, got {self.lbfgs_max_iterations}"
            )
        if self.optimizer != "lbfgs":
            return
        others = {
            "lr_schedule": ("constant", self.lr_schedule),
            "ensemble": ("none", self.ensemble),
            "weight_average": ("none", self.weight_average),
            "warm_start": ("", self.warm_start),
            "continue_from": ("", self.continue_from),
        }
        for key, (expected, value) in others.items():
            if value != expected:
                raise ConfigError(
                    f"[train] optimizer = 'lbfgs' with {key} = {value!r}: L-BFGS fits each "
                    f"value of lbfgs_c exactly from the previous fit; set {key} = {expected!r}"
                )

    def run_epochs(self) -> TrainConfig:
        """This config with the epochs its run trains: ``continue_epochs`` where it continues
        a run (``continue_from``) and sets them, else itself."""
        if self.continue_from and self.continue_epochs:
            return dataclasses.replace(self, epochs=self.continue_epochs)
        return self

    def _check_selection(self) -> None:
        """The validation-driven keys: eval_every, early_stopping, select_metric, patience,
        min_delta."""
        if self.eval_every < 0:
            raise ConfigError(f"[train] eval_every must be >= 0 (steps), got {self.eval_every}")
        if self.early_stopping is not None and not isinstance(self.early_stopping, bool):
            raise ConfigError(
                f"[train] early_stopping must be true or false, got {self.early_stopping!r}"
            )
        if self.select_metric not in _SELECT_METRICS:
            raise ConfigError(
                f"[train] select_metric {self.select_metric!r} is not one of "
                f"{list(_SELECT_METRICS)}"
            )
        if self.patience < 1:
            raise ConfigError(f"[train] patience must be >= 1 (evaluations), got {self.patience}")
        if not self.min_delta >= 0:
            raise ConfigError(f"[train] min_delta must be >= 0, got {self.min_delta}")
