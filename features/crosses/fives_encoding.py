"""FIVES inputs: raw columns -> field ids (training vocabularies, numeric quantile buckets).

Categorical values map by a training vocabulary (values seen ``min_count`` times, at most
``max_vocab``; 1 = other, 0 = missing), a multi-categorical cell as one value (its whole
string), numeric values by ``numeric_bins`` training quantiles (0 = missing). Fields with a
single value or all values missing are skipped and reported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.crosses.fives_config import FivesDataError
from features.schema import FeatureKind, Schema
from features.shard_reader import iter_record_batches

# ---------------------------------------------------------------------------------------------
# Encoding fields as ids
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class FieldEncoder:
    """Raw columns -> ids ``[rows, F]`` (see the module docstring); fit on training rows."""

    fields: list[str]
    kinds: list[str]  # "categorical" | "numeric"
    vocabs: dict[str, pa.Array]
    boundaries: dict[str, list[float]]
    skipped: list[dict[str, str]]

    @property
    def vocab_sizes(self) -> list[int]:
        """Rows per field: 0 missing, 1 other (categorical), then values or buckets."""
        out = []
        for name, kind in zip(self.fields, self.kinds, strict=True):
            if kind == "numeric":
                out.append(len(self.boundaries[name]) + 2)
            else:
                out.append(len(self.vocabs[name]) + 2)
        return out

    def transform(self, table: pa.Table) -> np.ndarray:
        cols = []
        for name, kind in zip(self.fields, self.kinds, strict=True):
            col = table.column(name)
            if kind == "numeric":
                v = float_values(col)
                b = np.asarray(self.boundaries[name], np.float32)
                ids = np.searchsorted(b, v, side="right") + 1
                ids[~np.isfinite(v)] = 0
            else:
                s = _string_values(col)
                idx = pc.index_in(s, value_set=self.vocabs[name])
                ids = pc.fill_null(pc.add(idx, 2), 1).to_numpy(zero_copy_only=False)
                missing = pc.fill_null(pc.equal(s, ""), True).to_numpy(zero_copy_only=False)
                ids = np.where(missing, 0, ids)
            cols.append(np.asarray(ids, np.int32))
        return np.stack(cols, axis=1) if cols else np.zeros((table.num_rows, 0), np.int32)


def _string_values(col: pa.ChunkedArray) -> pa.ChunkedArray:
    col = pc.cast(col, pa.string())
    if pa.types.is_integer(col.type):  # pragma: no cover - cast above makes it a string
        return col
    return col


def float_values(col: pa.ChunkedArray) -> np.ndarray:
    v = pc.cast(col, pa.float32())
    return pc.fill_null(v, float("nan")).to_numpy(zero_copy_only=False).astype(np.float32)


def read_table(schema: Schema, files: Sequence[Any], max_rows: int = 0) -> pa.Table:
    """The model inputs and label of Parquet ``files`` as one Arrow table (validated batches,
    the first ``max_rows`` rows when > 0)."""
    batches, rows = [], 0
    for rb in iter_record_batches(schema, list(files)):
        batches.append(rb)
        rows += rb.num_rows
        if max_rows and rows >= max_rows:
            break
    if not batches:
        raise FivesDataError(f"fives: no rows in {[str(f) for f in files]}")
    table = pa.Table.from_batches(batches)
    return table.slice(0, max_rows) if max_rows else table


def searchable_fields(schema: Schema) -> list[str]:
    """The schema's categorical, multi-categorical and numeric model inputs (not crosses, not
    sequences)."""
    return [f.name for f in schema.model_inputs if not f.is_sequence]


def fit_encoder(
    schema: Schema,
    table: pa.Table,
    fields: Sequence[str] | None = None,
    numeric_bins: int = 10,
    max_vocab: int = 1_000,
    min_count: int = 5,
) -> FieldEncoder:
    """Vocabularies and numeric quantiles of ``table``; skips (and reports) useless fields.

    A field is skipped when its rows are all missing, or when they hold a single value (a
    numeric field with one distinct finite value, a categorical field with one distinct value).
    """
    names = list(fields) if fields is not None else searchable_fields(schema)
    kept, kinds, skipped = [], [], []
    vocabs: dict[str, pa.Array] = {}
    boundaries: dict[str, list[float]] = {}
    for name in names:
        spec = schema.field(name)
        if not spec.is_model_input or spec.is_sequence:
            raise ValueError(
                f"fives: field {name!r} is {spec.kind.value}; only categorical, "
                f"multi_categorical and numeric fields can be crossed"
            )
        if name not in table.column_names:
            raise ValueError(f"fives: the data has no column {name!r}")
        col = table.column(name)
        if spec.kind == FeatureKind.NUMERIC:
            v = float_values(col)
            v = v[np.isfinite(v)]
            if v.size == 0:
                skipped.append({"field": name, "reason": "all values missing"})
                continue
            if np.unique(v[: min(v.size, 1_000_000)]).size < 2:
                skipped.append({"field": name, "reason": "a single value"})
                continue
            qs = np.linspace(0, 1, numeric_bins + 1)[1:-1]
            b = np.unique(np.quantile(v, qs).astype(np.float32))
            boundaries[name] = [float(x) for x in b]
            kinds.append("numeric")
        else:
            s = pc.drop_null(_string_values(col))
            s = pc.filter(s, pc.not_equal(s, ""))
            if len(s) == 0:
                skipped.append({"field": name, "reason": "all values missing"})
                continue
            counts = pc.value_counts(s)
            values, freq = counts.field("values"), counts.field("counts").to_numpy()
            if len(values) < 2:
                skipped.append({"field": name, "reason": "a single value"})
                continue
            order = np.lexsort((np.arange(len(freq)), -freq))
            order = order[freq[order] >= min_count][:max_vocab]
            vocabs[name] = values.take(pa.array(order, pa.int64()))
            kinds.append("categorical")
        kept.append(name)
    return FieldEncoder(kept, kinds, vocabs, boundaries, skipped)
