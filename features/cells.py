"""The schema's Arrow types (``arrow_schema``) and cell conversion: a raw Arrow column of one
field -> its typed column and the mask of its bad cells, and a raw batch -> a typed batch
with a message per bad row.

Besides its cells, a row is checked across fields: two ``aligned_with`` sequences must have
as many values, and a ``defined_on`` label may be empty (read as 0) only where its parent
label is 0, and must not be 1 there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features.schema import FeatureKind, FeatureSpec, Schema

_INT_RE = r"^[+-]?[0-9]+$"
_FLOAT_RE = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
_ARROW_TYPES = {"string": pa.string(), "int64": pa.int64(), "float32": pa.float32()}


def arrow_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema of every batch ``read_batches`` yields for ``schema``.

    One column per field in schema order, named ``field.name``: dtype ``string``/``int64``/
    ``float32`` map to the Arrow type of that name; labels are float32 holding 0.0/1.0;
    timestamps are int64 seconds since the epoch.
    """
    return pa.schema([pa.field(f.name, _field_type(f)) for f in schema.fields])


def _field_type(field: FeatureSpec) -> pa.DataType:
    if field.kind == FeatureKind.SEQUENCE:
        return pa.string()
    if field.kind == FeatureKind.LABEL:
        return pa.float32()
    if field.kind == FeatureKind.TIMESTAMP:
        return pa.int64()
    return _ARROW_TYPES[field.dtype]


# --------------------------------------------------------------------------------------------
# Cell conversion: raw Arrow column -> (typed column, bad-cell mask, expectation)


@dataclasses.dataclass
class _Converted:
    values: pa.Array  # the field's Arrow type, one entry per input row (bad cells: anything)
    bad: np.ndarray  # bool[n]: the cell is bad
    expected: str  # what a good cell looks like, for messages


def _mask(arr: pa.Array) -> np.ndarray:
    """A boolean Arrow array (nulls = False) as a numpy bool array."""
    return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=bool)


def is_null(arr: pa.Array) -> np.ndarray:
    return _mask(pc.is_null(arr))


def as_plain(arr: pa.Array) -> pa.Array:
    """Decodes dictionary arrays and narrows large strings to plain strings."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if pa.types.is_large_string(arr.type) or pa.types.is_string_view(arr.type):
        arr = arr.cast(pa.string())
    return arr


def _parse_float64(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Any column to float64 and a mask of non-null cells that are not finite numbers."""
    arr = as_plain(arr)
    if pa.types.is_string(arr.type):
        try:
            out = pc.cast(arr, pa.float64())
        except pa.ArrowInvalid:
            trimmed = pc.utf8_trim_whitespace(arr)
            ok = pc.match_substring_regex(trimmed, _FLOAT_RE)
            out = pc.cast(pc.if_else(ok, trimmed, pa.scalar(None, pa.string())), pa.float64())
    elif pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type):
        out = pc.cast(arr, pa.float64())
    elif pa.types.is_boolean(arr.type) or pa.types.is_decimal(arr.type):
        out = pc.cast(arr, pa.float64(), safe=False)
    else:
        return _parse_float64(pc.cast(arr, pa.string()))
    bad = ~is_null(arr) & ~_mask(pc.is_finite(out))
    return out, bad


def _parse_int64(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Any column to int64 and a mask of non-null cells that are not int64 integers."""
    arr = as_plain(arr)
    if pa.types.is_string(arr.type):
        out = _strings_to_int64(arr)
    elif pa.types.is_integer(arr.type) or pa.types.is_boolean(arr.type):
        try:
            out = pc.cast(arr, pa.int64())
        except pa.ArrowInvalid:  # uint64 beyond int64
            out = _py_ints(pc.cast(arr, pa.string()))
    elif pa.types.is_floating(arr.type):
        f = pc.cast(arr, pa.float64())
        ok = pc.and_(pc.is_finite(f), pc.equal(pc.floor(f), f))
        ok = pc.and_(ok, pc.less(pc.abs(f), 2.0**63))
        out = pc.cast(pc.if_else(ok, f, pa.scalar(None, pa.float64())), pa.int64())
    else:
        return _parse_int64(pc.cast(arr, pa.string()))
    return out, ~is_null(arr) & is_null(out)


def _strings_to_int64(arr: pa.Array) -> pa.Array:
    """Integer text to int64; anything else (and out-of-range integers) to null."""
    try:
        return pc.cast(arr, pa.int64())
    except pa.ArrowInvalid:
        pass
    trimmed = pc.replace_substring_regex(pc.utf8_trim_whitespace(arr), r"^\+", "")
    ok = pc.match_substring_regex(trimmed, _INT_RE)
    clean = pc.if_else(ok, trimmed, pa.scalar(None, pa.string()))
    try:
        return pc.cast(clean, pa.int64())
    except pa.ArrowInvalid:  # an integer beyond int64
        return _py_ints(clean)


def _py_ints(arr: pa.Array) -> pa.Array:
    """Slow path: integer text to int64, out-of-range values to null."""
    out = []
    for v in arr.to_pylist():
        try:
            i = int(v) if v is not None else None
        except ValueError:
            i = None
        out.append(i if i is not None and -(2**63) <= i < 2**63 else None)
    return pa.array(out, pa.int64())


def _parse_iso(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """ISO-8601 text (any UTC offset; none = UTC) to int64 seconds, floored."""
    if not pa.types.is_string(arr.type):
        return _parse_int64(arr)
    parsed = pd.to_datetime(arr.to_pandas(), utc=True, errors="coerce", format="ISO8601")
    missing = parsed.isna().to_numpy()
    secs = parsed.dt.tz_convert(None).to_numpy().astype("datetime64[s]").astype(np.int64)
    out = pa.array(secs, pa.int64(), mask=missing)
    return out, ~is_null(arr) & missing


def _timestamps_to_seconds(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Arrow timestamp/date column to int64 seconds since the epoch, floored."""
    ts = pc.cast(arr, pa.timestamp("us")) if pa.types.is_date(arr.type) else arr
    if ts.type.tz is not None:
        ts = ts.cast(pa.timestamp(ts.type.unit))
    per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[ts.type.unit]
    raw = ts.cast(pa.int64())
    missing = is_null(raw)
    secs = np.floor_divide(raw.fill_null(0).to_numpy(), per_second)
    return pa.array(secs, pa.int64(), mask=missing), np.zeros(len(arr), dtype=bool)


def timestamp_seconds(arr: pa.Array, time_format: str) -> tuple[pa.Array, np.ndarray, str]:
    """A timestamp column as int64 seconds since the epoch (UTC, floored), the mask of its bad
    cells (missing or unparsable) and what a good cell is, for messages.

    An Arrow timestamp or date column is converted as it is; text is read by ``time_format``
    (the schema's): ``"unix"`` integer seconds, ``"iso"`` ISO-8601 date-times (any UTC offset;
    none = UTC).
    """
    arr = as_plain(arr)
    if pa.types.is_timestamp(arr.type) or pa.types.is_date(arr.type):
        out, bad = _timestamps_to_seconds(arr)
        expected = "a timestamp"
    elif time_format == "iso":
        out, bad = _parse_iso(arr)
        expected = "an ISO-8601 date-time such as '2019-11-24 00:00:34+00:00'"
    else:
        out, bad = _parse_int64(arr)
        expected = "integer seconds since the epoch (unix time)"
    return out, bad | is_null(arr), expected


def is_list_type(t: pa.DataType) -> bool:
    """A list, large list or fixed-size list type."""
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def join_sequence(arr: pa.Array, separator: str) -> tuple[pa.Array, np.ndarray]:
    """A list column of a sequence as its text form (the values joined by ``separator``; a null
    list stays null) and the mask of rows with a value that is null, empty or holds the
    separator (such a list has no text form)."""
    if pa.types.is_fixed_size_list(arr.type):
        arr = arr.cast(pa.list_(arr.type.value_type))
    values = as_plain(arr.flatten())
    if not pa.types.is_string(values.type):
        values = pc.cast(values, pa.string())
    bad_value = (
        is_null(values) | _mask(pc.equal(values, "")) | _mask(pc.match_substring(values, separator))
    )
    bad = np.zeros(len(arr), dtype=bool)
    if bad_value.any():
        parents = pc.list_parent_indices(arr).to_numpy()
        bad[parents[bad_value]] = True
    lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), pa.int32())
    lists = pa.ListArray.from_arrays(offsets, values, mask=pc.is_null(arr))
    return pc.binary_join(lists, separator), bad


def _convert_sequence(field: FeatureSpec, arr: pa.Array) -> _Converted:
    arr = as_plain(arr)
    if is_list_type(arr.type):
        out, bad = join_sequence(arr, field.separator)
        return _Converted(out, bad, f"a list of non-empty texts without {field.separator!r}")
    out = arr if pa.types.is_string(arr.type) else pc.cast(arr, pa.string())
    return _Converted(out, np.zeros(len(arr), dtype=bool), "text")


def sequence_lengths(arr: pa.Array, separator: str) -> np.ndarray:
    """The number of ``separator``-separated values of each cell (0: empty or missing)."""
    arr = as_plain(arr)
    n = pc.add(pc.count_substring(arr, separator), 1).fill_null(0).to_numpy(zero_copy_only=False)
    empty = _mask(pc.equal(arr, "")) | is_null(arr)
    return np.where(empty, 0, n).astype(np.int64)


def _convert(field: FeatureSpec, arr: pa.Array) -> _Converted:
    """Converts one raw column to ``field``'s Arrow type, marking bad cells."""
    kind = field.kind
    if kind == FeatureKind.LABEL:
        return _convert_label(field, arr)
    if kind == FeatureKind.SEQUENCE:
        return _convert_sequence(field, arr)
    if kind == FeatureKind.TIMESTAMP:
        out, bad, expected = timestamp_seconds(arr, field.time_format)
        return _Converted(out, bad, expected)
    if field.dtype == "int64":
        out, bad = _parse_int64(arr)
        return _Converted(out, bad, "an integer (int64)")
    if field.dtype == "float32":
        f64, bad = _parse_float64(arr)
        out = pc.cast(f64, pa.float32(), safe=False)
        bad = bad | (~is_null(arr) & ~_mask(pc.is_finite(out)))
        return _Converted(out, bad, "a finite number (float32)")
    arr = as_plain(arr)
    out = arr if pa.types.is_string(arr.type) else pc.cast(arr, pa.string())
    return _Converted(out, np.zeros(len(arr), dtype=bool), "text")


def _convert_label(field: FeatureSpec, arr: pa.Array) -> _Converted:
    """Label column to float32 0.0/1.0: ``value >= threshold`` or a literal 0/1.

    A missing cell is bad, except in a ``defined_on`` label: there it stays null for
    ``row_errors`` (allowed where the parent label is 0)."""
    f64, bad = _parse_float64(arr)
    if field.defined_on is None:
        bad = bad | is_null(arr)
    if field.threshold is not None:
        out = pc.cast(pc.greater_equal(f64, field.threshold), pa.float32())
        return _Converted(out, bad, f"a finite number (label = value >= {field.threshold})")
    bad = bad | (~_mask(pc.or_(pc.equal(f64, 0.0), pc.equal(f64, 1.0))) & ~is_null(arr))
    return _Converted(pc.cast(pc.equal(f64, 1.0), pa.float32()), bad, "0 or 1")


def _value_text(arr: pa.Array, i: int) -> str:
    v = arr[i].as_py()
    return "missing value" if v is None else f"bad value {v!r}"


def typed_batch(
    schema: Schema, cols: dict[str, pa.Array], column_notes: dict[str, str]
) -> tuple[pa.RecordBatch, list[tuple[int, str]]]:
    """Raw columns (by source column name, n rows) to a batch of ``arrow_schema(schema)``.

    Returns the batch of the good rows and, for each bad row, (its index in 0..n-1, a message
    naming the column, the value and what was expected); a row is bad if any cell is.
    """
    converted = [_convert(f, cols[f.column]) for f in schema.fields]
    bad_any = np.zeros(len(converted[0].bad), dtype=bool)
    for c in converted:
        bad_any |= c.bad
    values = {f.name: c.values for f, c in zip(schema.fields, converted, strict=True)}
    across = row_errors(schema.fields, values, bad_any)
    for f in schema.labels:
        if f.defined_on is not None:
            values[f.name] = pc.fill_null(values[f.name], 0.0)
    arrays = [values[f.name] for f in schema.fields]
    bad: list[tuple[int, str]] = []
    if across:
        bad_any[list(across)] = True
    if bad_any.any():
        for i in np.flatnonzero(bad_any).tolist():
            if i in across:
                bad.append((i, across[i]))
                continue
            j = next(k for k, c in enumerate(converted) if c.bad[i])
            f = schema.fields[j]
            where = f"column {f.column!r}" + (f" (field {f.name!r})" if f.name != f.column else "")
            where += column_notes.get(f.column, "")
            text = _value_text(cols[f.column], i)
            bad.append((i, f"{where}: {text}; expected {converted[j].expected}"))
        keep = pa.array(~bad_any)
        arrays = [a.filter(keep) for a in arrays]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(schema)), bad


def row_errors(
    fields: Sequence[FeatureSpec], values: dict[str, pa.Array], bad: np.ndarray
) -> dict[int, str]:
    """{row: message} of the rows not already ``bad`` that break a rule across ``fields``:
    aligned sequences of different lengths; a ``defined_on`` label missing where its parent is
    1, or 1 where its parent is 0. ``values``: the converted columns by field name (a rule is
    checked when both its fields are in ``fields``)."""
    by_name = {f.name: f for f in fields}
    out: dict[int, str] = {}
    for f in fields:
        g = by_name.get(f.aligned_with) if f.kind == FeatureKind.SEQUENCE else None
        if g is None:
            continue
        a = sequence_lengths(values[f.name], f.separator)
        b = sequence_lengths(values[g.name], g.separator)
        for i in np.flatnonzero((a != b) & ~bad).tolist():
            out.setdefault(
                i,
                f"fields {f.name!r} and {g.name!r} (aligned_with): {a[i]} and {b[i]} values; "
                f"expected sequences of the same length",
            )
    for f in fields:
        if f.kind != FeatureKind.LABEL or f.defined_on not in by_name:
            continue
        child, parent = values[f.name], values[f.defined_on]
        missing = is_null(child) & _mask(pc.equal(parent, 1.0))
        stray = _mask(pc.equal(child, 1.0)) & _mask(pc.equal(parent, 0.0))
        rule = f"label {f.name!r} is defined_on {f.defined_on!r}"
        for i in np.flatnonzero(missing & ~bad).tolist():
            out.setdefault(
                i,
                f"field {f.name!r}: missing value where {f.defined_on!r} is 1; expected 0 or 1 "
                f"({rule})",
            )
        for i in np.flatnonzero(stray & ~bad).tolist():
            out.setdefault(
                i,
                f"field {f.name!r}: 1 where {f.defined_on!r} is 0; expected 0 or an empty cell "
                f"({rule}: only rows where {f.defined_on!r} is 1 can be positive)",
            )
    return out
