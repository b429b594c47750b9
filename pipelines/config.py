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
from pipelines.config_data import DataConfig
from pipelines.config_sections import (
    ConfigError,
    DistributeConfig,
    EngineConfig,
    FusionConfig,
    PairStatsConfig,
    VocabConfig,
)
from pipelines.config_train import (
    AVERAGED_TRAIN_DEFAULTS,
    EPOCHS_BOUND,
    LINEAR_EPOCHS_BOUND,
    LINEAR_TRAIN_DEFAULTS,
    TrainConfig,
)
from pipelines.config_types import type_error
from ranking.config import ModelConfig, PrerankConfig


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
    if train.get("optimizer") in ("lbfgs", "auto") and model.get("type") != "lr":
        raise ConfigError(
            f"{where} [train] optimizer = {train['optimizer']!r} fits a logistic regression "
            f"exactly (auto: where it can): it needs [model] type = 'lr', got "
            f"{model.get('type', 'dcn_v2')!r}"
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

    Empty when the file sets ``learning_rate``, or an ``optimizer`` other than ``auto`` and
    ``ftrl``: an explicit rate, or another optimizer's, is never reinterpreted. Otherwise
    ``LINEAR_TRAIN_DEFAULTS`` (``optimizer = "auto"`` and FTRL's rate and batch size), and
    ``epochs = LINEAR_EPOCHS_BOUND`` when early stopping ends the run: a validation split
    (``[data] validation`` files or ``validation_fraction`` > 0, default 0.1),
    ``early_stopping`` not false and no ``[distribute]`` section (whose runs do not select on
    validation).
    """
    if "learning_rate" in train or train.get("optimizer", "auto") not in ("auto", "ftrl"):
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
    """Raises ConfigError naming ``--set text`` when its section or key is unknown or its value
    does not fit the key's type."""
    section, _, name = key.partition(".")
    if not name:  # a top-level key (output_dir): checked with the whole config
        return
    cls = _sections().get(section)
    if cls is None:
        raise ConfigError(
            f"--set {text}: unknown section {section!r}; expected one of "
            f"{sorted(_sections())} (or output_dir)"
        )
    if "." in name:  # a key inside a table value: checked with the whole config
        return
    allowed = {f.name for f in dataclasses.fields(cls)}
    if name not in allowed:
        raise ConfigError(
            f"--set {text}: [{section}] unknown key {name!r}; allowed: {sorted(allowed)}"
        )
    if isinstance(value, str) and name in _PATH_LISTS.get(section, ()):
        value = [value]
    problem = type_error(cls, {name: value})
    if problem:
        raise ConfigError(f"--set {text}: [{section}] {problem}")


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """The TOML table of the file ``path``; ConfigError naming ``what`` (e.g. ``config
    file``) and the path when it does not exist, is a folder, is not UTF-8 text or not TOML."""
    if not path.exists():
        raise ConfigError(f"{what} {str(path)!r} does not exist")
    if path.is_dir():
        raise ConfigError(f"{what} {str(path)!r} is a folder: expected a TOML file")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{what} {str(path)!r} is not UTF-8 text (byte {e.start}): expected a TOML file"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{what} {str(path)!r} is not valid TOML: {e}") from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> PipelineConfig:
    """Reads a TOML training config and applies ``KEY=VALUE`` overrides.

    Raises ConfigError naming the file (or the override), section, key, value and the expected
    type for a value of the wrong type, before any section is built.
    """
    p = Path(path)
    data = read_toml(p, "config file")
    for text in overrides or []:
        key, value = parse_override(text)
        _check_override(key, value, text)
        set_path(data, key, value)
    return config_from_dict(data, base_dir=p.resolve().parent, where=f"config file {str(p)!r}")
