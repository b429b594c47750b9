"""The training config: typed dataclasses read from one TOML file.

::

    output_dir = "runs/movielens"       # relative paths resolve against this file's folder

    [data]
    schema = "movielens"                # a schema file, or the name of a shipped schema
    raw = ["../shared/data/movielens-latest-small/ratings.csv"]
    test_fraction = 0.2                 # random split of the raw rows, by split_seed
    split_seed = 0
    # or, for Parquet shards whose columns are the schema's fields:
    # train = ["data/train"]
    # test = ["data/test"]

    [model]                             # ranking.models.ModelConfig
    type = "dcn_v2"
    embedding_dim = 16
    mlp = [256, 128]

    [train]
    batch_size = 1024
    epochs = 1
    learning_rate = 0.001
    seed = 0

Flags are read only by the command line, which turns ``--set train.epochs=3`` into overrides
applied by ``load_config``.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ranking.config import ModelConfig

_OPTIMIZERS = ("adam", "adagrad", "sgd")


class ConfigError(ValueError):
    """A training config is invalid; the message names the file and key."""


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the data comes from.

    Attributes:
      schema: schema file or shipped schema name.
      raw: raw files (any format the schema reads); converted to Parquet shards in the run's
        ``data/`` folder, split into train and test by ``test_fraction``.
      train, test: Parquet shards whose columns are the schema's fields (used as they are).
      max_bad_rows: bad raw rows to skip and count before failing (0: fail on the first).
    """

    schema: str
    raw: tuple[str, ...] = ()
    train: tuple[str, ...] = ()
    test: tuple[str, ...] = ()
    test_fraction: float = 0.2
    split_seed: int = 0
    max_bad_rows: int = 0

    def __post_init__(self) -> None:
        for key in ("raw", "train", "test"):
            value = getattr(self, key)
            object.__setattr__(self, key, (value,) if isinstance(value, str) else tuple(value))
        if bool(self.raw) == bool(self.train):
            raise ConfigError("[data]: give either `raw` files or `train` Parquet shards")
        if not 0.0 <= self.test_fraction < 1.0:
            raise ConfigError(f"[data] test_fraction must be in [0, 1), got {self.test_fraction}")
        if self.max_bad_rows < 0:
            raise ConfigError(f"[data] max_bad_rows must be >= 0, got {self.max_bad_rows}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How to train.

    Attributes:
      batch_size, epochs, learning_rate: as usual.
      optimizer: ``adam``, ``adagrad`` or ``sgd``.
      seed: model initialization and data order.
      checkpoint_every: steps between checkpoints (and at every epoch end).
      log_every: steps between progress lines and TensorBoard scalars.
      max_steps: stop after this many steps in total (0: no limit).
      shuffle_buffer: rows shuffled together.
      deterministic: ``tf.config.experimental.enable_op_determinism`` (bitwise-repeatable runs).
      warm_start: a finished training run whose weights start this one (same fields and
        architecture; an embedding method may change, e.g. AMTL behind the trained full tables).
    """

    batch_size: int = 1024
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

    def __post_init__(self) -> None:
        for key in ("batch_size", "epochs", "checkpoint_every", "log_every", "shuffle_buffer"):
            if getattr(self, key) < 1:
                raise ConfigError(f"[train] {key} must be >= 1, got {getattr(self, key)}")
        if self.max_steps < 0:
            raise ConfigError(f"[train] max_steps must be >= 0, got {self.max_steps}")
        if not self.learning_rate > 0:
            raise ConfigError(f"[train] learning_rate must be > 0, got {self.learning_rate}")
        if self.optimizer not in _OPTIMIZERS:
            raise ConfigError(
                f"[train] optimizer {self.optimizer!r} is not one of {list(_OPTIMIZERS)}"
            )


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    output_dir: str
    data: DataConfig
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        from features.schema import _toml_value

        d = self.to_dict()
        lines = [f"output_dir = {_toml_value(d.pop('output_dir'))}"]
        for section, values in d.items():
            lines += ["", f"[{section}]"]
            for k, v in values.items():
                if v is not None:
                    lines.append(f"{k} = {_toml_value(v)}")
        return "\n".join(lines) + "\n"


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted!r}: {k!r} is not a section")
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``"train.epochs=3"`` -> ``("train.epochs", 3)``; values are TOML (bare words: strings)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. train.epochs=3")
    key, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip(), value


def _build(cls: type, section: str, values: Mapping[str, Any], where: str) -> Any:
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ConfigError(
            f"{where} [{section}]: unknown keys {unknown}; allowed: {sorted(allowed)}"
        )
    try:
        return cls(**values)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where} [{section}]: {e}") from None


def config_from_dict(
    data: Mapping[str, Any], *, base_dir: Path, where: str = "config"
) -> PipelineConfig:
    """Builds a PipelineConfig; relative paths are resolved against ``base_dir``."""
    data = dict(data)
    unknown = sorted(set(data) - {"output_dir", "data", "model", "train"})
    if unknown:
        raise ConfigError(f"{where}: unknown top-level keys {unknown}")
    if "output_dir" not in data:
        raise ConfigError(f"{where}: missing `output_dir`")
    if "data" not in data:
        raise ConfigError(f"{where}: missing [data] section")
    d = dict(data["data"])

    def resolve(p: str) -> str:
        return str(p) if Path(p).is_absolute() else str((base_dir / p).resolve())

    if "schema" not in d:
        raise ConfigError(f"{where} [data]: missing `schema`")
    schema = str(d["schema"])
    if Path(schema).suffix:
        d["schema"] = resolve(schema)
    for key in ("raw", "train", "test"):
        if key in d:
            values = [d[key]] if isinstance(d[key], str) else list(d[key])
            d[key] = tuple(resolve(v) for v in values)
    model = dict(data.get("model", {}))
    if "mlp" in model:
        model["mlp"] = tuple(model["mlp"])
    train = dict(data.get("train", {}))
    if train.get("warm_start"):
        train["warm_start"] = resolve(str(train["warm_start"]))
    return PipelineConfig(
        output_dir=resolve(str(data["output_dir"])),
        data=_build(DataConfig, "data", d, where),
        model=_build(ModelConfig, "model", model, where),
        train=_build(TrainConfig, "train", train, where),
    )


def load_config(path: str | Path, overrides: list[str] | None = None) -> PipelineConfig:
    """Reads a TOML training config and applies ``KEY=VALUE`` overrides."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {e}") from None
    for text in overrides or []:
        key, value = parse_override(text)
        _set_path(data, key, value)
    return config_from_dict(data, base_dir=p.resolve().parent, where=f"config file {str(p)!r}")
