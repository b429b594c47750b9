"""Version labels, traffic splits and shadow traffic: ``<repo>/<model>/traffic.toml``.

The file is optional; without it a model's requests go to the version they name, else to its
highest live version. With it::

    [labels]            # label -> version
    stable = 3
    canary = 4

    [split]             # requests that name neither a version nor a label
    key = "user"        # a feature name, or "header:x-user-id" (gRPC metadata / HTTP header)
    weights = { stable = 90, canary = 10 }

    [shadow]
    label = "canary"    # or version = 4
    fraction = 0.1      # share of primary calls mirrored (default 1.0)
    queue = 64          # mirrored calls waiting at most; more are dropped (default 64)
    max_share = 0.05    # share of the server's time the shadow may take (default 0.05)

Rules checked when the file is read (``TrafficError``, a ``ConfigError`` naming the file, the
key, the value and what was expected):

- a label is 1 to 64 characters, a letter first, then letters, digits, ``_``, ``-`` or ``.``;
  its version an integer >= 1; several labels may name one version;
- every ``[split]`` weight names a label of ``[labels]`` and is a number >= 0, their sum > 0;
  the key is a non-empty feature name or ``header:NAME``;
- ``[shadow]`` names exactly one of ``label`` (of ``[labels]``) and ``version``, a
  ``fraction`` in (0, 1], a ``queue`` of at least 1 call and a ``max_share`` in (0, 1];
- no other table or key.

``TrafficTable`` holds the configs of one repository: it re-reads a file when its stamp (inode,
mtime, size) changes, at each repository poll (``refresh``) and, on a request, at most once per
``check_interval_s`` per model (``config``). A file that fails to parse keeps the last good
config in force; the error is logged (``traffic_config_error``), counted
(``stitchrec_traffic_config_errors_total{model}``) and kept in ``TrafficTable.errors``. A file
that is removed removes the model's routing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import time
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipelines.config_sections import ConfigError

log = logging.getLogger("stitchrec.serving.traffic")

TRAFFIC_FILE = "traffic.toml"
HEADER_PREFIX = "header:"
DEFAULT_SHADOW_QUEUE = 64
#: the share of the server's time the shadow may take by default (``Shadow.max_share``)
DEFAULT_SHADOW_SHARE = 0.05
LABEL_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


class TrafficError(ConfigError):
    """A ``traffic.toml`` is invalid; the message names the file, the key and the value."""


@dataclasses.dataclass(frozen=True)
class Split:
    """How requests naming neither a version nor a label are spread over labels.

    key: a feature name, or ``header:NAME`` (gRPC metadata / HTTP header ``NAME``).
    weights: ``(label, weight)`` in file order; a key's bucket ``b`` in ``[0, 10000)`` goes to
    the first label whose cumulative weight share reaches past ``b / 10000``.
    """

    key: str
    weights: tuple[tuple[str, float], ...]

    @property
    def header(self) -> str | None:
        """The metadata / header name the key is read from (lower case), or None."""
        if self.key.startswith(HEADER_PREFIX):
            return self.key[len(HEADER_PREFIX) :].lower()
        return None

    @property
    def feature(self) -> str | None:
        """The feature the key is read from, or None."""
        return None if self.key.startswith(HEADER_PREFIX) else self.key


@dataclasses.dataclass(frozen=True)
class Shadow:
    """Mirrored traffic: ``fraction`` of the primary calls scored again on ``version`` (named
    directly or through ``label``), at most ``queue`` of them waiting, the shadow scoring for
    at most ``max_share`` of the time (``serving.shadow``)."""

    version: int | None
    label: str | None
    fraction: float
    queue: int
    max_share: float = DEFAULT_SHADOW_SHARE


@dataclasses.dataclass(frozen=True)
class TrafficConfig:
    """One model's ``traffic.toml``: labels, the split (or None) and the shadow (or None)."""

    labels: Mapping[str, int] = dataclasses.field(default_factory=dict)
    split: Split | None = None
    shadow: Shadow | None = None

    def shadow_version(self) -> int | None:
        """The version the shadow mirrors to (None: no shadow)."""
        if self.shadow is None:
            return None
        if self.shadow.label is not None:
            return self.labels[self.shadow.label]
        return self.shadow.version


def _where(path: str | Path, key: str) -> str:
    return f"{path}: {key}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _table(doc: Mapping[str, Any], name: str, path: str | Path) -> Mapping[str, Any] | None:
    value = doc.get(name)
    if value is not None and not isinstance(value, dict):
        raise TrafficError(f"{_where(path, name)} is {value!r}; expected a table [{name}]")
    return value


def _unknown(table: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    extra = sorted(set(table) - set(known))
    if extra:
        raise TrafficError(f"{where}: unknown key(s) {extra}; expected keys among {list(known)}")


def check_label(label: Any, where: str) -> str:
    """``label`` when it is a valid label name, else TrafficError naming ``where``."""
    if not isinstance(label, str) or not LABEL_PATTERN.match(label):
        raise TrafficError(
            f"{where}: label {label!r} is not a valid label; expected 1 to 64 characters, a "
            f"letter first, then letters, digits, '_', '-' or '.'"
        )
    return label


def _labels(doc: Mapping[str, Any], path: str | Path) -> dict[str, int]:
    table = _table(doc, "labels", path) or {}
    out = {}
    for label, version in table.items():
        where = _where(path, f"labels.{label}")
        check_label(label, where)
        if not _is_int(version) or version < 1:
            raise TrafficError(f"{where} is {version!r}; expected a version number (integer >= 1)")
        out[label] = version
    return out


def _split(doc: Mapping[str, Any], labels: Mapping[str, int], path: str | Path) -> Split | None:
    table = _table(doc, "split", path)
    if table is None:
        return None
    _unknown(table, ("key", "weights"), _where(path, "[split]"))
    key = table.get("key")
    if not isinstance(key, str) or not key or key == HEADER_PREFIX:
        raise TrafficError(
            f"{_where(path, 'split.key')} is {key!r}; expected a feature name or "
            f"'header:NAME' (a gRPC metadata key or HTTP header)"
        )
    weights = table.get("weights")
    if not isinstance(weights, dict) or not weights:
        raise TrafficError(
            f"{_where(path, 'split.weights')} is {weights!r}; expected a table of label = "
            f"weight, e.g. {{ stable = 90, canary = 10 }}"
        )
    out = []
    for label, weight in weights.items():
        where = _where(path, f"split.weights.{label}")
        if label not in labels:
            raise TrafficError(
                f"{where}: {label!r} is not a label of [labels]; labels: {sorted(labels)}"
            )
        if not _is_number(weight) or weight < 0:
            raise TrafficError(f"{where} is {weight!r}; expected a number >= 0")
        out.append((label, float(weight)))
    if sum(w for _, w in out) <= 0:
        raise TrafficError(
            f"{_where(path, 'split.weights')}: the weights sum to 0; expected a positive sum"
        )
    return Split(key, tuple(out))


def _shadow(doc: Mapping[str, Any], labels: Mapping[str, int], path: str | Path) -> Shadow | None:
    table = _table(doc, "shadow", path)
    if table is None:
        return None
    _unknown(
        table, ("label", "version", "fraction", "queue", "max_share"), _where(path, "[shadow]")
    )
    label, version = table.get("label"), table.get("version")
    if (label is None) == (version is None):
        raise TrafficError(
            f"{_where(path, '[shadow]')}: expected exactly one of label and version, got "
            f"label={label!r}, version={version!r}"
        )
    if label is not None and label not in labels:
        raise TrafficError(
            f"{_where(path, 'shadow.label')}: {label!r} is not a label of [labels]; labels: "
            f"{sorted(labels)}"
        )
    if version is not None and (not _is_int(version) or version < 1):
        raise TrafficError(
            f"{_where(path, 'shadow.version')} is {version!r}; expected a version number "
            f"(integer >= 1)"
        )
    fraction = table.get("fraction", 1.0)
    if not _is_number(fraction) or not 0 < fraction <= 1:
        raise TrafficError(
            f"{_where(path, 'shadow.fraction')} is {fraction!r}; expected a number in (0, 1]"
        )
    queue = table.get("queue", DEFAULT_SHADOW_QUEUE)
    if not _is_int(queue) or queue < 1:
        raise TrafficError(
            f"{_where(path, 'shadow.queue')} is {queue!r}; expected an integer >= 1 (calls)"
        )
    share = table.get("max_share", DEFAULT_SHADOW_SHARE)
    if not _is_number(share) or not 0 < share <= 1:
        raise TrafficError(
            f"{_where(path, 'shadow.max_share')} is {share!r}; expected a number in (0, 1] "
            f"(the share of the server's time the shadow may take)"
        )
    return Shadow(version, label, float(fraction), queue, float(share))


def parse_traffic(text: str, path: str | Path = TRAFFIC_FILE) -> TrafficConfig:
    """A ``traffic.toml``'s text -> its ``TrafficConfig`` (TrafficError naming ``path``)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TrafficError(f"{path}: not valid TOML: {e}") from None
    _unknown(doc, ("labels", "split", "shadow"), f"{path}: top level")
    labels = _labels(doc, path)
    return TrafficConfig(labels, _split(doc, labels, path), _shadow(doc, labels, path))


def load_traffic(path: str | Path) -> TrafficConfig:
    """The ``TrafficConfig`` of the file at ``path``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TrafficError(f"{path}: cannot be read: {e}") from None
    return parse_traffic(text, path)


Stamp = tuple[int, int, int]


def _stamp(path: Path) -> Stamp | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class TrafficTable:
    """The traffic configs of the models under ``root``, re-read when their file changes.

    ``on_error(model)`` is called once for each new bad file (the server counts it).
    """

    def __init__(
        self,
        root: str | Path,
        check_interval_s: float = 1.0,
        on_error: Callable[[str], None] | None = None,
    ):
        self.root = Path(root)
        self.check_interval_s = check_interval_s
        self._on_error = on_error
        self._configs: dict[str, TrafficConfig] = {}
        self._stamps: dict[str, Stamp | None] = {}
        self._checked: dict[str, float] = {}
        #: the last error of each model whose file is bad now (its last good config serves)
        self.errors: dict[str, str] = {}

    def config(self, model: str) -> TrafficConfig | None:
        """The model's config (None: no file), re-read when the file changed and it was last
        looked at ``check_interval_s`` or more ago."""
        now = time.monotonic()
        if now - self._checked.get(model, -math.inf) >= self.check_interval_s:
            self._check(model, now)
        return self._configs.get(model)

    def refresh(self, models: list[str]) -> None:
        """Re-reads the changed files of ``models`` now (the repository poll calls this)."""
        now = time.monotonic()
        for model in models:
            self._check(model, now)

    def _check(self, model: str, now: float) -> None:
        self._checked[model] = now
        path = self.root / model / TRAFFIC_FILE
        stamp = _stamp(path)
        if model in self._stamps and stamp == self._stamps[model]:
            return
        self._stamps[model] = stamp
        if stamp is None:
            self.errors.pop(model, None)
            if self._configs.pop(model, None) is not None:
                log.info(json.dumps({"event": "traffic_config_removed", "model": model}))
            return
        try:
            config = load_traffic(path)
        except TrafficError as e:
            self.errors[model] = str(e)
            log.error(
                json.dumps(
                    {
                        "event": "traffic_config_error",
                        "model": model,
                        "file": str(path),
                        "error": str(e),
                        "kept": model in self._configs,
                    }
                )
            )
            if self._on_error is not None:
                self._on_error(model)
            return
        self.errors.pop(model, None)
        self._configs[model] = config
        log.info(
            json.dumps(
                {
                    "event": "traffic_config",
                    "model": model,
                    "labels": dict(config.labels),
                    "split": None if config.split is None else dict(config.split.weights),
                    "split_key": None if config.split is None else config.split.key,
                    "shadow": config.shadow_version(),
                }
            )
        )
