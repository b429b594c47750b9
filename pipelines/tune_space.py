"""The search space of ``stitchrec tune``: the ``[tune]`` section (or a ``--space`` file) read
into checked parameters, and the default space.

Keys are dotted config paths (``train.learning_rate``, ``model.mlp``); a bare key name of
``[train]`` or ``[model]`` (``learning_rate``, ``dropout``) stands for its section's key. Values
are a range ``{low, high[, log][, step]}`` (an integer range when both bounds are integers) or
``{choices = [...]}`` (any TOML values, lists too)::

    [tune]
    learning_rate = {low = 1e-4, high = 1e-1, log = true}
    batch_size = {choices = [256, 512, 1024]}
    model.mlp = {choices = [[64], [128, 64]]}
    train.epochs = {low = 1, high = 3}

Only ``[train]`` and ``[model]`` keys can be searched: a ``[data]`` key would change the
validation split the trials are compared on.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipelines.config import ConfigError, TrainConfig
from ranking.config import ModelConfig

#: The space searched when neither the config's [tune] section nor --space gives one.
#: ``model.mlp`` is searched for the MLP models only (dnn, dcn_v2).
DEFAULT_SPACE: dict[str, dict[str, Any]] = {
    "train.learning_rate": {"low": 1e-4, "high": 1e-1, "log": True},
    "train.batch_size": {"choices": [256, 512, 1024]},
    "model.embedding_dim": {"choices": [8, 16, 32]},
    "model.dropout": {"low": 0.0, "high": 0.3},
    "model.l2": {"low": 1e-8, "high": 1e-3, "log": True},
}
DEFAULT_MLP = {"choices": [[64], [128, 64], [256, 128]]}

_SECTIONS: dict[str, set[str]] = {
    "train": {f.name for f in dataclasses.fields(TrainConfig)},
    "model": {f.name for f in dataclasses.fields(ModelConfig)},
}
_FIXED = {  # keys a trial may not change: the comparison of the trials depends on them
    "train.select_metric": "it is the metric the trials are compared on",
    "train.warm_start": "it is a path, not a hyper-parameter",
    "train.continue_from": "it is a path, not a hyper-parameter",
}
_SPEC_KEYS = {"low", "high", "log", "step", "choices"}
#: The Optuna study's user attribute that records its search space (``check_study_space``).
SPACE_ATTR = "space"


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched config key: a numeric range (``low``, ``high``, ``log``, ``step``; an
    integer range when both bounds are integers) or a list of ``choices``."""

    key: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()

    def labels(self) -> list[Any]:
        """The choices as Optuna stores them: scalars as they are, lists as JSON text."""
        return [
            c if isinstance(c, bool | int | float | str) else json.dumps(c) for c in self.choices
        ]

    def suggest(self, trial: Any) -> Any:
        """The trial's value of this key (sampled, or the enqueued one)."""
        if self.choices:
            return self.decode(trial.suggest_categorical(self.key, self.labels()))
        if self.is_int:
            return trial.suggest_int(
                self.key, self.low, self.high, step=self.step or 1, log=self.log
            )
        return trial.suggest_float(self.key, self.low, self.high, step=self.step, log=self.log)

    @property
    def is_int(self) -> bool:
        return all(isinstance(v, int) and not isinstance(v, bool) for v in (self.low, self.high))

    def decode(self, stored: Any) -> Any:
        """The config value of a stored parameter (a choice's label back to the choice)."""
        return self.choices[self.labels().index(stored)] if self.choices else stored

    def extremes(self) -> list[Any]:
        return list(self.choices) if self.choices else [self.low, self.high]

    def describe(self) -> dict[str, Any]:
        if self.choices:
            return {"choices": list(self.choices)}
        return {"low": self.low, "high": self.high, "log": self.log, "step": self.step}


def _flatten(table: Mapping[str, Any], where: str, prefix: str = "") -> dict[str, dict]:
    """``{"model": {"mlp": {...}}}`` (a dotted TOML key) -> ``{"model.mlp": {...}}``."""
    flat: dict[str, dict] = {}
    for name, value in table.items():
        key = f"{prefix}{name}"
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{where} {key} = {value!r}: expected a range {{low = .., high = ..}} or "
                "{choices = [..]}"
            )
        if set(value) & _SPEC_KEYS or not value:
            flat[key] = dict(value)
        else:
            flat.update(_flatten(value, where, f"{key}."))
    return flat


def _resolve_key(key: str, where: str) -> str:
    """``learning_rate`` -> ``train.learning_rate``; a dotted key is checked as it is."""
    parts = key.split(".")
    if len(parts) == 1:
        owners = [s for s, names in _SECTIONS.items() if key in names]
        if len(owners) != 1:
            raise ConfigError(
                f"{where} {key}: not a [train] or [model] key; name it section.key, e.g. "
                "train.learning_rate or model.embedding_dim"
            )
        parts = [owners[0], key]
    section, name = parts[0], ".".join(parts[1:])
    if section not in _SECTIONS:
        raise ConfigError(
            f"{where} {key}: only [train] and [model] keys can be searched, not [{section}] "
            "(a [data] key would change the validation split the trials are compared on)"
        )
    if name not in _SECTIONS[section]:
        raise ConfigError(
            f"{where} {key}: [{section}] has no key {name!r}; keys: {sorted(_SECTIONS[section])}"
        )
    dotted = f"{section}.{name}"
    if dotted in _FIXED:
        raise ConfigError(f"{where} {dotted}: cannot be searched, {_FIXED[dotted]}")
    return dotted


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _param(key: str, spec: Mapping[str, Any], where: str) -> Param:
    """A checked ``Param`` from one ``[tune]`` entry."""
    at = f"{where} {key}"
    unknown = sorted(set(spec) - _SPEC_KEYS)
    if unknown or not spec:
        raise ConfigError(
            f"{at}: unknown keys {unknown}; a range is {{low, high[, log][, step]}}, "
            "a list is {choices = [..]}"
        )
    if "choices" in spec:
        choices = spec["choices"]
        if set(spec) != {"choices"}:
            raise ConfigError(
                f"{at}: choices cannot be combined with {sorted(set(spec) - {'choices'})}"
            )
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{at}: choices must be a non-empty list, got {choices!r}")
        return Param(key, choices=tuple(choices))
    low, high, log, step = (
        spec.get("low"),
        spec.get("high"),
        spec.get("log", False),
        spec.get("step"),
    )
    if not (_number(low) and _number(high)):
        raise ConfigError(
            f"{at}: a range needs numbers low and high, got low={low!r} high={high!r}"
        )
    if not low < high:
        raise ConfigError(f"{at}: low must be < high, got low={low!r} high={high!r}")
    if not isinstance(log, bool):
        raise ConfigError(f"{at}: log must be true or false, got {log!r}")
    if log and low <= 0:
        raise ConfigError(f"{at}: a log range needs low > 0, got low={low!r}")
    if step is not None and not (_number(step) and step > 0):
        raise ConfigError(f"{at}: step must be a number > 0, got {step!r}")
    if log and step is not None:
        raise ConfigError(f"{at}: give log or step, not both")
    p = Param(key, low=low, high=high, log=log, step=step)
    if p.is_int and step is not None and not isinstance(step, int):
        raise ConfigError(f"{at}: an integer range needs an integer step, got {step!r}")
    return p


def parse_space(table: Mapping[str, Any], where: str) -> list[Param]:
    """The checked parameters of a ``[tune]`` table (names and ranges; values: ``check_space``)."""
    flat = _flatten(table, where)
    if not flat:
        raise ConfigError(
            f"{where}: no parameters; give e.g. learning_rate = {{low = 1e-4, high = 0.1, log = true}}"
        )
    params: dict[str, Param] = {}
    for key, spec in flat.items():
        dotted = _resolve_key(key, where)
        if dotted in params:
            raise ConfigError(f"{where} {key}: {dotted} is searched twice")
        params[dotted] = dataclasses.replace(_param(key, spec, where), key=dotted)
    return list(params.values())


def default_space(model_type: str) -> list[Param]:
    """``DEFAULT_SPACE``, plus ``model.mlp`` for the MLP models."""
    table = dict(DEFAULT_SPACE)
    if model_type in ("dnn", "dcn_v2"):
        table["model.mlp"] = DEFAULT_MLP
    return parse_space(table, "the default space")


def space_record(space: Sequence[Param]) -> dict[str, Any]:
    """The search space as the study journal records it: ``{key: Param.describe()}``, in the
    form JSON gives back (lists, not tuples)."""
    return json.loads(json.dumps({p.key: p.describe() for p in space}))


def check_study_space(study: Any, space: Sequence[Param], journal: str | Path) -> None:
    """Records ``space`` in the Optuna ``study`` (user attribute ``SPACE_ATTR``) when it holds
    none (a new study, or one from a journal written without it: continued as it is), else
    raises ConfigError naming the study's ``journal`` and the keys whose ranges or choices
    differ."""
    check_record(
        study,
        SPACE_ATTR,
        space_record(space),
        journal,
        "search space",
        "the space it was created with (the config's [tune] section or --space file)",
        _fmt_spec,
    )


def check_record(
    study: Any,
    attr: str,
    current: Mapping[str, Any],
    journal: str | Path,
    what: str,
    advice: str,
    show: Callable[[Any], str],
    keep: Callable[[str], bool] = lambda key: True,
) -> None:
    """Records ``current`` (``{key: value}``) in the Optuna ``study`` as its user attribute
    ``attr`` when it holds none, else raises ConfigError naming ``journal``, ``what`` was
    recorded and each key added, removed or changed (values by ``show``; only the recorded
    keys ``keep`` passes are compared), and how to continue (``advice``)."""
    stored = study.user_attrs.get(attr)
    if stored is None:
        study.set_user_attr(attr, dict(current))
        return
    stored = {k: v for k, v in stored.items() if keep(k)}
    if stored == current:
        return
    changes = [f"{k} added" for k in current if k not in stored]
    changes += [f"{k} removed" for k in stored if k not in current]
    changes += [
        f"{k} was {show(stored[k])}, now {show(current[k])}"
        for k in current
        if k in stored and stored[k] != current[k]
    ]
    raise ConfigError(
        f"{journal}: the study was created with another {what} ({'; '.join(changes)}); "
        f"continue it with {advice}, or start a new study with another --output"
    )


def _fmt_spec(spec: Mapping[str, Any]) -> str:
    """A recorded range or choice list as text: ``{low = 0.001, high = 0.1, log = true}``."""
    shown = {k: v for k, v in spec.items() if v is not None and v is not False}
    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in shown.items()) + "}"
