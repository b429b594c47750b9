"""Type checks of config values against the annotations of the dataclass they build.

``check_values(cls, values)`` compares each TOML value with its field's annotation, read with
``typing.get_type_hints``: ``int`` (not a boolean), ``float`` (a finite number; an integer
too), ``bool`` (only ``true``/``false``), ``str``, ``tuple[X, ...]`` / ``list[X]`` (a TOML array
of X), ``tuple[X, Y]`` (an array of exactly those), ``dict[K, V]`` / ``dict`` (a TOML table), a
dataclass (a TOML table whose known keys fit its fields; unknown and missing keys are the
dataclass builder's to report), unions and ``Optional``. It runs before the dataclass is built,
so ``mlp = "64"`` or ``deterministic = "false"`` never reach a ``__post_init__`` that would read
them loosely.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

_NAMES = {
    int: ("an integer", "integers"),
    float: ("a finite number", "finite numbers"),
    bool: ("true or false", "booleans"),
    str: ("a string", "strings"),
}


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """``{field name: resolved annotation}`` of a dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def matches(tp: Any, value: Any) -> bool:
    """Whether a TOML value fits the annotation ``tp``."""
    if tp is Any:
        return True
    if _is_union(tp):
        return any(matches(t, value) for t in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:  # TOML's inf and nan are no setting's value
        return (
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        )
    if tp is str:
        return isinstance(value, str)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return True
        types_ = field_types(tp)
        return isinstance(value, Mapping) and all(
            matches(types_[k], v) for k, v in value.items() if k in types_
        )
    origin, args = typing.get_origin(tp) or tp, typing.get_args(tp)
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(map(matches, args, value))
        item = args[0] if args else Any
        return all(matches(item, v) for v in value)
    if origin is dict:
        if not isinstance(value, Mapping):
            return False
        key, val = args if args else (Any, Any)
        return all(matches(key, k) and matches(val, v) for k, v in value.items())
    return isinstance(value, origin)


def describe(tp: Any, plural: bool = False) -> str:
    """What a value of annotation ``tp`` looks like in TOML, e.g. ``a list of integers``."""
    if _is_union(tp):
        parts = [describe(t, plural) for t in typing.get_args(tp) if t is not type(None)]
        return " or ".join(parts)
    if tp in _NAMES:
        return _NAMES[tp][plural]
    if dataclasses.is_dataclass(tp):
        keys = ", ".join(f.name for f in dataclasses.fields(tp))
        return f"tables {{{keys}}}" if plural else f"a table {{{keys}}}"
    origin, args = typing.get_origin(tp) or tp, typing.get_args(tp)
    if origin in (tuple, list):
        if origin is tuple and args and args[-1] is not Ellipsis:
            inner = ", ".join(describe(a) for a in args)
            return f"lists of [{inner}]" if plural else f"a list of [{inner}]"
        item = describe(args[0], plural=True) if args else "values"
        return f"lists of {item}" if plural else f"a list of {item}"
    if origin is dict:
        if args:
            text = f"of {describe(args[0], True)} to {describe(args[1], True)}"
            return f"tables {text}" if plural else f"a table {text}"
        return "tables" if plural else "a table"
    return getattr(tp, "__name__", str(tp))


def type_error(cls: type, values: Mapping[str, Any]) -> str | None:
    """``key must be ..., got value`` for the first value of ``values`` (known fields of
    ``cls``) that does not fit its annotation, else None.

    A field's ``metadata["expected"]`` replaces the text made from its annotation.
    """
    types_ = field_types(cls)
    expected = {f.name: f.metadata.get("expected") for f in dataclasses.fields(cls)}
    for key, value in values.items():
        tp = types_.get(key)
        if tp is not None and not matches(tp, value):
            return f"{key} must be {expected[key] or describe(tp)}, got {value!r}"
    return None
