"""Dataset statistics in one streaming pass: vocabularies with counts and ranks, numeric moments
and quantiles.

``compute_stats(schema, batches)`` reads Arrow record batches once (it never holds the dataset)
and returns ``DatasetStats``:

* categorical and multi-valued fields: the count of every value, the vocabulary (values seen at
  least ``min_count`` times, capped at ``max_vocab``, most frequent first, ties by value), each
  value's frequency rank (its position in that order; AMTL uses counts and ranks), the number of
  distinct values and how many cells fall outside the vocabulary (OOV);
* numeric fields: count, missing, min, max, mean and standard deviation of the value after the
  field's ``transform``, and quantile boundaries for ``num_buckets`` from a uniform bottom-k sample
  (``sample_size`` values per field, exact when the field has fewer values);
* sequence fields: the length distribution (mean, max, the fraction of rows longer than
  ``max_len`` and the fraction of empty rows) and, when not shared, the vocabulary over all
  values of all rows as for a categorical (a shared sequence uses its target's vocabulary);
* the labels: rows and the positives of every label; for a ``defined_on`` label also the rows
  where its parent is 1, so ``label_means_on_parent`` gives its conditional rate.

``cap_hash_tables(stats, schema)`` sizes the tables of hashed fields (``vocab = "hash"``) to
the training data: ``hash_rows`` gives a field at most ``HASH_ROWS_PER_VALUE`` rows per distinct
training value and never fewer than ``HASH_MIN_ROWS`` (nor more than the schema's
``hash_buckets``); the rows are kept in ``FieldStats.hash_buckets`` and saved with the rest.

Vocabularies go to one Parquet file per field, everything else to ``stats.json``; ``save`` and
``load`` round-trip. Value counts are merged with Arrow ``group_by`` so a field with millions of
distinct values costs vectorized work, not a Python loop per value.

``compute_stats(..., all_counts=True)`` also keeps, for every field with its own vocabulary, the
count of EVERY value seen (``FieldStats.all_counts``: an Arrow table ``value, count``, most
frequent first, ties by value), not only of the vocabulary; ``features.vocab_state`` ages and
admits values across windows from them. They stay in memory: ``save`` does not write them.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features.cells import sequence_lengths
from features.schema import VALUE_KINDS, FeatureKind, FeatureSpec, Schema

STATS_FILE = "stats.json"
VOCAB_DIR = "vocab"

#: Rows per distinct training value a hashed field's table is capped to. n values hashed
#: uniformly into 4n rows leave a value alone in its row with probability (1 - 1/4n)^(n-1),
#: about e^-0.25 = 78%; 2 rows per value give 61%, 8 give 88% for twice the parameters.
HASH_ROWS_PER_VALUE = 4
#: The fewest rows a capped hashed field keeps (16k parameters at dim 16): a field with a handful
#: of training values still has room for values the training rows did not show.
HASH_MIN_ROWS = 1024
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
        """Writes ``stats.json`` and ``vocab/<field>.parquet`` under ``directory``."""
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
        (d / STATS_FILE).write_text(json.dumps(summary, indent=1, allow_nan=True))
        return d

    @classmethod
    def load(cls, directory: str | Path) -> DatasetStats:
        d = Path(directory)
        path = d / STATS_FILE
        if not path.exists():
            raise FileNotFoundError(f"no {STATS_FILE} in {str(d)!r}: run `stitchrec stats` first")
        raw = json.loads(path.read_text())
        fields = {}
        for name, s in raw["fields"].items():
            vocab_file = s.pop("vocab_file", None)
            s.pop("vocab_size", None)
            fs = FieldStats(**s)
            if vocab_file:
                t = pq.read_table(d / vocab_file)
                fs.vocab = t.column("value").to_pylist()
                fs.vocab_counts = t.column("count").to_pylist()
            fields[name] = fs
        return cls(
            rows=raw["rows"],
            positives=raw["positives"],
            fields=fields,
            label_positives=dict(raw.get("label_positives", {})),
            parent_positives=dict(raw.get("parent_positives", {})),
        )


def hash_rows(hash_buckets: int, distinct: int) -> int:
    """The rows of a hashed field with ``distinct`` training values whose schema declares
    ``hash_buckets``: ``min(hash_buckets, max(HASH_MIN_ROWS, HASH_ROWS_PER_VALUE * distinct))``."""
    return min(hash_buckets, max(HASH_MIN_ROWS, HASH_ROWS_PER_VALUE * distinct))


def cap_hash_tables(stats: DatasetStats, schema: Schema, cap: bool = True) -> dict[str, int]:
    """Sets ``FieldStats.hash_buckets`` of every hashed model input of ``schema``.

    With ``cap``, a field without rows recorded gets ``hash_rows`` of its schema's
    ``hash_buckets`` and distinct values (recorded rows stay, so statistics read back give the
    model they gave before); without it, the rows are cleared to 0, the schema's
    ``hash_buckets``.

    Returns:
      ``{field: rows}`` of the fields whose rows are below the schema's ``hash_buckets``.
    """
    capped = {}
    for spec in schema.model_inputs:
        if spec.kind == FeatureKind.NUMERIC or spec.vocab != "hash":
            continue
        fs = stats[spec.name]
        if not cap:
            fs.hash_buckets = 0
        elif not fs.hash_buckets:
            fs.hash_buckets = hash_rows(spec.hash_buckets, fs.num_distinct)
        if 0 < fs.hash_buckets < spec.hash_buckets:
            capped[spec.name] = fs.hash_buckets
    return capped


def transform_numeric(values: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    """The value transform a numeric field applies before standardization.

    ``log1p``: log(1 + max(x, 0)); ``none`` and ``standardize``: x unchanged (``standardize`` is
    (x - mean) / std with the mean and std of this output, applied by the model).
    """
    if spec.transform == "log1p":
        return np.log1p(np.maximum(values, 0.0))
    return values


class _CategoricalCounter:
    """Accumulates value counts of one field; compacts with Arrow group_by when large."""

    def __init__(self, spec: FeatureSpec, compact_every: int = 2_000_000, all_counts: bool = False):
        self.spec = spec
        self.all_counts = all_counts
        self.parts: list[pa.Table] = []
        self.pending = 0
        self.compact_every = compact_every
        self.count = 0
        self.missing = 0
        self.rows_with_values = 0
        self.lengths = _LengthCounter(spec.max_len) if spec.is_sequence else None

    def update(self, column: pa.Array) -> None:
        if column.type != pa.string():
            column = pc.cast(column, pa.string())
        if self.lengths is not None:
            self.lengths.update(sequence_lengths(column, self.spec.separator))
        nulls = column.null_count
        values = column.drop_null()
        if self.spec.kind in (FeatureKind.MULTI_CATEGORICAL, FeatureKind.SEQUENCE):
            empty = pc.equal(values, "")
            nulls += pc.sum(empty).as_py() or 0
            values = values.filter(pc.invert(empty))
            lists = pc.split_pattern(values, self.spec.separator)
            flat = pc.list_flatten(lists)
            values = flat.filter(pc.not_equal(flat, ""))
            self.rows_with_values += len(lists)
        self.missing += nulls
        self.count += len(values)
        if len(values) == 0:
            return
        vc = pc.value_counts(values)
        self.parts.append(
            pa.table(
                {"value": vc.field("values"), "count": pc.cast(vc.field("counts"), pa.int64())}
            )
        )
        self.pending += len(vc)
        if self.pending > self.compact_every:
            self._compact()

    def _compact(self) -> None:
        if len(self.parts) > 1:
            t = pa.concat_tables(self.parts).group_by("value").aggregate([("count", "sum")])
            self.parts = [t.rename_columns(["value", "count"])]
        self.pending = 0

    def finish(self) -> FieldStats:
        self._compact()
        fs = FieldStats(name=self.spec.name, kind=self.spec.kind.value)
        fs.count, fs.missing = self.count, self.missing
        multi = self.spec.kind in (FeatureKind.MULTI_CATEGORICAL, FeatureKind.SEQUENCE)
        if multi and self.rows_with_values:
            fs.mean_values_per_row = self.count / self.rows_with_values
        if self.lengths is not None:
            self.lengths.finish(fs)
        own_vocab = self.spec.vocab == "vocabulary" and self.spec.shares_embedding_with is None
        if not self.parts:
            if own_vocab and self.all_counts:
                fs.all_counts = pa.table(
                    {"value": pa.array([], pa.string()), "count": pa.array([], pa.int64())}
                )
            return fs
        t = self.parts[0]
        fs.num_distinct = t.num_rows
        order = pc.sort_indices(t, sort_keys=[("count", "descending"), ("value", "ascending")])
        t = t.take(order)
        if own_vocab and self.all_counts:
            fs.all_counts = t
        keep = pc.greater_equal(t.column("count"), self.spec.min_count)
        t = t.filter(keep)
        if self.spec.max_vocab is not None:
            t = t.slice(0, self.spec.max_vocab)
        if own_vocab:
            fs.vocab = t.column("value").to_pylist()
            fs.vocab_counts = t.column("count").to_pylist()
            fs.oov_count = self.count - int(sum(fs.vocab_counts))
        return fs


class _LengthCounter:
    """The length distribution of a sequence field: sum, max, rows over ``max_len``, empty."""

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.rows = self.total = self.longest = self.over = self.empty = 0

    def update(self, lengths: np.ndarray) -> None:
        self.rows += lengths.size
        self.total += int(lengths.sum())
        self.longest = max(self.longest, int(lengths.max(initial=0)))
        self.over += int((lengths > self.max_len).sum())
        self.empty += int((lengths == 0).sum())

    def finish(self, fs: FieldStats) -> None:
        if self.rows:
            fs.mean_length = self.total / self.rows
            fs.frac_truncated = self.over / self.rows
            fs.frac_empty = self.empty / self.rows
        fs.max_length = self.longest


class _NumericCounter:
    """Moments of the transformed value, plus a uniform bottom-k sample for quantiles."""

    def __init__(self, spec: FeatureSpec, sample_size: int, seed: int):
        self.spec = spec
        self.k = sample_size
        self.rng = np.random.default_rng(seed)
        self.keys = np.empty(0)
        self.sample = np.empty(0)
        self.n = 0
        self.missing = 0
        self.total = 0.0
        self.total_sq = 0.0
        self.lo = math.inf
        self.hi = -math.inf

    def update(self, column: pa.Array) -> None:
        self.missing += column.null_count
        x = column.drop_null().to_numpy(zero_copy_only=False).astype(np.float64)
        if x.size == 0:
            return
        x = transform_numeric(x, self.spec)
        self.n += x.size
        self.total += float(x.sum())
        self.total_sq += float(np.square(x).sum())
        self.lo = min(self.lo, float(x.min()))
        self.hi = max(self.hi, float(x.max()))
        keys = self.rng.random(x.size)
        keys = np.concatenate([self.keys, keys])
        sample = np.concatenate([self.sample, x])
        if keys.size > self.k:
            idx = np.argpartition(keys, self.k)[: self.k]
            keys, sample = keys[idx], sample[idx]
        self.keys, self.sample = keys, sample

    def finish(self) -> FieldStats:
        fs = FieldStats(name=self.spec.name, kind=self.spec.kind.value)
        fs.count, fs.missing = self.n, self.missing
        if self.n == 0:
            return fs
        fs.min, fs.max = self.lo, self.hi
        fs.mean = self.total / self.n
        var = max(self.total_sq / self.n - fs.mean**2, 0.0)
        fs.std = math.sqrt(var) if var > 1e-12 else 1.0
        if self.spec.num_buckets > 1:
            qs = np.linspace(0, 1, self.spec.num_buckets + 1)[1:-1]
            b = np.unique(np.quantile(self.sample, qs))
            fs.boundaries = [float(v) for v in b]
        return fs


def compute_stats(
    schema: Schema,
    batches: Iterable[pa.RecordBatch],
    *,
    sample_size: int = 200_000,
    seed: int = 0,
    all_counts: bool = False,
) -> DatasetStats:
    """One pass over ``batches`` (columns named by field, as ``features.readers`` yields them).

    Args:
      schema: the dataset's schema; statistics are kept for model inputs.
      batches: Arrow record batches.
      sample_size: values per numeric field kept for quantiles.
      seed: seeds the quantile sample.
      all_counts: also keep every value's count of each field with its own vocabulary
        (``FieldStats.all_counts``); the rest of the statistics are the same either way.
    """
    if sample_size < 1:
        raise ValueError(f"sample_size must be >= 1, got {sample_size}")
    counters: dict[str, Any] = {}
    for i, spec in enumerate(schema.model_inputs):
        if spec.kind == FeatureKind.NUMERIC:
            counters[spec.name] = _NumericCounter(spec, sample_size, seed + i)
        else:
            counters[spec.name] = _CategoricalCounter(spec, all_counts=all_counts)
    labels = [f.name for f in schema.labels]
    positives = dict.fromkeys(labels, 0.0)
    parents = {f.name: f.defined_on for f in schema.labels if f.defined_on is not None}
    on_parent = dict.fromkeys(parents, 0.0)
    rows = 0
    for batch in batches:
        names = batch.schema.names
        missing = [n for n in [*counters, *labels] if n not in names]
        if missing:
            raise ValueError(f"record batch lacks fields {missing}; it has {names}")
        rows += batch.num_rows
        for name in labels:
            positives[name] += float(pc.sum(batch.column(name)).as_py() or 0.0)
        for name, parent in parents.items():
            on_parent[name] += float(pc.sum(batch.column(parent)).as_py() or 0.0)
        for name, counter in counters.items():
            counter.update(batch.column(name))
    if rows == 0:
        raise ValueError("no rows to compute statistics from")
    return DatasetStats(
        rows=rows,
        positives=positives[labels[0]],
        fields={name: c.finish() for name, c in counters.items()},
        label_positives=positives,
        parent_positives=on_parent,
    )
