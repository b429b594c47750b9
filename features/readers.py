"""Streaming readers: raw CSV/TSV/Parquet files to typed, validated Arrow RecordBatches.

``read_batches(schema, paths)`` streams files of any size (CSV with any one-character delimiter,
optionally gzip/bz2-compressed, or Parquet) and yields ``pa.RecordBatch`` es with exactly
``arrow_schema(schema)``: one column per FeatureSpec, in schema order, named by field name.

Every cell is checked. A bad cell (text in a numeric column, a label that is not 0/1, an
unparseable timestamp, NaN/Inf text) or a line with the wrong number of columns makes its row
bad; the first bad row raises ``DataError`` naming the file, the 1-based line (CSV) or row
(Parquet), the column, the value and what was expected. With ``max_bad_rows = N`` up to N bad
rows are skipped and counted in a ``ReadReport``; the (N+1)-th raises.

Missing (empty) cells stay null in categorical, multi_categorical, numeric and meta fields
(downstream code fills them); a missing label or timestamp makes the row bad. Blank lines (and
lines whose every cell is empty) are skipped but still counted in line numbers. Line numbers
count records, so a quoted value spanning several lines shifts the numbers after it.

``convert`` streams inputs into Parquet shards under ``out_dir/train`` and ``out_dir/test``;
``Schema.as_parquet()`` describes those shards so they can be read back with ``read_batches``.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from features.schema import FeatureKind, FeatureSpec, Schema

__all__ = [
    "DataError",
    "ReadReport",
    "ShardWriter",
    "arrow_schema",
    "convert",
    "list_files",
    "read_batches",
    "split_mask",
    "write_parquet_shards",
]

_MAX_EXAMPLES = 10
_INT_RE = r"^[+-]?[0-9]+$"
_FLOAT_RE = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
_DELIMITER_NAMES = {"\t": "tab", ",": "comma", ";": "semicolon", "|": "pipe", " ": "space"}
_ARROW_TYPES = {"string": pa.string(), "int64": pa.int64(), "float32": pa.float32()}


class DataError(ValueError):
    """Bad input data; the message names the file, line/row, column, value and expectation."""


@dataclasses.dataclass
class ReadReport:
    """What a read did: good rows yielded, bad rows skipped (with the first messages), files."""

    rows: int = 0
    bad_rows: int = 0
    examples: list[str] = dataclasses.field(default_factory=list)
    files: int = 0


def arrow_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema of every batch ``read_batches`` yields for ``schema``.

    One column per field in schema order, named ``field.name``: dtype ``string``/``int64``/
    ``float32`` map to the Arrow type of that name; labels are float32 holding 0.0/1.0;
    timestamps are int64 seconds since the epoch.
    """
    return pa.schema([pa.field(f.name, _field_type(f)) for f in schema.fields])


def _field_type(field: FeatureSpec) -> pa.DataType:
    if field.kind == FeatureKind.LABEL:
        return pa.float32()
    if field.kind == FeatureKind.TIMESTAMP:
        return pa.int64()
    return _ARROW_TYPES[field.dtype]


# --------------------------------------------------------------------------------------------
# Input files


def list_files(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    schema: Schema | None = None,
) -> list[Path]:
    """The data files named by ``paths``: files, directories or glob patterns.

    Each entry expands on its own, sorted: a directory to the files directly inside it (hidden
    ``.x`` and ``_x`` files, and the schema's join side tables, are left out); a glob pattern
    (``**`` recurses) to the matching files, side tables left out. Entries keep their order;
    a file named twice is read once. Raises DataError for a path that matches nothing.
    """
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not items:
        raise DataError("no input paths given: expected files, directories or glob patterns")
    out: list[Path] = []
    for item in items:
        for p in _expand_one(str(item), schema):
            if p not in out:
                out.append(p)
    return out


def _expand_one(item: str, schema: Schema | None) -> list[Path]:
    p = Path(item)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = [
            f for f in sorted(p.iterdir()) if f.is_file() and not f.name.startswith((".", "_"))
        ]
        files = [f for f in files if not _is_side_table(f, schema)]
        if not files:
            raise DataError(f"directory {item!r} has no data files")
        return files
    if any(ch in item for ch in "*?["):
        files = [Path(m) for m in sorted(glob.glob(item, recursive=True)) if Path(m).is_file()]
        files = [f for f in files if not _is_side_table(f, schema)]
        if not files:
            raise DataError(f"no files match {item!r}")
        return files
    raise DataError(f"input {item!r} does not exist (expected a file, directory or glob pattern)")


def _is_side_table(f: Path, schema: Schema | None) -> bool:
    if schema is None:
        return False
    return any((f.parent / j.path).resolve() == f.resolve() for j in schema.source.joins)


# --------------------------------------------------------------------------------------------
# Bad rows


class _Budget:
    """Counts bad rows of one read against ``max_bad_rows``; records them in the report."""

    def __init__(self, max_bad_rows: int, report: ReadReport) -> None:
        self.max_bad_rows = max_bad_rows
        self.report = report
        self.count = 0

    def add(self, message: str) -> None:
        """Counts one bad row; raises DataError once there are more than ``max_bad_rows``."""
        self.count += 1
        if self.count > self.max_bad_rows:
            if self.max_bad_rows == 0:
                raise DataError(message)
            raise DataError(
                f"more than max_bad_rows = {self.max_bad_rows} bad rows (limit exceeded); "
                f"bad row {self.count}: {message}"
            )
        self.report.bad_rows += 1
        if len(self.report.examples) < _MAX_EXAMPLES:
            self.report.examples.append(message)


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


def _is_null(arr: pa.Array) -> np.ndarray:
    return _mask(pc.is_null(arr))


def _as_plain(arr: pa.Array) -> pa.Array:
    """Decodes dictionary arrays and narrows large strings to plain strings."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if pa.types.is_large_string(arr.type) or pa.types.is_string_view(arr.type):
        arr = arr.cast(pa.string())
    return arr


def _parse_float64(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Any column to float64 and a mask of non-null cells that are not finite numbers."""
    arr = _as_plain(arr)
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
    bad = ~_is_null(arr) & ~_mask(pc.is_finite(out))
    return out, bad


def _parse_int64(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Any column to int64 and a mask of non-null cells that are not int64 integers."""
    arr = _as_plain(arr)
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
    return out, ~_is_null(arr) & _is_null(out)


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
    return out, ~_is_null(arr) & missing


def _timestamps_to_seconds(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Arrow timestamp/date column to int64 seconds since the epoch, floored."""
    ts = pc.cast(arr, pa.timestamp("us")) if pa.types.is_date(arr.type) else arr
    if ts.type.tz is not None:
        ts = ts.cast(pa.timestamp(ts.type.unit))
    per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[ts.type.unit]
    raw = ts.cast(pa.int64())
    missing = _is_null(raw)
    secs = np.floor_divide(raw.fill_null(0).to_numpy(), per_second)
    return pa.array(secs, pa.int64(), mask=missing), np.zeros(len(arr), dtype=bool)


def _convert(field: FeatureSpec, arr: pa.Array) -> _Converted:
    """Converts one raw column to ``field``'s Arrow type, marking bad cells."""
    kind = field.kind
    if kind == FeatureKind.LABEL:
        return _convert_label(field, arr)
    if kind == FeatureKind.TIMESTAMP:
        arr = _as_plain(arr)
        if pa.types.is_timestamp(arr.type) or pa.types.is_date(arr.type):
            out, bad = _timestamps_to_seconds(arr)
            expected = "a timestamp"
        elif field.time_format == "iso":
            out, bad = _parse_iso(arr)
            expected = "an ISO-8601 date-time such as '2019-11-24 00:00:34+00:00'"
        else:
            out, bad = _parse_int64(arr)
            expected = "integer seconds since the epoch (unix time)"
        return _Converted(out, bad | _is_null(arr), expected)
    if field.dtype == "int64":
        out, bad = _parse_int64(arr)
        return _Converted(out, bad, "an integer (int64)")
    if field.dtype == "float32":
        f64, bad = _parse_float64(arr)
        out = pc.cast(f64, pa.float32(), safe=False)
        bad = bad | (~_is_null(arr) & ~_mask(pc.is_finite(out)))
        return _Converted(out, bad, "a finite number (float32)")
    arr = _as_plain(arr)
    out = arr if pa.types.is_string(arr.type) else pc.cast(arr, pa.string())
    return _Converted(out, np.zeros(len(arr), dtype=bool), "text")


def _convert_label(field: FeatureSpec, arr: pa.Array) -> _Converted:
    """Label column to float32 0.0/1.0: ``value >= threshold`` or a literal 0/1."""
    f64, bad = _parse_float64(arr)
    bad = bad | _is_null(arr)
    if field.threshold is not None:
        out = pc.cast(pc.greater_equal(f64, field.threshold), pa.float32())
        return _Converted(out, bad, f"a finite number (label = value >= {field.threshold})")
    bad = bad | ~_mask(pc.or_(pc.equal(f64, 0.0), pc.equal(f64, 1.0)))
    return _Converted(pc.cast(pc.equal(f64, 1.0), pa.float32()), bad, "0 or 1")


def _value_text(arr: pa.Array, i: int) -> str:
    v = arr[i].as_py()
    return "missing value" if v is None else f"bad value {v!r}"


def _typed_batch(
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
    arrays = [c.values for c in converted]
    bad: list[tuple[int, str]] = []
    if bad_any.any():
        for i in np.flatnonzero(bad_any).tolist():
            j = next(k for k, c in enumerate(converted) if c.bad[i])
            f = schema.fields[j]
            where = f"column {f.column!r}" + (f" (field {f.name!r})" if f.name != f.column else "")
            where += column_notes.get(f.column, "")
            text = _value_text(cols[f.column], i)
            bad.append((i, f"{where}: {text}; expected {converted[j].expected}"))
        keep = pa.array(~bad_any)
        arrays = [a.filter(keep) for a in arrays]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(schema)), bad


@dataclasses.dataclass
class _RawBatch:
    """One chunk of a file before conversion.

    ``cols`` holds n rows by source column name (joined columns included), ``positions`` their
    1-based ``unit`` numbers ("line" in a CSV file, "row" in Parquet), ``notes`` a note per
    joined column for messages, and ``earlier_bad`` (position, message) of rows the parser
    already rejected, to report in file order with the bad cells of ``cols``.
    """

    cols: dict[str, pa.Array]
    positions: np.ndarray
    unit: str
    notes: dict[str, str]
    earlier_bad: list[tuple[int, str]] = dataclasses.field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Side tables (joins)


@dataclasses.dataclass
class _SideTable:
    path: Path
    on: str
    columns: list[str]  # the columns this join may provide
    key: pa.Array  # string keys, one per side-table row
    table: pa.Table  # all columns as strings


def _load_side_table(join: Any, data_file: Path, cache: dict[Any, _SideTable]) -> _SideTable:
    """Reads a join's side table (resolved next to ``data_file``) whole, as strings; cached."""
    path = (data_file.parent / join.path).resolve()
    cache_key = (path, join.on, join.delimiter, join.columns)
    if cache_key in cache:
        return cache[cache_key]
    where = f"side table {str(path)!r} (joined on {join.on!r} to {str(data_file)!r})"
    if not path.is_file():
        raise DataError(f"{where} does not exist")
    header = _read_header(path, join.delimiter)
    for needed, what in (
        (join.on, "the join key"),
        *((c, "a listed column") for c in join.columns or ()),
    ):
        if needed not in header:
            raise DataError(f"{where} lacks {what} {needed!r}; its columns are {_short(header)}")
    try:
        table = pacsv.read_csv(
            pa.input_stream(str(path), compression="detect"),
            parse_options=pacsv.ParseOptions(delimiter=join.delimiter, newlines_in_values=True),
            convert_options=_string_convert_options(header),
        )
    except pa.ArrowException as e:
        raise DataError(f"{where} could not be read: {e}") from None
    provides = [c for c in (join.columns or header) if c != join.on]
    key = pc.cast(table[join.on].combine_chunks(), pa.string())
    side = _SideTable(path, join.on, provides, key, table)
    cache[cache_key] = side
    return side


@dataclasses.dataclass
class _Plan:
    """Where each source column of one data file comes from."""

    read: list[str]  # columns read from the data file (needed columns and join keys)
    joins: list[tuple[_SideTable, list[str]]]  # side table and the columns taken from it
    notes: dict[str, str]  # column -> " (from side.csv on key)" for messages


def _plan_file(
    schema: Schema, file: Path, file_cols: list[str], cache: dict[Any, _SideTable]
) -> _Plan:
    """Matches the schema's source columns to the file's columns and its join side tables."""
    needed = list(dict.fromkeys(f.column for f in schema.fields))
    read = [c for c in needed if c in file_cols]
    missing = [c for c in needed if c not in file_cols]
    joins: list[tuple[_SideTable, list[str]]] = []
    notes: dict[str, str] = {}
    for join in schema.source.joins:
        side = _load_side_table(join, file, cache)
        take = [c for c in missing if c in side.columns]
        if not take:
            continue
        if join.on not in file_cols:
            raise DataError(
                f"file {str(file)!r} lacks the join key column {join.on!r} needed to join "
                f"{str(side.path)!r}; the file's columns are {_short(file_cols)}"
            )
        joins.append((side, take))
        missing = [c for c in missing if c not in take]
        notes.update({c: f" (from {side.path.name} joined on {join.on!r})" for c in take})
        read += [join.on] if join.on not in read else []
    if missing:
        sides = f" or in its join side tables {[str(j.path) for j in schema.source.joins]}"
        raise DataError(
            f"file {str(file)!r} lacks column(s) {_short(missing)} that schema {schema.name!r} reads"
            f"{sides if schema.source.joins else ''}; the file's columns are {_short(file_cols)}"
        )
    return _Plan(read, joins, notes)


def _short(names: Sequence[str], limit: int = 30) -> str:
    """A list of names for a message, abbreviated past ``limit`` entries."""
    if len(names) <= limit:
        return repr(list(names))
    return repr(list(names[:limit]))[:-1] + f", ... ({len(names) - limit} more)]"


def _apply_joins(cols: dict[str, pa.Array], plan: _Plan) -> dict[str, pa.Array]:
    """Adds the side-table columns to ``cols``, row-aligned; unmatched keys give nulls."""
    for side, take in plan.joins:
        key = pc.cast(_as_plain(cols[side.on]), pa.string())
        idx = pc.index_in(key, value_set=side.key)
        for c in take:
            cols[c] = side.table[c].combine_chunks().take(idx)
    return cols


# --------------------------------------------------------------------------------------------
# CSV


def _string_convert_options(names: Sequence[str]) -> pacsv.ConvertOptions:
    """Every column as a string; only an empty cell is null ("NA", "nan" stay text)."""
    return pacsv.ConvertOptions(
        column_types={n: pa.string() for n in names},
        null_values=[""],
        strings_can_be_null=True,
        quoted_strings_can_be_null=True,
    )


def _read_header(path: Path, delimiter: str) -> list[str]:
    """The column names on the first line of a CSV file (BOM and line end stripped)."""
    with pa.input_stream(str(path), compression="detect") as stream:
        chunks = []
        while True:
            chunk = stream.read(65536)
            chunks.append(chunk)
            if not chunk or b"\n" in chunk:
                break
    raw = b"".join(chunks).split(b"\n", 1)[0]
    if not raw.strip():
        raise DataError(
            f"file {str(path)!r} is empty or starts with a blank line: expected a header line "
            f"naming the columns"
        )
    text = raw.decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r")
    return next(csv.reader([text], delimiter=delimiter))


class _LineMap:
    """Maps the rows pyarrow yields to 1-based line numbers, around rows it skipped."""

    def __init__(self, first_line: int) -> None:
        self.next = first_line  # the line of the next row pyarrow will yield, if not skipped
        self.skipped: list[int] = []  # lines of rows the invalid-row handler skipped, ascending
        self._p = 0  # skipped[_p:] are the skipped lines at or after `next`

    def take(self, n: int) -> np.ndarray:
        """The line numbers of the next ``n`` yielded rows."""
        while self._p < len(self.skipped) and self.skipped[self._p] < self.next:
            self._p += 1
        pending = np.array(self.skipped[self._p :], dtype=np.int64)
        cand = np.arange(self.next, self.next + n + len(pending), dtype=np.int64)
        lines = cand[~np.isin(cand, pending)][:n]
        if n:
            self.next = int(lines[-1]) + 1
        return lines


def _delimiter_name(d: str) -> str:
    return _DELIMITER_NAMES.get(d, repr(d))


def _column_count_message(file: Path, names: list[str], row: Any, delimiter: str) -> str:
    """The message for a line with the wrong number of columns."""
    exp, act = row.expected_columns, row.actual_columns
    line = f"line {row.number}" if row.number is not None and row.number >= 0 else "a line"
    if act < exp:
        detail = f"no value for column(s) {_short(names[act:exp])} (a truncated or short line)"
    else:
        detail = f"{act - exp} value(s) after the last column {names[exp - 1]!r}"
    text = row.text if len(row.text) <= 200 else row.text[:200] + "..."
    return (
        f"{file}: {line}: expected {exp} {_delimiter_name(delimiter)}-separated columns, "
        f"found {act}: {detail}: {text!r}"
    )


def _csv_batches(file: Path, schema: Schema, cache: dict[Any, _SideTable]) -> Iterator[_RawBatch]:
    """Streams one CSV file as raw string columns, one chunk per parsed block.

    Lines with the wrong number of columns are skipped by the parser and handed on as
    ``earlier_bad`` of the chunk they precede (or of a last, empty chunk).
    """
    src = schema.source
    names = _read_header(file, src.delimiter) if src.header else list(src.columns or ())
    plan = _plan_file(schema, file, names, cache)
    lines = _LineMap(2 if src.header else 1)
    rejected: list[tuple[int, str]] = []

    def on_invalid_row(row: Any) -> str:
        known = row.number is not None and row.number >= 0
        if known:
            lines.skipped.append(row.number)
        message = _column_count_message(file, names, row, src.delimiter)
        rejected.append((row.number if known else lines.next, message))
        return "skip"

    read_opts = pacsv.ReadOptions(use_threads=False, column_names=None if src.header else names)
    parse_opts = pacsv.ParseOptions(
        delimiter=src.delimiter, ignore_empty_lines=False, invalid_row_handler=on_invalid_row
    )
    try:
        reader = pacsv.open_csv(
            pa.input_stream(str(file), compression="detect"),
            read_options=read_opts,
            parse_options=parse_opts,
            convert_options=_string_convert_options(names),
        )
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            yield _csv_chunk(batch, plan, lines, rejected)
    except pa.ArrowException as e:
        if "Empty CSV file" in str(e):
            raise DataError(f"file {str(file)!r} is empty: expected lines of data") from None
        raise DataError(f"{file}: could not parse CSV at or after line {lines.next}: {e}") from None
    if rejected:
        yield _RawBatch({}, np.zeros(0, np.int64), "line", plan.notes, list(rejected))


def _csv_chunk(
    batch: pa.RecordBatch, plan: _Plan, lines: _LineMap, rejected: list[tuple[int, str]]
) -> _RawBatch:
    """One parsed block as a raw chunk: blank lines dropped, joined columns added.

    Takes from ``rejected`` the rejected lines that come before the block's last row (all of
    them if the block has no rows).
    """
    line_no = lines.take(batch.num_rows)
    upto = lines.next if batch.num_rows else None
    earlier = [r for r in rejected if upto is None or r[0] < upto]
    rejected[:] = [r for r in rejected if upto is not None and r[0] >= upto]
    blank = np.ones(batch.num_rows, dtype=bool)
    for col in batch.columns:
        blank &= _is_null(col)
        if not blank.any():
            break
    cols = {c: batch.column(c) for c in plan.read}
    if blank.any():
        keep = pa.array(~blank)
        cols = {c: a.filter(keep) for c, a in cols.items()}
        line_no = line_no[~blank]
    return _RawBatch(_apply_joins(cols, plan), line_no, "line", plan.notes, earlier)


# --------------------------------------------------------------------------------------------
# Parquet


def _parquet_batches(
    file: Path, schema: Schema, batch_rows: int, cache: dict[Any, _SideTable]
) -> Iterator[_RawBatch]:
    """Streams one Parquet file as raw columns (the needed ones) in chunks of ``batch_rows``."""
    try:
        pf = pq.ParquetFile(str(file))
        names = list(pf.schema_arrow.names)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"file {str(file)!r} is not a readable Parquet file: {e}") from None
    plan = _plan_file(schema, file, names, cache)
    start = 0
    batches = pf.iter_batches(batch_size=batch_rows, columns=plan.read)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as e:
            raise DataError(
                f"file {str(file)!r}: Parquet data after row {start} could not be read "
                f"(truncated or corrupt file?): {e}"
            ) from None
        cols = {c: batch.column(c) for c in plan.read}
        rows = np.arange(start + 1, start + batch.num_rows + 1, dtype=np.int64)
        yield _RawBatch(_apply_joins(cols, plan), rows, "row", plan.notes)
        start += batch.num_rows


# --------------------------------------------------------------------------------------------
# read_batches


def read_batches(
    schema: Schema,
    paths: str | Path | Sequence[str | Path],
    *,
    batch_rows: int = 65536,
    max_bad_rows: int = 0,
    report: ReadReport | None = None,
) -> Iterator[pa.RecordBatch]:
    """Streams ``paths`` as batches of ``arrow_schema(schema)`` with at most ``batch_rows`` rows.

    Files are found eagerly (see ``list_files``; DataError if a path matches nothing) and read
    lazily in order. Every batch but the last has exactly ``batch_rows`` rows. Bad rows raise
    DataError, or are skipped and counted in ``report`` while there are at most
    ``max_bad_rows`` of them. If no good row is read at all, DataError.
    """
    if not isinstance(batch_rows, int) or batch_rows < 1:
        raise ValueError(f"batch_rows must be an integer >= 1, got {batch_rows!r}")
    if not isinstance(max_bad_rows, int) or max_bad_rows < 0:
        raise ValueError(f"max_bad_rows must be an integer >= 0, got {max_bad_rows!r}")
    files = list_files(paths, schema)
    report = report if report is not None else ReadReport()
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    desc = ", ".join(repr(str(p)) for p in items)
    return _read(schema, files, desc, batch_rows, _Budget(max_bad_rows, report), report)


def _read(
    schema: Schema,
    files: list[Path],
    desc: str,
    batch_rows: int,
    budget: _Budget,
    report: ReadReport,
) -> Iterator[pa.RecordBatch]:
    rows = 0
    for batch in rebatch(_typed_batches(schema, files, batch_rows, budget, report), batch_rows):
        rows += batch.num_rows
        report.rows += batch.num_rows
        yield batch
    if rows == 0:
        skipped = f"; {budget.count} bad rows were skipped" if budget.count else ""
        raise DataError(f"no rows were read from {desc} ({len(files)} file(s){skipped})")


def _typed_batches(
    schema: Schema, files: list[Path], batch_rows: int, budget: _Budget, report: ReadReport
) -> Iterator[pa.RecordBatch]:
    """Typed, validated batches of each file in turn (sizes as the file's chunks come).

    Bad rows are reported to ``budget`` in file order; it raises past its limit.
    """
    cache: dict[Any, _SideTable] = {}
    for file in files:
        report.files += 1
        if file.stat().st_size == 0:
            raise DataError(f"file {str(file)!r} is empty: expected {_expectation(schema)}")
        if schema.source.format == "parquet":
            raws = _parquet_batches(file, schema, batch_rows, cache)
        else:
            raws = _csv_batches(file, schema, cache)
        for raw in raws:
            typed, bad = None, []
            if len(raw.positions):
                typed, bad = _typed_batch(schema, raw.cols, raw.notes)
            messages = raw.earlier_bad + [
                (int(raw.positions[i]), f"{file}: {raw.unit} {raw.positions[i]}, {text}")
                for i, text in bad
            ]
            for _, message in sorted(messages, key=lambda m: m[0]):
                budget.add(message)
            if typed is not None and typed.num_rows:
                yield typed


def _expectation(schema: Schema) -> str:
    src = schema.source
    if src.format == "parquet":
        return "a Parquet file"
    delim = _delimiter_name(src.delimiter)
    if src.header:
        return f"a header line naming the {delim}-separated columns, then data lines"
    cols = list(src.columns or ())
    return f"lines of {len(cols)} {delim}-separated columns {_short(cols, limit=10)}"


def rebatch(batches: Iterable[pa.RecordBatch], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Regroups batches into batches of exactly ``batch_rows`` rows (the last may be shorter)."""
    buf: list[pa.RecordBatch] = []
    buffered = 0
    for b in batches:
        buf.append(b)
        buffered += b.num_rows
        if buffered < batch_rows:
            continue
        table = pa.Table.from_batches(buf)
        start = 0
        while buffered - start >= batch_rows:
            yield _one_batch(table.slice(start, batch_rows))
            start += batch_rows
        rest = table.slice(start)
        buf = [_one_batch(rest)] if rest.num_rows else []
        buffered = rest.num_rows
    if buffered:
        yield _one_batch(pa.Table.from_batches(buf))


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return batches[0]


# --------------------------------------------------------------------------------------------
# Parquet output


# Row groups of at most this many rows: a worker reading its share of an epoch (training with
# [distribute] input = "shard") decodes whole row groups, so smaller groups waste less at the
# ends of its range; 65,536 rows keep pyarrow's reads efficient.
ROW_GROUP_ROWS = 65_536


class ShardWriter:
    """Writes batches to ``out_dir/{prefix}-00000.parquet``, ... of ``rows_per_shard`` rows.

    Shards are written under a hidden temporary name and renamed when complete. Creating the
    writer removes stale ``{prefix}-NNNNN.parquet`` shards of an earlier run in ``out_dir``.
    """

    def __init__(self, out_dir: str | Path, rows_per_shard: int, prefix: str) -> None:
        if not isinstance(rows_per_shard, int) or rows_per_shard < 1:
            raise ValueError(f"rows_per_shard must be an integer >= 1, got {rows_per_shard!r}")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        stale = re.compile(rf"^{re.escape(prefix)}-\d+\.parquet$")
        for f in self.out_dir.iterdir():
            if f.is_file() and stale.match(f.name):
                f.unlink()
        self.rows_per_shard = rows_per_shard
        self.prefix = prefix
        self.paths: list[Path] = []
        self._writer: pq.ParquetWriter | None = None
        self._tmp: Path | None = None
        self._in_shard = 0

    def write(self, batch: pa.RecordBatch) -> None:
        start = 0
        while start < batch.num_rows:
            if self._writer is None:
                self._open(batch.schema)
            take = min(batch.num_rows - start, self.rows_per_shard - self._in_shard)
            self._writer.write_batch(batch.slice(start, take), row_group_size=ROW_GROUP_ROWS)
            self._in_shard += take
            start += take
            if self._in_shard == self.rows_per_shard:
                self._finish()

    def _open(self, schema: pa.Schema) -> None:
        name = f"{self.prefix}-{len(self.paths):05d}.parquet"
        self._tmp = self.out_dir / f".{name}.tmp"
        self._writer = pq.ParquetWriter(str(self._tmp), schema)
        self._in_shard = 0

    def _finish(self) -> None:
        self._writer.close()
        final = self.out_dir / self._tmp.name[1:-4]
        self._tmp.replace(final)
        self.paths.append(final)
        self._writer, self._tmp = None, None

    def close(self) -> list[Path]:
        """Completes the last shard; returns all shard paths in order."""
        if self._writer is not None:
            self._finish()
        return list(self.paths)

    def abort(self) -> None:
        """Drops the unfinished shard (after an error)."""
        if self._writer is not None:
            self._writer.close()
            self._tmp.unlink(missing_ok=True)
            self._writer, self._tmp = None, None


def write_parquet_shards(
    batches: Iterable[pa.RecordBatch],
    out_dir: str | Path,
    *,
    rows_per_shard: int = 1_000_000,
    prefix: str = "part",
) -> list[Path]:
    """Writes ``batches`` to ``out_dir/{prefix}-00000.parquet``, ...; returns the shard paths.

    Each shard holds ``rows_per_shard`` rows (the last fewer); no batches, no shards. Creates
    ``out_dir`` and replaces shards of an earlier run there.
    """
    writer = ShardWriter(out_dir, rows_per_shard, prefix)
    try:
        for b in batches:
            writer.write(b)
    except BaseException:
        writer.abort()
        raise
    return writer.close()


# --------------------------------------------------------------------------------------------
# convert


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer of uint64 ``x`` (wrapping arithmetic), elementwise."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def split_mask(seed: int, start: int, n: int, test_fraction: float) -> np.ndarray:
    """bool[n]: rows ``start .. start+n-1`` (global row indices) that go to the test split.

    A row is in test iff ``u < test_fraction`` with ``u`` in [0, 1) from splitmix64 of the row
    index keyed by ``seed``, so the split depends only on (seed, row index).
    """
    key = _splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
    idx = np.arange(start, start + n, dtype=np.uint64)
    u = (_splitmix64(idx ^ key) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return u < test_fraction


def convert(
    schema: Schema,
    inputs: str | Path | Sequence[str | Path],
    out_dir: str | Path,
    *,
    test_fraction: float = 0.0,
    seed: int = 0,
    rows_per_shard: int = 1_000_000,
    batch_rows: int = 65536,
    max_bad_rows: int = 0,
    report: ReadReport | None = None,
) -> dict[str, list[Path]]:
    """Streams ``inputs`` through ``read_batches`` into Parquet shards.

    Rows go to ``out_dir/test/`` with probability ``test_fraction`` (decided by ``split_mask``
    from ``seed`` and the row's global index, so independent of ``batch_rows``), else to
    ``out_dir/train/``. Returns ``{"train": [shard paths], "test": [shard paths]}``; read the
    shards back with ``read_batches(schema.as_parquet(), out_dir / "train")``.
    """
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction!r}")
    batches = read_batches(
        schema, inputs, batch_rows=batch_rows, max_bad_rows=max_bad_rows, report=report
    )
    out = Path(out_dir)
    train = ShardWriter(out / "train", rows_per_shard, "part")
    test = ShardWriter(out / "test", rows_per_shard, "part") if test_fraction > 0 else None
    if test is None and (out / "test").is_dir():
        ShardWriter(out / "test", rows_per_shard, "part")  # clears stale test shards
    seen = 0
    try:
        for b in batches:
            if test is None:
                train.write(b)
            else:
                is_test = split_mask(seed, seen, b.num_rows, test_fraction)
                train.write(b.filter(pa.array(~is_test)))
                test.write(b.filter(pa.array(is_test)))
            seen += b.num_rows
    except BaseException:
        train.abort()
        if test is not None:
            test.abort()
        raise
    return {"train": train.close(), "test": test.close() if test is not None else []}
