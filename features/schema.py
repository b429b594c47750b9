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
* ``sequence``: an ordered list of values per row, newest first, joined by ``separator`` in one
  cell ("i9|i7|i1"; an empty cell is an empty sequence; a Parquet ``list<string>`` column is
  read as the same text). The model keeps the first ``max_len`` values (longer sequences are
  truncated). With ``shares_embedding_with = "item"`` the values are looked up in that
  categorical field's vocabulary (or hash buckets) and read its embedding table; otherwise the
  sequence has its own vocabulary over all values of all rows (``min_count``, ``max_vocab``,
  ``vocab = "hash"`` as for categoricals). ``aligned_with`` names a parallel sequence (the
  category of each history item): a row where the two lengths differ is a bad row.
* ``label``: a 0/1 target; with ``threshold`` the label is ``column >= threshold`` (MovieLens
  ratings). A schema has one label or several (multi-task): the first is the primary task
  (``Schema.label``). ``defined_on = "click"`` makes a label defined only on rows where the
  label ``click`` is 1 (conversion after click): where ``click`` is 0 its cell may be empty and
  reads 0, and a 1 there makes the row bad.
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

from features.schema_fields import (
    _RANGE,
    MODEL_INPUT_KINDS,
    VALUE_KINDS,
    FeatureKind,
    FeatureSpec,
    JoinSpec,
    SchemaError,
    SourceSpec,
    expand_names,
)

__all__ = [
    "MODEL_INPUT_KINDS",
    "VALUE_KINDS",
    "FeatureKind",
    "FeatureSpec",
    "JoinSpec",
    "Schema",
    "SchemaError",
    "SourceSpec",
    "expand_names",
    "load_schema",
    "schema_from_dict",
    "shipped_schemas",
]


@dataclasses.dataclass(frozen=True)
class Schema:
    """A named, ordered collection of FeatureSpecs with one or more label fields.

    Checked across fields: names are unique; there is at least one label, and a label's
    ``defined_on`` names another label (no cycles); a sequence's ``shares_embedding_with``
    names a categorical field and its ``aligned_with`` another sequence of the same
    ``max_len`` (no cycles); crosses cross categorical, multi_categorical or numeric fields.
    """

    name: str
    fields: tuple[FeatureSpec, ...]
    source: SourceSpec = dataclasses.field(default_factory=SourceSpec)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        names = [f.name for f in self.fields]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SchemaError(f"schema {self.name!r}: duplicate field names {dup}")
        if not self.labels:
            raise SchemaError(
                f"schema {self.name!r}: expected at least one field of kind 'label', found none"
            )
        if not any(f.is_model_input for f in self.fields):
            raise SchemaError(f"schema {self.name!r}: no categorical or numeric field to model")
        self._check_references()
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
        inputs = {f.name: f for f in self.fields if f.is_model_input and not f.is_sequence}
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

    def _check_references(self) -> None:
        """``shares_embedding_with``, ``aligned_with`` and ``defined_on`` name fit fields."""
        by_name = {f.name: f for f in self.fields}
        where = f"schema {self.name!r}"
        for f in self.sequences:
            target = f.shares_embedding_with
            if target is not None and (
                target not in by_name or by_name[target].kind != FeatureKind.CATEGORICAL
            ):
                found = f"a {by_name[target].kind.value} field" if target in by_name else "no field"
                raise SchemaError(
                    f"{where}: sequence {f.name!r} has shares_embedding_with = {target!r}, which "
                    f"is {found}; expected a categorical field of the schema"
                )
            other = f.aligned_with
            if other is None:
                continue
            if other not in by_name or not by_name[other].is_sequence:
                found = f"a {by_name[other].kind.value} field" if other in by_name else "no field"
                raise SchemaError(
                    f"{where}: sequence {f.name!r} has aligned_with = {other!r}, which is "
                    f"{found}; expected another sequence field of the schema"
                )
            if by_name[other].max_len != f.max_len:
                raise SchemaError(
                    f"{where}: sequence {f.name!r} (max_len {f.max_len}) is aligned_with "
                    f"{other!r} (max_len {by_name[other].max_len}); expected the same max_len"
                )
        _check_acyclic(where, "aligned_with", {f.name: f.aligned_with for f in self.sequences})
        labels = {f.name for f in self.labels}
        for f in self.labels:
            if f.defined_on is not None and f.defined_on not in labels:
                raise SchemaError(
                    f"{where}: label {f.name!r} has defined_on = {f.defined_on!r}, which is not "
                    f"a label; expected one of {sorted(labels - {f.name})}"
                )
        _check_acyclic(where, "defined_on", {f.name: f.defined_on for f in self.labels})

    @property
    def label(self) -> FeatureSpec:
        """The first label: the primary task."""
        return self.labels[0]

    @property
    def labels(self) -> tuple[FeatureSpec, ...]:
        """Every label field, in schema order (the first is the primary task)."""
        return tuple(f for f in self.fields if f.kind == FeatureKind.LABEL)

    @property
    def sequences(self) -> tuple[FeatureSpec, ...]:
        """Fields of kind ``sequence``, in schema order."""
        return tuple(f for f in self.fields if f.is_sequence)

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
        """The same schema restricted to ``names`` in schema order, plus every label and the
        fields a kept sequence refers to (``shares_embedding_with``, ``aligned_with``)."""
        keep = set(names)
        unknown = sorted(keep - set(self.names))
        if unknown:
            raise SchemaError(f"schema {self.name!r}: unknown fields {unknown}")
        keep.update(f.name for f in self.labels)
        while True:
            refs = {
                r
                for f in self.sequences
                if f.name in keep
                for r in (f.shares_embedding_with, f.aligned_with)
                if r is not None
            }
            if refs <= keep:
                break
            keep |= refs
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


def _check_acyclic(where: str, key: str, links: Mapping[str, str | None]) -> None:
    """Raises SchemaError when following ``key`` from a field comes back to it."""
    for start in links:
        seen = [start]
        nxt = links.get(start)
        while nxt is not None:
            if nxt in seen:
                cycle = " -> ".join([*seen[seen.index(nxt) :], nxt])
                raise SchemaError(f"{where}: {key} forms a cycle: {cycle}")
            seen.append(nxt)
            nxt = links.get(nxt)


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
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise SchemaError(f"schema file {str(p)!r} is not UTF-8 text (byte {e.start})") from None
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
