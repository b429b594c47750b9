"""Dataset statistics in one streaming pass: vocabularies with counts and ranks, numeric moments
and quantiles (``StatsAccumulator``, whose partial results merge: ``features.stats_job`` runs it
as tasks over parts of a dataset).

``compute_stats(schema, batches)`` reads Arrow record batches once (it never holds the dataset)
and returns ``DatasetStats``:

* categorical and multi-valued fields: the count of every value, the vocabulary (values seen at
  least ``min_count`` times, capped at ``max_vocab``, most frequent first, ties by value), each
  value's frequency rank (its position in that order; AMTL uses counts and ranks), the number of
  distinct values and how many cells fall outside the vocabulary (OOV);
* numeric fields: count, missing, min, max, mean and standard deviation of the value after the
  field's ``transform``, and quantile boundaries for ``num_buckets`` from a uniform bottom-k sample
  (``sample_size`` values per field, exact when the field has fewer values). Each row's key is a
  hash of its position, so the sample does not depend on batching and merges exactly across
  tasks. With ``k = sample_size`` values sampled, the sample's quantiles are within ``eps`` in
  rank of the data's with probability at least ``1 - 2 exp(-2 k eps^2)`` (Dvoretzky-Kiefer-
  Wolfowitz): at the default k = 200,000, within 0.005 (half a percentile) with probability
  0.9999;
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

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.cells import sequence_lengths
from features.exact_sum import ExactSum
from features.schema import FeatureKind, FeatureSpec, Schema
from features.shards import row_uniform
from features.stats_types import STATS_FILE, VOCAB_DIR, DatasetStats, FieldStats

__all__ = [
    "STATS_FILE",
    "VOCAB_DIR",
    "DatasetStats",
    "FieldStats",
    "StatsAccumulator",
    "cap_hash_tables",
    "compute_stats",
    "hash_rows",
    "transform_numeric",
]

#: Rows per distinct training value a hashed field's table is capped to. n values hashed
#: uniformly into 4n rows leave a value alone in its row with probability (1 - 1/4n)^(n-1),
#: about e^-0.25 = 78%; 2 rows per value give 61%, 8 give 88% for twice the parameters.
HASH_ROWS_PER_VALUE = 4
#: The fewest rows a capped hashed field keeps (16k parameters at dim 16): a field with a handful
#: of training values still has room for values the training rows did not show.
HASH_MIN_ROWS = 1024


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


#: Value-count entries a field holds beyond its compacted counts before it compacts them: at
#: least this many, and at least as many as the compacted counts have rows. Compaction work so
#: stays linear in the entries added, and a field holds about twice its distinct values at most
#: (plus this many). Measured on 4M and 16M Criteo-like rows (docs/scale.md): 65,536 keeps one
#: process's statistics at 635-657 MB where 262,144 let it grow from 676 to 787 MB, at the
#: same speed within 3%.
MIN_PENDING = 1 << 16


class _CategoricalCounter:
    """Accumulates value counts of one field; compacts them with Arrow ``group_by`` when the
    entries added since the last compaction outnumber ``max(min_pending, compacted rows)``."""

    def __init__(
        self, spec: FeatureSpec, min_pending: int = MIN_PENDING, all_counts: bool = False
    ) -> None:
        self.spec = spec
        self.all_counts = all_counts
        self.parts: list[pa.Table] = []
        self.pending = 0
        self.compacted = 0
        self.min_pending = min_pending
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
        self._maybe_compact()

    def merge(self, other: _CategoricalCounter) -> None:
        """Adds the counts of ``other`` (the same field, other rows)."""
        self.parts.extend(other.parts)
        self.pending += other.pending + other.compacted
        self.count += other.count
        self.missing += other.missing
        self.rows_with_values += other.rows_with_values
        if self.lengths is not None:
            self.lengths.merge(other.lengths)
        self._maybe_compact()

    def __getstate__(self) -> dict[str, Any]:
        """Compacted first: a counter sent to another process (a task's result, a merge's)
        carries each value once, whatever its pending parts held."""
        self._compact()
        return self.__dict__

    @property
    def held(self) -> int:
        """Value-count entries held (compacted and pending)."""
        return self.compacted + self.pending

    def _maybe_compact(self) -> None:
        if self.pending > max(self.min_pending, self.compacted):
            self._compact()

    def _compact(self) -> None:
        if len(self.parts) > 1:
            t = pa.concat_tables(self.parts).group_by("value").aggregate([("count", "sum")])
            self.parts = [t.rename_columns(["value", "count"])]
        self.compacted = self.parts[0].num_rows if self.parts else 0
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

    def merge(self, other: _LengthCounter) -> None:
        self.rows += other.rows
        self.total += other.total
        self.longest = max(self.longest, other.longest)
        self.over += other.over
        self.empty += other.empty

    def finish(self, fs: FieldStats) -> None:
        if self.rows:
            fs.mean_length = self.total / self.rows
            fs.frac_truncated = self.over / self.rows
            fs.frac_empty = self.empty / self.rows
        fs.max_length = self.longest


class _NumericCounter:
    """Moments of the transformed value, plus a uniform bottom-k sample for quantiles.

    Each value's sample key is ``row_uniform`` of its row's index in its stream of rows, keyed
    by the field's seed and the stream (``update``'s ``stream`` and ``start``), so the sample
    is a function of the rows, not of how they were batched or split among tasks: the
    ``sample_size`` values of smallest key, exact when merged.
    """

    def __init__(self, spec: FeatureSpec, sample_size: int, seed: int):
        self.spec = spec
        self.k = sample_size
        self.seed = seed
        self.keys = np.empty(0)
        self.sample = np.empty(0)
        self.n = 0
        self.missing = 0
        self.total = ExactSum()
        self.total_sq = ExactSum()
        self.lo = math.inf
        self.hi = -math.inf

    def update(self, column: pa.Array, stream: int = 0, start: int = 0) -> None:
        """Adds the values of rows ``start, start + 1, ...`` of row stream ``stream``."""
        self.missing += column.null_count
        present = ~np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        x = column.drop_null().to_numpy(zero_copy_only=False).astype(np.float64)
        if x.size == 0:
            return
        x = transform_numeric(x, self.spec)
        self.n += x.size
        self.total.add(float(x.sum()))
        self.total_sq.add(float(np.square(x).sum()))
        self.lo = min(self.lo, float(x.min()))
        self.hi = max(self.hi, float(x.max()))
        keys = row_uniform(_stream_seed(self.seed, stream), start, len(column))[present]
        self._keep(np.concatenate([self.keys, keys]), np.concatenate([self.sample, x]))

    def _keep(self, keys: np.ndarray, sample: np.ndarray) -> None:
        """Keeps the ``k`` values of smallest key, equal keys by value: the same set whatever
        the order in which values arrive and partial samples merge."""
        if keys.size > self.k:
            idx = np.argpartition(keys, self.k - 1)[: self.k]
            last = keys[idx].max()
            if np.count_nonzero(keys == last) > 1:  # equal keys at the cut: order by value
                idx = np.lexsort((sample, keys))[: self.k]
            keys, sample = keys[idx], sample[idx]
        self.keys, self.sample = keys, sample

    def merge(self, other: _NumericCounter) -> None:
        """Adds the values of ``other`` (the same field, other rows)."""
        self.missing += other.missing
        if other.n == 0:
            return
        self.n += other.n
        self.total.merge(other.total)
        self.total_sq.merge(other.total_sq)
        self.lo = min(self.lo, other.lo)
        self.hi = max(self.hi, other.hi)
        self._keep(
            np.concatenate([self.keys, other.keys]), np.concatenate([self.sample, other.sample])
        )

    def finish(self) -> FieldStats:
        fs = FieldStats(name=self.spec.name, kind=self.spec.kind.value)
        fs.count, fs.missing = self.n, self.missing
        if self.n == 0:
            return fs
        fs.min, fs.max = self.lo, self.hi
        fs.mean = self.total.value / self.n
        var = max(self.total_sq.value / self.n - fs.mean**2, 0.0)
        fs.std = math.sqrt(var) if var > 1e-12 else 1.0
        if self.spec.num_buckets > 1:
            qs = np.linspace(0, 1, self.spec.num_buckets + 1)[1:-1]
            b = np.unique(np.quantile(self.sample, qs))
            fs.boundaries = [float(v) for v in b]
        return fs


def _stream_seed(seed: int, stream: int) -> int:
    """The key seed of row stream ``stream`` of a field seeded ``seed``."""
    return (seed * 0x9E3779B1 + stream) & 0xFFFFFFFFFFFFFFFF


class StatsAccumulator:
    """The statistics of the rows seen so far; ``merge`` adds another accumulator's rows (of the
    same schema and settings), so tasks over parts of a dataset give the statistics of the
    whole. ``finish`` returns the ``DatasetStats``."""

    def __init__(
        self, schema: Schema, *, sample_size: int = 200_000, seed: int = 0, all_counts: bool = False
    ) -> None:
        if sample_size < 1:
            raise ValueError(f"sample_size must be >= 1, got {sample_size}")
        self.counters: dict[str, Any] = {}
        for i, spec in enumerate(schema.model_inputs):
            if spec.kind == FeatureKind.NUMERIC:
                self.counters[spec.name] = _NumericCounter(spec, sample_size, seed + i)
            else:
                self.counters[spec.name] = _CategoricalCounter(spec, all_counts=all_counts)
        self.labels = [f.name for f in schema.labels]
        self.positives = {name: ExactSum() for name in self.labels}
        self.parents = {f.name: f.defined_on for f in schema.labels if f.defined_on is not None}
        self.on_parent = {name: ExactSum() for name in self.parents}
        self.rows = 0

    def update(self, batch: pa.RecordBatch, stream: int = 0, start: int = 0) -> None:
        """Adds ``batch``: rows ``start, start + 1, ...`` of row stream ``stream`` (the rows'
        identity for the numeric fields' quantile samples)."""
        names = batch.schema.names
        missing = [n for n in [*self.counters, *self.labels] if n not in names]
        if missing:
            raise ValueError(f"record batch lacks fields {missing}; it has {names}")
        self.rows += batch.num_rows
        for name in self.labels:
            self.positives[name].add(pc.sum(batch.column(name)).as_py() or 0.0)
        for name, parent in self.parents.items():
            self.on_parent[name].add(pc.sum(batch.column(parent)).as_py() or 0.0)
        for name, counter in self.counters.items():
            if isinstance(counter, _NumericCounter):
                counter.update(batch.column(name), stream, start)
            else:
                counter.update(batch.column(name))

    def merge(self, other: StatsAccumulator) -> None:
        """Adds the rows ``other`` has seen."""
        self.rows += other.rows
        for name in self.labels:
            self.positives[name].merge(other.positives[name])
        for name in self.parents:
            self.on_parent[name].merge(other.on_parent[name])
        for name, counter in self.counters.items():
            counter.merge(other.counters[name])

    def finish(self) -> DatasetStats:
        """The statistics; raises ValueError when no row was seen."""
        if self.rows == 0:
            raise ValueError("no rows to compute statistics from")
        return DatasetStats(
            rows=self.rows,
            positives=self.positives[self.labels[0]].value,
            fields={name: c.finish() for name, c in self.counters.items()},
            label_positives={name: s.value for name, s in self.positives.items()},
            parent_positives={name: s.value for name, s in self.on_parent.items()},
        )


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

    ``features.stats_job`` computes the same statistics as tasks over parts of the data.
    """
    acc = StatsAccumulator(schema, sample_size=sample_size, seed=seed, all_counts=all_counts)
    start = 0
    for batch in batches:
        acc.update(batch, 0, start)
        start += batch.num_rows
    return acc.finish()
