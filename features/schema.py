"""Dataset schemas: typed FeatureSpec dataclasses loaded from a TOML or YAML file.

A schema file describes where a dataset's columns come from (``[source]``) and what each field is
(``[[fields]]``), so that a user adds a new dataset without writing code::

    name = "criteo"

    [source]
    format = "csv"            # csv (any delimiter) or parquet
    delimiter = "\\t"
    header = false            # no header line: name the columns here
    columns = ["label", "I{1..13}", "C{1..26}"]

    [[fields]]
    name = "label"
    kind = "label"

    [[fields]]
    names = "I{1..13}"        # one entry, several fields with the same settings
    kind = "numeric"
    transform = "log1p"

    [[fields]]
    names = "C{1..26}"
    kind = "categorical"
    min_count = 2

Kinds (``FeatureKind``):

* ``categorical``: one value per row, looked up in a vocabulary built from the training data
  (``vocab = "vocabulary"``, values under ``min_count`` go to the OOV row) or hashed into
  ``hash_buckets`` buckets (``vocab = "hash"``).
* ``multi_categorical``: several values in one cell joined by ``separator`` ("Action|Comedy"),
  embedded and pooled with ``combiner``.
* ``numeric``: a float; missing values become ``default``; optionally ``transform`` (``log1p``,
  ``standardize``) or bucketized by ``num_buckets`` training-data quantiles and embedded.
* ``label``: the 0/1 target; with ``threshold`` the label is ``column >= threshold`` (MovieLens
  ratings).
* ``timestamp``: seconds since the epoch (``time_format = "unix"``) or ISO-8601 text
  (``time_format = "iso"``); kept for splits and later features, not fed to models.
* ``meta``: carried through (row ids, propensities) but not fed to models.
* ``cross``: an explicit feature cross of ``fields`` (two or more categorical, multi-categorical
  or numeric model inputs), computed inside the model from the raw values of its fields (there
  is no data column): numeric fields are bucketized by ``boundaries`` (``[[name, [b1, ...]], ...]``),
  the values are joined and fingerprint-hashed into ``hash_buckets`` rows (row 0: a field
  missing). Written by ``features.crosses.artifact.add_crosses`` from a FIVES search (docs/fives.md).

Every field also has a ``cost`` (its serving cost, used by FSCD pre-ranking), an optional
``embedding_dim`` overriding the model's default, and an optional ``group`` (``user``, ``item``,
``context``) for two-tower models and ranking requests.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


class SchemaError(ValueError):
    """A schema file or FeatureSpec is invalid; the message names the file, field and key."""


class FeatureKind(enum.StrEnum):
    CATEGORICAL = "categorical"
    MULTI_CATEGORICAL = "multi_categorical"
    NUMERIC = "numeric"
    LABEL = "label"
    TIMESTAMP = "timestamp"
    META = "meta"
    CROSS = "cross"


MODEL_INPUT_KINDS = (FeatureKind.CATEGORICAL, FeatureKind.MULTI_CATEGORICAL, FeatureKind.NUMERIC)
_DTYPES = ("string", "int64", "float32")
_VOCAB_MODES = ("vocabulary", "hash")
_TRANSFORMS = ("none", "log1p", "standardize")
_COMBINERS = ("mean", "sum")
_TIME_FORMATS = ("unix", "iso")
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
      separator: multi_categorical only: the separator between values in one cell.
      combiner: multi_categorical only: ``mean`` or ``sum`` pooling of the value embeddings.
      threshold: label only: label = column >= threshold (None: the column holds 0/1).
      time_format: timestamp only: ``unix`` seconds or ``iso`` text.
      cost: relative serving cost of computing this field (FSCD's complexity term).
      group: ``user``, ``item`` or ``context`` (None: unassigned).
      fields: cross only: the crossed fields (two or more model inputs), in order.
      boundaries: cross only: ``((numeric field, (b1, b2, ...)), ...)``: the bucket boundaries of
        the crossed numeric fields (bucket = number of boundaries <= value).
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
            }[kind]
            object.__setattr__(self, "dtype", default_dtype)
        self._check_choice("dtype", self.dtype, _DTYPES)
        self._check_choice("vocab", self.vocab, _VOCAB_MODES)
        self._check_choice("transform", self.transform, _TRANSFORMS)
        self._check_choice("combiner", self.combiner, _COMBINERS)
        self._check_choice("time_format", self.time_format, _TIME_FORMATS)
        if self.group is not None:
            self._check_choice("group", self.group, _GROUPS)
        if kind == FeatureKind.MULTI_CATEGORICAL and self.dtype != "string":
            raise SchemaError(
                f"field {self.name!r}: multi_categorical needs dtype 'string', got {self.dtype!r}"
            )
        if kind == FeatureKind.NUMERIC and self.dtype == "string":
            raise SchemaError(f"field {self.name!r}: numeric needs dtype int64 or float32")
        categorical = kind in (FeatureKind.CATEGORICAL, FeatureKind.MULTI_CATEGORICAL)
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
        if not (self.cost >= 0):
            raise SchemaError(f"field {self.name!r}: cost must be >= 0, got {self.cost!r}")
        if kind == FeatureKind.MULTI_CATEGORICAL and not self.separator:
            raise SchemaError(f"field {self.name!r}: separator must be a non-empty string")

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
        cross = {"fields": self.fields, "hash_buckets": 2} if self.kind == FeatureKind.CROSS else {}
        defaults = FeatureSpec(name=self.name, kind=self.kind, **cross)
        for f in dataclasses.fields(self):
            if f.name in ("name", "kind"):
                continue
            value = getattr(self, f.name)
            if value != getattr(defaults, f.name) or (
                self.kind == FeatureKind.CROSS and f.name in ("fields", "hash_buckets")
            ):
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


@dataclasses.dataclass(frozen=True)
class Schema:
    """A named, ordered collection of FeatureSpecs with exactly one label field."""

    name: str
    fields: tuple[FeatureSpec, ...]
    source: SourceSpec = dataclasses.field(default_factory=SourceSpec)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        names = [f.name for f in self.fields]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SchemaError(f"schema {self.name!r}: duplicate field names {dup}")
        labels = [f.name for f in self.fields if f.kind == FeatureKind.LABEL]
        if len(labels) != 1:
            raise SchemaError(
                f"schema {self.name!r}: expected exactly one field of kind 'label', found "
                f"{len(labels)} ({labels})"
            )
        if not any(f.is_model_input for f in self.fields):
            raise SchemaError(f"schema {self.name!r}: no categorical or numeric field to model")
        if self.source.columns is not None:
            missing = [
                f.column
                for f in self.fields
                if f.column not in self.source.columns and f.kind != FeatureKind.CROSS
            ]
            joined = {c for j in self.source.joins for c in (j.columns or ())}
            missing = [c for c in missing if c not in joined]
            if missing and not any(j.columns is None for j in self.source.joins):
                raise SchemaError(
                    f"schema {self.name!r}: fields read columns {missing} that [source] columns "
                    f"does not name"
                )
        inputs = {f.name: f for f in self.fields if f.is_model_input}
        for cross in self.crosses:
            bad = [n for n in cross.fields if n not in inputs]
            if bad:
                raise SchemaError(
                    f"schema {self.name!r}: cross {cross.name!r} crosses {bad}, which are not "
                    f"categorical, multi_categorical or numeric fields of the schema"
                )
            for n, _ in cross.boundaries:
                if inputs[n].kind != FeatureKind.NUMERIC:
                    raise SchemaError(
                        f"schema {self.name!r}: cross {cross.name!r} gives boundaries for {n!r}, "
                        f"which is {inputs[n].kind.value}, not numeric"
                    )

    @property
    def label(self) -> FeatureSpec:
        return next(f for f in self.fields if f.kind == FeatureKind.LABEL)

    @property
    def model_inputs(self) -> tuple[FeatureSpec, ...]:
        """The raw fields the model reads (crosses are computed from them, not read)."""
        return tuple(f for f in self.fields if f.is_model_input)

    @property
    def crosses(self) -> tuple[FeatureSpec, ...]:
        """Fields of kind ``cross``: computed inside the model from their ``fields``."""
        return tuple(f for f in self.fields if f.kind == FeatureKind.CROSS)

    def field(self, name: str) -> FeatureSpec:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"schema {self.name!r} has no field {name!r}; fields: {self.names}")

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def select(self, names: Iterable[str]) -> Schema:
        """The same schema restricted to ``names`` (plus the label), in schema order."""
        keep = set(names)
        unknown = sorted(keep - set(self.names))
        if unknown:
            raise SchemaError(f"schema {self.name!r}: unknown fields {unknown}")
        keep.add(self.label.name)
        return dataclasses.replace(self, fields=tuple(f for f in self.fields if f.name in keep))

    def as_parquet(self) -> Schema:
        """The schema of Parquet shards written by ``features.shards.convert``.

        Converted shards hold one column per field, named by the field, with labels already
        thresholded to 0/1 and timestamps already in unix seconds.
        """
        fields = tuple(
            dataclasses.replace(f, column=f.name, threshold=None, time_format="unix")
            for f in self.fields
        )
        return dataclasses.replace(self, fields=fields, source=SourceSpec(format="parquet"))

    def replace_field(self, name: str, **changes: Any) -> Schema:
        fields = tuple(
            dataclasses.replace(f, **changes) if f.name == name else f for f in self.fields
        )
        if fields == self.fields and name not in self.names:
            raise SchemaError(f"schema {self.name!r} has no field {name!r}")
        return dataclasses.replace(self, fields=fields)

    def to_dict(self) -> dict[str, Any]:
        src = dataclasses.asdict(self.source)
        src["joins"] = [dataclasses.asdict(j) for j in self.source.joins]
        return {"name": self.name, "source": src, "fields": [f.to_dict() for f in self.fields]}

    def to_toml(self) -> str:
        """Serializes to TOML that ``load_schema`` reads back to an equal Schema."""
        lines = [f"name = {_toml_value(self.name)}", "", "[source]"]
        src = self.to_dict()["source"]
        joins = src.pop("joins")
        for k, v in src.items():
            if v is not None:
                lines.append(f"{k} = {_toml_value(v)}")
        for j in joins:
            lines += ["", "[[source.joins]]"]
            lines += [f"{k} = {_toml_value(v)}" for k, v in j.items() if v is not None]
        for f in self.fields:
            lines += ["", "[[fields]]"]
            lines += [f"{k} = {_toml_value(v)}" for k, v in f.to_dict().items() if v is not None]
        return "\n".join(lines) + "\n"

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_toml())


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t") + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, enum.Enum):
        return _toml_value(v.value)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} {v!r} to TOML")


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_value(k)


_FIELD_KEYS = {f.name for f in dataclasses.fields(FeatureSpec)}
_SOURCE_KEYS = {f.name for f in dataclasses.fields(SourceSpec)}
_JOIN_KEYS = {f.name for f in dataclasses.fields(JoinSpec)}


def _check_keys(where: str, given: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise SchemaError(f"{where}: unknown keys {unknown}; allowed keys: {sorted(allowed)}")


def _expand_columns(column: Any, names: list[str], where: str) -> list[Any]:
    """The source column of each of ``names``: ``column`` expanded in parallel with ``names``.

    ``names = "user_item_affinity_{0..79}"`` with ``column = "user-item_affinity_{0..79}"`` gives
    field i the i-th column; a ``column`` without a range is shared by every name (None: each
    field reads the column of its own name).
    """
    if not isinstance(column, str):
        return [column] * len(names)
    cols = expand_names(column)
    if len(cols) == 1 and not _RANGE.match(column):
        return cols * len(names)
    if len(cols) != len(names):
        raise SchemaError(
            f"{where}: column {column!r} expands to {len(cols)} columns but the names expand "
            f"to {len(names)} fields; give ranges of the same length"
        )
    return cols


def schema_from_dict(data: Mapping[str, Any], where: str = "schema") -> Schema:
    """Builds a Schema from parsed TOML/YAML; every error names ``where`` and the entry."""
    if not isinstance(data, Mapping):
        raise SchemaError(f"{where}: expected a table at the top level, got {type(data).__name__}")
    _check_keys(where, data, {"name", "source", "fields"})
    if "name" not in data:
        raise SchemaError(f"{where}: missing top-level key 'name'")
    src = dict(data.get("source") or {})
    _check_keys(f"{where} [source]", src, _SOURCE_KEYS)
    joins = []
    for i, j in enumerate(src.pop("joins", []) or []):
        _check_keys(f"{where} [[source.joins]] #{i + 1}", j, _JOIN_KEYS)
        if "path" not in j or "on" not in j:
            raise SchemaError(f"{where} [[source.joins]] #{i + 1}: needs 'path' and 'on'")
        j = dict(j)
        if j.get("columns") is not None:
            j["columns"] = tuple(expand_names(j["columns"]))
        joins.append(JoinSpec(**j))
    try:
        source = SourceSpec(**src, joins=tuple(joins))
    except SchemaError as e:
        raise SchemaError(f"{where}: {e}") from None
    raw_fields = data.get("fields")
    if not raw_fields:
        raise SchemaError(f"{where}: no [[fields]] entries")
    fields: list[FeatureSpec] = []
    for i, entry in enumerate(raw_fields):
        entry = dict(entry)
        label = entry.get("name") or entry.get("names") or f"#{i + 1}"
        _check_keys(f"{where} [[fields]] {label}", entry, _FIELD_KEYS | {"names"})
        if ("name" in entry) == ("names" in entry):
            raise SchemaError(f"{where} [[fields]] {label}: give exactly one of 'name' or 'names'")
        names = expand_names(entry.pop("names")) if "names" in entry else [entry.pop("name")]
        columns = _expand_columns(entry.pop("column", None), names, f"{where} [[fields]] {label}")
        for n, col in zip(names, columns, strict=True):
            try:
                fields.append(FeatureSpec(name=n, column=col, **entry))
            except SchemaError as e:
                raise SchemaError(f"{where}: {e}") from None
            except TypeError as e:
                raise SchemaError(f"{where} [[fields]] {n}: {e}") from None
    try:
        return Schema(name=str(data["name"]), fields=tuple(fields), source=source)
    except SchemaError as e:
        raise SchemaError(f"{where}: {e}") from None


_SCHEMA_SUFFIXES = (".toml", ".yaml", ".yml")


def _schema_file(path: str | Path) -> Path:
    """The file ``load_schema`` reads for ``path``.

    ``path`` names a file when it is one or ends in ``.toml``/``.yaml``/``.yml``; otherwise a
    bare name (no folder part) names the shipped schema of that name, so a folder called
    ``movielens`` in the working directory does not hide the shipped ``movielens``.
    """
    p = Path(path)
    if p.is_file() or p.suffix in _SCHEMA_SUFFIXES:
        if p.is_dir():
            raise SchemaError(f"schema file {str(path)!r} is a directory: expected a schema file")
        if not p.exists():
            raise SchemaError(f"schema file {str(path)!r} does not exist")
        return p
    shipped = shipped_schemas()
    if p.name == str(path) and p.name in shipped:
        return shipped[p.name]
    if p.is_dir():
        raise SchemaError(
            f"schema {str(path)!r} is a directory: expected a .toml, .yaml or .yml schema file "
            f"or the name of a shipped schema {sorted(shipped)}"
        )
    raise SchemaError(
        f"schema file {str(path)!r} does not exist (expected a .toml, .yaml or .yml file or "
        f"the name of a shipped schema {sorted(shipped)})"
    )


def load_schema(path: str | Path) -> Schema:
    """Loads a schema from a ``.toml`` or ``.yaml``/``.yml`` file.

    A bare name such as ``"criteo"`` that is not a file loads the schema shipped in
    ``features/schemas/`` (a folder of that name does not count); a directory is a SchemaError.
    """
    p = _schema_file(path)
    text = p.read_text()
    try:
        if p.suffix == ".toml":
            data = tomllib.loads(text)
        elif p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            raise SchemaError(f"schema file {str(p)!r}: expected a .toml, .yaml or .yml file")
    except (tomllib.TOMLDecodeError, ValueError) as e:
        if isinstance(e, SchemaError):
            raise
        raise SchemaError(f"schema file {str(p)!r} is not valid {p.suffix[1:]}: {e}") from None
    except Exception as e:  # yaml.YAMLError without importing yaml at module level
        raise SchemaError(f"schema file {str(p)!r} is not valid YAML: {e}") from None
    return schema_from_dict(data, where=f"schema file {str(p)!r}")


def shipped_schemas() -> dict[str, Path]:
    """The schema files that ship with StitchRec, by name."""
    return {p.stem: p for p in sorted((Path(__file__).parent / "schemas").glob("*.toml"))}
