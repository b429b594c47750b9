"""The parts of a schema: ``FeatureKind``, ``FeatureSpec`` (one field, checked on its own),
``SourceSpec`` and ``JoinSpec``. ``features.schema`` puts them together into a ``Schema``,
checks what spans several fields, and loads and writes schema files.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterable
from typing import Any


class SchemaError(ValueError):
    """A schema file or FeatureSpec is invalid; the message names the file, field and key."""


class FeatureKind(enum.StrEnum):
    """The kinds of field (see ``features.schema``)."""

    CATEGORICAL = "categorical"
    MULTI_CATEGORICAL = "multi_categorical"
    NUMERIC = "numeric"
    LABEL = "label"
    TIMESTAMP = "timestamp"
    META = "meta"
    CROSS = "cross"
    SEQUENCE = "sequence"


MODEL_INPUT_KINDS = (
    FeatureKind.CATEGORICAL,
    FeatureKind.MULTI_CATEGORICAL,
    FeatureKind.NUMERIC,
    FeatureKind.SEQUENCE,
)
#: Kinds whose values are looked up in a vocabulary or hashed.
VALUE_KINDS = (FeatureKind.CATEGORICAL, FeatureKind.MULTI_CATEGORICAL, FeatureKind.SEQUENCE)
_DTYPES = ("string", "int64", "float32")
#: The vocabulary keys a shared sequence leaves at these values (its target's apply).
_SEQUENCE_DEFAULTS = {
    "vocab": "vocabulary",
    "hash_buckets": 0,
    "min_count": 1,
    "max_vocab": None,
    "embedding_dim": None,
}
_VOCAB_MODES = ("vocabulary", "hash")
_TRANSFORMS = ("none", "log1p", "standardize")
_COMBINERS = ("mean", "sum")
TIME_FORMATS = ("unix", "iso")  # the schema's time_format choices
_TIME_FORMATS = TIME_FORMATS
_GROUPS = ("user", "item", "context")
_FORMATS = ("csv", "parquet")
_RANGE = re.compile(r"^(?P<prefix>.*)\{(?P<lo>\d+)\.\.(?P<hi>\d+)\}(?P<suffix>.*)$")


def expand_names(spec: str | Iterable[str]) -> list[str]:
    """Expands ``"C{1..3}"`` to ``["C1", "C2", "C3"]``; lists expand element-wise."""
    if isinstance(spec, str):
        m = _RANGE.match(spec)
        if not m:
            return [spec]
        lo, hi = int(m["lo"]), int(m["hi"])
        if hi < lo:
            raise SchemaError(f"name range {spec!r}: upper bound {hi} is below lower bound {lo}")
        return [f"{m['prefix']}{i}{m['suffix']}" for i in range(lo, hi + 1)]
    out: list[str] = []
    for s in spec:
        out.extend(expand_names(s))
    return out


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """One field of a dataset.

    Attributes:
      name: the field's name in Arrow batches, tf.data elements and the serving signature.
      kind: see the module docstring.
      column: the source column it is read from (defaults to ``name``).
      dtype: the raw type: ``string``, ``int64`` or ``float32``. Defaults: categorical ``string``,
        numeric and label ``float32``, timestamp ``int64``.
      vocab: ``vocabulary`` (built from training data) or ``hash``.
      hash_buckets: number of buckets when ``vocab = "hash"``.
      min_count: values seen fewer times in training go to the OOV row.
      max_vocab: keep at most this many most frequent values (None: no cap).
      embedding_dim: overrides the model's default embedding dimension for this field.
      num_buckets: numeric only: bucketize by this many training quantiles and embed (0: off).
      transform: numeric only: ``none``, ``log1p`` (of max(x, 0)) or ``standardize``.
      default: numeric only: value used for a missing cell.
      separator: multi_categorical and sequence: the separator between values in one cell.
      combiner: multi_categorical only: ``mean`` or ``sum`` pooling of the value embeddings.
      threshold: label only: label = column >= threshold (None: the column holds 0/1).
      time_format: timestamp only: ``unix`` seconds or ``iso`` text.
      cost: relative serving cost of computing this field (FSCD's complexity term).
      group: ``user``, ``item`` or ``context`` (None: unassigned).
      fields: cross only: the crossed fields (two or more model inputs), in order.
      boundaries: cross only: ``((numeric field, (b1, b2, ...)), ...)``: the bucket boundaries of
        the crossed numeric fields (bucket = number of boundaries <= value).
      max_len: sequence only (required, >= 1): the model keeps the first (newest) ``max_len``
        values of a row; longer sequences are truncated.
      shares_embedding_with: sequence only: a categorical field whose vocabulary (or hash
        buckets) and embedding table the values use (None: the sequence's own vocabulary and
        table, built like a categorical's from all values of all rows).
      aligned_with: sequence only: another sequence field this one runs parallel to (the same
        number of values in every row, e.g. the category of each history item).
      defined_on: label only: another label; this label is only defined on rows where that
        label is 1 (an empty cell reads 0 where it is 0; 1 there is a bad row).
    """

    name: str
    kind: FeatureKind
    column: str | None = None
    dtype: str | None = None
    vocab: str = "vocabulary"
    hash_buckets: int = 0
    min_count: int = 1
    max_vocab: int | None = None
    embedding_dim: int | None = None
    num_buckets: int = 0
    transform: str = "none"
    default: float = 0.0
    separator: str = "|"
    combiner: str = "mean"
    threshold: float | None = None
    time_format: str = "unix"
    cost: float = 1.0
    group: str | None = None
    fields: tuple[str, ...] = ()
    boundaries: tuple[tuple[str, tuple[float, ...]], ...] = ()
    max_len: int = 0
    shares_embedding_with: str | None = None
    aligned_with: str | None = None
    defined_on: str | None = None

    def __post_init__(self) -> None:
        try:
            kind = FeatureKind(self.kind)
        except ValueError:
            raise SchemaError(
                f"field {self.name!r}: kind {self.kind!r} is not one of "
                f"{[k.value for k in FeatureKind]}"
            ) from None
        object.__setattr__(self, "kind", kind)
        if not self.name or not isinstance(self.name, str):
            raise SchemaError(f"a field has an empty or non-string name: {self.name!r}")
        if self.column is None:
            object.__setattr__(self, "column", self.name)
        if self.dtype is None:
            default_dtype = {
                FeatureKind.CATEGORICAL: "string",
                FeatureKind.MULTI_CATEGORICAL: "string",
                FeatureKind.NUMERIC: "float32",
                FeatureKind.LABEL: "float32",
                FeatureKind.TIMESTAMP: "int64",
                FeatureKind.META: "string",
                FeatureKind.CROSS: "int64",
                FeatureKind.SEQUENCE: "string",
            }[kind]
            object.__setattr__(self, "dtype", default_dtype)
        self._check_choice("dtype", self.dtype, _DTYPES)
        self._check_choice("vocab", self.vocab, _VOCAB_MODES)
        self._check_choice("transform", self.transform, _TRANSFORMS)
        self._check_choice("combiner", self.combiner, _COMBINERS)
        self._check_choice("time_format", self.time_format, _TIME_FORMATS)
        if self.group is not None:
            self._check_choice("group", self.group, _GROUPS)
        if kind in (FeatureKind.MULTI_CATEGORICAL, FeatureKind.SEQUENCE) and self.dtype != "string":
            raise SchemaError(
                f"field {self.name!r}: {kind.value} needs dtype 'string', got {self.dtype!r}"
            )
        if kind == FeatureKind.NUMERIC and self.dtype == "string":
            raise SchemaError(f"field {self.name!r}: numeric needs dtype int64 or float32")
        categorical = kind in VALUE_KINDS and self.shares_embedding_with is None
        if categorical and self.vocab == "hash" and self.hash_buckets < 1:
            raise SchemaError(
                f"field {self.name!r}: vocab = 'hash' needs hash_buckets >= 1, "
                f"got {self.hash_buckets}"
            )
        self._check_min("min_count", self.min_count, 1)
        if self.max_vocab is not None:
            self._check_min("max_vocab", self.max_vocab, 1)
        if self.embedding_dim is not None:
            self._check_min("embedding_dim", self.embedding_dim, 1)
        self._check_min("num_buckets", self.num_buckets, 0)
        if self.num_buckets == 1:
            raise SchemaError(f"field {self.name!r}: num_buckets must be 0 (off) or >= 2, got 1")
        self._check_cross(kind)
        self._check_sequence(kind)
        self._check_label(kind)
        if not (self.cost >= 0):
            raise SchemaError(f"field {self.name!r}: cost must be >= 0, got {self.cost!r}")
        multi = kind in (FeatureKind.MULTI_CATEGORICAL, FeatureKind.SEQUENCE)
        if multi and (not isinstance(self.separator, str) or not self.separator):
            raise SchemaError(f"field {self.name!r}: separator must be a non-empty string")

    def _check_sequence(self, kind: FeatureKind) -> None:
        """``max_len`` (>= 1), ``shares_embedding_with`` and ``aligned_with`` are sequence keys;
        a shared sequence takes its vocabulary and table from its target, so it sets none."""
        if kind != FeatureKind.SEQUENCE:
            given = [
                k for k in ("shares_embedding_with", "aligned_with") if getattr(self, k) is not None
            ]
            given += ["max_len"] if self.max_len != 0 else []
            if given:
                raise SchemaError(
                    f"field {self.name!r}: {', '.join(given)} "
                    f"{'is a key' if len(given) == 1 else 'are keys'} of kind 'sequence' only, "
                    f"not {kind.value!r}"
                )
            return
        self._check_min("max_len", self.max_len, 1)
        for key in ("shares_embedding_with", "aligned_with"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value):
                raise SchemaError(f"field {self.name!r}: {key} must be a field name, got {value!r}")
        if self.aligned_with == self.name:
            raise SchemaError(f"field {self.name!r}: aligned_with names the field itself")
        if self.shares_embedding_with is not None:
            if self.shares_embedding_with == self.name:
                raise SchemaError(f"field {self.name!r}: shares_embedding_with names itself")
            own = [
                k
                for k in ("vocab", "hash_buckets", "min_count", "max_vocab", "embedding_dim")
                if getattr(self, k) != _SEQUENCE_DEFAULTS[k]
            ]
            if own:
                raise SchemaError(
                    f"field {self.name!r}: shares_embedding_with = "
                    f"{self.shares_embedding_with!r} takes the vocabulary and table of that "
                    f"field, so {own} must not be set here"
                )

    def _check_label(self, kind: FeatureKind) -> None:
        if self.defined_on is None:
            return
        if kind != FeatureKind.LABEL:
            raise SchemaError(
                f"field {self.name!r}: defined_on is a key of kind 'label' only, not {kind.value!r}"
            )
        if not isinstance(self.defined_on, str) or not self.defined_on:
            raise SchemaError(
                f"field {self.name!r}: defined_on must be a label name, got {self.defined_on!r}"
            )
        if self.defined_on == self.name:
            raise SchemaError(f"field {self.name!r}: defined_on names the label itself")

    def _check_cross(self, kind: FeatureKind) -> None:
        """``fields``/``boundaries`` belong to crosses; a cross needs >= 2 distinct fields."""
        fields = (self.fields,) if isinstance(self.fields, str) else self.fields
        object.__setattr__(self, "fields", tuple(str(f) for f in fields))
        try:
            bounds = tuple((str(n), tuple(float(b) for b in bs)) for n, bs in self.boundaries)
        except (TypeError, ValueError):
            raise SchemaError(
                f"field {self.name!r}: boundaries must be [[numeric field, [b1, b2, ...]], ...], "
                f"got {self.boundaries!r}"
            ) from None
        object.__setattr__(self, "boundaries", bounds)
        if kind != FeatureKind.CROSS:
            if self.fields or self.boundaries:
                raise SchemaError(
                    f"field {self.name!r}: `fields` and `boundaries` are for kind 'cross' only"
                )
            return
        if len(self.fields) < 2 or len(set(self.fields)) != len(self.fields):
            raise SchemaError(
                f"field {self.name!r}: a cross needs `fields` = two or more distinct field "
                f"names, got {list(self.fields)}"
            )
        if self.hash_buckets < 2:
            raise SchemaError(
                f"field {self.name!r}: a cross needs hash_buckets >= 2, got {self.hash_buckets}"
            )
        for n, bs in bounds:
            if n not in self.fields:
                raise SchemaError(
                    f"field {self.name!r}: boundaries name {n!r}, which is not in its fields "
                    f"{list(self.fields)}"
                )
            if list(bs) != sorted(set(bs)):
                raise SchemaError(
                    f"field {self.name!r}: boundaries of {n!r} must be strictly increasing"
                )

    def _check_choice(self, key: str, value: Any, choices: tuple[str, ...]) -> None:
        if value not in choices:
            raise SchemaError(
                f"field {self.name!r}: {key} = {value!r} is not one of {list(choices)}"
            )

    def _check_min(self, key: str, value: Any, lo: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < lo:
            raise SchemaError(
                f"field {self.name!r}: {key} must be an integer >= {lo}, got {value!r}"
            )

    @property
    def is_sequence(self) -> bool:
        return self.kind == FeatureKind.SEQUENCE

    @property
    def is_model_input(self) -> bool:
        return self.kind in MODEL_INPUT_KINDS

    @property
    def is_embedded(self) -> bool:
        """Categorical fields, crosses, and numeric fields bucketized into embedded buckets."""
        return self.kind in (
            FeatureKind.CATEGORICAL,
            FeatureKind.MULTI_CATEGORICAL,
            FeatureKind.CROSS,
        ) or (self.kind == FeatureKind.NUMERIC and self.num_buckets > 0)

    def to_dict(self) -> dict[str, Any]:
        """Only the keys that differ from the defaults, so saved schemas stay readable."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind.value}
        required: dict[str, Any] = {}
        if self.kind == FeatureKind.CROSS:
            required = {"fields": self.fields, "hash_buckets": 2}
        elif self.kind == FeatureKind.SEQUENCE:
            required = {"max_len": self.max_len}
        defaults = FeatureSpec(name=self.name, kind=self.kind, **required)
        for f in dataclasses.fields(self):
            if f.name in ("name", "kind"):
                continue
            value = getattr(self, f.name)
            if value != getattr(defaults, f.name) or f.name in required:
                out[f.name] = value
        if "boundaries" in out:
            out["boundaries"] = [[n, list(bs)] for n, bs in self.boundaries]
        return out


@dataclasses.dataclass(frozen=True)
class JoinSpec:
    """A small side table joined to every batch on ``on`` (e.g. MovieLens movies.csv).

    ``path`` is resolved against the directory of each data file, so one schema serves every
    folder of a dataset laid out the same way. Side tables are read whole into memory.
    """

    path: str
    on: str
    delimiter: str = ","
    columns: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """How raw files are read: format, delimiter, header, column names, side-table joins."""

    format: str = "csv"
    delimiter: str = ","
    header: bool = True
    columns: tuple[str, ...] | None = None
    joins: tuple[JoinSpec, ...] = ()

    def __post_init__(self) -> None:
        if self.format not in _FORMATS:
            raise SchemaError(f"[source] format = {self.format!r} is not one of {list(_FORMATS)}")
        if len(self.delimiter) != 1:
            raise SchemaError(f"[source] delimiter must be one character, got {self.delimiter!r}")
        if not self.header and self.format == "csv" and not self.columns:
            raise SchemaError("[source] header = false needs `columns`, the names of the columns")
        if self.columns is not None:
            cols = tuple(expand_names(self.columns))
            dup = sorted({c for c in cols if cols.count(c) > 1})
            if dup:
                raise SchemaError(f"[source] columns has duplicates: {dup}")
            object.__setattr__(self, "columns", cols)
