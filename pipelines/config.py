"""The training config: typed dataclasses read from one TOML file.

::

    output_dir = "runs/movielens"       # relative paths resolve against this file's folder

    [data]
    schema = "movielens"                # a schema file, or the name of a shipped schema
    raw = ["../shared/data/movielens-latest-small/ratings.csv"]
    test_fraction = 0.2                 # random split of the raw rows, by split_seed
    validation_fraction = 0.1           # of the training rows: model selection, early stopping
    split_seed = 0
    # or, for Parquet shards whose columns are the schema's fields:
    # train = ["data/train"]
    # test = ["data/test"]            # with `train` only: `raw` rows split by test_fraction

    [model]                             # ranking.models.ModelConfig
    type = "dcn_v2"
    embedding_dim = 16
    mlp = [256, 128]
    # multi-task (ranking.multitask): task 0 is the primary task, the schema's first label
    # tasks = [{name = "click", label = "click"},
    #          {name = "buy", label = "buy", defined_on = "click", weight = 0.5}]
    # multitask = "esmm"                # shared_bottom | mmoe | ple | esmm

    [train]                             # the defaults
    batch_size = 256
    # epochs = 20                       # unset: an upper bound where early stopping ends the run
    learning_rate = 0.001
    seed = 0

    [vocab]                             # vocabularies of a run continued over a newer window
    decay = 1.0                         # earlier windows' counts times decay, once per window
    evict_after = 0                     # windows a value may go unseen (0: never evicted)

Flags are read only by the command line, which turns ``--set train.epochs=3`` into overrides
applied by ``load_config``.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from features.schema import _toml_value
from features.shards import VALIDATION_SPLITS
from pipelines.config_sections import (
    ConfigError,
    DistributeConfig,
    EngineConfig,
    FusionConfig,
    PairStatsConfig,
    VocabConfig,
)
from pipelines.config_types import type_error
from ranking.config import ModelConfig, PrerankConfig

_OPTIMIZERS = ("adam", "adagrad", "ftrl", "sgd", "lbfgs")
#: ``[train] lbfgs_c``'s default: scikit-learn's ``C`` values the L-BFGS path fits
#: (``pipelines.run.lbfgs``).
LBFGS_C_PATH = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
#: ``[train]`` values a ``type = "lr"`` model gets when its config file sets neither
#: ``optimizer`` nor ``learning_rate`` (each only where the file does not set it); measured in
#: docs/training.md#the-logistic-regression-baseline.
LINEAR_TRAIN_DEFAULTS = {"optimizer": "ftrl", "learning_rate": 0.1, "batch_size": 256}
#: ``[train] epochs`` of those configs when early stopping ends the run (a validation split and
#: ``early_stopping`` not false): an upper bound, not the usual single epoch.
LINEAR_EPOCHS_BOUND = 60
#: ``[train]`` values the config file of any other model type gets where it does not set them,
#: when validation selects its checkpoint (``averaged_train_defaults``): a moving average of the
#: weights, which lets the learning rate be three times Adam's usual 1e-3; chosen on validation
#: rows, measured in docs/training.md#defaults.
AVERAGED_TRAIN_DEFAULTS = {"weight_average": "ema", "learning_rate": 3e-3}
#: ``[train] epochs`` of any other config file that does not set it, when validation ends the
#: run (early stopping, or an ensemble's saturation): an upper bound, not the single epoch of
#: ``TrainConfig``; measured in docs/training.md#defaults.
EPOCHS_BOUND = 20
_SELECT_METRICS = ("auc", "logloss")
#: ``[data] input_format``: what the training loop reads (``pipelines.run.train_input``).
INPUT_FORMATS = ("parquet", "tfrecord")
#: ``[train] new_rows``: how a ``continue_from`` run starts the rows of new vocabulary values.
NEW_ROWS = ("oov", "mean", "zeros", "init")
#: ``[train] weight_average``: none, or an exponential moving average of the weights
#: (``pipelines.run.averaging``).
WEIGHT_AVERAGES = ("none", "ema")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the data comes from.

    Attributes:
      schema: schema file or shipped schema name.
      raw: raw files (any format the schema reads); converted to Parquet shards in the run's
        ``data/`` folder, split into train and test by ``test_fraction``.
      train, test: Parquet shards whose columns are the schema's fields (used as they are).
        ``test`` goes with ``train`` only: with ``raw`` the test rows are the ``test_fraction``
        split of the raw files, and a ``test`` next to ``raw`` is a ConfigError.
      validation: the validation files or shards (raw or Parquet, like ``train``/``test``); when
        given, ``validation_fraction`` is not used.
      validation_fraction: the fraction of the training rows held out as the validation split
        (never a test row); model selection and early stopping read it, never the test set.
        0: no validation split.
      validation_split: which training rows the fraction takes: ``hash`` (a sample by row
        hash and ``split_seed``, like the test split) or ``recent`` (the last rows in input
        order, files in the order given: for logs in time order whose test rows come later,
        so that selection reads the rows closest to them).
      max_bad_rows: bad raw rows to skip and count before failing (0: fail on the first).
        With ``train`` Parquet shards read as they are, a value above 0 reads them through the
        conversion into the run's ``data/`` folder instead, where bad rows are skipped and
        counted like raw ones.
      crosses: a cross artifact (``stitchrec crosses fives``) whose top ``cross_top_n`` crosses
        become hashed categorical fields computed inside the model ("": none).
      cross_top_n: how many of the artifact's ranked crosses to add.
      cross_hash_buckets: rows of every cross's table (0: per cross, twice the distinct value
        tuples the search saw, between 16 and 2^20).
      cap_hash_buckets: size each hashed field's table (``vocab = "hash"``) to the training
        split: ``min(hash_buckets, max(1024, 4 * distinct training values))`` rows
        (``features.stats.hash_rows``), fixed once with the run's statistics. false: the
        schema's ``hash_buckets``.
      input_format: what the training loop reads the training split from: ``parquet`` (the
        default: the Parquet shards, read by pyarrow in Python) or ``tfrecord`` (TFRecord
        shards written once into the run's ``data/tfrecord/train/`` and read by TensorFlow ops
        alone, ``features.tfrecord``; under parameter servers each worker reads its own share).
        Statistics, validation and test read Parquet either way.
    """

    schema: str
    raw: tuple[str, ...] = ()
    train: tuple[str, ...] = ()
    test: tuple[str, ...] = ()
    validation: tuple[str, ...] = ()
    test_fraction: float = 0.2
    validation_fraction: float = 0.1
    validation_split: str = "hash"
    split_seed: int = 0
    max_bad_rows: int = 0
    crosses: str = ""
    cross_top_n: int = 10
    cross_hash_buckets: int = 0
    cap_hash_buckets: bool = True
    input_format: str = "parquet"

    def __post_init__(self) -> None:
        if self.input_format not in INPUT_FORMATS:
            raise ConfigError(
                f"[data] input_format {self.input_format!r} is not one of {list(INPUT_FORMATS)}"
            )
        if not isinstance(self.cap_hash_buckets, bool):
            raise ConfigError(
                f"[data] cap_hash_buckets must be true or false, got {self.cap_hash_buckets!r}"
            )
        if self.cross_top_n < 1:
            raise ConfigError(f"[data] cross_top_n must be >= 1, got {self.cross_top_n}")
        if self.cross_hash_buckets < 0 or self.cross_hash_buckets == 1:
            raise ConfigError(
                f"[data] cross_hash_buckets must be 0 (auto) or >= 2, got {self.cross_hash_buckets}"
            )
        for key in ("raw", "train", "test", "validation"):
            value = getattr(self, key)
            object.__setattr__(self, key, (value,) if isinstance(value, str) else tuple(value))
        if bool(self.raw) == bool(self.train):
            raise ConfigError("[data]: give either `raw` files or `train` Parquet shards")
        if self.raw and self.test:
            raise ConfigError(
                "[data] raw and test: with `raw` files the test rows are their test_fraction "
                "split; give `test` only with `train` Parquet shards (or convert the raw "
                "files and name both splits' shards)"
            )
        if not 0.0 <= self.test_fraction < 1.0:
            raise ConfigError(f"[data] test_fraction must be in [0, 1), got {self.test_fraction}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ConfigError(
                f"[data] validation_fraction must be in [0, 1), got {self.validation_fraction}"
            )
        if self.max_bad_rows < 0:
            raise ConfigError(f"[data] max_bad_rows must be >= 0, got {self.max_bad_rows}")
        if self.validation_split not in VALIDATION_SPLITS:
            raise ConfigError(
                f"[data] validation_split {self.validation_split!r} is not one of "
                f"{list(VALIDATION_SPLITS)}"
            )
        if self.validation_split != "hash" and self.validation:
            raise ConfigError(
                f"[data] validation_split = {self.validation_split!r} splits the training rows, "
                "but validation files are given: set one or the other"
            )


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How to train.

    Attributes:
      batch_size, epochs, learning_rate: as usual. A config file that does not set ``epochs``
        and whose run ends by validation (early stopping or an ensemble's saturation; see
        ``_validation_ends_run``) gets ``EPOCHS_BOUND`` (20) as its upper bound.
      optimizer: ``adam``, ``adagrad``, ``ftrl`` or ``sgd``. In a config file with ``[model]
        type = "lr"`` that sets neither ``optimizer`` nor ``learning_rate``, they (and
        ``batch_size``, ``epochs`` where not set) are ``linear_train_defaults``'s (``ftrl`` at
        0.1, batch 256, at most 60 epochs with early stopping; docs/training.md). ``lbfgs``
        (``type = "lr"`` only, one process): the exact minimizer of the log loss plus scikit-
        learn's L2 penalty for each ``C`` of ``lbfgs_c``, the best chosen on validation
        (``pipelines.run.lbfgs``); ``batch_size``, ``epochs`` and ``learning_rate`` do not
        apply.
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

    def __post_init__(self) -> None:
        for key in ("batch_size", "epochs", "checkpoint_every", "log_every", "shuffle_buffer"):
            if getattr(self, key) < 1:
                raise ConfigError(f"[train] {key} must be >= 1, got {getattr(self, key)}")
        for key in ("max_steps", "continue_epochs"):
            if getattr(self, key) < 0:
                raise ConfigError(f"[train] {key} must be >= 0, got {getattr(self, key)}")
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


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    output_dir: str
    data: DataConfig
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    preranking: PrerankConfig | None = None  # [preranking]: FSCD / two-tower pre-ranking
    pair_stats: PairStatsConfig | None = None  # [pair_stats]: PCF-GNN / table pair statistics
    distribute: DistributeConfig | None = None  # [distribute]: multi-worker training
    fusion: FusionConfig | None = None  # [fusion]: generated kernels (compiler_opt)
    vocab: VocabConfig | None = None  # [vocab]: vocabularies across windows
    engine: EngineConfig | None = None  # [engine]: where the data jobs run

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def to_toml(self) -> str:
        d = self.to_dict()
        lines = [f"output_dir = {_toml_value(d.pop('output_dir'))}"]
        for section, values in d.items():
            lines += ["", f"[{section}]"]
            for k, v in values.items():
                if v is not None:
                    lines.append(f"{k} = {_toml_value(_without_none(v))}")
        return "\n".join(lines) + "\n"


def _without_none(value: Any) -> Any:
    """``value`` with the None entries of its tables (at any depth) left out: TOML has no null,
    and an absent key reads back as the field's None default (``[model] tasks``)."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_without_none(v) for v in value]
    return value


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Sets ``data[a][b]... = value`` for the dotted path ``a.b...`` (tables created as needed)."""
    keys = dotted.split(".")
    node = data
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted!r}: {k!r} is not a section")
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``"train.epochs=3"`` -> ``("train.epochs", 3)``; values are TOML (bare words: strings).

    The value then meets the same type checks as the config file's (``load_config``): e.g.
    ``train.deterministic=false`` is the boolean, ``train.batch_size=big`` a ConfigError.
    """
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. train.epochs=3")
    key, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip(), value


# Keys whose value may be one path instead of a list of them.
_PATH_LISTS = {"data": ("raw", "train", "test", "validation"), "pair_stats": ("graph_data",)}


def _sections() -> dict[str, type]:
    """The dataclass each config section builds, by section name."""
    return {
        "data": DataConfig,
        "model": ModelConfig,
        "train": TrainConfig,
        "preranking": PrerankConfig,
        "pair_stats": PairStatsConfig,
        "distribute": DistributeConfig,
        "fusion": FusionConfig,
        "vocab": VocabConfig,
        "engine": EngineConfig,
    }


def _table(data: Mapping[str, Any], section: str, where: str) -> dict[str, Any] | None:
    """Section ``section`` of ``data`` as a dict (None when absent), its values type-checked
    against its dataclass's annotations (a single path of a path list becomes a list)."""
    values = data.get(section)
    if values is None:
        return None
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: [{section}] must be a table, got {values!r}")
    values = dict(values)
    for key in _PATH_LISTS.get(section, ()):
        if isinstance(values.get(key), str):
            values[key] = [values[key]]
    problem = type_error(_sections()[section], values)
    if problem:
        raise ConfigError(f"{where} [{section}] {problem}")
    return values


def _build(cls: type, section: str, values: Mapping[str, Any], where: str) -> Any:
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ConfigError(
            f"{where} [{section}]: unknown keys {unknown}; allowed: {sorted(allowed)}"
        )
    problem = type_error(cls, values)
    if problem:
        raise ConfigError(f"{where} [{section}] {problem}")
    try:
        return cls(**values)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where} [{section}]: {e}") from None


def config_from_dict(
    data: Mapping[str, Any], *, base_dir: Path, where: str = "config"
) -> PipelineConfig:
    """Builds a PipelineConfig; relative paths are resolved against ``base_dir``.

    Every value is first checked against its field's annotation (``pipelines.config_types``).
    """
    data = dict(data)
    unknown = sorted(set(data) - {"output_dir", *_sections()})
    if unknown:
        raise ConfigError(f"{where}: unknown top-level keys {unknown}")
    if "output_dir" not in data:
        raise ConfigError(f"{where}: missing `output_dir`")
    if not isinstance(data["output_dir"], str):
        raise ConfigError(f"{where}: output_dir must be a string, got {data['output_dir']!r}")
    d = _table(data, "data", where)
    if d is None:
        raise ConfigError(f"{where}: missing [data] section")

    def resolve(p: str) -> str:
        return str(p) if Path(p).is_absolute() else str((base_dir / p).resolve())

    if "schema" not in d:
        raise ConfigError(f"{where} [data]: missing `schema`")
    if Path(d["schema"]).suffix:
        d["schema"] = resolve(d["schema"])
    for key in _PATH_LISTS["data"]:
        if key in d:
            d[key] = tuple(resolve(v) for v in d[key])
    if d.get("crosses"):
        d["crosses"] = resolve(d["crosses"])
    model = _table(data, "model", where) or {}
    if "mlp" in model:
        model["mlp"] = tuple(model["mlp"])
    train = _table(data, "train", where) or {}
    if train.get("optimizer") == "lbfgs" and model.get("type") != "lr":
        raise ConfigError(
            f"{where} [train] optimizer = 'lbfgs' fits a logistic regression exactly: it needs "
            f"[model] type = 'lr', got {model.get('type', 'dcn_v2')!r}"
        )
    if model.get("type") == "lr":
        train = {**linear_train_defaults(train, d, "distribute" in data), **train}
    elif "preranking" not in data:
        train = {**averaged_train_defaults(train, d, "distribute" in data), **train}
    bounded = "epochs" not in train and "preranking" not in data  # preranking: its own stages
    if bounded and _validation_ends_run(train, d, "distribute" in data):
        train["epochs"] = EPOCHS_BOUND
    for key in ("warm_start", "continue_from"):
        if train.get(key) and isinstance(train[key], str):
            train[key] = resolve(train[key])
    return PipelineConfig(
        output_dir=resolve(data["output_dir"]),
        data=_build(DataConfig, "data", d, where),
        model=_build(ModelConfig, "model", model, where),
        train=_build(TrainConfig, "train", train, where),
        preranking=_preranking(_table(data, "preranking", where), where),
        pair_stats=_pair_stats(_table(data, "pair_stats", where), where, resolve),
        distribute=_optional(DistributeConfig, "distribute", data, where),
        fusion=_optional(FusionConfig, "fusion", data, where),
        vocab=_optional(VocabConfig, "vocab", data, where),
        engine=_optional(EngineConfig, "engine", data, where),
    )


def linear_train_defaults(
    train: Mapping[str, Any], data: Mapping[str, Any], distributed: bool
) -> dict[str, Any]:
    """The ``[train]`` defaults of a ``type = "lr"`` config with these ``[train]`` / ``[data]``
    tables (a key the file sets wins over them).

    Empty when the file sets ``optimizer`` or ``learning_rate``: an explicit optimizer or rate
    is never reinterpreted. Otherwise ``LINEAR_TRAIN_DEFAULTS``, and ``epochs =
    LINEAR_EPOCHS_BOUND`` when early stopping ends the run: a validation split (``[data]
    validation`` files or ``validation_fraction`` > 0, default 0.1), ``early_stopping`` not
    false and no ``[distribute]`` section (whose runs do not select on validation).
    """
    if "optimizer" in train or "learning_rate" in train:
        return {}
    stops = _validation_ends_run(train, data, distributed)
    return {**LINEAR_TRAIN_DEFAULTS, **({"epochs": LINEAR_EPOCHS_BOUND} if stops else {})}


def averaged_train_defaults(
    train: Mapping[str, Any], data: Mapping[str, Any], distributed: bool
) -> dict[str, Any]:
    """The ``[train]`` defaults of a config of any model type but ``lr`` with these ``[train]``
    / ``[data]`` tables (a key the file sets wins over them).

    Where validation ends the run (``_validation_ends_run``) and the file asks for no ensemble:
    ``weight_average = "ema"``, and, when the file sets neither ``optimizer`` nor
    ``learning_rate`` and the weights are averaged, ``learning_rate = 3e-3``
    (``AVERAGED_TRAIN_DEFAULTS``). Otherwise none: ``TrainConfig``'s own defaults (no average,
    1e-3).
    """
    if train.get("ensemble", "none") != "none" or not _validation_ends_run(
        train, data, distributed
    ):
        return {}
    out = {"weight_average": AVERAGED_TRAIN_DEFAULTS["weight_average"]}
    averaged = train.get("weight_average", out["weight_average"]) == "ema"
    if averaged and "optimizer" not in train and "learning_rate" not in train:
        out["learning_rate"] = AVERAGED_TRAIN_DEFAULTS["learning_rate"]
    return out


def _validation_ends_run(
    train: Mapping[str, Any], data: Mapping[str, Any], distributed: bool
) -> bool:
    """Whether a run of these ``[train]`` / ``[data]`` tables ends by validation: a validation
    split (``validation`` files or ``validation_fraction`` > 0, default 0.1), no ``[distribute]``
    section, and early stopping not off, or an ensemble (whose snapshots' saturation ends
    it)."""
    fraction = data.get("validation_fraction", DataConfig.validation_fraction)
    # a fraction of the wrong type is reported when [data] is built
    has_validation = bool(data.get("validation")) or (
        isinstance(fraction, int | float) and fraction > 0
    )
    if not has_validation or distributed:
        return False
    return train.get("ensemble") == "auto" or train.get("early_stopping") is not False


def _optional(cls: type, section: str, data: Mapping[str, Any], where: str) -> Any:
    """An optional section without paths (``[fusion]``, ``[distribute]``, ``[vocab]``), or
    None."""
    values = _table(data, section, where)
    return None if values is None else _build(cls, section, values, where)


def _preranking(values: dict[str, Any] | None, where: str) -> PrerankConfig | None:
    """The optional ``[preranking]`` section (``PrerankConfig``), type-checked."""
    if values is None:
        return None
    for key in ("mlp", "tower_mlp"):
        if key in values:
            values[key] = tuple(values[key])
    return _build(PrerankConfig, "preranking", values, where)


def _pair_stats(values: dict[str, Any] | None, where: str, resolve: Any) -> PairStatsConfig | None:
    """The optional ``[pair_stats]`` section (``PairStatsConfig``), type-checked; paths
    resolved."""
    if values is None:
        return None
    if values.get("artifact"):
        values["artifact"] = resolve(values["artifact"])
    if "graph_data" in values:
        values["graph_data"] = tuple(resolve(v) for v in values["graph_data"])
    for key in ("pairs", "head"):
        if key in values:
            values[key] = tuple(tuple(v) if isinstance(v, list) else v for v in values[key])
    return _build(PairStatsConfig, "pair_stats", values, where)


def _check_override(key: str, value: Any, text: str) -> None:
    """Raises ConfigError naming ``--set text`` when its value does not fit the key's type."""
    section, _, name = key.partition(".")
    cls = _sections().get(section)
    if cls is None or "." in name:
        return  # an unknown section or key is reported with the whole config
    if isinstance(value, str) and name in _PATH_LISTS.get(section, ()):
        value = [value]
    problem = type_error(cls, {name: value})
    if problem:
        raise ConfigError(f"--set {text}: [{section}] {problem}")


def load_config(path: str | Path, overrides: list[str] | None = None) -> PipelineConfig:
    """Reads a TOML training config and applies ``KEY=VALUE`` overrides.

    Raises ConfigError naming the file (or the override), section, key, value and the expected
    type for a value of the wrong type, before any section is built.
    """
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {e}") from None
    for text in overrides or []:
        key, value = parse_override(text)
        _check_override(key, value, text)
        set_path(data, key, value)
    return config_from_dict(data, base_dir=p.resolve().parent, where=f"config file {str(p)!r}")
