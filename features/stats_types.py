"""The statistics of a dataset: ``FieldStats`` per field and ``DatasetStats``, saved as
``stats.json`` plus one Parquet vocabulary file per field (``features.stats`` computes them)."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from features.json_files import read_json_object
from features.read_report import DataError
from features.schema import VALUE_KINDS

STATS_FILE = "stats.json"
VOCAB_DIR = "vocab"

_VOCAB_KINDS = tuple(k.value for k in VALUE_KINDS)


@dataclasses.dataclass
class FieldStats:
    """Statistics of one field. Categorical fields fill the vocab part, numeric the moments."""

    name: str
    kind: str
    count: int = 0
    missing: int = 0
    # categorical / multi_categorical
    vocab: list[str] = dataclasses.field(default_factory=list)
    vocab_counts: list[int] = dataclasses.field(default_factory=list)
    num_distinct: int = 0
    oov_count: int = 0
    mean_values_per_row: float = 0.0
    # numeric (moments of the transformed value)
    min: float = math.nan
    max: float = math.nan
    mean: float = 0.0
    std: float = 1.0
    boundaries: list[float] = dataclasses.field(default_factory=list)
    # hashed categorical fields: the rows of the model's table (0: the schema's hash_buckets)
    hash_buckets: int = 0
    # sequence: length distribution over all rows (empty and missing cells have length 0)
    mean_length: float = 0.0
    max_length: int = 0
    frac_truncated: float = 0.0  # rows longer than max_len
    frac_empty: float = 0.0
    # vocabulary fields of compute_stats(..., all_counts=True): every value's count (not saved)
    all_counts: pa.Table | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def summary(self) -> dict[str, Any]:
        """The JSON-able statistics of ``stats.json``: every attribute but the value lists, plus
        ``vocab_size``."""
        skip = ("vocab", "vocab_counts", "all_counts")
        out = {
            f.name: copy.deepcopy(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name not in skip
        }
        out["vocab_size"] = self.vocab_size
        return out


@dataclasses.dataclass
class DatasetStats:
    """Rows, the primary label's ``positives``, per-field statistics and, per label, its
    positives (``label_positives``) and, for ``defined_on`` labels, the rows where the parent
    label is 1 (``parent_positives``). Statistics saved without the per-label keys load with
    them empty."""

    rows: int
    positives: float
    fields: dict[str, FieldStats]
    label_positives: dict[str, float] = dataclasses.field(default_factory=dict)
    parent_positives: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def label_mean(self) -> float:
        """The primary label's mean."""
        return self.positives / self.rows if self.rows else 0.0

    @property
    def label_means(self) -> dict[str, float]:
        """``{label: mean over all rows}`` (a ``defined_on`` label counts 0 where its parent is
        0), in schema order."""
        return {n: p / self.rows if self.rows else 0.0 for n, p in self.label_positives.items()}

    @property
    def label_means_on_parent(self) -> dict[str, float]:
        """``{defined_on label: mean over the rows where its parent label is 1}``."""
        return {
            n: self.label_positives[n] / rows if rows else 0.0
            for n, rows in self.parent_positives.items()
        }

    def __getitem__(self, name: str) -> FieldStats:
        try:
            return self.fields[name]
        except KeyError:
            raise KeyError(
                f"no statistics for field {name!r}; fields with statistics: {sorted(self.fields)}"
            ) from None

    def save(self, directory: str | Path) -> Path:
        """Writes ``stats.json`` and ``vocab/<field>.parquet`` under ``directory``.

        ``stats.json`` is strict JSON: a number that is not finite (the NaN ``min`` and ``max``
        of a numeric field without values) is written as null, which ``load`` reads as NaN."""
        d = Path(directory)
        (d / VOCAB_DIR).mkdir(parents=True, exist_ok=True)
        summary = {
            "rows": self.rows,
            "positives": self.positives,
            "label_positives": self.label_positives,
            "parent_positives": self.parent_positives,
            "fields": {n: fs.summary() for n, fs in self.fields.items()},
        }
        for i, (name, fs) in enumerate(self.fields.items()):
            if fs.kind in _VOCAB_KINDS:
                fname = f"{i:03d}.parquet"
                summary["fields"][name]["vocab_file"] = f"{VOCAB_DIR}/{fname}"
                table = pa.table(
                    {
                        "value": pa.array(fs.vocab, pa.string()),
                        "count": pa.array(fs.vocab_counts, pa.int64()),
                    }
                )
                pq.write_table(table, d / VOCAB_DIR / fname)
        (d / STATS_FILE).write_text(json.dumps(_strict(summary), indent=1, allow_nan=False))
        return d

    @classmethod
    def load(cls, directory: str | Path) -> DatasetStats:
        """The statistics ``save`` wrote under ``directory``.

        Raises:
          FileNotFoundError: no ``stats.json`` there.
          DataError: ``stats.json`` or a vocabulary file it names cannot be read as what
            ``save`` writes (the message names the file and what is wrong).
        """
        d = Path(directory)
        path = _stats_path(d)
        raw = _stats_object(path)
        fields = {name: _field_stats(d, path, name, s) for name, s in raw["fields"].items()}
        return cls(
            rows=raw["rows"],
            positives=raw["positives"],
            fields=fields,
            label_positives=dict(raw.get("label_positives", {})),
            parent_positives=dict(raw.get("parent_positives", {})),
        )

    @staticmethod
    def check(directory: str | Path) -> Path:
        """Checks what ``load`` reads (the vocabulary files by their Parquet footers, their
        values unread); returns the ``stats.json`` path. Raises as ``load``."""
        path = _stats_path(Path(directory))
        for name, s in _stats_object(path)["fields"].items():
            _field_stats(Path(directory), path, name, s, values=False)
        return path


def _strict(value: Any) -> Any:
    """``value`` (JSON-able) with every float that is not finite replaced by None (null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    return value


#: the float statistics of a field (``boundaries``: a list of them), null in ``stats.json``
#: when not finite
_FLOAT_KEYS = {f.name for f in dataclasses.fields(FieldStats) if f.type == "float"}


_WHAT = "the statistics `stitchrec stats` or `stitchrec train` writes"
_EXPECTED = f"expected {_WHAT}"
_STATS_KEYS = {"rows": (int,), "positives": (int, float), "fields": (dict,)}
_FIELD_KEYS = {f.name for f in dataclasses.fields(FieldStats)} - {"all_counts", "vocab"}


def _stats_path(d: Path) -> Path:
    """``d/stats.json``; FileNotFoundError when it is not there."""
    if not (d / STATS_FILE).exists():
        raise FileNotFoundError(f"no {STATS_FILE} in {str(d)!r}: run `stitchrec stats` first")
    return d / STATS_FILE


def _stats_object(path: Path) -> dict[str, Any]:
    """``stats.json``'s object, its top-level keys checked; DataError naming ``path``."""
    raw = read_json_object(path, _WHAT)
    for key, kinds in _STATS_KEYS.items():
        if isinstance(raw.get(key), bool) or not isinstance(raw.get(key), kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise DataError(f"{str(path)!r}: {key!r} is {raw.get(key)!r}, not {names}: {_EXPECTED}")
    return raw


def _field_stats(d: Path, path: Path, name: str, s: Any, values: bool = True) -> FieldStats:
    """One field's ``FieldStats`` from its ``stats.json`` entry and vocabulary file (its
    values read when ``values``; else only the file's Parquet footer)."""
    where = f"{str(path)!r}, field {name!r}"
    if not isinstance(s, dict):
        raise DataError(f"{where}: {s!r} is not an object: {_EXPECTED}")
    unknown = sorted(set(s) - _FIELD_KEYS - {"vocab_file", "vocab_size"})
    if unknown or "name" not in s or "kind" not in s:
        what = f"unknown keys {unknown}" if unknown else "no name or kind"
        raise DataError(f"{where}: {what}: {_EXPECTED}")
    s = dict(s)
    for key in _FLOAT_KEYS & set(s):
        if s[key] is None:  # a number that is not finite (``save``)
            s[key] = math.nan
    if isinstance(s.get("boundaries"), list):
        s["boundaries"] = [math.nan if b is None else b for b in s["boundaries"]]
    vocab_file = s.pop("vocab_file", None)
    s.pop("vocab_size", None)
    fs = FieldStats(**s)
    if vocab_file:
        vocab_path = d / str(vocab_file)
        try:
            columns = pq.read_schema(vocab_path).names
            if {"value", "count"} <= set(columns) and values:
                t = pq.read_table(vocab_path, columns=["value", "count"])
                fs.vocab = t.column("value").to_pylist()
                fs.vocab_counts = t.column("count").to_pylist()
        except (OSError, pa.ArrowException) as e:
            raise DataError(
                f"{where}: its vocabulary {str(vocab_path)!r} cannot be read ({e}): {_EXPECTED}"
            ) from None
        if not {"value", "count"} <= set(columns):
            raise DataError(
                f"{where}: its vocabulary {str(vocab_path)!r} has columns {columns}, "
                f"not value and count: {_EXPECTED}"
            )
    return fs
